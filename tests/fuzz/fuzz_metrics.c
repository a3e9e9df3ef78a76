/* metrics.jsonl as read back on resume: lines after the resume step and a
 * torn last line are dropped (mt_metrics_open). */
#include "engine/metrics.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    mt_metrics_writer w;
    mt_error err;
    if (mt_metrics_open(&w, fuzz_file("metrics.jsonl", data + 1, size - 1), data[0] % 8, &err) == 0)
        mt_metrics_close(&w);
    return 0;
}
