/* AVX-512 kernels of the optimizer: the AdamW update 16 floats at a time
 * and the 16-lane double sum of squares. Same operations in the same order
 * as the scalar reference (adamw.c, clip.c), hence the same bits; tails go
 * to the scalar code. */
#include <immintrin.h>

#include "optim/kernels.h"

typedef __m512 VF;
typedef __m512i VI;
typedef __mmask16 VMASK;
#define SIMD(op) _mm512_##op
#define VF_BITS(x) _mm512_castps_si512(x)
#define VMASK_ALL(on) ((on) ? (__mmask16)0xFFFF : (__mmask16)0)
#define VSELECT(k, a, b) _mm512_mask_mov_ps(a, k, b)
#define ADAMW_KERNEL mt_adamw_kernel_avx512
#include "optim/adamw_simd.h"

// Not vcvtneps2bf16: it flushes subnormals, torch's conversion does not.
static inline void vstore_bf16(uint16_t *dst, VF x, bool stream) {
    VI r = bf16_rne(x);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
    __m256i h = _mm512_cvtepi32_epi16(r);
    if (stream) _mm256_stream_si256((__m256i *)dst, h);
    else _mm256_storeu_si256((__m256i *)dst, h);
}

double mt_sumsq_kernel_avx512(const float *x, size_t n) {
    // Two accumulators hold lanes 0-7 and 8-15; x*x is exact in double.
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 xi = _mm512_loadu_ps(x + i);
        __m512d d0 = _mm512_cvtps_pd(_mm512_castps512_ps256(xi));
        __m512d d1 = _mm512_cvtps_pd(_mm512_extractf32x8_ps(xi, 1));
        a0 = _mm512_fmadd_pd(d0, d0, a0);
        a1 = _mm512_fmadd_pd(d1, d1, a1);
    }
    double acc[MT_SUMSQ_LANES];
    _mm512_storeu_pd(acc + 0, a0);
    _mm512_storeu_pd(acc + 8, a1);
    return mt_sumsq_finish(acc, x + i, n - i);
}
