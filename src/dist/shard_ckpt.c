/* Sharded checkpoints: the collective save and the re-sharding load (see
 * shard_ckpt.h). The directory handling (publish, prune) and the trainer
 * state's format are those of src/io/checkpoint*.c. */
#include "dist/shard_ckpt.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "host/disk_state.h"
#include "io/checkpoint.h"
#include "io/checkpoint_internal.h"
#include "io/checksum.h"
#include "io/ckpt_disk.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "util/mem.h"

/* What one rank tells the others about a stage of the save. */
typedef struct stage_status {
    int32_t rc;
    int32_t pid;        /* rank 0's, which names the temporary directory */
    char msg[1000];
} stage_status;

static void shard_name(char *buf, size_t cap, int rank, int ranks) {
    snprintf(buf, cap, "shard-%05d-of-%05d.safetensors", rank, ranks);
}

/* ---- save --------------------------------------------------------------- */

/* This rank's shard file: per layer, its parts of w, m and v. */
static int write_shard(const char *tmp, const mt_shard_store *s, mt_error *err) {
    const mt_shard_layout *sl = &s->layout;
    const int L = sl->table->n_layers;
    char (*names)[32] = mt_calloc_or_die(3 * (size_t)L + 1, sizeof *names);
    mt_st_write_tensor *t = mt_calloc_or_die(3 * (size_t)L + 1, sizeof *t);
    const float *arrays[3] = {s->w, s->m, s->v};
    const char *prefix[3] = {"w", "m", "v"};
    /* the m and v of the disk layers are read from the disk as they are written */
    mt_ckpt_disk *disk = s->disk ? mt_ckpt_disk_new(s->disk, 2 * L, 0) : NULL;
    int n = 0;
    for (int a = 0; a < 3; a++)
        for (int l = 0; l < L; l++) {
            if (mt_shard_len(sl, l) == 0) continue;  /* more ranks than units */
            snprintf(names[n], sizeof names[n], "%s.%d", prefix[a], l);
            t[n] = (mt_st_write_tensor){.name = names[n], .dtype = MT_DTYPE_F32, .ndim = 1,
                                        .f32 = arrays[a] + sl->local[l]};
            t[n].shape[0] = (int64_t)mt_shard_len(sl, l);
            if (a > 0 && mt_disk_state_on_disk(s->disk, l))
                mt_ckpt_disk_source(disk, &t[n], l, a, 0); /* MT_CKPT_M, _V */
            n++;
        }
    char file[64], rank[16], ranks[16];
    shard_name(file, sizeof file, sl->rank, sl->ranks);
    snprintf(rank, sizeof rank, "%d", sl->rank);
    snprintf(ranks, sizeof ranks, "%d", sl->ranks);
    mt_st_kv meta[] = {{"format", "megatrain-shard"}, {"rank", rank}, {"ranks", ranks}};
    char *path = mt_path_join(tmp, file);
    int rc = mt_st_write(path, t, n, meta, 3, err);
    free(path);
    free(names);
    free(t);
    mt_ckpt_disk_free(disk);
    return rc;
}

/* COMPLETE: format, step, ranks, and the size and XXH3-64 of every file. */
static int write_complete(const char *tmp, int64_t step, int ranks, mt_error *err) {
    mt_ckpt_complete mk = mt_ckpt_complete_begin(step, ranks);
    int rc = 0;
    for (int i = -2; i < ranks && rc == 0; i++) {
        char name[64];
        if (i < 0) snprintf(name, sizeof name, "%s", i == -2 ? "config.json" : "trainer_state.json");
        else shard_name(name, sizeof name, i, ranks);
        rc = mt_ckpt_record_file(tmp, name, mk.files, mk.sums, err);
    }
    return mt_ckpt_complete_write(&mk, tmp, rc, err);
}

/* Rank 0, once every shard is in: COMPLETE, fsync, publish, prune. */
static int finish(const char *ck, const char *tmp, const char *final, int64_t step, int ranks,
                  int keep_last, const char *out_dir, mt_error *err) {
    int rc = write_complete(tmp, step, ranks, err);
    if (rc == 0) rc = mt_fsync_dir(tmp, err);
    if (rc == 0) rc = mt_ckpt_commit(ck, tmp, final, out_dir, keep_last, err);
    return rc;
}

/* Every rank learns whether any rank failed a stage: gathers the statuses
 * on rank 0 and broadcasts the first failure (or rank 0's success). */
static int agree(mt_rdv *g, stage_status *st, mt_error *err) {
    stage_status *all = g->rank == 0 ? mt_calloc_or_die((size_t)g->world, sizeof *all) : NULL;
    int rc = mt_rdv_gather(g, st, sizeof *st, all, err);
    if (rc == 0 && g->rank == 0)
        for (int r = 0; r < g->world; r++)
            if (all[r].rc) {
                st->rc = -1;
                snprintf(st->msg, sizeof st->msg, "rank %d: %.900s", r, all[r].msg);
                break;
            }
    free(all);
    if (rc == 0) rc = mt_rdv_bcast(g, st, sizeof *st, err);
    return rc;
}

int mt_shard_ckpt_save(mt_rdv *g, const char *out_dir, int64_t step, const mt_shard_store *s,
                       const mt_config *cfg, const char *state_json, int keep_last,
                       char *saved_path, size_t cap, mt_error *err) {
    MT_ASSERT(s->layout.ranks == g->world && s->layout.rank == g->rank);
    if (step < 0) return mt_errorf(err, "checkpoint step %lld is negative", (long long)step);
    char *ck = mt_path_join(out_dir, "checkpoints");
    char name[64], tmp_name[96];
    snprintf(name, sizeof name, "step-%08lld", (long long)step);
    char *final = mt_path_join(ck, name), *tmp = NULL;
    /* 1. rank 0 makes the temporary directory and names it to all */
    stage_status st = {.pid = (int32_t)getpid()};
    mt_error e = {{0}};
    if (g->rank == 0) {
        snprintf(tmp_name, sizeof tmp_name, ".tmp-%s-%ld", name, (long)st.pid);
        tmp = mt_path_join(ck, tmp_name);
        st.rc = mt_ckpt_make_tmp(ck, tmp, &e);
        snprintf(st.msg, sizeof st.msg, "%.900s", e.msg);
    }
    int rc = mt_rdv_bcast(g, &st, sizeof st, err);
    if (rc == 0 && st.rc) rc = mt_errorf(err, "%s%s", g->rank ? "rank 0: " : "", st.msg);
    int made_tmp = rc == 0;
    /* 2. every rank writes its shard; rank 0 the config and trainer state */
    if (rc == 0) {
        if (!tmp) {
            snprintf(tmp_name, sizeof tmp_name, ".tmp-%s-%ld", name, (long)st.pid);
            tmp = mt_path_join(ck, tmp_name);
        }
        stage_status mine = {0};
        mine.rc = write_shard(tmp, s, &e);
        if (mine.rc == 0 && g->rank == 0) {
            char *cfg_json = mt_config_to_json(cfg);
            mine.rc = mt_ckpt_write_text(tmp, "config.json", cfg_json, &e);
            free(cfg_json);
            if (mine.rc == 0) mine.rc = mt_ckpt_check_state_json(state_json, &e);
            if (mine.rc == 0) mine.rc = mt_ckpt_write_state(tmp, step, state_json, &e);
        }
        if (mine.rc) snprintf(mine.msg, sizeof mine.msg, "%.900s", e.msg);
        /* 3. rank 0 publishes once all are in, and tells everyone how it went */
        rc = agree(g, &mine, err);
        if (rc == 0 && g->rank == 0 && mine.rc == 0) {
            mine.rc = finish(ck, tmp, final, step, g->world, keep_last, out_dir, &e);
            if (mine.rc) snprintf(mine.msg, sizeof mine.msg, "rank 0: %.900s", e.msg);
        }
        if (rc == 0) rc = mt_rdv_bcast(g, &mine, sizeof mine, err);
        if (rc == 0 && mine.rc) rc = mt_errorf(err, "%s", mine.msg);
    }
    return mt_ckpt_save_end(rc, made_tmp && g->rank == 0, "sharded checkpoint", step, ck, final,
                            tmp, saved_path, cap, err);
}

/* ---- load --------------------------------------------------------------- */

/* The marker's step, ranks, sizes and checksums. */
typedef struct marker {
    cJSON *root;
    const cJSON *files, *sums;
    int64_t step;
    int ranks;
} marker;

static int read_marker(const char *dir, marker *mk, mt_error *err) {
    char *path = mt_path_join(dir, "COMPLETE"), *text = NULL;
    size_t len;
    int rc = 0;
    memset(mk, 0, sizeof *mk);
    if (!mt_file_exists(path))
        rc = mt_errorf(err, "%s: missing: %s is not a complete checkpoint (a save was "
                       "interrupted); pass its parent directory to pick the newest complete one",
                       path, dir);
    else if (mt_read_file(path, &text, &len, err) == 0) {
        mk->root = cJSON_Parse(text);
        const cJSON *st = cJSON_GetObjectItemCaseSensitive(mk->root, "step");
        const cJSON *rk = cJSON_GetObjectItemCaseSensitive(mk->root, "ranks");
        mk->files = cJSON_GetObjectItemCaseSensitive(mk->root, "files");
        mk->sums = cJSON_GetObjectItemCaseSensitive(mk->root, "xxh3_64");
        if (!cJSON_IsNumber(st) || !cJSON_IsObject(mk->files) || !cJSON_IsObject(mk->sums))
            rc = mt_errorf(err, "%s: corrupt marker (expected {\"step\", \"files\", "
                           "\"xxh3_64\"})", path);
        else if (!rk)
            rc = mt_errorf(err, "%s: a checkpoint of one process (no \"ranks\"): it holds the "
                           "whole store; load it with the one-process loader", dir);
        else if (!cJSON_IsNumber(rk) || rk->valuedouble < 1 || rk->valuedouble > (1 << 20))
            rc = mt_errorf(err, "%s: corrupt marker (\"ranks\" is not a count)", path);
        else {
            mk->step = (int64_t)st->valuedouble;
            mk->ranks = rk->valueint;
        }
    } else
        rc = -1;
    free(text);
    free(path);
    return rc;
}

/* dir/name against the size and checksum COMPLETE records for it. */
static int check_file(const char *dir, const char *name, const marker *mk, mt_error *err) {
    char *path = mt_path_join(dir, name), hex[17];
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(mk->files, name);
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(mk->sums, name);
    struct stat sb;
    uint64_t h;
    int rc = 0;
    if (!cJSON_IsNumber(size) || !cJSON_IsString(sum))
        rc = mt_errorf(err, "%s: not recorded in COMPLETE: the marker is corrupt; resume from "
                       "another checkpoint", path);
    else if (stat(path, &sb) != 0)
        rc = mt_errorf(err, "%s: missing from the checkpoint: %s", path, strerror(errno));
    else if ((double)sb.st_size != size->valuedouble)
        rc = mt_errorf(err, "%s: %lld bytes, but the checkpoint recorded %.0f: the file was "
                       "truncated or replaced after the save", path, (long long)sb.st_size,
                       size->valuedouble);
    else if (mt_file_xxh3(path, &h, NULL, err) == 0) {
        mt_xxh3_hex(h, hex);
        if (strcmp(hex, sum->valuestring))
            rc = mt_errorf(err, "%s: corrupt: its checksum (xxh3 %s) differs from the one "
                           "recorded at the save (%s); resume from an earlier checkpoint", path,
                           hex, sum->valuestring);
    } else
        rc = -1;
    free(path);
    return rc;
}

/* The shard files of the old ranks whose parts meet this layout's, open
 * (mapped) and checked against COMPLETE; files[k] NULL-pathed where none
 * meets. */
typedef struct old_shards {
    int ranks;
    mt_shard_layout *layout; /* (ranks) */
    mt_st_file *files;       /* (ranks) */
    uint8_t *open;           /* (ranks) */
} old_shards;

static void close_shards(old_shards *o) {
    for (int k = 0; k < o->ranks; k++) {
        if (o->open[k]) mt_st_close(&o->files[k]);
        mt_shard_layout_free(&o->layout[k]);
    }
    free(o->layout);
    free(o->files);
    free(o->open);
}

static int open_shards(const char *dir, const marker *mk, const mt_shard_layout *sl,
                       old_shards *o, mt_error *err) {
    *o = (old_shards){.ranks = mk->ranks};
    o->layout = mt_calloc_or_die((size_t)mk->ranks, sizeof *o->layout);
    o->files = mt_calloc_or_die((size_t)mk->ranks, sizeof *o->files);
    o->open = mt_calloc_or_die((size_t)mk->ranks, 1);
    int rc = 0;
    for (int k = 0; k < mk->ranks && rc == 0; k++) {
        rc = mt_shard_layout_init(&o->layout[k], sl->table, k, mk->ranks, err);
        int overlaps = 0;
        for (int l = 0; l < sl->table->n_layers && rc == 0; l++)
            overlaps |= o->layout[k].part[l].begin < sl->part[l].end &&
                        sl->part[l].begin < o->layout[k].part[l].end;
        char name[64];
        shard_name(name, sizeof name, k, mk->ranks);
        if (rc == 0 && overlaps) rc = check_file(dir, name, mk, err);
        if (rc == 0 && overlaps) {
            char *path = mt_path_join(dir, name);
            rc = mt_st_open(&o->files[k], path, err);
            o->open[k] = rc == 0;
            free(path);
        }
    }
    if (rc) close_shards(o);
    return rc;
}

/* Copies this layout's part of layer l of w, m and v (dst[0..2], where the
 * part starts) from the old ranks' files that hold pieces of it; counts
 * the elements into *copied. */
static int copy_layer(const old_shards *o, const mt_shard_layout *sl, int l, float *dst[3],
                      size_t *copied, mt_error *err) {
    const char *prefix[3] = {"w", "m", "v"};
    mt_shard_range mine = sl->part[l];
    for (int k = 0; k < o->ranks; k++) {
        mt_shard_range theirs = o->layout[k].part[l];
        size_t b = mine.begin > theirs.begin ? mine.begin : theirs.begin;
        size_t e = mine.end < theirs.end ? mine.end : theirs.end;
        if (b >= e) continue;
        const mt_st_file *f = &o->files[k];
        for (int a = 0; a < 3; a++) {
            char name[32];
            snprintf(name, sizeof name, "%s.%d", prefix[a], l);
            const mt_st_tensor_info *ti = mt_st_find(f, name);
            if (!ti) return mt_errorf(err, "%s: tensor \"%s\" is missing", f->path, name);
            size_t want = theirs.end - theirs.begin;
            if (ti->dtype != MT_DTYPE_F32 || ti->ndim != 1 || (size_t)ti->shape[0] != want)
                return mt_errorf(err, "%s: tensor \"%s\" is %s of %d dims [%lld, ...], expected "
                                 "F32 [%zu]: the shard does not belong to this model", f->path,
                                 name, mt_dtype_name(ti->dtype), ti->ndim,
                                 (long long)ti->shape[0], want);
            memcpy(dst[a] + (b - mine.begin),
                   (const char *)ti->data + (b - theirs.begin) * sizeof(float),
                   (e - b) * sizeof(float));
        }
        *copied += e - b;
    }
    return 0;
}

/* The marker, and config.json checked against cfg. */
static int begin_load(const char *dir, const mt_config *cfg, marker *mk, mt_error *err) {
    int rc = read_marker(dir, mk, err);
    if (rc == 0) rc = check_file(dir, "config.json", mk, err);
    if (rc == 0) {
        char *cpath = mt_path_join(dir, "config.json");
        mt_config saved;
        rc = mt_config_load(&saved, cpath, err);
        if (rc == 0) rc = mt_ckpt_compare_configs(&saved, cfg, cpath, err);
        free(cpath);
    }
    return rc;
}

/* The trainer's state (state_json may be NULL), and the marker freed. */
static int end_load(const char *dir, marker *mk, int rc, char **state_json, mt_error *err) {
    if (rc == 0 && state_json) {
        rc = check_file(dir, "trainer_state.json", mk, err);
        if (rc == 0) rc = mt_ckpt_load_state(dir, mk->step, state_json, err);
    }
    cJSON_Delete(mk->root);
    return rc;
}

int mt_shard_ckpt_load(const char *dir, mt_shard_store *s, const mt_config *cfg,
                       char **state_json, mt_error *err) {
    if (state_json) *state_json = NULL;
    const mt_shard_layout *sl = &s->layout;
    marker mk;
    old_shards o;
    int rc = begin_load(dir, cfg, &mk, err);
    if (rc == 0 && (rc = open_shards(dir, &mk, sl, &o, err)) == 0) {
        size_t copied = 0, owned = 0, most = mt_disk_state_max_numel(s->disk);
        /* a disk layer's parts of m and v pass through RAM on their way to the disk */
        float *mv = s->disk ? mt_malloc_or_die(2 * most * sizeof(float)) : NULL;
        for (int l = 0; l < sl->table->n_layers && rc == 0; l++) {
            float *dst[3] = {s->w + sl->local[l], s->m + sl->local[l], s->v + sl->local[l]};
            int away = mt_disk_state_on_disk(s->disk, l);
            if (away) dst[1] = mv, dst[2] = mv + most;
            owned += mt_shard_len(sl, l);
            rc = copy_layer(&o, sl, l, dst, &copied, err);
            if (rc == 0 && away) rc = mt_disk_state_write(s->disk, l, NULL, dst[1], dst[2], err);
        }
        free(mv);
        MT_ASSERT(rc != 0 || copied == owned); /* the old ranks' parts cover every layer */
        close_shards(&o);
    }
    rc = end_load(dir, &mk, rc, state_json, err);
    if (rc)
        mt_error_prefix(err, "loading sharded checkpoint as rank %d of %d: ", sl->rank,
                        sl->ranks);
    return rc;
}

int mt_shard_ckpt_load_layers(const char *dir, const mt_param_table *t, const mt_config *cfg,
                              char **state_json, mt_shard_layer_sink sink, void *ctx,
                              mt_error *err) {
    if (state_json) *state_json = NULL;
    mt_shard_layout one;
    if (mt_shard_layout_init(&one, t, 0, 1, err)) return -1;
    marker mk;
    old_shards o;
    int rc = begin_load(dir, cfg, &mk, err);
    if (rc == 0 && (rc = open_shards(dir, &mk, &one, &o, err)) == 0) {
        size_t most = t->max_layer_numel ? t->max_layer_numel : 1, copied = 0;
        float *buf = mt_malloc_or_die(3 * most * sizeof(float));
        for (int l = 0; l < t->n_layers && rc == 0; l++) {
            float *dst[3] = {buf, buf + most, buf + 2 * most};
            size_t before = copied;
            rc = copy_layer(&o, &one, l, dst, &copied, err);
            MT_ASSERT(rc != 0 || copied - before == t->layers[l].numel);
            if (rc == 0) rc = sink(ctx, l, dst[0], dst[1], dst[2], err);
        }
        free(buf);
        close_shards(&o);
    }
    mt_shard_layout_free(&one);
    rc = end_load(dir, &mk, rc, state_json, err);
    if (rc) mt_error_prefix(err, "loading sharded checkpoint in one process: ");
    return rc;
}

int mt_shard_ckpt_ranks(const char *dir, mt_error *err) {
    char *path = mt_path_join(dir, "COMPLETE"), *text = NULL;
    size_t len;
    int rc = mt_read_file(path, &text, &len, err);
    if (rc == 0) {
        cJSON *root = cJSON_Parse(text);
        const cJSON *rk = cJSON_GetObjectItemCaseSensitive(root, "ranks");
        if (!root)
            rc = mt_errorf(err, "%s: corrupt marker (not JSON)", path);
        else if (rk && (!cJSON_IsNumber(rk) || rk->valuedouble < 1 || rk->valuedouble > (1 << 20)))
            rc = mt_errorf(err, "%s: corrupt marker (\"ranks\" is not a count)", path);
        else
            rc = rk ? rk->valueint : 0;
        cJSON_Delete(root);
    }
    free(text);
    free(path);
    return rc;
}
