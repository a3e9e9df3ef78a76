/* Gradient sum of squares and the clip coefficient (see clip.h). */
#include "optim/clip.h"

#include <math.h>
#include <omp.h>

#include "optim/kernels.h"

// The sum is split into at most SUMSQ_MAX_BLOCKS blocks of at least
// SUMSQ_MIN_BLOCK elements, summed in parallel and then in block order: the
// split depends on n only, so the bits do not depend on the thread count.
#define SUMSQ_MAX_BLOCKS 1024
#define SUMSQ_MIN_BLOCK ((size_t)65536)

static mt_sumsq_kernel sumsq_kernel(mt_isa isa) {
    switch (isa) {
    case MT_ISA_AVX512: return mt_sumsq_kernel_avx512;
    case MT_ISA_AVX2: return mt_sumsq_kernel_avx2;
    default: return mt_sumsq_kernel_scalar;
    }
}

double mt_sumsq(const mt_optim_cpu *cpu, const float *x, size_t n) {
    const mt_sumsq_kernel kernel = sumsq_kernel(cpu->isa);
    size_t block = (n + SUMSQ_MAX_BLOCKS - 1) / SUMSQ_MAX_BLOCKS;
    block = block < SUMSQ_MIN_BLOCK ? SUMSQ_MIN_BLOCK : (block + 15) / 16 * 16;
    const size_t nblocks = (n + block - 1) / block;
    if (nblocks <= 1) return kernel(x, n);
    double partial[SUMSQ_MAX_BLOCKS];
    const int threads = cpu->threads > 0 ? cpu->threads : omp_get_max_threads();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (size_t b = 0; b < nblocks; b++) {
        size_t i = b * block;
        partial[b] = kernel(x + i, n - i < block ? n - i : block);
    }
    double total = 0;
    for (size_t b = 0; b < nblocks; b++) total += partial[b];
    return total;
}

float mt_clip_coef(double total_sumsq, float max_norm, float *norm_out) {
    float norm = (float)sqrt(total_sumsq);
    if (norm_out) *norm_out = norm;
    float coef = (1.0f / (norm + 1e-6f)) * max_norm;
    return coef > 1.0f ? 1.0f : coef;
}
