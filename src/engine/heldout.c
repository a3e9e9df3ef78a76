/* Held-out loss: the evaluation loop and the eval set of a training run;
 * see heldout.h. */
#include "engine/heldout.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/step.h"
#include "util/mem.h"
#include "util/sys.h"

int64_t mt_eval_next_batch(mt_dataset *d, int64_t rows, int64_t T, int32_t *tokens,
                           int32_t *targets, int32_t *pos) {
    if (mt_dataset_next_batch(d, rows, T, tokens, targets, pos) == 0) return rows;
    int64_t got = 0;
    while (got < rows && mt_dataset_next_batch(d, 1, T, tokens + got * T, targets + got * T,
                                               pos ? pos + got * T : NULL) == 0)
        got++;
    if (got == 0) return 0;
    size_t from = (size_t)(got * T), n = (size_t)((rows - got) * T);
    memset(tokens + from, 0, n * sizeof *tokens);
    for (size_t i = 0; i < n; i++) targets[from + i] = MT_IGNORE_INDEX;
    if (pos) memset(pos + from, 0, n * sizeof *pos);
    return got;
}

int mt_eval_dataset(mt_backend *be, int n_layers, mt_dataset *d, int M, int mb_first,
                    int mb_count, int64_t B, int64_t T, int64_t max_batches, int32_t *tokens,
                    int32_t *targets, int32_t *pos, mt_eval_totals *res, mt_error *err) {
    double t0 = mt_now_s();
    memset(res, 0, sizeof *res);
    mt_dataset_rewind(d);
    size_t skip = (size_t)mb_first * (size_t)B * (size_t)T;
    while ((!max_batches || res->batches < max_batches) &&
           mt_eval_next_batch(d, (int64_t)M * B, T, tokens, targets, pos) > 0) {
        mt_batch b = {.M = mb_count, .B = B, .T = T, .tokens = tokens + skip,
                      .targets = targets + skip, .pos = pos ? pos + skip : NULL};
        double ls;
        int64_t nv;
        if (mt_step_eval(be, n_layers, &b, &ls, &nv, err)) return -1;
        res->loss_sum += ls;
        res->tokens += nv;
        res->batches++;
    }
    res->seconds = mt_now_s() - t0;
    return 0;
}

int mt_eval_set_open(mt_eval_set *e, const mt_data_opts *o, const mt_tokenizer *tok,
                     int64_t vocab_size, int M, int64_t B, int64_t T, int64_t max_batches,
                     int64_t every, mt_error *err) {
    memset(e, 0, sizeof *e);
    mt_data_opts eo = *o;
    eo.seed = MT_EVAL_SEED, eo.epochs = 1;
    if (!(e->data = mt_dataset_open(&eo, tok, vocab_size, err)))
        return mt_error_prefix(err, "eval_data: ");
    if (mt_dataset_rows_per_epoch(e->data, T) < 1) {
        mt_errorf(err, "eval_data: %s holds %lld tokens, less than one row of seq_len + 1 = "
                  "%lld: add held-out data", o->path, (long long)mt_dataset_stats(e->data).tokens,
                  (long long)T + 1);
        mt_eval_set_free(e);
        return -1;
    }
    mt_data_stats st = mt_dataset_stats(e->data);
    if (st.trainable == 0) {
        mt_errorf(err, "eval_data: %s has no token with a loss (every label is masked): give "
                  "data with answers to score", o->path);
        mt_eval_set_free(e);
        return -1;
    }
    e->M = M, e->B = B, e->T = T, e->max_batches = max_batches, e->every = every;
    e->mb_first = 0, e->mb_count = M;
    size_t n = (size_t)M * (size_t)B * (size_t)T;
    e->tokens = mt_malloc_or_die(n * sizeof *e->tokens);
    e->targets = mt_malloc_or_die(n * sizeof *e->targets);
    if (mt_dataset_packs_documents(e->data)) e->pos = mt_malloc_or_die(n * sizeof *e->pos);
    return 0;
}

void mt_eval_set_free(mt_eval_set *e) {
    if (e->data) mt_dataset_free(e->data);
    free(e->tokens);
    free(e->targets);
    free(e->pos);
    memset(e, 0, sizeof *e);
}

int mt_eval_set_due(const mt_eval_set *e, int64_t step, int64_t total_steps) {
    return e->data && step > 0 && (step == total_steps || (e->every > 0 && step % e->every == 0));
}

/* mt_eval_dataset over this rank's micro-batches, its totals added over
 * the ranks. */
static int eval_share(mt_eval_set *e, mt_backend *be, int n_layers, mt_eval_totals *res,
                      mt_error *err) {
    if (mt_eval_dataset(be, n_layers, e->data, e->M, e->mb_first, e->mb_count, e->B, e->T,
                        e->max_batches, e->tokens, e->targets, e->pos, res, err))
        return -1;
    double x[2] = {res->loss_sum, (double)res->tokens};
    if (e->sum && e->sum(e->sum_ctx, x, 2, err)) return -1;
    res->loss_sum = x[0];
    res->tokens = (int64_t)x[1];
    return 0;
}

int mt_eval_set_log(mt_eval_set *e, mt_backend *be, int n_layers, int64_t step,
                    int64_t total_steps, mt_metrics_writer *mw, char *line, size_t cap,
                    mt_error *err) {
    mt_eval_totals r;
    if (eval_share(e, be, n_layers, &r, err))
        return mt_error_prefix(err, "evaluation at step %lld: ", (long long)step);
    if (r.tokens == 0)  // every batch fully masked: no loss to report
        return mt_errorf(err, "evaluation at step %lld: the eval batches have no token with a "
                         "loss; raise eval_batches or give other eval_data", (long long)step);
    mt_metrics_row row = mt_metrics_row_make(step);
    row.eval_loss = r.loss_sum / (double)r.tokens;
    row.eval_tokens = r.tokens;
    row.eval_time_s = r.seconds;
    if (mw && mt_metrics_write(mw, &row, err)) return -1; /* stops the run, as a training row's */
    if (line) {
        char head[512];
        mt_progress_format(&row, total_steps, head, sizeof head);
        snprintf(line, cap, "%s | %lld tokens in %.1fs", head, (long long)r.tokens, r.seconds);
    }
    return 0;
}
