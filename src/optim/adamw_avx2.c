/* AVX2 + FMA kernels of the optimizer: the AdamW update 8 floats at a time
 * and the 16-lane double sum of squares. Same operations in the same order
 * as the scalar reference (adamw.c, clip.c), hence the same bits; tails go
 * to the scalar code. */
#include <immintrin.h>

#include "optim/kernels.h"

typedef __m256 VF;
typedef __m256i VI;
typedef __m256 VMASK; // a blendv mask: all bits of a lane set, or none
#define SIMD(op) _mm256_##op
#define VF_BITS(x) _mm256_castps_si256(x)
#define VMASK_ALL(on) _mm256_castsi256_ps(_mm256_set1_epi32((on) ? -1 : 0))
#define VSELECT(k, a, b) _mm256_blendv_ps(a, b, k)
#define ADAMW_KERNEL mt_adamw_kernel_avx2
#include "optim/adamw_simd.h"

static inline void vstore_bf16(uint16_t *dst, VF x, bool stream) {
    VI r = bf16_rne(x);
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    r = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(r),
                                             _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC0)), nan));
    __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    if (stream) _mm_stream_si128((__m128i *)dst, h);
    else _mm_storeu_si128((__m128i *)dst, h);
}

double mt_sumsq_kernel_avx2(const float *x, size_t n) {
    // Four accumulators hold lanes 0-3, 4-7, 8-11, 12-15. x*x is exact in
    // double, so fma(x, x, acc) rounds once like the scalar acc += x*x.
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 lo = _mm256_loadu_ps(x + i), hi = _mm256_loadu_ps(x + i + 8);
        __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(lo));
        __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(lo, 1));
        __m256d d2 = _mm256_cvtps_pd(_mm256_castps256_ps128(hi));
        __m256d d3 = _mm256_cvtps_pd(_mm256_extractf128_ps(hi, 1));
        a0 = _mm256_fmadd_pd(d0, d0, a0);
        a1 = _mm256_fmadd_pd(d1, d1, a1);
        a2 = _mm256_fmadd_pd(d2, d2, a2);
        a3 = _mm256_fmadd_pd(d3, d3, a3);
    }
    double acc[MT_SUMSQ_LANES];
    _mm256_storeu_pd(acc + 0, a0);
    _mm256_storeu_pd(acc + 4, a1);
    _mm256_storeu_pd(acc + 8, a2);
    _mm256_storeu_pd(acc + 12, a3);
    return mt_sumsq_finish(acc, x + i, n - i);
}
