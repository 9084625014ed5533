/* mlp2_cpu.c - backend.h's mlp2 on the CPU: a two-layer map whose hidden
 * layer is made and consumed a few units at a time.
 *
 * Why this exists: the fold (engine/fold.h) turns a candidate linear whose
 * wide output is read only through a folded linear into one op, so the
 * [rows, hidden] activation (427 MB at the bench model's 16 x 70) is never
 * stored. This is the reference the CUDA kernel is checked against.
 *
 * The addend's linear runs first, cpu_linear into y; then per tile of
 * GEMM_MR rows and chunk of MLP2_HC hidden units: the hidden
 * values go through the register-tile core exactly as cpu_linear computes
 * them (its sum over in, then bias, then act1), then into y's sums, which
 * run over hidden in increasing order from add (or from zero) with one fp32
 * accumulator per element: cpu_internal.h's determinism contract. Without
 * an addend, y equals cpu_linear(cpu_linear(x, W1, b1, act1), W2) bit for bit.
 * Then addu's row (through the map) is added and act2 applied, as the add
 * and activation ops would after it (the fold's user term and the folded
 * linear's activation).
 */
#include "cpu_internal.h"

/* Hidden units a chunk: the chunk's [GEMM_MR, MLP2_HC] values sit in L1. */
#define MLP2_HC 256

/* c[i][0 .. nr) (i < mr; the other c[i] are not touched) of the core for
 * panel bp, through tmp when nr < GEMM_NR (a zero-padded panel still
 * writes GEMM_NR columns) and for the spare rows. */
static void tile(const float *const a[GEMM_MR], const float *bp, int kn, float *const c[GEMM_MR],
                 int mr, int nr, int load)
{
    float tmp[GEMM_MR][GEMM_NR] = {{0}}, *cc[GEMM_MR];
    for (int i = 0; i < GEMM_MR; i++) {
        cc[i] = i < mr && nr == GEMM_NR ? c[i] : tmp[i];
        if (i < mr && nr < GEMM_NR && load) memcpy(tmp[i], c[i], (size_t)nr * sizeof(float));
    }
    gemm_cpu_tile(a, bp, GEMM_NR, kn, GEMM_NR, cc, load);
    if (nr < GEMM_NR)
        for (int i = 0; i < mr; i++) memcpy(c[i], tmp[i], (size_t)nr * sizeof(float));
}

/* y[r, :] = act2(y[r, :] + addu[map ? map[r] : r, :]) for the tile's rows. */
static void tail(float *yf, int ldy, int r0, int mr, int out, const float *uf, const int32_t *map,
                 enum bk_act act2)
{
    for (int i = 0; i < mr; i++) {
        float *yr = yf + (size_t)(r0 + i) * ldy;
        const float *ur = uf ? uf + (size_t)(map ? map[r0 + i] : r0 + i) * out : NULL;
        for (int j = 0; j < out; j++) yr[j] = cpu_activate(ur ? yr[j] + ur[j] : yr[j], act2);
    }
}

int cpu_mlp2(bk_stream *s, const void *x, int ldx, int rows, const bk_weight *w1,
             const bk_weight *b1, enum bk_act act1, const bk_weight *w2, const bk_mlp2_addend *a,
             const void *addu, const int32_t *map, enum bk_act act2, void *y, int ldy, bk_err *err)
{
    if (a && !a->w) {
        bk_seterr(err, "mlp2: the addend's weight is NULL");
        return -1;
    }
    if (bk_mlp2_check(w1 && w2, rows, w1 ? w1->cols : 0, w1 ? w1->rows : 0, w2 ? w2->rows : 0,
                      w2 ? w2->cols : 0, b1 ? (int64_t)b1->rows * b1->cols : -1, act1, act2, ldx,
                      ldy, a ? a->w->cols : -1, a ? a->w->rows : 0, a ? a->ldx : 0,
                      a && a->b ? (int64_t)a->b->rows * a->b->cols : -1, err))
        return -1;
    const int in = w1->cols, hid = w1->rows, out = w2->rows;
    if (rows == 0 || out == 0) return 0;
    if (!x || !y) {
        bk_seterr(err, "mlp2: NULL input or output");
        return -1;
    }
    if (overlap(x, ((size_t)(rows - 1) * ldx + in) * sizeof(float), y,
                ((size_t)(rows - 1) * ldy + out) * sizeof(float))) {
        bk_seterr(err, "mlp2: output overlaps input");
        return -1;
    }
    /* the addend into y (cpu_linear refuses an addend input overlapping y) */
    if (a && cpu_linear(s, a->x, a->ldx, rows, a->w, a->b, BK_ACT_NONE, y, ldy, err)) return -1;
    const float *p1 = cpu_weight_packed(w1, err), *p2 = p1 ? cpu_weight_packed(w2, err) : NULL;
    if (!p2) return -1;
    const float *xf = x, *bv = b1 ? b1->data : NULL;
    float *yf = y;
    float h[GEMM_MR][MLP2_HC];
    for (int r0 = 0; r0 < rows; r0 += GEMM_MR) {
        const int mr = min_int(GEMM_MR, rows - r0);
        /* spare rows (i >= mr) read row mr - 1 and write nowhere (tile) */
        const float *ax[GEMM_MR], *ah[GEMM_MR];
        for (int i = 0; i < GEMM_MR; i++) {
            ax[i] = xf + (size_t)(r0 + min_int(i, mr - 1)) * ldx;
            ah[i] = h[min_int(i, mr - 1)];
        }
        for (int j0 = 0; j0 < hid; j0 += MLP2_HC) {
            const int hn = min_int(MLP2_HC, hid - j0);
            /* h = act1(x W1[j0 .. j0+hn)^T + b1), as cpu_linear stores it (in <= LIN_KC
             * or not, its k blocks continue one sum, so one call over in is the same) */
            for (int p = j0 / GEMM_NR; p * GEMM_NR < j0 + hn; p++) {
                const int o0 = p * GEMM_NR - j0, nr = min_int(GEMM_NR, hn - o0);
                float *c[GEMM_MR];
                for (int i = 0; i < GEMM_MR; i++) c[i] = i < mr ? h[i] + o0 : NULL;
                tile(ax, p1 + (size_t)p * in * GEMM_NR, in, c, mr, nr, 0);
                for (int i = 0; i < mr; i++)
                    for (int j = 0; j < nr; j++)
                        h[i][o0 + j] = cpu_activate(bv ? h[i][o0 + j] + bv[j0 + o0 + j] : h[i][o0 + j], act1);
            }
            /* y += h W2[:, j0 .. j0+hn)^T, continuing each element's one sum */
            const int load = a || j0 > 0; /* y holds the addend */
            for (int p = 0; p * GEMM_NR < out; p++) {
                const int n0 = p * GEMM_NR, nr = min_int(GEMM_NR, out - n0);
                float *c[GEMM_MR];
                for (int i = 0; i < GEMM_MR; i++) c[i] = i < mr ? yf + (size_t)(r0 + i) * ldy + n0 : NULL;
                tile(ah, p2 + ((size_t)p * hid + j0) * GEMM_NR, hn, c, mr, nr, load);
            }
        }
        if (hid == 0 && !a)
            for (int i = 0; i < mr; i++) memset(yf + (size_t)(r0 + i) * ldy, 0, (size_t)out * sizeof(float));
        tail(yf, ldy, r0, mr, out, addu, map, act2);
    }
    return 0;
}
