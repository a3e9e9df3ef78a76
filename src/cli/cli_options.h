/* Rows of option tables (util/options.h) that several commands share, so
 * that an option is spelt, described and checked the same in each: the
 * batch shape, the precision and device, the model shape, the memory
 * budgets and rates of the planner, the data layout. Each macro is one row
 * for a command's struct T, whose field has the option's name; `def` is
 * the command's default, `sec` the --help section it opens (or NULL). The
 * choices are train's (train/train_config.h). */
#ifndef MT_CLI_CLI_OPTIONS_H
#define MT_CLI_CLI_OPTIONS_H

#include <stddef.h>

#include "model/presets.h"
#include "train/train_config.h"
#include "util/options.h"

/* A row whose field is named like the option. */
#define MT_CLI_ROW(T, name, type, def, range, choices, meta, sec, help) \
    {#name, type, offsetof(T, name), def, NULL, range, choices, meta, sec, help}

/* Batch shape and precision. */
#define MT_CLI_SEQ_LEN(T, def, sec) \
    MT_CLI_ROW(T, seq_len, MT_OPT_INT, def, MT_OPT_AT_LEAST(1), NULL, "T", sec, "tokens per row")
#define MT_CLI_BATCH_SIZE(T, def, sec)                                              \
    MT_CLI_ROW(T, batch_size, MT_OPT_INT, def, MT_OPT_AT_LEAST(1), NULL, "B", sec, \
               "rows per micro-batch")
#define MT_CLI_MICRO_BATCHES(T, def, sec)                                              \
    MT_CLI_ROW(T, micro_batches, MT_OPT_INT, def, MT_OPT_AT_LEAST(1), NULL, "M", sec, \
               "micro-batches per optimizer step")
#define MT_CLI_PRECISION(T, sec)                                                   \
    MT_CLI_ROW(T, precision, MT_OPT_ENUM, "bf16", MT_OPT_ANY, mt_tc_dtypes, NULL, sec, \
               "matrix products in bf16 (fp32 accumulation) or all fp32")
#define MT_CLI_DEVICE(T, sec)                                                       \
    MT_CLI_ROW(T, device, MT_OPT_ENUM, "auto", MT_OPT_ANY, mt_tc_devices, NULL, sec, \
               "where to run; auto: cuda when present, else cpu")

/* A model's shape, over a preset's or alone: the defaults are the
 * command's ("0" where 0 means the preset's), `what` ends each help. */
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

/* Where the planner may put things, and how fast this machine is. */
#define MT_CLI_GPU_MEM(T, sec, help)                                          \
    MT_CLI_ROW(T, gpu_mem, MT_OPT_FLOAT, "0", MT_OPT_NONNEG, NULL, "GB", sec, \
               "GPU memory the run may take, CUDA context included; 0: " help)
#define MT_CLI_HOST_MEM(T)                                                      \
    MT_CLI_ROW(T, host_mem, MT_OPT_FLOAT, "0", MT_OPT_NONNEG, NULL, "GB", NULL, \
               "host RAM the run may take; 0: MemTotal less max(4 GB, 4%)")
#define MT_CLI_HOST_GRAD_DTYPE(T)                                                             \
    MT_CLI_ROW(T, host_grad_dtype, MT_OPT_ENUM, "auto", MT_OPT_ANY, mt_tc_grad_dtypes, NULL, \
               NULL, "gradients waiting in host RAM: fp32, or bf16 (14 bytes/param); auto: " \
               "fp32 when it fits")
#define MT_CLI_CALIBRATION(T)                                                     \
    MT_CLI_ROW(T, calibration, MT_OPT_TEXT, "", MT_OPT_ANY, NULL, "FILE", NULL, \
               "machine rates for the planner, written by megatrain calibrate")

/* Data files. */
#define MT_CLI_DATA_FORMAT(T)                                                                \
    MT_CLI_ROW(T, data_format, MT_OPT_ENUM, "auto", MT_OPT_ANY, mt_tc_data_formats, NULL,   \
               NULL, "JSONL layout: text, prompt/completion, chat messages, or tokens; auto: " \
               "detect")
#define MT_CLI_CHAT_TEMPLATE(T)                                                                \
    MT_CLI_ROW(T, chat_template, MT_OPT_ENUM, "auto", MT_OPT_ANY, mt_tc_chat_templates, NULL, \
               NULL, "chat format of the model; auto: from the model's type")

/* The older spelling of data_format, kept: eval and tokenize called it --format. */
#define MT_CLI_FORMAT_ALIAS {"format", "data_format", MT_ALIAS_DEPRECATED}

#endif
