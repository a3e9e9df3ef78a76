/* Per-ISA kernels of the optimizer, private to src/optim. Each kernel works
 * on one contiguous range on the calling thread; adamw.c and clip.c split
 * the work over threads and pick the kernel. */
#ifndef MT_OPTIM_KERNELS_H
#define MT_OPTIM_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "optim/adamw.h"

typedef void (*mt_adamw_kernel)(float *p, float *m, float *v, const float *g, uint16_t *shadow,
                                size_t n, const mt_adamw_coefs *c, bool stream);

void mt_adamw_kernel_scalar(float *p, float *m, float *v, const float *g, uint16_t *shadow,
                            size_t n, const mt_adamw_coefs *c, bool stream);
void mt_adamw_kernel_avx2(float *p, float *m, float *v, const float *g, uint16_t *shadow,
                          size_t n, const mt_adamw_coefs *c, bool stream);
void mt_adamw_kernel_avx512(float *p, float *m, float *v, const float *g, uint16_t *shadow,
                            size_t n, const mt_adamw_coefs *c, bool stream);

/* Sum of squares accumulated in double over MT_SUMSQ_LANES lanes: element i
 * goes to lane i % 16 in increasing i, lanes are combined by
 * mt_sumsq_combine. Every ISA follows this order, so all give the same bits. */
#define MT_SUMSQ_LANES 16
typedef double (*mt_sumsq_kernel)(const float *x, size_t n);
double mt_sumsq_kernel_scalar(const float *x, size_t n);
double mt_sumsq_kernel_avx2(const float *x, size_t n);
double mt_sumsq_kernel_avx512(const float *x, size_t n);
/* acc (16): lanes; the tail x[0..n) (n < 16) is added to lanes 0..n-1 first. */
double mt_sumsq_finish(double *acc, const float *tail, size_t n);

/* bf16 bits of x, round to nearest even, NaN -> 0x7FC0 (c10::BFloat16). */
static inline uint16_t mt_bf16_rne(float x) {
    union { float f; uint32_t u; } b = {x};
    if (x != x) return 0x7FC0;
    return (uint16_t)((b.u + 0x7FFFu + ((b.u >> 16) & 1u)) >> 16);
}

#endif
