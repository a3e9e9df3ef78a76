/* The AdamW update of the SIMD kernels, written once for every vector width.
 * adamw_avx2.c (8 floats) and adamw_avx512.c (16 floats) each define, then
 * include this file, which defines the kernel ADAMW_KERNEL names
 * (mt_adamw_kernel_avx2, mt_adamw_kernel_avx512: optim/kernels.h):
 *   VF, VI        the vectors of floats and of int32;  VMASK  a lane mask;
 *   SIMD(op)      the intrinsic of that width: SIMD(add_ps) = _mm256_add_ps;
 *   VF_BITS(x)    the bits of x as a VI;
 *   VMASK_ALL(on) every lane set, or none;
 *   VSELECT(k, a, b)  b in the lanes of k, a elsewhere;
 * and, after it, vstore_bf16(dst, x, stream): the bf16 bits of x (bf16_rne,
 * and NaN -> 0x7FC0) to dst, as VW uint16_t.
 * The operations and their order are the scalar reference's (adamw.c), hence
 * the same bits; the tail goes to the scalar code. */
#ifndef MT_OPTIM_ADAMW_SIMD_H
#define MT_OPTIM_ADAMW_SIMD_H

#include <immintrin.h>

#include "optim/kernels.h"

#define VW (sizeof(VF) / sizeof(float))

// Software prefetch this many floats (8 KiB) ahead in each stream. On the
// 16-core device host, 16 threads: none 4.7-6.3, 4 KiB ahead 5.1-6.3, 8 KiB
// ahead 5.9-6.5 Gparam/s (noisy shared host; same-run comparisons); one
// thread: 0.88 -> 1.08. Hardware prefetchers alone keep too few lines in
// flight for 4 read streams. Prefetches past the end of an array do not fault.
#define PREFETCH_FLOATS 2048

static inline void prefetch_ahead(const float *p, const float *m, const float *v, const float *g,
                                  size_t i) {
    _mm_prefetch((const char *)(g + i + PREFETCH_FLOATS), _MM_HINT_T0);
    _mm_prefetch((const char *)(p + i + PREFETCH_FLOATS), _MM_HINT_T0);
    _mm_prefetch((const char *)(m + i + PREFETCH_FLOATS), _MM_HINT_T0);
    _mm_prefetch((const char *)(v + i + PREFETCH_FLOATS), _MM_HINT_T0);
}

/* Per lane, the bf16 bits of x in the low 16 of its 32, rounded to nearest
 * even (NaN not handled): (u + 0x7FFF + bit 16 of u) >> 16. */
static inline VI bf16_rne(VF x) {
    VI u = VF_BITS(x);
    VI lsb = SIMD(srli_epi32)(SIMD(slli_epi32)(u, 15), 31); // bit 16 of u
    VI r = SIMD(add_epi32)(SIMD(add_epi32)(u, SIMD(set1_epi32)(0x7FFF)), lsb);
    return SIMD(srli_epi32)(r, 16);
}

static inline void vstore_bf16(uint16_t *dst, VF x, bool stream);

/* p, m, v, shadow (n) updated from g (n) as mt_adamw_kernel_scalar does;
 * stream: non-temporal stores (the arrays are not read again soon). */
void ADAMW_KERNEL(float *p, float *m, float *v, const float *g, uint16_t *shadow, size_t n,
                  const mt_adamw_coefs *c, bool stream) {
    const VF gscale = SIMD(set1_ps)(c->gscale);
    const VF decay = SIMD(set1_ps)(c->decay);
    const VF m_weight = SIMD(set1_ps)(c->m_weight);
    const VMASK base_is_g = VMASK_ALL(c->m_base_is_g);
    const VF beta2 = SIMD(set1_ps)(c->beta2);
    const VF one_minus_beta2 = SIMD(set1_ps)(c->one_minus_beta2);
    const VF bc2_sqrt = SIMD(set1_ps)(c->bc2_sqrt);
    const VF eps = SIMD(set1_ps)(c->eps);
    const VF neg_step_size = SIMD(set1_ps)(c->neg_step_size);
    size_t i = 0;
    for (; i + VW <= n; i += VW) {
        if ((i & 15) == 0) prefetch_ahead(p, m, v, g, i); // once per 64-byte line
        VF gi = SIMD(mul_ps)(SIMD(loadu_ps)(g + i), gscale);
        VF pi = SIMD(mul_ps)(SIMD(loadu_ps)(p + i), decay);
        VF mi = SIMD(loadu_ps)(m + i);
        mi = SIMD(fmadd_ps)(m_weight, SIMD(sub_ps)(gi, mi), VSELECT(base_is_g, mi, gi));
        VF vi = SIMD(fmadd_ps)(SIMD(mul_ps)(one_minus_beta2, gi), gi,
                               SIMD(mul_ps)(SIMD(loadu_ps)(v + i), beta2));
        VF denom = SIMD(add_ps)(SIMD(div_ps)(SIMD(sqrt_ps)(vi), bc2_sqrt), eps);
        pi = SIMD(add_ps)(pi, SIMD(div_ps)(SIMD(mul_ps)(neg_step_size, mi), denom));
        if (stream) {
            SIMD(stream_ps)(p + i, pi);
            SIMD(stream_ps)(m + i, mi);
            SIMD(stream_ps)(v + i, vi);
        } else {
            SIMD(storeu_ps)(p + i, pi);
            SIMD(storeu_ps)(m + i, mi);
            SIMD(storeu_ps)(v + i, vi);
        }
        if (shadow) vstore_bf16(shadow + i, pi, stream);
    }
    if (stream) _mm_sfence();
    mt_adamw_kernel_scalar(p + i, m + i, v + i, g + i, shadow ? shadow + i : NULL, n - i, c, false);
}

#endif
