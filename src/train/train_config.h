/* The configuration of `megatrain train`: one struct holding every option.
 *
 * One table (train_config.c: `mt_tc_options`, an option table of
 * util/options.h) of {name, type, default, tiny-model default, range, help}
 * drives everything: the defaults, the YAML config
 * file keys, the command-line flags, the --help text, validation and the
 * YAML/JSON written back. Precedence: defaults < config file < flags.
 *
 * Keys are flat, as in HF / axolotl / torchtune configs (`lr: 1e-5`); a key
 * may be spelt with '_' or '-', a flag is the key with dashes
 * (`--batch-size 8`, `--batch-size=8`, booleans `--skip-bad-lines` /
 * `--no-skip-bad-lines`). docs/config.md is the user's manual.
 *
 * Files, each depending only on those before it: train_config.c (the table,
 * values, validation), train_config_io.c (YAML, JSON), train_args.c (flags,
 * --help). */
#ifndef MT_TRAIN_TRAIN_CONFIG_H
#define MT_TRAIN_TRAIN_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "optim/schedule.h"
#include "util/error.h"
#include "util/options.h"

/* Longest path or string value, terminator included. */
#define MT_TC_STR MT_OPT_STR
/* Room for the options of the table (a static assert keeps it large enough). */
#define MT_TC_MAX_OPTIONS 64

typedef enum mt_tc_data_format {
    MT_TC_DATA_AUTO, MT_TC_DATA_TEXT, MT_TC_DATA_COMPLETION, MT_TC_DATA_CHAT, MT_TC_DATA_ALPACA,
    MT_TC_DATA_SHAREGPT, MT_TC_DATA_TOKENS
} mt_tc_data_format;
typedef enum mt_tc_chat_template {
    MT_TC_CHAT_AUTO, MT_TC_CHAT_LLAMA3, MT_TC_CHAT_QWEN, MT_TC_CHAT_LLAMA2, MT_TC_CHAT_MISTRAL,
    MT_TC_CHAT_CHATML, MT_TC_CHAT_PHI3, MT_TC_CHAT_GEMMA
} mt_tc_chat_template;
typedef enum mt_tc_packing {
    MT_TC_PACKING_AUTO, MT_TC_PACKING_DOCUMENTS, MT_TC_PACKING_ROWS
} mt_tc_packing;
typedef enum mt_tc_objective {
    MT_TC_OBJECTIVE_SFT, MT_TC_OBJECTIVE_DPO, MT_TC_OBJECTIVE_SIMPO, MT_TC_OBJECTIVE_ORPO
} mt_tc_objective;
typedef enum mt_tc_loss_type {
    MT_TC_LOSS_SIGMOID, MT_TC_LOSS_IPO, MT_TC_LOSS_HINGE
} mt_tc_loss_type;
typedef enum mt_save_dtype { MT_SAVE_BF16, MT_SAVE_FP32 } mt_save_dtype;
typedef enum mt_nonfinite_action { MT_NONFINITE_STOP, MT_NONFINITE_SKIP } mt_nonfinite_action;
typedef enum mt_device_kind { MT_DEVICE_AUTO, MT_DEVICE_CPU, MT_DEVICE_CUDA } mt_device_kind;
typedef enum mt_tc_precision { MT_TC_PRECISION_BF16, MT_TC_PRECISION_FP32 } mt_tc_precision;

typedef struct mt_train_config {
    /* model and data */
    char model[MT_TC_STR];          // HF model directory; "" = built-in tiny model
    char tokenizer[MT_TC_STR];      // tokenizer.json; "" = <model>/tokenizer.json or bytes
    char data[MT_TC_STR];           // file, shard directory or weighted list; "" = built-in text
    mt_tc_data_format data_format;
    char text_field[MT_TC_STR];     // the text format's key
    mt_tc_chat_template chat_template;
    mt_tc_packing packing;          // documents in a row: separate sequences, or one
    bool skip_bad_lines;
    bool router_aux_loss;           // MoE: add the load-balancing loss (docs/moe.md)
    /* objective (docs/preference.md) */
    mt_tc_objective objective;      // sft: cross-entropy; dpo, simpo, orpo: preference pairs
    mt_tc_loss_type loss_type;      // dpo's loss
    double beta;                    // dpo, simpo: the temperature
    double label_smoothing;         // dpo sigmoid, simpo
    double gamma;                   // simpo's reward margin
    double lambda;                  // orpo's odds-ratio weight
    char ref_model[MT_TC_STR];      // dpo's reference model; "" = the starting weights
    bool skip_bad_pairs;
    /* batch shape and length */
    int64_t seq_len;                // T
    int64_t batch_size;             // B, rows per micro-batch
    int64_t micro_batches;          // M, per optimizer step
    int64_t steps;                  // optimizer steps; 0 = from epochs
    int64_t epochs;
    /* optimizer and schedule */
    double lr, min_lr_ratio;
    mt_lr_kind schedule;            // same order as cosine|linear|constant
    int64_t warmup_steps;
    double weight_decay, beta1, beta2, eps, max_grad_norm;
    int64_t seed;
    mt_nonfinite_action on_nonfinite;
    int64_t max_skips;
    /* output and checkpoints */
    char out[MT_TC_STR];
    int64_t save_every, keep_last;
    mt_save_dtype save_dtype;
    double max_shard_size;          // GB per safetensors file of the saved model
    char resume[MT_TC_STR];         // "" = fresh run, "auto" = latest in out/, or a path
    bool overwrite;                 // a fresh run replaces the run already in out/
    /* device */
    mt_device_kind device;
    int64_t gpus;                   // ranks this process starts on this machine; 0, 1: none
    mt_tc_precision precision;
    bool host_saved_inputs;
    double gpu_mem, host_mem;       // GB; 0 = the machine's
    int host_grad_dtype;            // auto | fp32 | bf16
    int saved_input_dtype;          // fp32 | bf16: saved layer inputs waiting in host RAM
    char calibration[MT_TC_STR];    // "" = probe
    char nvme_dir[MT_TC_STR];       // directories of the disk tier, "DIR[,DIR...]"; "" = none
    double disk_mem;                // GB of disk the tier may take; 0 = the free space
    int64_t disk_layers;            // layers whose m and v live there (the last ones); -1 auto
    int64_t disk_saved_layers;      // saved layer inputs there (the first ones); -1 auto
    int64_t disk_weight_layers;     // of the disk layers, the last with fp32 weights there; -1 auto
    /* evaluation and logging */
    char eval_data[MT_TC_STR];      // held-out data; "" = none
    int64_t eval_every, eval_batches;
    int64_t log_every;
    int64_t sample_tokens;
    bool tensorboard;
    /* Which options were given by the config file or a flag (by table index),
     * so that the built-in tiny model can pick its own defaults for the rest. */
    bool given[MT_TC_MAX_OPTIONS];
} mt_train_config;

/* Every option at its default (the defaults for a real model). */
void mt_train_config_defaults(mt_train_config *cfg);

/* Sets one option from text, as in the config file or on the command line.
 * `key` may use '_' or '-'. `where` prefixes error messages ("run.yaml:7",
 * "--lr"); NULL for just the key. Checks the type and the range. */
int mt_train_config_set(mt_train_config *cfg, const char *key, const char *value,
                        const char *where, mt_error *err);

/* Reads a flat YAML mapping of options over cfg. Errors name path:line. */
int mt_train_config_load_yaml(mt_train_config *cfg, const char *path, mt_error *err);

/* The whole of `megatrain train`'s argument parsing: defaults, then the
 * --config file (wherever it appears), then the flags in order, then
 * mt_train_config_resolve and mt_train_config_validate. argv[0] is the
 * subcommand name. Returns 0, 1 when --help was asked (nothing else done:
 * the caller prints mt_train_config_usage and exits 0), or -1 with err
 * filled. */
int mt_train_config_parse_args(mt_train_config *cfg, int argc, char **argv, mt_error *err);

/* Fills what depends on other options: with no model, options not given
 * take the built-in tiny model's defaults (steps 800, lr 1e-2, ...); with a
 * model and no tokenizer, tokenizer = <model>/tokenizer.json. */
void mt_train_config_resolve(mt_train_config *cfg);

/* Range of every option and consistency between options. */
int mt_train_config_validate(const mt_train_config *cfg, mt_error *err);

/* The effective config as YAML (loadable by mt_train_config_load_yaml) and
 * as a JSON object (for checkpoint trainer state). malloc'd; free(). */
char *mt_train_config_to_yaml(const mt_train_config *cfg);
char *mt_train_config_to_json(const mt_train_config *cfg);

/* The effective config as "name=value" lines (every option, table order):
 * what the ranks of a run compare when they meet. malloc'd; free(). */
char *mt_train_config_to_lines(const mt_train_config *cfg);

/* Reads a JSON object written by mt_train_config_to_json over cfg. */
int mt_train_config_from_json(mt_train_config *cfg, const char *json, mt_error *err);

/* Writes to_yaml to path (the run's out/config.yaml). */
int mt_train_config_save_yaml(const mt_train_config *cfg, const char *path, mt_error *err);

/* The --help text of `megatrain train`, generated from the option table. */
void mt_train_config_usage(FILE *f);

/* The names of the choices of an option, NULL-terminated, in enum order:
 * those of train's options, which the other commands' options of the same
 * name take too (cli/cli_options.h). */
extern const char *const mt_tc_data_formats[];
extern const char *const mt_tc_chat_templates[];
extern const char *const mt_tc_packings[];
extern const char *const mt_tc_dtypes[];      // precision, save_dtype
extern const char *const mt_tc_devices[];
extern const char *const mt_tc_grad_dtypes[]; // host_grad_dtype
extern const char *const mt_tc_saved_dtypes[]; // saved_input_dtype
#define MT_SAVED_INPUT_DTYPE_HELP                                                            \
    "saved layer inputs waiting in host RAM (bf16 runs on the GPU): fp32, or bf16 (half the " \
    "RAM and PCIe traffic; the backward recomputes each layer from its rounded input)"
#define MT_DISK_SAVED_LAYERS_HELP                                                            \
    "with nvme_dir: the saved layer inputs (kept from the forward for the backward) of the "  \
    "first N layers that would wait in host RAM live on disk instead: written once in the "   \
    "forward, read back once ahead of the backward (the first layers: the most compute to "   \
    "hide both behind), through 3 pinned staging buffers of one layer's; -1: the fewest the " \
    "host budget needs (none when RAM holds them)"
#define MT_DISK_WEIGHT_LAYERS_HELP                                                           \
    "with nvme_dir: of the disk layers, the last N keep their fp32 weights there too "        \
    "([w | m | v], 12 bytes a parameter read and written each step) and RAM only a bf16 copy " \
    "(2 bytes a parameter, uploaded at half the bytes) and their norms and biases; bf16 on "  \
    "one GPU, never the embedding; -1: the planner's choice (none unless the host budget is " \
    "short with every layer's m and v on disk)"
extern const char *const mt_tc_objectives[];
extern const char *const mt_tc_loss_types[];

/* Names of enum values as written in configs ("cosine", "bf16", ...). */
const char *mt_tc_data_format_name(mt_tc_data_format v);
const char *mt_tc_chat_template_name(mt_tc_chat_template v);
const char *mt_tc_packing_name(mt_tc_packing v);
const char *mt_device_kind_name(mt_device_kind v);
const char *mt_tc_precision_name(mt_tc_precision v);
const char *mt_save_dtype_name(mt_save_dtype v);

#endif
