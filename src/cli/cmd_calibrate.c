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
#include "host/disk.h"

typedef struct calibrate_args {
    const char *out, *preset, *nvme_dir;
    int64_t seq_len, batch_size, micro_batches;
    double disk_gb;
    int precision;
    bool given[10];
} calibrate_args;

static const mt_opt options[] = {
    {"out", MT_OPT_TEXT, offsetof(calibrate_args, out), NULL, NULL, MT_OPT_ANY, NULL, "FILE",
     NULL, "the rates, as JSON"},
    MT_CLI_PRESET(calibrate_args, "8b", "The shape measured"),
    MT_CLI_BATCH(calibrate_args, "2048", "8", "4", NULL),
    MT_CLI_PRECISION(calibrate_args, NULL),
    {"nvme_dir", MT_OPT_TEXT, offsetof(calibrate_args, nvme_dir), "", NULL, MT_OPT_ANY, NULL,
     "DIR[,DIR...]", "The disk tier",
     "also measure these directories as the disk tier stripes over them (O_DIRECT, io_uring, "
     "64 MiB blocks: written, read, and both at once); without a GPU, only them"},
    {"disk_gb", MT_OPT_FLOAT, offsetof(calibrate_args, disk_gb), "4", NULL, MT_OPT_ABOVE(0),
     NULL, "GB", NULL, "bytes the disk measurement moves each way"},
};

static int run(void *args, int argc, char **argv) {
    calibrate_args *a = args;
    const mt_preset *p = mt_cli_preset("calibrate", a->preset);
    if (!p) return 2;
    int gpu = mt_device_count() > 0, disk = a->nvme_dir && a->nvme_dir[0];
    if (!gpu && !disk)
        return mt_cli_fail("calibrate", 1, "no CUDA GPU is visible (or this build has no CUDA "
                           "support): calibration measures one (or a disk, --nvme-dir)");
    mt_config cfg;
    mt_preset_config(p, a->seq_len, &cfg);
    mt_rates r;
    mt_error err;
    mt_rates_default(&r);
    if (gpu && mt_device_probe(&r, &cfg, (int)a->micro_batches, a->batch_size, a->seq_len,
                               a->precision, &err))
        return mt_cli_fail("calibrate", 1, "%s", err.msg);
    if (gpu)
        printf("calibrate: H2D %.1f GB/s, D2H %.1f GB/s (%.0f%% with both busy), AdamW %.2f "
               "Gparam/s, %s layer fwd %.1f ms bwd %.1f ms\n", r.h2d_gbs, r.d2h_gbs,
               100 * r.duplex, r.adam_gparams, a->preset, r.layer_fwd_s * 1e3,
               r.layer_bwd_s * 1e3);
    if (disk) {
        if (mt_disk_measure(a->nvme_dir, (size_t)(a->disk_gb * 1e9), &r.disk_write_gbs,
                            &r.disk_read_gbs, &r.disk_both_gbs, &err))
            return mt_cli_fail("calibrate", 1, "%s", err.msg);
        printf("calibrate: disk %s: write %.2f GB/s, read %.2f GB/s, both at once %.2f GB/s\n",
               a->nvme_dir, r.disk_write_gbs, r.disk_read_gbs, r.disk_both_gbs);
        if (!gpu)
            snprintf(r.source, sizeof r.source, "H200 defaults, disk measured");
    }
    if (mt_rates_save(&r, a->out, &err)) return mt_cli_fail("calibrate", 1, "%s", err.msg);
    printf("calibrate: -> %s\n", a->out);
    return 0;
}

static const mt_opt_table table = {
    .command = "calibrate", MT_OPT_ROWS(options), MT_OPT_STRUCT(calibrate_args),
    .about = "Measures the rates of this machine for the planner (pinned copies, the CPU\n"
             "AdamW, one decoder layer and the head of the shape on the GPU)."};
const mt_cli_command mt_cli_calibrate = {
    "calibrate", "measure this machine's rates for the planner", &table, run};
