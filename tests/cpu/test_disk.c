/* Tests of src/host/disk.{h,c}: blocks written through the disk tier and
 * read back are the same bytes, striped over one and three directories,
 * with many transfers in flight, from two threads at once; a missing
 * directory and a disk too small for the tier are refused by name before
 * anything is written. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/device.h"
#include "host/disk.h"
#include "plan/rates.h"
#include "testlib.h"

static void fill(uint8_t *p, size_t n, unsigned seed) {
    uint32_t x = 2463534242u + seed;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

static void round_trip(const char *dirs) {
    /* sizes around the stripe and the alignment, and an empty block */
    size_t bytes[] = {MT_DISK_STRIPE * 3 + 4096, 100, 0, MT_DISK_STRIPE, 5 * MT_DISK_STRIPE - 8};
    int n = (int)(sizeof bytes / sizeof *bytes);
    mt_disk *d;
    mt_error err;
    cr_assert_eq(mt_disk_open(&d, dirs, bytes, n, &err), 0, "%s", err.msg);
    uint8_t *src[8], *dst[8];
    int t[8];
    for (int i = 0; i < n; i++) {
        size_t b = mt_disk_block_bytes(d, i);
        cr_assert_eq(b % MT_DISK_ALIGN, 0);
        cr_assert(b >= bytes[i]);
        src[i] = mt_disk_buffer(b);
        dst[i] = mt_disk_buffer(b);
        fill(src[i], b, (unsigned)i);
        memset(dst[i], 0, b);
    }
    /* every write in flight at once, then every read */
    for (int i = 0; i < n; i++) cr_assert_geq(t[i] = mt_disk_submit(d, i, src[i], 1, &err), 0);
    for (int i = n - 1; i >= 0; i--) cr_assert_eq(mt_disk_wait(d, t[i], &err), 0, "%s", err.msg);
    for (int i = 0; i < n; i++) cr_assert_geq(t[i] = mt_disk_submit(d, i, dst[i], 0, &err), 0);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(mt_disk_wait(d, t[i], &err), 0, "%s", err.msg);
        cr_assert(!memcmp(src[i], dst[i], mt_disk_block_bytes(d, i)), "%s: block %d differs",
                  dirs, i);
    }
    /* a block rewritten leaves its neighbours as they were */
    fill(src[1], mt_disk_block_bytes(d, 1), 99);
    cr_assert_eq(mt_disk_wait(d, mt_disk_submit(d, 1, src[1], 1, &err), &err), 0, "%s", err.msg);
    for (int i = 0; i < n; i++) {
        memset(dst[i], 0, mt_disk_block_bytes(d, i));
        cr_assert_eq(mt_disk_wait(d, mt_disk_submit(d, i, dst[i], 0, &err), &err), 0);
        cr_assert(!memcmp(src[i], dst[i], mt_disk_block_bytes(d, i)), "block %d", i);
    }
    for (int i = 0; i < n; i++) {
        free(src[i]);
        free(dst[i]);
    }
    mt_disk_close(d);
}

Test(disk, blocks_round_trip_on_one_directory) {
    char *dir = mt_test_tmpdir();
    round_trip(dir);
    mt_test_rmtree(dir);
    free(dir);
}

Test(disk, blocks_round_trip_striped_over_three) {
    char *dir = mt_test_tmpdir(), dirs[1200];
    snprintf(dirs, sizeof dirs, "%s/a,%s/b,%s/c", dir, dir, dir);
    char cmd[1300];
    snprintf(cmd, sizeof cmd, "mkdir -p %s/a %s/b %s/c", dir, dir, dir);
    cr_assert_eq(system(cmd), 0);
    round_trip(dirs);
    /* the files were unlinked: nothing is left in the directories */
    snprintf(cmd, sizeof cmd, "test -z \"$(find %s -type f)\"", dir);
    cr_assert_eq(system(cmd), 0, "the tier left files behind");
    mt_test_rmtree(dir);
    free(dir);
}

/* Two threads move their own blocks through one tier at once, each
 * rewriting and reading back its blocks many times: every read gives the
 * bytes that thread wrote last. */
typedef struct mover {
    mt_disk *d;
    int first;     /* blocks first, first + 2, ... */
    int n, rounds;
    int bad;       /* rounds whose bytes differed or whose transfer failed */
} mover;

static void *move_blocks(void *arg) {
    mover *m = arg;
    mt_error err;
    for (int r = 0; r < m->rounds; r++)
        for (int i = m->first; i < m->n; i += 2) {
            size_t b = mt_disk_block_bytes(m->d, i);
            uint8_t *src = mt_disk_buffer(b), *dst = mt_disk_buffer(b);
            fill(src, b, (unsigned)(100 * r + i));
            memset(dst, 0, b);
            int w = mt_disk_submit(m->d, i, src, 1, &err);
            if (w < 0 || mt_disk_wait(m->d, w, &err)) m->bad++;
            int rd = mt_disk_submit(m->d, i, dst, 0, &err);
            if (rd < 0 || mt_disk_wait(m->d, rd, &err) || memcmp(src, dst, b)) m->bad++;
            free(src);
            free(dst);
        }
    return NULL;
}

Test(disk, two_threads_share_a_tier) {
    char *dir = mt_test_tmpdir();
    size_t bytes[] = {3 * MT_DISK_STRIPE + 4096, MT_DISK_STRIPE, 2 * MT_DISK_STRIPE, 8192};
    mt_disk *d;
    mt_error err;
    cr_assert_eq(mt_disk_open(&d, dir, bytes, 4, &err), 0, "%s", err.msg);
    mover m[2] = {{d, 0, 4, 12, 0}, {d, 1, 4, 12, 0}};
    pthread_t th[2];
    for (int k = 0; k < 2; k++) cr_assert_eq(pthread_create(&th[k], NULL, move_blocks, &m[k]), 0);
    for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
    cr_assert_eq(m[0].bad + m[1].bad, 0, "%d and %d rounds went wrong", m[0].bad, m[1].bad);
    mt_disk_close(d);
    mt_test_rmtree(dir);
    free(dir);
}

Test(disk, a_missing_directory_is_named) {
    size_t bytes[] = {4096};
    mt_disk *d;
    mt_error err;
    cr_assert_eq(mt_disk_open(&d, "/nonexistent/megatrain", bytes, 1, &err), -1);
    cr_assert(strstr(err.msg, "/nonexistent/megatrain"), "%s", err.msg);
}

/* A file-size limit stands in for a full disk: the tier's reservation
 * fails at open, naming the directory and the size. */
Test(disk, a_disk_too_small_is_refused_at_open) {
    char *dir = mt_test_tmpdir();
    pid_t p = fork();
    if (p == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {1 << 20, 1 << 20};
        setrlimit(RLIMIT_FSIZE, &rl);
        size_t bytes[] = {MT_DISK_STRIPE * 4};
        mt_disk *d;
        mt_error err;
        int rc = mt_disk_open(&d, dir, bytes, 1, &err);
        _exit(rc == -1 && strstr(err.msg, dir) && strstr(err.msg, "GB") ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(p, &st, 0), p);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the open must fail naming the directory");
    mt_test_rmtree(dir);
    free(dir);
}

/* The last layers' optimizer state on disk (striped over two directories)
 * trains the same bits as all of it in RAM: the losses, and the optimizer
 * file of the checkpoint, with 3 disk layers (as many as the staging
 * buffers), 2 and 1 (a read ahead of the next step's first disk layer must
 * not overtake its write back); a run resumed with the state on disk
 * continues bit for bit too. */
Test(disk, optimizer_state_on_disk_trains_the_same_bits, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), a[600], b[600], c[600], dirs[1300], cmd[2600];
    snprintf(a, sizeof a, "%s/ram", dir);
    snprintf(b, sizeof b, "%s/disk", dir);
    snprintf(c, sizeof c, "%s/resumed", dir);
    snprintf(dirs, sizeof dirs, "%s/nv1,%s/nv2", dir, dir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/nv1 %s/nv2", dir, dir);
    cr_assert_eq(system(cmd), 0);
    char *ram[] = {"train", "--device", "cpu", "--precision", "fp32", "--steps", "8",
                   "--save-every", "4", "--out", a, NULL};
    char *disk[] = {"train", "--device", "cpu", "--precision", "fp32", "--steps", "8",
                    "--save-every", "4", "--out", b, "--nvme-dir", dirs, "--disk-layers", "3",
                    NULL};
    cr_assert_eq(mt_test_cli(ram), 0);
    cr_assert_eq(mt_test_cli(disk), 0);
    snprintf(cmd, sizeof cmd, "cmp %s/checkpoints/step-00000008/optimizer.safetensors "
             "%s/checkpoints/step-00000008/optimizer.safetensors && cmp %s/model/model.safetensors "
             "%s/model/model.safetensors", a, b, a, b);
    cr_assert_eq(system(cmd), 0, "the state on disk must give the RAM run's bits");
    for (int n = 1; n <= 2; n++) {
        char layers[8], out[640];
        snprintf(layers, sizeof layers, "%d", n);
        snprintf(out, sizeof out, "%s-%d", b, n);
        char *fewer[] = {"train", "--device", "cpu", "--precision", "fp32", "--steps", "8",
                         "--save-every", "4", "--out", out, "--nvme-dir", dirs, "--disk-layers",
                         layers, NULL};
        cr_assert_eq(mt_test_cli(fewer), 0);
        snprintf(cmd, sizeof cmd, "cmp %s/model/model.safetensors %s/model/model.safetensors",
                 a, out);
        cr_assert_eq(system(cmd), 0, "%d disk layers must give the RAM run's bits", n);
    }
    /* resume from step 4 with the state on disk: the same end */
    snprintf(cmd, sizeof cmd, "mkdir -p %s/checkpoints && cp -r %s/checkpoints/step-00000004 "
             "%s/checkpoints/", c, a, c);
    cr_assert_eq(system(cmd), 0);
    char *resumed[] = {"train", "--device", "cpu", "--precision", "fp32", "--steps", "8",
                       "--save-every", "4", "--out", c, "--nvme-dir", dirs, "--disk-layers", "3",
                       "--resume", "auto", NULL};
    cr_assert_eq(mt_test_cli(resumed), 0);
    snprintf(cmd, sizeof cmd, "cmp %s/checkpoints/step-00000008/optimizer.safetensors "
             "%s/checkpoints/step-00000008/optimizer.safetensors", a, c);
    cr_assert_eq(system(cmd), 0, "a resume with the state on disk continues bit for bit");
    snprintf(cmd, sizeof cmd, "test -z \"$(find %s/nv1 %s/nv2 -type f)\"", dir, dir);
    cr_assert_eq(system(cmd), 0, "the disk tier left files behind");
    mt_test_rmtree(dir);
    free(dir);
}

/* megatrain calibrate --nvme-dir measures the disk (here without a GPU in a
 * CPU build, or beside it) and records the rates the planner reads. */
Test(disk, calibrate_measures_the_disk_tier, .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), out[600];
    snprintf(out, sizeof out, "%s/rates.json", dir);
    char *argv[] = {"calibrate", "--nvme-dir", dir, "--disk-gb", "0.3", "--out", out, NULL};
    if (mt_device_count() > 0) { /* a GPU here: its probe runs too, which this test skips */
        mt_test_rmtree(dir);
        free(dir);
        return;
    }
    cr_assert_eq(mt_test_cli(argv), 0);
    mt_rates r;
    mt_error err;
    cr_assert_eq(mt_rates_load(&r, out, &err), 0, "%s", err.msg);
    cr_assert(r.disk_write_gbs > 0 && r.disk_read_gbs > 0 && r.disk_both_gbs > 0,
              "write %g read %g both %g", r.disk_write_gbs, r.disk_read_gbs, r.disk_both_gbs);
    mt_test_rmtree(dir);
    free(dir);
}
