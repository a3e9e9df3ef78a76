/* The state of a training run, shared by trainer.c (setting up, the steps,
 * the end) and trainer_state.c (what a checkpoint records of the run, and
 * the saves), which reads it and calls nothing of trainer.c. */
#ifndef MT_TRAIN_TRAINER_INTERNAL_H
#define MT_TRAIN_TRAINER_INTERNAL_H

#include <stdint.h>

#include "data/dataset.h"
#include "data/tokenizer.h"
#include "engine/eval.h"
#include "engine/metrics.h"
#include "engine/optim_pipeline.h"
#include "engine/optimizer.h"
#include "host/store.h"
#include "io/run_lock.h"
#include "model/config.h"
#include "model/params.h"
#include "train/events.h"
#include "train/runner.h"
#include "train/train_config.h"
#include "train/train_nonfinite.h"

struct mt_run {
    mt_train_config tc_copy; /* the options, when the run owns them */
    const mt_train_config *tc;
    mt_events ev;            /* where the run reports */
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
};

/* The trainer state of a checkpoint (step, data position, sampler RNG,
 * options) as JSON text (caller frees), and restoring it into R, checking
 * that the options deciding the batches did not change. */
char *mt_run_state_json(const mt_run *R);
int mt_run_restore_state(mt_run *R, const char *json, mt_error *err);

/* A resume checkpoint of the current step; the final HF model. Both wait
 * for the optimizer first and report the path saved. */
int mt_run_save_checkpoint(mt_run *R, mt_error *err);
int mt_run_save_model(mt_run *R, mt_error *err);

#endif
