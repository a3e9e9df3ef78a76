/* megatrain calibrate: measures this machine for the planner's step-time
 * model (pinned copies each way and both at once, the CPU AdamW, one
 * decoder layer and the head of a shape on the GPU) and writes the rates as
 * JSON, for `plan --calibration`, `train --calibration` and
 * `bench train --calibration` (which then skip their own probe). */
#include <stdio.h>

#include "cli/cli_options.h"
#include "cli/commands.h"
#include "model/presets.h"

#include "backend/device.h"

typedef struct calibrate_args {
    const char *out, *preset;
    int64_t seq_len, batch_size, micro_batches;
    int precision;
    bool given[8];
} calibrate_args;

static const mt_opt options[] = {
    {"out", MT_OPT_TEXT, offsetof(calibrate_args, out), NULL, NULL, MT_OPT_ANY, NULL, "FILE",
     NULL, "the rates, as JSON"},
    MT_CLI_PRESET(calibrate_args, "8b", "The shape measured"),
    MT_CLI_BATCH(calibrate_args, "2048", "8", "4", NULL),
    MT_CLI_PRECISION(calibrate_args, NULL),
};

static int run(void *args, int argc, char **argv) {
    calibrate_args *a = args;
    const mt_preset *p = mt_cli_preset("calibrate", a->preset);
    if (!p) return 2;
    if (mt_device_count() <= 0)
        return mt_cli_fail("calibrate", 1, "no CUDA GPU is visible (or this build has no CUDA "
                           "support): calibration measures one");
    mt_config cfg;
    mt_preset_config(p, a->seq_len, &cfg);
    mt_rates r;
    mt_error err;
    if (mt_device_probe(&r, &cfg, (int)a->micro_batches, a->batch_size, a->seq_len, a->precision,
                        &err) ||
        mt_rates_save(&r, a->out, &err))
        return mt_cli_fail("calibrate", 1, "%s", err.msg);
    printf("calibrate: H2D %.1f GB/s, D2H %.1f GB/s (%.0f%% with both busy), AdamW %.2f "
           "Gparam/s, %s layer fwd %.1f ms bwd %.1f ms -> %s\n", r.h2d_gbs, r.d2h_gbs,
           100 * r.duplex, r.adam_gparams, a->preset, r.layer_fwd_s * 1e3, r.layer_bwd_s * 1e3,
           a->out);
    return 0;
}

static const mt_opt_table table = {
    .command = "calibrate", MT_OPT_ROWS(options), MT_OPT_STRUCT(calibrate_args),
    .about = "Measures the rates of this machine for the planner (pinned copies, the CPU\n"
             "AdamW, one decoder layer and the head of the shape on the GPU)."};
const mt_cli_command mt_cli_calibrate = {
    "calibrate", "measure this machine's rates for the planner", &table, run};
