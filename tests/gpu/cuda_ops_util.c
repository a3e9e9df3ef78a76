/* Helpers of the CUDA operator tests (cuda_ops_util.h). */
#include "cuda_ops_util.h"

void *dalloc(dev_pool *pool, size_t bytes) {
    cr_assert(pool->n < 64);
    void *p;
    CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : 16));
    CUDA_CHECK(cudaMemset(p, 0xff, bytes ? bytes : 16)); /* NaN in fp32 and bf16 */
    pool->p[pool->n++] = p;
    return p;
}

void *dupload(dev_pool *pool, const void *h, size_t bytes) {
    void *p = dalloc(pool, bytes);
    CUDA_CHECK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    return p;
}

void *dupload_op(dev_pool *pool, const float *v, size_t n, mt_precision p) {
    if (p != MT_PREC_BF16) return dupload(pool, v, n * sizeof(float));
    uint16_t *b = to_bf16(v, n);
    void *d = dupload(pool, b, n * sizeof *b);
    free(b);
    return d;
}

void dpoison(void *d, size_t bytes) { CUDA_CHECK(cudaMemset(d, 0xff, bytes)); }

void download(void *h, const void *d, size_t bytes) {
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

void pool_free(dev_pool *pool) {
    for (int i = 0; i < pool->n; i++) CUDA_CHECK(cudaFree(pool->p[i]));
    pool->n = 0;
}

/* A context on the default stream, or skip the test without a GPU. */
mt_cuda_ctx *gpu_ctx(void) {
    if (mt_cuda_device_count() <= 0) cr_skip_test("no CUDA device: GPU test skipped");
    mt_cuda_ctx *ctx;
    mt_error err;
    cr_assert_eq(mt_cuda_ctx_create(&ctx, 0, 0, &err), 0, "%s", err.msg);
    return ctx;
}

float *hrand(size_t n, unsigned long long seed, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    mt_test_fill_uniform(x, n, seed, lo, hi);
    return x;
}

uint16_t f2bf(float f) { /* round to nearest even; inputs here are finite */
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t *to_bf16(const float *x, size_t n) {
    uint16_t *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = f2bf(x[i]);
    return y;
}

float *rounded(const float *x, size_t n) { /* x through bf16 and back */
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = bf2f(f2bf(x[i]));
    return y;
}

float *bf16_to_f32_host(const uint16_t *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = bf2f(x[i]);
    return y;
}

float *to_float(const double *x, size_t n) {
    float *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

/* Relative error of a float result against a double reference. */
double rel_err_d(const float *a, const double *ref, size_t n) {
    float *r = to_float(ref, n);
    double e = mt_test_rel_err(a, r, n);
    free(r);
    return e;
}

void expect_close(const float *got, const double *ref, size_t n, double tol,
                  const char *what) {
    double e = rel_err_d(got, ref, n);
    cr_expect(e <= tol, "%s: relative error %.3g > %.3g", what, e, tol);
}

/* ---- reference loops (double) ---- */

/* out (N,OC) = inp (N,IC) @ w (OC,IC)^T + bias */
void ref_matmul(double *out, const float *inp, const float *w, const float *bias,
                size_t N, size_t IC, size_t OC) {
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (size_t i = 0; i < IC; i++) s += (double)inp[n * IC + i] * w[o * IC + i];
            out[n * OC + o] = s;
        }
}

/* dinp (N,IC) += dout @ w ; dw (OC,IC) += dout^T @ inp (both pre-filled) */
void ref_matmul_bwd(double *dinp, double *dw, const float *dout, const float *inp,
                    const float *w, size_t N, size_t IC, size_t OC) {
    for (size_t n = 0; n < N; n++)
        for (size_t o = 0; o < OC; o++) {
            double d = dout[n * OC + o];
            for (size_t i = 0; i < IC; i++) {
                if (dinp) dinp[n * IC + i] += d * w[o * IC + i];
                if (dw) dw[o * IC + i] += d * inp[n * IC + i];
            }
        }
}

double *dcopy(const float *x, size_t n) {
    double *y = malloc(n * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}
