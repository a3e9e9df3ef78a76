/* Mixture-of-experts tensors under the names and shapes of the layouts
 * other than the published one (model_io_moe.h). */
#include "io/model_io_moe.h"

#include <stdio.h>
#include <string.h>

static const char BSM[] = "block_sparse_moe.";

/* name with its first "block_sparse_moe." read as "mlp.", into buf;
 * false when it has none. */
static bool mlp_alias(const char *name, char *buf, size_t n) {
    const char *p = strstr(name, BSM);
    if (!p) return false;
    snprintf(buf, n, "%.*smlp.%s", (int)(p - name), name, p + sizeof BSM - 1);
    return true;
}

static int shape_error(const mt_st_tensor_info *ti, const char *want, mt_error *err) {
    char got[96] = "";
    size_t k = 0;
    for (int d = 0; d < ti->ndim && k < sizeof got; d++)
        k += (size_t)snprintf(got + k, sizeof got - k, "%s%lld", d ? ", " : "",
                              (long long)ti->shape[d]);
    return mt_errorf(err, "%s: tensor \"%s\" has shape [%s] but config.json implies [%s]",
                     ti->file, ti->name, got, want);
}

int mt_moe_read_other_layout(const mt_st_model *m, const mt_layer_desc *ld,
                             const mt_tensor_desc *td, float *dst, mt_error *err) {
    char name[160], want[96];
    if (mlp_alias(td->name, name, sizeof name)) {
        const mt_st_tensor_info *ti = mt_st_model_find(m, name);
        if (ti) {
            if (ti->ndim != td->ndim || ti->shape[0] != td->shape[0] ||
                (td->ndim == 2 && ti->shape[1] != td->shape[1])) {
                snprintf(want, sizeof want, "%lld, %lld", (long long)td->shape[0],
                         (long long)td->shape[1]);
                return shape_error(ti, want, err);
            }
            return mt_st_read_f32(ti, dst, td->numel, err) ? -1 : 0;
        }
    }
    if (td->expert < 0) return 1;
    int down = td->role == MT_T_EXP_WDOWN;
    snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%s", ld->block,
             down ? "down_proj" : "gate_up_proj");
    const mt_st_tensor_info *ti = mt_st_model_find(m, name);
    if (!ti) return 1;
    /* gate and up: (FE, C) each, stacked as (E, 2*FE, C); down: (E, C, FE) */
    int64_t E = ld->n_experts, r = td->shape[0], c = td->shape[1];
    int64_t rows = down ? r : 2 * r;
    if (ti->ndim != 3 || ti->shape[0] != E || ti->shape[1] != rows || ti->shape[2] != c) {
        snprintf(want, sizeof want, "%lld, %lld, %lld", (long long)E, (long long)rows,
                 (long long)c);
        return shape_error(ti, want, err);
    }
    size_t first = (size_t)td->expert * (size_t)(rows * c);
    if (td->role == MT_T_EXP_WUP) first += (size_t)(r * c);
    return mt_st_read_f32_range(ti, first, dst, td->numel, err) ? -1 : 0;
}

bool mt_moe_other_layout_name(const mt_param_table *t, const char *name) {
    int idx, pos = 0;
    if (sscanf(name, "model.layers.%d.%n", &idx, &pos) != 1 || pos == 0 || idx < 0 ||
        idx + 1 >= t->n_layers - 1 || !t->layers[idx + 1].n_experts)
        return false;
    const char *rest = name + pos;
    if (!strcmp(rest, "mlp.experts.gate_up_proj") || !strcmp(rest, "mlp.experts.down_proj"))
        return true;
    char buf[160];
    if (strncmp(rest, "mlp.", 4) != 0) return false;
    snprintf(buf, sizeof buf, "model.layers.%d.%s%s", idx, BSM, rest + 4);
    return mt_params_by_name(t, buf, NULL) != NULL;
}
