/* Reading and writing Hugging Face safetensors files and model directories.
 *
 * File format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {"k": "v", ...},
 *    "name": {"dtype": "BF16", "shape": [R, C], "data_offsets": [begin, end]}, ...}
 * then the data section; offsets are relative to its start.
 *
 * Reader: a file is mapped read-only (never copied), and every header field
 * is checked against the file before anything points into it, so a hostile
 * or truncated file gives an error message, never an out-of-bounds read.
 * A model directory is either model.safetensors or shards named by
 * model.safetensors.index.json ("weight_map": name -> shard file).
 *
 * Writer: streams the header and then each tensor in the given order
 * (fp32 sources are narrowed to BF16/F16 in chunks), under a temporary name
 * renamed into place after fsync. The sharded writer splits tensors in order
 * into model-0000i-of-0000N.safetensors plus an index exactly as
 * transformers' save_pretrained does. */
#ifndef MT_IO_SAFETENSORS_H
#define MT_IO_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "io/dtype.h"
#include "util/error.h"

#define MT_ST_MAX_DIMS 8

typedef struct mt_st_tensor_info {
    const char *name;
    const char *file;            /* path of the file holding it, for messages */
    mt_dtype dtype;
    int ndim;                    /* 0 for a scalar */
    int64_t shape[MT_ST_MAX_DIMS];
    size_t numel;                /* product of shape (1 for a scalar) */
    size_t nbytes;               /* numel * dtype size, checked against data_offsets */
    size_t offset;               /* begin, from the start of the data section */
    const void *data;            /* into the mapping; may be unaligned */
} mt_st_tensor_info;

typedef struct mt_st_kv {
    const char *key;
    const char *value;
} mt_st_kv;

/* One open .safetensors file. Fields are read-only for callers. */
typedef struct mt_st_file {
    char *path;
    void *map;                   /* whole file, PROT_READ */
    size_t size;
    int n_tensors;
    mt_st_tensor_info *tensors;  /* (n_tensors) in data_offsets order */
    const mt_st_tensor_info **by_name; /* (n_tensors) into tensors, sorted by name */
    int n_meta;
    mt_st_kv *meta;              /* (n_meta) the __metadata__ map */
} mt_st_file;

/* Maps and validates path. Tensors of dtypes megatrain cannot convert
 * (F64, U8, F8_E4M3, ...) are listed; reading them is the error. On failure
 * f is left empty (safe to mt_st_close). */
int mt_st_open(mt_st_file *f, const char *path, mt_error *err);
void mt_st_close(mt_st_file *f);

/* Tensor called name, or NULL. */
const mt_st_tensor_info *mt_st_find(const mt_st_file *f, const char *name);

/* Value of __metadata__[key], or NULL. */
const char *mt_st_meta(const mt_st_file *f, const char *key);

/* Copies t into dst (n floats, which must equal t->numel), widening BF16 and
 * F16 exactly. Any other dtype is an error that says how to convert. */
int mt_st_read_f32(const mt_st_tensor_info *t, float *dst, size_t n, mt_error *err);

/* Copies elements [first, first + n) of t (in row-major order) into dst,
 * widened as mt_st_read_f32 does: one expert's slice of a fused tensor. */
int mt_st_read_f32_range(const mt_st_tensor_info *t, size_t first, float *dst, size_t n,
                         mt_error *err);

/* Copies an I32 or I64 tensor into dst (n == t->numel) as int64. */
int mt_st_read_i64(const mt_st_tensor_info *t, int64_t *dst, size_t n, mt_error *err);

/* A model directory: every tensor of every shard, by name. */
typedef struct mt_st_model {
    char *dir;
    int n_files;
    mt_st_file *files;           /* (n_files) each shard opened once */
    int n_tensors;
    const mt_st_tensor_info **tensors; /* (n_tensors) sorted by name */
} mt_st_model;

/* Opens dir/model.safetensors.index.json and its shards, or else
 * dir/model.safetensors. On failure m is left empty. */
int mt_st_model_open(mt_st_model *m, const char *dir, mt_error *err);
void mt_st_model_close(mt_st_model *m);
const mt_st_tensor_info *mt_st_model_find(const mt_st_model *m, const char *name);

/* Produces elements [first, first + count) of tensor t as fp32 into dst:
 * how a caller supplies data lazily (gathered, computed, copied from a GPU). */
struct mt_st_write_tensor;
typedef int (*mt_st_fill_fn)(void *ctx, const struct mt_st_write_tensor *t, size_t first,
                             size_t count, float *dst, mt_error *err);

/* One tensor to write: exactly one of f32, raw, fill is set.
 *   f32:  numel fp32 values, narrowed to dtype (F32, BF16, F16 only)
 *   raw:  the bytes as stored, numel * size of dtype (any writable dtype)
 *   fill: fp32 values produced on demand (F32, BF16, F16 only) */
typedef struct mt_st_write_tensor {
    const char *name;
    mt_dtype dtype;              /* F32, BF16, F16, I32 or I64 */
    int ndim;
    int64_t shape[MT_ST_MAX_DIMS];
    const float *f32;
    const void *raw;
    mt_st_fill_fn fill;
    void *fill_ctx;
} mt_st_write_tensor;

/* Writes tensors t[0..n) in order to path, atomically, with an optional
 * __metadata__ map (transformers expects {"format": "pt"}). */
int mt_st_write(const char *path, const mt_st_write_tensor *t, int n, const mt_st_kv *meta,
                int n_meta, mt_error *err);

/* Writes a model into the existing directory dir as transformers does: if
 * everything fits in max_shard_bytes, one model.safetensors; otherwise
 * model-%05d-of-%05d.safetensors files holding consecutive tensors (a tensor
 * larger than the limit gets a shard of its own) and
 * model.safetensors.index.json {"metadata": {"total_parameters",
 * "total_size"}, "weight_map"}. A stale file of the other layout is removed
 * so loaders cannot pick old weights. */
int mt_st_write_sharded(const char *dir, const mt_st_write_tensor *t, int n,
                        const mt_st_kv *meta, int n_meta, size_t max_shard_bytes,
                        mt_error *err);

#endif
