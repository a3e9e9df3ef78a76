/* The run directory: one writer at a time (the run lock), and what a killed
 * run left behind is cleaned when the next one starts. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "train/train_config.h"
#include "train/trainer.h"
#include "io/checkpoint.h"
#include "io/file.h"
#include "io/run_lock.h"
#include "util/fault.h"
#include "testlib.h"

static void config(mt_train_config *tc, const char *out, const char *extra) {
    mt_error err;
    cr_assert_eq(mt_test_train_args(tc, &err, "train --out %s --sample-tokens 0 "
                                    "--log-every 1000 %s", out, extra), 0, "%s", err.msg);
}

/* Entries of dir whose names start with prefix. */
static int count_entries(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    cr_assert(d, "cannot list %s", dir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

/* A run of 3 steps under dir/run that saved every step (3 checkpoints);
 * out and ck receive the run and checkpoint directories. */
static void three_checkpoints(const char *dir, char *out, size_t outcap, char *ck, size_t ckcap) {
    snprintf(out, outcap, "%s/run", dir);
    snprintf(ck, ckcap, "%s/checkpoints", out);
    mt_train_config tc;
    mt_error err;
    config(&tc, out, "--steps 3 --save-every 1 --keep-last 5");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    cr_assert_eq(count_entries(ck, "step-"), 3);
}

Test(run_dir, a_second_run_on_a_locked_out_is_refused_naming_the_pid,
     .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512];
    snprintf(out, sizeof out, "%s/run", dir);
    int go[2], done[2];
    cr_assert_eq(pipe(go), 0);
    cr_assert_eq(pipe(done), 0);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) { /* the other run: holds the lock until killed or the test ends */
        close(go[0]);
        close(done[1]);
        mt_run_lock l;
        mt_error err;
        char c = mt_run_lock_acquire(&l, out, "megatrain train", &err) == 0 ? 'y' : 'n';
        if (write(go[1], &c, 1) != 1 || read(done[0], &c, 1) < 0) _exit(1);
        _exit(0);
    }
    close(go[1]);
    close(done[0]);  /* our end of done closes when this test exits, whatever happens */
    char c = 0;
    cr_assert_eq(read(go[0], &c, 1), 1);
    cr_assert_eq(c, 'y');
    mt_train_config tc;
    mt_error err;
    config(&tc, out, "--steps 2 --save-every 1");
    cr_assert_eq(mt_train(&tc, &err), -1, "a run on a locked directory must be refused");
    char want[64];
    snprintf(want, sizeof want, "process %ld (megatrain train)", (long)pid);
    cr_assert(strstr(err.msg, want) && strstr(err.msg, out), "%s", err.msg);
    cr_assert(strstr(err.msg, "--out"), "the message says what to do: %s", err.msg);
    /* nothing of the refused run was written */
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", out);
    cr_assert_eq(access(metrics, F_OK), -1);
    /* a lock whose holder died (kill -9) never blocks */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    /* and in one process, a second acquire is refused while the first holds */
    mt_run_lock a, b;
    cr_assert_eq(mt_run_lock_acquire(&a, out, "test", &err), 0, "%s", err.msg);
    cr_assert_eq(mt_run_lock_acquire(&b, out, "test", &err), -1);
    mt_run_lock_release(&a);
    cr_assert_eq(mt_run_lock_acquire(&b, out, "test", &err), 0, "%s", err.msg);
    mt_run_lock_release(&b);
    mt_test_rmtree(dir);
    free(dir);
}

/* A save killed between publishing step-N and pruning leaves keep_last + 1
 * checkpoints; one killed while writing leaves .tmp-step-*; a pid that was
 * reused keeps such a directory looking alive. The next run removes all. */
Test(run_dir, a_run_starts_by_removing_what_a_killed_run_left, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512], ck[600], tmp[700];
    three_checkpoints(dir, out, sizeof out, ck, sizeof ck);
    mt_train_config tc;
    mt_error err;
    /* a save in progress of a process that exists (our parent) */
    snprintf(tmp, sizeof tmp, "%s/.tmp-step-00000004-%ld", ck, (long)getppid());
    cr_assert_eq(mkdir(tmp, 0755), 0);
    config(&tc, out, "--steps 3 --save-every 0 --keep-last 2 --resume auto");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    cr_assert_eq(count_entries(ck, "step-"), 2, "keep_last 2 holds at the start of a run");
    cr_assert_eq(count_entries(ck, ".tmp-"), 0, "temporary saves are removed");
    /* the checkpoint resumed from is kept even when it is not among the newest */
    char old[700];
    snprintf(old, sizeof old, "%s/step-00000002", ck);
    config(&tc, out, "--steps 3 --save-every 0 --keep-last 1");
    snprintf(tc.resume, sizeof tc.resume, "%s", old);
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    cr_assert_eq(access(old, F_OK), 0, "%s was removed", old);
    mt_test_rmtree(dir);
    free(dir);
}

/* Step directories under ck that are not a whole checkpoint: no COMPLETE
 * marker, or files that fail their checksums or are missing. */
static int count_broken(const char *ck) {
    DIR *d = opendir(ck);
    cr_assert(d, "cannot list %s", ck);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "step-", 5) != 0) continue;
        char p[1024];
        mt_error err;
        snprintf(p, sizeof p, "%s/%s", ck, e->d_name);
        n += mt_checkpoint_verify(p, &err) != 0;
    }
    closedir(d);
    return n;
}

/* Found by the 30-minute soak (docs/reliability.md): a run killed while it
 * removed a checkpoint beyond keep_last left that step directory with part
 * of its files, which no later run removed (it was not a complete
 * checkpoint, nor a temporary one): three checkpoints where keep_last was 2.
 * Here a child process's removal stops after its first file (the injected
 * fault stands for the kill): every step directory left must still be a
 * whole checkpoint, and the next run's start removes what is left. An
 * empty step directory, as older versions left, goes too. */
Test(run_dir, a_removal_cut_short_leaves_no_incomplete_checkpoint, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512], ck[600], legacy[700];
    three_checkpoints(dir, out, sizeof out, ck, sizeof ck);
    mt_train_config tc;
    mt_error err;
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) {
        mt_fault_arm(MT_FAULT_REMOVE, 2); /* the first file goes, then the removal stops */
        mt_error e2;
        int rc = mt_checkpoint_prune(out, 1, &e2);
        _exit(rc != 0 && strstr(e2.msg, "cannot remove old checkpoint") ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the cut removal reports an error");
    cr_assert_eq(count_broken(ck), 0, "a step directory was left with part of its files");
    cr_assert_eq(count_entries(ck, ".tmp-"), 1, "the cut removal's directory is a temporary one");
    snprintf(legacy, sizeof legacy, "%s/step-00000000", ck);
    cr_assert_eq(mkdir(legacy, 0755), 0);
    config(&tc, out, "--steps 3 --save-every 0 --keep-last 2 --resume auto");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    cr_assert_eq(count_entries(ck, ".tmp-"), 0, "the next run removes the cut removal's rest");
    cr_assert_eq(count_entries(ck, "step-"), 2, "keep_last 2 holds");
    cr_assert_eq(count_broken(ck), 0, "the empty step directory is removed");
    mt_test_rmtree(dir);
    free(dir);
}

/* The steps of out/metrics.jsonl's rows in order, as "1,2,3". */
static void metrics_steps(const char *out, char *buf, size_t cap) {
    char path[700], line[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    cr_assert(f, "cannot open %s", path);
    buf[0] = 0;
    long long step;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "{\"step\":%lld,", &step) == 1) {
            size_t n = strlen(buf);
            snprintf(buf + n, cap - n, "%s%lld", n ? "," : "", step);
        }
    fclose(f);
}

static int exists_in(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* Issue 29: a new run in an --out that held a run truncated its metrics,
 * lost its own checkpoints to the old run's under --keep-last, and a later
 * --resume auto continued the old run (metrics steps 1,2,3,4,21,22...).
 * Refused now unless resumed or overwritten; overwritten, nothing of the
 * old run is left to prune against, resume or plot. */
Test(run_dir, a_new_run_in_an_out_that_holds_a_run_needs_resume_or_overwrite,
     .timeout = MT_TEST_LIMIT(120)) {
    char *dir = mt_test_tmpdir(), out[512], ck[600], tb[600], steps[256];
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    snprintf(tb, sizeof tb, "%s/tensorboard", out);
    mt_train_config tc;
    mt_error err;
    config(&tc, out, "--steps 8 --save-every 3");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    cr_assert(exists_in(ck, "step-00000006") && exists_in(ck, "step-00000008"));

    config(&tc, out, "--steps 4 --save-every 3");
    cr_assert_eq(mt_train(&tc, &err), -1, "a new run over an earlier one must be refused");
    cr_assert(strstr(err.msg, out) && strstr(err.msg, "--resume auto") &&
              strstr(err.msg, "--overwrite") && strstr(err.msg, "metrics.jsonl"), "%s", err.msg);
    metrics_steps(out, steps, sizeof steps);
    cr_assert_str_eq(steps, "1,2,3,4,5,6,7,8", "the refused run touched the metrics");
    cr_assert(exists_in(ck, "step-00000006") && exists_in(ck, "step-00000008"));

    config(&tc, out, "--steps 4 --save-every 3 --overwrite");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    metrics_steps(out, steps, sizeof steps);
    cr_assert_str_eq(steps, "1,2,3,4");
    cr_assert_eq(count_entries(ck, "step-"), 2, "only the new run's checkpoints");
    cr_assert(exists_in(ck, "step-00000003") && exists_in(ck, "step-00000004"));
    cr_assert_eq(count_entries(tb, "events.out.tfevents."), 1, "only the new run's events");
    char yaml[700], *text;
    size_t n;
    snprintf(yaml, sizeof yaml, "%s/config.yaml", out);
    cr_assert_eq(mt_read_file(yaml, &text, &n, &err), 0, "%s", err.msg);
    cr_assert(strstr(text, "\noverwrite: false"), "a run repeated from config.yaml would "
              "delete this one:\n%s", text);
    free(text);

    config(&tc, out, "--steps 6 --save-every 3 --resume auto");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    metrics_steps(out, steps, sizeof steps);
    cr_assert_str_eq(steps, "1,2,3,4,5,6", "resume auto continues the new run");

    char *argv[] = {"train", "--out", out, "--resume", "auto", "--overwrite"};
    cr_assert_eq(mt_train_config_parse_args(&tc, 6, argv, &err), -1);
    cr_assert(strstr(err.msg, "overwrite") && strstr(err.msg, "resume"), "%s", err.msg);
    mt_test_rmtree(dir);
    free(dir);
}

/* --overwrite deletes model/ and checkpoints/: a model read from them would
 * be gone when the run saves its own (the tokenizer is copied at the end). */
Test(run_dir, overwrite_refuses_inputs_inside_what_it_deletes, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512], model[600];
    snprintf(out, sizeof out, "%s/run", dir);
    snprintf(model, sizeof model, "%s/model", out);
    mt_train_config tc;
    mt_error err;
    config(&tc, out, "--steps 2 --save-every 0");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    config(&tc, out, "--steps 2 --save-every 0 --overwrite --tokenizer bytes");
    snprintf(tc.model, sizeof tc.model, "%s", model);
    cr_assert_eq(mt_train(&tc, &err), -1);
    cr_assert(strstr(err.msg, model) && strstr(err.msg, "--overwrite"), "%s", err.msg);
    cr_assert(exists_in(model, "model.safetensors"), "the refused run deleted its input");
    mt_test_rmtree(dir);
    free(dir);
}

static char warnings[2048];

static void keep_warnings(const mt_event *ev, void *user) {
    if (ev->kind == MT_EVENT_WARNING)
        strncat(warnings, ev->text, sizeof warnings - strlen(warnings) - 1);
}

/* --resume auto in an out whose run saved no checkpoint starts again from
 * step 0 (a run killed before its first save is resumed so): said, since
 * the metrics there start again too. */
Test(run_dir, resume_auto_without_a_checkpoint_says_it_starts_again, .timeout = MT_TEST_LIMIT(60)) {
    char *dir = mt_test_tmpdir(), out[512];
    snprintf(out, sizeof out, "%s/run", dir);
    mt_train_config tc;
    mt_error err;
    config(&tc, out, "--steps 2 --save-every 0");
    cr_assert_eq(mt_train(&tc, &err), 0, "%s", err.msg);
    config(&tc, out, "--steps 2 --save-every 0 --resume auto");
    mt_events ev = {.fn = keep_warnings};
    mt_run *R = mt_trainer_open(&tc, &ev, &err);
    cr_assert(R, "%s", err.msg);
    cr_assert(strstr(warnings, "no checkpoint") && strstr(warnings, "step 0"), "'%s'", warnings);
    mt_trainer_close(R);
    mt_test_rmtree(dir);
    free(dir);
}
