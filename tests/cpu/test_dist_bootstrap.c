/* Tests of src/dist/bootstrap.{h,c}: tables of launcher environments and
 * what each gives, a rank or an error naming the variable at fault. */
#include <criterion/criterion.h>
#include <string.h>

#include "dist/bootstrap.h"

#define MAX_VARS 12

/* One environment: name/value pairs, unused slots NULL. */
typedef struct env_case {
    const char *vars[MAX_VARS][2];
    /* expected on success */
    int rank, world, local, port;
    const char *addr, *source;
    double timeout;
    /* expected on failure: substrings of the message (the variable, the fix) */
    const char *err1, *err2;
} env_case;

static const char *table_get(void *ctx, const char *name) {
    const env_case *c = ctx;
    for (int i = 0; i < MAX_VARS && c->vars[i][0]; i++)
        if (!strcmp(c->vars[i][0], name)) return c->vars[i][1];
    return NULL;
}

static void run_case(int i, const env_case *c) {
    mt_dist_env env;
    mt_error err = {{0}};
    int rc = mt_dist_bootstrap(&env, table_get, (void *)c, &err);
    if (c->err1) {
        cr_assert_eq(rc, -1, "case %d: accepted, expected an error with '%s'", i, c->err1);
        cr_assert(strstr(err.msg, c->err1), "case %d: '%s' lacks '%s'", i, err.msg, c->err1);
        if (c->err2)
            cr_assert(strstr(err.msg, c->err2), "case %d: '%s' lacks '%s'", i, err.msg, c->err2);
        return;
    }
    cr_assert_eq(rc, 0, "case %d: %s", i, err.msg);
    cr_assert_eq(env.rank, c->rank, "case %d", i);
    cr_assert_eq(env.world_size, c->world, "case %d", i);
    cr_assert_eq(env.local_rank, c->local, "case %d", i);
    cr_assert_eq(env.master_port, c->port ? c->port : MT_DIST_DEFAULT_PORT, "case %d", i);
    cr_assert_str_eq(env.master_addr, c->addr ? c->addr : "", "case %d", i);
    cr_assert_str_eq(env.source, c->source, "case %d", i);
    cr_assert_eq(env.timeout_s, c->timeout ? c->timeout : MT_DIST_DEFAULT_TIMEOUT_S, "case %d", i);
}

#define TORCH(r, w, l) {"RANK", r}, {"WORLD_SIZE", w}, {"LOCAL_RANK", l}
#define MASTER {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29400"}

Test(dist_bootstrap, launchers) {
    static const env_case cases[] = {
        /* nothing: a run of one */
        {.rank = 0, .world = 1, .source = "single process"},
        {{{"MASTER_ADDR", "h"}}, .world = 1, .source = "single process"},
        /* torchrun */
        {{TORCH("3", "4", "1"), MASTER}, .rank = 3, .world = 4, .local = 1, .port = 29400,
         .addr = "10.0.0.1", .source = "torchrun"},
        {{TORCH("0", "1", "0")}, .world = 1, .source = "torchrun"},
        {{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "node-a.example"}},
         .rank = 1, .world = 2, .addr = "node-a.example", .source = "torchrun"},
        {{TORCH("1", "2", "1"), MASTER, {"MT_DIST_TIMEOUT", "2.5"}}, .rank = 1, .world = 2,
         .local = 1, .port = 29400, .addr = "10.0.0.1", .source = "torchrun", .timeout = 2.5},
        /* Open MPI */
        {{{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, MASTER},
         .rank = 5, .world = 8, .local = 1, .port = 29400, .addr = "10.0.0.1",
         .source = "Open MPI"},
        /* Slurm */
        {{{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_LOCALID", "0"},
          {"MASTER_ADDR", "n1"}},
         .rank = 2, .world = 3, .addr = "n1", .source = "Slurm"},
        {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}},
         .world = 1, .source = "Slurm"},
        /* torchrun inside a Slurm allocation: torchrun's variables win */
        {{TORCH("1", "4", "1"), {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, MASTER},
         .rank = 1, .world = 4, .local = 1, .port = 29400, .addr = "10.0.0.1",
         .source = "torchrun"},
        /* mpirun of torch-style scripts: OMPI before Slurm */
        {{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "1"}, MASTER},
         .rank = 1, .world = 2, .port = 29400, .addr = "10.0.0.1", .source = "Open MPI"},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) run_case(i, &cases[i]);
}

Test(dist_bootstrap, errors) {
    static const env_case cases[] = {
        {{TORCH("2", "2", "0"), MASTER}, .err1 = "RANK=2 is not below WORLD_SIZE=2",
         .err2 = "0 to 1"},
        {{TORCH("x1", "2", "0"), MASTER}, .err1 = "RANK='x1' is not a whole number"},
        {{TORCH("-1", "2", "0"), MASTER}, .err1 = "RANK='-1'"},
        {{TORCH("1", "2.0", "0"), MASTER}, .err1 = "WORLD_SIZE='2.0'"},
        {{TORCH("0", "0", "0"), MASTER}, .err1 = "WORLD_SIZE=0 is out of range"},
        {{TORCH("0", "99999999999999999999", "0"), MASTER}, .err1 = "WORLD_SIZE=9999",
         .err2 = "out of range"},
        {{TORCH("", "2", "0"), MASTER}, .err1 = "RANK is set but empty"},
        {{TORCH("1", "2", "2"), MASTER}, .err1 = "LOCAL_RANK=2 is not below WORLD_SIZE=2"},
        {{TORCH("1", "2", " 1"), MASTER}, .err1 = "LOCAL_RANK=' 1'"},
        {{{"RANK", "1"}, MASTER}, .err1 = "RANK=1 is set but WORLD_SIZE is not"},
        {{{"WORLD_SIZE", "2"}, MASTER}, .err1 = "WORLD_SIZE=2 is set but RANK is not"},
        {{TORCH("1", "2", "1")}, .err1 = "MASTER_ADDR is not set", .err2 = "127.0.0.1"},
        {{TORCH("1", "2", "1"), {"MASTER_ADDR", ""}}, .err1 = "MASTER_ADDR is empty"},
        {{TORCH("1", "2", "1"), {"MASTER_ADDR", "h"}, {"MASTER_PORT", "0"}},
         .err1 = "MASTER_PORT=0 is out of range (1 to 65535)"},
        {{TORCH("1", "2", "1"), {"MASTER_ADDR", "h"}, {"MASTER_PORT", "65536"}},
         .err1 = "MASTER_PORT=65536"},
        {{TORCH("1", "2", "1"), {"MASTER_ADDR", "h"}, {"MASTER_PORT", "http"}},
         .err1 = "MASTER_PORT='http' is not a whole number", .err2 = "free TCP port"},
        {{TORCH("1", "2", "1"), MASTER, {"MT_DIST_TIMEOUT", "0"}}, .err1 = "MT_DIST_TIMEOUT='0'"},
        {{TORCH("1", "2", "1"), MASTER, {"MT_DIST_TIMEOUT", "5s"}}, .err1 = "MT_DIST_TIMEOUT='5s'"},
        {{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "2"}, MASTER},
         .err1 = "OMPI_COMM_WORLD_RANK=3 is not below OMPI_COMM_WORLD_SIZE=2"},
        {{{"OMPI_COMM_WORLD_RANK", "1"}, MASTER}, .err1 = "OMPI_COMM_WORLD_SIZE is not"},
        {{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}, .err1 = "Slurm starts 2 ranks",
         .err2 = "MASTER_ADDR is not set"},
        {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "x"}, MASTER},
         .err1 = "SLURM_LOCALID='x'"},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) run_case(i, &cases[i]);
}
