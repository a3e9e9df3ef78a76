/* Backend choice, creation and text generation shared by the commands. */
#include "cli/runner.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/backend_cpu.h"
#include "backend/cpu/ops.h"
#include "engine/step.h"
#include "io/model_io.h"
#include "util/mem.h"

#ifdef MT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_ops.h"
#endif

int mt_loaded_model_open(mt_loaded_model *m, const char *dir, const char *tokpath, mt_error *err) {
    memset(m, 0, sizeof *m);
    char tp[4200];
    if (!tokpath) {
        snprintf(tp, sizeof tp, "%s/tokenizer.json", dir);
        tokpath = tp;
    }
    if (mt_model_load_config(&m->cfg, dir, err) || mt_params_init(&m->table, &m->cfg, err) ||
        mt_host_store_create(&m->store, &m->table, 0, err) ||
        mt_model_load_weights(&m->store, dir, err)) {
        mt_loaded_model_close(m);
        return -1;
    }
    m->tok = !strcmp(tokpath, "bytes") ? mt_tokenizer_bytes() : mt_tokenizer_load(tokpath, err);
    if (!m->tok) {
        mt_loaded_model_close(m);
        return -1;
    }
    return 0;
}

void mt_loaded_model_close(mt_loaded_model *m) {
    if (m->tok) mt_tokenizer_free(m->tok);
    mt_host_store_free(&m->store);
    mt_params_free(&m->table);
    memset(m, 0, sizeof *m);
}

int mt_runner_parse_device(const char *name) {
    return !strcmp(name, "auto") ? 0 : !strcmp(name, "cpu") ? 1 : !strcmp(name, "cuda") ? 2 : -1;
}

int mt_runner_pick_gpu(int device, mt_error *err) {
#ifdef MT_HAVE_CUDA
    int have = mt_cuda_device_count() > 0;
#else
    int have = 0;
#endif
    if (device == 1) return 0;
    if (device == 2 && !have)
        return mt_errorf(err, "--device cuda: no CUDA GPU is visible (or this build has no CUDA); "
                         "use --device cpu");
    return have;
}

#ifdef MT_HAVE_CUDA
/* Gradients go to the GPU when the backend with them still leaves 2 GiB. */
static int gpu_grads_fit(const mt_config *cfg, const mt_param_table *t, int M, int64_t B,
                         int64_t T, const mt_runner_opts *o) {
    mt_cuda_backend_opts bo = {.precision = o->fp32 ? MT_GPU_FP32 : MT_GPU_BF16,
                               .host_checkpoints = o->host_checkpoints, .gpu_grads = 1};
    size_t need = mt_cuda_backend_bytes(cfg, t, M, B, T, &bo), fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) return 0;
    return need + ((size_t)2 << 30) < fr;
}
#endif

int mt_runner_store_needs_grads(const mt_config *cfg, const mt_param_table *t, int M, int64_t B,
                                int64_t T, const mt_runner_opts *o) {
    if (!o->train) return 0;
    mt_error err;
    int gpu = mt_runner_pick_gpu(o->device, &err);
    if (gpu <= 0) return 1;
#ifdef MT_HAVE_CUDA
    return !gpu_grads_fit(cfg, t, M, B, T, o);
#else
    return 1;
#endif
}

int mt_runner_init(mt_runner *r, const mt_config *cfg, const mt_param_table *t,
                   mt_host_store *store, int M, int64_t B, int64_t T, const mt_runner_opts *o,
                   mt_error *err) {
    memset(r, 0, sizeof *r);
    r->n_layers = t->n_layers;
    r->M = M;
    r->B = B;
    r->T = T;
    int gpu = mt_runner_pick_gpu(o->device, err);
    if (gpu < 0) return -1;
    if (!gpu) {
        r->be = mt_cpu_backend_create(cfg, t, store, M, B, T, err);
        return r->be ? 0 : -1;
    }
#ifdef MT_HAVE_CUDA
    r->gpu = 1;
    r->gpu_grads = o->train && !store->g;
    mt_cuda_backend_opts bo = {.precision = o->fp32 ? MT_GPU_FP32 : MT_GPU_BF16,
                               .host_checkpoints = o->host_checkpoints,
                               .gpu_grads = r->gpu_grads, .keep_layers = o->train ? -1 : 0};
    r->be = mt_cuda_backend_create(cfg, t, store, M, B, T, &bo, err);
    return r->be ? 0 : -1;
#else
    return mt_errorf(err, "this build has no CUDA support");
#endif
}

void mt_runner_free(mt_runner *r) {
    if (!r->be) return;
#ifdef MT_HAVE_CUDA
    if (r->gpu) {
        mt_cuda_backend_free(r->be);
        r->be = NULL;
        return;
    }
#endif
    mt_cpu_backend_free(r->be);
    r->be = NULL;
}

void mt_runner_logits(const mt_runner *r, int64_t row, float *logits) {
#ifdef MT_HAVE_CUDA
    if (r->gpu) {
        mt_cuda_backend_logits(r->be, 0, row, logits);
        return;
    }
#endif
    mt_cpu_backend_logits(r->be, 0, row, logits);
}

typedef struct prob_index {
    float p;
    int32_t id;
} prob_index;

static int by_prob_desc(const void *a, const void *b) {
    float x = ((const prob_index *)a)->p, y = ((const prob_index *)b)->p;
    return (x < y) - (x > y);
}

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Greedy, or softmax at `temperature` restricted to the smallest set of
 * tokens whose probability reaches top_p. */
static int32_t pick(float *logits, int64_t V, double temperature, double top_p, uint64_t *rng,
                    prob_index *scratch) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return (int32_t)best;
    double sum = 0;
    for (int64_t v = 0; v < V; v++) {
        scratch[v].p = (float)exp((logits[v] - logits[best]) / temperature);
        scratch[v].id = (int32_t)v;
        sum += scratch[v].p;
    }
    qsort(scratch, (size_t)V, sizeof *scratch, by_prob_desc);
    int64_t keep = 0;
    double cum = 0;
    while (keep < V && (keep == 0 || cum < top_p * sum)) cum += scratch[keep++].p;
    double u = (double)(rng_next(rng) >> 11) / 9007199254740992.0 * cum, acc = 0;
    for (int64_t k = 0; k < keep; k++) {
        acc += scratch[k].p;
        if (u < acc) return scratch[k].id;
    }
    return scratch[keep - 1].id;
}

int mt_generate(mt_runner *r, const mt_config *cfg, const mt_tokenizer *tok, const char *prompt,
                bool add_special, int n_new, double temperature, double top_p, uint64_t seed,
                FILE *out, mt_error *err) {
    MT_ASSERT(r->M == 1 && r->B == 1);
    int32_t *ids = NULL;
    size_t n = 0;
    if (mt_tokenizer_encode(tok, prompt, strlen(prompt), add_special, &ids, &n, err)) return -1;
    int64_t T = r->T, V = cfg->V;
    size_t cap = n + (size_t)n_new + 1;
    ids = mt_realloc_or_die(ids, cap * sizeof *ids);
    int32_t *win = mt_calloc_or_die((size_t)T, sizeof *win), *tgt = mt_malloc_or_die((size_t)T * 4);
    float *logits = mt_malloc_or_die((size_t)V * sizeof *logits);
    prob_index *scratch = mt_malloc_or_die((size_t)V * sizeof *scratch);
    for (int64_t i = 0; i < T; i++) tgt[i] = MT_IGNORE_INDEX;
    uint64_t rng = seed * 0x9E3779B97F4A7C15ull + 1;
    int32_t eos = mt_tokenizer_eos_id(tok);
    size_t printed = 0;
    char *text = mt_tokenizer_decode(tok, ids, n, true);
    fputs(text, out);
    printed = strlen(text);
    free(text);
    int rc = 0;
    for (int k = 0; k < n_new; k++) {
        /* the last T tokens, left-aligned; padding after them is causal-invisible */
        size_t start = n > (size_t)T ? n - (size_t)T : 0, ctx = n - start;
        if (ctx == 0) break;
        for (int64_t i = 0; i < T; i++) win[i] = (size_t)i < ctx ? ids[start + i] : 0;
        mt_batch b = {.M = 1, .B = 1, .T = T, .tokens = win, .targets = tgt};
        double ls;
        int64_t nv;
        if ((rc = mt_step_eval(r->be, r->n_layers, &b, &ls, &nv, err))) break;
        mt_runner_logits(r, (int64_t)ctx - 1, logits);
        int32_t next = pick(logits, V, temperature, top_p, &rng, scratch);
        if (next == eos) break;
        ids[n++] = next;
        /* print what the new token adds to the decoded text */
        text = mt_tokenizer_decode(tok, ids, n, true);
        size_t len = strlen(text);
        if (len > printed) fputs(text + printed, out);
        printed = len;
        free(text);
        fflush(out);
    }
    fputc('\n', out);
    free(ids);
    free(win);
    free(tgt);
    free(logits);
    free(scratch);
    return rc;
}
