/* Replays, through the fuzz harnesses themselves, every input that once
 * crashed one (tests/fuzz/regressions/<harness>/) and the seed corpora
 * (tests/fuzz/corpus/<harness>/): under make test-asan each replay runs
 * with ASan + UBSan, as in the fuzzer. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>

#include "io/file.h"

#define LLVMFuzzerTestOneInput mt_fuzz_compressed
#include "../fuzz/fuzz_compressed.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_config
#include "../fuzz/fuzz_config.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_jinja
#include "../fuzz/fuzz_jinja.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_jsonl
#include "../fuzz/fuzz_jsonl.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_metrics
#include "../fuzz/fuzz_metrics.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_mtok
#include "../fuzz/fuzz_mtok.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_plot
#include "../fuzz/fuzz_plot.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_safetensors
#include "../fuzz/fuzz_safetensors.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_st_index
#include "../fuzz/fuzz_st_index.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_tokenizer
#include "../fuzz/fuzz_tokenizer.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_trainer_state
#include "../fuzz/fuzz_trainer_state.c"
#undef LLVMFuzzerTestOneInput
#define LLVMFuzzerTestOneInput mt_fuzz_yaml
#include "../fuzz/fuzz_yaml.c"
#undef LLVMFuzzerTestOneInput

typedef int (*harness_fn)(const uint8_t *, size_t);

/* Runs fn on every file of dir (absent: none); returns how many. */
static int replay_dir(const char *dir, harness_fn fn) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char *path = mt_path_join(dir, e->d_name), *buf;
        size_t len;
        mt_error err;
        cr_assert_eq(mt_read_file(path, &buf, &len, &err), 0, "%s", err.msg);
        fn((const uint8_t *)buf, len);
        free(buf);
        free(path);
        n++;
    }
    closedir(d);
    return n;
}

static void replay(const char *name, harness_fn fn) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fuzz/corpus/%s", name);
    cr_assert_gt(replay_dir(dir, fn), 0, "no seed corpus in %s", dir);
    snprintf(dir, sizeof dir, "tests/fuzz/regressions/%s", name);
    replay_dir(dir, fn);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", fuzz_dir());
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", fuzz_dir());
}

Test(fuzz_regressions, compressed) { replay("compressed", mt_fuzz_compressed); }
Test(fuzz_regressions, config) { replay("config", mt_fuzz_config); }
Test(fuzz_regressions, jinja) { replay("jinja", mt_fuzz_jinja); }
Test(fuzz_regressions, jsonl) { replay("jsonl", mt_fuzz_jsonl); }
Test(fuzz_regressions, metrics) { replay("metrics", mt_fuzz_metrics); }
Test(fuzz_regressions, mtok) { replay("mtok", mt_fuzz_mtok); }
Test(fuzz_regressions, plot) { replay("plot", mt_fuzz_plot); }
Test(fuzz_regressions, safetensors) { replay("safetensors", mt_fuzz_safetensors); }
Test(fuzz_regressions, st_index) { replay("st_index", mt_fuzz_st_index); }
Test(fuzz_regressions, tokenizer) { replay("tokenizer", mt_fuzz_tokenizer); }
Test(fuzz_regressions, trainer_state) { replay("trainer_state", mt_fuzz_trainer_state); }
Test(fuzz_regressions, yaml) { replay("yaml", mt_fuzz_yaml); }
