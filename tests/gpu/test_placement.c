/* Checkpoint placements that change where a layer's input comes from in
 * the backward: recomputed checkpoints (rebuilt from the previous layer's)
 * mixed with host and GPU ones give the losses of the all-GPU run bit for
 * bit, in fp32 and bf16, tied and untied, deeper than the HF fixtures so
 * that a block is rebuilt from another block. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/backend_cuda.h"
#include "gpu_train.h"
#include "kernels/cuda_ops.h"

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
