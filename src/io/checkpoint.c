/* Resume checkpoints: save (temporary directory, fsync, rename, prune).
 * Loading and verifying live in checkpoint_load.c; directory listing,
 * search and pruning in checkpoint_dir.c. */
#include "io/checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/checkpoint_internal.h"
#include "io/checksum.h"
#include "io/ckpt_disk.h"
#include "io/file.h"
#include "io/model_io.h"
#include "host/disk_state.h"
#include "io/safetensors.h"
#include "util/mem.h"


/* ---- small file helpers ------------------------------------------------- */

int mt_ckpt_write_text(const char *dir, const char *name, const char *text, mt_error *err) {
    char *path = mt_path_join(dir, name);
    mt_atomic_file af;
    int rc = mt_atomic_open(&af, path, err);
    if (rc == 0) {
        rc = mt_write_all(af.fd, text, strlen(text), path, err);
        if (rc) mt_atomic_abort(&af);
        else rc = mt_atomic_commit(&af, err);
    }
    free(path);
    return rc;
}

static int run_hook(const mt_checkpoint_opts *o, const char *tmp, const char *file,
                    mt_error *err) {
    if (!o->hook || o->hook(o->hook_ctx, tmp, file, err) == 0) return 0;
    return mt_error_prefix(err, "%s/%s: save hook: ", tmp, file);
}

/* ---- tensors ------------------------------------------------------------ */


/* One safetensors tensor per table entry, reading array (w, m or v) in
 * place: F32 needs no conversion, so the writer streams straight from the
 * store. names: storage for prefixed names, (n, 128) chars. */
static void tensor_list(const mt_param_table *t, const float *array, const char *prefix,
                        char (*names)[128], mt_st_write_tensor *out) {
    int i = 0;
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        for (int k = 0; k < ld->n_tensors; k++, i++) {
            const mt_tensor_desc *td = &ld->tensors[k];
            snprintf(names[i], sizeof names[i], "%s%s", prefix, td->name);
            out[i] = (mt_st_write_tensor){.name = names[i], .dtype = MT_DTYPE_F32,
                                          .ndim = td->ndim, .f32 = array + ld->offset + td->offset};
            out[i].shape[0] = td->shape[0];
            out[i].shape[1] = td->shape[1];
        }
    }
}

/* One safetensors file of a save: what a writer thread needs. */
typedef struct st_job {
    const char *tmp, *file;
    const mt_st_write_tensor *t;
    int n;
    const mt_checkpoint_opts *opts;
    int rc;
    mt_error err;
} st_job;

static void *st_job_run(void *arg) {
    st_job *j = arg;
    char *path = mt_path_join(j->tmp, j->file);
    mt_st_kv meta[] = {{"format", "pt"}};
    j->rc = mt_st_write(path, j->t, j->n, meta, 1, &j->err);
    if (j->rc == 0) j->rc = run_hook(j->opts, j->tmp, j->file, &j->err);
    free(path);
    return NULL;
}

/* m's and v's tensors of the layers on disk (entries 0..n-1 are m's, n..2n-1
 * v's, as tensor_list made them) fill themselves from the disk: the
 * optimizer file lists a layer's tensors together (m's, then v's), so each
 * layer's block is read twice. */
static mt_ckpt_disk *disk_sources(const mt_host_store *s, mt_st_write_tensor *mv, int n) {
    const mt_param_table *t = s->table;
    mt_ckpt_disk *c = mt_ckpt_disk_new(s->disk, 2 * n, 0);
    int i = 0;
    for (int l = 0; l < t->n_layers; l++)
        for (int k = 0; k < t->layers[l].n_tensors; k++, i++) {
            if (!mt_disk_state_on_disk(s->disk, l)) continue;
            for (int a = 0; a < 2; a++)
                mt_ckpt_disk_source(c, &mv[a * n + i], l, MT_CKPT_M + a,
                                    t->layers[l].tensors[k].offset);
        }
    return c;
}

/* Writes model.safetensors (w) and optimizer.safetensors (m, v), on two
 * threads when asked: the optimizer file is twice the size, so the pair
 * overlaps the weights' write and fsync with the larger one. The state on
 * disk is read through a cache of its own for each file. */
static int write_tensors(const char *tmp, const mt_host_store *s, const mt_checkpoint_opts *o,
                         mt_error *err) {
    const mt_param_table *t = s->table;
    int n = mt_ckpt_count_tensors(t);
    char (*names)[128] = mt_calloc_or_die(3 * (size_t)n + 1, sizeof *names);
    mt_st_write_tensor *wt = mt_calloc_or_die(3 * (size_t)n + 1, sizeof *wt);
    /* the weights under their published names (an HF model directory);
     * the optimizer's state under the table's */
    void *fused;
    mt_ckpt_disk *wsrc = mt_disk_state_weight_layers(s->disk) ? mt_ckpt_disk_new(s->disk, n, 1)
                                                              : NULL;
    int n_w = mt_model_write_list(t, s->w, MT_DTYPE_F32, wsrc, wt, &fused);
    tensor_list(t, s->m, "exp_avg.", names + n, wt + n);
    tensor_list(t, s->v, "exp_avg_sq.", names + 2 * n, wt + 2 * n);
    mt_ckpt_disk *src = s->disk ? disk_sources(s, wt + n, n) : NULL;
    st_job jobs[2] = {{.tmp = tmp, .file = "model.safetensors", .t = wt, .n = n_w, .opts = o},
                      {.tmp = tmp, .file = "optimizer.safetensors", .t = wt + n, .n = 2 * n,
                       .opts = o}};
    pthread_t th;
    int threaded = o->parallel && pthread_create(&th, NULL, st_job_run, &jobs[1]) == 0;
    st_job_run(&jobs[0]);
    if (threaded) pthread_join(th, NULL);
    else if (jobs[0].rc == 0) st_job_run(&jobs[1]);
    int rc = 0;
    for (int i = 0; i < 2 && rc == 0; i++)
        if (jobs[i].rc) {
            *err = jobs[i].err;
            rc = -1;
        }
    free(names);
    free(wt);
    free(fused);
    mt_ckpt_disk_free(src);
    mt_ckpt_disk_free(wsrc);
    return rc;
}

/* ---- trainer state ------------------------------------------------------ */


int mt_ckpt_check_state_json(const char *state_json, mt_error *err) {
    cJSON *j = cJSON_ParseWithOpts(state_json ? state_json : "", NULL, 1);
    int ok = j && cJSON_IsObject(j);
    cJSON_Delete(j);
    if (ok) return 0;
    return mt_errorf(err, "trainer state must be one JSON object (got %.60s%s); this is a bug "
                     "in the caller", state_json ? state_json : "NULL",
                     state_json && strlen(state_json) > 60 ? "..." : "");
}

int mt_ckpt_write_state(const char *tmp, int64_t step, const char *state_json, mt_error *err) {
    char prefix[256];
    mt_ckpt_state_prefix(prefix, sizeof prefix, step);
    size_t n = strlen(prefix) + strlen(state_json) + sizeof STATE_SUFFIX;
    char *text = mt_malloc_or_die(n);
    snprintf(text, n, "%s%s%s", prefix, state_json, STATE_SUFFIX);
    int rc = mt_ckpt_write_text(tmp, "trainer_state.json", text, err);
    free(text);
    return rc;
}

mt_ckpt_complete mt_ckpt_complete_begin(int64_t step, int ranks) {
    mt_ckpt_complete mk = {cJSON_CreateObject(), NULL, NULL};
    cJSON_AddStringToObject(mk.root, "format", MT_CHECKPOINT_FORMAT);
    cJSON_AddNumberToObject(mk.root, "step", (double)step);
    if (ranks > 0) cJSON_AddNumberToObject(mk.root, "ranks", ranks);
    mk.files = cJSON_AddObjectToObject(mk.root, "files");
    mk.sums = cJSON_AddObjectToObject(mk.root, "xxh3_64");
    return mk;
}

int mt_ckpt_complete_write(mt_ckpt_complete *mk, const char *dir, int rc, mt_error *err) {
    char *text = cJSON_Print(mk->root);
    cJSON_Delete(mk->root);
    *mk = (mt_ckpt_complete){0};
    MT_ASSERT(text);
    if (rc == 0) rc = mt_ckpt_write_text(dir, "COMPLETE", text, err);
    free(text);
    return rc;
}

int mt_ckpt_record_file(const char *dir, const char *name, cJSON *files, cJSON *sums,
                        mt_error *err) {
    char *path = mt_path_join(dir, name), hex[17];
    uint64_t h;
    int64_t n;
    int rc = mt_file_xxh3(path, &h, &n, err);
    if (rc == 0) {
        mt_xxh3_hex(h, hex);
        cJSON_AddNumberToObject(files, name, (double)n);
        cJSON_AddStringToObject(sums, name, hex);
    }
    free(path);
    return rc;
}

/* COMPLETE: {"step": n, "files": {name: bytes, ...}, "xxh3_64": {name: hex}}.
 * The sizes and checksums let a load notice a file truncated, replaced or
 * corrupted after the save. Hashing re-reads the files just written, from
 * the page cache. */
static int write_complete(const char *tmp, int64_t step, mt_error *err) {
    mt_ckpt_complete mk = mt_ckpt_complete_begin(step, 0);
    int rc = 0;
    for (int i = 0; i < N_CKPT_FILES && rc == 0; i++)
        rc = mt_ckpt_record_file(tmp, mt_ckpt_file(i), mk.files, mk.sums, err);
    return mt_ckpt_complete_write(&mk, tmp, rc, err);
}

/* ---- save --------------------------------------------------------------- */

/* Everything inside the temporary directory, each file synced. */
static int write_all_files(const char *tmp, int64_t step, const mt_host_store *s,
                           const mt_config *cfg, const char *state_json,
                           const mt_checkpoint_opts *o, mt_error *err) {
    char *cfg_json = mt_config_to_json(cfg);
    int rc = mt_ckpt_write_text(tmp, "config.json", cfg_json, err);
    free(cfg_json);
    if (rc == 0) rc = run_hook(o, tmp, "config.json", err);
    if (rc == 0) rc = write_tensors(tmp, s, o, err);
    if (rc == 0) rc = mt_ckpt_write_state(tmp, step, state_json, err);
    if (rc == 0) rc = run_hook(o, tmp, "trainer_state.json", err);
    if (rc == 0) rc = write_complete(tmp, step, err);
    if (rc == 0) rc = mt_fsync_dir(tmp, err);
    return rc;
}

int mt_checkpoint_save_opts(const char *out_dir, int64_t step, const mt_host_store *s,
                            const mt_config *cfg, const char *state_json,
                            const mt_checkpoint_opts *o, char *saved_path, size_t cap,
                            mt_error *err) {
    if (step < 0) return mt_errorf(err, "checkpoint step %lld is negative", (long long)step);
    if (mt_ckpt_check_state_json(state_json, err)) return -1;
    char *ck = mt_path_join(out_dir, "checkpoints");
    char *final = mt_ckpt_step_path(ck, step), *tmp = mt_ckpt_tmp_path(ck, step);
    int rc = mt_ckpt_make_tmp(ck, tmp, err);
    int made_tmp = rc == 0;
    if (rc == 0) rc = write_all_files(tmp, step, s, cfg, state_json, o, err);
    if (rc == 0) rc = mt_ckpt_commit(ck, tmp, final, out_dir, o->keep_last, err);
    return mt_ckpt_save_end(rc, made_tmp, "checkpoint", step, ck, final, tmp, saved_path, cap,
                            err);
}

int mt_checkpoint_save(const char *out_dir, int64_t step, const mt_host_store *s,
                       const mt_config *cfg, const char *state_json, int keep_last,
                       char *saved_path, size_t cap, mt_error *err) {
    mt_checkpoint_opts o = {.keep_last = keep_last, .parallel = 1};
    return mt_checkpoint_save_opts(out_dir, step, s, cfg, state_json, &o, saved_path, cap, err);
}
