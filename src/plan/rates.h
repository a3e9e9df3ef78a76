/* Rates of a machine for the placement planner's step-time model: the
 * defaults (measured on an H200), the GPUs it knows by name (assumed, for a
 * described machine), and the JSON file of `megatrain calibrate`. A probe
 * that measures them on this machine's GPU is the CUDA backend's
 * (backend/cuda/planner_probe.h). Plain C, in every build. */
#ifndef MT_PLAN_RATES_H
#define MT_PLAN_RATES_H

#include <stdint.h>

#include "util/error.h"

/* Rates of the machine. Compute comes either from a probe of the very
 * layer shape (layer_* > 0, for that cfg/M/B/T) or from the FLOP rates. */
typedef struct mt_rates {
    char source[96];          /* where the numbers come from, for printing */
    double gemm_tflops;       /* matrix products on layer-sized shapes */
    double attn_fwd_tflops, attn_bwd_tflops; /* causal flash attention, counted as FA does */
    double hbm_gbs;           /* device memory, for element-wise passes */
    double h2d_gbs, d2h_gbs;  /* pinned copies, one direction alone */
    double duplex;            /* fraction of those rates left with both directions busy */
    double adam_gparams;      /* CPU AdamW, all threads (a rank of several: its share) */
    /* collectives between the ranks of a data-parallel run, per GPU: the
     * bus bandwidth of an all-gather or reduce-scatter (NCCL's busbw) */
    double link_gbs;
    /* the disk tier (megatrain calibrate --nvme-dir): GB/s written, read,
     * and moved with both at once; 0: not measured */
    double disk_write_gbs, disk_read_gbs, disk_both_gbs;
    /* probed times of one decoder layer and the head at the plan's shape */
    double layer_fwd_s, layer_bwd_s, layer_bwd_kept_s, head_s, embed_s;
    /* a Gemma layer's backward whose down projection's output was kept
     * (mt_cuda_backend_opts.keep_down_layers); 0: not probed */
    double layer_bwd_down_s;
    int64_t probe_C, probe_F, probe_V, probe_tokens, probe_T;
} mt_rates;

/* Rates measured on the H200 device machine (bench/RESULTS.md). */
void mt_rates_default(mt_rates *r);

/* A GPU the planner knows by name, for a machine described rather than
 * measured (megatrain plan --gpu): its memory and the rates it is assumed
 * to reach; the host's rates (AdamW, copy duplex) stay the defaults'. */
typedef struct mt_gpu_spec {
    const char *name;         /* h100, h200, a100, l40s, 4090 */
    const char *what;         /* the card, in words */
    double mem_gb;            /* GPU memory a run may take, GB */
    double h2d_gbs, d2h_gbs;  /* pinned copies over its PCIe link */
    double gemm_tflops;       /* bf16 products, fp32 accumulation */
    double attn_fwd_tflops, attn_bwd_tflops;
    double hbm_gbs;           /* device memory, element-wise passes */
} mt_gpu_spec;

/* The names mt_gpu_spec_find knows, for messages and --help. */
#define MT_GPU_NAMES "h100|h200|a100|l40s|4090"

/* The spec of a GPU by name (case-insensitive), NULL when unknown. */
const mt_gpu_spec *mt_gpu_spec_find(const char *name);
/* MT_GPU_NAMES. */
const char *mt_gpu_spec_names(void);
/* r = the defaults with g's GPU rates. */
void mt_rates_for_gpu(mt_rates *r, const mt_gpu_spec *g);

/* Reads / writes rates as JSON (megatrain calibrate). */
int mt_rates_load(mt_rates *r, const char *path, mt_error *err);
int mt_rates_save(const mt_rates *r, const char *path, mt_error *err);

#endif
