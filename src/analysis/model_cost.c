/* model_cost.c: the cost model of a whole BertForMaskedLM's training step (dmove_tools.h,
 * dm_model_cost_analyze): each segment the trainer chains (the embeddings, an encoder
 * layer, the MLM head at the scored positions; src/train/model.c) compiled as the trainer
 * compiles it and analysed as `dmove analyze` analyses a layer (flop, unfused and fused
 * bytes, roofline floors, by class), the layer counted L times; and the update (global
 * norm clipping and AdamW over every parameter, the tied table once), counted here. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "analysis/analysis_api.h"
#include "core/status.h"
#include "plan/compile.h"

static const char *const k_part_names[DM_NUM_PARTS] = {"embeddings", "encoder layers", "MLM head", "optimizer"};

const char *dm_model_part_name(int part) { return part >= 0 && part < DM_NUM_PARTS ? k_part_names[part] : NULL; }

/* Parameters of a segment's graph (its own tensors, not views). */
static int64_t graph_params(const dm_graph *g) {
    int64_t n = 0;
    for (int t = 0; t < g->nt; t++)
        if (g->t[t].base < 0 && g->t[t].role == DM_ROLE_PARAM) n += g->t[t].numel;
    return n;
}

/* Segment seg analysed into p (one of it; the caller scales the layers). */
static dm_status segment_cost(const dm_layer_config *cfg, dm_segment seg, const dm_bert_sizes *sz,
                              const dm_device *dev, int dtype_bytes, dm_model_part_cost *p) {
    dm_graph g, gf;
    dm_plan plan;
    dm_cost_report rep;
    memset(&rep, 0, sizeof rep);
    memset(&plan, 0, sizeof plan);
    dm_graph_init(&g);
    dm_graph_init(&gf);
    /* as the trainer builds its segments: every input gradient (the layers' feed the one
     * before), the GPU's plans without sibling merges */
    const dm_compile_opts un = {.cfg = cfg, .schedule = DM_SCHED_UNFUSED, .segment = seg, .sizes = sz};
    const dm_compile_opts fu = {
        .cfg = cfg, .schedule = DM_SCHED_FUSED, .no_siblings = !dev->is_cpu, .segment = seg, .sizes = sz,
        .attn_op = seg == DM_SEG_ENCODER && dev->is_cpu && dm_cpu_attn_op_default(cfg, DM_SCHED_FUSED, 0, 0, 0)};
    dm_status s = dm_compile(&un, &g, NULL, NULL);
    if (s == DM_OK) s = dm_compile(&fu, &gf, NULL, &plan);
    if (s == DM_OK) s = dm_cost_analyze(&g, &plan, dev, dtype_bytes, &rep);
    if (s == DM_OK) {
        p->params = graph_params(&g);
        p->flop = rep.flop_total;
        for (int c = 0; c < DM_NUM_CLASSES; c++) p->class_flop[c] = rep.class_flop[c];
        p->unfused_bytes = rep.unfused_bytes, p->fused_bytes = rep.fused_bytes;
        p->unfused_floor_s = rep.unfused_floor_s, p->fused_floor_s = rep.fused_floor_s;
        for (int k = 0; k < rep.ngroups; k++)
            if (rep.groups[k].pass == 1) p->backward_floor_s += rep.groups[k].predicted_s;
    }
    dm_cost_free(&rep);
    dm_plan_free(&plan);
    dm_graph_free(&gf);
    dm_graph_free(&g);
    return s;
}

static void scale_part(dm_model_part_cost *p, double k) {
    p->params = (int64_t)((double)p->params * k);
    p->flop *= k;
    for (int c = 0; c < DM_NUM_CLASSES; c++) p->class_flop[c] *= k;
    p->unfused_bytes *= k, p->fused_bytes *= k, p->unfused_floor_s *= k, p->fused_floor_s *= k;
    p->backward_floor_s *= k;
}

static void add_part(dm_model_part_cost *to, const dm_model_part_cost *p) {
    to->params += p->params;
    to->flop += p->flop;
    for (int c = 0; c < DM_NUM_CLASSES; c++) to->class_flop[c] += p->class_flop[c];
    to->unfused_bytes += p->unfused_bytes, to->fused_bytes += p->fused_bytes;
    to->unfused_floor_s += p->unfused_floor_s, to->fused_floor_s += p->fused_floor_s;
    to->backward_floor_s += p->backward_floor_s;
}

dm_status dm_model_cost_analyze(const dm_layer_config *cfg, int layers, const dm_bert_model *bert,
                                const dm_device_model *dev, int dtype_bytes, dm_model_cost *out) {
    if (!cfg || !bert || !dev || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_cost_analyze: NULL argument");
    memset(out, 0, sizeof *out);
    if (layers < 1) return dm_fail(DM_ERR_INVALID_ARG, "dm_model_cost_analyze: %d layers (at least 1)", layers);
    if (dtype_bytes != 4 && dtype_bytes != 2)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_model_cost_analyze: %d bytes per element (4 or 2)", dtype_bytes);
    size_t nz;
    if (cfg->batch < 1 || cfg->seq < 1 || !dm_mul_ok((size_t)cfg->batch, (size_t)cfg->seq, &nz) || nz > INT64_MAX / 2)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_model_cost_analyze: b = %lld, j = %lld: give sizes whose product fits",
                       (long long)cfg->batch, (long long)cfg->seq);
    const int64_t n = (int64_t)nz;
    const dm_bert_sizes sz = {.vocab = bert->vocab, .positions = bert->positions, .types = bert->types,
                              .predictions = bert->predictions ? bert->predictions : cfg->batch * ((cfg->seq + 4) / 5)};
    out->tokens = n;
    out->predictions = sz.predictions;
    const dm_segment segs[3] = {DM_SEG_EMBEDDINGS, DM_SEG_ENCODER, DM_SEG_MLM_HEAD};
    for (int k = 0; k < 3; k++) {
        dm_model_part_cost *p = &out->part[k];
        DM_TRY(segment_cost(cfg, segs[k], &sz, &dev->d, dtype_bytes, p));
        p->count = k == 1 ? layers : 1;
        if (k == 1) scale_part(p, layers);
    }
    /* the head's decoder is the word table: its parameter once (its gradient, summed into
     * the table's, is the head's work above) */
    out->part[DM_PART_MLM_HEAD].params -= bert->vocab * cfg->hidden;
    int64_t P = 0;
    for (int k = 0; k < 3; k++) P += out->part[k].params;
    dm_model_part_cost *o = &out->part[DM_PART_OPTIMIZER];
    o->count = 1;
    o->flop = o->class_flop[DM_CLASS_ELEMENTWISE] = (double)DM_OPT_FLOP_PER_PARAM * (double)P;
    o->unfused_bytes = o->fused_bytes = (double)DM_OPT_BYTES_PER_PARAM * (double)P;
    o->unfused_floor_s = o->fused_floor_s = dm_roofline_seconds(&dev->d, 4, 0.0, o->flop, o->fused_bytes);
    for (int k = 0; k < DM_NUM_PARTS; k++) {
        out->part[k].name = k_part_names[k];
        add_part(&out->total, &out->part[k]);
    }
    out->total.name = "whole model";
    out->total.count = 1;
    return DM_OK;
}

dm_status dm_dp_predict(const dm_model_cost *m, int grad_bytes, int ranks, const dm_link *link,
                        dm_dp_prediction *out) {
    if (!m || !link || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_dp_predict: NULL argument");
    if (ranks < 1 || (grad_bytes != 2 && grad_bytes != 4) || !(link->busbw > 0) || !(link->latency >= 0))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_dp_predict: %d ranks, %d-byte gradients, %g B/s, %g s", ranks,
                       grad_bytes, link->busbw, link->latency);
    memset(out, 0, sizeof *out);
    out->ranks = ranks;
    const dm_model_part_cost *emb = &m->part[DM_PART_EMBEDDINGS], *lay = &m->part[DM_PART_LAYERS],
                             *head = &m->part[DM_PART_MLM_HEAD], *opt = &m->part[DM_PART_OPTIMIZER];
    const int L = lay->count > 0 ? lay->count : 1;
    out->compute_s = m->total.fused_floor_s;
    const double fwd = m->total.fused_floor_s - m->total.backward_floor_s - opt->fused_floor_s;
    const double share = 2.0 * (ranks - 1) / ranks, lat = ranks > 1 ? 2.0 * log2((double)ranks) * link->latency : 0;
    /* the buckets in backward order: (the backward's time until it is ready, its bytes) */
    double t = fwd, link_free = 0, bytes = 0;
    for (int k = 0; k < L + 2; k++) {
        const dm_model_part_cost *p = k == 0 ? head : k <= L ? lay : emb;
        const double b = (k == 0 || k > L) ? p->backward_floor_s : p->backward_floor_s / L;
        const double params = (k == 0 || k > L) ? (double)p->params : (double)p->params / L;
        t += b;
        const double s = params * grad_bytes, c = ranks > 1 ? share * s / link->busbw + lat : 0;
        const double start = t > link_free ? t : link_free;
        link_free = start + c;
        out->comm_s += c;
        bytes += s;
    }
    out->grad_bytes = bytes;
    out->wire_bytes = share * bytes;
    out->exposed_s = link_free > t ? link_free - t : 0;
    out->step_s = out->compute_s + out->exposed_s;
    out->efficiency = out->compute_s / out->step_s;
    return DM_OK;
}
