/* Tests of src/dist/shard.{h,c}: the cut of a range among n ranks for many
 * sizes and rank counts, and the layouts of whole models: every element
 * owned exactly once, parts aligned and whole chunks, tensor pieces exact, and
 * the rank arrays put side by side giving back the full array bitwise. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dist/shard.h"
#include "testlib.h"

static void check_split(size_t n, int ranks) {
    size_t at = 0, chunk = mt_shard_chunk(n, ranks);
    size_t units_n = (n + MT_SHARD_ALIGN - 1) / MT_SHARD_ALIGN;
    /* a chunk is the units divided among the ranks, rounded up */
    cr_assert_eq(chunk % MT_SHARD_ALIGN, 0, "n=%zu ranks=%d", n, ranks);
    cr_assert(chunk / MT_SHARD_ALIGN * (size_t)ranks >= units_n, "n=%zu ranks=%d", n, ranks);
    cr_assert(chunk == 0 || (chunk / MT_SHARD_ALIGN - 1) * (size_t)ranks < units_n,
              "n=%zu ranks=%d: chunk %zu larger than needed", n, ranks, chunk);
    for (int r = 0; r < ranks; r++) {
        mt_shard_range p = mt_shard_split(n, ranks, r);
        cr_assert_eq(p.begin, at, "n=%zu ranks=%d rank %d: not contiguous", n, ranks, r);
        cr_assert(p.end >= p.begin, "n=%zu ranks=%d rank %d", n, ranks, r);
        /* an empty part (more ranks than units) sits at the end, aligned or not */
        if (p.end > p.begin)
            cr_assert_eq(p.begin % MT_SHARD_ALIGN, 0, "n=%zu ranks=%d rank %d: unaligned", n,
                         ranks, r);
        /* every part is one whole chunk until the range ends */
        if (p.end != n)
            cr_assert_eq(p.end - p.begin, chunk, "n=%zu ranks=%d rank %d: %zu floats, chunk %zu",
                         n, ranks, r, p.end - p.begin, chunk);
        else
            cr_assert(p.end - p.begin <= chunk, "n=%zu ranks=%d rank %d", n, ranks, r);
        /* its place is the rank's chunk: what a collective of chunks expects */
        cr_assert(p.begin == n || p.begin == (size_t)r * chunk, "n=%zu ranks=%d rank %d", n,
                  ranks, r);
        at = p.end;
    }
    cr_assert_eq(at, n, "n=%zu ranks=%d: parts end at %zu", n, ranks, at);
}

Test(dist_shard, split_many_sizes) {
    static const size_t sizes[] = {0, 1, 15, 16, 17, 31, 32, 33, 1000, 1023, 1024, 1025,
                                   4096, 65536 + 16, 65536 * 3 + 5, 12345678};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        for (int ranks = 1; ranks <= 17; ranks++) check_split(sizes[i], ranks);
    /* random sizes and rank counts */
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < 2000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        check_split((size_t)(x % 5000000), 1 + (int)((x >> 40) % 64));
    }
}

Test(dist_shard, split_more_ranks_than_units) {
    /* 3 units among 5 ranks: 1,1,1,0,0 */
    size_t want[5] = {16, 16, 8, 0, 0};
    for (int r = 0; r < 5; r++) {
        mt_shard_range p = mt_shard_split(40, 5, r);
        cr_assert_eq(p.end - p.begin, want[r], "rank %d", r);
    }
}

/* Configs of several shapes: the tiny default, untied with q/k norms and
 * biases, and odd sizes. */
static void configs(mt_config out[3]) {
    mt_config_default_tiny(&out[0]);
    out[1] = out[0];
    out[1].tie_embeddings = false;
    out[1].qkv_bias = true;
    out[1].qk_norm = true;
    out[2] = out[0];
    out[2].C = 48;
    out[2].F = 136;
    out[2].V = 1001;
    out[2].L = 3;
}

Test(dist_shard, layouts_own_every_element_once) {
    mt_config cfgs[3];
    configs(cfgs);
    for (int c = 0; c < 3; c++) {
        mt_param_table t;
        mt_error err;
        cr_assert_eq(mt_params_init(&t, &cfgs[c], &err), 0, "%s", err.msg);
        uint8_t *owned = calloc(t.total, 1), *in_piece = calloc(t.total, 1);
        for (int ranks = 1; ranks <= 7; ranks++) {
            memset(owned, 0, t.total);
            memset(in_piece, 0, t.total);
            for (int r = 0; r < ranks; r++) {
                mt_shard_layout sl;
                cr_assert_eq(mt_shard_layout_init(&sl, &t, r, ranks, &err), 0, "%s", err.msg);
                size_t local_end = 0;
                for (int l = 0; l < t.n_layers; l++) {
                    const mt_layer_desc *ld = &t.layers[l];
                    cr_assert_eq(sl.local[l] % MT_LAYER_ALIGN, 0, "parts start on a page");
                    cr_assert(sl.local[l] >= local_end, "local parts overlap");
                    local_end = sl.local[l] + mt_shard_len(&sl, l);
                    for (size_t i = sl.part[l].begin; i < sl.part[l].end; i++)
                        owned[ld->offset + i]++;
                    mt_shard_piece *pc = malloc((size_t)ld->n_tensors * sizeof *pc);
                    int n = mt_shard_pieces(&sl, l, pc);
                    for (int k = 0; k < n; k++) {
                        const mt_tensor_desc *td = &ld->tensors[pc[k].tensor];
                        cr_assert(pc[k].first + pc[k].n <= td->numel);
                        size_t at = ld->offset + td->offset + pc[k].first;
                        /* the piece's local place maps back to the same element */
                        cr_assert_eq(pc[k].local - sl.local[l] + sl.part[l].begin,
                                     td->offset + pc[k].first);
                        for (size_t i = 0; i < pc[k].n; i++) in_piece[at + i]++;
                    }
                    free(pc);
                }
                cr_assert(local_end <= sl.total);
                mt_shard_layout_free(&sl);
            }
            for (int l = 0; l < t.n_layers; l++) {
                const mt_layer_desc *ld = &t.layers[l];
                for (size_t i = 0; i < ld->numel; i++)
                    cr_assert_eq(owned[ld->offset + i], 1, "config %d ranks %d layer %d elem %zu",
                                 c, ranks, l, i);
                /* tensor elements in exactly one piece, padding in none */
                size_t in_tensors = 0;
                for (int k = 0; k < ld->n_tensors; k++) {
                    const mt_tensor_desc *td = &ld->tensors[k];
                    for (size_t i = 0; i < td->numel; i++)
                        cr_assert_eq(in_piece[ld->offset + td->offset + i], 1);
                    in_tensors += td->numel;
                }
                size_t sum = 0;
                for (size_t i = 0; i < ld->numel; i++) sum += in_piece[ld->offset + i];
                cr_assert_eq(sum, in_tensors, "padding inside a piece");
            }
        }
        free(owned);
        free(in_piece);
        mt_params_free(&t);
    }
}

Test(dist_shard, take_put_round_trip) {
    mt_config cfgs[3];
    configs(cfgs);
    for (int c = 0; c < 3; c++) {
        mt_param_table t;
        mt_error err;
        cr_assert_eq(mt_params_init(&t, &cfgs[c], &err), 0, "%s", err.msg);
        float *full = malloc(t.total * sizeof(float)), *back = malloc(t.total * sizeof(float));
        mt_test_fill_uniform(full, t.total, 7 + (unsigned)c, -1.0f, 1.0f);
        for (int ranks = 1; ranks <= 5; ranks++) {
            memset(back, 0xFF, t.total * sizeof(float));
            for (int r = 0; r < ranks; r++) {
                mt_shard_store s;
                cr_assert_eq(mt_shard_store_init(&s, &t, r, ranks, 0, &err), 0, "%s", err.msg);
                cr_assert_null(s.g);
                mt_shard_take(&s.layout, full, s.w);
                mt_shard_put(&s.layout, s.w, back);
                mt_shard_store_free(&s);
            }
            cr_assert(!memcmp(full, back, t.total * sizeof(float)), "config %d, %d ranks", c,
                      ranks);
        }
        free(full);
        free(back);
        mt_params_free(&t);
    }
}

/* The parts' table describes each rank's arrays: layers where the layout
 * puts the parts, one tensor per piece with the whole tensor's name and
 * ndim (the optimizer decides weight decay by it), the parameters of all
 * ranks adding up to the model's. */
Test(dist_shard, parts_table_describes_the_pieces) {
    mt_config cfgs[3];
    configs(cfgs);
    for (int c = 0; c < 3; c++) {
        mt_param_table t;
        mt_error err;
        cr_assert_eq(mt_params_init(&t, &cfgs[c], &err), 0, "%s", err.msg);
        for (int ranks = 1; ranks <= 6; ranks++) {
            int64_t params = 0;
            for (int r = 0; r < ranks; r++) {
                mt_shard_store s;
                cr_assert_eq(mt_shard_store_init(&s, &t, r, ranks, 0, &err), 0, "%s", err.msg);
                cr_assert_eq(s.table.n_layers, t.n_layers);
                cr_assert_eq(s.table.total, s.layout.total);
                for (int l = 0; l < t.n_layers; l++) {
                    const mt_layer_desc *ld = &s.table.layers[l];
                    cr_assert_eq(ld->offset, s.layout.local[l]);
                    cr_assert_eq(ld->numel, mt_shard_len(&s.layout, l));
                    mt_shard_piece pc[64];
                    cr_assert_eq(ld->n_tensors, mt_shard_pieces(&s.layout, l, pc));
                    for (int k = 0; k < ld->n_tensors; k++) {
                        const mt_tensor_desc *full = &t.layers[l].tensors[pc[k].tensor];
                        cr_assert_str_eq(ld->tensors[k].name, full->name);
                        cr_assert_eq(ld->tensors[k].ndim, full->ndim);
                        cr_assert_eq(ld->tensors[k].numel, pc[k].n);
                        cr_assert_eq(ld->offset + ld->tensors[k].offset, pc[k].local);
                    }
                }
                params += s.table.n_params;
                mt_shard_store_free(&s);
            }
            cr_assert_eq(params, t.n_params, "config %d, %d ranks", c, ranks);
        }
        mt_params_free(&t);
    }
}

/* Each rank's random parts, side by side, are the whole model's random
 * weights bit for bit (a rank fills only its part). */
Test(dist_shard, random_parts_are_the_whole_models) {
    mt_config cfgs[3];
    configs(cfgs);
    for (int c = 0; c < 3; c++) {
        mt_param_table t;
        mt_error err;
        cr_assert_eq(mt_params_init(&t, &cfgs[c], &err), 0, "%s", err.msg);
        mt_host_store whole;
        cr_assert_eq(mt_host_store_create(&whole, &t, 0, &err), 0, "%s", err.msg);
        mt_host_store_init_random(&whole, 42, 0.02f);
        float *back = malloc(t.total * sizeof(float));
        for (int ranks = 1; ranks <= 5; ranks += 2) {
            memcpy(back, whole.w, t.total * sizeof(float)); /* padding as the whole store's */
            for (int l = 0; l < t.n_layers; l++) /* the parts are written below */
                memset(back + t.layers[l].offset, 0xFF, t.layers[l].numel * sizeof(float));
            for (int r = 0; r < ranks; r++) {
                mt_shard_store s;
                cr_assert_eq(mt_shard_store_init(&s, &t, r, ranks, 0, &err), 0, "%s", err.msg);
                mt_host_store h = mt_shard_store_host(&s);
                mt_shard_init_random(&h, &s.layout, 42, 0.02f);
                mt_shard_put(&s.layout, s.w, back);
                mt_shard_store_free(&s);
            }
            cr_assert(!memcmp(back, whole.w, t.total * sizeof(float)), "config %d, %d ranks", c,
                      ranks);
        }
        free(back);
        mt_host_store_free(&whole);
        mt_params_free(&t);
    }
}

Test(dist_shard, bad_rank) {
    mt_config cfg;
    mt_config_default_tiny(&cfg);
    mt_param_table t;
    mt_error err;
    cr_assert_eq(mt_params_init(&t, &cfg, &err), 0, "%s", err.msg);
    mt_shard_layout sl;
    cr_assert_eq(mt_shard_layout_init(&sl, &t, 2, 2, &err), -1);
    cr_assert(strstr(err.msg, "rank 2 of 2"), "%s", err.msg);
    cr_assert_eq(mt_shard_layout_init(&sl, &t, 0, 0, &err), -1);
    mt_params_free(&t);
}
