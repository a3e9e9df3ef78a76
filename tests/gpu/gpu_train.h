/* Training loops shared by the GPU tests: the same random batches and the
 * same optimizer for every run, so that placements and backends compare. */
#ifndef MT_TEST_GPU_TRAIN_H
#define MT_TEST_GPU_TRAIN_H

#include <stdint.h>

#include "backend/cuda/backend_cuda.h"
#include "host/store.h"
#include "model/config.h"
#include "model/params.h"

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

#endif
