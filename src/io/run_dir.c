/* A run's outputs in its out directory: telling whether a run is there, and
 * removing it for a run that replaces it; see run_dir.h. */
#include "io/run_dir.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/file.h"
#include "util/mem.h"

/* What a run writes into out, checkpoints first: the order of removal. */
static const struct {
    const char *name;
    int dir;
} outputs[] = {
    {"checkpoints", 1}, {"tensorboard", 1}, {"metrics.jsonl", 0}, {"config.yaml", 0},
    {"model", 1},
};
#define N_OUTPUTS (sizeof outputs / sizeof *outputs)

static int exists(const char *dir, const char *name) {
    char *p = mt_path_join(dir, name);
    struct stat st;
    int r = lstat(p, &st) == 0;
    free(p);
    return r;
}

/* Appends "name" (with "/" for a directory) to a ", "-separated list. */
static void list_add(char *buf, size_t cap, size_t i) {
    size_t n = strlen(buf);
    snprintf(buf + n, cap - n, "%s%s%s", n ? ", " : "", outputs[i].name,
             outputs[i].dir ? "/" : "");
}

int mt_run_dir_check_new(const char *out_dir, mt_error *err) {
    char found[256] = "";
    for (size_t i = 0; i < N_OUTPUTS; i++)
        if (exists(out_dir, outputs[i].name)) list_add(found, sizeof found, i);
    if (!found[0]) return 0;
    return mt_errorf(err, "%s already holds a run (%s): continue it with --resume auto (or "
                     "--resume CHECKPOINT_DIR), or start over with --overwrite, which deletes "
                     "its checkpoints, metrics, TensorBoard files and model; or pass another "
                     "--out", out_dir, found);
}

int mt_run_dir_check_input(const char *out_dir, const char *what, const char *path,
                           mt_error *err) {
    char in[PATH_MAX], out[PATH_MAX];
    if (!path[0] || !realpath(path, in)) return 0;
    for (size_t i = 0; i < N_OUTPUTS; i++) {
        char *p = mt_path_join(out_dir, outputs[i].name);
        int inside = 0;
        if (realpath(p, out)) {
            size_t n = strlen(out);
            inside = !strncmp(in, out, n) && (in[n] == '/' || in[n] == 0);
        }
        free(p);
        if (inside)
            return mt_errorf(err, "%s %s lies in %s/%s, which --overwrite deletes; copy it "
                             "elsewhere first, or pass another --out", what, path, out_dir,
                             outputs[i].name);
    }
    return 0;
}

/* The TensorBoard event files of tensorboard/, then the folder if empty. */
static int remove_events(const char *dir, mt_error *err) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : mt_errorf(err, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0) continue;
        char *p = mt_path_join(dir, e->d_name);
        if (unlink(p) != 0 && errno != ENOENT)
            rc = mt_errorf(err, "%s: cannot remove: %s", p, strerror(errno));
        free(p);
    }
    closedir(d);
    if (rc == 0) rmdir(dir); /* kept when something else is in it */
    return rc;
}

int mt_run_dir_clear(const char *out_dir, char *removed, size_t cap, mt_error *err) {
    removed[0] = 0;
    int rc = 0;
    for (size_t i = 0; i < N_OUTPUTS && rc == 0; i++) {
        if (!exists(out_dir, outputs[i].name)) continue;
        list_add(removed, cap, i);
        char *p = mt_path_join(out_dir, outputs[i].name);
        if (!strcmp(outputs[i].name, "checkpoints")) {
            rc = mt_checkpoint_remove_all(out_dir, err);
            if (rc == 0) rmdir(p); /* kept when something else is in it */
        } else if (!strcmp(outputs[i].name, "tensorboard")) {
            rc = remove_events(p, err);
        } else if (mt_remove_tree(p) != 0) {
            rc = mt_errorf(err, "%s: cannot remove: %s", p, strerror(errno));
        }
        free(p);
    }
    if (rc == 0 && removed[0]) rc = mt_fsync_dir(out_dir, err);
    return rc ? mt_error_prefix(err, "--overwrite: ") : 0;
}
