/* Resume checkpoints: load and verify (marker, checksums, sizes, config,
 * tensors); see checkpoint.h. */
#include "io/checkpoint.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/disk_state.h"
#include "io/checkpoint_internal.h"
#include "io/checksum.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "util/mem.h"

/* The first field of the two configs that differs, as named in config.json. */
int mt_ckpt_compare_configs(const mt_config *a, const mt_config *b, const char *path,
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
    CMP_NUM(rope_attn_factor, "rope_scaling.attention_factor");
    CMP_INT(n_rope_factors, "rope_scaling.short_factor (its length)");
    for (int i = 0; i < a->n_rope_factors; i++) {
        CMP_NUM(rope_short_factor[i], "rope_scaling.short_factor");
        CMP_NUM(rope_long_factor[i], "rope_scaling.long_factor");
    }
    CMP_INT(tie_embeddings, "tie_word_embeddings");
    CMP_INT(qkv_bias, "attention_bias");
    CMP_INT(qk_norm, "q/k norm");
    CMP_INT(sliding_window, "sliding_window");
    CMP_INT(parallel_residual, "use_parallel_residual");
    CMP_INT(attn_bias, "attention_bias");
    CMP_INT(act, "hidden_act");
    CMP_INT(rotary_dim, "rotary_pct (rotary dims)");
    CMP_INT(new_decoder, "new_decoder_architecture");
    CMP_NUM(query_pre_attn_scalar, "query_pre_attn_scalar");
    CMP_NUM(attn_softcap, "attn_logit_softcapping");
    CMP_NUM(final_softcap, "final_logit_softcapping");
    CMP_INT(sliding_pattern, "layer_types (sliding_window_pattern)");
    CMP_NUM(rope_local_theta, "rope_local_base_freq");
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
                         "corrupt; use another checkpoint", path);
    uint64_t h;
    char hex[17];
    if (mt_file_xxh3(path, &h, NULL, err)) return -1;
    mt_xxh3_hex(h, hex);
    if (strcmp(hex, want->valuestring) == 0) return 0;
    return mt_errorf(err, "%s: corrupt: its checksum (xxh3 %s) differs from the one recorded at "
                     "the save (%s); use an earlier checkpoint (--resume auto falls back to one "
                     "by itself)", path, hex, want->valuestring);
}

/* dir/COMPLETE, parsed; its step, and its "files" (sizes) and "xxh3_64"
 * (checksums, NULL in an older megatrain's marker, which is said on stderr
 * when the files are to be hashed). */
typedef struct marker {
    cJSON *json;
    int64_t step;
    const cJSON *files, *sums;
} marker;

static int read_marker(const char *dir, int hashing, marker *mk, mt_error *err) {
    char *path = mt_path_join(dir, "COMPLETE");
    char *text = NULL;
    size_t len;
    int rc = 0;
    mk->json = NULL;
    if (!mt_file_exists(path)) {
        rc = mt_errorf(err, "%s: missing: %s is not a complete checkpoint (a save was "
                       "interrupted); pass its parent directory to pick the newest complete one",
                       path, dir);
    } else if (mt_read_file(path, &text, &len, err) == 0) {
        mk->json = cJSON_Parse(text);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(mk->json, "step");
        mk->files = cJSON_GetObjectItemCaseSensitive(mk->json, "files");
        mk->sums = cJSON_GetObjectItemCaseSensitive(mk->json, "xxh3_64");
        if (!cJSON_IsNumber(st) || !cJSON_IsObject(mk->files) ||
            (mk->sums && !cJSON_IsObject(mk->sums)))
            rc = mt_errorf(err, "%s: corrupt marker (expected {\"step\", \"files\"})", path);
        else
            mk->step = (int64_t)st->valuedouble;
        if (rc == 0 && !mk->sums && hashing)
            fprintf(stderr, "megatrain: warning: %s records no checksums (a checkpoint of an "
                    "older megatrain): its files are checked by their sizes only\n", path);
    } else {
        rc = -1;
    }
    if (rc) cJSON_Delete(mk->json);
    free(text);
    free(path);
    return rc;
}

/* dir/name's size, and its checksum when hash, against the marker. */
static int check_file(const char *dir, const char *name, const marker *mk, int hash,
                      mt_error *err) {
    char *fp = mt_path_join(dir, name);
    const cJSON *want = cJSON_GetObjectItemCaseSensitive(mk->files, name);
    struct stat sb;
    int rc = 0;
    if (stat(fp, &sb) != 0)
        rc = mt_errorf(err, "%s: missing from the checkpoint: %s", fp, strerror(errno));
    else if (!cJSON_IsNumber(want) || (double)sb.st_size != want->valuedouble)
        rc = mt_errorf(err, "%s: %lld bytes, but the checkpoint recorded %.0f: the file "
                       "was truncated or replaced after the save", fp, (long long)sb.st_size,
                       cJSON_IsNumber(want) ? want->valuedouble : -1.0);
    else if (hash)
        rc = check_sum(fp, mk->sums, name, err);
    free(fp);
    return rc;
}

/* Checks every file's size, and its checksum unless sums_checked (a
 * verification just did), against dir/COMPLETE: one process's files, or
 * those a checkpoint of several ranks lists (each rank's shard and rank
 * 0's files: dist/shard_ckpt.h). */
static int check_complete(const char *dir, int64_t *step, int sums_checked, mt_error *err) {
    marker mk;
    if (read_marker(dir, !sums_checked, &mk, err)) return -1;
    int rc = 0;
    if (cJSON_GetObjectItemCaseSensitive(mk.json, "ranks")) {
        for (const cJSON *f = mk.files->child; f && rc == 0; f = f->next) {
            if (!f->string || strchr(f->string, '/') || !strcmp(f->string, "..") ||
                !strcmp(f->string, "."))
                rc = mt_errorf(err, "%s/COMPLETE: corrupt marker (file name \"%s\")", dir,
                               f->string ? f->string : "");
            else
                rc = check_file(dir, f->string, &mk, !sums_checked, err);
        }
    } else {
        for (int i = 0; i < N_CKPT_FILES && rc == 0; i++)
            rc = check_file(dir, mt_ckpt_file(i), &mk, !sums_checked, err);
    }
    if (rc == 0) *step = mk.step;
    cJSON_Delete(mk.json);
    return rc;
}

int mt_checkpoint_verify_file(const char *dir, const char *name, mt_error *err) {
    marker mk;
    if (read_marker(dir, 1, &mk, err)) return -1;
    int rc = check_file(dir, name, &mk, 1, err);
    cJSON_Delete(mk.json);
    return rc;
}

/* Reads trainer_state.json and returns the caller's object as saved. */
int mt_ckpt_load_state(const char *dir, int64_t step, char **out, mt_error *err) {
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
        mt_ckpt_state_prefix(prefix, sizeof prefix, step);
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

/* Reads td of layer l from its rows of the fused tensor prefix + published
 * name in f (mt_params_fused; model.safetensors holds phi3's weights so).
 * 1: td is not a part of one there. */
static int read_fused(const mt_st_file *f, const mt_param_table *t, int l, const char *prefix,
                      const mt_tensor_desc *td, float *dst, mt_error *err) {
    char fused[96], name[128];
    int64_t rows, row0;
    if (!mt_params_fused(t, l, td, fused, &rows, &row0)) return 1;
    snprintf(name, sizeof name, "%s%s", prefix, fused);
    const mt_st_tensor_info *ti = mt_st_find(f, name);
    if (!ti) return 1;
    if (ti->dtype != MT_DTYPE_F32 || ti->ndim != 2 || ti->shape[0] != rows ||
        ti->shape[1] != td->shape[1])
        return mt_errorf(err, "%s: tensor \"%s\" is %s of %d dims [%lld, ...], expected F32 "
                         "[%lld, %lld]", f->path, name, mt_dtype_name(ti->dtype), ti->ndim,
                         (long long)ti->shape[0], (long long)rows, (long long)td->shape[1]);
    return mt_st_read_f32_range(ti, (size_t)row0 * (size_t)td->shape[1], dst, td->numel, err);
}

/* Reads layer l's tensors of one array from file f, named prefix + HF
 * name, into base (the layer's range). */
static int read_layer(const mt_st_file *f, const mt_param_table *t, int l, const char *prefix,
                      float *base, mt_error *err) {
    const mt_layer_desc *ld = &t->layers[l];
    for (int k = 0; k < ld->n_tensors; k++) {
        const mt_tensor_desc *td = &ld->tensors[k];
        int st = read_fused(f, t, l, prefix, td, base + td->offset, err);
        if (st < 0) return -1;
        if (st == 0) continue;
        char name[128];
        snprintf(name, sizeof name, "%s%s", prefix, td->name);
        const mt_st_tensor_info *ti = mt_st_find(f, name);
        if (!ti) return mt_errorf(err, "%s: tensor \"%s\" is missing", f->path, name);
        if (ti->dtype != MT_DTYPE_F32 || !shape_matches(ti, td))
            return mt_errorf(err, "%s: tensor \"%s\" is %s of %d dims [%lld, ...], expected "
                             "F32 [%lld, %lld]", f->path, name, mt_dtype_name(ti->dtype),
                             ti->ndim, (long long)ti->shape[0], (long long)td->shape[0],
                             (long long)td->shape[1]);
        if (mt_st_read_f32(ti, base + td->offset, td->numel, err)) return -1;
    }
    return 0;
}

/* Opens dir/file expecting exactly n_expect tensors. */
static int open_tensor_file(mt_st_file *f, const char *dir, const char *file, int n_expect,
                            mt_error *err) {
    char *path = mt_path_join(dir, file);
    int rc = mt_st_open(f, path, err);
    if (rc == 0 && f->n_tensors != n_expect) {
        rc = mt_errorf(err, "%s: %d tensors, expected %d: it does not belong to this model",
                       path, f->n_tensors, n_expect);
        mt_st_close(f);
    }
    free(path);
    return rc;
}

/* A layer of the disk tier from the files: its weights (when they live on
 * disk too) from model file wf, m and v from optimizer file of, into the
 * store's tier. */
static int load_disk_layer(const mt_st_file *wf, const mt_st_file *of, mt_host_store *s, int l,
                           mt_error *err) {
    const mt_param_table *t = s->table;
    size_t n = t->layers[l].numel ? t->layers[l].numel : 1;
    int with_w = mt_disk_state_weights_on_disk(s->disk, l);
    float *w = with_w ? mt_calloc_or_die(n, sizeof *w) : NULL;
    float *m = mt_calloc_or_die(n, sizeof *m), *v = mt_calloc_or_die(n, sizeof *v);
    int rc = (with_w && read_layer(wf, t, l, "", w, err)) ||
             read_layer(of, t, l, "exp_avg.", m, err) ||
             read_layer(of, t, l, "exp_avg_sq.", v, err) ||
             mt_disk_layer_write(s, l, w, m, v, err);
    free(w);
    free(m);
    free(v);
    return rc ? -1 : 0;
}

int mt_checkpoint_verify(const char *dir, mt_error *err) {
    int64_t step;
    return check_complete(dir, &step, 0, err);
}

/* Tensors of model.safetensors: the table's, a fused published tensor
 * counted once. */
static int published_count(const mt_param_table *t) {
    int n = 0;
    for (int l = 0; l < t->n_layers; l++)
        for (int k = 0; k < t->layers[l].n_tensors; k++) {
            char name[96];
            int64_t rows, row0;
            n += !mt_params_fused(t, l, &t->layers[l].tensors[k], name, &rows, &row0) || !row0;
        }
    return n;
}

/* The store from a checkpoint's model.safetensors (w) and
 * optimizer.safetensors (m, v): the layers in RAM straight into their
 * ranges, those of the disk tier a layer at a time. */
static int load_tensors(const char *dir, mt_host_store *s, mt_error *err) {
    const mt_param_table *t = s->table;
    mt_st_file wf, of;
    if (open_tensor_file(&wf, dir, "model.safetensors", published_count(t), err)) return -1;
    if (open_tensor_file(&of, dir, "optimizer.safetensors", 2 * mt_ckpt_count_tensors(t), err)) {
        mt_st_close(&wf);
        return -1;
    }
    int rc = 0;
    for (int l = 0; l < t->n_layers && rc == 0; l++) {
        if (!mt_disk_state_weights_on_disk(s->disk, l))
            rc = read_layer(&wf, t, l, "", mt_store_layer(s->w, t, l), err);
        if (rc == 0 && mt_disk_state_on_disk(s->disk, l))
            rc = load_disk_layer(&wf, &of, s, l, err);
        else if (rc == 0)
            rc = read_layer(&of, t, l, "exp_avg.", mt_store_layer(s->m, t, l), err) ||
                 read_layer(&of, t, l, "exp_avg_sq.", mt_store_layer(s->v, t, l), err) ? -1 : 0;
    }
    mt_st_close(&wf);
    mt_st_close(&of);
    return rc;
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
    if (rc == 0) rc = mt_ckpt_compare_configs(&saved, cfg, cpath, err);
    free(cpath);
    if (rc == 0) rc = load_tensors(dir, s, err);
    if (rc == 0) rc = mt_ckpt_load_state(dir, step, state_json, err);
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
