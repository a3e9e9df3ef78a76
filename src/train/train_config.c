/* The option table of `megatrain train` (util/options.h drives defaults,
 * values from text, flags and --help from it), the tiny-model defaults and
 * validation. The files built on it, each reading this one and not the
 * other way round: YAML and JSON in train_config_io.c, the flags and --help
 * in train_args.c. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "train/train_config_internal.h"
#include "data/data_spec.h"
#include "io/hub_cache.h"

#define OFF(field) offsetof(mt_train_config, field)
#define AT_LEAST(x) MT_OPT_AT_LEAST(x)
#define NONNEG MT_OPT_NONNEG
#define ANY MT_OPT_ANY

const char *const mt_tc_data_formats[] = {"auto",   "text",     "completion", "chat",
                                          "alpaca", "sharegpt", "tokens",     NULL};
const char *const mt_tc_chat_templates[] = {"auto",    "llama3", "qwen",  "llama2", "mistral",
                                            "chatml",  "phi3",   "gemma", NULL};
const char *const mt_tc_packings[] = {"auto", "documents", "rows", NULL};
const char *const mt_tc_dtypes[] = {"bf16", "fp32", NULL};
const char *const mt_tc_devices[] = {"auto", "cpu", "cuda", NULL};
const char *const mt_tc_grad_dtypes[] = {"auto", "fp32", "bf16", NULL};
const char *const mt_tc_saved_dtypes[] = {"fp32", "bf16", NULL};
const char *const mt_tc_objectives[] = {"sft", "dpo", "simpo", "orpo", NULL};
const char *const mt_tc_loss_types[] = {"sigmoid", "ipo", "hinge", NULL};
static const char *const schedules[] = {"cosine", "linear", "constant", NULL};
static const char *const nonfinite_actions[] = {"stop", "skip", NULL};

const mt_opt mt_tc_options[] = {
    {"model", MT_OPT_STRING, OFF(model), "", NULL, ANY, NULL, "DIR", "Model and data",
     "Hugging Face model directory (config.json + safetensors), or a Hub name (org/name) in "
     "the local Hugging Face cache; empty: the built-in tiny model"},
    {"tokenizer", MT_OPT_STRING, OFF(tokenizer), "", NULL, ANY, NULL, "PATH", NULL,
     "tokenizer.json; empty: <model>/tokenizer.json, or bytes for the tiny model (which "
     "takes the vocabulary of any other, and then needs data)"},
    {"data", MT_OPT_STRING, OFF(data), "", NULL, ANY, NULL, "PATH", NULL,
     "training data: .jsonl[.gz|.zst] or .mtok, a directory of them, or a weighted list "
     "[{path: a, weight: 0.7}, ...]; empty: built-in English text"},
    {"data_format", MT_OPT_ENUM, OFF(data_format), "auto", NULL, ANY, mt_tc_data_formats, NULL,
     NULL, "JSONL layout: text, prompt/completion (texts or lists of messages), chat messages, "
     "alpaca (instruction/input/output), sharegpt (conversations of from/value), or tokens; "
     "auto: detect"},
    {"text_field", MT_OPT_STRING, OFF(text_field), "text", NULL, ANY, NULL, "FIELD", NULL,
     "the key of the text format's text (a JSONL line {\"FIELD\": \"...\"})"},
    {"chat_template", MT_OPT_ENUM, OFF(chat_template), "auto", NULL, ANY, mt_tc_chat_templates,
     NULL, NULL, "chat template of chat data: auto, the model's own (its tokenizer_config.json), "
     "else the built-in its tokenizer suggests; or a built-in by name"},
    {"packing", MT_OPT_ENUM, OFF(packing), "auto", NULL, ANY, mt_tc_packings, NULL, NULL,
     "documents packed in a row: separate sequences (positions restart, attention stays in "
     "each document) or one sequence (rows); auto: documents for completion and chat data"},
    {"skip_bad_lines", MT_OPT_BOOL, OFF(skip_bad_lines), "false", NULL, ANY, NULL, NULL, NULL,
     "skip malformed data lines (counted) instead of stopping"},
    {"router_aux_loss", MT_OPT_BOOL, OFF(router_aux_loss), "false", NULL, ANY, NULL, NULL, NULL,
     "mixture-of-experts models: add router_aux_loss_coef x the load-balancing loss (also on "
     "when config.json sets output_router_logits)"},

    {"objective", MT_OPT_ENUM, OFF(objective), "sft", NULL, ANY, mt_tc_objectives, NULL,
     "Objective", "sft: cross-entropy on the data's loss tokens; dpo, simpo, orpo: preference "
     "optimization on pairs {prompt, chosen, rejected} (docs/preference.md)"},
    {"loss_type", MT_OPT_ENUM, OFF(loss_type), "sigmoid", NULL, ANY, mt_tc_loss_types, NULL,
     NULL, "dpo's loss, as TRL's: sigmoid (DPO), ipo, hinge"},
    {"beta", MT_OPT_FLOAT, OFF(beta), "0.1", NULL, {0, NAN, true, false}, NULL, NULL, NULL,
     "dpo, simpo: the temperature beta (dpo: of the log-ratios to the reference model)"},
    {"label_smoothing", MT_OPT_FLOAT, OFF(label_smoothing), "0", NULL, {0, 0.5, false, true},
     NULL, NULL, NULL, "dpo sigmoid, simpo: the probability that a pair's labels are flipped "
     "(conservative DPO)"},
    {"gamma", MT_OPT_FLOAT, OFF(gamma), "0.5", NULL, ANY, NULL, NULL, NULL,
     "simpo: the target reward margin gamma"},
    {"lambda", MT_OPT_FLOAT, OFF(lambda), "0.1", NULL, NONNEG, NULL, NULL, NULL,
     "orpo: the weight lambda of the odds-ratio term beside the chosen answers' NLL"},
    {"ref_model", MT_OPT_STRING, OFF(ref_model), "", NULL, ANY, NULL, "DIR", NULL,
     "dpo: the reference model (a Hugging Face directory of the same architecture); empty: "
     "the starting weights. Its log-probabilities are computed once, before training"},
    {"skip_bad_pairs", MT_OPT_BOOL, OFF(skip_bad_pairs), "false", NULL, ANY, NULL, NULL, NULL,
     "leave out (and count) bad preference pairs: a field missing or empty, a pair longer "
     "than seq_len"},

    {"seq_len", MT_OPT_INT, OFF(seq_len), "2048", "64", AT_LEAST(1), NULL, NULL, "Batch",
     "tokens per row (T)"},
    {"batch_size", MT_OPT_INT, OFF(batch_size), "8", NULL, AT_LEAST(1), NULL, NULL, NULL,
     "rows per micro-batch (B)"},
    {"micro_batches", MT_OPT_INT, OFF(micro_batches), "4", "2", AT_LEAST(1), NULL, NULL, NULL,
     "micro-batches per optimizer step (gradient accumulation)"},
    {"steps", MT_OPT_INT, OFF(steps), "0", "800", AT_LEAST(0), NULL, NULL, NULL,
     "optimizer steps; 0: as many as `epochs` passes over the data take"},
    {"epochs", MT_OPT_INT, OFF(epochs), "1", NULL, AT_LEAST(1), NULL, NULL, NULL,
     "passes over the data when steps is 0"},

    {"lr", MT_OPT_FLOAT, OFF(lr), "1e-5", "1e-2", NONNEG, NULL, NULL, "Optimizer (AdamW)",
     "peak learning rate"},
    {"min_lr_ratio", MT_OPT_FLOAT, OFF(min_lr_ratio), "0", NULL, {0, 1, false, false}, NULL,
     NULL, NULL, "cosine floor as a fraction of lr"},
    {"schedule", MT_OPT_ENUM, OFF(schedule), "cosine", NULL, ANY, schedules, NULL, NULL,
     "learning-rate schedule after warmup"},
    {"warmup_steps", MT_OPT_INT, OFF(warmup_steps), "100", "30", AT_LEAST(0), NULL, NULL, NULL,
     "linear warmup steps"},
    {"weight_decay", MT_OPT_FLOAT, OFF(weight_decay), "0", "0.1", NONNEG, NULL, NULL, NULL,
     "decoupled weight decay on matrices"},
    {"beta1", MT_OPT_FLOAT, OFF(beta1), "0.9", NULL, {0, 1, false, true}, NULL, NULL, NULL,
     "Adam first-moment decay"},
    {"beta2", MT_OPT_FLOAT, OFF(beta2), "0.95", NULL, {0, 1, false, true}, NULL, NULL, NULL,
     "Adam second-moment decay"},
    {"eps", MT_OPT_FLOAT, OFF(eps), "1e-8", NULL, {0, NAN, true, false}, NULL, NULL, NULL,
     "Adam epsilon"},
    {"max_grad_norm", MT_OPT_FLOAT, OFF(max_grad_norm), "1.0", NULL, NONNEG, NULL, NULL, NULL,
     "clip the global gradient norm to this; 0: off"},
    {"seed", MT_OPT_INT, OFF(seed), "1234", "1", AT_LEAST(0), NULL, NULL, NULL,
     "seed of initialisation and data order"},
    {"on_nonfinite", MT_OPT_ENUM, OFF(on_nonfinite), "stop", NULL, ANY, nonfinite_actions, NULL,
     NULL, "a non-finite loss or gradient: stop, or skip the update (CPU; counted)"},
    {"max_skips", MT_OPT_INT, OFF(max_skips), "10", NULL, AT_LEAST(1), NULL, NULL, NULL,
     "with on_nonfinite skip: stop after N skipped steps in a row"},

    {"out", MT_OPT_STRING, OFF(out), "runs/megatrain", "runs/tiny", ANY, NULL, "DIR",
     "Output", "run directory: final HF model, checkpoints, metrics.jsonl, config.yaml"},
    {"save_every", MT_OPT_INT, OFF(save_every), "500", NULL, AT_LEAST(0), NULL, NULL, NULL,
     "steps between resume checkpoints; 0: only at the end or on a signal"},
    {"keep_last", MT_OPT_INT, OFF(keep_last), "2", NULL, AT_LEAST(1), NULL, NULL, NULL,
     "resume checkpoints kept"},
    {"save_dtype", MT_OPT_ENUM, OFF(save_dtype), "bf16", NULL, ANY, mt_tc_dtypes, NULL, NULL,
     "dtype of the final HF model"},
    {"max_shard_size", MT_OPT_FLOAT, OFF(max_shard_size), "5", NULL, {0, NAN, true, false}, NULL,
     "GB", NULL, "largest safetensors file of the final HF model, as save_pretrained's "
     "max_shard_size (more files and an index beyond it)"},
    {"resume", MT_OPT_STRING, OFF(resume), "", NULL, ANY, NULL, "PATH|auto", NULL,
     "resume from a checkpoint directory, or auto: the latest one in out"},
    {"overwrite", MT_OPT_BOOL, OFF(overwrite), "false", NULL, ANY, NULL, NULL, NULL,
     "start afresh in an out that holds a run, deleting its checkpoints, metrics, TensorBoard "
     "files and model (such an out is refused otherwise, unless resume is set)"},

    {"device", MT_OPT_ENUM, OFF(device), "auto", NULL, ANY, mt_tc_devices, NULL, "Device",
     "where to train; auto: cuda when present, else cpu"},
    {"gpus", MT_OPT_INT, OFF(gpus), "0", NULL, AT_LEAST(0), NULL, "N", NULL,
     "train on N GPUs of this machine, one process (rank) each: every step's micro-batches "
     "are shared among them (micro_batches must be a multiple of N), the same training as on "
     "one GPU; 0: one GPU. Under torchrun, mpirun or srun: the launcher's ranks "
     "(docs/distributed.md)"},
    {"precision", MT_OPT_ENUM, OFF(precision), "bf16", NULL, ANY, mt_tc_dtypes, NULL, NULL,
     "matrix products in bf16 (fp32 accumulation) or all fp32"},
    {"host_saved_inputs", MT_OPT_BOOL, OFF(host_saved_inputs), "false", NULL, ANY, NULL, NULL,
     NULL, "every layer's saved input (what its backward recomputes it from) in host RAM, no "
     "planner (longer sequences, more PCIe traffic)"},
    {"gpu_mem", MT_OPT_FLOAT, OFF(gpu_mem), "0", NULL, NONNEG, NULL, "GB", NULL,
     "GPU memory the run may take, CUDA context included; 0: what is free"},
    {"host_mem", MT_OPT_FLOAT, OFF(host_mem), "0", NULL, NONNEG, NULL, "GB", NULL,
     "host RAM the run may take; 0: MemTotal less max(4 GB, 4%)"},
    {"host_grad_dtype", MT_OPT_ENUM, OFF(host_grad_dtype), "auto", NULL, ANY, mt_tc_grad_dtypes,
     NULL, NULL, "gradients waiting in host RAM: fp32, or bf16 (14 bytes/param); auto: fp32 "
     "when it fits"},
    {"saved_input_dtype", MT_OPT_ENUM, OFF(saved_input_dtype), "fp32", NULL, ANY,
     mt_tc_saved_dtypes, NULL, NULL, MT_SAVED_INPUT_DTYPE_HELP},
    {"calibration", MT_OPT_STRING, OFF(calibration), "", NULL, ANY, NULL, "PATH", NULL,
     "machine rates for the planner (megatrain calibrate); empty: a short probe"},
    {"nvme_dir", MT_OPT_STRING, OFF(nvme_dir), "", NULL, ANY, NULL, "DIR[,DIR...]", NULL,
     "directories (fast disks, one per drive) for the Adam m and v of the layers the host "
     "budget cannot hold, striped over them; the files are working state, gone when the run "
     "ends (resume checkpoints stay complete and separate)"},
    {"disk_mem", MT_OPT_FLOAT, OFF(disk_mem), "0", NULL, NONNEG, NULL, "GB", NULL,
     "with nvme_dir: disk the optimizer state may take; 0: the directories' free space"},
    {"disk_layers", MT_OPT_INT, OFF(disk_layers), "-1", NULL, AT_LEAST(-1), NULL, "N", NULL,
     "with nvme_dir: the Adam m and v of the last N layers (the head first) live on disk, read "
     "and written around their update (8 bytes per parameter less RAM, 16 of disk traffic a "
     "step); -1: the fewest the host budget needs (none when it holds them all)"},
    {"disk_saved_layers", MT_OPT_INT, OFF(disk_saved_layers), "-1", NULL, AT_LEAST(-1), NULL,
     "N", NULL, MT_DISK_SAVED_LAYERS_HELP},
    {"disk_weight_layers", MT_OPT_INT, OFF(disk_weight_layers), "-1", NULL, AT_LEAST(-1), NULL,
     "N", NULL, MT_DISK_WEIGHT_LAYERS_HELP},

    {"eval_data", MT_OPT_STRING, OFF(eval_data), "", NULL, ANY, NULL, "PATH", "Evaluation",
     "held-out data (a file or a directory) whose loss is logged; empty: none"},
    {"eval_every", MT_OPT_INT, OFF(eval_every), "0", NULL, AT_LEAST(0), NULL, NULL, NULL,
     "evaluate every N steps and after the last; 0: after the last step only"},
    {"eval_batches", MT_OPT_INT, OFF(eval_batches), "0", NULL, AT_LEAST(0), NULL, NULL, NULL,
     "batches of micro_batches x batch_size rows per evaluation; 0: all of eval_data"},

    {"log_every", MT_OPT_INT, OFF(log_every), "10", NULL, AT_LEAST(1), NULL, NULL, "Logging",
     "a progress line every N steps (and the last); in a terminal a progress bar is "
     "redrawn at every step between them. metrics.jsonl and TensorBoard get every step"},
    {"sample_tokens", MT_OPT_INT, OFF(sample_tokens), "0", "120", AT_LEAST(0), NULL, NULL, NULL,
     "greedy sample of N tokens printed after training (at most the model's positions); 0: "
     "none"},
    {"tensorboard", MT_OPT_BOOL, OFF(tensorboard), "true", NULL, ANY, NULL, NULL, NULL,
     "also write the metrics as TensorBoard event files in out/tensorboard"},
};
const size_t mt_tc_n_options = sizeof mt_tc_options / sizeof *mt_tc_options;
_Static_assert(sizeof mt_tc_options / sizeof *mt_tc_options <= MT_TC_MAX_OPTIONS,
               "raise MT_TC_MAX_OPTIONS");
/* Enums are set through an int. */
_Static_assert(sizeof(mt_lr_kind) == sizeof(int) && sizeof(mt_tc_data_format) == sizeof(int),
               "enum fields must be int-sized");

/* Keys of other trainers (HF Trainer, axolotl, torchtune): suggested, not read. */
static const mt_opt_alias aliases[] = {
    {"learning_rate", "lr", MT_ALIAS_SUGGEST}, {"max_steps", "steps", MT_ALIAS_SUGGEST},
    {"num_epochs", "epochs", MT_ALIAS_SUGGEST}, {"num_train_epochs", "epochs", MT_ALIAS_SUGGEST},
    {"gradient_accumulation_steps", "micro_batches", MT_ALIAS_SUGGEST},
    {"micro_batch_size", "batch_size", MT_ALIAS_SUGGEST},
    {"per_device_train_batch_size", "batch_size", MT_ALIAS_SUGGEST},
    {"sequence_len", "seq_len", MT_ALIAS_SUGGEST}, {"max_seq_length", "seq_len", MT_ALIAS_SUGGEST},
    {"max_seq_len", "seq_len", MT_ALIAS_SUGGEST}, {"output_dir", "out", MT_ALIAS_SUGGEST},
    {"warmup", "warmup_steps", MT_ALIAS_SUGGEST}, {"lr_scheduler", "schedule", MT_ALIAS_SUGGEST},
    {"lr_scheduler_type", "schedule", MT_ALIAS_SUGGEST},
    {"model_name_or_path", "model", MT_ALIAS_SUGGEST}, {"base_model", "model", MT_ALIAS_SUGGEST},
    {"dataset", "data", MT_ALIAS_SUGGEST}, {"datasets", "data", MT_ALIAS_SUGGEST},
    {"adam_beta1", "beta1", MT_ALIAS_SUGGEST}, {"adam_beta2", "beta2", MT_ALIAS_SUGGEST},
    {"adam_epsilon", "eps", MT_ALIAS_SUGGEST}, {"save_steps", "save_every", MT_ALIAS_SUGGEST},
    {"save_total_limit", "keep_last", MT_ALIAS_SUGGEST},
    {"logging_steps", "log_every", MT_ALIAS_SUGGEST},
    {"resume_from_checkpoint", "resume", MT_ALIAS_SUGGEST},
    {"gradient_clipping", "max_grad_norm", MT_ALIAS_SUGGEST},
    {"bf16", "precision", MT_ALIAS_SUGGEST}, {"dtype", "precision", MT_ALIAS_SUGGEST},
    {"host_checkpoints", "host_saved_inputs", MT_ALIAS_DEPRECATED},
};

const mt_opt_table mt_tc_table = {
    .command = "train",
    .usage = "usage: megatrain train [--config FILE.yaml] [options]\n"
             "Trains (fine-tunes) a Llama-family model; with no model, the built-in tiny model\n"
             "on built-in English text. Options come from defaults, then the YAML config file\n"
             "(flat keys: `seq_len: 2048`, '_' or '-'), then these flags, which win.\n\n"
             "  --config FILE                  read options from a YAML file first\n",
    MT_OPT_ROWS(mt_tc_options),
    MT_OPT_ALIASES(aliases),
    MT_OPT_STRUCT(mt_train_config),
    .alt_def_name = "tiny model",
};

void mt_train_config_defaults(mt_train_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    mt_opt_defaults(&mt_tc_table, cfg);
}

int mt_train_config_set(mt_train_config *cfg, const char *key, const char *value,
                        const char *where, mt_error *err) {
    char label[MT_TC_STR + 64];
    snprintf(label, sizeof label, "%s%s%s", where ? where : "", where ? ": " : "", key);
    const mt_opt *o = mt_opt_lookup(&mt_tc_table, key);
    if (o) return mt_opt_set(&mt_tc_table, cfg, o, value, label, err);
    const char *s = mt_opt_suggest(&mt_tc_table, key);
    if (s) return mt_errorf(err, "%s: unknown key (did you mean '%s'?)", label, s);
    return mt_errorf(err, "%s: unknown key (run 'megatrain train --help' for the list)", label);
}

void mt_train_config_resolve(mt_train_config *cfg) {
    mt_data_spec_canonicalize(cfg->data, sizeof cfg->data);
    char dir[MT_TC_STR];
    mt_error ignored;  // a Hub name not in the cache: the load says so
    if (cfg->model[0] && mt_hub_model_dir(cfg->model, dir, sizeof dir, &ignored) == 0)
        strcpy(cfg->model, dir);
    if (!cfg->model[0]) {
        for (size_t i = 0; i < mt_tc_n_options; i++) {
            const mt_opt *o = &mt_tc_options[i];
            if (cfg->given[i] || !o->alt_def) continue;
            mt_error err;
            if (mt_opt_set(&mt_tc_table, cfg, o, o->alt_def, o->name, &err))
                MT_DIE("bad tiny default in the option table: %s", err.msg);
            cfg->given[i] = false;
        }
    } else if (!cfg->tokenizer[0]) {
        char path[MT_TC_STR + 32];
        snprintf(path, sizeof path, "%s/tokenizer.json", cfg->model);
        if (strlen(path) < MT_TC_STR) strcpy(cfg->tokenizer, path);
    }
}

/* Every option's value is one its type and range allow. */
static int validate_values(const mt_train_config *cfg, mt_error *err) {
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        const mt_opt *o = &mt_tc_options[i];
        const void *p = (const char *)cfg + o->offset;
        char text[64];
        if (o->type == MT_OPT_INT || o->type == MT_OPT_FLOAT) {
            mt_opt_format(cfg, o, text, sizeof text);
            double v = o->type == MT_OPT_INT ? (double)*(const int64_t *)p : *(const double *)p;
            if (!isfinite(v)) return mt_errorf(err, "%s: must be a finite number", o->name);
            if (mt_opt_check_range(o, v, text, o->name, err)) return -1;
        } else if (o->type == MT_OPT_ENUM) {
            int v = *(const int *)p, n = 0;
            while (o->choices[n]) n++;
            if (v < 0 || v >= n) return mt_errorf(err, "%s: enum value %d out of range", o->name, v);
        } else if (o->type == MT_OPT_STRING && !memchr(p, 0, MT_TC_STR)) {
            return mt_errorf(err, "%s: string not terminated", o->name);
        }
    }
    return 0;
}

/* A preference objective reads pairs from a JSONL file, one of its own. */
static int validate_objective(const mt_train_config *cfg, mt_error *err) {
    const char *obj = mt_tc_objectives[cfg->objective];
    if (cfg->objective == MT_TC_OBJECTIVE_SFT) return 0;
    if (cfg->data_format != MT_TC_DATA_AUTO)
        return mt_errorf(err, "objective %s: data_format %s: preference data has a layout of "
                         "its own ({prompt, chosen, rejected}); drop data_format", obj,
                         mt_tc_data_format_name(cfg->data_format));
    if (cfg->packing == MT_TC_PACKING_ROWS)
        return mt_errorf(err, "objective %s: packing rows: each answer of a pair is a sequence "
                         "of its own; drop packing", obj);
    if (cfg->ref_model[0] && cfg->objective != MT_TC_OBJECTIVE_DPO)
        return mt_errorf(err, "ref_model: objective %s has no reference model (only dpo has)",
                         obj);
    return 0;
}

int mt_train_config_validate(const mt_train_config *cfg, mt_error *err) {
    if (validate_values(cfg, err)) return -1;
    if (!cfg->data[0] && cfg->data_format != MT_TC_DATA_AUTO && cfg->data_format != MT_TC_DATA_TEXT)
        return mt_errorf(err, "data_format: '%s' needs a data file (set data: FILE)",
                         mt_tc_data_format_name(cfg->data_format));
    if (!cfg->data[0] && cfg->packing == MT_TC_PACKING_DOCUMENTS)
        return mt_errorf(err, "packing: 'documents' needs a data file (the built-in text has no "
                         "documents); set data: FILE or packing: rows");
    if (!cfg->out[0])
        return mt_errorf(err, "out: the run directory must not be empty (e.g. out: runs/my-run)");
    if (cfg->overwrite && cfg->resume[0])
        return mt_errorf(err, "overwrite and resume: resume continues the run in out, "
                         "overwrite deletes it; keep one (--no-overwrite drops an overwrite: "
                         "true of a config file)");
    if (mt_data_spec_check(cfg->data, "data", true, err) ||
        mt_data_spec_check(cfg->eval_data, "eval_data", false, err))
        return -1;
    if (!cfg->eval_data[0] && (cfg->eval_every || cfg->eval_batches))
        return mt_errorf(err, "%s: set eval_data (held-out data) too, or drop it",
                         cfg->eval_every ? "eval_every" : "eval_batches");
    return validate_objective(cfg, err);
}

/* Enum names ------------------------------------------------------------ */

const char *mt_tc_data_format_name(mt_tc_data_format v) { return mt_tc_data_formats[v]; }
const char *mt_tc_chat_template_name(mt_tc_chat_template v) { return mt_tc_chat_templates[v]; }
const char *mt_tc_packing_name(mt_tc_packing v) { return mt_tc_packings[v]; }
const char *mt_device_kind_name(mt_device_kind v) { return mt_tc_devices[v]; }
const char *mt_tc_precision_name(mt_tc_precision v) { return mt_tc_dtypes[v]; }
const char *mt_save_dtype_name(mt_save_dtype v) { return mt_tc_dtypes[v]; }
