/* mlp2.cu - backend.h's mlp2 on the GPU: y = add + act1(x W1^T + b1) W2^T
 * with the hidden layer kept in registers.
 *
 * Why this exists: the fold's candidate MLP part (engine/fold.h) is c_r1 of
 * the bench model, 1120 x [16 -> 190464] with ReLU read only through the
 * folded [64, 190464] weight: stored, its hidden layer is 427 MB written
 * and read back (~310 us on an H100); here it never leaves the SM (117 us
 * in bench/kernels/fmlp_proto.cu, v1; NOTES.md "c_r1 through the fold").
 *
 * k_mlp2 (bf16/fp16, in <= 16): a CTA takes 16 RT rows a warp (8 warps)
 * by a slice of the hidden layer by 64 outputs. Per chunk of 128 hidden
 * units (W1's [128, 16], b1 and W2's [64, 128] staged by cp.async,
 * double-buffered, zero-filled past the weights): H = x W1^T on tensor
 * cores (one k-step), then b1 and act1 and the rounding to T that linear's
 * store applies, repacked in registers as the A operand of Y += H W2^T.
 * Each slice writes fp32 partials to the stream's scratch; k_mlp2_sum adds
 * add and the slices in order (the same order for every row, so a row's
 * result does not depend on the batch). Elsewhere (fp32, in > 16) the
 * composition through a scratch of MLP2_CHUNK hidden units: linear into it,
 * linear out of it into a second scratch, added.
 */
#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/mma_util.cuh"

#define MLP2_HC 128     /* hidden units a chunk */
#define MLP2_NO 64      /* outputs a CTA */
#define MLP2_W2P 136    /* W2 chunk row pitch in shared memory: conflict-free ldmatrix */
#define MLP2_CHUNK 8192 /* the composition's hidden units a step */

template <typename T> struct mlp2_stage {
    T w1[MLP2_HC * 16];        /* [j][k] */
    T w2[MLP2_NO * MLP2_W2P];  /* [n][j] */
    T b1[MLP2_HC];
};

template <typename T>
__device__ __forceinline__ void mlp2_load(mlp2_stage<T> *s, const T *W1, int ld1, const T *b1,
                                          const T *W2, int ld2, int hid, int out, int n0, int j0,
                                          int tid)
{
    { /* W1: 128 rows of 16 (ld1 8 or 16: the second half zero for 8) */
        const int j = tid >> 1, h = tid & 1;
        const bool ok = j0 + j < hid && h * 8 < ld1;
        cp_async16(&s->w1[j * 16 + h * 8], ok ? W1 + (size_t)(j0 + j) * ld1 + h * 8 : W1, ok);
    }
    for (int c = tid; c < MLP2_NO * (MLP2_HC / 8); c += 256) {
        const int n = c >> 4, q = c & 15;
        const bool ok = n0 + n < out && j0 + q * 8 < ld2;
        cp_async16(&s->w2[n * MLP2_W2P + q * 8], ok ? W2 + (size_t)(n0 + n) * ld2 + j0 + q * 8 : W2,
                   ok);
    }
    if (tid < MLP2_HC / 8) {
        const bool ok = b1 && j0 + tid * 8 < ((hid + 7) & ~7);
        cp_async16(&s->b1[tid * 8], ok ? b1 + j0 + tid * 8 : W1, ok);
    }
}

template <typename T, int RT>
__global__ void __launch_bounds__(256, 2)
k_mlp2(const T *__restrict__ x, int ldx, int in, int rows, const T *W1, int ld1, const T *b1,
       int relu, const T *W2, int ld2, int hid, int out, float *part, int per_slice)
{
    extern __shared__ __align__(128) unsigned char smem_raw[];
    mlp2_stage<T> *st = (mlp2_stage<T> *)smem_raw;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int r0 = (blockIdx.x * 8 + warp) * 16 * RT, n0 = blockIdx.z * MLP2_NO;
    const int nchunks = (hid + MLP2_HC - 1) / MLP2_HC;
    const int c0 = blockIdx.y * per_slice, c1 = min(nchunks, c0 + per_slice);
    /* x's A fragments: elements past in or rows past the batch are zero */
    uint32_t a[RT][4];
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int row = r0 + 16 * r + g + 8 * (q & 1), k = 2 * t + 8 * (q >> 1);
            const uint16_t *xr = (const uint16_t *)x + (size_t)row * ldx; /* T's bits */
            const uint32_t lo = row < rows && k < in ? xr[k] : 0u;
            const uint32_t hi = row < rows && k + 1 < in ? xr[k + 1] : 0u;
            a[r][q] = lo | hi << 16;
        }
    float y[RT][MLP2_NO / 8][4];
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int i = 0; i < MLP2_NO / 8; i++) y[r][i][0] = y[r][i][1] = y[r][i][2] = y[r][i][3] = 0.f;
    if (c0 < c1) mlp2_load(&st[0], W1, ld1, b1, W2, ld2, hid, out, n0, c0 * MLP2_HC, tid);
    cp_async_commit();
    const int mi = lane >> 3, rr = lane & 7;
    for (int c = c0; c < c1; c++) {
        const int buf = (c - c0) & 1;
        if (c + 1 < c1)
            mlp2_load(&st[buf ^ 1], W1, ld1, b1, W2, ld2, hid, out, n0, (c + 1) * MLP2_HC, tid);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const mlp2_stage<T> *s = &st[buf];
#pragma unroll
        for (int kk = 0; kk < MLP2_HC / 16; kk++) {
            /* B fragments of W1 rows 16kk.. (two n-tiles of 8 hidden units) */
            uint32_t bw[4];
            ldmatrix_x4(bw, &s->w1[(16 * kk + (mi >> 1) * 8 + rr) * 16 + (mi & 1) * 8]);
            float bb[2][2];
#pragma unroll
            for (int q = 0; q < 2; q++) {
                bb[q][0] = b1 ? cu_tof<T>(s->b1[16 * kk + 8 * q + 2 * t]) : 0.f;
                bb[q][1] = b1 ? cu_tof<T>(s->b1[16 * kk + 8 * q + 2 * t + 1]) : 0.f;
            }
            uint32_t p[RT][4];
#pragma unroll
            for (int r = 0; r < RT; r++) {
                float h[2][4];
#pragma unroll
                for (int q = 0; q < 2; q++) {
                    h[q][0] = h[q][1] = h[q][2] = h[q][3] = 0.f;
                    const uint32_t b2[2] = {bw[2 * q], bw[2 * q + 1]};
                    mma16816<T>(h[q], a[r], b2);
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        h[q][e] += bb[q][e & 1]; /* linear's epilogue: the sum, then the bias */
                        if (relu) h[q][e] = fmaxf(h[q][e], 0.f);
                    }
                }
                p[r][0] = pack2<T>(h[0][0], h[0][1]);
                p[r][1] = pack2<T>(h[0][2], h[0][3]);
                p[r][2] = pack2<T>(h[1][0], h[1][1]);
                p[r][3] = pack2<T>(h[1][2], h[1][3]);
            }
#pragma unroll
            for (int nn = 0; nn < MLP2_NO / 16; nn++) {
                uint32_t bq[4];
                ldmatrix_x4(bq, &s->w2[(16 * nn + (mi >> 1) * 8 + rr) * MLP2_W2P + 16 * kk +
                                       (mi & 1) * 8]);
                const uint32_t blo[2] = {bq[0], bq[1]}, bhi[2] = {bq[2], bq[3]};
#pragma unroll
                for (int r = 0; r < RT; r++) {
                    mma16816<T>(y[r][2 * nn], p[r], blo);
                    mma16816<T>(y[r][2 * nn + 1], p[r], bhi);
                }
            }
        }
        __syncthreads();
    }
    float *pp = part + (size_t)blockIdx.y * rows * out;
#pragma unroll
    for (int r = 0; r < RT; r++)
#pragma unroll
        for (int i = 0; i < MLP2_NO / 8; i++) {
            const int n = n0 + 8 * i + 2 * t, ra = r0 + 16 * r + g, rb = ra + 8;
#pragma unroll
            for (int e = 0; e < 2; e++) {
                if (n + e >= out) continue;
                if (ra < rows) pp[(size_t)ra * out + n + e] = y[r][i][e];
                if (rb < rows) pp[(size_t)rb * out + n + e] = y[r][i][2 + e];
            }
        }
}

/* y[r, n] = add[r, n] + the S slices' partials in slice order. */
template <typename T>
__global__ void k_mlp2_sum(const float *part, int S, const T *add, int ldadd, T *y, int ldy,
                           int rows, int out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)rows * out;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / out, n = i % out;
        float acc = add ? cu_tof<T>(add[r * ldadd + n]) : 0.f;
        for (int s = 0; s < S; s++) acc += part[(size_t)s * rows * out + i];
        y[r * ldy + n] = cu_fromf<T>(acc);
    }
}

/* y[r, n] = a[r, n] + b[r, n], a NULL or b NULL read as zeros; a may be y. */
template <typename T>
__global__ void k_mlp2_add(const T *a, int lda, const T *b, int ldb, T *y, int ldy, int rows,
                           int out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)rows * out;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / out, n = i % out;
        const float va = a ? cu_tof<T>(a[r * lda + n]) : 0.f, vb = b ? cu_tof<T>(b[r * ldb + n]) : 0.f;
        y[r * ldy + n] = cu_fromf<T>(va + vb);
    }
}

static int mlp2_add(bk_stream *s, const void *a, int lda, const void *b, int ldb, void *y, int ldy,
                    int rows, int out, bk_err *err)
{
    CU_DISPATCH(cu_dt(s), (k_mlp2_add<T><<<cu_grid_for((size_t)rows * out, 256), 256, 0, s->st>>>(
                              (const T *)a, lda, (const T *)b, ldb, (T *)y, ldy, rows, out)));
    return cu_check_launch(s, err, "mlp2 add");
}

/* The composition for what k_mlp2 does not take: MLP2_CHUNK hidden units at
 * a time through linear (views of W1's rows, b1's and W2's columns), the
 * step's product into yc, added to y (add first). */
static int mlp2_composed(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w1,
                         const bk_weight *b1, enum bk_act act1, const bk_weight *w2,
                         const void *add, int ldadd, void *y, int ldy, bk_err *err)
{
    const int hid = w1->rows, out = w2->rows, as = (int)s->be->act_size;
    const int cn_max = hid < MLP2_CHUNK ? hid : MLP2_CHUNK;
    const size_t hbytes = (size_t)rows * cn_max * as, ybytes = (size_t)rows * out * as;
    if (cu_scratch_get(s, &s->mlp2_part, hbytes + ybytes, err)) return -1;
    char *h = (char *)s->mlp2_part.p, *yc = h + hbytes;
    if (hid == 0) return mlp2_add(s, add, ldadd, NULL, 0, y, ldy, rows, out, err);
    for (int j0 = 0; j0 < hid; j0 += MLP2_CHUNK) {
        const int cn = hid - j0 < MLP2_CHUNK ? hid - j0 : MLP2_CHUNK;
        bk_weight v1 = {cn, w1->cols, w1->ld, (char *)w1->data + (size_t)j0 * w1->ld * as, 0};
        bk_weight vb = {1, cn, cn, b1 ? (char *)b1->data + (size_t)j0 * as : NULL, 0};
        bk_weight v2 = {out, cn, w2->ld, (char *)w2->data + (size_t)j0 * as, 0};
        if (cuda_linear(s, x, ldx, rows, &v1, b1 ? &vb : NULL, act1, h, cn_max, err) ||
            cuda_linear(s, h, cn_max, rows, &v2, NULL, BK_ACT_NONE, yc, out, err))
            return -1;
        const void *base = j0 ? y : add;
        if (mlp2_add(s, base, j0 ? ldy : ldadd, yc, out, y, ldy, rows, out, err)) return -1;
    }
    return 0;
}

/* k_mlp2 then k_mlp2_sum, in T (bf16 or fp16). */
template <typename T>
static int mlp2_launch(bk_stream *s, dim3 grid, int rt, const void *x, int ldx, int in, int rows,
                       const bk_weight *w1, const bk_weight *b1, int relu, const bk_weight *w2,
                       float *part, int per, int S, const void *add, int ldadd, void *y, int ldy,
                       bk_err *err)
{
    const size_t smem = 2 * sizeof(mlp2_stage<T>);
    const int out = w2->rows;
    auto kern = rt == 2 ? k_mlp2<T, 2> : k_mlp2<T, 1>;
    if (cu_smem_limit(s, (const void *)kern, (int)smem, err)) return -1;
    kern<<<grid, 256, smem, s->st>>>((const T *)x, ldx, in, rows, (const T *)w1->data, w1->ld,
                                     b1 ? (const T *)b1->data : NULL, relu, (const T *)w2->data,
                                     w2->ld, w1->rows, out, part, per);
    if (cu_check_launch(s, err, "mlp2")) return -1;
    k_mlp2_sum<T><<<cu_grid_for((size_t)rows * out, 256), 256, 0, s->st>>>(
        part, S, (const T *)add, ldadd, (T *)y, ldy, rows, out);
    return cu_check_launch(s, err, "mlp2 sum");
}

int cuda_mlp2(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w1,
              const bk_weight *b1, enum bk_act act1, const bk_weight *w2, const void *add,
              int ldadd, void *y, int ldy, bk_err *err)
{
    if (!w1 || !w2) {
        bk_seterr(err, "mlp2: weight is NULL");
        return -1;
    }
    const int in = w1->cols, hid = w1->rows, out = w2->rows;
    cu_prof_scope prof_(s, "mlp2");
    if (w2->cols != hid) {
        bk_seterr(err, "mlp2: W2 has %d columns, W1 %d rows (the hidden width)", w2->cols, hid);
        return -1;
    }
    if (rows < 0 || ldx < in || ldy < out || (add && ldadd < out)) {
        bk_seterr(err, "mlp2: rows %d, ldx %d / ldy %d / ldadd %d against in %d / out %d", rows,
                  ldx, ldy, add ? ldadd : 0, in, out);
        return -1;
    }
    if (b1 && b1->rows * b1->cols != hid) {
        bk_seterr(err, "mlp2: b1 has %d x %d elements, expected %d", b1->rows, b1->cols, hid);
        return -1;
    }
    if (act1 != BK_ACT_NONE && act1 != BK_ACT_RELU) {
        bk_seterr(err, "mlp2: hidden activation %d (none or relu)", (int)act1);
        return -1;
    }
    if (rows == 0 || out == 0) return 0;
    if (prof_.on())
        prof_.work(2.0 * rows * hid * (in + out),
                   ((double)rows * (in + out) + (double)hid * (in + out + 1)) * s->be->act_size);
    if (cu_enter(s, err)) return -1;
    const enum cu_dtype dt = cu_dt(s);
    if (dt == CU_F32 || w1->ld > 16 || hid == 0)
        return mlp2_composed(s, x, ldx, rows, w1, b1, act1, w2, add, ldadd, y, ldy, err);
    const int rt = rows >= 256 ? 2 : 1, rb = (rows + 128 * rt - 1) / (128 * rt);
    const int zt = (out + MLP2_NO - 1) / MLP2_NO, nchunks = (hid + MLP2_HC - 1) / MLP2_HC;
    int S = (2 * cu_impl(s->be)->sm_count + rb * zt - 1) / (rb * zt);
    S = S < 1 ? 1 : S > nchunks ? nchunks : S;
    const int per = (nchunks + S - 1) / S;
    S = (nchunks + per - 1) / per;
    if (cu_scratch_get(s, &s->mlp2_part, (size_t)S * rows * out * sizeof(float), err)) return -1;
    float *part = (float *)s->mlp2_part.p;
    const dim3 grid(rb, S, zt);
    const int relu = act1 == BK_ACT_RELU;
    return dt == CU_BF16 ? mlp2_launch<__nv_bfloat16>(s, grid, rt, x, ldx, in, rows, w1, b1, relu, w2,
                                                      part, per, S, add, ldadd, y, ldy, err)
                         : mlp2_launch<__half>(s, grid, rt, x, ldx, in, rows, w1, b1, relu, w2,
                                               part, per, S, add, ldadd, y, ldy, err);
}
