/* megatrain plan: what a run needs (host bytes, pinned bytes, GPU bytes)
 * against what this machine has, before allocating anything; refuses with
 * the numbers and what to change when it does not fit. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "io/model_io.h"
#include "model/config.h"
#include "model/params.h"

#ifdef MT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/backend_cuda.h"
#include "backend/cuda/cuda_ops.h"
#endif

static void usage(FILE *f) {
    fprintf(f,
            "usage: megatrain plan (--model DIR | --hidden N --layers N --heads N --kv-heads N\n"
            "                        --ffn N --vocab N) [batch options]\n"
            "  --seq-len T --batch-size B --micro-batches M   (default 2048, 8, 4)\n"
            "  --host-ram-gb X   host RAM to plan for (default: this machine's MemTotal)\n"
            "  --gpu-gb X        GPU memory to plan for (default: this GPU's free memory, or 139)\n");
}

static double meminfo_gb(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) kb = atof(line + strlen(key) + 1);
    if (f) fclose(f);
    return kb * 1024 / 1e9;
}

typedef struct option_plan {
    const char *name;
    int gpu_grads, host_ckpt;
    double host, pinned, gpu;
} option_plan;

int mt_cmd_plan(int argc, char **argv) {
    const char *model = NULL;
    long long C = 0, L = 0, NH = 0, NKV = 0, F = 0, V = 32000, T = 2048, B = 8, M = 4;
    double host_gb = 0, gpu_gb = 0;
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},  {"hidden", required_argument, 0, 'C'},
        {"layers", required_argument, 0, 'L'}, {"heads", required_argument, 0, 'H'},
        {"kv-heads", required_argument, 0, 'K'}, {"ffn", required_argument, 0, 'F'},
        {"vocab", required_argument, 0, 'V'},  {"seq-len", required_argument, 0, 't'},
        {"batch-size", required_argument, 0, 'b'}, {"micro-batches", required_argument, 0, 'n'},
        {"host-ram-gb", required_argument, 0, 'r'}, {"gpu-gb", required_argument, 0, 'g'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': model = optarg; break;
        case 'C': C = mt_arg_ll(optarg, &bad); break;
        case 'L': L = mt_arg_ll(optarg, &bad); break;
        case 'H': NH = mt_arg_ll(optarg, &bad); break;
        case 'K': NKV = mt_arg_ll(optarg, &bad); break;
        case 'F': F = mt_arg_ll(optarg, &bad); break;
        case 'V': V = mt_arg_ll(optarg, &bad); break;
        case 't': T = mt_arg_ll(optarg, &bad); break;
        case 'b': B = mt_arg_ll(optarg, &bad); break;
        case 'n': M = mt_arg_ll(optarg, &bad); break;
        case 'r': host_gb = mt_arg_d(optarg, &bad); break;
        case 'g': gpu_gb = mt_arg_d(optarg, &bad); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "megatrain plan: '%s' is not a number\n", optarg);
            return 2;
        }
    }
    mt_error err;
    mt_config cfg;
    if (model) {
        if (mt_model_load_config(&cfg, model, &err)) {
            fprintf(stderr, "megatrain plan: %s\n", err.msg);
            return 1;
        }
    } else {
        if (!C || !L || !NH || !F) {
            fprintf(stderr, "megatrain plan: give --model DIR, or --hidden, --layers, --heads and "
                    "--ffn\n");
            return 2;
        }
        mt_config_default_tiny(&cfg);
        cfg.C = C;
        cfg.L = L;
        cfg.NH = NH;
        cfg.NKV = NKV ? NKV : NH;
        cfg.HD = C / NH;
        cfg.F = F;
        cfg.V = V;
        cfg.tie_embeddings = 0;
        cfg.max_pos = T;
    }
    if (T < 1 || B < 1 || M < 1) {
        fprintf(stderr, "megatrain plan: --seq-len, --batch-size, --micro-batches must be >= 1\n");
        return 2;
    }
    mt_param_table t;
    if (mt_config_validate(&cfg, model ? model : "the shape", &err) ||
        mt_params_init(&t, &cfg, &err)) {
        fprintf(stderr, "megatrain plan: %s\n", err.msg);
        return 1;
    }
    double P = (double)t.n_params, tokens = (double)(M * B * T);
    double ckpt = (double)t.n_layers * tokens * cfg.C * 4;
    if (!host_gb) host_gb = meminfo_gb("MemTotal:");
    int have_gpu = 0;
#ifdef MT_HAVE_CUDA
    if (!gpu_gb && mt_cuda_device_count() > 0) {
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
            gpu_gb = fr / 1e9;
            have_gpu = 1;
        }
    }
#endif
    if (!gpu_gb) gpu_gb = 139;
    printf("model: %s, %.2fB parameters, %lld layers, hidden %lld, ffn %lld, vocab %lld\n",
           model ? model : "shape from flags", P / 1e9, (long long)cfg.L, (long long)cfg.C,
           (long long)cfg.F, (long long)cfg.V);
    printf("step: %lld x %lld x %lld = %.0f tokens; layer checkpoints %.1f GB\n", M, B, T, tokens,
           ckpt / 1e9);
    printf("machine: host %.1f GB%s, GPU %.1f GB%s\n\n", host_gb,
           argc && host_gb == meminfo_gb("MemTotal:") ? " (MemTotal)" : "", gpu_gb,
           have_gpu ? " free" : " (assumed)");
    option_plan plans[4] = {
        {"gradients on GPU, checkpoints on GPU", 1, 0, 0, 0, 0},
        {"gradients on host, checkpoints on GPU", 0, 0, 0, 0, 0},
        {"gradients on GPU, checkpoints on host", 1, 1, 0, 0, 0},
        {"gradients on host, checkpoints on host", 0, 1, 0, 0, 0},
    };
    int best = -1;
    printf("%-42s %10s %10s %10s  %s\n", "placement", "host GB", "pinned GB", "GPU GB", "fits");
    for (int i = 0; i < 4; i++) {
        option_plan *p = &plans[i];
        p->host = P * (p->gpu_grads ? 12 : 16) + (p->host_ckpt ? ckpt : 0);
        p->pinned = P * (p->gpu_grads ? 4 : 8) + (p->host_ckpt ? ckpt : 0);
#ifdef MT_HAVE_CUDA
        mt_cuda_backend_opts bo = {.precision = MT_GPU_BF16, .gpu_grads = p->gpu_grads,
                                   .host_checkpoints = p->host_ckpt};
        p->gpu = (double)mt_cuda_backend_bytes(&cfg, &t, (int)M, B, T, &bo);
#else
        p->gpu = NAN;
#endif
        /* 4 GB of host and 2 GB of GPU stay for the system and CUDA */
        int fits = p->host / 1e9 + 4 <= host_gb && p->gpu / 1e9 + 2 <= gpu_gb;
        printf("%-42s %10.1f %10.1f %10.1f  %s\n", p->name, p->host / 1e9, p->pinned / 1e9,
               p->gpu / 1e9, fits ? "yes" : "no");
        if (fits && best < 0) best = i;
    }
    mt_params_free(&t);
    if (best < 0) {
        printf("\nmegatrain plan: this run does not fit: the smallest host need is %.1f GB "
               "(%.1f available) and the smallest GPU need %.1f GB (%.1f available); use fewer "
               "tokens per step (--batch-size, --micro-batches, --seq-len) for the GPU, a "
               "smaller model or more RAM for the host\n",
               plans[3].host < plans[1].host ? plans[3].host / 1e9 : plans[1].host / 1e9, host_gb,
               plans[3].gpu / 1e9, gpu_gb);
        return 1;
    }
    printf("\nplan: %s\n", plans[best].name);
    return 0;
}
