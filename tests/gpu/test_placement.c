/* Checkpoint placements that change where a layer's input comes from in
 * the backward: recomputed checkpoints (rebuilt from the previous layer's)
 * mixed with host and GPU ones give the losses of the all-GPU run bit for
 * bit, in fp32 and bf16, tied and untied, deeper than the HF fixtures so
 * that a block is rebuilt from another block. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "engine/step.h"
#include "gpu_train.h"
#include "kernels/cuda_ops.h"
#include "testlib.h"

/* Six blocks, head dim 64 (the bf16 flash kernel and the fast path). */
static mt_config deep_config(int tied) {
    mt_config c;
    mt_config_default_tiny(&c);
    c.C = 256;
    c.NH = 4;
    c.NKV = 2;
    c.HD = 64;
    c.F = 512;
    c.V = 512;
    c.L = 6;
    c.max_pos = 128;
    c.tie_embeddings = tied;
    return c;
}

Test(placement, rebuilt_saved_inputs_match_all_gpu_bitwise, .timeout = 180) {
    mt_test_need_gpu();
    enum { S = 6 };
    mt_error err;
    for (int tied = 0; tied < 2; tied++) {
        mt_config cfg = deep_config(tied);
        mt_param_table t;
        mt_host_store s;
        cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
        cr_assert_eq(mt_host_store_create(&s, &t, 0, &err), 0, "%s", err.msg);
        int nl = t.n_layers; /* 8: embedding, blocks 1-6, head 7 */
        /* a: blocks 2, 4 rebuilt from 1, 3 (host, GPU); the last block's and
         * the head's inputs never leave the GPU. b: block 1 rebuilt from the
         * embedding, 3 from 2 (host), 5 from 4 (GPU). */
        mt_layer_home a[8], b[8];
        for (int l = 0; l < nl; l++) {
            a[l] = (mt_layer_home){.grad_host = l % 2, .saved_host = l == 1 || l == 5,
                                   .saved_recompute = l == 2 || l == 4 || l >= 6};
            b[l] = (mt_layer_home){.grad_host = !(l % 2), .saved_host = l == 2 || l == 6,
                                   .saved_recompute = l % 2 == 1};
        }
        for (int p = 0; p < 2; p++) {
            mt_gpu_precision prec = p ? MT_GPU_BF16 : MT_GPU_FP32;
            double ref[S], la[S], lb[S];
            mt_layer_home *runs[] = {NULL, a, b};
            double *out[] = {ref, la, lb};
            for (int r = 0; r < 3; r++) {
                mt_host_store_init_random(&s, 11, 0.02f);
                memset(s.m, 0, t.total * sizeof(float));
                memset(s.v, 0, t.total * sizeof(float));
                mt_test_train(&cfg, &t, &s, 128, 1, prec, r == 0, runs[r], 0, S, out[r]);
            }
            for (int i = 0; i < S; i++) {
                cr_assert_eq(la[i], ref[i], "%s %s step %d: placement a %.9g vs all-GPU %.9g",
                             tied ? "tied" : "untied", p ? "bf16" : "fp32", i, la[i], ref[i]);
                cr_assert_eq(lb[i], ref[i], "%s %s step %d: placement b %.9g vs all-GPU %.9g",
                             tied ? "tied" : "untied", p ? "bf16" : "fp32", i, lb[i], ref[i]);
            }
            cr_assert_neq(ref[0], ref[S - 1], "the loss never moved: nothing was trained");
        }
        mt_host_store_free(&s);
        mt_params_free(&t);
    }
}

/* Four blocks of width 640 over 4096 tokens: a micro-batch pair's saved
 * input is 5.2M values, more than one chunk of the bf16 conversion
 * (MT_SAVED_CHUNK, 4M values), so a chunk and a partial one. */
static mt_config wide_config(void) {
    mt_config c = deep_config(0);
    c.C = 640;
    c.NH = 10;
    c.NKV = 5;
    c.F = 1280;
    c.L = 4;
    c.max_pos = 4096;
    return c;
}

/* One step's gradients into s->g with every saved input on the host (fp32
 * or bf16) or on the GPU; returns the loss. */
static double step_grads(const mt_config *cfg, mt_param_table *t, mt_host_store *s, int64_t T,
                         int host, int saved_bf16) {
    mt_error err;
    mt_layer_home h[16];
    for (int l = 0; l < t->n_layers; l++)
        h[l] = (mt_layer_home){.grad_host = 1, .saved_host = (uint8_t)host};
    mt_cuda_backend_opts o = {.precision = MT_GPU_BF16, .homes = h, .keep_layers = 0,
                              .host_saved_bf16 = saved_bf16};
    mt_host_store_init_random(s, 5, 0.02f);
    mt_backend *be = mt_cuda_backend_create(cfg, t, s, 2, 1, T, &o, &err);
    cr_assert_not_null(be, "%s", err.msg);
    int32_t *tok = malloc(2 * T * sizeof *tok), *tgt = malloc(2 * T * sizeof *tgt);
    mt_test_make_batch(cfg, 2 * T, 3, tok, tgt);
    mt_batch b = {.M = 2, .B = 1, .T = T, .tokens = tok, .targets = tgt};
    double loss;
    memset(s->g, 0x7f, t->total * sizeof(float)); /* poison: every gradient is written */
    cr_assert_eq(mt_step_forward_backward(be, t->n_layers, &b, &loss, &err), 0, "%s", err.msg);
    mt_cuda_backend_wait_grads(be);
    mt_cuda_backend_free(be);
    free(tok);
    free(tgt);
    return loss;
}

Test(placement, bf16_saved_inputs_round_only_what_waits_on_the_host, .timeout = 180) {
    mt_test_need_gpu();
    mt_error err;
    mt_config cfg = wide_config();
    mt_param_table t;
    mt_host_store s;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_create(&s, &t, 1, &err), 0, "%s", err.msg);
    int64_t T = 4096;
    float *ref = malloc(t.total * sizeof *ref), *gpu = malloc(t.total * sizeof *gpu);
    double l_ref = step_grads(&cfg, &t, &s, T, 1, 0);
    memcpy(ref, s.g, t.total * sizeof *ref);
    /* on the GPU the option changes nothing: the bits of the fp32 run */
    double l_gpu = step_grads(&cfg, &t, &s, T, 0, 1);
    memcpy(gpu, s.g, t.total * sizeof *gpu);
    cr_assert_eq(l_gpu, l_ref, "GPU-saved loss %.9g vs %.9g", l_gpu, l_ref);
    cr_assert_eq(memcmp(gpu, ref, t.total * sizeof *ref), 0,
                 "saved inputs on the GPU: bf16 saved inputs changed the gradients");
    /* on the host: the forward goes on in fp32 (the same loss), the
     * backward recomputes each block from its rounded input */
    double l_bf = step_grads(&cfg, &t, &s, T, 1, 1);
    cr_assert_eq(l_bf, l_ref, "the forward changed: loss %.9g vs %.9g", l_bf, l_ref);
    for (int l = 0; l < t.n_layers; l++) {
        const mt_layer_desc *d = &t.layers[l];
        double e = mt_test_rel_err(s.g + d->offset, ref + d->offset, d->numel);
        cr_log_info("bf16 saved inputs: layer %d gradient rel err %.2e", l, e);
        /* the last block and the head run their backward from inputs still
         * on the GPU in fp32 from the forward: the same bits */
        if (l >= t.n_layers - 2) {
            cr_assert_eq(e, 0, "layer %d: its input never left the GPU, yet rel err %.3g", l, e);
            continue;
        }
        /* the blocks before are recomputed from inputs rounded to 8 bits of
         * mantissa (relative 2^-9 = 2e-3 each), and the embedding gets their
         * input gradients: the gradients move by about that much, observed
         * 2.1e-3 to 6.1e-3 on this model (H100); 3e-2 allows 5x the largest and fails a chunk
         * moved to the wrong place (errors of order 1) */
        cr_assert_lt(e, 3e-2, "layer %d: gradient rel err %.3g", l, e);
        cr_assert_gt(e, 0, "layer %d: the same bits: nothing was rounded", l);
    }
    free(ref);
    free(gpu);
    mt_host_store_free(&s);
    mt_params_free(&t);
}

/* The homes are read at creation only: the caller frees them after it
 * (the trainer does), and the backend's statistics, which count its pinned
 * host bytes, must not read them again. Poisoned after creation (every
 * flag set: every saved input rebuilt, an impossible placement the backend
 * would refuse), the statistics still give the creation's count. */
Test(placement, homes_are_read_at_creation_only, .timeout = 60) {
    mt_test_need_gpu();
    mt_error err;
    mt_config cfg = deep_config(0);
    mt_param_table t;
    mt_host_store s;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_host_store_create(&s, &t, 0, &err), 0, "%s", err.msg);
    mt_layer_home *h = malloc((size_t)t.n_layers * sizeof *h);
    for (int l = 0; l < t.n_layers; l++)
        h[l] = (mt_layer_home){.grad_host = 1, .saved_host = 1, .saved_disk = 0};
    mt_cuda_backend_opts o = {.precision = MT_GPU_BF16, .homes = h, .keep_layers = 0};
    size_t want = mt_cuda_backend_host_bytes(&cfg, &t, 2, 1, 64, &o);
    cr_assert_gt(want, 0, "host-saved inputs and host gradients take pinned memory");
    mt_backend *be = mt_cuda_backend_create(&cfg, &t, &s, 2, 1, 64, &o, &err);
    cr_assert_not_null(be, "%s", err.msg);
    memset(h, 0xFF, (size_t)t.n_layers * sizeof *h);
    mt_backend_stats st;
    mt_cuda_backend_stats(be, &st);
    cr_assert_eq(st.host_bytes, (double)want, "stats: %.0f host bytes, %zu at creation",
                 st.host_bytes, want);
    mt_cuda_backend_free(be);
    free(h);
    mt_host_store_free(&s);
    mt_params_free(&t);
}
