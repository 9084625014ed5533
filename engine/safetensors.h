/* safetensors.h - validate a safetensors file and read its tensors as fp32.
 *
 * Why this exists: model weights arrive as standard safetensors (8-byte
 * little-endian header size N, N bytes of JSON header, then the data section)
 * from exporters we do not control. Everything in the header is checked
 * before any tensor byte is touched: size limits, dtypes (F32, F16, BF16),
 * shapes (overflow-checked), offsets inside the data section, and that the
 * tensors tile the data section exactly (no overlap, no hole, no trailing
 * bytes - the same rule as the reference `safetensors` library). Tensor data
 * is then read on demand, from memory or from a file descriptor with pread,
 * so a large file is never held twice.
 *
 * Ownership: st_open_* fill a caller-owned st_file; st_close frees what they
 * allocated (it never closes the fd or frees the memory buffer). An st_file is
 * read-only after opening; st_read_f32 may run from several threads.
 */
#ifndef IKBO_SAFETENSORS_H
#define IKBO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "../kernels/backend.h"

#define ST_MAX_HEADER ((uint64_t)100 << 20) /* header JSON bytes */
#define ST_MAX_DIMS 8

enum st_dtype { ST_F32 = 0, ST_F16 = 1, ST_BF16 = 2 };

typedef struct st_tensor {
    char *name;
    enum st_dtype dtype;
    int ndim;
    uint64_t shape[ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end; /* byte range within the data section */
} st_tensor;

typedef struct st_file {
    const char *fname;  /* for messages; not owned, must outlive the st_file */
    const uint8_t *mem; /* whole file in memory, or NULL to read from fd */
    int fd;
    uint64_t size;       /* whole file, bytes */
    uint64_t data_start; /* 8 + N */
    st_tensor *tensors;  /* sorted by name */
    size_t n;
} st_file;

/* Parse and validate the header of a file held in memory (buf, len). */
int st_open_mem(st_file *f, const char *fname, const uint8_t *buf, size_t len, bk_err *err);
/* Same for an open file of `size` bytes, read with pread. */
int st_open_fd(st_file *f, const char *fname, int fd, uint64_t size, bk_err *err);
void st_close(st_file *f);

/* Index of the tensor called name in f->tensors, or -1. */
long st_find(const st_file *f, const char *name);

/* Converts tensor t to fp32 into dst (t->numel floats). F16 and BF16 are
 * widened exactly; values are not checked (see st_first_nonfinite). */
int st_read_f32(const st_file *f, const st_tensor *t, float *dst, bk_err *err);

/* Index of the first NaN or Inf in x[0..n), or -1. */
long st_first_nonfinite(const float *x, size_t n);

size_t st_dtype_size(enum st_dtype d);
const char *st_dtype_name(enum st_dtype d);

/* Exact IEEE 754 binary16 / bfloat16 -> binary32 (subnormals, inf, NaN kept). */
float st_f16_to_f32(uint16_t h);
float st_bf16_to_f32(uint16_t b);

#endif
