/* AdamW on the GPU for the layers whose optimizer state lives there
 * (mt_cuda_backend_opts.device_optim_layers): the kernel gives the CPU
 * reference's bits, and training with any number of device layers gives
 * the losses and the final store (weights, m, v) of the CPU optimizer bit
 * for bit, also when the device layers start from a store that earlier
 * steps wrote. Exact equality is the claim: the kernel performs the same
 * fp32 operations in the same order, each rounded once. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "engine/optimizer.h"
#include "fixture.h"
#include "gpu_train.h"
#include "kernels/cuda_common.h"
#include "kernels/optim/optim_kernels.h"
#include "testlib.h"

static float *random_floats(size_t n, uint64_t seed, float lo, float hi) {
    float *x = malloc(n * sizeof *x);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        x[i] = lo + (hi - lo) * (float)((s >> 40) * (1.0 / 16777216.0));
    }
    return x;
}

static float *to_device(const float *h, size_t n) {
    float *d;
    CUDA_CHECK(cudaMalloc((void **)&d, n * sizeof *d));
    CUDA_CHECK(cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice));
    return d;
}

static void expect_same_bits(const float *a, const float *d, size_t n, const char *what,
                             int set) {
    float *b = malloc(n * sizeof *b);
    CUDA_CHECK(cudaMemcpy(b, d, n * sizeof *b, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(memcmp(&a[i], &b[i], 4), 0, "set %d, %s[%zu]: CPU %.9g, GPU %.9g", set,
                     what, i, a[i], b[i]);
    free(b);
}

Test(gpu_adamw, kernel_is_bitwise_the_cpu_reference) {
    mt_test_need_gpu();
    mt_error err;
    mt_optim_cpu cpu;
    cr_assert_eq(mt_optim_cpu_init_isa(&cpu, MT_ISA_SCALAR, 1, &err), 0, "%s", err.msg);
    const size_t n = 100003; /* odd: no size assumption; offset 1 below: unaligned */
    /* beta1 0.3 takes torch's other lerp branch; tiny moments reach
     * subnormal square roots; the clip coefficient scales the gradient */
    struct { double lr, b1, b2, wd; int64_t step; float gscale, vscale; } sets[] = {
        {3e-4, 0.9, 0.95, 0.1, 1, 1.0f, 1e-4f},
        {1e-2, 0.9, 0.999, 0.0, 7, 0.37f, 1e-4f},
        {2e-3, 0.3, 0.95, 0.01, 3, 1.0f, 1e-4f},
        {1e-3, 0.9, 0.95, 0.1, 1000, 0.5f, 1e-38f},
    };
    for (int k = 0; k < (int)(sizeof sets / sizeof *sets); k++) {
        float *p = random_floats(n, 10 + k, -1.0f, 1.0f);
        float *m = random_floats(n, 20 + k, -1e-2f, 1e-2f);
        float *v = random_floats(n, 30 + k, 0.0f, sets[k].vscale);
        float *g = random_floats(n, 40 + k, -2.0f, 2.0f);
        for (size_t i = 0; i < n; i += 97) g[i] = 0.0f; /* a zero gradient among the rest */
        float *dp = to_device(p, n), *dm = to_device(m, n), *dv = to_device(v, n);
        float *dg = to_device(g, n);
        mt_adamw_hparams h = {.lr = sets[k].lr, .beta1 = sets[k].b1, .beta2 = sets[k].b2,
                              .eps = 1e-8, .step = sets[k].step};
        mt_adamw_update(&cpu, p + 1, m + 1, v + 1, g + 1, NULL, n - 1, &h, sets[k].wd,
                        sets[k].gscale);
        mt_adamw_coefs c = mt_adamw_coefs_make(&h, sets[k].wd, sets[k].gscale);
        mt_cuda_adamw(0, dp + 1, dm + 1, dv + 1, dg + 1, n - 1, &c);
        CUDA_CHECK(cudaDeviceSynchronize());
        expect_same_bits(p, dp, n, "p", k);
        expect_same_bits(m, dm, n, "m", k);
        expect_same_bits(v, dv, n, "v", k);
        float *dev[] = {dp, dm, dv, dg}, *host[] = {p, m, v, g};
        for (int i = 0; i < 4; i++) {
            CUDA_CHECK(cudaFree(dev[i]));
            free(host[i]);
        }
    }
}

static void expect_store_equal(const mt_host_store *a, const mt_host_store *b, size_t n,
                               const char *what) {
    cr_assert_eq(memcmp(a->w, b->w, n * 4), 0, "%s: weights differ", what);
    cr_assert_eq(memcmp(a->m, b->m, n * 4), 0, "%s: first moments differ", what);
    cr_assert_eq(memcmp(a->v, b->v, n * 4), 0, "%s: second moments differ", what);
}

/* A copy of the fixture's store after training with device_optim_layers = dev. */
static void train_dev(mt_fixture *f, mt_gpu_precision prec, int dev, int steps, double *losses,
                      mt_host_store *out) {
    mt_error err;
    mt_fixture_reset(f);
    mt_optimizer opt;
    mt_test_optimizer(&opt, steps);
    mt_cuda_backend_opts o = {.precision = prec, .gpu_grads = 0, .device_optim_layers = dev};
    mt_test_train_steps(&f->cfg, &f->table, &f->store, f->T, &o, &opt, 0, steps, losses);
    cr_assert_eq(mt_host_store_create(out, &f->table, 0, &err), 0, "%s", err.msg);
    size_t bytes = f->table.total * sizeof(float);
    memcpy(out->w, f->store.w, bytes);
    memcpy(out->m, f->store.m, bytes);
    memcpy(out->v, f->store.v, bytes);
}

/* The embedding alone, the first blocks, and every layer (the head too)
 * updated on the GPU: the losses and the store the run leaves are the CPU
 * optimizer's, for a tied model (the head reads layer 0's device weights)
 * and an untied one, in fp32 and bf16. */
Test(gpu_adamw, device_layers_train_bitwise_like_the_cpu_optimizer, .timeout = 240) {
    mt_test_need_gpu();
    enum { S = 8 };
    const char *models[] = {"qwen2_bias_tied", "llama_gqa"};
    for (int mi = 0; mi < 2; mi++) {
        mt_fixture f;
        mt_fixture_open(&f, models[mi]);
        int nl = f.table.n_layers, devs[] = {1, 2, nl};
        for (int pi = 0; pi < 2; pi++) {
            mt_gpu_precision prec = pi ? MT_GPU_BF16 : MT_GPU_FP32;
            double ref[S], got[S];
            mt_host_store ref_store, got_store;
            train_dev(&f, prec, 0, S, ref, &ref_store);
            for (int di = 0; di < 3; di++) {
                train_dev(&f, prec, devs[di], S, got, &got_store);
                for (int s = 0; s < S; s++)
                    cr_assert_eq(got[s], ref[s], "%s %s, %d device layers, step %d: loss "
                                 "%.9g vs %.9g", models[mi], pi ? "bf16" : "fp32", devs[di], s,
                                 got[s], ref[s]);
                char what[128];
                snprintf(what, sizeof what, "%s %s, %d device layers", models[mi],
                         pi ? "bf16" : "fp32", devs[di]);
                expect_store_equal(&ref_store, &got_store, f.table.total, what);
                mt_host_store_free(&got_store);
            }
            mt_fixture_reset(&f); /* the steps moved every weight tensor */
            cr_assert_neq(memcmp(ref_store.w, f.store.w, f.table.total * 4), 0,
                          "%s: the run left the weights as loaded", models[mi]);
            mt_host_store_free(&ref_store);
        }
        mt_fixture_close(&f);
    }
}

/* A backend with device layers takes their weights and moments from the
 * store as earlier steps left them (a resumed run): 4 steps on the CPU
 * optimizer, then 4 with 2 device layers, equal 8 steps on the CPU one. */
Test(gpu_adamw, device_layers_start_from_the_store, .timeout = 120) {
    mt_test_need_gpu();
    enum { S = 8, H = 4 };
    mt_fixture f;
    mt_fixture_open(&f, "llama_gqa");
    double ref[S], got[S];
    mt_host_store ref_store, got_store;
    train_dev(&f, MT_GPU_BF16, 0, S, ref, &ref_store);
    mt_fixture_reset(&f);
    mt_optimizer opt;
    mt_test_optimizer(&opt, S);
    mt_cuda_backend_opts cpu_opt = {.precision = MT_GPU_BF16, .gpu_grads = 0};
    mt_cuda_backend_opts dev_opt = cpu_opt;
    dev_opt.device_optim_layers = 2;
    mt_test_train_steps(&f.cfg, &f.table, &f.store, f.T, &cpu_opt, &opt, 0, H, got);
    mt_test_train_steps(&f.cfg, &f.table, &f.store, f.T, &dev_opt, &opt, H, S - H, got + H);
    for (int s = 0; s < S; s++)
        cr_assert_eq(got[s], ref[s], "step %d: loss %.9g vs %.9g", s, got[s], ref[s]);
    got_store = f.store;
    expect_store_equal(&ref_store, &got_store, f.table.total, "resumed with device layers");
    mt_host_store_free(&ref_store);
    mt_fixture_close(&f);
}
