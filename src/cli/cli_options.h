/* Rows of option tables (util/options.h) that several commands share, so
 * that an option is spelt, described and checked the same in each: the
 * model and tokenizer, the model shape, the batch shape, the precision and
 * device, the memory budgets and rates of the planner, the data layout.
 * Each macro gives the rows of a command's struct T, whose fields have the
 * options' names; `d_*` are the command's defaults, `sec` the --help
 * section the first row opens (or NULL). The choices are train's
 * (train/train_config.h). */
#ifndef MT_CLI_CLI_OPTIONS_H
#define MT_CLI_CLI_OPTIONS_H

#include <stddef.h>

#include "model/presets.h"
#include "train/train_config.h"
#include "util/options.h"

/* A row whose field is named like the option. */
#define MT_CLI_ROW(T, name, type, def, range, choices, meta, sec, help) \
    {#name, type, offsetof(T, name), def, NULL, range, choices, meta, sec, help}

/* A model to load (required), and its tokenizer. */
#define MT_CLI_MODEL(T, sec)                                                       \
    MT_CLI_ROW(T, model, MT_OPT_TEXT, NULL, MT_OPT_ANY, NULL, "DIR", sec,          \
               "a Hugging Face model directory (ours or any other)"),              \
    MT_CLI_ROW(T, tokenizer, MT_OPT_TEXT, "", MT_OPT_ANY, NULL, "PATH", NULL,      \
               "tokenizer.json, or bytes for the byte tokenizer; none: "           \
               "<model>/tokenizer.json")

/* A model's shape, over a preset's or alone: `what` ends each help. */
#define MT_CLI_SHAPE(T, d_hidden, d_layers, d_heads, d_kv, d_ffn, sec, what)           \
    MT_CLI_ROW(T, hidden, MT_OPT_INT, d_hidden, MT_OPT_NONNEG, NULL, "N", sec,         \
               "hidden size" what),                                                    \
    MT_CLI_ROW(T, layers, MT_OPT_INT, d_layers, MT_OPT_NONNEG, NULL, "N", NULL,        \
               "decoder layers" what),                                                 \
    MT_CLI_ROW(T, heads, MT_OPT_INT, d_heads, MT_OPT_NONNEG, NULL, "N", NULL,          \
               "attention heads" what),                                                \
    MT_CLI_ROW(T, kv_heads, MT_OPT_INT, d_kv, MT_OPT_NONNEG, NULL, "N", NULL,          \
               "key/value heads" what),                                                \
    MT_CLI_ROW(T, ffn, MT_OPT_INT, d_ffn, MT_OPT_NONNEG, NULL, "N", NULL,              \
               "MLP inner size (of a mixture-of-experts shape: the experts')" what)
#define MT_CLI_PRESET(T, def, sec)                                          \
    MT_CLI_ROW(T, preset, MT_OPT_TEXT, def, MT_OPT_ANY, NULL, "NAME", sec, \
               "a published model shape: " MT_PRESET_NAMES)

/* The batch shape: rows of seq_len tokens, micro-batches of rows. */
#define MT_CLI_BATCH(T, d_seq_len, d_batch_size, d_micro_batches, sec)                      \
    MT_CLI_ROW(T, seq_len, MT_OPT_INT, d_seq_len, MT_OPT_AT_LEAST(1), NULL, "T", sec,       \
               "tokens per row"),                                                           \
    MT_CLI_ROW(T, batch_size, MT_OPT_INT, d_batch_size, MT_OPT_AT_LEAST(1), NULL, "B", NULL, \
               "rows per micro-batch"),                                                     \
    MT_CLI_ROW(T, micro_batches, MT_OPT_INT, d_micro_batches, MT_OPT_AT_LEAST(1), NULL, "M", \
               NULL, "micro-batches per optimizer step")

/* Precision and device. */
#define MT_CLI_PRECISION(T, sec)                                                   \
    MT_CLI_ROW(T, precision, MT_OPT_ENUM, "bf16", MT_OPT_ANY, mt_tc_dtypes, NULL, sec, \
               "matrix products in bf16 (fp32 accumulation) or all fp32")
#define MT_CLI_DEVICE(T, sec)                                                       \
    MT_CLI_ROW(T, device, MT_OPT_ENUM, "auto", MT_OPT_ANY, mt_tc_devices, NULL, sec, \
               "where to run; auto: cuda when present, else cpu")

/* Where the planner may put things (`gpu_free`: what a GPU budget of 0
 * means), and how fast this machine is. */
#define MT_CLI_BUDGETS(T, sec, gpu_free)                                                     \
    MT_CLI_ROW(T, gpu_mem, MT_OPT_FLOAT, "0", MT_OPT_NONNEG, NULL, "GB", sec,                \
               "GPU memory the run may take, CUDA context included; 0: " gpu_free),          \
    MT_CLI_ROW(T, host_mem, MT_OPT_FLOAT, "0", MT_OPT_NONNEG, NULL, "GB", NULL,              \
               "host RAM the run may take; 0: MemTotal less max(4 GB, 4%)"),                 \
    MT_CLI_ROW(T, host_grad_dtype, MT_OPT_ENUM, "auto", MT_OPT_ANY, mt_tc_grad_dtypes, NULL, \
               NULL, "gradients waiting in host RAM: fp32, or bf16 (14 bytes/param); auto: " \
               "fp32 when it fits"),                                                         \
    MT_CLI_ROW(T, saved_input_dtype, MT_OPT_ENUM, "fp32", MT_OPT_ANY, mt_tc_saved_dtypes,   \
               NULL, NULL, MT_SAVED_INPUT_DTYPE_HELP)
#define MT_CLI_CALIBRATION(T)                                                     \
    MT_CLI_ROW(T, calibration, MT_OPT_TEXT, "", MT_OPT_ANY, NULL, "FILE", NULL, \
               "machine rates for the planner, written by megatrain calibrate")

/* How the lines of a JSONL file read; the older spelling of data_format,
 * kept: eval and tokenize called it --format. */
#define MT_CLI_DATA_LAYOUT(T)                                                                  \
    MT_CLI_ROW(T, data_format, MT_OPT_ENUM, "auto", MT_OPT_ANY, mt_tc_data_formats, NULL,     \
               NULL, "JSONL layout: text, prompt/completion (texts or lists of messages), "  \
               "chat messages, alpaca, sharegpt, or tokens; auto: detect"),                    \
    MT_CLI_ROW(T, text_field, MT_OPT_TEXT, "text", MT_OPT_ANY, NULL, "FIELD", NULL,           \
               "the key of the text format's text (a JSONL line {\"FIELD\": \"...\"})"),    \
    MT_CLI_ROW(T, chat_template, MT_OPT_ENUM, "auto", MT_OPT_ANY, mt_tc_chat_templates, NULL, \
               NULL, "chat template of chat data: auto, the model's own (its "                \
               "tokenizer_config.json), else the built-in its tokenizer suggests; or a built-in by name")
/* A preference objective and its parameters, as train's (docs/preference.md):
 * fields objective, loss_type (int), beta, label_smoothing, gamma, lambda
 * (double), ref_model (const char *), skip_bad_pairs (bool). */
#define MT_CLI_OBJECTIVE(T, sec)                                                                \
    MT_CLI_ROW(T, objective, MT_OPT_ENUM, "sft", MT_OPT_ANY, mt_tc_objectives, NULL, sec,      \
               "sft: the loss per token; dpo, simpo, orpo: a preference objective's metrics "  \
               "on pairs {prompt, chosen, rejected}"),                                          \
    MT_CLI_ROW(T, loss_type, MT_OPT_ENUM, "sigmoid", MT_OPT_ANY, mt_tc_loss_types, NULL, NULL, \
               "dpo's loss: sigmoid, ipo, hinge"),                                              \
    MT_CLI_ROW(T, beta, MT_OPT_FLOAT, "0.1", MT_OPT_ANY, NULL, NULL, NULL,                      \
               "dpo, simpo: the temperature beta"),                                             \
    MT_CLI_ROW(T, label_smoothing, MT_OPT_FLOAT, "0", MT_OPT_ANY, NULL, NULL, NULL,            \
               "dpo sigmoid, simpo: label smoothing"),                                          \
    MT_CLI_ROW(T, gamma, MT_OPT_FLOAT, "0.5", MT_OPT_ANY, NULL, NULL, NULL,                    \
               "simpo: the target reward margin"),                                              \
    MT_CLI_ROW(T, lambda, MT_OPT_FLOAT, "0.1", MT_OPT_ANY, NULL, NULL, NULL,                   \
               "orpo: the weight of the odds-ratio term"),                                      \
    MT_CLI_ROW(T, ref_model, MT_OPT_TEXT, "", MT_OPT_ANY, NULL, "DIR", NULL,                   \
               "dpo: the reference model (the model before preference training)"),             \
    MT_CLI_ROW(T, skip_bad_pairs, MT_OPT_BOOL, "false", MT_OPT_ANY, NULL, NULL, NULL,          \
               "leave out (and count) bad pairs instead of failing")

#define MT_CLI_FORMAT_ALIAS {"format", "data_format", MT_ALIAS_DEPRECATED}

#endif
