/* The mixture-of-experts module's state (moe_cuda.c) and its device
 * memory layout (moe_cuda_layout.c): one range carved in a fixed order, so
 * that the same code sizes it (also in a build without CUDA, for the
 * placement planner) and carves it at creation. Not a public interface:
 * use moe_cuda.h. */
#ifndef MT_BACKEND_CUDA_MOE_CUDA_INTERNAL_H
#define MT_BACKEND_CUDA_MOE_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/moe_cuda.h"
#include "util/mem.h"

#define MOE_ALIGN 256

struct mt_cuda_moe {
    size_t N, C, E, K, FE, FS, NK;
    mt_precision prec;
    size_t es; /* bytes of an operand */
    bool norm_topk, aux_on;
    double aux_coef;
    int train;
    double rows; /* MoE blocks x tokens counted this step (host: known without the device) */
    /* routing of the last forward */
    float *p;              /* (N, E) router logits, then their softmax */
    int32_t *sel;          /* (N, K) chosen experts, largest p first */
    float *wk;             /* (N, K) their routing weights */
    float *psel;           /* (N) sum of the chosen p */
    int32_t *start;        /* (E + 1) first grouped row of each expert */
    int32_t *row;          /* (N, K) grouped row of token n's j-th choice */
    int32_t *tok;          /* (NK) token of each grouped row */
    int32_t *hist;         /* grouping scratch (mt_cuda_moe_group_scratch) */
    float *xn32;           /* (N, C) bf16 precision: xn in fp32, for the router and shared gate */
    /* grouped rows, expert after expert; op = operand type */
    void *xg;              /* (NK, C) op: the tokens' inputs */
    void *hg, *hu, *hh;    /* (NK, FE) op: gate, up, silu(gate) * up */
    float *y;              /* (NK, C) expert outputs, before the weights */
    /* shared expert (FS > 0) */
    void *sg, *su, *sh;    /* (N, FS) op */
    float *sy;             /* (N, C) */
    float *sz;             /* (N) shared gate logit */
    /* backward */
    void *dy;              /* (NK, C) op */
    float *dhh;            /* (NK, FE) */
    void *dhg, *dhu;       /* (NK, FE) op */
    float *dxg;            /* (NK, C) */
    float *dwk;            /* (N, K) dL/d(routing weights) */
    float *dz;             /* (N, E) dL/d(router logits) */
    void *dsy;             /* (N, C) op */
    float *dsh;            /* (N, FS) */
    void *dsg, *dsu;       /* (N, FS) op */
    float *dsz;            /* (N) */
    void *gemm_scratch;    /* mt_cuda_moe_gemm_scratch_bytes(E) */
    /* the step's load-balancing counts */
    double *cnt, *psum;    /* (E) top-K selections and summed p of each expert */
};

/* Sets m's shape for cfg, N tokens and prec, and carves its buffers from a
 * (a with base NULL only counts; a->overflow when a size does not fit). */
void mt_cuda_moe_layout(mt_cuda_moe *m, const mt_config *c, size_t N, mt_precision prec,
                        mt_arena *a);

#endif
