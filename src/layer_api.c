/* layer_api.c: the backend-neutral reports of dmove_tools.h on a layer: what its backend
 * chose, counts and notes by name (over dm_layer_cuda_choices today, the one backend that
 * reports any), and the options as a layer resolves them (rows and streams from the
 * environment). Moves with layer.c. */
#include <stdio.h>
#include <string.h>

#include "dmove_tools.h"

int64_t dm_layer_choice_count(const dm_layer *layer, const char *name) {
    if (!layer || !name) return 0;
    dm_cuda_choices c;
    dm_layer_cuda_choices(layer, &c);
    if (!strcmp(name, "row_programs")) return c.row_programs;
    if (!strcmp(name, "row_programs_generated")) return c.row_programs_generated;
    if (!strcmp(name, "attention_fused")) return c.attention_fused;
    if (!strcmp(name, "bias_epilogues")) return c.bias_epilogues;
    if (!strcmp(name, "second_stream")) return c.second_stream;
    return 0;
}

void dm_layer_note(const dm_layer *layer, const char *name, char *buf, size_t n) {
    if (!buf || !n) return;
    buf[0] = 0;
    if (!layer || !name) return;
    dm_cuda_choices c;
    dm_layer_cuda_choices(layer, &c);
    if (!strcmp(name, "gen_unavailable")) snprintf(buf, n, "%s", c.gen_unavailable);
    else if (!strcmp(name, "device_name")) snprintf(buf, n, "%s", c.gpu);
}

dm_status dm_layer_options_effective(const dm_layer_options *opt, dm_layer_options *out) {
    *out = *opt;
    dm_rows r;
    int n = 0;
    dm_status s = dm_rows_resolve(opt->rows, &r);
    if (s == DM_OK) out->rows = r;
    dm_status s2 = dm_streams_resolve(opt->streams, &n);
    if (s2 == DM_OK) out->streams = n;
    return s != DM_OK ? s : s2;
}
