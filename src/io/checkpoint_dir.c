/* Checkpoint directories: recognising names (step-%08lld, .tmp-step-<n>-<pid>),
 * finding the newest complete checkpoint, pruning, and the directory
 * operations of a save (mkdir -p, fsync, atomic publish, removal). Only
 * directories whose names match those two patterns are ever removed. */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint_internal.h"
#include "io/file.h"
#include "util/mem.h"

/* ---- names -------------------------------------------------------------- */

/* Parses a run of 1..18 decimal digits at *p (advancing it). */
static int parse_digits(const char **p, int64_t *out) {
    const char *s = *p;
    int64_t v = 0;
    int n = 0;
    for (; *s >= '0' && *s <= '9' && n < 18; s++, n++) v = v * 10 + (*s - '0');
    if (n == 0 || (*s >= '0' && *s <= '9')) return 0;
    *p = s;
    *out = v;
    return 1;
}

/* "step-<digits>" exactly. */
static int parse_step_name(const char *name, int64_t *step) {
    if (strncmp(name, "step-", 5) != 0) return 0;
    const char *p = name + 5;
    return parse_digits(&p, step) && *p == '\0';
}

/* ".tmp-step-<digits>-<pid>" exactly. */
static int parse_tmp_name(const char *name, int64_t *pid) {
    if (strncmp(name, ".tmp-step-", 10) != 0) return 0;
    const char *p = name + 10;
    int64_t step;
    if (!parse_digits(&p, &step) || *p++ != '-') return 0;
    return parse_digits(&p, pid) && *p == '\0';
}

static int is_dir(const char *path) { return mt_is_dir(path); }

static int dir_is_empty(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    closedir(d);
    return n == 0;
}

static int has_file(const char *dir, const char *name) {
    char *p = mt_path_join(dir, name);
    int r = mt_file_exists(p);
    free(p);
    return r;
}

/* ---- directory operations ----------------------------------------------- */

int mt_ckpt_publish(const char *tmp, const char *final, mt_error *err) {
    if (mt_rename(tmp, final) == 0) return 0;
    if (errno != ENOTEMPTY && errno != EEXIST)
        return mt_errorf(err, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
    /* The same step saved again (a resumed run): swap, then drop the old. */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
        /* No atomic exchange on this file system: older steps still exist
         * should we crash between these two calls. */
        if (mt_remove_tree(final) != 0 || rename(tmp, final) != 0)
            return mt_errorf(err, "cannot replace %s with %s: %s", final, tmp, strerror(errno));
        return 0;
    }
    mt_remove_tree(tmp);
    return 0;
}

int mt_ckpt_make_tmp(const char *ck, const char *tmp, mt_error *err) {
    if (mt_mkdirs(ck, err)) return -1;
    mt_remove_tree(tmp);  /* left by an earlier failed attempt of this process */
    if (mkdir(tmp, 0755) != 0)
        return mt_errorf(err, "%s: cannot create directory: %s", tmp, strerror(errno));
    return 0;
}

int mt_ckpt_commit(const char *ck, const char *tmp, const char *final, const char *out_dir,
                   int keep_last, mt_error *err) {
    int rc = mt_ckpt_publish(tmp, final, err);
    if (rc == 0) rc = mt_fsync_dir(ck, err);
    /* The new checkpoint is durable; a failed prune only leaves extra
     * directories behind, which the next save retries. */
    if (rc == 0 && mt_checkpoint_prune(out_dir, keep_last, err) != 0)
        fprintf(stderr, "warning: %s\n", err->msg);
    return rc;
}

int mt_ckpt_save_end(int rc, bool remove_tmp, const char *what, int64_t step, char *ck,
                     char *final, char *tmp, char *saved_path, size_t cap, mt_error *err) {
    if (rc != 0 && remove_tmp) mt_remove_tree(tmp);
    if (rc == 0 && saved_path) snprintf(saved_path, cap, "%s", final);
    if (rc != 0)
        mt_error_prefix(err, "saving %s step %lld to %s (earlier checkpoints are untouched): ",
                        what, (long long)step, ck);
    free(ck);
    free(final);
    free(tmp);
    return rc;
}

/* ---- listing ------------------------------------------------------------ */

typedef struct ckpt_list {
    int64_t *steps;   /* (n) complete checkpoints, ascending */
    int n;
    char **stale;     /* (n_stale) .tmp-* directories of processes that are gone */
    int n_stale;
} ckpt_list;

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void push(void **arr, int *n, size_t elem, const void *x) {
    *arr = mt_realloc_or_die(*arr, ((size_t)*n + 1) * elem);
    memcpy((char *)*arr + (size_t)*n * elem, x, elem);
    (*n)++;
}

/* A .tmp directory is stale when its process no longer exists. A reused
 * pid only delays the cleanup; a directory written from another host on a
 * shared file system looks alive or dead by accident, so do not share a
 * checkpoint directory between hosts while they save. */
static int tmp_is_stale(int64_t pid) {
    if (pid <= 0 || pid == (int64_t)getpid()) return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

/* all_tmp: count every .tmp-* directory as stale (the caller holds the run
 * lock, so no other process is saving here). */
static int list_dir(const char *ck, int all_tmp, ckpt_list *out, mt_error *err) {
    memset(out, 0, sizeof *out);
    DIR *d = opendir(ck);
    if (!d) return mt_errorf(err, "%s: cannot list: %s", ck, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step, pid;
        char *p = mt_path_join(ck, e->d_name);
        if (parse_step_name(e->d_name, &step) && is_dir(p)) {
            if (has_file(p, "COMPLETE")) {
                push((void **)&out->steps, &out->n, sizeof step, &step);
            } else if (all_tmp && dir_is_empty(p)) {
                /* What a removal cut short left in older versions (they
                 * removed a checkpoint in place). Nothing is in it. */
                char *q = mt_strdup_or_die(p);
                push((void **)&out->stale, &out->n_stale, sizeof q, &q);
            }
        }
        if (parse_tmp_name(e->d_name, &pid) && is_dir(p) &&
            (all_tmp ? pid != (int64_t)getpid() : tmp_is_stale(pid))) {
            char *q = mt_strdup_or_die(p);
            push((void **)&out->stale, &out->n_stale, sizeof q, &q);
        }
        free(p);
    }
    closedir(d);
    if (out->n) qsort(out->steps, (size_t)out->n, sizeof *out->steps, cmp_i64);
    return 0;
}

static void list_free(ckpt_list *l) {
    for (int i = 0; i < l->n_stale; i++) free(l->stale[i]);
    free(l->stale);
    free(l->steps);
}

char *mt_ckpt_step_path(const char *ck, int64_t step) {
    char name[64];
    snprintf(name, sizeof name, "step-%08lld", (long long)step);
    return mt_path_join(ck, name);
}

char *mt_ckpt_tmp_path(const char *ck, int64_t step) {
    char name[96];
    snprintf(name, sizeof name, ".tmp-step-%08lld-%ld", (long long)step, (long)getpid());
    return mt_path_join(ck, name);
}

/* ---- public ------------------------------------------------------------- */

/* The checkpoints directory a --resume path names (malloc'd), given that
 * path is not a checkpoint itself. */
static char *checkpoints_of(const char *path) {
    char *sub = mt_path_join(path, "checkpoints");
    if (is_dir(sub)) return sub;
    free(sub);
    return mt_strdup_or_die(path);
}

int mt_checkpoint_find_intact(const char *path, char *found, size_t cap, mt_error *err) {
    if (mt_checkpoint_find_latest(path, found, cap, err)) return -1;
    if (mt_checkpoint_verify(found, err) == 0) return 0;
    if (has_file(path, "COMPLETE")) return -1;  /* one checkpoint named: nothing to fall back to */
    fprintf(stderr, "megatrain: warning: %s\n", err->msg);
    char *ck = checkpoints_of(path);
    ckpt_list l;
    int rc = list_dir(ck, 0, &l, err), ok = 0;
    for (int i = l.n - 2; i >= 0 && rc == 0 && !ok; i--) {
        char *p = mt_ckpt_step_path(ck, l.steps[i]);
        mt_error e;
        if (mt_checkpoint_verify(p, &e) == 0) {
            fprintf(stderr, "megatrain: warning: falling back to %s, the newest intact "
                    "checkpoint\n", p);
            snprintf(found, cap, "%s", p);
            ok = 1;
        } else {
            fprintf(stderr, "megatrain: warning: %s\n", e.msg);
        }
        free(p);
    }
    if (rc == 0 && !ok)
        rc = mt_errorf(err, "%s: no intact checkpoint (each is damaged, see the warnings "
                       "above); start afresh without --resume, or restore a copy", ck);
    list_free(&l);
    free(ck);
    return rc;
}

int mt_checkpoint_find_latest(const char *path, char *found, size_t cap, mt_error *err) {
    if (!is_dir(path))
        return mt_errorf(err, "%s: not a directory; --resume takes a checkpoint directory, a "
                         "checkpoints directory or a run's output directory", path);
    if (has_file(path, "COMPLETE") || has_file(path, "trainer_state.json")) {
        if (!has_file(path, "COMPLETE"))
            return mt_errorf(err, "%s: incomplete checkpoint (no COMPLETE marker: its save was "
                             "interrupted); pass its parent directory to pick the newest "
                             "complete one", path);
        snprintf(found, cap, "%s", path);
        return 0;
    }
    char *sub = mt_path_join(path, "checkpoints");
    char *ck = is_dir(sub) ? sub : mt_strdup_or_die(path);
    if (ck != sub) free(sub);
    ckpt_list l;
    int rc = list_dir(ck, 0, &l, err);
    if (rc == 0 && l.n == 0)
        rc = mt_errorf(err, "%s: no complete checkpoint here (looked for step-NNNNNNNN/COMPLETE); "
                       "check the path given to --resume", ck);
    if (rc == 0) {
        char *p = mt_ckpt_step_path(ck, l.steps[l.n - 1]);
        snprintf(found, cap, "%s", p);
        free(p);
    }
    list_free(&l);
    free(ck);
    return rc;
}

/* Removes the stale .tmp-* directories and all complete checkpoints but the
 * newest keep (0: every one), except step `spare`. */
static int prune(const char *out_dir, int keep, int all_tmp, int64_t spare, mt_error *err) {
    char *ck = mt_path_join(out_dir, "checkpoints");
    if (!is_dir(ck)) {
        free(ck);
        return 0;  /* nothing saved yet */
    }
    ckpt_list l;
    int rc = list_dir(ck, all_tmp, &l, err);
    for (int i = 0; i < l.n_stale && rc == 0; i++)
        if (mt_remove_tree(l.stale[i]) != 0)
            rc = mt_errorf(err, "%s: cannot remove stale temporary directory: %s", l.stale[i],
                           strerror(errno));
    /* An old checkpoint is first renamed to a temporary name, then removed:
     * a process killed in the removal leaves a .tmp directory that a later
     * prune removes, never a step directory with part of its files. */
    for (int i = 0; i < l.n - keep && rc == 0; i++) {
        if (l.steps[i] == spare) continue;
        char *p = mt_ckpt_step_path(ck, l.steps[i]), *tmp = mt_ckpt_tmp_path(ck, l.steps[i]);
        if (mt_remove_tree(tmp) != 0 || mt_rename(p, tmp) != 0)
            rc = mt_errorf(err, "%s: cannot remove old checkpoint: %s", p, strerror(errno));
        else if (mt_remove_tree(tmp) != 0)
            rc = mt_errorf(err, "%s: cannot remove old checkpoint (renamed %s): %s", p, tmp,
                           strerror(errno));
        free(tmp);
        free(p);
    }
    if (rc == 0) rc = mt_fsync_dir(ck, err);
    list_free(&l);
    free(ck);
    return rc;
}

int mt_checkpoint_prune(const char *out_dir, int keep_last, mt_error *err) {
    return prune(out_dir, keep_last > 0 ? keep_last : INT_MAX, 0, -1, err);
}

int mt_checkpoint_cleanup(const char *out_dir, int keep_last, int64_t spare_step,
                          mt_error *err) {
    return prune(out_dir, keep_last > 0 ? keep_last : INT_MAX, 1, spare_step, err);
}

int mt_checkpoint_remove_all(const char *out_dir, mt_error *err) {
    return prune(out_dir, 0, 1, -1, err);
}
