/* Tests of src/dist/shard_ckpt.{h,c}: two forked ranks (meeting over TCP on
 * 127.0.0.1) train two sharded optimizer steps, summing the gradient norm
 * over the ranks, and save one sharded checkpoint; it then loads on 1, 2
 * and 3 ranks (re-sharded) and equals, bit for bit, the one-process store
 * after the same two steps, and a further step from the 3-rank load equals
 * the one-process third step. Plus the errors: a rank whose write fails
 * (every rank fails, nothing is left behind), a corrupt shard, another
 * model, a one-process checkpoint. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dist/shard_ckpt.h"
#include "dist/shard_optim.h"
#include "host/store.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "util/fault.h"
#include "testlib.h"

static char *tmp;
static void setup(void) { tmp = mt_test_tmpdir(); }
static void teardown(void) {
    mt_test_rmtree(tmp);
    free(tmp);
}

static const char *STATE = "{\"step\": 2, \"rng\": \"18446744073709551557\"}";

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void make_opt(mt_optimizer *o) {
    mt_error err;
    memset(o, 0, sizeof *o);
    MT_ASSERT(mt_optim_cpu_init(&o->cpu, 1, &err) == 0);
    o->sched = mt_lr_schedule_make(MT_LR_LINEAR, 1e-3, 1, 10);
    o->beta1 = 0.9;
    o->beta2 = 0.95;
    o->eps = 1e-8;
    o->weight_decay = 0.1;
    o->max_grad_norm = 1.0f;
}

/* The full starting state and the gradient of step k, the same in every
 * process (no OpenMP: the ranks are forked). */
static void fill_start(const mt_param_table *t, float *w, float *m, float *v) {
    mt_test_fill_uniform(w, t->total, 1, -1.0f, 1.0f);
    mt_test_fill_uniform(m, t->total, 2, -0.1f, 0.1f);
    mt_test_fill_uniform(v, t->total, 3, 0.0f, 0.01f);
}
static void fill_grad(const mt_param_table *t, float *g, int k) {
    memset(g, 0, t->total * sizeof(float));
    for (int l = 0; l < t->n_layers; l++)
        for (int i = 0; i < t->layers[l].n_tensors; i++) {
            const mt_tensor_desc *td = &t->layers[l].tensors[i];
            mt_test_fill_uniform(g + t->layers[l].offset + td->offset, td->numel,
                                 (unsigned long long)(k * 1000 + l * 16 + i), -1.0f, 1.0f);
        }
}

typedef struct rank_job {
    int port, world;
    int fail_rank;   /* this rank's writes fail (file size limit); -1: none */
    long rename_fault;  /* rank 0's n-th rename fails (util/fault.h); 0: none */
} rank_job;

/* One rank: meet, two sharded steps with the norm summed over the ranks,
 * save step 2. Exit status 0 when it went as the job expects. */
static int rank_main(int rank, const rank_job *job, char *msg, size_t cap) {
    mt_error err = {{0}};
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_param_table t;
    MT_ASSERT(mt_params_init(&t, &cfg, &err) == 0);
    mt_dist_env env = {.rank = rank, .world_size = job->world, .master_port = job->port,
                       .timeout_s = 20, .source = "test"};
    snprintf(env.master_addr, sizeof env.master_addr, "127.0.0.1");
    mt_rdv g;
    if (mt_rdv_open(&g, &env, "model=tiny\n", NULL, &err)) return snprintf(msg, cap, "%s", err.msg), 1;
    mt_shard_store s;
    MT_ASSERT(mt_shard_store_init(&s, &t, rank, job->world, 1, &err) == 0);
    float *full = malloc(4 * t.total * sizeof(float));
    fill_start(&t, full, full + t.total, full + 2 * t.total);
    mt_shard_take(&s.layout, full, s.w);
    mt_shard_take(&s.layout, full + t.total, s.m);
    mt_shard_take(&s.layout, full + 2 * t.total, s.v);
    mt_optimizer o;
    make_opt(&o);
    for (int k = 0; k < 2; k++) {
        fill_grad(&t, full + 3 * t.total, k);
        mt_shard_take(&s.layout, full + 3 * t.total, s.g);
        double sumsq = mt_shard_optim_sumsq(&o, &s, s.g);
        if (mt_rdv_sum(&g, &sumsq, &err)) return snprintf(msg, cap, "%s", err.msg), 2;
        mt_shard_optim_apply(&o, &s, s.g, sumsq, NULL);
    }
    if (rank == job->fail_rank) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {.rlim_cur = 4096, .rlim_max = 4096};
        setrlimit(RLIMIT_FSIZE, &rl);
    }
    if (rank == 0 && job->rename_fault) mt_fault_arm(MT_FAULT_RENAME, job->rename_fault);
    char saved[1024] = "";
    int rc = mt_shard_ckpt_save(&g, tmp, 2, &s, &cfg, rank == 0 ? STATE : NULL, 3, saved,
                                sizeof saved, &err);
    snprintf(msg, cap, "%s", rc ? err.msg : saved);
    mt_rdv_close(&g);
    free(full);
    mt_shard_store_free(&s);
    mt_params_free(&t);
    int expect_fail = job->fail_rank >= 0 || job->rename_fault;
    return expect_fail ? (rc == 0 ? 3 : 0) : (rc ? 4 : 0);
}

/* Forks the ranks of job; asserts each exited 0; their messages into msgs. */
static void run_ranks(const rank_job *job, char msgs[][1200]) {
    pid_t pid[4];
    int pipes[4][2];
    for (int r = 0; r < job->world; r++) {
        cr_assert_eq(pipe(pipes[r]), 0);
        pid[r] = fork();
        cr_assert(pid[r] >= 0);
        if (pid[r] == 0) {
            char msg[1200] = "";
            int rc = rank_main(r, job, msg, sizeof msg);
            if (write(pipes[r][1], msg, strlen(msg) + 1) < 0) rc = 9;
            _exit(rc);
        }
        close(pipes[r][1]);
    }
    for (int r = 0; r < job->world; r++) {
        ssize_t n = read(pipes[r][0], msgs[r], 1199);
        msgs[r][n > 0 ? n : 0] = 0;
        close(pipes[r][0]);
        int st;
        cr_assert_eq(waitpid(pid[r], &st, 0), pid[r]);
        cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d: status %d: %s", r, st,
                  msgs[r]);
    }
}

/* The one-process reference after `steps` steps. */
static void reference(const mt_param_table *t, mt_host_store *ref, int steps) {
    mt_error err;
    cr_assert_eq(mt_host_store_init(ref, t, &err), 0, "%s", err.msg);
    fill_start(t, ref->w, ref->m, ref->v);
    mt_optimizer o;
    make_opt(&o);
    for (int k = 0; k < steps; k++) {
        fill_grad(t, ref->g, k);
        mt_optimizer_step(&o, ref, NULL);
    }
}

/* Loads dir on `ranks` ranks, puts the shards side by side, compares with ref. */
static void load_and_compare(const char *dir, const mt_config *cfg, const mt_param_table *t,
                             const mt_host_store *ref, int ranks) {
    float *got = malloc(3 * t->total * sizeof(float));
    memset(got, 0xFF, 3 * t->total * sizeof(float));
    for (int r = 0; r < ranks; r++) {
        mt_shard_store s;
        mt_error err;
        char *state = NULL;
        cr_assert_eq(mt_shard_store_init(&s, t, r, ranks, 0, &err), 0, "%s", err.msg);
        cr_assert_eq(mt_shard_ckpt_load(dir, &s, cfg, &state, &err), 0, "%d ranks: %s", ranks,
                     err.msg);
        cr_assert_str_eq(state, STATE);
        mt_shard_put(&s.layout, s.w, got);
        mt_shard_put(&s.layout, s.m, got + t->total);
        mt_shard_put(&s.layout, s.v, got + 2 * t->total);
        free(state);
        mt_shard_store_free(&s);
    }
    /* every layer's whole range, padding included, came back */
    cr_assert(!memcmp(got, ref->w, t->total * sizeof(float)), "%d ranks: w differs", ranks);
    cr_assert(!memcmp(got + t->total, ref->m, t->total * sizeof(float)), "%d ranks: m", ranks);
    cr_assert(!memcmp(got + 2 * t->total, ref->v, t->total * sizeof(float)), "%d ranks: v",
              ranks);
    free(got);
}

static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d) closedir(d);
    return n;
}

static void save_two_ranks(char *dir, size_t cap) {
    rank_job job = {.port = free_port(), .world = 2, .fail_rank = -1};
    char msgs[2][1200];
    run_ranks(&job, msgs);
    cr_assert_str_eq(msgs[0], msgs[1], "ranks disagree on the saved path");
    snprintf(dir, cap, "%s", msgs[0]);
}

Test(dist_ckpt, two_ranks_save_load_on_1_2_3, .init = setup, .fini = teardown) {
    char dir[1200];
    save_two_ranks(dir, sizeof dir);
    char *ck = mt_path_join(tmp, "checkpoints");
    cr_assert_eq(count_entries(ck, ".tmp"), 0, "a temporary directory was left");
    cr_assert_eq(count_entries(ck, "step-00000002"), 1);
    const char *files[] = {"config.json", "trainer_state.json", "COMPLETE",
                           "shard-00000-of-00002.safetensors", "shard-00001-of-00002.safetensors"};
    for (int i = 0; i < 5; i++) {
        char *p = mt_path_join(dir, files[i]);
        cr_assert(mt_file_exists(p), "%s missing", p);
        free(p);
    }
    cr_assert_eq(count_entries(dir, ""), 5 + 2, "extra files in %s", dir);  /* + . and .. */
    /* the one-process finder and verifier accept the directory */
    char found[1200];
    mt_error err;
    cr_assert_eq(mt_checkpoint_find_latest(tmp, found, sizeof found, &err), 0, "%s", err.msg);
    cr_assert_str_eq(found, dir);

    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_param_table t;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    mt_host_store ref;
    reference(&t, &ref, 2);
    for (int ranks = 1; ranks <= 3; ranks++) load_and_compare(dir, &cfg, &t, &ref, ranks);

    /* resumed on 3 ranks, a third step equals the one-process third step */
    mt_shard_store s[3];
    mt_optimizer o[3];
    double total = 0;
    fill_grad(&t, ref.g, 2);
    for (int r = 0; r < 3; r++) {
        cr_assert_eq(mt_shard_store_init(&s[r], &t, r, 3, 1, &err), 0, "%s", err.msg);
        cr_assert_eq(mt_shard_ckpt_load(dir, &s[r], &cfg, NULL, &err), 0, "%s", err.msg);
        make_opt(&o[r]);
        o[r].step = 2;  /* from the trainer state */
        mt_shard_take(&s[r].layout, ref.g, s[r].g);
        total += mt_shard_optim_sumsq(&o[r], &s[r], s[r].g);
    }
    mt_optimizer one;
    make_opt(&one);
    one.step = 2;
    mt_optimizer_step(&one, &ref, NULL);
    float *got = malloc(t.total * sizeof(float));
    memcpy(got, ref.w, t.total * sizeof(float));
    for (int r = 0; r < 3; r++) {
        mt_shard_optim_apply(&o[r], &s[r], s[r].g, total, NULL);
        mt_shard_put(&s[r].layout, s[r].w, got);
        mt_shard_store_free(&s[r]);
    }
    cr_assert(!memcmp(got, ref.w, t.total * sizeof(float)), "step 3 after the 3-rank resume");
    free(got);
    mt_host_store_free(&ref);
    mt_params_free(&t);
    free(ck);
}

Test(dist_ckpt, failed_rank_fails_every_rank, .init = setup, .fini = teardown) {
    /* rank 1 cannot write more than 4 KiB: its shard fails, so the save
     * fails on both ranks with rank 1's reason, and nothing is left */
    rank_job job = {.port = free_port(), .world = 2, .fail_rank = 1};
    char msgs[2][1200];
    run_ranks(&job, msgs);
    for (int r = 0; r < 2; r++) {
        cr_assert(strstr(msgs[r], "rank 1: "), "rank %d: %s", r, msgs[r]);
        cr_assert(strstr(msgs[r], "shard-00001-of-00002.safetensors"), "rank %d: %s", r, msgs[r]);
        cr_assert(strstr(msgs[r], "earlier checkpoints are untouched"), "rank %d: %s", r,
                  msgs[r]);
    }
    char *ck = mt_path_join(tmp, "checkpoints");
    cr_assert_eq(count_entries(ck, ".tmp"), 0);
    cr_assert_eq(count_entries(ck, "step-"), 0);
    free(ck);
}

Test(dist_ckpt, failed_rank0_fails_every_rank, .init = setup, .fini = teardown) {
    /* rank 0's renames: its shard file (1), config.json, trainer_state.json,
     * COMPLETE, then the directory (5): a failure while writing its files
     * and one while publishing */
    long faults[] = {1, 5};
    const char *where[] = {"shard-00000-of-00002.safetensors: cannot rename", "step-00000002: "};
    for (int i = 0; i < 2; i++) {
        rank_job job = {.port = free_port(), .world = 2, .fail_rank = -1,
                        .rename_fault = faults[i]};
        char msgs[2][1200];
        run_ranks(&job, msgs);
        for (int r = 0; r < 2; r++) {
            cr_assert(strstr(msgs[r], "rank 0: "), "fault %ld rank %d: %s", faults[i], r, msgs[r]);
            cr_assert(strstr(msgs[r], where[i]), "fault %ld rank %d: %s", faults[i], r, msgs[r]);
            cr_assert(strstr(msgs[r], "earlier checkpoints are untouched"), "%s", msgs[r]);
        }
        char *ck = mt_path_join(tmp, "checkpoints");
        cr_assert_eq(count_entries(ck, ".tmp"), 0, "fault %ld", faults[i]);
        cr_assert_eq(count_entries(ck, "step-"), 0, "fault %ld", faults[i]);
        free(ck);
    }
}

Test(dist_ckpt, load_errors, .init = setup, .fini = teardown) {
    char dir[1200];
    save_two_ranks(dir, sizeof dir);
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_param_table t;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    mt_shard_store s;
    cr_assert_eq(mt_shard_store_init(&s, &t, 0, 1, 0, &err), 0, "%s", err.msg);

    /* another model: the field is named */
    mt_config other = cfg;
    other.F = 256;
    mt_param_table t2;
    cr_assert_eq(mt_params_init(&t2, &other, &err), 0, "%s", err.msg);
    mt_shard_store s2;
    cr_assert_eq(mt_shard_store_init(&s2, &t2, 0, 1, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_shard_ckpt_load(dir, &s2, &other, NULL, &err), -1);
    cr_assert(strstr(err.msg, "intermediate_size"), "%s", err.msg);
    mt_shard_store_free(&s2);
    mt_params_free(&t2);

    /* a flipped byte in rank 1's shard: named, with both checksums */
    char *shard = mt_path_join(dir, "shard-00001-of-00002.safetensors");
    FILE *f = fopen(shard, "r+b");
    cr_assert(f);
    fseek(f, -100, SEEK_END);
    int c = fgetc(f);
    fseek(f, -100, SEEK_END);
    fputc(c ^ 0x40, f);
    fclose(f);
    cr_assert_eq(mt_shard_ckpt_load(dir, &s, &cfg, NULL, &err), -1);
    cr_assert(strstr(err.msg, "shard-00001-of-00002.safetensors: corrupt"), "%s", err.msg);
    /* rank 0 of 2 reads only its own shard: still loads */
    mt_shard_store s0;
    cr_assert_eq(mt_shard_store_init(&s0, &t, 0, 2, 0, &err), 0, "%s", err.msg);
    cr_assert_eq(mt_shard_ckpt_load(dir, &s0, &cfg, NULL, &err), 0, "%s", err.msg);
    mt_shard_store_free(&s0);
    free(shard);

    /* a one-process checkpoint */
    mt_host_store one;
    cr_assert_eq(mt_host_store_init(&one, &t, &err), 0, "%s", err.msg);
    char *out1 = mt_path_join(tmp, "one"), saved[1200];
    cr_assert_eq(mt_checkpoint_save(out1, 5, &one, &cfg, "{}", 0, saved, sizeof saved, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(mt_shard_ckpt_load(saved, &s, &cfg, NULL, &err), -1);
    cr_assert(strstr(err.msg, "a checkpoint of one process"), "%s", err.msg);
    free(out1);
    mt_host_store_free(&one);
    mt_shard_store_free(&s);
    mt_params_free(&t);
}
