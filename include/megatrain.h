/* megatrain: full-precision training of Llama-family language models on
 * one GPU (or the CPU), as a C library. docs/api.md is the manual; this
 * header is its contract.
 *
 * Conventions, for every call below:
 * - A call that can fail returns 0 (or a handle, or a string) on success
 *   and -1 (or NULL) on failure; mt_last_error() then says which input was
 *   wrong, what was wrong with it, and the fix.
 * - Handles are opaque. Each is made by one call (*_open, *_new) and
 *   released by one (*_close, *_free), which accept NULL.
 * - A string or array the library returns to the caller (char *, the ids
 *   of mt_tokenizer_tokenize) is the caller's, released with mt_free. A
 *   const char * it returns is borrowed: valid as long as its handle.
 * - Nothing is written to stdout: what a run or a generation has to say
 *   reaches the caller through an mt_event_fn callback (NULL: none). A few
 *   warnings of the checkpoint code (a damaged checkpoint skipped, a
 *   directory that could not be synced) still go to stderr.
 * - A handle is used by one thread at a time; different handles may be
 *   used from different threads. mt_last_error is per thread.
 * - Sizes and counts are int64_t or size_t; booleans are bool. */
#ifndef MEGATRAIN_H
#define MEGATRAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- version, errors, memory ------------------------------------------ */

/* The version of this header; mt_version() is the library's. The only
 * place the version is written: the Makefile reads it from here. */
#define MT_VERSION_MAJOR 0
#define MT_VERSION_MINOR 1
#define MT_VERSION_PATCH 0
#define MT_VERSION "0.1.0"

/* "MAJOR.MINOR.PATCH" of the library that is linked. */
const char *mt_version(void);

/* The GPU code this build carries, as nvcc was asked for it, e.g.
 * "sm_80 sm_86 sm_89 sm_90 compute_90" (compute_NN: PTX, compiled for
 * newer GPUs when loaded); "none (CPU only)" for a build without CUDA. */
const char *mt_cuda_archs(void);

/* The message of the last call that failed on this thread ("" if none).
 * Valid until the next failing call on this thread. */
const char *mt_last_error(void);

/* Releases what the library returned to the caller (strings, id arrays). */
void mt_free(void *p);

/* ---- events: what a run or a generation reports ---------------------- */

typedef enum mt_event_kind {
    MT_EVENT_INFO,    /* text: a line of information (no newline) */
    MT_EVENT_WARNING, /* text: a line worth the user's attention (no newline) */
    MT_EVENT_STEP,    /* step: an optimizer step finished; text: its progress
                       * line on the steps `log_every` asks for, else NULL */
    MT_EVENT_TEXT,    /* text: generated text, a piece as it comes (may hold
                       * newlines; nothing is added between pieces) */
} mt_event_kind;

/* One optimizer step. A value that does not apply (no GPU, no ETA yet) is
 * NAN; tokens and skipped are -1 then. */
typedef struct mt_step_metrics {
    int64_t step;          /* optimizer steps done, 1 after the first */
    int64_t total_steps;   /* steps the run will do */
    double epoch;          /* passes over the data, fractional */
    double loss;           /* mean loss of the step's tokens */
    double lr, grad_norm;  /* lr used; global gradient norm before clipping */
    int64_t tokens;        /* tokens seen so far */
    double tokens_per_s, tflops, step_time_s, eta_s;
    double gpu_mem_gb, host_mem_gb; /* GB = 1e9 bytes */
    double h2d_gbps, d2h_gbps;
    int64_t skipped;       /* a skipped update (non-finite): how many in a row */
    const char *nonfinite; /* then its first non-finite tensor, or NULL (valid
                            * until the next call on the run) */
    /* a preference objective's step (NAN for sft): TRL's rewards/chosen,
     * rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen,
     * logps/rejected, means over the step's pairs */
    double rewards_chosen, rewards_rejected, rewards_accuracies, rewards_margins;
    double logps_chosen, logps_rejected;
} mt_step_metrics;

typedef struct mt_event {
    mt_event_kind kind;
    const char *text;             /* see mt_event_kind; NULL when absent */
    const mt_step_metrics *step;  /* MT_EVENT_STEP; NULL otherwise */
} mt_event;

/* Called on the thread that made the call, during it; ev and what it
 * points to are valid only during the callback. */
typedef void (*mt_event_fn)(const mt_event *ev, void *user);

/* ---- options of a training run ---------------------------------------- */

/* Every option of `megatrain train` (docs/config.md lists them): keys are
 * the YAML keys (`lr`, `batch_size`; '-' may stand for '_'), values text in
 * the YAML syntax ("1e-5", "true", "cosine"). */
typedef struct mt_options mt_options;

/* Options at their defaults (those of a real model; with no `model`, a run
 * gives the options not set the built-in tiny model's defaults). */
mt_options *mt_options_new(void);
void mt_options_free(mt_options *o);

/* Sets key to value after checking its type and range; an unknown key is
 * an error that suggests the closest one. */
int mt_options_set(mt_options *o, const char *key, const char *value);

/* The value of key as text (what a YAML file would say), into buf of size
 * bytes. Returns the length of the text (it was cut when >= size), -1 for
 * an unknown key. */
int mt_options_get(const mt_options *o, const char *key, char *buf, size_t size);

/* Sets the options of a YAML file (a flat `key: value` mapping); errors
 * name path:line. */
int mt_options_load_yaml(mt_options *o, const char *path);

/* Sets the members of a JSON object ({"lr": 1e-4, "device": "cpu"}):
 * numbers for numeric options, true/false for booleans, strings else. */
int mt_options_set_json(mt_options *o, const char *json);

/* Completes the options as mt_run_open does before it starts: with no
 * `model`, the built-in tiny model's defaults for every option not set;
 * with one, `tokenizer` = model/tokenizer.json when not set; then the
 * checks across options. mt_options_get then gives the values the run will
 * use (a binding finds the run directory `out` before opening the run).
 * Call it after the last mt_options_set: an option it filled counts as not
 * set, but a later `model` keeps the tiny values it gave. */
int mt_options_resolve(mt_options *o);

/* The command line of `megatrain train` (argv[0] is "train"): defaults,
 * the --config FILE, then the flags (--lr 1e-4, --no-skip-bad-lines), then
 * the tiny-model defaults and the checks. Returns 0, 1 when --help was
 * asked (nothing else done; print mt_options_usage()), or -1. */
int mt_options_parse_args(mt_options *o, int argc, char **argv);

/* The options as YAML (loadable by mt_options_load_yaml) or as a JSON
 * object (loadable by mt_options_set_json). Caller frees (mt_free). */
char *mt_options_to_yaml(const mt_options *o);
char *mt_options_to_json(const mt_options *o);

/* The --help text of `megatrain train`, generated from the option table.
 * Caller frees (mt_free). */
char *mt_options_usage(void);

/* One option of the table, for bindings that build their own forms. */
typedef struct mt_option_info {
    const char *name;          /* the YAML key */
    const char *type;          /* "string", "int", "float", "bool" or "enum" */
    const char *default_value; /* as text */
    const char *tiny_default;  /* for the built-in tiny model, or NULL */
    const char *choices;       /* enum: "cosine|linear|constant"; else NULL */
    const char *section;       /* set on the first option of a --help section */
    const char *help;
} mt_option_info;

/* Options are numbered 0 .. mt_options_count() - 1, in --help order. */
size_t mt_options_count(void);
int mt_options_describe(size_t i, mt_option_info *info);

/* ---- a training run ---------------------------------------------------- */

typedef struct mt_run mt_run;

/* Prepares the run the options describe: takes the run directory `out`
 * (refused while another run holds it, and when it holds an earlier run
 * unless `resume` continues it or `overwrite` replaces it), loads the
 * model (HF directory or the built-in tiny one), tokenizer and data, makes
 * the host store and the backend (CPU, or CUDA with the planner's
 * placement), resumes from a checkpoint when `resume` says so, and writes
 * out/config.yaml. o is copied. Reports through fn (may be NULL) until
 * mt_run_close. */
mt_run *mt_run_open(const mt_options *o, mt_event_fn fn, void *user);

/* One optimizer step: the next batch, forward, backward, the update, a
 * line of out/metrics.jsonl, an MT_EVENT_STEP, and a resume checkpoint
 * when the step is a multiple of save_every (before the last step). A
 * batch without a loss token is skipped (an MT_EVENT_WARNING says so).
 * Returns 0 with *m filled (m may be NULL); 1 when there is no step to do
 * (all steps done, or the data ran out: an MT_EVENT_INFO says so), nothing
 * done; -1 on error (a non-finite step with on_nonfinite stop included, and
 * a metrics row that could not be written: the run stops there). */
int mt_run_step(mt_run *r, mt_step_metrics *m);

/* Writes a resume checkpoint of the current step to out/checkpoints/
 * (keeping the last keep_last); a later run with resume = auto continues
 * from it, bit for bit. */
int mt_run_save(mt_run *r);

/* Ends the training: a last checkpoint (when save_every > 0), the final
 * Hugging Face model in out/model (save_dtype, with the tokenizer files),
 * and the sample_tokens sample (MT_EVENT_TEXT). No step after it. */
int mt_run_finish(mt_run *r);

/* The whole of `megatrain train` after the options: mt_run_step until
 * there is none, a summary line, then mt_run_finish. Installs handlers of
 * SIGINT and SIGTERM for its duration: on one, the step under way stops
 * at its next layer without changing anything (one process on the CPU;
 * several ranks, and the GPU, finish it), a checkpoint of the last step
 * done is saved (unless one holds it) and it returns 1 (resume = auto
 * continues); a second signal ends the process at once. 0 when finished,
 * -1 on error. */
int mt_run_train(mt_run *r);

/* Optimizer steps done so far (the resumed step after a resume), and the
 * steps the run will do. */
int64_t mt_run_steps_done(const mt_run *r);
int64_t mt_run_total_steps(const mt_run *r);

/* Releases the backend, the memory and the run directory. What was saved
 * stays; steps since the last checkpoint are lost. */
void mt_run_close(mt_run *r);

/* ---- tokenizers -------------------------------------------------------- */

typedef struct mt_tokenizer mt_tokenizer;

/* A Hugging Face tokenizer.json (with the BOS/EOS of a tokenizer_config.json
 * beside it), or "bytes": the built-in byte tokenizer (ids 0-255 the bytes,
 * 256 BOS, 257 EOS). */
mt_tokenizer *mt_tokenizer_open(const char *path);
void mt_tokenizer_free(mt_tokenizer *tok);

/* The ids of text (UTF-8, len bytes), as HF `tokenizers` gives them;
 * add_special: with the template's special tokens (BOS). *ids (caller
 * frees, mt_free) holds *n ids. Text that is not UTF-8 is an error. */
int mt_tokenizer_tokenize(const mt_tokenizer *tok, const char *text, size_t len,
                          bool add_special, int32_t **ids, size_t *n);

/* The text of n ids through the tokenizer's decoder; skip_special leaves
 * out special tokens. Caller frees (mt_free). */
char *mt_tokenizer_decode(const mt_tokenizer *tok, const int32_t *ids, size_t n,
                          bool skip_special);

size_t mt_tokenizer_vocab_size(const mt_tokenizer *tok);
/* -1 when the tokenizer has none. */
int32_t mt_tokenizer_bos_id(const mt_tokenizer *tok);
int32_t mt_tokenizer_eos_id(const mt_tokenizer *tok);
/* The id of a token spelled as in tokenizer.json, or -1. */
int32_t mt_tokenizer_token_id(const mt_tokenizer *tok, const char *token);

/* ---- data sets --------------------------------------------------------- */

typedef struct mt_dataset mt_dataset;

typedef struct mt_dataset_opts {
    const char *format;        /* "auto" (NULL), "text", "completion", "chat", "alpaca",
                                * "sharegpt", "tokens" (docs/data.md) */
    const char *chat_template; /* "auto" (NULL): the model's own, else the tokenizer's
                                * family's; "llama3", "qwen", "llama2", "mistral",
                                * "chatml" (docs/data.md) */
    const char *packing;       /* "auto" (NULL), "documents", "rows" (docs/data.md); auto:
                                * documents for completion and chat data and token files
                                * with a loss mask, rows for text */
    bool skip_bad_lines;       /* skip (and count) malformed lines instead of failing */
    uint64_t seed;             /* order of documents, per epoch */
    int64_t epochs;            /* passes the batches may span; >= 1 */
    int64_t vocab_size;        /* ids >= this are refused; 0: the tokenizer's */
    const char *text_field;    /* the key of the text format's text; NULL: "text" */
} mt_dataset_opts;

/* format "auto", chat_template "auto", seed 1, epochs 1, vocab_size 0. */
void mt_dataset_opts_defaults(mt_dataset_opts *o);

/* Tokenizes a JSONL file (text, prompt/completion, chat messages, alpaca,
 * sharegpt) or maps a pre-tokenized .mtok file (tok may then be NULL);
 * docs/data.md. o may be NULL (the defaults). */
mt_dataset *mt_dataset_load(const char *path, const mt_tokenizer *tok, const mt_dataset_opts *o);
void mt_dataset_free(mt_dataset *d);

/* Writes the data set's documents as loaded (token ids and loss mask) to a
 * .mtok file at path (a temporary file, fsync, rename): what `megatrain
 * tokenize` writes, and training from it gives the batches the source
 * gives. The order is the file's, not the shuffled one. */
int mt_dataset_save(const mt_dataset *d, const char *path);

typedef struct mt_dataset_info {
    int64_t documents, tokens, trainable, skipped_lines;
    const char *format;        /* the format read (after "auto") */
    const char *chat_template; /* the chat template used ("model": the model's own, or a
                                * built-in's name), or NULL */
    const char *packing;       /* "documents" or "rows" (after "auto") */
} mt_dataset_info;
int mt_dataset_describe(const mt_dataset *d, mt_dataset_info *info);

/* The next rows of T+1 tokens, packed: tokens (rows, T), their targets
 * (rows, T; -100 where a token carries no loss) and, when the data set
 * packs documents, pos (rows, T): each token's position within its
 * document (0 at a document's start and at every row's); pos may be NULL
 * only for a data set that packs rows. 0, or 1 at the end of the data
 * (nothing written). */
int mt_dataset_next_batch(mt_dataset *d, int64_t rows, int64_t T, int32_t *tokens,
                          int32_t *targets, int32_t *pos);

/* ---- models: evaluation and generation ------------------------------- */

typedef struct mt_model mt_model;

/* A Hugging Face model directory (config.json, safetensors) and its
 * tokenizer: tokenizer NULL means dir/tokenizer.json, "bytes" the built-in
 * one. The weights are read into host memory, in fp32. */
mt_model *mt_model_open(const char *dir, const char *tokenizer);
void mt_model_close(mt_model *m);

typedef struct mt_model_info {
    const char *model_type;    /* as config.json says: "llama", "qwen2", ... */
    int64_t n_params, layers, hidden, heads, kv_heads, ffn, vocab_size, max_positions;
    bool tied_embeddings;
    /* mixture-of-experts models: routed experts per MoE layer, experts per
     * token, and the parameters one token works with (all 0 / n_params for
     * a dense model) */
    int64_t experts, experts_per_tok, active_params;
} mt_model_info;
int mt_model_describe(const mt_model *m, mt_model_info *info);

/* The model's tokenizer, borrowed. */
const mt_tokenizer *mt_model_tokenizer(const mt_model *m);

/* The shape of a new model. */
typedef struct mt_model_shape {
    int64_t hidden, layers, heads, kv_heads, ffn, max_positions;
    double rope_theta;
    double init_std;           /* standard deviation of the random matrices */
    bool untied;               /* a separate lm_head */
    uint64_t seed;
    /* "llama" (NULL), "mistral", "qwen2", "qwen3", "phi3" (q, k, v and
     * gate, up saved fused as Phi-3 publishes them), a mixture-of-experts
     * type: "mixtral", "qwen2_moe", "qwen3_moe", "gpt_neox" (Pythia's
     * layout: kv_heads and untied do not apply; trains on the CPU only) or
     * "falcon" (kv_heads 1: Falcon-7B's architecture, more: the new decoder
     * of Falcon-40B/180B; trains on the CPU only), "gemma2" or "gemma3_text"
     * (the published configs' soft-caps, sliding windows and rope bases;
     * trains on the CPU only) */
    const char *model_type;
    /* MoE types: routed experts per layer, experts per token, an expert's
     * inner size (0: ffn; mixtral always uses ffn), the shared expert's
     * inner size (qwen2_moe; 0: ffn), and whether the top-k weights are
     * renormalised (norm_topk_prob; -1: the type's published default, true
     * for qwen3_moe, false for qwen2_moe; mixtral always renormalises) */
    int64_t experts, experts_per_tok, expert_ffn, shared_expert_ffn;
    int norm_topk;
} mt_model_shape;

/* hidden 1024, 12 layers, 16 heads, 4 kv heads, ffn 2816, 2048 positions,
 * rope_theta 500000, init_std 0.02, tied, seed 1, llama; for MoE types 8
 * experts, 2 per token, expert_ffn and shared_expert_ffn 0 (ffn),
 * norm_topk -1. */
void mt_model_shape_defaults(mt_model_shape *s);

/* Writes a new model with random weights to dir (which must not exist), as
 * an HF directory in fp32 with the tokenizer's files copied in (tokenizer
 * "bytes": the built-in one, no files); the tokenizer sets the vocabulary
 * and BOS/EOS. info (may be NULL) describes
 * what was written. */
int mt_model_init(const char *dir, const char *tokenizer, const mt_model_shape *s,
                  mt_model_info *info);

typedef struct mt_eval_opts {
    const char *data;          /* .jsonl or .mtok */
    const char *format;        /* as mt_dataset_opts; NULL: "auto" */
    const char *chat_template; /* NULL: "auto" */
    const char *packing;       /* NULL: "auto"; as mt_dataset_opts */
    int64_t seq_len;           /* 0: the model's max_position_embeddings, at most 1024 */
    int64_t batch_size;
    int64_t micro_batches;     /* batches of micro_batches x batch_size rows; with a run's
                                * seq_len, batch_size and micro_batches the loss equals the
                                * run's eval_loss at the same step */
    int64_t max_batches;       /* 0: the whole file */
    const char *device;        /* "auto" (NULL), "cpu", "cuda" */
    const char *precision;     /* on the GPU: "bf16" (NULL) or "fp32" */
    const char *dump_logits;   /* a safetensors file for the first row's input
                                * ids and logits, or NULL */
    const char *text_field;    /* as mt_dataset_opts; NULL: "text" */
    /* A preference objective's metrics on pairs {prompt, chosen, rejected}
     * (the options of train's that name them): objective NULL or "sft" is
     * the loss per token; "dpo" (with ref_model, the reference), "simpo",
     * "orpo". */
    const char *objective;
    const char *loss_type;     /* dpo: NULL ("sigmoid"), "ipo", "hinge" */
    double beta, label_smoothing, gamma, lambda; /* 0.1, 0, 0.5, 0.1 by default */
    const char *ref_model;     /* dpo: the reference model's directory */
    int skip_bad_pairs;        /* leave out (and count) bad pairs instead of failing */
} mt_eval_opts;

/* seq_len 0 (the model's), batch_size 4, micro_batches 1, the whole file,
 * device auto, bf16; objective sft (beta 0.1, gamma 0.5, lambda 0.1). */
void mt_eval_opts_defaults(mt_eval_opts *o);

typedef struct mt_eval_result {
    double loss;               /* mean over the tokens with a loss */
    double perplexity;         /* exp(loss) */
    int64_t tokens, batches;
    /* a preference objective (loss is then its loss; perplexity 0): TRL's
     * rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
     * logps/chosen, logps/rejected, means over the pairs */
    double rewards_chosen, rewards_rejected, rewards_accuracies, rewards_margins;
    double logps_chosen, logps_rejected;
    int64_t pairs, skipped_pairs;
} mt_eval_result;

/* The model's loss on o->data, read once in order in batches of
 * batch_size rows of seq_len tokens, the last batch partial (the final
 * partial row is not read). */
int mt_model_eval(mt_model *m, const mt_eval_opts *o, mt_eval_result *res);

typedef struct mt_generate_opts {
    const char *prompt;        /* NULL: "" */
    int64_t max_new_tokens;
    double temperature;        /* 0: greedy */
    double top_p;              /* nucleus sampling, in (0, 1] */
    uint64_t seed;
    int64_t context;           /* tokens of context; 0: min(512, max positions) */
    const char *device;        /* "auto" (NULL), "cpu", "cuda" */
    bool add_special;          /* encode the prompt with BOS, as documents were
                                * in training; false for raw-text models */
    /* A chat reply instead of a continuation: a JSON list of {"role",
     * "content"} messages, rendered with the model's chat template (or the
     * built-in chat_template names: as mt_dataset_opts) and
     * add_generation_prompt; the reply stops at EOS or a token that ends a
     * turn, and only it is reported and returned. NULL: prompt. */
    const char *messages;
    const char *chat_template;
} mt_generate_opts;

/* 64 new tokens, temperature 0.8, top_p 0.95, seed 1, device auto, BOS. */
void mt_generate_opts_defaults(mt_generate_opts *o);

/* Continues the prompt (or replies to o->messages), stopping at EOS or
 * after max_new_tokens. The text is streamed through fn as MT_EVENT_TEXT
 * pieces (the prompt first, except for a chat reply), and returned whole
 * (prompt and continuation, or the reply; caller frees, mt_free). */
char *mt_model_generate(mt_model *m, const mt_generate_opts *o, mt_event_fn fn, void *user);

#ifdef __cplusplus
}
#endif

#endif
