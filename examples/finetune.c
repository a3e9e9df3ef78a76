/* Fine-tuning through the public API (megatrain.h) only: a few steps, a
 * checkpoint, the final model, the loss of every step.
 *
 *   cc finetune.c $(pkg-config --cflags --libs megatrain) -o finetune
 *   ./finetune OUT [key=value ...]
 *
 * With no `model`, it trains the built-in tiny model on built-in text; give
 * model=DIR data=FILE.jsonl (a model made by `megatrain init`, or any
 * Llama-family HF directory) to fine-tune that. Any option of `megatrain
 * train` may follow (docs/config.md): device=cpu steps=10 lr=1e-4 ...
 * Exits 0 when the run finished and its loss fell. */
#include <megatrain.h>
#include <stdio.h>
#include <string.h>

/* Information lines as they come; the steps are printed by the loop. */
static void on_event(const mt_event *ev, void *user) {
    (void)user;
    if (ev->kind == MT_EVENT_INFO) printf("  %s\n", ev->text);
    else if (ev->kind == MT_EVENT_WARNING) fprintf(stderr, "  warning: %s\n", ev->text);
}

static int fail(const char *what, mt_options *o, mt_run *r) {
    fprintf(stderr, "finetune: %s: %s\n", what, mt_last_error());
    mt_run_close(r);
    mt_options_free(o);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUT [key=value ...]\n", argv[0]);
        return 2;
    }
    printf("megatrain %s (CUDA: %s)\n", mt_version(), mt_cuda_archs());
    mt_options *o = mt_options_new();
    /* a short run: 8 steps, a checkpoint at step 4, no sample */
    const char *defaults[][2] = {{"out", argv[1]}, {"steps", "8"}, {"save_every", "4"},
                                 {"warmup_steps", "2"}, {"sample_tokens", "0"}};
    for (size_t i = 0; i < sizeof defaults / sizeof *defaults; i++)
        if (mt_options_set(o, defaults[i][0], defaults[i][1])) return fail("options", o, NULL);
    for (int i = 2; i < argc; i++) {
        char key[64];
        const char *eq = strchr(argv[i], '=');
        if (!eq || eq - argv[i] >= (int)sizeof key) {
            fprintf(stderr, "finetune: '%s': give options as key=value\n", argv[i]);
            mt_options_free(o);
            return 2;
        }
        snprintf(key, sizeof key, "%.*s", (int)(eq - argv[i]), argv[i]);
        if (mt_options_set(o, key, eq + 1)) return fail("options", o, NULL);
    }

    mt_run *r = mt_run_open(o, on_event, NULL);
    if (!r) return fail("open", o, NULL);
    mt_step_metrics m;
    double first = 0, last = 0;
    int rc;
    while ((rc = mt_run_step(r, &m)) == 0) {
        printf("step %lld/%lld loss %.4f lr %.3g\n", (long long)m.step,
               (long long)m.total_steps, m.loss, m.lr);
        if (m.step == 1) first = m.loss;
        last = m.loss;
    }
    if (rc < 0) return fail("step", o, r);
    /* the last checkpoint, the model in OUT/model */
    if (mt_run_finish(r)) return fail("finish", o, r);
    mt_run_close(r);
    mt_options_free(o);
    printf("loss %.4f -> %.4f\n", first, last);
    return last < first ? 0 : 1;
}
