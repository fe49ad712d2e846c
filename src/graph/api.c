/* api.c: the public parameter table of dmove_tools.h (dm_param_spec): the layer's
 * parameters, names and shapes by dimension letter, read from the encoder builder itself
 * (built on sizes that tell i from u), so that the table lives in one place. */
#include <string.h>

#include "core/status.h"
#include "dmove_tools.h"
#include "graph/encoder.h"

int dm_param_spec_count(void) { return DM_NUM_PARAMS; }

dm_status dm_param_spec_get(int index, dm_param_spec *out) {
    if (!out) return dm_fail(DM_ERR_INVALID_ARG, "dm_param_spec_get: NULL argument");
    if (index < 0 || index >= DM_NUM_PARAMS)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_param_spec_get: no parameter %d", index);
    enum { I = 2, U = 3 }; /* the hidden and the feed-forward width, told apart by size */
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 1, cfg.seq = 1, cfg.hidden = I, cfg.heads = 1, cfg.ffn = U;
    dm_graph g;
    dm_encoder enc;
    dm_graph_init(&g);
    dm_status s = dm_build_encoder(&g, &cfg, 1, 0, 0, 0, &enc);
    dm_graph_free(&g);
    DM_TRY(s);
    for (int k = 0; k < enc.n; k++) {
        const dm_export *e = &enc.e[k];
        if (!e->is_param || strcmp(e->name, dm_param_names[index]) != 0) continue;
        memset(out, 0, sizeof *out);
        out->name = dm_param_names[index];
        out->ndim = e->ndim;
        for (int d = 0; d < e->ndim && d < 2; d++) out->dims[d] = e->shape[d] == U ? 'u' : 'i';
        return DM_OK;
    }
    return dm_fail(DM_ERR_INTERNAL, "the encoder exports no parameter '%s'", dm_param_names[index]);
}
