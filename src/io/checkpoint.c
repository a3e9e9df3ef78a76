/* Resume checkpoints: save (temporary directory, fsync, rename, prune) and
 * load (marker, sizes, config, tensors). Directory listing, search and
 * pruning live in checkpoint_dir.c. */
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
#include "io/file.h"
#include "io/safetensors.h"
#include "util/mem.h"

/* The files of a checkpoint, in the order they are written; COMPLETE last. */
static const char *const ckpt_files[] = {"config.json", "model.safetensors",
                                         "optimizer.safetensors", "trainer_state.json"};
#define N_CKPT_FILES 4

/* ---- small file helpers ------------------------------------------------- */

/* Writes text to dir/name atomically (temp name, fsync, rename). */
static int write_text(const char *dir, const char *name, const char *text, mt_error *err) {
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

static int count_tensors(const mt_param_table *t) {
    int n = 0;
    for (int l = 0; l < t->n_layers; l++) n += t->layers[l].n_tensors;
    return n;
}

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

/* Writes model.safetensors (w) and optimizer.safetensors (m, v), on two
 * threads when asked: the optimizer file is twice the size, so the pair
 * overlaps the weights' write and fsync with the larger one. */
static int write_tensors(const char *tmp, const mt_host_store *s, const mt_checkpoint_opts *o,
                         mt_error *err) {
    const mt_param_table *t = s->table;
    int n = count_tensors(t);
    char (*names)[128] = mt_calloc_or_die(3 * (size_t)n + 1, sizeof *names);
    mt_st_write_tensor *wt = mt_calloc_or_die(3 * (size_t)n + 1, sizeof *wt);
    tensor_list(t, s->w, "", names, wt);
    tensor_list(t, s->m, "exp_avg.", names + n, wt + n);
    tensor_list(t, s->v, "exp_avg_sq.", names + 2 * n, wt + 2 * n);
    st_job jobs[2] = {{.tmp = tmp, .file = "model.safetensors", .t = wt, .n = n, .opts = o},
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
    return rc;
}

/* ---- trainer state ------------------------------------------------------ */

/* trainer_state.json is this prefix, the caller's object verbatim, then
 * STATE_SUFFIX: verbatim so that 64-bit integers (RNG states, data
 * positions) survive, which a parse-and-print through doubles would not. */
static void state_prefix(char *buf, size_t cap, int64_t step) {
    snprintf(buf, cap, "{\n  \"format\": \"%s\",\n  \"layout_version\": %d,\n  \"step\": %lld,\n"
             "  \"trainer\": ", MT_CHECKPOINT_FORMAT, MT_CHECKPOINT_LAYOUT_VERSION,
             (long long)step);
}
#define STATE_SUFFIX "\n}\n"

static int check_state_json(const char *state_json, mt_error *err) {
    cJSON *j = cJSON_ParseWithOpts(state_json ? state_json : "", NULL, 1);
    int ok = j && cJSON_IsObject(j);
    cJSON_Delete(j);
    if (ok) return 0;
    return mt_errorf(err, "trainer state must be one JSON object (got %.60s%s); this is a bug "
                     "in the caller", state_json ? state_json : "NULL",
                     state_json && strlen(state_json) > 60 ? "..." : "");
}

static int write_state(const char *tmp, int64_t step, const char *state_json, mt_error *err) {
    char prefix[256];
    state_prefix(prefix, sizeof prefix, step);
    size_t n = strlen(prefix) + strlen(state_json) + sizeof STATE_SUFFIX;
    char *text = mt_malloc_or_die(n);
    snprintf(text, n, "%s%s%s", prefix, state_json, STATE_SUFFIX);
    int rc = write_text(tmp, "trainer_state.json", text, err);
    free(text);
    return rc;
}

/* COMPLETE: {"step": n, "files": {name: bytes, ...}, "xxh3_64": {name: hex}}.
 * The sizes and checksums let a load notice a file truncated, replaced or
 * corrupted after the save. Hashing re-reads the files just written, from
 * the page cache. */
static int write_complete(const char *tmp, int64_t step, mt_error *err) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "format", MT_CHECKPOINT_FORMAT);
    cJSON_AddNumberToObject(r, "step", (double)step);
    cJSON *files = cJSON_AddObjectToObject(r, "files");
    cJSON *sums = cJSON_AddObjectToObject(r, "xxh3_64");
    int rc = 0;
    for (int i = 0; i < N_CKPT_FILES && rc == 0; i++) {
        char *path = mt_path_join(tmp, ckpt_files[i]), hex[17];
        uint64_t h;
        int64_t n;
        rc = mt_file_xxh3(path, &h, &n, err);
        if (rc == 0) {
            mt_xxh3_hex(h, hex);
            cJSON_AddNumberToObject(files, ckpt_files[i], (double)n);
            cJSON_AddStringToObject(sums, ckpt_files[i], hex);
        }
        free(path);
    }
    char *text = cJSON_Print(r);
    cJSON_Delete(r);
    MT_ASSERT(text);
    if (rc == 0) rc = write_text(tmp, "COMPLETE", text, err);
    free(text);
    return rc;
}

/* ---- save --------------------------------------------------------------- */

/* Everything inside the temporary directory, each file synced. */
static int write_all_files(const char *tmp, int64_t step, const mt_host_store *s,
                           const mt_config *cfg, const char *state_json,
                           const mt_checkpoint_opts *o, mt_error *err) {
    char *cfg_json = mt_config_to_json(cfg);
    int rc = write_text(tmp, "config.json", cfg_json, err);
    free(cfg_json);
    if (rc == 0) rc = run_hook(o, tmp, "config.json", err);
    if (rc == 0) rc = write_tensors(tmp, s, o, err);
    if (rc == 0) rc = write_state(tmp, step, state_json, err);
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
    if (check_state_json(state_json, err)) return -1;
    char *ck = mt_path_join(out_dir, "checkpoints");
    char name[64], tmp_name[96];
    snprintf(name, sizeof name, "step-%08lld", (long long)step);
    snprintf(tmp_name, sizeof tmp_name, ".tmp-%s-%ld", name, (long)getpid());
    char *final = mt_path_join(ck, name), *tmp = mt_path_join(ck, tmp_name);
    int rc = mt_mkdirs(ck, err);
    if (rc == 0) {
        mt_ckpt_rmtree(tmp);  /* left by an earlier failed attempt of this process */
        if (mkdir(tmp, 0755) != 0)
            rc = mt_errorf(err, "%s: cannot create directory: %s", tmp, strerror(errno));
    }
    int made_tmp = rc == 0;
    if (rc == 0) rc = write_all_files(tmp, step, s, cfg, state_json, o, err);
    if (rc == 0) rc = mt_ckpt_publish(tmp, final, err);
    if (rc == 0) rc = mt_fsync_dir(ck, err);
    if (rc != 0 && made_tmp) mt_ckpt_rmtree(tmp);
    if (rc == 0 && saved_path) snprintf(saved_path, cap, "%s", final);
    /* The new checkpoint is durable; a failed prune only leaves extra
     * directories behind, which the next save retries. */
    if (rc == 0 && mt_checkpoint_prune(out_dir, o->keep_last, err) != 0)
        fprintf(stderr, "warning: %s\n", err->msg);
    if (rc != 0)
        mt_error_prefix(err, "saving checkpoint step %lld to %s (earlier checkpoints are "
                        "untouched): ", (long long)step, ck);
    free(ck);
    free(final);
    free(tmp);
    return rc;
}

int mt_checkpoint_save(const char *out_dir, int64_t step, const mt_host_store *s,
                       const mt_config *cfg, const char *state_json, int keep_last,
                       char *saved_path, size_t cap, mt_error *err) {
    mt_checkpoint_opts o = {.keep_last = keep_last, .parallel = 1};
    return mt_checkpoint_save_opts(out_dir, step, s, cfg, state_json, &o, saved_path, cap, err);
}

/* ---- load --------------------------------------------------------------- */

/* The first field of the two configs that differs, as named in config.json. */
static int compare_configs(const mt_config *a, const mt_config *b, const char *path,
                           mt_error *err) {
#define FIELD_MSG "%s: field \"%s\" is %s in the checkpoint but %s in the model being trained; " \
                  "resume with the model the checkpoint was made from, or start a new run"
#define CMP_INT(f, key)                                                                  \
    if (a->f != b->f) {                                                                  \
        char x[32], y[32];                                                               \
        snprintf(x, sizeof x, "%lld", (long long)a->f);                                  \
        snprintf(y, sizeof y, "%lld", (long long)b->f);                                  \
        return mt_errorf(err, FIELD_MSG, path, key, x, y);                               \
    }
#define CMP_NUM(f, key)                                                                  \
    if (a->f != b->f) {                                                                  \
        char x[32], y[32];                                                               \
        snprintf(x, sizeof x, "%.9g", (double)a->f);                                     \
        snprintf(y, sizeof y, "%.9g", (double)b->f);                                     \
        return mt_errorf(err, FIELD_MSG, path, key, x, y);                               \
    }
    if (strcmp(a->model_type, b->model_type) != 0)
        return mt_errorf(err, FIELD_MSG, path, "model_type", a->model_type, b->model_type);
    CMP_INT(C, "hidden_size");
    CMP_INT(L, "num_hidden_layers");
    CMP_INT(NH, "num_attention_heads");
    CMP_INT(NKV, "num_key_value_heads");
    CMP_INT(HD, "head_dim");
    CMP_INT(F, "intermediate_size");
    CMP_INT(V, "vocab_size");
    CMP_INT(max_pos, "max_position_embeddings");
    CMP_NUM(rms_eps, "rms_norm_eps");
    CMP_NUM(rope_theta, "rope_theta");
    CMP_INT(rope_kind, "rope_scaling.rope_type");
    CMP_NUM(rope_factor, "rope_scaling.factor");
    CMP_NUM(rope_low_freq_factor, "rope_scaling.low_freq_factor");
    CMP_NUM(rope_high_freq_factor, "rope_scaling.high_freq_factor");
    CMP_INT(rope_orig_max_pos, "rope_scaling.original_max_position_embeddings");
    CMP_INT(tie_embeddings, "tie_word_embeddings");
    CMP_INT(qkv_bias, "attention_bias");
    CMP_INT(qk_norm, "q/k norm");
    CMP_INT(sliding_window, "sliding_window");
    /* mixture-of-experts: what changes the math without changing the tensors */
    CMP_INT(moe.E, "num_experts");
    CMP_INT(moe.K, "num_experts_per_tok");
    CMP_INT(moe.norm_topk, "norm_topk_prob");
    CMP_INT(moe.sparse_step, "decoder_sparse_step");
    return 0;
#undef CMP_INT
#undef CMP_NUM
#undef FIELD_MSG
}

/* Checks path against the checksum recorded for it, when there is one
 * (checkpoints of older megatrain versions have sizes only). */
static int check_sum(const char *path, const cJSON *sums, const char *name, mt_error *err) {
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(sums, name);
    if (!sums) return 0;
    if (!cJSON_IsString(want) || strlen(want->valuestring) != 16)
        return mt_errorf(err, "%s: no checksum recorded for it in COMPLETE: the marker is "
                         "corrupt; resume from another checkpoint", path);
    uint64_t h;
    char hex[17];
    if (mt_file_xxh3(path, &h, NULL, err)) return -1;
    mt_xxh3_hex(h, hex);
    if (strcmp(hex, want->valuestring) == 0) return 0;
    return mt_errorf(err, "%s: corrupt: its checksum (xxh3 %s) differs from the one recorded at "
                     "the save (%s); resume from an earlier checkpoint (--resume auto falls "
                     "back to one by itself)", path, hex, want->valuestring);
}

/* Parses dir/COMPLETE and checks every file's size and checksum against it. */
static int check_complete(const char *dir, int64_t *step, int sums_checked, mt_error *err) {
    char *path = mt_path_join(dir, "COMPLETE");
    char *text = NULL;
    size_t len;
    int rc = 0;
    if (!mt_file_exists(path)) {
        rc = mt_errorf(err, "%s: missing: %s is not a complete checkpoint (a save was "
                       "interrupted); pass its parent directory to pick the newest complete one",
                       path, dir);
    } else if (mt_read_file(path, &text, &len, err) == 0) {
        cJSON *j = cJSON_Parse(text);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(j, "step");
        const cJSON *files = cJSON_GetObjectItemCaseSensitive(j, "files");
        const cJSON *sums = cJSON_GetObjectItemCaseSensitive(j, "xxh3_64");
        if (!cJSON_IsNumber(st) || !cJSON_IsObject(files) || (sums && !cJSON_IsObject(sums)))
            rc = mt_errorf(err, "%s: corrupt marker (expected {\"step\", \"files\"})", path);
        for (int i = 0; i < N_CKPT_FILES && rc == 0; i++) {
            char *fp = mt_path_join(dir, ckpt_files[i]);
            const cJSON *want = cJSON_GetObjectItemCaseSensitive(files, ckpt_files[i]);
            struct stat sb;
            if (stat(fp, &sb) != 0)
                rc = mt_errorf(err, "%s: missing from the checkpoint: %s", fp, strerror(errno));
            else if (!cJSON_IsNumber(want) || (double)sb.st_size != want->valuedouble)
                rc = mt_errorf(err, "%s: %lld bytes, but the checkpoint recorded %.0f: the file "
                               "was truncated or replaced after the save", fp,
                               (long long)sb.st_size, cJSON_IsNumber(want) ? want->valuedouble : -1.0);
            else
                rc = sums_checked ? 0 : check_sum(fp, sums, ckpt_files[i], err);
            free(fp);
        }
        if (rc == 0) *step = (int64_t)st->valuedouble;
        cJSON_Delete(j);
    } else {
        rc = -1;
    }
    free(text);
    free(path);
    return rc;
}

/* Reads trainer_state.json and returns the caller's object as saved. */
static int load_state(const char *dir, int64_t step, char **out, mt_error *err) {
    char *path = mt_path_join(dir, "trainer_state.json");
    char *text = NULL;
    size_t len;
    int rc = mt_read_file(path, &text, &len, err);
    cJSON *j = rc == 0 ? cJSON_Parse(text) : NULL;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(j, "format");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "layout_version");
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(j, "trainer");
    if (rc == 0 && (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, MT_CHECKPOINT_FORMAT) ||
                    !cJSON_IsObject(tr) || !cJSON_IsNumber(ver)))
        rc = mt_errorf(err, "%s: corrupt: expected {\"format\": \"%s\", \"layout_version\", "
                       "\"trainer\": {...}}", path, MT_CHECKPOINT_FORMAT);
    if (rc == 0 && ver->valueint != MT_CHECKPOINT_LAYOUT_VERSION)
        rc = mt_errorf(err, "%s: layout version %d; this megatrain reads version %d (use the "
                       "megatrain that wrote it)", path, ver->valueint,
                       MT_CHECKPOINT_LAYOUT_VERSION);
    if (rc == 0) {
        char prefix[256];
        state_prefix(prefix, sizeof prefix, step);
        size_t p = strlen(prefix), q = strlen(STATE_SUFFIX);
        if (len >= p + q && memcmp(text, prefix, p) == 0 &&
            strcmp(text + len - q, STATE_SUFFIX) == 0) {
            *out = strndup(text + p, len - p - q);
            MT_ASSERT(*out);
        } else { /* edited by hand: the object's content, re-printed */
            *out = cJSON_PrintUnformatted(tr);
            MT_ASSERT(*out);
        }
    }
    cJSON_Delete(j);
    free(text);
    free(path);
    return rc;
}

static int shape_matches(const mt_st_tensor_info *ti, const mt_tensor_desc *td) {
    return ti->ndim == td->ndim && ti->shape[0] == td->shape[0] &&
           (td->ndim == 1 || ti->shape[1] == td->shape[1]);
}

/* Reads one store array (w, m or v) from file f, tensors named prefix + HF name. */
static int read_array(const mt_st_file *f, const mt_param_table *t, const char *prefix,
                      float *array, mt_error *err) {
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        for (int k = 0; k < ld->n_tensors; k++) {
            const mt_tensor_desc *td = &ld->tensors[k];
            char name[128];
            snprintf(name, sizeof name, "%s%s", prefix, td->name);
            const mt_st_tensor_info *ti = mt_st_find(f, name);
            if (!ti) return mt_errorf(err, "%s: tensor \"%s\" is missing", f->path, name);
            if (ti->dtype != MT_DTYPE_F32 || !shape_matches(ti, td))
                return mt_errorf(err, "%s: tensor \"%s\" is %s of %d dims [%lld, ...], expected "
                                 "F32 [%lld, %lld]", f->path, name, mt_dtype_name(ti->dtype),
                                 ti->ndim, (long long)ti->shape[0], (long long)td->shape[0],
                                 (long long)td->shape[1]);
            if (mt_st_read_f32(ti, array + ld->offset + td->offset, td->numel, err)) return -1;
        }
    }
    return 0;
}

/* Opens dir/file expecting exactly n_expect tensors, then reads arrays. */
static int load_tensor_file(const char *dir, const char *file, const mt_param_table *t,
                            int n_expect, const char *const *prefixes, float *const *arrays,
                            int n_arrays, mt_error *err) {
    char *path = mt_path_join(dir, file);
    mt_st_file f;
    int rc = mt_st_open(&f, path, err);
    if (rc == 0 && f.n_tensors != n_expect)
        rc = mt_errorf(err, "%s: %d tensors, expected %d: it does not belong to this model",
                       path, f.n_tensors, n_expect);
    for (int i = 0; i < n_arrays && rc == 0; i++)
        rc = read_array(&f, t, prefixes[i], arrays[i], err);
    mt_st_close(&f);
    free(path);
    return rc;
}

int mt_checkpoint_verify(const char *dir, mt_error *err) {
    int64_t step;
    return check_complete(dir, &step, 0, err);
}

static int load(const char *dir, mt_host_store *s, const mt_config *cfg, char **state_json,
                int sums_checked, mt_error *err) {
    *state_json = NULL;
    int64_t step = 0;
    if (check_complete(dir, &step, sums_checked, err))
        return mt_error_prefix(err, "loading checkpoint: ");
    char *cpath = mt_path_join(dir, "config.json");
    mt_config saved;
    int rc = mt_config_load(&saved, cpath, err);
    if (rc == 0) rc = compare_configs(&saved, cfg, cpath, err);
    free(cpath);
    int n = count_tensors(s->table);
    const char *wp[] = {""}, *op[] = {"exp_avg.", "exp_avg_sq."};
    float *wa[] = {s->w}, *oa[] = {s->m, s->v};
    if (rc == 0) rc = load_tensor_file(dir, "model.safetensors", s->table, n, wp, wa, 1, err);
    if (rc == 0) rc = load_tensor_file(dir, "optimizer.safetensors", s->table, 2 * n, op, oa, 2, err);
    if (rc == 0) rc = load_state(dir, step, state_json, err);
    if (rc) mt_error_prefix(err, "loading checkpoint: ");
    return rc;
}

int mt_checkpoint_load(const char *dir, mt_host_store *s, const mt_config *cfg,
                       char **state_json, mt_error *err) {
    return load(dir, s, cfg, state_json, 0, err);
}

int mt_checkpoint_load_verified(const char *dir, mt_host_store *s, const mt_config *cfg,
                                char **state_json, mt_error *err) {
    return load(dir, s, cfg, state_json, 1, err);
}
