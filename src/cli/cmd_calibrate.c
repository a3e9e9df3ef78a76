/* megatrain calibrate: measures this machine for the planner's step-time
 * model (pinned copies each way and both at once, the CPU AdamW, one
 * decoder layer and the head of a shape on the GPU) and writes the rates as
 * JSON, for `plan --calibration`, `train --calibration` and
 * `bench train --calibration` (which then skip their own probe). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "util/args.h"
#include "cli/commands.h"
#include "model/presets.h"

#ifdef MT_HAVE_CUDA
#include "backend/cuda/planner_probe.h"
#include "kernels/cuda_ops.h"
#endif

static void usage(FILE *f) {
    fprintf(f, "usage: megatrain calibrate --out FILE [--preset NAME] [--seq-len T] "
               "[--batch-size B] [--micro-batches M] [--precision bf16|fp32]\n"
               "  measures the rates of this machine for the shape (default preset 8b, 2048 x 8 x 4)\n");
}

int mt_cmd_calibrate(int argc, char **argv) {
    const char *out = NULL, *preset = "8b";
    long long T = 2048, B = 8, M = 4;
    int fp32 = 0;
    static const struct option opts[] = {
        {"out", required_argument, 0, 'o'},    {"preset", required_argument, 0, 'p'},
        {"seq-len", required_argument, 0, 't'}, {"batch-size", required_argument, 0, 'b'},
        {"micro-batches", required_argument, 0, 'm'}, {"precision", required_argument, 0, 'P'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0},
    };
    optind = 1;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'o': out = optarg; break;
        case 'p': preset = optarg; break;
        case 't': T = mt_arg_ll(optarg, &bad); break;
        case 'b': B = mt_arg_ll(optarg, &bad); break;
        case 'm': M = mt_arg_ll(optarg, &bad); break;
        case 'P':
            if (strcmp(optarg, "bf16") && strcmp(optarg, "fp32")) {
                fprintf(stderr, "megatrain calibrate: --precision must be bf16 or fp32\n");
                return 2;
            }
            fp32 = !strcmp(optarg, "fp32");
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) {
            fprintf(stderr, "megatrain calibrate: '%s' is not a number\n", optarg);
            return 2;
        }
    }
    const mt_preset *p = mt_preset_find(preset);
    if (!out || !p || T < 1 || B < 1 || M < 1) {
        if (!p) fprintf(stderr, "megatrain calibrate: unknown preset '%s' (%s)\n", preset,
                        mt_preset_names());
        else usage(stderr);
        return 2;
    }
#ifndef MT_HAVE_CUDA
    fprintf(stderr, "megatrain calibrate: this build has no CUDA support\n");
    return 1;
#else
    if (mt_cuda_device_count() <= 0) {
        fprintf(stderr, "megatrain calibrate: no CUDA GPU is visible: calibration measures one\n");
        return 1;
    }
    mt_config cfg;
    mt_preset_config(p, T, &cfg);
    mt_rates r;
    mt_error err;
    if (mt_rates_probe(&r, &cfg, (int)M, B, T, fp32 ? MT_GPU_FP32 : MT_GPU_BF16, &err) ||
        mt_rates_save(&r, out, &err)) {
        fprintf(stderr, "megatrain calibrate: %s\n", err.msg);
        return 1;
    }
    printf("calibrate: H2D %.1f GB/s, D2H %.1f GB/s (%.0f%% with both busy), AdamW %.2f "
           "Gparam/s, %s layer fwd %.1f ms bwd %.1f ms -> %s\n", r.h2d_gbs, r.d2h_gbs,
           100 * r.duplex, r.adam_gparams, preset, r.layer_fwd_s * 1e3, r.layer_bwd_s * 1e3, out);
    return 0;
#endif
}
