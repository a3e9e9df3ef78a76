/* The state of a training run, shared by trainer.c (setting up, the steps,
 * the end) and trainer_state.c (what a checkpoint records of the run, and
 * the saves), which reads it and calls nothing of trainer.c. */
#ifndef MT_TRAIN_TRAINER_INTERNAL_H
#define MT_TRAIN_TRAINER_INTERNAL_H

#include <stdint.h>

#include "data/dataset.h"
#include "data/pref_data.h"
#include "data/tokenizer.h"
#include "engine/heldout.h"
#include "engine/metrics.h"
#include "engine/optim_pipeline.h"
#include "engine/optimizer.h"
#include "engine/step.h"
#include "host/store.h"
#include "io/run_lock.h"
#include "model/config.h"
#include "model/params.h"
#include "train/events.h"
#include "train/ranks.h"
#include "train/runner.h"
#include "train/train_config.h"
#include "train/train_nonfinite.h"

struct mt_run {
    mt_train_config tc_copy; /* the options, when the run owns them */
    const mt_train_config *tc;
    mt_events ev;            /* where the run reports */
    mt_config cfg;
    mt_param_table table;
    /* The ranks of the run (a run of one: world 1). Several: the store
     * holds this rank's parts of every layer (sl, parts), each step's
     * micro-batches [mb_first, mb_first + M) are this rank's, and only rank
     * 0 writes metrics and logs. */
    mt_ranks rk;
    int several;
    mt_shard_layout sl;
    mt_param_table parts;
    int M, mb_first;
    int stop_asked;          /* several: a rank caught a signal (agreed at each step) */
    int cpu_ranks;           /* the backend is dist/cpu_ranks.h's */
    mt_events ev_rank;       /* a rank other than the first: where its warnings go */
    mt_host_store store;     /* over table, or parts */
    mt_tokenizer *tok;
    mt_dataset *data;        /* NULL: built-in text */
    mt_eval_set eval;        /* held-out data (eval_data), if any */
    char *text;              /* built-in text and its sampler state */
    size_t text_len;
    uint64_t rng;
    mt_runner r;
    mt_runner_plan *plan;    /* CUDA training: the placement */
    int disk_layers;         /* the last layers whose m and v live on disk (resolved) */
    int disk_weight_layers;  /* the last of them whose fp32 weights live there too */
    mt_optimizer opt;
    mt_optim_pipeline pipe;
    int pipe_on;
    int64_t step, total_steps, tokens_seen;
    int64_t saved_step;      /* the step whose state is saved: the newest checkpoint written
                                or resumed from; 0 for a fresh start (its weights come from
                                the seed or the model) */
    int32_t *tokens, *targets, *pos;  /* pos: packing documents only, else NULL */
    mt_metrics_writer mw;
    char ckpt_dir[4096];     /* the checkpoint resumed from, if any */
    mt_run_lock lock;        /* on tc->out, for the whole run */
    mt_nonfinite nf;         /* the last non-finite step, skips in a row */
    int finished;            /* mt_trainer_finish ran: no more steps */
    int data_done;           /* the data ran out */
    int64_t empty_batches;   /* batches without a loss token skipped for this step */
    int64_t empty_batches_run, empty_batches_said; /* by this process; said in a warning */
    double t_start, t_prev;  /* of the steps of this process */
    int64_t start_step;
    double first_loss, last_loss; /* of the finite steps of this process */
    struct mt_run_pref *pref; /* a preference objective (trainer_pref.c); NULL: sft */
};

/* ---- a preference objective (trainer_pref.c) ---- */

typedef struct mt_run_pref {
    mt_pref_data data;       /* the training pairs (R->data stays NULL) */
    mt_pref_opts o;
    mt_pref_pair *pairs;     /* (M*B*T/2) the step's */
    mt_pref_pair *mine;      /* (M*B*T/2) those of this rank's micro-batches */
    int64_t n_pairs;
    mt_pref_metrics m;       /* the last step's */
    mt_pref_data eval;       /* held-out pairs (eval_data), if any */
    int has_eval;
} mt_run_pref;

/* Whether the run's objective is one of preference pairs. */
int mt_run_is_pref(const mt_run *R);
/* Opens the preference data (and eval_data's pairs) in R->pref; refuses
 * ref_model on several ranks. */
int mt_run_pref_open(mt_run *R, mt_error *err);
/* The reference log-probabilities (dpo): read from the run's file or, on
 * a fresh start, computed with a forward-only backend (on the GPU when
 * gpu) over the reference weights (ref_model, else those in the store).
 * Several ranks on a fresh start: nothing here (the run's backend does it
 * once started: mt_run_pref_reference_ranks). */
int mt_run_pref_reference(mt_run *R, int gpu, mt_error *err);
/* Several ranks, a fresh start: the reference pass on the run's backend
 * (the starting weights), each rank its micro-batches of every batch, all
 * the values on every rank and in rank 0's file. Nothing otherwise. */
int mt_run_pref_reference_ranks(mt_run *R, mt_error *err);
/* The next step's pairs into R->tokens/targets/pos; 1: the data ran out. */
int mt_run_pref_next(mt_run *R);
/* One training step of the preference loss: as mt_step_sequence_or_stop
 * over this rank's micro-batches; *loss the objective's (several ranks:
 * this rank's part of it, which the ranks add up), R->pref->m the step's
 * metrics over all ranks. */
int mt_run_pref_step(mt_run *R, const mt_step_stop *stop, double *loss, mt_error *err);
/* The last step's metrics into row. */
void mt_run_pref_row(const mt_run *R, mt_metrics_row *row);
/* The held-out pairs' metrics, as a row of metrics.jsonl and a line for
 * the log. */
int mt_run_pref_eval(mt_run *R, char *line, size_t n, mt_error *err);
void mt_run_pref_free(mt_run *R);

/* The trainer state of a checkpoint (step, data position, sampler RNG,
 * options) as JSON text (caller frees), and restoring it into R, checking
 * that the options deciding the batches did not change. */
char *mt_run_state_json(const mt_run *R);
int mt_run_restore_state(mt_run *R, const char *json, mt_error *err);

/* ---- tokenizer, data and batches (trainer_data.c) ---- */

/* The run's tokenizer (--tokenizer, the model's, or the byte one), and
 * the training data (or the preference pairs, or the built-in text). */
int mt_run_load_tokenizer(mt_run *R, mt_error *err);
int mt_run_open_data(mt_run *R, mt_error *err);
/* The held-out data (eval_data), this rank's micro-batches of each batch. */
int mt_run_open_eval(mt_run *R, mt_error *err);
/* 0: the next batch with a loss token is in R->tokens/targets (batches
 * without one skipped and counted in R->empty_batches); 1: the data is
 * exhausted. */
int mt_run_next_batch(mt_run *R);
/* Warns of skipped batches: once in full, then with the progress lines. */
void mt_run_warn_empty_batches(mt_run *R);
/* This rank's micro-batches of the step, whose loss is a mean over the
 * whole step's targets. */
mt_batch mt_run_rank_batch(const mt_run *R);

/* What taking a batch moves: the data position (JSON, as a checkpoint
 * holds it), the built-in text's sampler, the skipped-batch counts. */
typedef struct mt_run_batch_state {
    struct cJSON *data;
    uint64_t rng;
    int64_t empty_run, empty_said;
} mt_run_batch_state;
/* What taking a batch moved, before it (get), put back for a step that is
 * abandoned (set, which frees it), or dropped (free). Only a run that can
 * abandon a step records the data position. */
mt_run_batch_state mt_run_batch_state_get(const mt_run *R);
void mt_run_batch_state_set(mt_run *R, mt_run_batch_state *s);
void mt_run_batch_state_free(mt_run_batch_state *s);

/* ---- the ranks of a run (trainer_ranks.c) ---- */

/* Becomes this process's rank (train/ranks.h) and, with several, checks
 * the batch can be shared and cuts the model into this rank's parts. */
int mt_run_ranks_open(mt_run *R, int gpu, mt_error *err);
/* The table of the run's store: the model's, or this rank's parts'. */
const mt_param_table *mt_run_store_table(const mt_run *R);
/* The host store (over mt_run_store_table), with the disk tier when the
 * options put layers' optimizer state there (R->store.disk). */
int mt_run_store_open(mt_run *R, int store_grads, mt_error *err);
/* Refuses weights on disk (tc->disk_weight_layers > 0) where they cannot
 * run, naming why: without --nvme-dir, on the CPU, with several ranks,
 * in fp32, without the planner, with a reference model pass. */
int mt_run_check_disk_weights(const mt_run *R, int gpu, mt_error *err);
/* A fresh start's weights: the model directory's, or random. */
int mt_run_init_weights(mt_run *R, mt_error *err);
/* Loads the checkpoint R->ckpt_dir (one process's or several ranks',
 * written by any number of them) into this rank's store. */
int mt_run_load_checkpoint(mt_run *R, char **state_json, mt_error *err);
/* A rank other than the first: only its warnings reach the caller. */
void mt_run_quiet_events(mt_run *R);
/* GB of host RAM this rank may take (its machine's budget shared among
 * the machine's ranks); 0: the machine's default, alone. */
double mt_run_host_mem_share(const mt_run *R);
/* The step's backend (a CPU rank of several: dist/cpu_ranks.h; else the
 * runner's), and its release. */
int mt_run_backend_init(mt_run *R, const mt_runner_opts *ro, mt_error *err);
void mt_run_backend_free(mt_run *R);
/* Whether the run should stop for a signal: several ranks stop together,
 * at the step where any of them caught it. */
int mt_run_stop_asked(const mt_run *R);

/* A resume checkpoint of the current step; the final HF model. Both wait
 * for the optimizer first and report the path saved. */
int mt_run_save_checkpoint(mt_run *R, mt_error *err);
int mt_run_save_model(mt_run *R, mt_error *err);

#endif
