/* Training loops shared by the GPU tests: the same random batches and the
 * same optimizer for every run, so that placements and backends compare. */
#ifndef MT_TEST_GPU_TRAIN_H
#define MT_TEST_GPU_TRAIN_H

#include <stdint.h>

#include "backend/cuda/backend_cuda.h"
#include "engine/optimizer.h"
#include "host/store.h"
#include "model/config.h"
#include "model/params.h"
#include "fixture.h"

/* Skips the calling test when no CUDA device is visible. */
void mt_test_need_gpu(void);

/* Random tokens and targets (every fifth target ignored), the same for a
 * given seed. */
void mt_test_make_batch(const mt_config *cfg, int64_t n, uint64_t seed, int32_t *tok,
                        int32_t *tgt);

/* Trains `steps` steps of 2 micro-batches of (1, T) from the store as it
 * is (the caller resets it). GPU runs use the optimizer pipeline overlapped
 * with the next step's forward, the CPU run the plain optimizer step.
 * homes (or NULL: gpu_grads for every layer) and bf16 host gradients. */
void mt_test_train(const mt_config *cfg, const mt_param_table *t, mt_host_store *s, int64_t T,
                   int gpu, mt_gpu_precision prec, int gpu_grads, const mt_layer_home *homes,
                   int grad_bf16, int steps, double *losses);

/* The tests' AdamW (betas 0.9/0.95, decay 0.1, clipping at 1, cosine
 * schedule over `steps` with 3 warm-up steps). */
void mt_test_optimizer(mt_optimizer *opt, int steps);

/* Steps first..first+steps-1 (batches seeded by the step) with opt, on a
 * GPU backend made with o (the pipeline overlapped, the store current at
 * the end), or with o NULL on the CPU backend and the plain step. */
void mt_test_train_steps(const mt_config *cfg, const mt_param_table *t, mt_host_store *s,
                         int64_t T, const mt_cuda_backend_opts *o, mt_optimizer *opt,
                         int first, int steps, double *losses);

/* fp32 logits against the HF fixture: TF32 off, summation order only
 * (observed < 1e-6 dense, 4.2e-7 MoE), with the margin of the other GPU
 * bounds. */
#define MT_TEST_TOL32_LOGITS 3e-5

/* One training step of the fixture's batch as M micro-batches on the GPU
 * (host checkpoints or not): returns the loss and leaves every gradient in
 * the store's g (poisoned first, so each must be written). Checks the
 * per-layer norms against g and, in fp32 with M = 1 and no aux loss, the
 * logits against the fixture's. */
double mt_test_gpu_step(mt_fixture *f, mt_gpu_precision prec, int M, int host_saved);

#endif
