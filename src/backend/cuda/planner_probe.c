/* Rates for the planner measured on this machine (planner_probe.h): pinned
 * copies each way and both at once, the CPU AdamW, one decoder layer and
 * the head of the run's shape on the GPU; and the GPU's free memory. */
#include "backend/cuda/planner_probe.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "engine/step.h"
#include "engine/trace.h"
#include "io/file.h"
#include "kernels/cuda_common.h"
#include "optim/adamw.h"
#include "util/mem.h"
#include "util/sys.h"

/* ---- copies ---- */

static double copy_gbs(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                       cudaStream_t s) {
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s)); /* warm-up */
    CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < 4; i++) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
    CUDA_CHECK(cudaEventRecord(b, s));
    CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    return 4.0 * bytes / (ms / 1e3) / 1e9;
}

static void probe_copies(mt_rates *r) {
    size_t bytes = (size_t)256 << 20;
    char *h1, *h2, *d1, *d2;
    CUDA_CHECK(cudaMallocHost((void **)&h1, bytes));
    CUDA_CHECK(cudaMallocHost((void **)&h2, bytes));
    CUDA_CHECK(cudaMalloc((void **)&d1, bytes));
    CUDA_CHECK(cudaMalloc((void **)&d2, bytes));
    memset(h1, 1, bytes);
    memset(h2, 2, bytes);
    cudaStream_t s1, s2;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    r->h2d_gbs = copy_gbs(d1, h1, bytes, cudaMemcpyHostToDevice, s1);
    r->d2h_gbs = copy_gbs(h2, d2, bytes, cudaMemcpyDeviceToHost, s2);
    /* both at once: 8 copies each way on two streams, timed on the host */
    CUDA_CHECK(cudaDeviceSynchronize());
    double t0 = mt_now_s();
    for (int i = 0; i < 8; i++) {
        CUDA_CHECK(cudaMemcpyAsync(d1, h1, bytes, cudaMemcpyHostToDevice, s1));
        CUDA_CHECK(cudaMemcpyAsync(h2, d2, bytes, cudaMemcpyDeviceToHost, s2));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    double both = 2.0 * 8 * bytes / (mt_now_s() - t0) / 1e9;
    r->duplex = both / (r->h2d_gbs + r->d2h_gbs);
    if (r->duplex > 1) r->duplex = 1;
    CUDA_CHECK(cudaStreamDestroy(s1));
    CUDA_CHECK(cudaStreamDestroy(s2));
    CUDA_CHECK(cudaFreeHost(h1));
    CUDA_CHECK(cudaFreeHost(h2));
    CUDA_CHECK(cudaFree(d1));
    CUDA_CHECK(cudaFree(d2));
}

/* ---- CPU AdamW ---- */

static int probe_adam(mt_rates *r, mt_error *err) {
    mt_optim_cpu cpu;
    if (mt_optim_cpu_init(&cpu, 0, err)) return -1;
    size_t n = (size_t)48 << 20;
    r->adam_gparams = mt_adamw_measure(&cpu, n);
    if (r->adam_gparams <= 0)
        return mt_errorf(err, "calibration: cannot allocate %.1f GB for the AdamW probe",
                         18.0 * n / 1e9);
    return 0;
}

/* ---- one layer ---- */

static double span_us(const mt_trace *tr, const char *name) {
    for (size_t i = 0; i < tr->n; i++)
        if (!strcmp(tr->spans[i].name, name)) return tr->spans[i].dur_us;
    return 0;
}

/* Two steps of a 1-layer model of cfg's shape; the second is traced. */
static int probe_steps(const mt_config *pc, int M, int64_t B, int64_t T, mt_gpu_precision prec,
                       int keep, int keep_down, mt_trace *tr, mt_error *err) {
    mt_param_table t;
    mt_host_store s;
    if (mt_params_init(&t, pc, err)) return -1;
    if (mt_host_store_create(&s, &t, 0, err)) {
        mt_params_free(&t);
        return -1;
    }
    mt_host_store_init_random(&s, 1, 0.02f);
    mt_cuda_backend_opts o = {.precision = prec, .gpu_grads = 1, .keep_layers = keep,
                              .keep_down_layers = keep_down};
    mt_backend *be = mt_cuda_backend_create(pc, &t, &s, M, B, T, &o, err);
    int rc = be ? 0 : -1;
    size_t n = (size_t)M * B * T;
    int32_t *tok = mt_malloc_or_die(n * sizeof *tok), *tgt = mt_malloc_or_die(n * sizeof *tgt);
    mt_batch_fill_random(tok, tgt, n, pc->V);
    mt_batch b = {.M = M, .B = B, .T = T, .tokens = tok, .targets = tgt};
    for (int step = 0; step < 2 && !rc; step++) {
        if (step == 1) mt_cuda_backend_set_trace(be, tr);
        double loss;
        rc = mt_step_forward_backward(be, t.n_layers, &b, &loss, err);
    }
    if (be) mt_cuda_backend_free(be);
    free(tok);
    free(tgt);
    mt_host_store_free(&s);
    mt_params_free(&t);
    return rc;
}

int mt_rates_probe(mt_rates *r, const mt_config *cfg, int M, int64_t B, int64_t T,
                   mt_gpu_precision prec, mt_error *err) {
    mt_rates_default(r);
    probe_copies(r);
    if (probe_adam(r, err)) return -1;
    mt_config pc = *cfg;
    pc.L = 1;
    pc.V = cfg->V < 16384 ? cfg->V : 16384;
    mt_trace re = {0}, kept = {0}, down = {0};
    int fast = prec == MT_GPU_BF16, gemma = fast && mt_arch_is_gemma(cfg->arch);
    if (probe_steps(&pc, M, B, T, prec, 0, 0, &re, err) ||
        (fast && probe_steps(&pc, M, B, T, prec, 1, 0, &kept, err)) ||
        (gemma && probe_steps(&pc, M, B, T, prec, 0, 1, &down, err))) {
        mt_trace_free(&re);
        mt_trace_free(&kept);
        mt_trace_free(&down);
        return mt_error_prefix(err, "calibration probe: ");
    }
    r->layer_fwd_s = span_us(&re, "fwd L1") / 1e6;
    r->layer_bwd_s = span_us(&re, "bwd L1") / 1e6;
    r->layer_bwd_kept_s = fast ? span_us(&kept, "bwd L1") / 1e6 : r->layer_bwd_s;
    if (r->layer_bwd_kept_s <= 0) r->layer_bwd_kept_s = r->layer_bwd_s;
    r->layer_bwd_down_s = gemma ? span_us(&down, "bwd L1") / 1e6 : 0;
    r->head_s = span_us(&re, "head (L2)") / 1e6;
    r->embed_s = (span_us(&re, "fwd L0") + span_us(&re, "bwd L0")) / 1e6;
    mt_trace_free(&re);
    mt_trace_free(&kept);
    mt_trace_free(&down);
    r->probe_C = cfg->C;
    r->probe_F = cfg->F;
    r->probe_V = pc.V;
    r->probe_tokens = (int64_t)M * B * T;
    r->probe_T = T;
    snprintf(r->source, sizeof r->source, "probed on this machine");
    return r->layer_fwd_s > 0 && r->layer_bwd_s > 0 && r->head_s > 0
               ? 0
               : mt_errorf(err, "calibration probe: the layer timings came back empty");
}

