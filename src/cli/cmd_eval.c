/* megatrain eval: mean loss and perplexity of a model on a data file. */
#include <stdio.h>

#include "cli/cli_options.h"
#include "cli/commands.h"

typedef struct eval_args {
    const char *model, *tokenizer, *text_field;
    mt_eval_opts eo; // the strings of the choices below are set after parsing
    int data_format, chat_template, packing, device, precision;
    int objective, loss_type;
    double beta, label_smoothing, gamma, lambda;
    const char *ref_model;
    bool skip_bad_pairs;
    bool given[32];
} eval_args;

#define OFF(field) offsetof(eval_args, field)
static const mt_opt options[] = {
    MT_CLI_MODEL(eval_args, "Model and data"),
    {"data", MT_OPT_TEXT, OFF(eo.data), NULL, NULL, MT_OPT_ANY, NULL, "FILE", NULL,
     ".jsonl (any format of --data-format) or .mtok"},
    MT_CLI_DATA_LAYOUT(eval_args),
    {"packing", MT_OPT_ENUM, OFF(packing), "auto", NULL, MT_OPT_ANY, mt_tc_packings, NULL, NULL,
     "documents packed in a row, as in train"},
    {"seq_len", MT_OPT_INT, OFF(eo.seq_len), "0", NULL, MT_OPT_AT_LEAST(0), NULL, "T",
     "Batch", "tokens per row; 0: the model's max_position_embeddings, at most 1024"},
    {"batch_size", MT_OPT_INT, OFF(eo.batch_size), "4", NULL, MT_OPT_AT_LEAST(1), NULL, "B",
     NULL, "rows per micro-batch"},
    {"micro_batches", MT_OPT_INT, OFF(eo.micro_batches), "1", NULL, MT_OPT_BETWEEN(1, 4096),
     NULL, "M", NULL, "micro-batches per forward pass; with a run's seq_len, batch_size and "
     "micro_batches, the loss equals the run's eval_loss at the checkpoint's step"},
    {"max_batches", MT_OPT_INT, OFF(eo.max_batches), "0", NULL, MT_OPT_NONNEG, NULL, "N", NULL,
     "stop after N batches; 0: the whole file"},
    MT_CLI_OBJECTIVE(eval_args, "Objective"),
    MT_CLI_DEVICE(eval_args, "Device"),
    MT_CLI_PRECISION(eval_args, NULL),
    {"dump_logits", MT_OPT_TEXT, OFF(eo.dump_logits), "", NULL, MT_OPT_ANY, NULL, "FILE",
     "Output", "write the first row's input ids and logits as safetensors (to compare with "
     "another implementation)"},
};
#undef OFF
static const mt_opt_alias aliases[] = {MT_CLI_FORMAT_ALIAS};

static int run(void *args, int argc, char **argv) {
    mt_cli_warn_launcher("eval");
    eval_args *a = args;
    mt_eval_opts *eo = &a->eo;
    eo->format = mt_tc_data_formats[a->data_format];
    eo->text_field = a->text_field;
    eo->chat_template = mt_tc_chat_templates[a->chat_template];
    eo->packing = mt_tc_packings[a->packing];
    eo->device = mt_tc_devices[a->device];
    eo->precision = mt_tc_dtypes[a->precision];
    eo->objective = mt_tc_objectives[a->objective];
    eo->loss_type = mt_tc_loss_types[a->loss_type];
    eo->beta = a->beta, eo->label_smoothing = a->label_smoothing, eo->gamma = a->gamma;
    eo->lambda = a->lambda;
    eo->ref_model = a->ref_model, eo->skip_bad_pairs = a->skip_bad_pairs;
    mt_eval_result res;
    mt_model *m = mt_model_open(a->model, a->tokenizer);
    int rc = !m || mt_model_eval(m, eo, &res) ? 1 : 0;
    if (rc) mt_cli_fail("eval", 1, "%s", mt_last_error());
    else if (a->objective != MT_TC_OBJECTIVE_SFT)
        printf("eval: %s on %s: %lld pairs (%lld left out), loss %.6f, rewards/chosen %.4f, "
               "rewards/rejected %.4f, rewards/accuracies %.4f, rewards/margins %.4f, "
               "logps/chosen %.4f, logps/rejected %.4f\n", a->model, eo->data,
               (long long)res.pairs, (long long)res.skipped_pairs, res.loss, res.rewards_chosen,
               res.rewards_rejected, res.rewards_accuracies, res.rewards_margins,
               res.logps_chosen, res.logps_rejected);
    else
        printf("eval: %s on %s: %lld tokens in %lld batches, loss %.6f, perplexity %.4f\n",
               a->model, eo->data, (long long)res.tokens, (long long)res.batches, res.loss,
               res.perplexity);
    mt_model_close(m);
    return rc;
}

static const mt_opt_table table = {
    .command = "eval", MT_OPT_ROWS(options), MT_OPT_ALIASES(aliases), MT_OPT_STRUCT(eval_args),
    .about = "The mean loss per token and the perplexity of a model on a data file, read once\n"
             "in order; or, with --objective dpo|simpo|orpo, a preference objective's loss and\n"
             "rewards on held-out pairs."};
const mt_cli_command mt_cli_eval = {
    "eval", "loss and perplexity of a model on a data file", &table, run};
