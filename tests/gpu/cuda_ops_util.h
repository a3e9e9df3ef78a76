/* Helpers shared by the CUDA operator tests (test_cuda_ops*.c): device
 * buffers freed together, random and bf16-rounded host data, double
 * reference loops and the comparisons; tolerances are explained in
 * test_cuda_ops.c. */
#ifndef MT_TEST_CUDA_OPS_UTIL_H
#define MT_TEST_CUDA_OPS_UTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda_common.h"
#include "kernels/cuda_ops.h"
#include "testlib.h"

#define TOL_F32 1e-5
#define TOL_BF16_OUT 4e-3
#define TOL_BF16_VS_F32 1e-2
#define IGNORE (-100)

/* Device buffers of one test, freed together. */
typedef struct {
    void *p[64];
    int n;
} dev_pool;

void *dalloc(dev_pool *pool, size_t bytes);
void *dupload(dev_pool *pool, const void *h, size_t bytes);
/* n operand values of precision p: bf16 bits (rounded) in bf16, else fp32. */
void *dupload_op(dev_pool *pool, const float *v, size_t n, mt_precision p);
void dpoison(void *d, size_t bytes);
void download(void *h, const void *d, size_t bytes);
void pool_free(dev_pool *pool);
mt_cuda_ctx *gpu_ctx(void);
float *hrand(size_t n, unsigned long long seed, float lo, float hi);
uint16_t f2bf(float f);
float bf2f(uint16_t b);
uint16_t *to_bf16(const float *x, size_t n);
float *rounded(const float *x, size_t n);
float *bf16_to_f32_host(const uint16_t *x, size_t n);
float *to_float(const double *x, size_t n);
double rel_err_d(const float *a, const double *ref, size_t n);
void expect_close(const float *got, const double *ref, size_t n, double tol,
                  const char *what);
void ref_matmul(double *out, const float *inp, const float *w, const float *bias,
                size_t N, size_t IC, size_t OC);
void ref_matmul_bwd(double *dinp, double *dw, const float *dout, const float *inp,
                    const float *w, size_t N, size_t IC, size_t OC);
double *dcopy(const float *x, size_t n);

#endif
