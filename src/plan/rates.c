/* Rates of a machine (rates.h): the defaults, the GPUs known by name, the
 * JSON file of megatrain calibrate. */
#include "plan/rates.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "io/file.h"

/* Measured on the H200: products by cuBLASLt; attention by the Hopper
 * kernels at seq 2048, 32/8 heads, HD 128 (bench/RESULTS.md, 0e176a7:
 * 561 forward, 409-434 backward). */
void mt_rates_default(mt_rates *r) {
    /* link: NVLink between the GPUs of one server; an all-reduce of 1 GiB
     * through NCCL ran at 329-361 GB/s bus bandwidth on the 2- and 4-H100
     * machines (NV18) the project measures on */
    *r = (mt_rates){.gemm_tflops = 700, .attn_fwd_tflops = 560, .attn_bwd_tflops = 415,
                    .hbm_gbs = 2500, .h2d_gbs = 55, .d2h_gbs = 55, .duplex = 0.88,
                    .adam_gparams = 4.5, .link_gbs = 300};
    snprintf(r->source, sizeof r->source, "H200 defaults");
}

/* ---- GPUs by name ----
 * What a described machine is assumed to reach: not measurements of this
 * machine (megatrain calibrate measures one). h200 is the defaults above.
 * h100: the same Hopper kernels measured on H100 80GB HBM3 instances
 * (bench/RESULTS.md: attention 556-561 forward, 414-428 backward at 0e176a7;
 * the products run at the H200's rate there, both having the same tensor
 * cores and clocks); its device memory 3.35 TB/s against the H200's 4.8,
 * so 2500 * 3.35 / 4.8 for element-wise passes; the same PCIe Gen5 host
 * link. The others are assumptions derived from vendor data sheets, not
 * measured by this project: products at about 70% of the dense bf16
 * tensor peak (with fp32 accumulation), attention on the mma.sync kernels
 * at the fraction of that peak they reach on Hopper (216-233 of 989 forward,
 * 163-165 backward: bench/RESULTS.md), device memory at about 75% of its
 * peak, and pinned copies over PCIe Gen4 x16 at 25 GB/s each way. The
 * attention numbers are likely low on Ampere and Ada, where mma.sync is
 * the full-rate instruction; `megatrain calibrate` on the card replaces
 * them all. Memory: the card's in GiB rounded down, as the H200's 139, which
 * the budget reads as GB: a margin for the driver's context. */
static const mt_gpu_spec gpu_specs[] = {
    /* measured (H200) and derived from measurements (H100) */
    {"h200", "NVIDIA H200 141 GB", 139, 55, 55, 700, 560, 415, 2500},
    {"h100", "NVIDIA H100 80 GB SXM", 79, 55, 55, 700, 560, 415, 1750},
    /* A100 80 GB SXM: 312 TFLOP/s dense bf16, 2.04 TB/s HBM2e, PCIe Gen4 */
    {"a100", "NVIDIA A100 80 GB", 79, 25, 25, 220, 70, 52, 1500},
    /* L40S: 362 TFLOP/s dense bf16 with fp32 accumulation, 0.86 TB/s GDDR6,
     * 48 GB, PCIe Gen4 */
    {"l40s", "NVIDIA L40S 48 GB", 45, 25, 25, 250, 80, 60, 650},
    /* GeForce RTX 4090: 165 TFLOP/s dense bf16 with fp32 accumulation (half
     * its fp16-accumulate rate), 1.01 TB/s GDDR6X, 24 GB, PCIe Gen4 */
    {"4090", "NVIDIA GeForce RTX 4090 24 GB", 23, 25, 25, 115, 37, 27, 750},
};

const mt_gpu_spec *mt_gpu_spec_find(const char *name) {
    for (size_t i = 0; name && i < sizeof gpu_specs / sizeof *gpu_specs; i++)
        if (!strcasecmp(name, gpu_specs[i].name)) return &gpu_specs[i];
    return NULL;
}

const char *mt_gpu_spec_names(void) { return MT_GPU_NAMES; }

/* The rates an mt_gpu_spec gives, under the same names as in mt_rates. */
#define GPU_RATE_FIELDS(X) \
    X(gemm_tflops) X(attn_fwd_tflops) X(attn_bwd_tflops) X(hbm_gbs) X(h2d_gbs) X(d2h_gbs)

void mt_rates_for_gpu(mt_rates *r, const mt_gpu_spec *g) {
    mt_rates_default(r);
#define COPY(f) r->f = g->f;
    GPU_RATE_FIELDS(COPY)
#undef COPY
    snprintf(r->source, sizeof r->source, "%s (assumed rates, --gpu %s)", g->what, g->name);
}

/* ---- JSON ---- */

#define RATE_FIELDS(X)                                                                  \
    GPU_RATE_FIELDS(X)                                                                  \
    X(duplex) X(adam_gparams) X(layer_fwd_s) X(layer_bwd_s) X(layer_bwd_kept_s) X(head_s) \
    X(embed_s) X(layer_bwd_down_s) X(link_gbs) X(disk_write_gbs) X(disk_read_gbs)            \
    X(disk_both_gbs)
#define SHAPE_FIELDS(X) X(probe_C) X(probe_F) X(probe_V) X(probe_tokens) X(probe_T)

int mt_rates_save(const mt_rates *r, const char *path, mt_error *err) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "source", r->source);
#define ADD(f) cJSON_AddNumberToObject(o, #f, (double)r->f);
    RATE_FIELDS(ADD)
    SHAPE_FIELDS(ADD)
#undef ADD
    char *txt = cJSON_Print(o);
    cJSON_Delete(o);
    mt_atomic_file f;
    int rc = mt_atomic_open(&f, path, err);
    if (!rc) rc = mt_write_all(f.fd, txt, strlen(txt), path, err);
    if (!rc) rc = mt_atomic_commit(&f, err);
    else mt_atomic_abort(&f);
    free(txt);
    return rc;
}

int mt_rates_load(mt_rates *r, const char *path, mt_error *err) {
    size_t len;
    char *txt;
    if (mt_read_file(path, &txt, &len, err)) return -1;
    cJSON *o = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return mt_errorf(err, "%s: not a JSON object of rates; write one with megatrain "
                         "calibrate", path);
    }
    mt_rates_default(r);
#define GET(f)                                                                          \
    {                                                                                   \
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, #f);                       \
        if (x && !cJSON_IsNumber(x)) {                                                  \
            cJSON_Delete(o);                                                            \
            return mt_errorf(err, "%s: field '%s' must be a number", path, #f);         \
        }                                                                               \
        if (x) r->f = x->valuedouble;                                                   \
    }
    RATE_FIELDS(GET)
    SHAPE_FIELDS(GET)
#undef GET
    cJSON_Delete(o);
    double must[] = {r->gemm_tflops, r->h2d_gbs, r->d2h_gbs, r->adam_gparams, r->hbm_gbs};
    for (size_t i = 0; i < sizeof must / sizeof *must; i++)
        if (!(must[i] > 0))
            return mt_errorf(err, "%s: rates must be positive (gemm_tflops, h2d_gbs, d2h_gbs, "
                             "adam_gparams, hbm_gbs)", path);
    snprintf(r->source, sizeof r->source, "%s", path);
    return 0;
}
