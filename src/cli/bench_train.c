/* megatrain bench train: the arguments of a benchmark of training steps
 * (src/train/bench.h runs it and prints its report). */
#include <stdio.h>

#include "cli/cli_options.h"
#include "cli/commands.h"
#include "model/config.h"
#include "model/presets.h"
#include "dist/launch.h"
#include "train/bench.h"

typedef struct bench_train_args {
    const char *preset, *trace, *calibration, *nvme_dir;
    int64_t hidden, layers, heads, kv_heads, ffn, vocab, seq_len, batch_size, micro_batches;
    int64_t steps, slots, keep_layers, gpus, gpu_adam_layers, disk_layers, disk_saved_layers;
    int64_t disk_weight_layers;
    double gpu_mem, host_mem, disk_mem;
    int precision, host_grad_dtype, saved_input_dtype, placement, grads, objective;
    bool host_saved_inputs;
    bool given[32];
} bench_train_args;

static const char *const placements[] = {"auto", "all-gpu", NULL};
static const char *const grad_homes[] = {"auto", "gpu", "host", NULL};

#define OFF(field) offsetof(bench_train_args, field)
static const mt_opt options[] = {
    MT_CLI_PRESET(bench_train_args, "7b", "The model"),
    MT_CLI_SHAPE(bench_train_args, "0", "0", "0", "0", "0", NULL, "; 0: the preset's"),
    {"vocab", MT_OPT_INT, OFF(vocab), "0", NULL, MT_OPT_NONNEG, NULL, "N", NULL,
     "vocabulary; 0: the preset's"},
    MT_CLI_BATCH(bench_train_args, "2048", "8", "4", "The step"),
    {"steps", MT_OPT_INT, OFF(steps), "4", NULL, MT_OPT_AT_LEAST(1), NULL, "N", NULL,
     "timed steps after one warm-up step"},
    MT_CLI_PRECISION(bench_train_args, NULL),
    {"objective", MT_OPT_ENUM, OFF(objective), "sft", NULL, MT_OPT_ANY, mt_tc_objectives, NULL,
     NULL, "sft: cross-entropy steps; dpo, simpo, orpo: the preference objective's steps at the "
     "same tokens (each row one pair, a prompt of seq_len/8 in each half)"},
    {"trace", MT_OPT_TEXT, OFF(trace), "", NULL, MT_OPT_ANY, NULL, "FILE", NULL,
     "write a Chrome trace (chrome://tracing) of the timed steps"},
    {"gpus", MT_OPT_INT, OFF(gpus), "0", NULL, MT_OPT_BETWEEN(0, 4096), NULL, "N", NULL,
     "run on N GPUs of this machine, one rank each, every GPU stepping on its own "
     "micro-batches (the step's tokens are per GPU); under torchrun, mpirun or srun, the "
     "launcher's ranks"},
    MT_CLI_BUDGETS(bench_train_args, "Placement (default: the planner's, within the budgets)",
                   "what is free"),
    {"placement", MT_OPT_ENUM, OFF(placement), "auto", NULL, MT_OPT_ANY, placements, NULL, NULL,
     "all-gpu: every gradient and saved input on the GPU; auto: the planner's"},
    MT_CLI_CALIBRATION(bench_train_args),
    {"gpu_adam_layers", MT_OPT_INT, OFF(gpu_adam_layers), "-1", NULL, MT_OPT_AT_LEAST(-1), NULL,
     "N", NULL, "leading layers (0 = the embedding) whose AdamW runs on the GPU, their state "
     "kept there; -1: the planner's choice, 0: none"},
    {"nvme_dir", MT_OPT_TEXT, OFF(nvme_dir), "", NULL, MT_OPT_ANY, NULL, "DIR[,DIR...]", NULL,
     "the disk tier: directories for the Adam m and v of the layers the host budget cannot "
     "hold (as train's)"},
    {"disk_mem", MT_OPT_FLOAT, OFF(disk_mem), "0", NULL, MT_OPT_NONNEG, NULL, "GB", NULL,
     "with --nvme-dir: disk the optimizer state may take; 0: their free space"},
    {"disk_layers", MT_OPT_INT, OFF(disk_layers), "-1", NULL, MT_OPT_AT_LEAST(-1), NULL, "N",
     NULL, "with --nvme-dir: the last N layers' m and v on disk; -1: the planner's choice"},
    {"disk_saved_layers", MT_OPT_INT, OFF(disk_saved_layers), "-1", NULL, MT_OPT_AT_LEAST(-1),
     NULL, "N", NULL, MT_DISK_SAVED_LAYERS_HELP},
    {"disk_weight_layers", MT_OPT_INT, OFF(disk_weight_layers), "-1", NULL, MT_OPT_AT_LEAST(-1),
     NULL, "N", NULL, MT_DISK_WEIGHT_LAYERS_HELP},
    {"slots", MT_OPT_INT, OFF(slots), "3", NULL, MT_OPT_AT_LEAST(2), NULL, "K", "Engine",
     "GPU weight slots"},
    {"keep_layers", MT_OPT_INT, OFF(keep_layers), "-1", NULL, MT_OPT_AT_LEAST(-1), NULL, "N",
     NULL, "layers whose activations skip the recompute; -1: as many as fit, 0: recompute all "
     "(and keep no Gemma down projection output)"},
    {"grads", MT_OPT_ENUM, OFF(grads), "auto", NULL, MT_OPT_ANY, grad_homes, NULL, NULL,
     "where every gradient waits, without the planner; auto: the planner's"},
    {"host_saved_inputs", MT_OPT_BOOL, OFF(host_saved_inputs), "false", NULL, MT_OPT_ANY, NULL,
     NULL, NULL, "keep the saved layer inputs in host memory, not on the GPU (with --grads)"},
};
#undef OFF
/* The preset's shape with the flags' over it. */
static void shape_config(const mt_preset *ps, const bench_train_args *a, mt_config *cfg) {
    mt_preset_config(ps, a->seq_len, cfg);
    if (a->hidden) cfg->C = a->hidden;
    if (a->layers) cfg->L = a->layers;
    if (a->heads) cfg->NH = a->heads;
    if (a->kv_heads || a->heads) cfg->NKV = a->kv_heads ? a->kv_heads : cfg->NH;
    if (a->ffn) cfg->F = a->ffn;
    if (a->ffn && cfg->moe.E) cfg->moe.FE = a->ffn; /* MoE: the experts' size */
    if (a->vocab) cfg->V = a->vocab;
    if (a->hidden || a->heads) cfg->HD = cfg->C / cfg->NH;
}

static int run(void *args, int argc, char **argv) {
    bench_train_args *a = args;
    const mt_preset *ps = mt_cli_preset("bench train", a->preset);
    if (!ps) return 2;
    mt_config cfg;
    shape_config(ps, a, &cfg);
    int gpus = (int)a->gpus;
    mt_bench_opts bo = {.cfg = cfg, .M = (int)a->micro_batches, .B = a->batch_size,
                        .T = a->seq_len, .steps = a->steps, .fp32 = a->precision,
                        .slots = (int)a->slots, .keep = (int)a->keep_layers,
                        .gpu_grads = a->grads == 0 ? -1 : a->grads == 1,
                        .host_saved = a->host_saved_inputs, .grad_dtype = a->host_grad_dtype - 1,
                        .saved_bf16 = a->saved_input_dtype == 1,
                        .all_gpu = a->placement == 1, .gpu_mem = a->gpu_mem,
                        .host_mem = a->host_mem, .calib = a->calibration,
                        .gpu_adam = (int)a->gpu_adam_layers, .trace_path = a->trace,
                        .gpus = gpus, .nvme_dir = a->nvme_dir, .disk_mem = a->disk_mem,
                        .disk_layers = (int)a->disk_layers,
                        .disk_saved_layers = (int)a->disk_saved_layers,
                        .disk_weight_layers = (int)a->disk_weight_layers,
                        .objective = a->objective};
    mt_error err;
    if (gpus > 1 && !mt_launch_is_rank()) /* this process starts the ranks */
        return mt_cli_launch(gpus, "bench", argc, argv);
    if (mt_bench_train_run(&bo, stdout, &err)) {
        fprintf(stderr, "megatrain bench train: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static const mt_opt_alias aliases[] = {
    {"host_checkpoints", "host_saved_inputs", MT_ALIAS_DEPRECATED},
};
static const mt_opt_table table = {
    .command = "bench train", MT_OPT_ROWS(options), MT_OPT_ALIASES(aliases),
    MT_OPT_STRUCT(bench_train_args),
    .about = "Training steps of a synthetic model (random weights and tokens) on the GPU: step\n"
             "time, tokens/s, model TFLOPS, memory, beside the plan's prediction."};
const mt_cli_command mt_cli_bench_train = {
    "train", "training steps of a synthetic model on the GPU", &table, run};
