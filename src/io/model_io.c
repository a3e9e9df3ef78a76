/* Loading and saving Hugging Face model directories. */
#include "io/model_io.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/disk_state.h"
#include "io/checkpoint.h"
#include "io/ckpt_disk.h"
#include "io/file.h"
#include "io/model_io_moe.h"
#include "io/safetensors.h"
#include "util/mem.h"

/* "[a, b, ...]" of ndim dimensions ("[]" for a scalar). */
static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* A resume checkpoint (io/checkpoint.h: a directory with COMPLETE) is a
 * model directory too; what a load reads of it must be what its save
 * wrote, or a flipped bit reaches the loss silently. */
static int verify_if_checkpoint(const char *dir, const char *file, mt_error *err) {
    char *marker = mt_path_join(dir, "COMPLETE");
    int is_checkpoint = mt_file_exists(marker);
    free(marker);
    return is_checkpoint ? mt_checkpoint_verify_file(dir, file, err) : 0;
}

int mt_model_load_config(mt_config *cfg, const char *dir, mt_error *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (verify_if_checkpoint(dir, "config.json", err)) return -1;
    return mt_config_load(cfg, path, err);
}

/* Tensors some checkpoints carry that hold no parameters. */
static int ignorable(const char *name, const mt_config *cfg) {
    if (strstr(name, "rotary_emb.inv_freq")) return 1;
    /* Pythia's checkpoints keep GPT-NeoX's causal-mask buffers. */
    size_t n = strlen(name);
    const char *buffers[] = {".attention.bias", ".attention.masked_bias"};
    for (size_t i = 0; i < 2; i++) {
        size_t k = strlen(buffers[i]);
        if (!strncmp(name, "gpt_neox.layers.", 16) && n > k && !strcmp(name + n - k, buffers[i]))
            return 1;
    }
    /* Tied checkpoints sometimes store the shared matrix twice. */
    return cfg->tie_embeddings && !strcmp(name, "lm_head.weight");
}

static float *store_layer(void *ctx, int layer) {
    mt_host_store *s = ctx;
    return s->w + s->table->layers[layer].offset;
}

int mt_model_load_weights(mt_host_store *s, const char *dir, mt_error *err) {
    return mt_model_read_layers(s->table, dir, store_layer, NULL, s, err);
}

/* Reads td (of layer l) from the rows of the fused tensor it is published
 * in. 0: read; 1: the file holds no such tensor (a megatrain resume
 * checkpoint names the parts: read td by its own name); -1: an error. */
static int read_fused(const mt_st_model *m, const mt_param_table *t, int l,
                      const mt_tensor_desc *td, float *dst, mt_error *err) {
    char name[96];
    int64_t rows, row0;
    if (!mt_params_fused(t, l, td, name, &rows, &row0)) return 1;
    const mt_st_tensor_info *ti = mt_st_model_find(m, name);
    if (!ti) return 1;
    if (ti->ndim != 2 || ti->shape[0] != rows || ti->shape[1] != td->shape[1]) {
        char has[160], want[80];
        int64_t shape[2] = {rows, td->shape[1]};
        format_shape(has, sizeof has, ti->ndim, ti->shape);
        format_shape(want, sizeof want, 2, shape);
        return mt_errorf(err, "%s: tensor \"%s\" has shape %s but config.json implies %s",
                         ti->file, name, has, want);
    }
    return mt_st_read_f32_range(ti, (size_t)row0 * (size_t)td->shape[1], dst, td->numel, err);
}

int mt_model_read_layers(const mt_param_table *t, const char *dir, mt_layer_dst dst_of,
                         mt_layer_done done, void *ctx, mt_error *err) {
    mt_st_model m;
    if (verify_if_checkpoint(dir, "model.safetensors", err) || mt_st_model_open(&m, dir, err))
        return -1;
    int rc = -1;
    /* The table's config is not stored in the table; tied-ness shows as
     * the absence of lm_head in the head layer. */
    mt_config tied = {.tie_embeddings = mt_params_find(t, t->n_layers - 1, MT_T_LM_HEAD) == NULL};
    for (int i = 0; i < m.n_tensors; i++) {
        const char *name = m.tensors[i]->name;
        if (!mt_params_by_name(t, name, NULL) && !ignorable(name, &tied) &&
            !mt_moe_other_layout_name(t, name)) {
            mt_errorf(err, "%s: tensor \"%s\" is not part of the model that config.json "
                      "describes; check that config.json belongs to these weights", dir, name);
            goto out;
        }
    }
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        float *base = dst_of(ctx, l);
        for (int k = 0; k < ld->n_tensors; k++) {
            const mt_tensor_desc *td = &ld->tensors[k];
            float *dst = base + td->offset;
            int st = read_fused(&m, t, l, td, dst, err);
            if (st < 0) goto out;
            if (st == 0) continue;
            const mt_st_tensor_info *ti = mt_st_model_find(&m, td->name);
            if (!ti && ld->n_experts) { /* an MoE block in another layout */
                int st = mt_moe_read_other_layout(&m, ld, td, dst, err);
                if (st < 0) goto out;
                if (st == 0) continue;
            }
            if (!ti) {
                char fused[96];
                int64_t rows, row0;
                bool f = mt_params_fused(t, l, td, fused, &rows, &row0);
                mt_errorf(err, "%s: tensor \"%s\" is missing from the safetensors files",
                          dir, f ? fused : td->name);
                goto out;
            }
            int shape_ok = ti->ndim == td->ndim && ti->shape[0] == td->shape[0] &&
                           (td->ndim == 1 || ti->shape[1] == td->shape[1]);
            if (!shape_ok) {
                char has[160], want[80];
                format_shape(has, sizeof has, ti->ndim, ti->shape);
                format_shape(want, sizeof want, td->ndim, td->shape);
                mt_errorf(err, "%s: tensor \"%s\" has shape %s but config.json implies %s",
                          ti->file, td->name, has, want);
                goto out;
            }
            if (mt_st_read_f32(ti, dst, td->numel, err)) goto out;
        }
        if (done) done(ctx, l);
    }
    rc = 0;
out:
    mt_st_model_close(&m);
    return rc;
}

/* Writes text to DIR/NAME. */
static int write_json(const char *dir, const char *name, const char *text, mt_error *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return mt_errorf(err, "%s: cannot write: %s", path, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    return bad ? mt_errorf(err, "%s: write failed (disk full?)", path) : 0;
}

/* A fused published tensor (mt_params_fused): its parts, in row order,
 * from w or, when its layer's weights are on disk, from `away` (at
 * off[j] into the layer). */
typedef struct fused_src {
    char name[96];
    int n;
    const float *part[3];
    size_t numel[3];
    mt_ckpt_disk *away;
    int layer;
    size_t off[3];
} fused_src;

/* Elements [first, first + count) of a fused tensor, gathered from its parts. */
static int fill_fused(void *ctx, const mt_st_write_tensor *t, size_t first, size_t count,
                      float *dst, mt_error *err) {
    (void)t;
    const fused_src *f = ctx;
    size_t start = 0;
    for (int j = 0; j < f->n && count > 0; j++) {
        size_t end = start + f->numel[j];
        if (first < end) {
            size_t k = end - first < count ? end - first : count;
            if (f->away && mt_ckpt_disk_copy(f->away, f->layer, MT_CKPT_W,
                                             f->off[j] + (first - start), k, dst, err))
                return -1;
            if (!f->away) memcpy(dst, f->part[j] + (first - start), k * sizeof(float));
            dst += k, first += k, count -= k;
        }
        start = end;
    }
    return 0;
}

int mt_model_write_list(const mt_param_table *t, const float *w, mt_dtype dtype,
                        mt_ckpt_disk *away, mt_st_write_tensor *out, void **ctx) {
    int n = 0;
    for (int l = 0; l < t->n_layers; l++) n += t->layers[l].n_tensors;
    fused_src *fs = mt_calloc_or_die((size_t)n + 1, sizeof *fs);
    *ctx = fs;
    n = 0;
    for (int l = 0; l < t->n_layers; l++) {
        const mt_layer_desc *ld = &t->layers[l];
        for (int k = 0; k < ld->n_tensors; k++) {
            const mt_tensor_desc *td = &ld->tensors[k];
            const float *src = w + ld->offset + td->offset;
            mt_ckpt_disk *from = away && mt_ckpt_disk_has_weights(away, l) ? away : NULL;
            char name[96];
            int64_t rows, row0;
            if (mt_params_fused(t, l, td, name, &rows, &row0)) {
                /* the parts follow one another in the table: the first part
                 * opens the published tensor, the others join it */
                fused_src *f = &fs[n];
                if (row0 > 0) {
                    f = &fs[n - 1];
                    MT_ASSERT(n > 0 && !strcmp(f->name, name) && f->n < 3);
                    f->part[f->n] = src;
                    f->off[f->n] = td->offset;
                    f->numel[f->n++] = td->numel;
                    continue;
                }
                snprintf(f->name, sizeof f->name, "%s", name);
                f->part[0] = src;
                f->off[0] = td->offset;
                f->numel[0] = td->numel;
                f->n = 1;
                f->away = from;
                f->layer = l;
                out[n++] = (mt_st_write_tensor){.name = f->name, .dtype = dtype, .ndim = 2,
                                                .shape = {rows, td->shape[1]},
                                                .fill = fill_fused, .fill_ctx = f};
                continue;
            }
            out[n] = (mt_st_write_tensor){.name = td->name, .dtype = dtype, .ndim = td->ndim,
                                          .shape = {td->shape[0], td->shape[1]}, .f32 = src};
            if (from) mt_ckpt_disk_source(from, &out[n], l, MT_CKPT_W, td->offset);
            n++;
        }
    }
    return n;
}

int mt_model_save(const mt_host_store *s, const mt_config *cfg, const char *dir, mt_dtype dtype,
                  size_t max_shard_bytes, mt_error *err) {
    if (mt_mkdirs(dir, err)) return -1;
    const mt_param_table *t = s->table;
    int n = 0;
    for (int l = 0; l < t->n_layers; l++) n += t->layers[l].n_tensors;
    mt_st_write_tensor *wt = mt_calloc_or_die((size_t)n, sizeof *wt);
    void *fs;
    /* the layers whose fp32 weights are on disk: read from there */
    mt_ckpt_disk *away = mt_disk_state_weight_layers(s->disk) ? mt_ckpt_disk_new(s->disk, n, 1)
                                                              : NULL;
    n = mt_model_write_list(t, s->w, dtype, away, wt, &fs);
    mt_st_kv meta[] = {{"format", "pt"}};
    int rc = mt_st_write_sharded(dir, wt, n, meta, 1, max_shard_bytes, err);
    free(wt);
    free(fs);
    mt_ckpt_disk_free(away);
    if (rc) return -1;
    char *json = mt_config_to_json_dtype(cfg, dtype == MT_DTYPE_BF16 ? "bfloat16" : "float32");
    rc = write_json(dir, "config.json", json, err);
    free(json);
    if (rc) return -1;
    /* what transformers derives from config.json when a model has none
     * (_from_model_config); a tokenizer's own, copied in after, replaces it */
    cJSON *g = cJSON_CreateObject();
    cJSON_AddBoolToObject(g, "_from_model_config", true);
    if (cfg->bos_id >= 0) cJSON_AddNumberToObject(g, "bos_token_id", (double)cfg->bos_id);
    if (cfg->eos_id >= 0) cJSON_AddNumberToObject(g, "eos_token_id", (double)cfg->eos_id);
    json = cJSON_Print(g);
    cJSON_Delete(g);
    MT_ASSERT(json);
    rc = write_json(dir, "generation_config.json", json, err);
    free(json);
    return rc;
}

int mt_model_copy_tokenizer(const char *tokenizer_json, const char *dir, mt_error *err) {
    char to[4200], from[4200], src_dir[4096];
    snprintf(to, sizeof to, "%s/tokenizer.json", dir);
    if (mt_copy_file(tokenizer_json, to, err)) return -1;
    snprintf(src_dir, sizeof src_dir, "%s", tokenizer_json);
    char *slash = strrchr(src_dir, '/');
    if (slash) *slash = 0;
    else snprintf(src_dir, sizeof src_dir, ".");
    const char *sidecars[] = {"tokenizer_config.json", "special_tokens_map.json",
                              "generation_config.json", "chat_template.jinja"};
    for (size_t i = 0; i < sizeof sidecars / sizeof *sidecars; i++) {
        snprintf(from, sizeof from, "%s/%s", src_dir, sidecars[i]);
        if (access(from, R_OK)) continue; /* optional */
        snprintf(to, sizeof to, "%s/%s", dir, sidecars[i]);
        if (mt_copy_file(from, to, err)) return -1;
    }
    return 0;
}
