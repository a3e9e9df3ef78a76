/* The public calls of a training run (megatrain.h: mt_run_*): the trainer's
 * (trainer.c), with the options resolved and checked first and errors left
 * for mt_last_error. */
#include "megatrain.h"
#include "train/events.h"
#include "train/options.h"
#include "train/trainer.h"

mt_run *mt_run_open(const mt_options *o, mt_event_fn fn, void *user) {
    mt_error err;
    /* what parsing the arguments does last: the tiny model's defaults
     * for what was not set, then the checks across options */
    mt_options resolved = *o;
    if (mt_options_resolve(&resolved)) return NULL;
    mt_events ev = {fn, user};
    mt_run *r = mt_trainer_open(&resolved.tc, &ev, &err);
    if (!r) mt_set_last_error(&err);
    return r;
}

int mt_run_step(mt_run *r, mt_step_metrics *m) {
    mt_error err;
    int rc = mt_trainer_step(r, m, &err);
    return rc < 0 ? mt_set_last_error(&err) : rc;
}

int mt_run_save(mt_run *r) {
    mt_error err;
    return mt_trainer_save(r, &err) ? mt_set_last_error(&err) : 0;
}

int mt_run_finish(mt_run *r) {
    mt_error err;
    return mt_trainer_finish(r, &err) ? mt_set_last_error(&err) : 0;
}

int mt_run_train(mt_run *r) {
    mt_error err;
    int rc = mt_trainer_train(r, &err);
    return rc < 0 ? mt_set_last_error(&err) : rc;
}

int64_t mt_run_steps_done(const mt_run *r) { return mt_trainer_steps_done(r); }
int64_t mt_run_total_steps(const mt_run *r) { return mt_trainer_total_steps(r); }
void mt_run_close(mt_run *r) { mt_trainer_close(r); }
