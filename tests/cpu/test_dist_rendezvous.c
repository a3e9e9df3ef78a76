/* Tests of src/dist/rendezvous.{h,c} with real processes on 127.0.0.1:
 * forked ranks meet on a free port, receive rank 0's blob and run the
 * control collectives; a mismatched option, a missing peer, an absent rank
 * 0, a rank given twice and a peer that dies are each a clear error on
 * every rank still there, within the (short) timeout. */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dist/rendezvous.h"
#include "io/file.h"
#include "testlib.h"

static char *tmp;
static void setup(void) { tmp = mt_test_tmpdir(); }
static void teardown(void) {
    mt_test_rmtree(tmp);
    free(tmp);
}

/* A TCP port free on 127.0.0.1 a moment ago. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static mt_dist_env env_of(int rank, int world, int port, double timeout) {
    mt_dist_env e = {.rank = rank, .world_size = world, .master_port = port,
                     .timeout_s = timeout, .source = "test"};
    snprintf(e.master_addr, sizeof e.master_addr, "127.0.0.1");
    return e;
}

static void blob_of(unsigned char *b) {
    for (int i = 0; i < MT_RDV_BLOB_BYTES; i++) b[i] = (unsigned char)(i * 37 + 11);
}

/* What a rank does; returns its exit status (0: as expected). */
typedef int (*rank_fn)(int rank, int world, int port, void *ctx, mt_error *err);

/* Writes rank r's message to tmp/rank<r>.txt for the parent to read. */
static void save_msg(int rank, const char *msg) {
    char name[32];
    snprintf(name, sizeof name, "rank%d.txt", rank);
    char *path = mt_path_join(tmp, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(msg, f);
        fclose(f);
    }
    free(path);
}

static char *read_msg(int rank) {
    char name[32];
    snprintf(name, sizeof name, "rank%d.txt", rank);
    char *path = mt_path_join(tmp, name), *text = NULL;
    size_t len;
    mt_error err;
    if (mt_read_file(path, &text, &len, &err)) text = strdup("(no message)");
    free(path);
    return text;
}

/* Forks one process per entry of ranks (rank numbers, world size world),
 * waits for all, and asserts each exited 0. Returns the seconds taken. */
static double run_ranks(const int *ranks, int n, int world, int port, rank_fn fn, void *ctx) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid[8];
    for (int i = 0; i < n; i++) {
        pid[i] = fork();
        cr_assert(pid[i] >= 0);
        if (pid[i] == 0) {
            mt_error err = {{0}};
            int rc = fn(ranks[i], world, port, ctx, &err);
            save_msg(ranks[i], err.msg);
            _exit(rc);
        }
    }
    for (int i = 0; i < n; i++) {
        int st;
        cr_assert_eq(waitpid(pid[i], &st, 0), pid[i]);
        char *msg = read_msg(ranks[i]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d failed (status %d): %s",
                  ranks[i], st, msg);
        free(msg);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
}

static const char *CONFIG = "model=tiny\nlr=0.001\nseq_len=64\n";

/* ---- success ----------------------------------------------------------- */

static int meet_and_talk(int rank, int world, int port, void *ctx, mt_error *err) {
    mt_dist_env e = env_of(rank, world, port, 20.0);
    unsigned char blob[MT_RDV_BLOB_BYTES], want[MT_RDV_BLOB_BYTES];
    blob_of(want);
    if (rank == 0) memcpy(blob, want, sizeof blob);
    mt_rdv g;
    if (mt_rdv_open(&g, &e, CONFIG, rank == 0 ? blob : NULL, err)) return 1;
    if (memcmp(g.blob, want, sizeof want)) return mt_errorf(err, "blob differs"), 2;
    double x = 0.5 + rank;
    if (mt_rdv_sum(&g, &x, err)) return 3;
    double expect = 0;
    for (int r = 0; r < world; r++) expect += 0.5 + r;
    if (x != expect) return mt_errorf(err, "sum %g, expected %g", x, expect), 4;
    int mine = 100 + rank, all[8];
    if (mt_rdv_gather(&g, &mine, sizeof mine, all, err)) return 5;
    if (rank == 0)
        for (int r = 0; r < world; r++)
            if (all[r] != 100 + r) return mt_errorf(err, "gather[%d] = %d", r, all[r]), 6;
    char word[8] = "";
    if (rank == 0) snprintf(word, sizeof word, "hello");
    if (mt_rdv_bcast(&g, word, sizeof word, err)) return 7;
    if (strcmp(word, "hello")) return mt_errorf(err, "broadcast gave '%s'", word), 8;
    if (mt_rdv_barrier(&g, err)) return 9;
    int every[8] = {0};
    if (mt_rdv_allgather(&g, &mine, sizeof mine, every, err)) return 10;
    for (int r = 0; r < world; r++)
        if (every[r] != 100 + r) return mt_errorf(err, "allgather[%d] = %d", r, every[r]), 11;
    /* elementwise sums, in rank order: 0.1 + 0.2 + 0.3 ... rounded as rank 0 adds them */
    double d[3] = {rank, 0.1 * (rank + 1), -rank};
    float f[3] = {(float)rank, 0.1f * (float)(rank + 1), 1e-8f};
    if (mt_rdv_sum_n(&g, d, 3, err) || mt_rdv_sum_f32(&g, f, 3, err)) return 12;
    double dw[3] = {0, 0.1, 0};
    float fw[3] = {0, 0.1f, 1e-8f};
    for (int r = 1; r < world; r++) {
        dw[0] += r, dw[1] += 0.1 * (r + 1), dw[2] += -r;
        fw[0] += (float)r, fw[1] += 0.1f * (float)(r + 1), fw[2] += 1e-8f;
    }
    for (int i = 0; i < 3; i++)
        if (d[i] != dw[i] || f[i] != fw[i])
            return mt_errorf(err, "sum %d: %.17g %.9g, expected %.17g %.9g", i, d[i], f[i], dw[i],
                             fw[i]), 13;
    mt_rdv_close(&g);
    return 0;
}

Test(dist_rendezvous, two_ranks_meet, .init = setup, .fini = teardown) {
    int ranks[] = {0, 1};
    run_ranks(ranks, 2, 2, free_port(), meet_and_talk, NULL);
}

Test(dist_rendezvous, four_ranks_any_start_order, .init = setup, .fini = teardown) {
    int ranks[] = {3, 1, 2, 0};  /* rank 0 last: the others retry until it listens */
    run_ranks(ranks, 4, 4, free_port(), meet_and_talk, NULL);
}

Test(dist_rendezvous, run_of_one) {
    mt_dist_env e = {.rank = 0, .world_size = 1, .timeout_s = 1};
    mt_rdv g;
    mt_error err;
    cr_assert_eq(mt_rdv_open(&g, &e, CONFIG, NULL, &err), 0);
    double x = 2.5;
    cr_assert_eq(mt_rdv_sum(&g, &x, &err), 0);
    cr_assert_eq(x, 2.5);
    cr_assert_eq(mt_rdv_barrier(&g, &err), 0);
    mt_rdv_close(&g);
}

/* ---- failures: each rank checks its own message ------------------------ */

typedef struct expect {
    double timeout;
    const char *config[8];      /* per rank; NULL: CONFIG */
    int claim[8];               /* rank a process says it is; -1: its own */
    const char *msg[8][2];      /* substrings its error must hold */
    int die_after_open[8];      /* exits right after the rendezvous */
} expect;

static int fail_as_expected(int rank, int world, int port, void *ctx, mt_error *err) {
    const expect *x = ctx;
    int idx = rank;
    if (x->claim[idx] >= 0) rank = x->claim[idx];
    mt_dist_env e = env_of(rank, world, port, x->timeout);
    unsigned char blob[MT_RDV_BLOB_BYTES];
    blob_of(blob);
    mt_rdv g;
    int rc = mt_rdv_open(&g, &e, x->config[idx] ? x->config[idx] : CONFIG, blob, err);
    if (rc == 0 && x->die_after_open[idx]) _exit(0);  /* closes its socket: it "died" */
    if (rc == 0) {
        double s = 1;
        rc = mt_rdv_sum(&g, &s, err);
        mt_rdv_close(&g);
    }
    if (rc == 0) return mt_errorf(err, "process %d: no error", idx), 1;
    for (int k = 0; k < 2; k++)
        if (x->msg[idx][k] && !strstr(err->msg, x->msg[idx][k])) {
            char m[1024];
            snprintf(m, sizeof m, "%s", err->msg);
            return mt_errorf(err, "lacks '%s': %s", x->msg[idx][k], m), 2;
        }
    return 0;
}

/* Ranks 0..n-1 each run fail_as_expected (its index picks its row of x). */
static double run_expect(int n, int world, expect *x) {
    int ranks[8];
    for (int i = 0; i < n; i++) ranks[i] = i;
    return run_ranks(ranks, n, world, free_port(), fail_as_expected, x);
}

Test(dist_rendezvous, mismatched_option_named, .init = setup, .fini = teardown) {
    expect x = {.timeout = 10, .claim = {-1, -1},
                .config = {NULL, "model=tiny\nlr=0.002\nseq_len=64\n"},
                .msg = {{"option 'lr' is '0.001' on rank 0 but '0.002' on rank 1",
                         "same options"},
                        {"rank 0 stopped the run", "option 'lr' is '0.001' on rank 0"}}};
    run_expect(2, 2, &x);
}

Test(dist_rendezvous, missing_option_named, .init = setup, .fini = teardown) {
    expect x = {.timeout = 10, .claim = {-1, -1},
                .config = {NULL, "model=tiny\nlr=0.001\n"},
                .msg = {{"at option 3", "'seq_len=64' on rank 0, '(none)' on rank 1"},
                        {"rank 0 stopped the run", "at option 3"}}};
    run_expect(2, 2, &x);
}

/* Timeouts here are 0.5 s; the runs must end well within 10 s. */
Test(dist_rendezvous, missing_peer_times_out, .init = setup, .fini = teardown) {
    expect x = {.timeout = 0.5, .claim = {-1, -1},
                .msg = {{"1 of 3 ranks did not connect", "missing: rank 2"},
                        {"rank 0 stopped the run", "missing: rank 2"}}};
    double s = run_expect(2, 3, &x);
    cr_assert(s < 10, "took %g s", s);
}

Test(dist_rendezvous, absent_rank0_times_out, .init = setup, .fini = teardown) {
    expect x = {.timeout = 0.5, .claim = {1},
                .msg = {{"rank 1: could not reach rank 0 at 127.0.0.1:", "MT_DIST_TIMEOUT"}}};
    double s = run_expect(1, 2, &x);
    cr_assert(s < 10, "took %g s", s);
}

Test(dist_rendezvous, rank_given_twice, .init = setup, .fini = teardown) {
    expect x = {.timeout = 5, .claim = {-1, 1, 1},
                .msg = {{"two processes say they are rank 1", "its own RANK"},
                        {"rank 0 stopped the run"}, {"rank 0 stopped the run"}}};
    run_expect(3, 3, &x);
}

Test(dist_rendezvous, dead_peer_is_named, .init = setup, .fini = teardown) {
    expect x = {.timeout = 5, .claim = {-1, -1}, .die_after_open = {0, 1},
                .msg = {{"rank 0: rank 1 closed its connection while gathering", "stopped"}}};
    /* process 1 exits 0 right after meeting; process 0 must report it */
    run_expect(2, 2, &x);
}

Test(dist_rendezvous, unreachable_rank0_within_timeout) {
    /* 192.0.2.1 is TEST-NET-1 (RFC 5737), routed nowhere: a blocking
     * connect would wait for the kernel's SYN retries (minutes) */
    mt_dist_env e = env_of(1, 2, 29500, 0.5);
    snprintf(e.master_addr, sizeof e.master_addr, "192.0.2.1");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    mt_rdv g;
    mt_error err;
    cr_assert_eq(mt_rdv_open(&g, &e, CONFIG, NULL, &err), -1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    cr_assert(strstr(err.msg, "could not reach rank 0 at 192.0.2.1:29500 within 0.5 s"), "%s",
              err.msg);
    cr_assert(s < 5, "took %g s", s);
}

Test(dist_rendezvous, unknown_host_named) {
    mt_dist_env e = env_of(1, 2, 29500, 0.5);
    snprintf(e.master_addr, sizeof e.master_addr, "no-such-host.invalid");
    mt_rdv g;
    mt_error err;
    cr_assert_eq(mt_rdv_open(&g, &e, CONFIG, NULL, &err), -1);
    cr_assert(strstr(err.msg, "no-such-host.invalid"), "%s", err.msg);
}
