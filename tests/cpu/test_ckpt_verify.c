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
#include "testlib.h"

static void config(mt_train_config *tc, const char *out, const char *extra) {
    char buf[2048];
    snprintf(buf, sizeof buf, "train --out %s --sample-tokens 0 --log-every 1000 --save-dtype fp32 %s",
             out, extra);
    char *argv[64];
    int argc = 0;
    for (char *tok = strtok(buf, " "); tok && argc < 63; tok = strtok(NULL, " ")) argv[argc++] = tok;
    mt_error err;
    cr_assert_eq(mt_train_config_parse_args(tc, argc, argv, &err), 0, "%s", err.msg);
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

Test(ckpt_verify, a_flipped_byte_in_any_file_is_named_on_load, .timeout = 60) {
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
Test(ckpt_verify, resume_auto_falls_back_to_the_previous_intact_checkpoint, .timeout = 120) {
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
