/* backend.c - device-independent part of the op table: error text, the
 * byte accounting every backend keeps, and the device-string dispatch.
 *
 * Why this exists: the engine names its device in config ("cpu", "cuda:N")
 * and should not know which backends this build contains. A device this
 * build cannot serve is a load-time error whose text says why, so a
 * misconfigured server fails loudly instead of silently running on the CPU.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

void bk_seterr(bk_err *err, const char *fmt, ...)
{
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

void bk_ledger_init(bk_ledger *l)
{
    pthread_mutex_init(&l->lock, NULL);
    memset(&l->stats, 0, sizeof l->stats);
}

void bk_ledger_destroy(bk_ledger *l)
{
    pthread_mutex_destroy(&l->lock);
}

static void take(size_t *count, size_t add, size_t sub)
{
    *count += add;
    *count -= sub < *count ? sub : *count;
}

void bk_ledger_account(bk_ledger *l, enum bk_tag tag, size_t add, size_t sub)
{
    pthread_mutex_lock(&l->lock);
    take(&l->stats.bytes_live[tag], add, sub);
    if (l->stats.bytes_live[tag] > l->stats.bytes_peak[tag])
        l->stats.bytes_peak[tag] = l->stats.bytes_live[tag];
    pthread_mutex_unlock(&l->lock);
}

void bk_ledger_weights(bk_ledger *l, size_t add, size_t sub)
{
    pthread_mutex_lock(&l->lock);
    take(&l->stats.weight_bytes, add, sub);
    pthread_mutex_unlock(&l->lock);
}

void bk_ledger_get(bk_ledger *l, bk_stats *out)
{
    pthread_mutex_lock(&l->lock);
    *out = l->stats;
    pthread_mutex_unlock(&l->lock);
}

static bk_backend *backend_create(const char *device, bk_err *err)
{
    if (!device || !*device) {
        bk_seterr(err, "no device given (expected \"cpu\" or \"cuda:N\")");
        return NULL;
    }
    int ordinal;
    if (bk_parse_device(device, &ordinal) == 0 && ordinal < 0)
        return bk_cpu_new(err);
    if (strncmp(device, "cuda:", 5) == 0) {
        if (bk_parse_device(device, &ordinal) != 0) {
            bk_seterr(err, "device %.64s: bad CUDA device ordinal (expected \"cuda:N\", N in "
                           "0..%d without leading zeros)", device, BK_MAX_CUDA_ORDINAL);
            return NULL;
        }
#ifdef IKBO_CUDA
        return bk_cuda_new(ordinal, err);
#else
        bk_seterr(err, "device %.64s: this build has no CUDA support (built with CUDA=0)",
                  device);
        return NULL;
#endif
    }
    bk_seterr(err, "unknown device \"%.64s\" (expected \"cpu\" or \"cuda:N\")", device);
    return NULL;
}

bk_backend *bk_backend_new(const char *device, bk_err *err)
{
    bk_fault f;
    if (bk_fault_next_backend(&f, err))
        return NULL;
    bk_backend *be = backend_create(device, err);
    if (be)
        be->fault = f;
    return be;
}

int bk_bags_check(const bk_bag *bags, int n, bk_err *err)
{
    if (n < 1 || n > BK_MAX_BAGS || !bags) {
        bk_seterr(err, "embedding_bags: %d bags (expected 1..%d)", bags ? n : 0, BK_MAX_BAGS);
        return -1;
    }
    return 0;
}

int bk_bad_stride(const char *op, const char *what, int64_t ld, const char *of, int64_t width,
                  bk_err *err)
{
    if (ld >= width)
        return 0;
    bk_seterr(err, "%s: %s %lld is below %s = %lld", op, what, (long long)ld, of,
              (long long)width);
    return -1;
}

int bk_bad_copy(const char *op, size_t n, size_t elem, const void *dst, const void *src,
                bk_err *err)
{
    const char *unit = elem == 1 ? (n == 1 ? "byte" : "bytes") : (n == 1 ? "element" : "elements");
    if (n > SIZE_MAX / elem) {
        bk_seterr(err, "%s: %zu %s overflow size_t", op, n, unit);
        return -1;
    }
    if (n && (!dst || !src)) {
        bk_seterr(err, "%s: NULL buffer for %zu %s", op, n, unit);
        return -1;
    }
    return 0;
}

int bk_mlp2_check(int has_w, int rows, int in, int hid, int out, int w2_cols, int64_t nb1,
                  enum bk_act act1, enum bk_act act2, int ldx, int ldy, int a_in, int a_out,
                  int a_ldx, int64_t na_b, bk_err *err)
{
    if (!has_w) {
        bk_seterr(err, "mlp2: weight is NULL");
        return -1;
    }
    if (rows < 0) {
        bk_seterr(err, "mlp2: row count %d", rows);
        return -1;
    }
    if (w2_cols != hid) {
        bk_seterr(err, "mlp2: W2 has %d columns, W1 %d rows (the hidden width)", w2_cols, hid);
        return -1;
    }
    if (ldx < in || ldy < out) {
        bk_seterr(err, "mlp2: ldx %d / ldy %d smaller than in %d / out %d", ldx, ldy, in, out);
        return -1;
    }
    if (nb1 >= 0 && nb1 != hid) {
        bk_seterr(err, "mlp2: b1 has %lld elements, expected %d", (long long)nb1, hid);
        return -1;
    }
    if (act1 != BK_ACT_NONE && act1 != BK_ACT_RELU) {
        bk_seterr(err, "mlp2: hidden activation %d (none or relu)", (int)act1);
        return -1;
    }
    if ((int)act2 < 0 || act2 >= BK_ACT_COUNT) {
        bk_seterr(err, "mlp2: output activation %d", (int)act2);
        return -1;
    }
    if (a_in >= 0 && (a_out != out || a_ldx < a_in || (na_b >= 0 && na_b != out))) {
        bk_seterr(err, "mlp2: the addend's weight is [%d, %d] (want %d rows), its ldx %d, its "
                  "bias %lld elements (want %d)", a_out, a_in, out, a_ldx, (long long)na_b, out);
        return -1;
    }
    return 0;
}

int bk_grouped_check(int has_w, int in, int out, int nbias, int ldx, int64_t gx, int groups,
                     int g, enum bk_act act, int ldy, int64_t gy, bk_err *err)
{
    if (!has_w) {
        bk_seterr(err, "linear_grouped: weight is NULL");
        return -1;
    }
    if (nbias >= 0 && nbias != out) {
        bk_seterr(err, "linear_grouped: bias has %d values for %d outputs", nbias, out);
        return -1;
    }
    if (groups < 0 || g < 0 || (g > 0 && groups > INT32_MAX / g)) {
        bk_seterr(err, "linear_grouped: %d groups of %d rows", groups, g);
        return -1;
    }
    if (act != BK_ACT_NONE && act != BK_ACT_RELU) {
        bk_seterr(err, "linear_grouped: activation %d (only none and relu)", (int)act);
        return -1;
    }
    if (ldx < in || ldy < out) {
        bk_seterr(err, "linear_grouped: row strides %d/%d below widths %d/%d", ldx, ldy, in,
                  out);
        return -1;
    }
    if (groups > 1 && g > 0 &&
        (gx < (int64_t)(g - 1) * ldx + in || gy < (int64_t)(g - 1) * ldy + out)) {
        bk_seterr(err, "linear_grouped: group strides %lld/%lld overlap %d rows of %d/%d",
                  (long long)gx, (long long)gy, g, ldx, ldy);
        return -1;
    }
    return groups <= 1 || (gx == (int64_t)g * ldx && gy == (int64_t)g * ldy);
}
