/* The loss of a model on a data file (`megatrain eval`). */
#include "train/model_eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "engine/heldout.h"
#include "engine/step.h"
#include "io/safetensors.h"
#include "util/mem.h"

void mt_eval_opts_defaults(mt_eval_opts *o) {
    *o = (mt_eval_opts){.seq_len = 0, .batch_size = 4, .micro_batches = 1, .beta = 0.1,
                        .gamma = 0.5, .lambda = 0.1};
}

/* The default length of a row: the model's, at most 1024. */
enum { DEFAULT_SEQ_LEN = 1024 };

/* Row 0's input ids (T) and logits (T, V) of the batch just evaluated. */
static int dump_logits(const mt_runner *r, const mt_config *cfg, const int32_t *tokens,
                       int64_t T, const char *path, mt_error *err) {
    float *logits = mt_malloc_or_die((size_t)T * cfg->V * sizeof(float));
    for (int64_t t = 0; t < T; t++) mt_runner_logits(r, t, logits + (size_t)t * cfg->V);
    mt_st_write_tensor w[2] = {
        {.name = "input_ids", .dtype = MT_DTYPE_I32, .ndim = 1, .shape = {T}, .raw = tokens},
        {.name = "logits", .dtype = MT_DTYPE_F32, .ndim = 2, .shape = {T, cfg->V}, .f32 = logits},
    };
    int rc = mt_st_write(path, w, 2, NULL, 0, err);
    free(logits);
    return rc;
}

static int check_opts(const mt_eval_opts *o, int *device, mt_error *err) {
    *device = mt_runner_parse_device(o->device ? o->device : "auto");
    if (!o->data) return mt_errorf(err, "eval: no data file; set data to a .jsonl or .mtok file");
    if (*device < 0)
        return mt_errorf(err, "eval: device '%s': use auto, cpu or cuda", o->device);
    if (o->precision && strcmp(o->precision, "bf16") && strcmp(o->precision, "fp32"))
        return mt_errorf(err, "eval: precision '%s': use bf16 or fp32", o->precision);
    if (o->seq_len < 0 || o->batch_size < 1 || o->max_batches < 0 || o->micro_batches < 1 ||
        o->micro_batches > 4096)
        return mt_errorf(err, "eval: need seq_len >= 0 (0: the model's), batch_size >= 1, "
                         "1 <= micro_batches <= 4096 and max_batches >= 0 (got %lld, %lld, %lld, "
                         "%lld)",
                         (long long)o->seq_len, (long long)o->batch_size,
                         (long long)o->micro_batches, (long long)o->max_batches);
    return 0;
}

int mt_eval_model(mt_loaded_model *m, const mt_eval_opts *o, mt_eval_result *res,
                  mt_error *err) {
    int dev;
    if (check_opts(o, &dev, err)) return -1;
    const mt_config *cfg = &m->cfg;
    int64_t T = o->seq_len ? o->seq_len
                           : cfg->max_pos < DEFAULT_SEQ_LEN ? cfg->max_pos : DEFAULT_SEQ_LEN;
    int64_t B = o->batch_size, M = o->micro_batches;
    if (T > cfg->max_pos)
        return mt_errorf(err, "--seq-len %lld exceeds the model's max_position_embeddings %lld",
                         (long long)T, (long long)cfg->max_pos);
    if (o->objective && strcmp(o->objective, "sft")) return mt_eval_model_pref(m, o, dev, T, res, err);
    mt_data_opts dopts = {.path = o->data, .format = o->format ? o->format : "auto",
                          .chat_template = o->chat_template ? o->chat_template : "auto",
                          .packing = o->packing ? o->packing : "auto", .text_field = o->text_field,
                          .seed = MT_EVAL_SEED, .epochs = 1};
    mt_dataset *ds = mt_dataset_open(&dopts, m->tok, cfg->V, err);
    if (!ds) return -1;
    mt_runner r = {0};
    mt_runner_opts ro = {.device = dev, .fp32 = o->precision && !strcmp(o->precision, "fp32")};
    int32_t *tokens = NULL, *targets = NULL, *pos = NULL;
    int rc = -1;
    if (mt_runner_init(&r, cfg, &m->table, &m->store, (int)M, B, T, &ro, err)) goto out;
    size_t n = (size_t)(M * B * T);
    tokens = mt_malloc_or_die(n * sizeof *tokens);
    targets = mt_malloc_or_die(n * sizeof *targets);
    if (mt_dataset_packs_documents(ds)) pos = mt_malloc_or_die(n * sizeof *pos);
    double sum = 0;
    int64_t count = 0, batches = 0;
    while ((!o->max_batches || batches < o->max_batches) &&
           mt_eval_next_batch(ds, M * B, T, tokens, targets, pos) > 0) {
        /* the loop of mt_eval_dataset, which a run's evaluation uses */
        mt_batch b = {.M = (int)M, .B = B, .T = T, .tokens = tokens, .targets = targets,
                      .pos = pos};
        double ls;
        int64_t nv;
        if (mt_step_eval(r.be, m->table.n_layers, &b, &ls, &nv, err)) goto out;
        sum += ls;
        count += nv;
        if (o->dump_logits && batches == 0 && dump_logits(&r, cfg, tokens, T, o->dump_logits, err))
            goto out;
        batches++;
    }
    if (!count) {
        mt_data_stats st = mt_dataset_stats(ds);
        if (st.trainable == 0)
            mt_errorf(err, "%s: none of its %lld tokens has a loss (prompts only?): give data with "
                      "text, completions or assistant turns", o->data, (long long)st.tokens);
        else
            mt_errorf(err, "%s: no row of seq_len + 1 = %lld tokens with a loss (the data holds "
                      "%lld tokens, %lld with a loss); lower --seq-len to %lld or less", o->data,
                      (long long)T + 1, (long long)st.tokens, (long long)st.trainable,
                      (long long)(st.tokens > 1 ? st.tokens - 1 : 1));
        goto out;
    }
    *res = (mt_eval_result){.loss = sum / count, .perplexity = exp(sum / count),
                            .tokens = count, .batches = batches};
    rc = 0;
out:
    mt_runner_free(&r);
    mt_dataset_free(ds);
    free(tokens);
    free(targets);
    free(pos);
    return rc;
}
