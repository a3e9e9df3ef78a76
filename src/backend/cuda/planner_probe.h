/* What the placement planner measures on this machine's GPU (CUDA builds
 * only; the planner itself, src/plan/, is plain C in every build). */
#ifndef MT_BACKEND_CUDA_PLANNER_PROBE_H
#define MT_BACKEND_CUDA_PLANNER_PROBE_H

#include <stdint.h>

#include "backend/cuda/backend_cuda.h"
#include "plan/rates.h"

/* Measures this machine: copies, CPU AdamW, and one decoder layer and the
 * head of cfg's shape at M x (B, T) on the GPU (a few seconds). */
int mt_rates_probe(mt_rates *r, const mt_config *cfg, int M, int64_t B, int64_t T,
                   mt_gpu_precision prec, mt_error *err);

#endif
