/* megatrain bench train: the arguments of a benchmark of training steps
 * (src/train/bench.h runs it and prints its report). */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "model/config.h"
#include "model/presets.h"
#include "dist/launch.h"
#include "train/bench.h"
#include "util/args.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: megatrain bench train [--preset NAME] [shape options] [options]\n"
            "  --preset P          model shape (default 7b = Llama-2-7B; 1b 3b 8b 13b 20b 34b 70b\n"
            "                      123b 405b; Qwen qwen2.5-7b qwen3-8b; mixture-of-experts\n"
            "                      mixtral-8x7b qwen3-30b-a3b qwen3-235b-a22b)\n"
            "  --layers N --hidden N --heads N --kv-heads N --ffn N --vocab N  override\n"
            "                      (--ffn: the experts' size for a mixture-of-experts shape)\n"
            "  --seq-len T         (default 2048)\n"
            "  --batch-size B      rows per micro-batch (default 8)\n"
            "  --micro-batches M   per optimizer step (default 4)\n"
            "  --steps N           timed steps after one warm-up step (default 4)\n"
            "  --precision P       bf16 | fp32 (default bf16)\n"
            "  --slots K           GPU weight slots (default 3)\n"
            "  --host-checkpoints  keep layer inputs in host memory, not on the GPU\n"
            "  --keep-layers N     layers whose activations skip the recompute (-1 = as many\n"
            "                      as fit, the default; 0 = recompute all)\n"
            "  --trace FILE        write a Chrome trace (chrome://tracing) of the timed steps\n"
            "  --gpus N            run on N GPUs of this machine, one rank each, every GPU\n"
            "                      stepping on its own micro-batches (the step's tokens are\n"
            "                      per GPU); under torchrun, mpirun or srun, the launcher's\n"
            "                      ranks\n"
            "placement (default: the planner's, within the budgets):\n"
            "  --gpu-mem GB        GPU memory the run may take, context included (default: free)\n"
            "  --host-mem GB       host RAM the run may take (default: MemTotal less max(4 GB, 4%%))\n"
            "  --host-grad-dtype D fp32 | bf16 for gradients waiting on the host (default: fp32\n"
            "                      when it fits, else bf16)\n"
            "  --placement all-gpu every gradient and checkpoint on the GPU\n"
            "  --calibration FILE  rates for the step-time model (megatrain calibrate); default:\n"
            "                      a short probe of this machine\n"
            "  --gpu-adam-layers N leading layers (0 = the embedding) whose AdamW runs on the\n"
            "                      GPU, their state kept there (default: the planner's choice;\n"
            "                      0 = none)\n"
            "  --grads gpu|host    force where every gradient waits (no planner)\n");
}


int mt_bench_train(int argc, char **argv) {
    const mt_preset *ps = mt_preset_find("7b");
    int64_t over[6] = {0}; /* layers hidden heads kv ffn vocab */
    int64_t T = 2048, B = 8, steps = 4;
    int M = 4, slots = 3, fp32 = 0, host_ckpt = 0, keep = -1, gpu_grads = -1, all_gpu = 0;
    int grad_dtype = -1, gpu_adam = -1, gpus = 0;
    double gpu_mem = 0, host_mem = 0;
    const char *trace_path = NULL, *calib = NULL;
    static const struct option opts[] = {
        {"preset", required_argument, 0, 'p'},  {"layers", required_argument, 0, 'L'},
        {"hidden", required_argument, 0, 'C'},  {"heads", required_argument, 0, 'H'},
        {"kv-heads", required_argument, 0, 'K'}, {"ffn", required_argument, 0, 'F'},
        {"vocab", required_argument, 0, 'V'},   {"seq-len", required_argument, 0, 't'},
        {"batch-size", required_argument, 0, 'b'}, {"micro-batches", required_argument, 0, 'm'},
        {"steps", required_argument, 0, 's'},   {"precision", required_argument, 0, 'P'},
        {"slots", required_argument, 0, 'k'},   {"help", no_argument, 0, 'h'},
        {"host-checkpoints", no_argument, 0, 'c'}, {"trace", required_argument, 0, 'T'},
        {"keep-layers", required_argument, 0, 'K' + 256},
        {"grads", required_argument, 0, 'G' + 256},
        {"gpu-mem", required_argument, 0, 'g' + 256},
        {"host-mem", required_argument, 0, 'h' + 256},
        {"host-grad-dtype", required_argument, 0, 'd' + 256},
        {"placement", required_argument, 0, 'p' + 256},
        {"calibration", required_argument, 0, 'c' + 256},
        {"gpu-adam-layers", required_argument, 0, 'a' + 256},
        {"gpus", required_argument, 0, 'n' + 256},
        {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'p':
            ps = mt_preset_find(optarg);
            if (!ps) {
                fprintf(stderr, "megatrain bench train: unknown preset '%s' (%s)\n", optarg,
                        mt_preset_names());
                return 2;
            }
            break;
        case 'L': over[0] = mt_arg_ll(optarg, &bad); break;
        case 'C': over[1] = mt_arg_ll(optarg, &bad); break;
        case 'H': over[2] = mt_arg_ll(optarg, &bad); break;
        case 'K': over[3] = mt_arg_ll(optarg, &bad); break;
        case 'F': over[4] = mt_arg_ll(optarg, &bad); break;
        case 'V': over[5] = mt_arg_ll(optarg, &bad); break;
        case 't': T = mt_arg_ll(optarg, &bad); break;
        case 'b': B = mt_arg_ll(optarg, &bad); break;
        case 'm': M = (int)mt_arg_ll(optarg, &bad); break;
        case 's': steps = mt_arg_ll(optarg, &bad); break;
        case 'k': slots = (int)mt_arg_ll(optarg, &bad); break;
        case 'c': host_ckpt = 1; break;
        case 'K' + 256: keep = (int)mt_arg_ll(optarg, &bad); break;
        case 'G' + 256:
            if (strcmp(optarg, "gpu") && strcmp(optarg, "host")) {
                fprintf(stderr, "megatrain bench train: --grads must be gpu or host\n");
                return 2;
            }
            gpu_grads = !strcmp(optarg, "gpu");
            break;
        case 'T': trace_path = optarg; break;
        case 'g' + 256: gpu_mem = mt_arg_d(optarg, &bad); break;
        case 'h' + 256: host_mem = mt_arg_d(optarg, &bad); break;
        case 'c' + 256: calib = optarg; break;
        case 'a' + 256: gpu_adam = (int)mt_arg_ll(optarg, &bad); break;
        case 'n' + 256: gpus = (int)mt_arg_ll(optarg, &bad); break;
        case 'd' + 256:
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) {
                fprintf(stderr, "megatrain bench train: --host-grad-dtype must be fp32 or bf16\n");
                return 2;
            }
            grad_dtype = !strcmp(optarg, "bf16");
            break;
        case 'p' + 256:
            if (strcmp(optarg, "all-gpu") && strcmp(optarg, "auto")) {
                fprintf(stderr, "megatrain bench train: --placement must be auto or all-gpu\n");
                return 2;
            }
            all_gpu = !strcmp(optarg, "all-gpu");
            break;
        case 'P':
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) {
                fprintf(stderr, "megatrain bench train: --precision must be bf16 or fp32\n");
                return 2;
            }
            fp32 = !strcmp(optarg, "fp32");
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "megatrain bench train: '%s' is not a number\n", optarg);
            return 2;
        }
    }
    if (gpu_adam < -1) {
        fprintf(stderr, "megatrain bench train: --gpu-adam-layers must be 0 or more\n");
        return 2;
    }
    if (gpus < 0 || gpus > 4096) {
        fprintf(stderr, "megatrain bench train: --gpus must be between 1 and the GPUs of the "
                "machine\n");
        return 2;
    }
    if (T <= 0 || B <= 0 || M <= 0 || steps <= 0 || gpu_mem < 0 || host_mem < 0) {
        fprintf(stderr, "megatrain bench train: sizes, budgets and --steps must be positive\n");
        return 2;
    }
    mt_config cfg;
    mt_preset_config(ps, T, &cfg);
    if (over[1]) cfg.C = over[1];
    if (over[0]) cfg.L = over[0];
    if (over[2]) cfg.NH = over[2];
    if (over[3] || over[2]) cfg.NKV = over[3] ? over[3] : cfg.NH;
    if (over[4]) cfg.F = over[4];
    if (over[4] && cfg.moe.E) cfg.moe.FE = over[4]; /* MoE: the experts' size */
    if (over[5]) cfg.V = over[5];
    if (over[1] || over[2]) cfg.HD = cfg.C / cfg.NH;
    mt_bench_opts bo = {.cfg = cfg, .M = M, .B = B, .T = T, .steps = steps, .fp32 = fp32,
                        .slots = slots, .keep = keep, .gpu_grads = gpu_grads,
                        .host_ckpt = host_ckpt, .grad_dtype = grad_dtype, .all_gpu = all_gpu,
                        .gpu_mem = gpu_mem, .host_mem = host_mem, .calib = calib,
                        .gpu_adam = gpu_adam,
                        .trace_path = trace_path, .gpus = gpus};
    mt_error err;
    if (gpus > 1 && !mt_launch_is_rank()) /* this process starts the ranks */
        return mt_cli_launch(gpus, "bench", argc, argv);
    if (mt_bench_train_run(&bo, stdout, &err)) {
        fprintf(stderr, "megatrain bench train: %s\n", err.msg);
        return 1;
    }
    return 0;
}
