/* Verified checkpoints: every file's XXH3 checksum is in COMPLETE and
 * checked on load; --resume auto falls back past a damaged checkpoint. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/train_config.h"
#include "train/trainer.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "train/runner.h"
#include "testlib.h"

static void config(mt_train_config *tc, const char *out, const char *extra) {
    mt_error err;
    cr_assert_eq(mt_test_train_args(tc, &err, "train --out %s --sample-tokens 0 --log-every 1000 "
                                    "--save-dtype fp32 %s", out, extra), 0, "%s", err.msg);
}

/* Flips one bit of the byte at the middle of path: same size, other content. */
static void flip_middle_byte(const char *path) {
    int fd = open(path, O_RDWR);
    cr_assert(fd >= 0, "%s", path);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    unsigned char c;
    off_t at = st.st_size / 2;
    cr_assert_eq(pread(fd, &c, 1, at), 1);
    c ^= 0x10;
    cr_assert_eq(pwrite(fd, &c, 1, at), 1);
    close(fd);
}

static void copy_tree(const char *from, const char *to) {
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", from, to);
    cr_assert_eq(system(cmd), 0);
}

Test(ckpt_verify, a_flipped_byte_in_any_file_is_named_on_load, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512], ck[700], copy[700];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_train_config tc;
    mt_error err;
    config(&tc, out, "--steps 2 --save-every 2");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(ck, sizeof ck, "%s/checkpoints/step-00000002", out);
    const char *files[] = {"config.json", "model.safetensors", "optimizer.safetensors",
                           "trainer_state.json"};
    for (int i = 0; i < 4; i++) {
        snprintf(copy, sizeof copy, "%s/copy%d", dir, i);
        copy_tree(ck, copy);
        char *p = mt_path_join(copy, files[i]);
        flip_middle_byte(p);
        cr_assert_eq(mt_checkpoint_verify(copy, &err), -1, "%s: a flipped byte passed", p);
        cr_assert(strstr(err.msg, p) && strstr(err.msg, "checksum"), "%s", err.msg);
        free(p);
    }
    cr_assert_eq(mt_checkpoint_verify(ck, &err), 0, "%s", err.msg);
    mt_test_rmtree(dir);
    free(dir);
}

/* b is a's run, then it loses its end and its step-4 checkpoint to a
 * flipped byte: resume auto goes back to step 2 and ends bitwise where the
 * uninterrupted run a ended. */
Test(ckpt_verify, resume_auto_falls_back_to_the_previous_intact_checkpoint,
     .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), a[512], b[512], path[1200], pa[1200];
    snprintf(a, sizeof a, "%s/a", dir);
    snprintf(b, sizeof b, "%s/b", dir);
    mt_train_config tc;
    mt_error err;
    config(&tc, a, "--steps 6 --save-every 2 --keep-last 3");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    config(&tc, b, "--steps 6 --save-every 2 --keep-last 3");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "rm -r %s/checkpoints/step-00000006 %s/model", b, b);
    cr_assert_eq(system(path), 0);
    snprintf(path, sizeof path, "%s/checkpoints/step-00000004/optimizer.safetensors", b);
    flip_middle_byte(path);
    config(&tc, b, "--steps 6 --save-every 2 --keep-last 3 --resume auto");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model/model.safetensors", b);
    snprintf(pa, sizeof pa, "%s/model/model.safetensors", a);
    char *x, *y;
    size_t nx, ny;
    cr_assert_eq(mt_read_file(pa, &x, &nx, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_read_file(path, &y, &ny, &err), 0, "%s", err.msg);
    cr_assert(nx == ny && memcmp(x, y, nx) == 0, "the fallback did not continue the same run");
    free(x);
    free(y);
    /* a named checkpoint that is damaged is an error, not a silent fallback */
    snprintf(path, sizeof path, "%s/checkpoints/step-00000006/model.safetensors", b);
    flip_middle_byte(path);
    config(&tc, b, "--steps 8 --save-every 2");
    snprintf(tc.resume, sizeof tc.resume, "%s/checkpoints/step-00000006", b);
    cr_assert_eq(mt_train(&tc, &err), -1);
    cr_assert(strstr(err.msg, "model.safetensors") && strstr(err.msg, "checksum"), "%s", err.msg);
    mt_test_rmtree(dir);
    free(dir);
}

/* What fn(arg) writes to stderr (the checkpoint code's warnings), into buf. */
static int capture_stderr(int (*fn)(const char *), const char *arg, char *buf, size_t cap) {
    fflush(stderr);
    char path[] = "/tmp/megatrain-stderr-XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    cr_assert(fd >= 0 && saved >= 0);
    dup2(fd, 2);
    int rc = fn(arg);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    close(fd);
    unlink(path);
    return rc;
}

static char load_msg[1024];

/* Opens dir as eval and generate do (tokenizer bytes); the error in load_msg. */
static int load_model(const char *dir) {
    mt_loaded_model m;
    mt_error err;
    int rc = mt_loaded_model_open(&m, dir, "bytes", &err);
    snprintf(load_msg, sizeof load_msg, "%s", rc ? err.msg : "");
    if (rc == 0) mt_loaded_model_close(&m);
    return rc;
}

static char eval_data[600];

static int cli_eval(const char *model) {
    char *argv[] = {"eval", "--model", (char *)model, "--tokenizer", "bytes", "--data", eval_data,
                    "--seq-len", "16", "--batch-size", "2", "--max-batches", "2", "--device",
                    "cpu", NULL};
    return mt_test_cli(argv);
}

static int cli_generate(const char *model) {
    char *argv[] = {"generate", "--model", (char *)model, "--tokenizer", "bytes", "--prompt",
                    "The", "--max-new-tokens", "4", "--temperature", "0", "--device", "cpu",
                    "--no-bos", NULL};
    return mt_test_cli(argv);
}

/* Issue 29: eval and generate read a resume checkpoint as a model without
 * its checksums: one flipped exponent bit gave loss 4.2e35 and exit 0. Now
 * each file a model load reads is checked against COMPLETE, and a COMPLETE
 * without checksums (an older megatrain's) is loaded with a warning. */
Test(ckpt_verify, eval_and_generate_verify_a_checkpoint_they_load, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), out[512], ck[700], copy[700], path[1200];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_train_config tc;
    mt_error err;
    config(&tc, out, "--steps 2 --save-every 2");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    snprintf(ck, sizeof ck, "%s/checkpoints/step-00000002", out);
    snprintf(eval_data, sizeof eval_data, "%s/eval.jsonl", dir);
    FILE *f = fopen(eval_data, "w");
    for (int i = 0; i < 8; i++) fprintf(f, "{\"text\": \"The old man went to the sea, day %d.\"}\n", i);
    fclose(f);
    cr_assert_eq(load_model(ck), 0, "%s", load_msg);
    cr_assert_eq(cli_eval(ck), 0);
    cr_assert_eq(cli_generate(ck), 0);
    const char *files[] = {"model.safetensors", "config.json"};
    for (int i = 0; i < 2; i++) {
        snprintf(copy, sizeof copy, "%s/flipped%d", dir, i);
        copy_tree(ck, copy);
        snprintf(path, sizeof path, "%s/%s", copy, files[i]);
        flip_middle_byte(path);
        cr_assert_eq(load_model(copy), -1, "%s: a flipped byte was loaded", path);
        cr_assert(strstr(load_msg, path) && strstr(load_msg, "checksum"), "%s", load_msg);
        cr_assert_neq(cli_eval(copy), 0, "eval of %s exited 0", path);
        cr_assert_neq(cli_generate(copy), 0, "generate of %s exited 0", path);
    }
    /* the optimizer state is not read by a model load: not its business */
    snprintf(copy, sizeof copy, "%s/flipped-optimizer", dir);
    copy_tree(ck, copy);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", copy);
    flip_middle_byte(path);
    cr_assert_eq(load_model(copy), 0, "%s", load_msg);
    /* COMPLETE without checksums: loaded on its sizes, with a warning */
    snprintf(copy, sizeof copy, "%s/no-sums", dir);
    copy_tree(ck, copy);
    snprintf(path, sizeof path, "python3 -c \"import json,sys; p=sys.argv[1]; j=json.load(open(p)); "
             "del j['xxh3_64']; json.dump(j, open(p, 'w'))\" %s/COMPLETE", copy);
    cr_assert_eq(system(path), 0);
    char warn[2048];
    cr_assert_eq(capture_stderr(load_model, copy, warn, sizeof warn), 0, "%s", load_msg);
    cr_assert(strstr(warn, "COMPLETE") && strstr(warn, "no checksums"), "no warning: '%s'", warn);
    mt_test_rmtree(dir);
    free(dir);
}
