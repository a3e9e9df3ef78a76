/* safetensors reader: maps a file, validates its JSON header field by field
 * against the file size, and converts tensors to fp32. Also opens a Hugging
 * Face model directory, sharded or not. The writer is in safetensors_write.c. */
#include "io/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/file.h"
#include "util/mem.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; megatrain reads it in place"
#endif

/* The reference implementation refuses larger headers; so do we, so that a
 * corrupt length cannot make us parse gigabytes. */
#define MAX_HEADER_BYTES ((uint64_t)100000000)

#define HOW_TO_CONVERT                                                             \
    "megatrain reads F32, BF16, F16 (convert the checkpoint with e.g. "            \
    "AutoModelForCausalLM.from_pretrained(dir, torch_dtype=torch.bfloat16)"       \
    ".save_pretrained(out))"

/* ---- header parsing ---------------------------------------------------- */

/* A JSON number that is an exact non-negative integer below 2^53 (beyond
 * that cJSON's double cannot hold every integer exactly). */
static bool json_size(const cJSON *j, size_t *out) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0) || d >= 9007199254740992.0 || d != floor(d)) return false;
    *out = (size_t)d;
    return true;
}

static int parse_shape(const char *path, const char *name, const cJSON *js,
                       mt_st_tensor_info *t, mt_error *err) {
    if (!cJSON_IsArray(js))
        return mt_errorf(err, "%s: tensor '%s': \"shape\" is %s, expected an array of integers",
                         path, name, js ? "not an array" : "missing");
    int nd = cJSON_GetArraySize(js);
    if (nd > MT_ST_MAX_DIMS)
        return mt_errorf(err, "%s: tensor '%s' has %d dimensions; megatrain supports at most %d",
                         path, name, nd, MT_ST_MAX_DIMS);
    t->ndim = nd;
    size_t numel = 1;
    int i = 0;
    for (const cJSON *d = js->child; d; d = d->next, i++) {
        size_t v;
        if (!json_size(d, &v))
            return mt_errorf(err, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                             path, name, i);
        if (!mt_mul_size(numel, v, &numel))
            return mt_errorf(err, "%s: tensor '%s': the product of its shape overflows", path,
                             name);
        t->shape[i] = (int64_t)v;
    }
    t->numel = numel;
    size_t bits;
    if (!mt_mul_size(numel, (size_t)mt_dtype_bits(t->dtype), &bits))
        return mt_errorf(err, "%s: tensor '%s': its byte size overflows", path, name);
    if (bits % 8 != 0)
        return mt_errorf(err, "%s: tensor '%s': %zu elements of %s do not fill whole bytes",
                         path, name, numel, mt_dtype_name(t->dtype));
    t->nbytes = bits / 8;
    return 0;
}

/* Fills t from one header entry; t->name must already be set. */
static int parse_entry(const char *path, const cJSON *e, mt_st_tensor_info *t, mt_error *err) {
    const char *name = t->name;
    if (!cJSON_IsObject(e))
        return mt_errorf(err, "%s: header entry '%s' is not an object with dtype, shape, "
                         "data_offsets", path, name);
    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    if (!cJSON_IsString(jd))
        return mt_errorf(err, "%s: tensor '%s': \"dtype\" is %s, expected a string like \"BF16\"",
                         path, name, jd ? "not a string" : "missing");
    if (!mt_dtype_from_name(jd->valuestring, &t->dtype))
        return mt_errorf(err, "%s: tensor '%s' has unknown dtype \"%.32s\", which is not a "
                         "safetensors dtype; " HOW_TO_CONVERT, path, name, jd->valuestring);
    if (parse_shape(path, name, cJSON_GetObjectItemCaseSensitive(e, "shape"), t, err)) return -1;

    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    size_t begin, end;
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_size(jo->child, &begin) ||
        !json_size(jo->child->next, &end))
        return mt_errorf(err, "%s: tensor '%s': \"data_offsets\" is %s, expected [begin, end] "
                         "with non-negative integers", path, name, jo ? "malformed" : "missing");
    if (begin > end)
        return mt_errorf(err, "%s: tensor '%s': data_offsets [%zu, %zu] has begin > end", path,
                         name, begin, end);
    if (end - begin != t->nbytes)
        return mt_errorf(err, "%s: tensor '%s': data_offsets [%zu, %zu] span %zu bytes but "
                         "%zu elements of %s take %zu bytes", path, name, begin, end,
                         end - begin, t->numel, mt_dtype_name(t->dtype), t->nbytes);
    t->offset = begin;
    return 0;
}

static int parse_metadata(mt_st_file *f, const cJSON *jm, mt_error *err) {
    if (!cJSON_IsObject(jm))
        return mt_errorf(err, "%s: \"__metadata__\" is not an object of strings", f->path);
    f->meta = mt_calloc_or_die((size_t)cJSON_GetArraySize(jm) + 1, sizeof *f->meta);
    for (const cJSON *kv = jm->child; kv; kv = kv->next) {
        if (!cJSON_IsString(kv))
            return mt_errorf(err, "%s: __metadata__[\"%s\"] is not a string", f->path,
                             kv->string);
        f->meta[f->n_meta].key = mt_strdup_or_die(kv->string);
        f->meta[f->n_meta].value = mt_strdup_or_die(kv->valuestring);
        f->n_meta++;
    }
    return 0;
}

static int cmp_offset(const void *a, const void *b) {
    const mt_st_tensor_info *x = a, *y = b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

/* Sorting callbacks get no context argument: by_name sorts pointers. */
static int cmp_info_ptr_name(const void *a, const void *b) {
    const mt_st_tensor_info *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Sorts the tensors by offset, builds the by-name index (rejecting
 * duplicate names), and checks that the tensors lie inside the data section
 * without overlapping. */
static int check_layout(mt_st_file *f, size_t data_start, mt_error *err) {
    size_t data_size = f->size - data_start;
    int n = f->n_tensors;
    qsort(f->tensors, (size_t)n, sizeof *f->tensors, cmp_offset);

    const mt_st_tensor_info **ptrs = mt_malloc_or_die(((size_t)n + 1) * sizeof *ptrs);
    for (int i = 0; i < n; i++) ptrs[i] = &f->tensors[i];
    qsort(ptrs, (size_t)n, sizeof *ptrs, cmp_info_ptr_name);
    f->by_name = ptrs;
    for (int i = 1; i < n; i++)
        if (strcmp(ptrs[i]->name, ptrs[i - 1]->name) == 0)
            return mt_errorf(err, "%s: tensor name '%s' appears twice in the header", f->path,
                             ptrs[i]->name);

    const mt_st_tensor_info *prev = NULL;
    for (int i = 0; i < n; i++) {
        mt_st_tensor_info *t = &f->tensors[i];
        if (t->offset + t->nbytes > data_size)
            return mt_errorf(err, "%s: tensor '%s' needs bytes [%zu, %zu) of the data section "
                             "but it holds only %zu bytes: the file is truncated or corrupt",
                             f->path, t->name, t->offset, t->offset + t->nbytes, data_size);
        t->data = (const char *)f->map + data_start + t->offset;
        if (t->nbytes == 0) continue;  /* empty tensors own no bytes */
        if (prev && t->offset < prev->offset + prev->nbytes)
            return mt_errorf(err, "%s: tensors '%s' [%zu, %zu) and '%s' [%zu, %zu) overlap in "
                             "the data section", f->path, prev->name, prev->offset,
                             prev->offset + prev->nbytes, t->name, t->offset,
                             t->offset + t->nbytes);
        prev = t;
    }
    return 0;
}

static int parse_header(mt_st_file *f, const char *json, size_t len, mt_error *err) {
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, 0);
    if (!root)
        return mt_errorf(err, "%s: header is not valid JSON (error near header byte %td): not "
                         "a safetensors file or corrupt", f->path, end ? end - json : (ptrdiff_t)0);
    int rc = 0;
    for (const char *p = end; p < json + len && rc == 0; p++)
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r')
            rc = mt_errorf(err, "%s: unexpected bytes after the header JSON (at header byte %td)",
                           f->path, p - json);
    if (rc == 0 && !cJSON_IsObject(root))
        rc = mt_errorf(err, "%s: header is JSON but not an object: not a safetensors file",
                       f->path);
    if (rc == 0) {
        f->tensors = mt_calloc_or_die((size_t)cJSON_GetArraySize(root) + 1, sizeof *f->tensors);
        int n_meta_seen = 0;
        for (const cJSON *e = root->child; e && rc == 0; e = e->next) {
            if (strcmp(e->string, "__metadata__") == 0) {
                rc = n_meta_seen++ ? mt_errorf(err, "%s: \"__metadata__\" appears twice",
                                               f->path)
                                   : parse_metadata(f, e, err);
                continue;
            }
            mt_st_tensor_info *t = &f->tensors[f->n_tensors++];
            t->name = mt_strdup_or_die(e->string);
            t->file = f->path;
            rc = parse_entry(f->path, e, t, err);
        }
    }
    cJSON_Delete(root);
    return rc;
}

/* ---- files ------------------------------------------------------------- */

static int map_file(mt_st_file *f, const char *path, mt_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_errorf(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        rc = mt_errorf(err, "%s: not a regular file", path);
    else if (st.st_size < 8)
        rc = mt_errorf(err, "%s: file is %lld bytes, shorter than the 8-byte header length: "
                       "not a safetensors file, or truncated", path, (long long)st.st_size);
    if (rc == 0) {
        f->size = (size_t)st.st_size;
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            rc = mt_errorf(err, "%s: cannot map %zu bytes: %s", path, f->size, strerror(errno));
        }
    }
    close(fd);
    return rc;
}

int mt_st_open(mt_st_file *f, const char *path, mt_error *err) {
    memset(f, 0, sizeof *f);
    f->path = mt_strdup_or_die(path);
    if (map_file(f, path, err)) goto fail;
    uint64_t hlen;
    memcpy(&hlen, f->map, 8);  /* little-endian, checked above */
    if (hlen > MAX_HEADER_BYTES) {
        mt_errorf(err, "%s: header length %llu is absurd (limit %llu): not a safetensors file "
                  "or corrupt", path, (unsigned long long)hlen,
                  (unsigned long long)MAX_HEADER_BYTES);
        goto fail;
    }
    if (hlen > f->size - 8) {
        mt_errorf(err, "%s: header length %llu runs past the end of the %zu-byte file: "
                  "truncated or not a safetensors file", path, (unsigned long long)hlen, f->size);
        goto fail;
    }
    if (parse_header(f, (const char *)f->map + 8, (size_t)hlen, err)) goto fail;
    if (check_layout(f, 8 + (size_t)hlen, err)) goto fail;
    return 0;
fail:
    mt_st_close(f);
    return -1;
}

void mt_st_close(mt_st_file *f) {
    if (f->map) munmap(f->map, f->size);
    for (int i = 0; i < f->n_tensors; i++) free((char *)f->tensors[i].name);
    for (int i = 0; i < f->n_meta; i++) {
        free((char *)f->meta[i].key);
        free((char *)f->meta[i].value);
    }
    free(f->tensors);
    free(f->by_name);
    free(f->meta);
    free(f->path);
    memset(f, 0, sizeof *f);
}

/* The tensor called name in sorted (n, ascending names), NULL if none. */
static const mt_st_tensor_info *find_sorted(const mt_st_tensor_info *const *sorted, int n,
                                            const char *name) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, sorted[mid]->name);
        if (c == 0) return sorted[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const mt_st_tensor_info *mt_st_find(const mt_st_file *f, const char *name) {
    return find_sorted(f->by_name, f->n_tensors, name);
}

const char *mt_st_meta(const mt_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[i].key, key) == 0) return f->meta[i].value;
    return NULL;
}

/* ---- conversion -------------------------------------------------------- */

/* 16-bit source at any alignment: mapped data need not be 2-byte aligned,
 * so an unaligned one goes through a small aligned bounce buffer. */
static void widen16(const void *src, float *dst, size_t n, mt_dtype dt) {
    void (*conv)(const uint16_t *, float *, size_t) =
        dt == MT_DTYPE_BF16 ? mt_bf16_to_f32_array : mt_f16_to_f32_array;
    if ((uintptr_t)src % sizeof(uint16_t) == 0) {
        conv(src, dst, n);
        return;
    }
    uint16_t tmp[4096];
    for (size_t i = 0; i < n; i += 4096) {
        size_t k = n - i < 4096 ? n - i : 4096;
        memcpy(tmp, (const char *)src + 2 * i, 2 * k);
        conv(tmp, dst + i, k);
    }
}

int mt_st_read_f32(const mt_st_tensor_info *t, float *dst, size_t n, mt_error *err) {
    if (!mt_dtype_is_float(t->dtype))
        return mt_errorf(err, "unsupported dtype %s for tensor '%s' in %s; " HOW_TO_CONVERT,
                         mt_dtype_name(t->dtype), t->name, t->file);
    if (n != t->numel)
        return mt_errorf(err, "%s: tensor '%s' has %zu elements, but %zu were expected (does "
                         "config.json match the weights?)", t->file, t->name, t->numel, n);
    if (t->dtype == MT_DTYPE_F32) memcpy(dst, t->data, n * sizeof(float));
    else widen16(t->data, dst, n, t->dtype);
    return 0;
}

int mt_st_read_f32_range(const mt_st_tensor_info *t, size_t first, float *dst, size_t n,
                         mt_error *err) {
    if (!mt_dtype_is_float(t->dtype))
        return mt_errorf(err, "unsupported dtype %s for tensor '%s' in %s; " HOW_TO_CONVERT,
                         mt_dtype_name(t->dtype), t->name, t->file);
    if (first > t->numel || n > t->numel - first)
        return mt_errorf(err, "%s: tensor '%s' has %zu elements, fewer than the %zu + %zu "
                         "expected (does config.json match the weights?)", t->file, t->name,
                         t->numel, first, n);
    size_t es = t->dtype == MT_DTYPE_F32 ? 4 : 2;
    const char *src = (const char *)t->data + first * es;
    if (t->dtype == MT_DTYPE_F32) memcpy(dst, src, n * sizeof(float));
    else widen16(src, dst, n, t->dtype);
    return 0;
}

int mt_st_read_i64(const mt_st_tensor_info *t, int64_t *dst, size_t n, mt_error *err) {
    if (t->dtype != MT_DTYPE_I64 && t->dtype != MT_DTYPE_I32)
        return mt_errorf(err, "%s: tensor '%s' is %s, expected I32 or I64", t->file, t->name,
                         mt_dtype_name(t->dtype));
    if (n != t->numel)
        return mt_errorf(err, "%s: tensor '%s' has %zu elements, but %zu were expected",
                         t->file, t->name, t->numel, n);
    if (t->dtype == MT_DTYPE_I64) {
        memcpy(dst, t->data, n * sizeof(int64_t));
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t v;
        memcpy(&v, (const char *)t->data + 4 * i, 4);
        dst[i] = v;
    }
    return 0;
}

/* ---- model directories ------------------------------------------------- */

/* Sorts m->tensors by name; two entries with one name are an error. */
static int index_model(mt_st_model *m, const char *what, mt_error *err) {
    qsort(m->tensors, (size_t)m->n_tensors, sizeof *m->tensors, cmp_info_ptr_name);
    for (int i = 1; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i]->name, m->tensors[i - 1]->name) == 0)
            return mt_errorf(err, "%s: tensor '%s' is listed twice", what, m->tensors[i]->name);
    return 0;
}

/* Index of the shard called name in m->files, opening it on first use. */
static int shard_for(mt_st_model *m, const char *index_path, const char *name,
                     const char *tensor, mt_error *err) {
    for (int i = 0; i < m->n_files; i++) {
        const char *base = strrchr(m->files[i].path, '/');
        if (strcmp(base ? base + 1 : m->files[i].path, name) == 0) return i;
    }
    if (!*name || strchr(name, '/') || strcmp(name, "..") == 0 || strcmp(name, ".") == 0)
        return mt_errorf(err, "%s: tensor '%s' maps to \"%s\", which is not a file name in the "
                         "model directory", index_path, tensor, name);
    char *path = mt_path_join(m->dir, name);
    if (!mt_file_exists(path)) {
        mt_errorf(err, "%s: shard %s (holding tensor '%s') does not exist: incomplete "
                  "download? fetch the missing file", index_path, path, tensor);
        free(path);
        return -1;
    }
    int rc = mt_st_open(&m->files[m->n_files], path, err);
    free(path);
    return rc ? -1 : m->n_files++;
}

static int open_sharded(mt_st_model *m, const char *index_path, mt_error *err) {
    char *text;
    size_t len;
    if (mt_read_file(index_path, &text, &len, err)) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    int rc = 0;
    if (!cJSON_IsObject(wm)) {
        rc = mt_errorf(err, "%s: %s", index_path, root ? "no \"weight_map\" object"
                                                       : "not valid JSON");
        goto done;
    }
    int n = cJSON_GetArraySize(wm);
    m->files = mt_calloc_or_die((size_t)n + 1, sizeof *m->files);
    m->tensors = mt_calloc_or_die((size_t)n + 1, sizeof *m->tensors);
    for (const cJSON *e = wm->child; e && rc == 0; e = e->next) {
        if (!cJSON_IsString(e)) {
            rc = mt_errorf(err, "%s: weight_map[\"%s\"] is not a file name", index_path, e->string);
            break;
        }
        int s = shard_for(m, index_path, e->valuestring, e->string, err);
        if (s < 0) { rc = -1; break; }
        const mt_st_tensor_info *t = mt_st_find(&m->files[s], e->string);
        if (!t)
            rc = mt_errorf(err, "%s: tensor '%s' is not in its shard %s: the index and the "
                           "shards do not belong together", index_path, e->string,
                           m->files[s].path);
        m->tensors[m->n_tensors++] = t;
    }
    if (rc == 0) rc = index_model(m, index_path, err);
done:
    cJSON_Delete(root);
    return rc;
}

int mt_st_model_open(mt_st_model *m, const char *dir, mt_error *err) {
    memset(m, 0, sizeof *m);
    m->dir = mt_strdup_or_die(dir);
    char *index_path = mt_path_join(dir, "model.safetensors.index.json");
    char *single_path = mt_path_join(dir, "model.safetensors");
    int rc;
    if (mt_file_exists(index_path)) {
        rc = open_sharded(m, index_path, err);
    } else if (mt_file_exists(single_path)) {
        m->files = mt_calloc_or_die(1, sizeof *m->files);
        rc = mt_st_open(&m->files[0], single_path, err);
        if (rc == 0) {
            m->n_files = 1;
            m->tensors = mt_calloc_or_die((size_t)m->files[0].n_tensors + 1, sizeof *m->tensors);
            for (int i = 0; i < m->files[0].n_tensors; i++)
                m->tensors[m->n_tensors++] = &m->files[0].tensors[i];
            rc = index_model(m, single_path, err);
        }
    } else {
        rc = mt_errorf(err, "%s: no model.safetensors.index.json or model.safetensors found; "
                       "expected a Hugging Face model directory with safetensors weights "
                       "(for pytorch_model.bin, re-save the model with save_pretrained)", dir);
    }
    free(index_path);
    free(single_path);
    if (rc) mt_st_model_close(m);
    return rc;
}

void mt_st_model_close(mt_st_model *m) {
    for (int i = 0; i < m->n_files; i++) mt_st_close(&m->files[i]);
    free(m->files);
    free(m->tensors);
    free(m->dir);
    memset(m, 0, sizeof *m);
}

const mt_st_tensor_info *mt_st_model_find(const mt_st_model *m, const char *name) {
    return find_sorted(m->tensors, m->n_tensors, name);
}
