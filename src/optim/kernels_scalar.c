/* The scalar reference kernels of the optimizer (kernels.h): the AdamW
 * update and the gradient sum of squares in the lane order every ISA
 * follows, and the tail and lane combination the vector kernels share. */
#include <math.h>

#include "optim/kernels.h"

void mt_adamw_kernel_scalar(float *p, float *m, float *v, const float *g, uint16_t *shadow,
                            size_t n, const mt_adamw_coefs *c, bool stream) {
    (void)stream;
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * c->gscale;
        float pi = p[i] * c->decay;
        float mi = m[i];
        mi = fmaf(c->m_weight, gi - mi, c->m_base_is_g ? gi : mi);
        float vi = fmaf(c->one_minus_beta2 * gi, gi, v[i] * c->beta2);
        float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
        pi = pi + (c->neg_step_size * mi) / denom;
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (shadow) shadow[i] = mt_bf16_rne(pi);
    }
}

double mt_sumsq_finish(double *acc, const float *tail, size_t n) {
    for (size_t j = 0; j < n; j++) acc[j] += (double)tail[j] * (double)tail[j];
    for (int w = MT_SUMSQ_LANES / 2; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) acc[j] = acc[j] + acc[j + w];
    return acc[0];
}

double mt_sumsq_kernel_scalar(const float *x, size_t n) {
    double acc[MT_SUMSQ_LANES] = {0};
    size_t i = 0;
    for (; i + MT_SUMSQ_LANES <= n; i += MT_SUMSQ_LANES)
        for (int j = 0; j < MT_SUMSQ_LANES; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
    return mt_sumsq_finish(acc, x + i, n - i);
}
