/* The training run: everything `megatrain train` does between parsing its
 * options and exiting, as steps a caller drives (megatrain.h: mt_run_*).
 *
 * out/ receives config.yaml (the effective options), metrics.jsonl (one
 * line per step), checkpoints/step-N/ (resume checkpoints, the last K kept)
 * and model/ (the final Hugging Face model, with the tokenizer files: the
 * byte tokenizer's too).
 * What a checkpoint records of the run, and the saves: trainer_state.c;
 * the data and the batches: trainer_data.c. */
#include "train/trainer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/step.h"
#include "host/disk_state.h"
#include "io/checkpoint.h"
#include "io/hub_cache.h"
#include "io/model_io.h"
#include "io/run_dir.h"
#include "train/generate.h"
#include "train/train_memory.h"
#include "train/trainer_internal.h"
#include "util/mem.h"
#include "util/signals.h"
#include "util/sys.h"

/* ---- model, tokenizer, data ---- */

static int load_config(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (!tc->model[0]) {
        mt_config_default_tiny(&R->cfg);
        /* with a tokenizer of its own, the built-in model takes its vocabulary
         * (the model saved then works with the tokenizer saved beside it) */
        if (tc->tokenizer[0] && strcmp(tc->tokenizer, "bytes")) {
            if (!(R->tok = mt_tokenizer_load(tc->tokenizer, err))) return -1;
            R->cfg.V = (int64_t)mt_tokenizer_vocab_size(R->tok);
            R->cfg.bos_id = mt_tokenizer_bos_id(R->tok);
            R->cfg.eos_id = mt_tokenizer_eos_id(R->tok);
        }
        if (tc->router_aux_loss)
            return mt_errorf(err, "router_aux_loss: the built-in tiny model has no experts; "
                             "drop the option");
        if (!tc->data[0] && (size_t)tc->seq_len >= MT_BUILTIN_TEXT_BYTES / 2)
            return mt_errorf(err, "seq_len %lld: the built-in text has %zu bytes, rows of it "
                             "must be shorter than %zu; lower --seq-len or pass --data FILE",
                             (long long)tc->seq_len, MT_BUILTIN_TEXT_BYTES,
                             MT_BUILTIN_TEXT_BYTES / 2);
        if (tc->seq_len > R->cfg.max_pos) R->cfg.max_pos = tc->seq_len;
        return 0;
    }
    char found[MT_TC_STR];  // a Hub name the options did not find in the cache: say how to get it
    if (mt_hub_model_dir(tc->model, found, sizeof found, err) ||
        mt_model_load_config(&R->cfg, tc->model, err))
        return -1;
    if (tc->router_aux_loss && !mt_config_is_moe(&R->cfg))
        return mt_errorf(err, "router_aux_loss: %s has no experts (model_type \"%s\"); drop "
                         "the option", tc->model, R->cfg.model_type);
    if (tc->router_aux_loss) R->cfg.moe.aux_loss = true;
    if (tc->seq_len > R->cfg.max_pos)
        return mt_errorf(err, "seq_len %lld exceeds the model's max_position_embeddings %lld; "
                         "use seq_len <= %lld", (long long)tc->seq_len,
                         (long long)R->cfg.max_pos, (long long)R->cfg.max_pos);
    return 0;
}

/* The sample after training is text of the model: it has positions for so
 * many tokens. */
static int check_sample(const mt_run *R, mt_error *err) {
    if (R->tc->sample_tokens <= R->cfg.max_pos) return 0;
    return mt_errorf(err, "sample_tokens %lld is more than the model's %lld positions "
                     "(max_position_embeddings); use --sample-tokens %lld or less",
                     (long long)R->tc->sample_tokens, (long long)R->cfg.max_pos,
                     (long long)R->cfg.max_pos);
}

/* ---- the loop ---- */

/* Each layer's sum of squares of the gradient (all ranks' parts) into
 * sq, the loss summed over the ranks, and whether any rank caught a
 * signal (so that all stop after the same step). sq: n_layers + 2. */
static int step_sums(mt_run *R, double *sq, double *loss, mt_error *err) {
    int nl = R->table.n_layers;
    const mt_backend_ops *ops = R->r.be->ops;
    if (ops->layer_sumsq)
        memcpy(sq, ops->layer_sumsq(R->r.be), (size_t)nl * sizeof *sq);
    else /* the gradient is in the store */
        for (int l = 0; l < nl; l++) sq[l] = mt_optimizer_layer_sumsq(&R->opt, &R->store, l);
    sq[nl] = *loss;
    sq[nl + 1] = mt_signals_pending();
    if (mt_ranks_sum(&R->rk, sq, nl + 2, err)) return -1;
    *loss = sq[nl];
    R->stop_asked = sq[nl + 1] > 0;
    return 0;
}

static int signal_caught(void *ctx) {
    (void)ctx;
    return mt_signals_pending();
}

/* Loss of this step; the optimizer's update is started (GPU: it runs
 * under the next step's forward) and described in rep. 1: the loss or a
 * gradient is not finite (R->nf says where; rep has the norm), and no
 * update was started. 2: a signal came during the step, which was
 * abandoned at the next layer (one process on the CPU; several ranks, and
 * the GPU, finish the step): nothing of it is applied. */
static int train_step(mt_run *R, double *loss, mt_optim_report *rep, mt_error *err) {
    /* the last update's disk failure, if any: the run stops, its last checkpoint intact */
    if (mt_disk_state_error(R->store.disk, err)) return -1;
    mt_batch b = mt_run_rank_batch(R);
    mt_step_stop stop = {signal_caught, NULL};
    int rc = R->pref ? mt_run_pref_step(R, &stop, loss, err)
                     : mt_step_forward_backward_or_stop(R->r.be, R->table.n_layers, &b,
                                                        R->several ? NULL : &stop, loss, err);
    if (rc) return rc < 0 ? -1 : 2;
    int nl = R->table.n_layers;
    double *sq = mt_malloc_or_die((size_t)(nl + 2) * sizeof *sq), total = 0;
    if (step_sums(R, sq, loss, err)) {
        free(sq);
        return -1;
    }
    for (int l = 0; l < nl; l++) total += sq[l];
    int bad = !isfinite(total) || !isfinite(*loss);
    const mt_backend_ops *ops = R->r.be->ops;
    if (bad && !ops->layer_sumsq && !R->several) {
        mt_nonfinite_find(&R->nf, &R->table, R->store.g);
    } else if (bad) {
        if (ops->wait_grads) ops->wait_grads(R->r.be); /* host gradients fully drained */
        /* the store's gradient is the whole model's only on one rank */
        mt_nonfinite_find_sumsq(&R->nf, &R->table, sq, R->several ? NULL : R->store.g);
    }
    free(sq);
    if (bad) {
        *rep = (mt_optim_report){.lr = NAN, .grad_norm = sqrt(total)};
        return 1;
    }
    if (R->pipe_on) /* runs under the next step's forward */
        mt_optim_pipeline_start(&R->pipe, total, rep);
    else
        mt_optimizer_apply(&R->opt, &R->store, total, rep);
    return 0;
}

/* The step's metrics to metrics.jsonl, to *m (may be NULL) and, as an
 * MT_EVENT_STEP, to the caller (with the progress line every log_every).
 * -1 when the row could not be written (err says which file and why). */
static int report(mt_run *R, double loss, const mt_optim_report *rep, double dt, double t_run,
                  int64_t steps_run, mt_step_metrics *m, mt_error *err) {
    const mt_train_config *tc = R->tc;
    double tokens = (double)(tc->micro_batches * tc->batch_size * tc->seq_len);
    mt_metrics_row row = mt_metrics_row_make(R->step);
    row.loss = loss;
    row.lr = rep->lr;
    row.grad_norm = rep->grad_norm;
    row.tokens = R->tokens_seen;
    row.step_time_s = dt;
    row.tokens_per_s = tokens / dt;
    /* MoE: the parameters a token works with (docs/moe.md) */
    row.tflops = mt_config_train_flops_per_token(&R->cfg, tc->seq_len) * tokens / dt / 1e12;
    row.host_mem_gb = mt_host_rss_bytes() / 1e9;
    row.eta_s = t_run / (double)steps_run * (double)(R->total_steps - R->step);
    if (R->empty_batches > 0) row.empty_batches = R->empty_batches;
    if (R->nf.in_a_row > 0) {
        row.skipped = R->nf.in_a_row;
        row.nonfinite = R->nf.tensor[0] ? R->nf.tensor : NULL;
    }
    if (R->pref) {
        mt_run_pref_row(R, &row);
        row.epoch = (double)R->pref->data.epoch +
                    (double)R->pref->data.next / (double)R->pref->data.n_pairs;
    }
    if (R->data) {
        mt_data_pos p = mt_dataset_get_pos(R->data);
        int64_t rpe = mt_dataset_rows_per_epoch(R->data, tc->seq_len);
        row.epoch = (double)p.epoch + (rpe ? (double)p.row / (double)rpe : 0);
    }
    if (R->r.be->ops->stats) {
        mt_backend_stats st;
        R->r.be->ops->stats(R->r.be, &st);
        row.gpu_mem_gb = st.device_bytes / 1e9;
        row.h2d_gbps = st.h2d_bytes / st.total_s / 1e9;
        row.d2h_gbps = st.d2h_bytes / st.total_s / 1e9;
    }
    /* a lost row stops the run: a resume from its last checkpoint redoes the
     * steps since, bitwise, and writes their rows; a row skipped would not be */
    if (R->mw.fd >= 0 && mt_metrics_write(&R->mw, &row, err))
        return mt_error_suffix(err, "; the run stopped at step %lld so that no row is lost: "
                               "make room, then --resume auto continues from the last "
                               "checkpoint (the steps after it are done again, bit for bit)",
                               (long long)R->step);
    mt_step_metrics sm = {
        .step = row.step, .total_steps = R->total_steps, .epoch = row.epoch, .loss = row.loss,
        .lr = row.lr, .grad_norm = row.grad_norm, .tokens = row.tokens,
        .tokens_per_s = row.tokens_per_s, .tflops = row.tflops, .step_time_s = row.step_time_s,
        .eta_s = row.eta_s, .gpu_mem_gb = row.gpu_mem_gb, .host_mem_gb = row.host_mem_gb,
        .h2d_gbps = row.h2d_gbps, .d2h_gbps = row.d2h_gbps, .skipped = row.skipped,
        .nonfinite = row.nonfinite, .rewards_chosen = row.pref.rewards_chosen,
        .rewards_rejected = row.pref.rewards_rejected,
        .rewards_accuracies = row.pref.rewards_accuracies,
        .rewards_margins = row.pref.rewards_margins, .logps_chosen = row.pref.logps_chosen,
        .logps_rejected = row.pref.logps_rejected};
    if (m) *m = sm; /* nonfinite points into R->nf: valid until the next step */
    char line[512];
    mt_event e = {.kind = MT_EVENT_STEP, .step = &sm};
    if (R->step % tc->log_every == 0 || R->step == R->total_steps) {
        mt_progress_format(&row, R->total_steps, line, sizeof line);
        e.text = line;
    }
    if (R->ev.fn) R->ev.fn(&e, R->ev.user);
    return 0;
}

/* A new run never mixes with one already in out: refused, unless resumed
 * or overwritten (then the inputs must not lie in what is deleted). */
static int check_out(const mt_train_config *tc, mt_error *err) {
    if (tc->resume[0]) return 0;
    if (!tc->overwrite) return mt_run_dir_check_new(tc->out, err);
    return mt_run_dir_check_input(tc->out, "model", tc->model, err) ||
           mt_run_dir_check_input(tc->out, "tokenizer", tc->tokenizer, err) ? -1 : 0;
}

/* The checkpoint --resume names, verified (auto: the newest intact one in
 * out, falling back to an older one, or none yet: a fresh start), into
 * R->ckpt_dir; loaded later. */
static int find_checkpoint(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    int autom = !strcmp(tc->resume, "auto");
    const char *where = autom ? tc->out : tc->resume;
    mt_error none;
    if (autom && mt_checkpoint_find_latest(where, R->ckpt_dir, sizeof R->ckpt_dir, err)) {
        R->ckpt_dir[0] = 0;
        if (mt_run_dir_check_new(tc->out, &none))
            mt_emitf(&R->ev, MT_EVENT_WARNING, "warning: --resume auto: %s holds no "
                     "checkpoint yet; the run starts again from step 0 (its metrics start "
                     "again too)", tc->out);
        return 0;
    }
    /* a checkpoint found (auto) or named: the newest intact one */
    return mt_checkpoint_find_intact(where, R->ckpt_dir, sizeof R->ckpt_dir, err);
}

/* The placement (the planner prints the probe's rates and its choice), the
 * host memory check with the disk layers it chose, and the host store. */
static int place(mt_run *R, int gpu, mt_runner_opts *ro, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (mt_run_check_disk_weights(R, gpu, err)) return -1;
    /* the CPU backends and the planner-less GPU path read the store's g */
    int store_grads = !gpu || tc->host_saved_inputs;
    char *plan_text = NULL;
    size_t plan_len = 0;
    FILE *log = open_memstream(&plan_text, &plan_len);
    MT_ASSERT(log);
    int rc = mt_runner_plan_make(&R->plan, &R->cfg, &R->table, R->M, tc->batch_size,
                                 tc->seq_len, ro, log, err);
    fclose(log);
    mt_emit_lines(&R->ev, MT_EVENT_INFO, plan_text);
    free(plan_text);
    if (rc) return -1;
    ro->plan = R->plan;
    /* the host's bytes with the disk layers the planner chose, or (on the
     * CPU) the fewest that --host-mem, else the RAM, needs (on the GPU the
     * planner keeps to --host-mem) */
    mt_train_config resolved = *tc;
    size_t avail = mt_host_ram_available_bytes();
    double hm = gpu || tc->host_mem <= 0 ? 0 : mt_run_host_mem_share(R) * 1e9;
    size_t host_mem = hm >= 1.8e19 ? SIZE_MAX : (size_t)hm;
    size_t binding = host_mem && (!avail || host_mem < avail) ? host_mem : avail;
    resolved.disk_layers = R->plan ? mt_runner_plan_disk_layers(R->plan)
                           : mt_train_disk_layers_needed(tc, &R->cfg, mt_run_store_table(R),
                                                         store_grads, !gpu, binding);
    R->disk_layers = (int)resolved.disk_layers;
    R->disk_weight_layers = mt_runner_plan_disk_weight_layers(R->plan);
    resolved.disk_weight_layers = R->disk_weight_layers;
    return mt_train_check_host_memory(&resolved, &R->cfg, mt_run_store_table(R), store_grads,
                                       !gpu, avail, host_mem, err) ||
                   mt_run_store_open(R, store_grads, err)
               ? -1
               : 0;
}

/* Weights and state from the checkpoint, or fresh ones; the tokenizer and
 * the data; then (rank 0) what an overwritten or killed run left in out. */
static int load_state(mt_run *R, int lead, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (R->ckpt_dir[0]) {
        char *js = NULL;
        if (mt_run_load_checkpoint(R, &js, err)) return -1;
        int rc = mt_run_load_tokenizer(R, err) || mt_run_open_data(R, err) ||
                 mt_run_restore_state(R, js, err);
        free(js);
        if (rc) return -1;
        mt_emitf(&R->ev, MT_EVENT_INFO, "resume: %s at step %lld", R->ckpt_dir,
                 (long long)R->step);
    } else if (mt_run_init_weights(R, err) || mt_run_load_tokenizer(R, err) ||
               mt_run_open_data(R, err)) {
        return -1;
    }
    if (!lead) return 0;
    if (tc->overwrite) { /* the last moment: everything it needs is loaded */
        char removed[256];
        if (mt_run_dir_clear(tc->out, removed, sizeof removed, err)) return -1;
        if (removed[0])
            mt_emitf(&R->ev, MT_EVENT_INFO, "overwrite: removed the earlier run's %s from %s",
                     removed, tc->out);
    }
    /* what a killed run left: temporary saves, a checkpoint beyond keep_last */
    if (mt_checkpoint_cleanup(tc->out, (int)tc->keep_last, R->ckpt_dir[0] ? R->step : -1, err))
        mt_emitf(&R->ev, MT_EVENT_WARNING, "warning: %s", err->msg);
    return 0;
}

/* The run's steps (steps, else epochs over the data) and the optimizer. */
static int plan_steps(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    R->total_steps = tc->steps;
    if (!R->total_steps && R->pref) R->total_steps = mt_pref_data_steps(&R->pref->data, R->M);
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
    return mt_optim_cpu_init(&R->opt.cpu, R->several ? R->rk.threads : 0, err);
}

/* The backend, and the optimizer's pipeline beside it where it has one. */
static int start_backend(mt_run *R, const mt_runner_opts *ro, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (mt_run_backend_init(R, ro, err)) return -1;
    if (R->r.be->ops->grad_source) { /* the optimizer beside the device */
        mt_grad_source src = R->r.be->ops->grad_source(R->r.be);
        if (mt_optim_pipeline_init(&R->pipe, &R->opt, &R->store, &src, err)) return -1;
        R->pipe_on = 1;
        R->r.be->ops->set_weight_gate(R->r.be, mt_optim_pipeline_gate, &R->pipe);
    }
    mt_emitf(&R->ev, MT_EVENT_INFO, "device: %s%s, host store %.1f GB (%.1f bytes/param)",
             R->r.gpu ? "cuda" : "cpu",
             R->r.gpu ? (tc->precision == MT_TC_PRECISION_FP32 ? " fp32" : " bf16") : "",
             R->store.bytes / 1e9, (double)R->store.bytes / (double)mt_run_store_table(R)->n_params);
    if (R->several)
        mt_emitf(&R->ev, MT_EVENT_INFO, "ranks: %d (%s), %d on this machine; each holds 1/%d of "
                 "every layer and takes %d of the %lld micro-batches of a step",
                 R->rk.env.world_size, R->rk.env.source, R->rk.local_world,
                 R->rk.env.world_size, R->M, (long long)tc->micro_batches);
    size_t n = (size_t)(tc->micro_batches * tc->batch_size * tc->seq_len);
    R->tokens = mt_malloc_or_die(n * sizeof *R->tokens);
    R->targets = mt_malloc_or_die(n * sizeof *R->targets);
    if ((R->data && mt_dataset_packs_documents(R->data)) || R->pref)
        R->pos = mt_malloc_or_die(n * sizeof *R->pos);
    return 0;
}

/* Rank 0's files in out: metrics.jsonl (its rows past the step cut),
 * TensorBoard, config.yaml. */
static int open_outputs(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", tc->out);
    if (mt_metrics_open(&R->mw, path, R->step, err)) return -1;
    if (R->mw.torn)
        mt_emitf(&R->ev, MT_EVENT_WARNING, "warning: %s ended with a torn row (%zu bytes without "
                 "a line end: a write cut short by a kill or a full disk); removed it",
                 path, R->mw.torn);
    snprintf(path, sizeof path, "%s/tensorboard", tc->out);
    if (tc->tensorboard && mt_metrics_open_tensorboard(&R->mw, path, R->step, err)) return -1;
    snprintf(path, sizeof path, "%s/config.yaml", tc->out);
    return mt_train_config_save_yaml(tc, path, err);
}

static int setup(mt_run *R, mt_error *err) {
    const mt_train_config *tc = R->tc;
    int device = tc->device == MT_DEVICE_CPU ? 1 : tc->device == MT_DEVICE_CUDA ? 2 : 0;
    int gpu = mt_runner_pick_gpu(device, err);
    if (gpu < 0 || mt_run_ranks_open(R, gpu, err)) return -1;
    int lead = mt_ranks_lead(&R->rk);
    if (!lead) mt_run_quiet_events(R);
    /* the run's directory belongs to rank 0's lock */
    if ((lead && (mt_run_lock_acquire(&R->lock, tc->out, "megatrain train", err) ||
                  check_out(tc, err))) ||
        load_config(R, err) || check_sample(R, err) || mt_params_init(&R->table, &R->cfg, err) ||
        (R->several && mt_ranks_parts(&R->rk, &R->table, &R->sl, &R->parts, err)) ||
        (tc->resume[0] && find_checkpoint(R, err)))
        return -1;
    int gpu_for = mt_runner_pick_gpu_for(device, &R->cfg, err);
    if (gpu_for < 0) return -1;
    if (gpu && !gpu_for) { /* auto, for a model the GPU path has no kernels for */
        if (R->several)
            return mt_errorf(err, "model_type \"%s\" has no GPU kernels yet, and several ranks "
                             "need the GPU: train it in one process with --device cpu",
                             R->cfg.model_type);
        mt_emitf(&R->ev, MT_EVENT_INFO, "device: model_type \"%s\" has no GPU kernels yet; it "
                 "trains on the CPU (--device cpu says so; --device cuda refuses it)",
                 R->cfg.model_type);
        gpu = 0, device = 1;
    }
    if (!gpu && tc->saved_input_dtype == 1)
        return mt_errorf(err, "--saved-input-dtype bf16 is for bf16 runs on the GPU (the CPU keeps "
                         "fp32 saved inputs in its own RAM); drop it or train with --device cuda");
    mt_runner_opts ro = {.device = device, .fp32 = tc->precision == MT_TC_PRECISION_FP32,
                         .host_saved_inputs = tc->host_saved_inputs, .train = 1,
                         .gpu_mem_gb = tc->gpu_mem, .host_mem_gb = mt_run_host_mem_share(R),
                         .host_grad_dtype = tc->host_grad_dtype - 1,
                         .saved_bf16 = tc->saved_input_dtype == 1,
                         .calibration = tc->calibration[0] ? tc->calibration : NULL,
                         .rank = R->rk.env.rank, .ranks = R->rk.env.world_size,
                         .comm = R->rk.comm, .link_gbs = R->rk.link_gbs,
                         .nvme_dir = tc->nvme_dir, .disk_mem_gb = tc->disk_mem,
                         .disk_layers = (int)tc->disk_layers, .disk_sharers = R->rk.local_world,
                         .disk_saved_layers = (int)tc->disk_saved_layers,
                         .disk_weight_layers = (int)tc->disk_weight_layers};
    if (gpu && R->several && tc->nvme_dir[0] && tc->disk_layers && !tc->calibration[0]) {
        /* each machine's drives measured once, by its first rank */
        double t0 = mt_now_s();
        if (mt_ranks_disk_rates(&R->rk, tc->nvme_dir, (size_t)4 << 30, ro.disk_gbs, err))
            return mt_error_prefix(err, "measuring the disk tier (--nvme-dir): ");
        mt_emitf(&R->ev, MT_EVENT_INFO, "disk %s: write %.2f GB/s, read %.2f GB/s, both at once "
                 "%.2f GB/s, shared by this machine's %d ranks (%.1fs)", tc->nvme_dir,
                 ro.disk_gbs[1], ro.disk_gbs[0], ro.disk_gbs[2], R->rk.local_world,
                 mt_now_s() - t0);
    }
    if (place(R, gpu, &ro, err)) return -1;
    mt_emitf(&R->ev, MT_EVENT_INFO, "model: %s %s, %.2fM parameters, %lld layers, hidden %lld, "
             "vocab %lld", tc->model[0] ? tc->model : "built-in", R->cfg.model_type,
             R->table.n_params / 1e6, (long long)R->cfg.L, (long long)R->cfg.C,
             (long long)R->cfg.V);
    if (load_state(R, lead, err) || (tc->eval_data[0] && !R->pref && mt_run_open_eval(R, err)) ||
        mt_run_pref_reference(R, gpu, err) || plan_steps(R, err) || start_backend(R, &ro, err) ||
        mt_run_pref_reference_ranks(R, err))
        return -1;
    return lead ? open_outputs(R, err) : 0; /* rank 0 writes the run's files */
}

static void teardown(mt_run *R) {
    if (R->pipe_on) {
        mt_optim_pipeline_wait_all(&R->pipe);
        mt_optim_pipeline_free(&R->pipe);
    }
    mt_run_backend_free(R);
    mt_runner_plan_free(R->plan);
    R->plan = NULL;
    mt_metrics_close(&R->mw);
    if (R->data) mt_dataset_free(R->data);
    mt_run_pref_free(R);
    mt_eval_set_free(&R->eval);
    if (R->tok) mt_tokenizer_free(R->tok);
    free(R->text);
    free(R->tokens);
    free(R->targets);
    free(R->pos);
    mt_disk_state_close(R->store.disk); /* after the optimizer: its last writes land */
    mt_host_store_free(&R->store);
    mt_params_free(&R->parts);
    mt_shard_layout_free(&R->sl);
    mt_params_free(&R->table);
    mt_run_lock_release(&R->lock);
    mt_ranks_close(&R->rk);
}

static void sample(mt_run *R) {
    const mt_train_config *tc = R->tc;
    if (tc->sample_tokens <= 0) return;
    if (R->several) { /* generation needs the whole model on one GPU */
        mt_emitf(&R->ev, MT_EVENT_INFO, "sample: not on several ranks; run megatrain generate "
                 "on %s/model", tc->out);
        return;
    }
    if (mt_disk_state_weight_layers(R->store.disk)) { /* it reads the head's fp32 weights */
        mt_emitf(&R->ev, MT_EVENT_INFO, "sample: not with weights on disk; run megatrain "
                 "generate on %s/model", tc->out);
        return;
    }
    if (R->pipe_on) mt_optim_pipeline_wait_all(&R->pipe);
    mt_runner g;
    mt_error err;
    mt_runner_opts ro = {.device = R->r.gpu ? 2 : 1};
    /* the sample needs no gradient: a one-row, forward-only backend */
    mt_runner_free(&R->r);
    int64_t T = tc->seq_len < 256 ? tc->seq_len : 256;
    if (mt_runner_init(&g, &R->cfg, &R->table, &R->store, 1, 1, T, &ro, &err)) {
        mt_emitf(&R->ev, MT_EVENT_WARNING, "sample: %s", err.msg);
        return;
    }
    mt_emitf(&R->ev, MT_EVENT_TEXT, "sample: ");
    /* the built-in text is raw bytes without BOS; datasets start with BOS */
    int bos = R->data || R->pref;
    if (mt_generate(&g, &R->cfg, R->tok, bos ? "The" : "The old man", bos,
                    (int)tc->sample_tokens, 0.0, 1.0, 1, &R->ev, NULL, &err))
        mt_emitf(&R->ev, MT_EVENT_WARNING, "sample: %s", err.msg);
    mt_runner_free(&g);
}

/* ---- the run, step by step ---- */

mt_run *mt_trainer_open(const mt_train_config *tc, const mt_events *ev, mt_error *err) {
    mt_run *R = mt_calloc_or_die(1, sizeof *R);
    R->tc_copy = *tc;
    R->tc = &R->tc_copy;
    R->lock.fd = -1;
    R->mw.fd = -1;
    if (ev) R->ev = *ev;
    R->first_loss = R->last_loss = NAN;
    /* several ranks: all set up, or all stop with the first failure */
    int rc = setup(R, err);
    if (R->several) rc = mt_ranks_agree(&R->rk, rc, err);
    if (rc) {
        mt_trainer_close(R);
        return NULL;
    }
    R->start_step = R->saved_step = R->step;
    tc = R->tc;
    mt_emitf(&R->ev, MT_EVENT_INFO, "train: %lld steps of %lld x %lld x %lld tokens, lr %g (%s), "
             "out %s", (long long)R->total_steps, (long long)tc->micro_batches,
             (long long)tc->batch_size, (long long)tc->seq_len, tc->lr,
             mt_lr_kind_name(tc->schedule), tc->out);
    return R;
}

/* Whether the held-out data is evaluated after this step. */
static int eval_due(const mt_run *R) {
    if (!R->pref) return mt_eval_set_due(&R->eval, R->step, R->total_steps);
    int64_t every = R->tc->eval_every;
    return R->pref->has_eval && R->step > 0 &&
           (R->step == R->total_steps || (every > 0 && R->step % every == 0));
}

int mt_trainer_step(mt_run *R, mt_step_metrics *m, mt_error *err) {
    const mt_train_config *tc = R->tc;
    if (R->finished)
        return mt_errorf(err, "%s: the run is finished; open a new run (resume auto) to train "
                         "further", tc->out);
    if (R->step >= R->total_steps || R->data_done) return 1;
    if (R->t_start == 0) {
        R->t_start = R->t_prev = mt_now_s();
        mt_ranks_watch_start(&R->rk);
    }
    /* where the data was, for a step that a signal abandons */
    mt_run_batch_state before = mt_run_batch_state_get(R);
    int done = mt_run_next_batch(R);
    mt_run_warn_empty_batches(R);
    if (done) {
        mt_run_batch_state_free(&before);
        R->data_done = 1;
        mt_emitf(&R->ev, MT_EVENT_INFO, "train: the data ran out after %lld steps (epochs = %lld)",
                 (long long)R->step, (long long)tc->epochs);
        return 1;
    }
    double loss;
    mt_optim_report rep;
    int st = train_step(R, &loss, &rep, err);
    if (st == 2) { /* as if the step had not begun: a checkpoint now is the state after step */
        mt_run_batch_state_set(R, &before);
        return 2;
    }
    mt_run_batch_state_free(&before);
    if (st < 0) return -1;
    /* the GPU's optimizer pipeline cannot skip an update: it stops */
    if (st == 1 && mt_nonfinite_decide(&R->nf, tc, R->step + 1, loss, rep.grad_norm, !R->r.gpu,
                                       err))
        return -1;
    if (st == 1) {
        mt_emitf(&R->ev, MT_EVENT_WARNING, "%s", R->nf.warning);
        R->opt.step++;  /* the schedule moves on, as a resume would count it */
    } else {
        mt_nonfinite_ok(&R->nf);
    }
    R->step++;
    mt_ranks_alive(&R->rk, R->step);
    R->tokens_seen += tc->micro_batches * tc->batch_size * tc->seq_len;
    double t = mt_now_s();
    if (report(R, loss, &rep, t - R->t_prev, t - R->t_start, R->step - R->start_step, m, err))
        return -1;
    R->t_prev = t;
    if (eval_due(R)) { /* on the updated weights */
        if (R->pipe_on) mt_optim_pipeline_wait_all(&R->pipe);
        char line[640];
        if (R->pref ? mt_run_pref_eval(R, line, sizeof line, err)
                    : mt_eval_set_log(&R->eval, R->r.be, R->table.n_layers, R->step,
                                      R->total_steps, R->mw.fd >= 0 ? &R->mw : NULL, line,
                                      sizeof line, err))
            return -1;
        mt_emit(&R->ev, MT_EVENT_INFO, line);
        R->t_prev = mt_now_s(); /* the next step's time leaves the evaluation out */
    }
    if (isnan(R->first_loss) && st == 0) R->first_loss = loss;
    if (st == 0) R->last_loss = loss;
    /* a stop asked for by a signal saves in mt_trainer_train instead */
    if (tc->save_every > 0 && R->step % tc->save_every == 0 && R->step < R->total_steps &&
        !mt_run_stop_asked(R) && mt_run_save_checkpoint(R, err))
        return -1;
    return 0;
}

int mt_trainer_save(mt_run *R, mt_error *err) {
    if (R->finished) return mt_errorf(err, "%s: the run is finished and saved", R->tc->out);
    return mt_run_save_checkpoint(R, err);
}

int mt_trainer_finish(mt_run *R, mt_error *err) {
    if (R->finished) return mt_errorf(err, "%s: the run is already finished", R->tc->out);
    R->finished = 1;
    if ((R->tc->save_every > 0 && mt_run_save_checkpoint(R, err)) || mt_run_save_model(R, err) ||
        mt_metrics_finish(&R->mw, err))
        return -1;
    sample(R);
    return 0;
}

/* A signal stops the run: the state after the last step done is saved,
 * unless a checkpoint holds it already (a periodic save, the one resumed
 * from) or no step was done since a fresh start. abandoned: the step after
 * it was cut short, and nothing of it applied. */
static int stop_on_signal(mt_run *R, int abandoned, mt_error *err) {
    char cut[96] = "";
    if (abandoned)
        snprintf(cut, sizeof cut, " (step %lld, cut short, is not applied)",
                 (long long)R->step + 1);
    if (R->step == R->saved_step) {
        mt_emitf(&R->ev, MT_EVENT_INFO, "train: signal %d: stopping at step %lld%s; %s",
                 mt_signals_last(), (long long)R->step, cut,
                 R->step ? "its checkpoint is already saved" : "no step was done, nothing to save");
        return 0;
    }
    mt_emitf(&R->ev, MT_EVENT_INFO, "train: signal %d: saving a checkpoint at step %lld before "
             "stopping%s", mt_signals_last(), (long long)R->step, cut);
    return mt_run_save_checkpoint(R, err);
}

int mt_trainer_train(mt_run *R, mt_error *err) {
    mt_signals_install();
    if (R->t_start == 0) R->t_start = R->t_prev = mt_now_s();
    int st, rc;
    while ((st = mt_trainer_step(R, NULL, err)) == 0)
        if (mt_run_stop_asked(R)) break;
    if (st < 0) {
        rc = -1;
    } else if (st == 0 || st == 2) {
        rc = stop_on_signal(R, st == 2, err) ? -1 : 1;
    } else {
        mt_emitf(&R->ev, MT_EVENT_INFO, "train: loss %.4f -> %.4f in %lld steps, %.1fs",
                 R->first_loss, R->last_loss, (long long)(R->step - R->start_step),
                 mt_now_s() - R->t_start);
        if (R->empty_batches_run > 0)
            mt_emitf(&R->ev, MT_EVENT_INFO, "train: %lld batches with no loss token were skipped "
                     "(\"empty_batches\" in metrics.jsonl)", (long long)R->empty_batches_run);
        rc = mt_trainer_finish(R, err);
    }
    mt_signals_restore();
    return rc;
}

int64_t mt_trainer_steps_done(const mt_run *R) { return R->step; }
int64_t mt_trainer_total_steps(const mt_run *R) { return R->total_steps; }

void mt_trainer_close(mt_run *R) {
    if (!R) return;
    teardown(R);
    free(R);
}

int mt_train(const mt_train_config *tc, mt_error *err) {
    mt_run *R = mt_trainer_open(tc, NULL, err);
    if (!R) return -1;
    int rc = mt_trainer_train(R, err);
    mt_trainer_close(R);
    return rc;
}
