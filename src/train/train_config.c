/* The option table of `megatrain train` and what is driven by it: defaults,
 * setting a value from text (type and range checks), the tiny-model
 * defaults and validation. The files built on it, each reading this one and
 * not the other way round: YAML and JSON in train_config_io.c, the flags and
 * --help in train_args.c. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "train/train_config_internal.h"
#include "data/data_spec.h"
#include "util/args.h"

#define OFF(field) offsetof(mt_train_config, field)
/* Integers must survive a round trip through JSON numbers (doubles). */
#define INT_MAX_EXACT 9007199254740992.0
#define AT_LEAST(x) {x, INT_MAX_EXACT, false, false}
#define NONNEG {0, NAN, false, false}
#define ANY {NAN, NAN, false, false}

static const char *const data_formats[] = {"auto", "text", "completion", "chat", "tokens", NULL};
static const char *const chat_templates[] = {"auto", "llama3", "qwen", "llama2", "mistral", NULL};
static const char *const packings[] = {"auto", "documents", "rows", NULL};
static const char *const schedules[] = {"cosine", "linear", "constant", NULL};
static const char *const dtypes[] = {"bf16", "fp32", NULL};
static const char *const devices[] = {"auto", "cpu", "cuda", NULL};
static const char *const grad_dtypes[] = {"auto", "fp32", "bf16", NULL};
static const char *const nonfinite_actions[] = {"stop", "skip", NULL};

const mt_tc_option mt_tc_options[] = {
    {"model", MT_TC_STRING, OFF(model), "", NULL, ANY, NULL, "DIR", "Model and data",
     "Hugging Face model directory (config.json + safetensors); empty: the built-in tiny model"},
    {"tokenizer", MT_TC_STRING, OFF(tokenizer), "", NULL, ANY, NULL, "PATH", NULL,
     "tokenizer.json; empty: <model>/tokenizer.json, or bytes for the tiny model (which "
     "takes the vocabulary of any other, and then needs data)"},
    {"data", MT_TC_STRING, OFF(data), "", NULL, ANY, NULL, "PATH", NULL,
     "training data: .jsonl[.gz|.zst] or .mtok, a directory of them, or a weighted list "
     "[{path: a, weight: 0.7}, ...]; empty: built-in English text"},
    {"data_format", MT_TC_ENUM, OFF(data_format), "auto", NULL, ANY, data_formats, NULL, NULL,
     "JSONL layout: text, prompt/completion, chat messages, or tokens; auto: detect"},
    {"chat_template", MT_TC_ENUM, OFF(chat_template), "auto", NULL, ANY, chat_templates, NULL,
     NULL, "chat format of the model; auto: from the model's type"},
    {"packing", MT_TC_ENUM, OFF(packing), "auto", NULL, ANY, packings, NULL, NULL,
     "documents packed in a row: separate sequences (positions restart, attention stays in "
     "each document) or one sequence (rows); auto: documents for completion and chat data"},
    {"skip_bad_lines", MT_TC_BOOL, OFF(skip_bad_lines), "false", NULL, ANY, NULL, NULL, NULL,
     "skip malformed data lines (counted) instead of stopping"},
    {"router_aux_loss", MT_TC_BOOL, OFF(router_aux_loss), "false", NULL, ANY, NULL, NULL, NULL,
     "mixture-of-experts models: add router_aux_loss_coef x the load-balancing loss (also on "
     "when config.json sets output_router_logits)"},

    {"seq_len", MT_TC_INT, OFF(seq_len), "2048", "64", AT_LEAST(1), NULL, NULL, "Batch",
     "tokens per row (T)"},
    {"batch_size", MT_TC_INT, OFF(batch_size), "8", NULL, AT_LEAST(1), NULL, NULL, NULL,
     "rows per micro-batch (B)"},
    {"micro_batches", MT_TC_INT, OFF(micro_batches), "4", "2", AT_LEAST(1), NULL, NULL, NULL,
     "micro-batches per optimizer step (gradient accumulation)"},
    {"steps", MT_TC_INT, OFF(steps), "0", "800", AT_LEAST(0), NULL, NULL, NULL,
     "optimizer steps; 0: as many as `epochs` passes over the data take"},
    {"epochs", MT_TC_INT, OFF(epochs), "1", NULL, AT_LEAST(1), NULL, NULL, NULL,
     "passes over the data when steps is 0"},

    {"lr", MT_TC_FLOAT, OFF(lr), "1e-5", "1e-2", NONNEG, NULL, NULL, "Optimizer (AdamW)",
     "peak learning rate"},
    {"min_lr_ratio", MT_TC_FLOAT, OFF(min_lr_ratio), "0", NULL, {0, 1, false, false}, NULL,
     NULL, NULL, "cosine floor as a fraction of lr"},
    {"schedule", MT_TC_ENUM, OFF(schedule), "cosine", NULL, ANY, schedules, NULL, NULL,
     "learning-rate schedule after warmup"},
    {"warmup_steps", MT_TC_INT, OFF(warmup_steps), "100", "30", AT_LEAST(0), NULL, NULL, NULL,
     "linear warmup steps"},
    {"weight_decay", MT_TC_FLOAT, OFF(weight_decay), "0", "0.1", NONNEG, NULL, NULL, NULL,
     "decoupled weight decay on matrices"},
    {"beta1", MT_TC_FLOAT, OFF(beta1), "0.9", NULL, {0, 1, false, true}, NULL, NULL, NULL,
     "Adam first-moment decay"},
    {"beta2", MT_TC_FLOAT, OFF(beta2), "0.95", NULL, {0, 1, false, true}, NULL, NULL, NULL,
     "Adam second-moment decay"},
    {"eps", MT_TC_FLOAT, OFF(eps), "1e-8", NULL, {0, NAN, true, false}, NULL, NULL, NULL,
     "Adam epsilon"},
    {"max_grad_norm", MT_TC_FLOAT, OFF(max_grad_norm), "1.0", NULL, NONNEG, NULL, NULL, NULL,
     "clip the global gradient norm to this; 0: off"},
    {"seed", MT_TC_INT, OFF(seed), "1234", "1", AT_LEAST(0), NULL, NULL, NULL,
     "seed of initialisation and data order"},
    {"on_nonfinite", MT_TC_ENUM, OFF(on_nonfinite), "stop", NULL, ANY, nonfinite_actions, NULL,
     NULL, "a non-finite loss or gradient: stop, or skip the update (CPU; counted)"},
    {"max_skips", MT_TC_INT, OFF(max_skips), "10", NULL, AT_LEAST(1), NULL, NULL, NULL,
     "with on_nonfinite skip: stop after N skipped steps in a row"},

    {"out", MT_TC_STRING, OFF(out), "runs/megatrain", "runs/tiny", ANY, NULL, "DIR",
     "Output", "run directory: final HF model, checkpoints, metrics.jsonl, config.yaml"},
    {"save_every", MT_TC_INT, OFF(save_every), "500", NULL, AT_LEAST(0), NULL, NULL, NULL,
     "steps between resume checkpoints; 0: only at the end or on a signal"},
    {"keep_last", MT_TC_INT, OFF(keep_last), "2", NULL, AT_LEAST(1), NULL, NULL, NULL,
     "resume checkpoints kept"},
    {"save_dtype", MT_TC_ENUM, OFF(save_dtype), "bf16", NULL, ANY, dtypes, NULL, NULL,
     "dtype of the final HF model"},
    {"max_shard_size", MT_TC_FLOAT, OFF(max_shard_size), "5", NULL, {0, NAN, true, false}, NULL,
     "GB", NULL, "largest safetensors file of the final HF model, as save_pretrained's "
     "max_shard_size (more files and an index beyond it)"},
    {"resume", MT_TC_STRING, OFF(resume), "", NULL, ANY, NULL, "PATH|auto", NULL,
     "resume from a checkpoint directory, or auto: the latest one in out"},
    {"overwrite", MT_TC_BOOL, OFF(overwrite), "false", NULL, ANY, NULL, NULL, NULL,
     "start afresh in an out that holds a run, deleting its checkpoints, metrics, TensorBoard "
     "files and model (such an out is refused otherwise, unless resume is set)"},

    {"device", MT_TC_ENUM, OFF(device), "auto", NULL, ANY, devices, NULL, "Device",
     "where to train; auto: cuda when present, else cpu"},
    {"gpus", MT_TC_INT, OFF(gpus), "0", NULL, AT_LEAST(0), NULL, "N", NULL,
     "train on N GPUs of this machine, one process (rank) each: every step's micro-batches "
     "are shared among them (micro_batches must be a multiple of N), the same training as on "
     "one GPU; 0: one GPU. Under torchrun, mpirun or srun: the launcher's ranks "
     "(docs/distributed.md)"},
    {"precision", MT_TC_ENUM, OFF(precision), "bf16", NULL, ANY, dtypes, NULL, NULL,
     "matrix products in bf16 (fp32 accumulation) or all fp32"},
    {"host_checkpoints", MT_TC_BOOL, OFF(host_checkpoints), "false", NULL, ANY, NULL, NULL,
     NULL, "every layer checkpoint in host RAM, no planner (longer sequences, more PCIe "
     "traffic)"},
    {"gpu_mem", MT_TC_FLOAT, OFF(gpu_mem), "0", NULL, NONNEG, NULL, "GB", NULL,
     "GPU memory the run may take, CUDA context included; 0: what is free"},
    {"host_mem", MT_TC_FLOAT, OFF(host_mem), "0", NULL, NONNEG, NULL, "GB", NULL,
     "host RAM the run may take; 0: MemTotal less max(4 GB, 4%)"},
    {"host_grad_dtype", MT_TC_ENUM, OFF(host_grad_dtype), "auto", NULL, ANY, grad_dtypes, NULL,
     NULL, "gradients waiting in host RAM: fp32, or bf16 (14 bytes/param); auto: fp32 when it "
     "fits"},
    {"calibration", MT_TC_STRING, OFF(calibration), "", NULL, ANY, NULL, "PATH", NULL,
     "machine rates for the planner (megatrain calibrate); empty: a short probe"},

    {"eval_data", MT_TC_STRING, OFF(eval_data), "", NULL, ANY, NULL, "PATH", "Evaluation",
     "held-out data (a file or a directory) whose loss is logged; empty: none"},
    {"eval_every", MT_TC_INT, OFF(eval_every), "0", NULL, AT_LEAST(0), NULL, NULL, NULL,
     "evaluate every N steps and after the last; 0: after the last step only"},
    {"eval_batches", MT_TC_INT, OFF(eval_batches), "0", NULL, AT_LEAST(0), NULL, NULL, NULL,
     "batches of micro_batches x batch_size rows per evaluation; 0: all of eval_data"},

    {"log_every", MT_TC_INT, OFF(log_every), "10", NULL, AT_LEAST(1), NULL, NULL, "Logging",
     "progress line and metrics.jsonl row every N steps"},
    {"sample_tokens", MT_TC_INT, OFF(sample_tokens), "0", "120", AT_LEAST(0), NULL, NULL, NULL,
     "greedy sample of N tokens printed after training (at most the model's positions); 0: "
     "none"},
    {"tensorboard", MT_TC_BOOL, OFF(tensorboard), "true", NULL, ANY, NULL, NULL, NULL,
     "also write the metrics as TensorBoard event files in out/tensorboard"},
};
const size_t mt_tc_n_options = sizeof mt_tc_options / sizeof *mt_tc_options;
_Static_assert(sizeof mt_tc_options / sizeof *mt_tc_options <= MT_TC_MAX_OPTIONS,
               "raise MT_TC_MAX_OPTIONS");
/* Enums are set through an int. */
_Static_assert(sizeof(mt_lr_kind) == sizeof(int) && sizeof(mt_tc_data_format) == sizeof(int),
               "enum fields must be int-sized");

/* Suggestions for keys of other trainers (HF Trainer, axolotl, torchtune). */
static const char *const aliases[][2] = {
    {"learning_rate", "lr"}, {"max_steps", "steps"}, {"num_epochs", "epochs"},
    {"num_train_epochs", "epochs"}, {"gradient_accumulation_steps", "micro_batches"},
    {"micro_batch_size", "batch_size"}, {"per_device_train_batch_size", "batch_size"},
    {"sequence_len", "seq_len"}, {"max_seq_length", "seq_len"}, {"max_seq_len", "seq_len"},
    {"output_dir", "out"}, {"warmup", "warmup_steps"}, {"lr_scheduler", "schedule"},
    {"lr_scheduler_type", "schedule"}, {"model_name_or_path", "model"}, {"base_model", "model"},
    {"dataset", "data"}, {"datasets", "data"}, {"adam_beta1", "beta1"},
    {"adam_beta2", "beta2"}, {"adam_epsilon", "eps"}, {"save_steps", "save_every"},
    {"save_total_limit", "keep_last"}, {"logging_steps", "log_every"},
    {"resume_from_checkpoint", "resume"}, {"gradient_clipping", "max_grad_norm"},
    {"bf16", "precision"}, {"dtype", "precision"},
};

/* key with '-' read as '_', into buf; false when too long. */
static bool normalize_key(const char *key, char *buf, size_t n) {
    size_t i = 0;
    for (; key[i]; i++) {
        if (i + 1 >= n) return false;
        buf[i] = key[i] == '-' ? '_' : (char)tolower((unsigned char)key[i]);
    }
    buf[i] = 0;
    return true;
}

const mt_tc_option *mt_tc_find(const char *key) {
    char k[64];
    if (!normalize_key(key, k, sizeof k)) return NULL;
    for (size_t i = 0; i < mt_tc_n_options; i++)
        if (!strcmp(k, mt_tc_options[i].name)) return &mt_tc_options[i];
    return NULL;
}

static size_t edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b), row[64];
    if (lb >= 64) return (size_t)-1;
    for (size_t j = 0; j <= lb; j++) row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j], best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = up;
            row[j] = best;
        }
    }
    return row[lb];
}

const char *mt_tc_suggest(const char *key) {
    char k[64];
    if (!normalize_key(key, k, sizeof k)) return NULL;
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        if (!strcmp(k, aliases[i][0])) return aliases[i][1];
    const char *best = NULL;
    size_t best_d = (size_t)-1;
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        size_t d = edit_distance(k, mt_tc_options[i].name);
        if (d < best_d) best_d = d, best = mt_tc_options[i].name;
    }
    /* Typos: a couple of edits, or a third of a long name. */
    size_t limit = strlen(k) / 3 > 2 ? strlen(k) / 3 : 2;
    return best_d <= limit ? best : NULL;
}

static void *field(mt_train_config *cfg, const mt_tc_option *o) { return (char *)cfg + o->offset; }
static const void *cfield(const mt_train_config *cfg, const mt_tc_option *o) {
    return (const char *)cfg + o->offset;
}

static void list_choices(const mt_tc_option *o, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; o->choices[i] && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", o->choices[i]);
}

static int check_range(const mt_tc_option *o, double v, const char *text, const char *label,
                       mt_error *err) {
    const mt_tc_range *r = &o->range;
    bool low = !isnan(r->lo) && (r->lo_open ? v <= r->lo : v < r->lo);
    bool high = !isnan(r->hi) && (r->hi_open ? v >= r->hi : v > r->hi);
    if (!low && !high) return 0;
    if (!isnan(r->lo) && !isnan(r->hi) && r->hi != INT_MAX_EXACT)
        return mt_errorf(err, "%s: must be %s %g and %s %g, got %s", label,
                         r->lo_open ? ">" : ">=", r->lo, r->hi_open ? "<" : "<=", r->hi, text);
    if (high)
        return mt_errorf(err, "%s: must be at most %.0f, got %s", label, r->hi, text);
    return mt_errorf(err, "%s: must be %s %g, got %s", label, r->lo_open ? ">" : ">=", r->lo,
                     text);
}

static int parse_bool(const char *s, bool *out) {
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) return *out = true, 0;
        if (!strcasecmp(s, no[i])) return *out = false, 0;
    }
    return -1;
}

/* Integers may be written 1000 or 1e3, not 2.5 or 0x10, and are read
 * exactly: past 2^53 (the largest a JSON number keeps) *out is a value past
 * it that the range check refuses, never a neighbour rounded back in. */
static int parse_int(const char *s, double *out) {
    if (!mt_decimal_text(s)) return -1;
    char *end;
    errno = 0;
    if (!strpbrk(s, ".eE")) { /* digits: exact */
        long long v = strtoll(s, &end, 10);
        long long most = (long long)INT_MAX_EXACT;
        bool big = errno == ERANGE || v > most || v < -most;
        *out = !big ? (double)v : s[0] == '-' ? -2 * INT_MAX_EXACT : 2 * INT_MAX_EXACT;
        return 0;
    }
    double v = strtod(s, &end);
    if (*end || !isfinite(v) || v != floor(v)) return -1;
    /* at 2^53 and beyond a double may be a rounded neighbour of the text */
    *out = fabs(v) < INT_MAX_EXACT ? v : v < 0 ? -2 * INT_MAX_EXACT : 2 * INT_MAX_EXACT;
    return 0;
}

/* Decimal numbers only: strtod would read 0x10 as 16. */
static int parse_float(const char *s, double *out) {
    char *end;
    errno = 0;
    if (!mt_decimal_text(s)) return -1;
    double v = strtod(s, &end);
    if (end == s || *end || !isfinite(v) || (errno && v != 0)) return -1;
    *out = v;
    return 0;
}

int mt_tc_set(mt_train_config *cfg, const mt_tc_option *o, const char *value, const char *label,
              mt_error *err) {
    double v;
    switch (o->type) {
    case MT_TC_STRING:
        if (strlen(value) >= MT_TC_STR)
            return mt_errorf(err, "%s: value is longer than %d bytes", label, MT_TC_STR - 1);
        strcpy(field(cfg, o), value);
        break;
    case MT_TC_INT:
        if (parse_int(value, &v))
            return mt_errorf(err, "%s: expected an integer (decimal, like 1000 or 1e3), got '%s'",
                             label, value);
        if (check_range(o, v, value, label, err)) return -1;
        *(int64_t *)field(cfg, o) = (int64_t)v;
        break;
    case MT_TC_FLOAT:
        if (parse_float(value, &v))
            return mt_errorf(err, "%s: expected a number (decimal, like 1e-5 or 0.1), got '%s'",
                             label, value);
        if (check_range(o, v, value, label, err)) return -1;
        *(double *)field(cfg, o) = v;
        break;
    case MT_TC_BOOL:
        if (parse_bool(value, field(cfg, o)))
            return mt_errorf(err, "%s: expected true or false, got '%s'", label, value);
        break;
    case MT_TC_ENUM: {
        int i = 0;
        while (o->choices[i] && strcasecmp(o->choices[i], value)) i++;
        if (!o->choices[i]) {
            char list[256];
            list_choices(o, list, sizeof list);
            return mt_errorf(err, "%s: unknown value '%s' (allowed: %s)", label, value, list);
        }
        *(int *)field(cfg, o) = i;
        break;
    }
    }
    cfg->given[o - mt_tc_options] = true;
    return 0;
}

/* Shortest text that reads back to exactly v, with a '.' so that YAML
 * readers of other tools see a float ("1.0e-05", "0.0"). */
static void format_double(double v, char *buf, size_t n) {
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    if (strchr(buf, '.') || strchr(buf, 'n') || strchr(buf, 'i')) return;
    char *e = strchr(buf, 'e');
    char tail[32];
    snprintf(tail, sizeof tail, "%s", e ? e : "");
    if (e) *e = 0;
    size_t len = strlen(buf);
    snprintf(buf + len, n - len, ".0%s", tail);
}

void mt_tc_format(const mt_train_config *cfg, const mt_tc_option *o, char *buf, size_t n) {
    const void *p = cfield(cfg, o);
    switch (o->type) {
    case MT_TC_STRING: snprintf(buf, n, "%s", (const char *)p); break;
    case MT_TC_INT: snprintf(buf, n, "%lld", (long long)*(const int64_t *)p); break;
    case MT_TC_FLOAT: format_double(*(const double *)p, buf, n); break;
    case MT_TC_BOOL: snprintf(buf, n, "%s", *(const bool *)p ? "true" : "false"); break;
    case MT_TC_ENUM: snprintf(buf, n, "%s", o->choices[*(const int *)p]); break;
    }
}

void mt_train_config_defaults(mt_train_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        mt_error err;
        if (mt_tc_set(cfg, &mt_tc_options[i], mt_tc_options[i].def, mt_tc_options[i].name, &err))
            MT_DIE("bad default in the option table: %s", err.msg);
    }
    memset(cfg->given, 0, sizeof cfg->given);
}

int mt_train_config_set(mt_train_config *cfg, const char *key, const char *value,
                        const char *where, mt_error *err) {
    char label[MT_TC_STR + 64];
    snprintf(label, sizeof label, "%s%s%s", where ? where : "", where ? ": " : "", key);
    const mt_tc_option *o = mt_tc_find(key);
    if (o) return mt_tc_set(cfg, o, value, label, err);
    const char *s = mt_tc_suggest(key);
    if (s) return mt_errorf(err, "%s: unknown key (did you mean '%s'?)", label, s);
    return mt_errorf(err, "%s: unknown key (run 'megatrain train --help' for the list)", label);
}

void mt_train_config_resolve(mt_train_config *cfg) {
    mt_data_spec_canonicalize(cfg->data, sizeof cfg->data);
    if (!cfg->model[0]) {
        for (size_t i = 0; i < mt_tc_n_options; i++) {
            const mt_tc_option *o = &mt_tc_options[i];
            if (cfg->given[i] || !o->tiny_def) continue;
            mt_error err;
            if (mt_tc_set(cfg, o, o->tiny_def, o->name, &err))
                MT_DIE("bad tiny default in the option table: %s", err.msg);
            cfg->given[i] = false;
        }
    } else if (!cfg->tokenizer[0]) {
        char path[MT_TC_STR + 32];
        snprintf(path, sizeof path, "%s/tokenizer.json", cfg->model);
        if (strlen(path) < MT_TC_STR) strcpy(cfg->tokenizer, path);
    }
}

int mt_train_config_validate(const mt_train_config *cfg, mt_error *err) {
    for (size_t i = 0; i < mt_tc_n_options; i++) {
        const mt_tc_option *o = &mt_tc_options[i];
        char text[64];
        if (o->type == MT_TC_INT || o->type == MT_TC_FLOAT) {
            mt_tc_format(cfg, o, text, sizeof text);
            double v = o->type == MT_TC_INT ? (double)*(const int64_t *)cfield(cfg, o)
                                            : *(const double *)cfield(cfg, o);
            if (!isfinite(v)) return mt_errorf(err, "%s: must be a finite number", o->name);
            if (check_range(o, v, text, o->name, err)) return -1;
        } else if (o->type == MT_TC_ENUM) {
            int v = *(const int *)cfield(cfg, o), n = 0;
            while (o->choices[n]) n++;
            if (v < 0 || v >= n) return mt_errorf(err, "%s: enum value %d out of range", o->name, v);
        } else if (o->type == MT_TC_STRING && !memchr(cfield(cfg, o), 0, MT_TC_STR)) {
            return mt_errorf(err, "%s: string not terminated", o->name);
        }
    }
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
    return 0;
}

/* Enum names ------------------------------------------------------------ */

const char *mt_tc_data_format_name(mt_tc_data_format v) { return data_formats[v]; }
const char *mt_tc_chat_template_name(mt_tc_chat_template v) { return chat_templates[v]; }
const char *mt_tc_packing_name(mt_tc_packing v) { return packings[v]; }
const char *mt_device_kind_name(mt_device_kind v) { return devices[v]; }
const char *mt_tc_precision_name(mt_tc_precision v) { return dtypes[v]; }
const char *mt_save_dtype_name(mt_save_dtype v) { return dtypes[v]; }
