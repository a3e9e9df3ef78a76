/* metrics.jsonl as `megatrain plot` reads it: training rows, evaluation
 * rows, other lines skipped (mt_metrics_read). */
#include <math.h>

#include "engine/metrics_read.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    mt_metrics_series s = {0};
    mt_error err;
    if (mt_metrics_read(fuzz_file("plot.jsonl", data, size), &s, NULL, &err) == 0) {
        /* Touch every element, as plot does: ASan checks the arrays' lengths. */
        volatile double sink = 0;
        for (size_t i = 0; i < s.n; i++) sink += s.step[i] + s.loss[i] + (isnan(s.lr[i]) ? 0 : s.lr[i]);
        for (size_t i = 0; i < s.n_eval; i++) sink += s.eval_step[i] + s.eval_loss[i];
        (void)sink;
        mt_metrics_series_free(&s);
    } else if (s.step || s.eval_step || s.n || s.n_eval) {
        abort(); // the contract: a failed read leaves nothing to free
    }
    return 0;
}
