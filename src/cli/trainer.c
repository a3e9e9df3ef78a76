/* The training run: everything `megatrain train` does between parsing its
 * options and exiting.
 *
 * out/ receives config.yaml (the effective options), metrics.jsonl (one
 * line per step), checkpoints/step-N/ (resume checkpoints, the last K kept)
 * and model/ (the final Hugging Face model, with the tokenizer files). */
#include "cli/trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend/cpu/ops.h"
#include "cli/runner.h"
#include "cli/train_memory.h"
#include "cli/train_nonfinite.h"
#include "data/builtin_text.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "engine/eval.h"
#include "engine/metrics.h"
#include "engine/optim_pipeline.h"
#include "engine/optimizer.h"
#include "engine/step.h"
#include "host/store.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "io/model_io.h"
#include "io/run_lock.h"
#include "model/params.h"
#include "util/mem.h"
#include "util/signals.h"
#include "util/sys.h"

#ifdef MT_HAVE_CUDA
#include "backend/cuda/backend_cuda.h"
#endif

typedef struct run {
    const mt_train_config *tc;
    mt_config cfg;
    mt_param_table table;
    mt_host_store store;
    mt_tokenizer *tok;
    mt_dataset *data;        /* NULL: built-in text */
    mt_eval_set eval;        /* held-out data (eval_data), if any */
    char *text;              /* built-in text and its sampler state */
    size_t text_len;
    uint64_t rng;
    mt_runner r;
    mt_runner_plan *plan;    /* CUDA training: the placement */
    mt_optimizer opt;
    mt_optim_pipeline pipe;
    int pipe_on;
    int64_t step, total_steps, tokens_seen;
    int32_t *tokens, *targets;
    mt_metrics_writer mw;
    char ckpt_dir[4096];     /* the checkpoint resumed from, if any */
    mt_run_lock lock;        /* on tc->out, for the whole run */
    mt_nonfinite nf;         /* the last non-finite step, skips in a row */
} run;

/* ---- model, tokenizer, data ---- */

static int load_config(run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (!tc->model[0]) {
        mt_config_default_tiny(&R->cfg);
        if (!tc->data[0] && (size_t)tc->seq_len >= MT_BUILTIN_TEXT_BYTES / 2)
            return mt_errorf(err, "seq_len %lld: the built-in text has %zu bytes, rows of it "
                             "must be shorter than %zu; lower --seq-len or pass --data FILE",
                             (long long)tc->seq_len, MT_BUILTIN_TEXT_BYTES,
                             MT_BUILTIN_TEXT_BYTES / 2);
        if (tc->seq_len > R->cfg.max_pos) R->cfg.max_pos = tc->seq_len;
        return 0;
    }
    if (mt_model_load_config(&R->cfg, tc->model, err)) return -1;
    if (tc->seq_len > R->cfg.max_pos)
        return mt_errorf(err, "seq_len %lld exceeds the model's max_position_embeddings %lld; "
                         "use seq_len <= %lld", (long long)tc->seq_len,
                         (long long)R->cfg.max_pos, (long long)R->cfg.max_pos);
    return 0;
}

static int load_tokenizer(run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (!tc->tokenizer[0] || !strcmp(tc->tokenizer, "bytes")) {
        if (tc->model[0] && !tc->tokenizer[0])
            return mt_errorf(err, "no tokenizer: pass --tokenizer PATH/tokenizer.json");
        R->tok = mt_tokenizer_bytes();
    } else {
        R->tok = mt_tokenizer_load(tc->tokenizer, err);
        if (!R->tok) return -1;
    }
    if ((int64_t)mt_tokenizer_vocab_size(R->tok) > R->cfg.V)
        fprintf(stderr, "megatrain: note: the tokenizer has %zu ids, the model %lld; data "
                "with ids >= %lld will be refused\n", mt_tokenizer_vocab_size(R->tok),
                (long long)R->cfg.V, (long long)R->cfg.V);
    return 0;
}

static int open_data(run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (!tc->data[0]) {
        if (tc->model[0])
            return mt_errorf(err, "no training data: pass --data FILE.jsonl (or .mtok)");
        R->text = mt_builtin_text(MT_BUILTIN_TEXT_BYTES, 7, &R->text_len);
        R->rng = (uint64_t)tc->seed * 0x9E3779B97F4A7C15ull + 1;
        return 0;
    }
    mt_data_opts o = {.path = tc->data, .format = mt_tc_data_format_name(tc->data_format),
                      .chat_template = mt_tc_chat_template_name(tc->chat_template),
                      .skip_bad_lines = tc->skip_bad_lines, .seed = (uint64_t)tc->seed,
                      .epochs = tc->epochs};
    R->data = mt_dataset_open(&o, R->tok, R->cfg.V, err);
    if (!R->data) return -1;
    mt_data_stats st = mt_dataset_stats(R->data);
    printf("data: %s, %lld documents, %lld tokens (%lld with loss), format %s", tc->data,
           (long long)st.documents, (long long)st.tokens, (long long)st.trainable, st.format);
    if (st.skipped_lines) printf(", %lld malformed lines skipped", (long long)st.skipped_lines);
    printf("\n");
    mt_dataset_describe(R->data, stdout);
    return mt_dataset_check_rows(R->data, tc->seq_len, err);
}

static int open_eval(run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    mt_data_opts o = {.path = tc->eval_data, .format = mt_tc_data_format_name(tc->data_format),
                      .chat_template = mt_tc_chat_template_name(tc->chat_template),
                      .skip_bad_lines = tc->skip_bad_lines};
    return mt_eval_set_open(&R->eval, &o, R->tok, R->cfg.V, (int)tc->micro_batches,
                            tc->batch_size, tc->seq_len, tc->eval_batches, tc->eval_every, err);
}

/* Rows of T+1 bytes of the built-in text at random offsets. */
static void builtin_batch(run *R, int64_t rows, int64_t T) {
    for (int64_t r = 0; r < rows; r++) {
        uint64_t *s = &R->rng;
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        size_t off = *s % (R->text_len - (size_t)T - 1);
        for (int64_t t = 0; t < T; t++) {
            R->tokens[r * T + t] = (unsigned char)R->text[off + t];
            R->targets[r * T + t] = (unsigned char)R->text[off + t + 1];
        }
    }
}

/* 0: a batch is in R->tokens/targets; 1: the data is exhausted. */
static int next_batch(run *R) {
    const mt_train_config *tc = R->tc;
    int64_t rows = tc->micro_batches * tc->batch_size;
    if (!R->data) {
        builtin_batch(R, rows, tc->seq_len);
        return 0;
    }
    return mt_dataset_next_batch(R->data, rows, tc->seq_len, R->tokens, R->targets);
}

/* ---- trainer state (resume) ---- */

static char *state_json(const run *R) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "step", (double)R->step);
    cJSON_AddNumberToObject(o, "tokens_seen", (double)R->tokens_seen);
    char rng[32];
    snprintf(rng, sizeof rng, "%llu", (unsigned long long)R->rng);
    cJSON_AddStringToObject(o, "rng", rng); /* 64 bits do not fit a JSON double */
    if (R->data) cJSON_AddItemToObject(o, "data", mt_dataset_pos_to_json(R->data));
    char *cfg = mt_train_config_to_json(R->tc);
    cJSON_AddItemToObject(o, "config", cJSON_Parse(cfg));
    free(cfg);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* The options that decide which tokens each step sees: a resumed run must
 * keep them, or it would not continue the same run. */
static int check_resumable(const run *R, const cJSON *saved, mt_error *err) {
    mt_train_config old;
    mt_train_config_defaults(&old);  /* a key missing from the saved object reads as its default */
    char *txt = cJSON_PrintUnformatted(saved);
    int rc = mt_train_config_from_json(&old, txt, err);
    free(txt);
    if (rc) return mt_error_prefix(err, "%s: trainer_state.json: ", R->ckpt_dir);
    const mt_train_config *tc = R->tc;
    struct { const char *name; long long was, now; } keys[] = {
        {"seq_len", old.seq_len, tc->seq_len},
        {"batch_size", old.batch_size, tc->batch_size},
        {"micro_batches", old.micro_batches, tc->micro_batches},
        {"seed", old.seed, tc->seed},
        {"epochs", old.epochs, tc->epochs},
    };
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (keys[i].was != keys[i].now)
            return mt_errorf(err, "%s was saved with %s = %lld, this run has %lld: a resumed "
                             "run must keep it (drop the flag or set it back)", R->ckpt_dir,
                             keys[i].name, keys[i].was, keys[i].now);
    if (strcmp(old.data, tc->data))
        return mt_errorf(err, "%s was saved training on '%s', this run on '%s'", R->ckpt_dir,
                         old.data, tc->data);
    return 0;
}

static int restore_state(run *R, const char *json, mt_error *err) {
    cJSON *o = cJSON_Parse(json); /* the object state_json() wrote */
    const cJSON *tr = cJSON_IsObject(o) ? o : NULL;
    const cJSON *step = tr ? cJSON_GetObjectItemCaseSensitive(tr, "step") : NULL;
    const cJSON *rng = tr ? cJSON_GetObjectItemCaseSensitive(tr, "rng") : NULL;
    const cJSON *cfg = tr ? cJSON_GetObjectItemCaseSensitive(tr, "config") : NULL;
    int rc = -1;
    if (!cJSON_IsNumber(step) || !cJSON_IsString(rng) || !cJSON_IsObject(cfg)) {
        mt_errorf(err, "%s/trainer_state.json: not written by this version of megatrain "
                  "(no trainer step, rng or config)", R->ckpt_dir);
        goto out;
    }
    if (check_resumable(R, cfg, err)) goto out;
    R->step = (int64_t)step->valuedouble;
    R->opt.step = R->step;
    R->rng = strtoull(rng->valuestring, NULL, 10);
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(tr, "tokens_seen");
    R->tokens_seen = cJSON_IsNumber(ts) ? (int64_t)ts->valuedouble : 0;
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(tr, "data");
    if (R->data && mt_dataset_pos_from_json(R->data, d, err)) {
        mt_error_prefix(err, "%s/trainer_state.json: ", R->ckpt_dir);
        goto out;
    }
    rc = 0;
out:
    cJSON_Delete(o);
    return rc;
}

/* ---- saving ---- */

static int save_checkpoint(run *R, mt_error *err) {
    if (R->pipe_on) mt_optim_pipeline_wait_all(&R->pipe);
    char *js = state_json(R), path[4096];
    double t0 = mt_now_s();
    int rc = mt_checkpoint_save(R->tc->out, R->step, &R->store, &R->cfg, js,
                                (int)R->tc->keep_last, path, sizeof path, err);
    free(js);
    if (!rc) printf("checkpoint: %s (%.1fs)\n", path, mt_now_s() - t0);
    return rc;
}

static int save_model(run *R, mt_error *err) {
    if (R->pipe_on) mt_optim_pipeline_wait_all(&R->pipe);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/model", R->tc->out);
    double t0 = mt_now_s();
    mt_dtype dt = R->tc->save_dtype == MT_SAVE_FP32 ? MT_DTYPE_F32 : MT_DTYPE_BF16;
    if (mt_model_save(&R->store, &R->cfg, dir, dt, (size_t)5 << 30, err)) return -1;
    if (R->tc->tokenizer[0] && strcmp(R->tc->tokenizer, "bytes") &&
        mt_model_copy_tokenizer(R->tc->tokenizer, dir, err))
        return -1;
    printf("model: %s (%s, %.1fs)\n", dir, mt_save_dtype_name(R->tc->save_dtype),
           mt_now_s() - t0);
    return 0;
}

/* ---- the loop ---- */

#ifdef MT_HAVE_CUDA
static mt_grad_view grads_begin(void *be, int l) { return mt_cuda_backend_grads_begin(be, l); }
static void grads_wait(void *be, int l) { mt_cuda_backend_grads_wait(be, l); }
#endif

/* Loss of this step; the optimizer's update is started (GPU: it runs
 * under the next step's forward) and described in rep. 1: the loss or a
 * gradient is not finite (R->nf says where; rep has the norm), and no
 * update was started. */
static int train_step(run *R, double *loss, mt_optim_report *rep, mt_error *err) {
    const mt_train_config *tc = R->tc;
    mt_batch b = {.M = (int)tc->micro_batches, .B = tc->batch_size, .T = tc->seq_len,
                  .tokens = R->tokens, .targets = R->targets};
    if (mt_step_forward_backward(R->r.be, R->table.n_layers, &b, loss, err)) return -1;
    if (!R->r.gpu) {
        if (mt_nonfinite_find(&R->nf, &R->table, R->store.g) || !isfinite(*loss)) {
            *rep = (mt_optim_report){.lr = NAN, .grad_norm = mt_grad_norm(&R->table, R->store.g)};
            return 1;
        }
        mt_optimizer_step(&R->opt, &R->store, rep);
        return 0;
    }
#ifdef MT_HAVE_CUDA
    const double *sq = mt_cuda_backend_layer_sumsq(R->r.be);
    double total = 0;
    for (int l = 0; l < R->table.n_layers; l++) total += sq[l];
    if (!isfinite(total) || !isfinite(*loss)) {
        mt_cuda_backend_wait_grads(R->r.be); /* host gradients fully drained */
        mt_nonfinite_find_sumsq(&R->nf, &R->table, sq, R->store.g); /* NULL: not in the store */
        *rep = (mt_optim_report){.lr = NAN, .grad_norm = sqrt(total)};
        return 1;
    }
    mt_optim_pipeline_start(&R->pipe, total, rep);
#endif
    return 0;
}

static void report(run *R, double loss, const mt_optim_report *rep, double dt, double t_run,
                   int64_t steps_run) {
    const mt_train_config *tc = R->tc;
    double tokens = (double)(tc->micro_batches * tc->batch_size * tc->seq_len);
    mt_metrics_row row = mt_metrics_row_make(R->step);
    row.loss = loss;
    row.lr = rep->lr;
    row.grad_norm = rep->grad_norm;
    row.tokens = R->tokens_seen;
    row.step_time_s = dt;
    row.tokens_per_s = tokens / dt;
    row.tflops = (6.0 * (double)R->table.n_params * tokens +
                  12.0 * R->cfg.L * R->cfg.C * tc->seq_len * tokens) / dt / 1e12;
    row.host_mem_gb = mt_host_rss_bytes() / 1e9;
    row.eta_s = t_run / (double)steps_run * (double)(R->total_steps - R->step);
    if (R->nf.in_a_row > 0) {
        row.skipped = R->nf.in_a_row;
        row.nonfinite = R->nf.tensor[0] ? R->nf.tensor : NULL;
    }
    if (R->data) {
        mt_data_pos p = mt_dataset_get_pos(R->data);
        int64_t rpe = mt_dataset_rows_per_epoch(R->data, tc->seq_len);
        row.epoch = (double)p.epoch + (rpe ? (double)p.row / (double)rpe : 0);
    }
#ifdef MT_HAVE_CUDA
    if (R->r.gpu) {
        mt_cuda_step_times st;
        mt_cuda_backend_times(R->r.be, &st);
        row.gpu_mem_gb = mt_cuda_backend_device_bytes(R->r.be) / 1e9;
        row.h2d_gbps = st.h2d_bytes / (st.total_ms / 1e3) / 1e9;
        row.d2h_gbps = st.d2h_bytes / (st.total_ms / 1e3) / 1e9;
    }
#endif
    mt_error err;
    if (mt_metrics_write(&R->mw, &row, &err)) fprintf(stderr, "megatrain: %s\n", err.msg);
    if (R->step % tc->log_every == 0 || R->step == R->total_steps) {
        char line[512];
        mt_progress_format(&row, R->total_steps, line, sizeof line);
        printf("%s\n", line);
        fflush(stdout);
    }
}

static int setup(run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (mt_run_lock_acquire(&R->lock, tc->out, "megatrain train", err) || load_config(R, err) ||
        mt_params_init(&R->table, &R->cfg, err))
        return -1;
    if (tc->resume[0]) {
        /* verified here (auto falls back to an older one), loaded below */
        int autom = !strcmp(tc->resume, "auto");
        const char *where = autom ? tc->out : tc->resume;
        if (autom && mt_checkpoint_find_latest(where, R->ckpt_dir, sizeof R->ckpt_dir, err))
            R->ckpt_dir[0] = 0; /* auto with nothing saved yet: a fresh start */
        else if (mt_checkpoint_find_intact(where, R->ckpt_dir, sizeof R->ckpt_dir, err))
            return -1;
    }
    int M = (int)tc->micro_batches;
    mt_runner_opts ro = {.device = tc->device == MT_DEVICE_CPU ? 1 : tc->device == MT_DEVICE_CUDA ? 2 : 0,
                         .fp32 = tc->precision == MT_TC_PRECISION_FP32,
                         .host_checkpoints = tc->host_checkpoints, .train = 1,
                         .gpu_mem_gb = tc->gpu_mem, .host_mem_gb = tc->host_mem,
                         .host_grad_dtype = tc->host_grad_dtype - 1,
                         .calibration = tc->calibration[0] ? tc->calibration : NULL};
    int gpu = mt_runner_pick_gpu(ro.device, err);
    if (gpu < 0) return -1;
    /* the CPU backend and the planner-less GPU path read the store's g */
    int store_grads = !gpu || tc->host_checkpoints;
    if (mt_train_check_host_memory(tc, &R->cfg, &R->table, store_grads, !gpu,
                                   mt_host_ram_available_bytes(), err))
        return -1;
    if (mt_runner_plan_make(&R->plan, &R->cfg, &R->table, M, tc->batch_size, tc->seq_len, &ro,
                            stdout, err))
        return -1;
    ro.plan = R->plan;
    if (mt_host_store_create(&R->store, &R->table, !R->plan, err)) return -1;
    printf("model: %s %s, %.2fM parameters, %lld layers, hidden %lld, vocab %lld\n",
           tc->model[0] ? tc->model : "built-in", R->cfg.model_type, R->table.n_params / 1e6,
           (long long)R->cfg.L, (long long)R->cfg.C, (long long)R->cfg.V);
    if (R->ckpt_dir[0]) {
        char *js = NULL;
        if (mt_checkpoint_load_verified(R->ckpt_dir, &R->store, &R->cfg, &js, err)) return -1;
        int rc = load_tokenizer(R, err) || open_data(R, err) || restore_state(R, js, err);
        free(js);
        if (rc) return -1;
        printf("resume: %s at step %lld\n", R->ckpt_dir, (long long)R->step);
    } else {
        if (tc->model[0]) {
            if (mt_model_load_weights(&R->store, tc->model, err)) return -1;
        } else {
            mt_host_store_init_random(&R->store, (uint64_t)tc->seed, 0.02f);
        }
        if (load_tokenizer(R, err) || open_data(R, err)) return -1;
    }
    /* what a killed run left: temporary saves, a checkpoint beyond keep_last */
    if (mt_checkpoint_cleanup(tc->out, (int)tc->keep_last, R->ckpt_dir[0] ? R->step : -1, err))
        fprintf(stderr, "megatrain: warning: %s\n", err->msg);
    if (tc->eval_data[0] && open_eval(R, err)) return -1;
    R->total_steps = tc->steps;
    if (!R->total_steps) {
        if (!R->data) return mt_errorf(err, "steps = 0 needs a data file to count epochs over");
        int64_t rows = mt_dataset_rows_per_epoch(R->data, tc->seq_len) * tc->epochs;
        R->total_steps = rows / (tc->micro_batches * tc->batch_size);
        if (!R->total_steps)
            return mt_errorf(err, "%s: %lld rows of %lld tokens make no full step of %lld rows; "
                             "lower batch_size or micro_batches", tc->data, (long long)rows,
                             (long long)tc->seq_len, (long long)(tc->micro_batches * tc->batch_size));
    }
    if (R->step > R->total_steps)
        return mt_errorf(err, "%s is at step %lld, past this run's %lld steps; raise --steps",
                         R->ckpt_dir, (long long)R->step, (long long)R->total_steps);
    R->opt = (mt_optimizer){.beta1 = tc->beta1, .beta2 = tc->beta2, .eps = tc->eps,
                            .weight_decay = tc->weight_decay,
                            .max_grad_norm = (float)tc->max_grad_norm, .step = R->step};
    R->opt.sched = mt_lr_schedule_make(tc->schedule, tc->lr, tc->warmup_steps, R->total_steps);
    R->opt.sched.min_lr_ratio = tc->min_lr_ratio;
    if (mt_optim_cpu_init(&R->opt.cpu, 0, err)) return -1;
    if (mt_runner_init(&R->r, &R->cfg, &R->table, &R->store, M, tc->batch_size, tc->seq_len, &ro,
                       err))
        return -1;
#ifdef MT_HAVE_CUDA
    if (R->r.gpu) {
        mt_grad_source src = {R->r.be, grads_begin, grads_wait};
        if (mt_optim_pipeline_init(&R->pipe, &R->opt, &R->store, &src, err))
            return -1;
        R->pipe_on = 1;
        mt_cuda_backend_set_weight_gate(R->r.be, mt_optim_pipeline_gate, &R->pipe);
    }
#endif
    printf("device: %s%s, host store %.1f GB (%.1f bytes/param)\n", R->r.gpu ? "cuda" : "cpu",
           R->r.gpu ? (tc->precision == MT_TC_PRECISION_FP32 ? " fp32" : " bf16") : "",
           R->store.bytes / 1e9, (double)R->store.bytes / (double)R->table.n_params);
    size_t n = (size_t)(tc->micro_batches * tc->batch_size * tc->seq_len);
    R->tokens = mt_malloc_or_die(n * sizeof *R->tokens);
    R->targets = mt_malloc_or_die(n * sizeof *R->targets);
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", tc->out);
    if (mt_metrics_open(&R->mw, path, R->step, err)) return -1;
    snprintf(path, sizeof path, "%s/tensorboard", tc->out);
    if (tc->tensorboard && mt_metrics_open_tensorboard(&R->mw, path, R->step, err)) return -1;
    snprintf(path, sizeof path, "%s/config.yaml", tc->out);
    return mt_train_config_save_yaml(tc, path, err);
}

static void teardown(run *R) {
    if (R->pipe_on) {
        mt_optim_pipeline_wait_all(&R->pipe);
        mt_optim_pipeline_free(&R->pipe);
    }
    mt_runner_free(&R->r);
    mt_runner_plan_free(R->plan);
    R->plan = NULL;
    if (R->mw.f) mt_metrics_close(&R->mw);
    if (R->data) mt_dataset_free(R->data);
    mt_eval_set_free(&R->eval);
    if (R->tok) mt_tokenizer_free(R->tok);
    free(R->text);
    free(R->tokens);
    free(R->targets);
    mt_host_store_free(&R->store);
    mt_params_free(&R->table);
    mt_run_lock_release(&R->lock);
}

static void sample(run *R) {
    const mt_train_config *tc = R->tc;
    if (tc->sample_tokens <= 0) return;
    if (R->pipe_on) mt_optim_pipeline_wait_all(&R->pipe);
    mt_runner g;
    mt_error err;
    mt_runner_opts ro = {.device = R->r.gpu ? 2 : 1};
    /* the sample needs no gradient: a one-row, forward-only backend */
    mt_runner_free(&R->r);
    int64_t T = tc->seq_len < 256 ? tc->seq_len : 256;
    if (mt_runner_init(&g, &R->cfg, &R->table, &R->store, 1, 1, T, &ro, &err)) {
        fprintf(stderr, "megatrain: sample: %s\n", err.msg);
        return;
    }
    printf("sample: ");
    /* the built-in text is raw bytes without BOS; datasets start with BOS */
    if (mt_generate(&g, &R->cfg, R->tok, R->data ? "The" : "The old man", R->data != NULL,
                    (int)tc->sample_tokens, 0.0, 1.0, 1, stdout, &err))
        fprintf(stderr, "megatrain: sample: %s\n", err.msg);
    mt_runner_free(&g);
}

int mt_train(const mt_train_config *tc, mt_error *err) {
    run R = {.tc = tc, .lock = {.fd = -1}};
    int rc = -1;
    if (setup(&R, err)) goto out;
    mt_signals_install();
    printf("train: %lld steps of %lld x %lld x %lld tokens, lr %g (%s), out %s\n",
           (long long)R.total_steps, (long long)tc->micro_batches, (long long)tc->batch_size,
           (long long)tc->seq_len, tc->lr, mt_lr_kind_name(tc->schedule), tc->out);
    double t_start = mt_now_s(), t_prev = t_start, first = NAN, last = NAN;
    int64_t start_step = R.step;
    int interrupted = 0;
    while (R.step < R.total_steps) {
        if (next_batch(&R)) {
            printf("train: the data ran out after %lld steps (epochs = %lld)\n",
                   (long long)R.step, (long long)tc->epochs);
            break;
        }
        double loss;
        mt_optim_report rep;
        int st = train_step(&R, &loss, &rep, err);
        if (st < 0) goto out;
        /* the GPU's optimizer pipeline cannot skip an update: it stops */
        if (st == 1 && mt_nonfinite_decide(&R.nf, tc, R.step + 1, loss, rep.grad_norm,
                                           !R.r.gpu, err))
            goto out;
        if (st == 1) R.opt.step++;  /* the schedule moves on, as a resume would count it */
        else mt_nonfinite_ok(&R.nf);
        R.step++;
        R.tokens_seen += tc->micro_batches * tc->batch_size * tc->seq_len;
        double t = mt_now_s();
        report(&R, loss, &rep, t - t_prev, t - t_start, R.step - start_step);
        t_prev = t;
        if (mt_eval_set_due(&R.eval, R.step, R.total_steps)) {  /* on the updated weights */
            if (R.pipe_on) mt_optim_pipeline_wait_all(&R.pipe);
            if (mt_eval_set_log(&R.eval, R.r.be, R.table.n_layers, R.step, R.total_steps, &R.mw,
                                stdout, err))
                goto out;
            t_prev = mt_now_s();  /* the next step's time leaves the evaluation out */
        }
        if (isnan(first) && st == 0) first = loss;
        if (st == 0) last = loss;
        if (mt_signals_pending()) {
            interrupted = 1;
            break;
        }
        if (tc->save_every > 0 && R.step % tc->save_every == 0 && R.step < R.total_steps &&
            save_checkpoint(&R, err))
            goto out;
    }
    if (interrupted) {
        printf("train: signal %d: saving a checkpoint at step %lld before stopping\n",
               mt_signals_last(), (long long)R.step);
        rc = save_checkpoint(&R, err) ? -1 : 1;
        goto out;
    }
    printf("train: loss %.4f -> %.4f in %lld steps, %.1fs\n", first, last,
           (long long)(R.step - start_step), mt_now_s() - t_start);
    if ((tc->save_every > 0 && save_checkpoint(&R, err)) || save_model(&R, err)) goto out;
    sample(&R);
    rc = 0;
out:
    teardown(&R);
    return rc;
}
