/* cmd_analyze.c: `dmove analyze`: the dataflow analysis of one encoder layer's training
 * step on a device model: per operator flop, bytes, intensity, roofline bound and
 * predicted time; per class shares; unfused vs fused bytes and floors; the fused groups;
 * the memory the step holds (what the forward keeps; intermediates per plan).
 * As a table (default), --json, --csv or an SVG roofline chart; --measure adds achieved
 * rates and MUE from a profiled run on this CPU. Builds only the graph and plans (no
 * tensors) unless --measure, so any size analyses instantly. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "analysis/cost.h"
#include "analysis/device.h"
#include "cli_common.h"
#include "cpu/contract.h"
#include "graph/encoder.h"
#include "graph/rewrite.h"
#include "plan/planfile.h"
#include "tune/tune.h"

static const char *const CMD = "analyze";

static void usage(FILE *out) {
    fprintf(out,
            "usage: dmove analyze [options]\n"
            "\n"
            "Analyses one training step (forward + backward) of a BERT encoder layer without\n"
            "running it: for every graph operator its class, flop, bytes read and written\n"
            "(each input once, each output once, in --dtype), operational intensity (flop/byte)\n"
            "and, on the --device model, whether it is memory- or compute-bound and its\n"
            "predicted time max(flop / peak, bytes / bandwidth), where peak is the contraction\n"
            "rate for contractions and the vector rate for the rest. Then per class the %% of\n"
            "flop vs %% of predicted time; the bytes of the unfused schedule (every operator's\n"
            "own I/O) vs the fused one (per fused group: its materialized external inputs\n"
            "read once and materialized outputs written once), the reduction in %%, and the\n"
            "roofline floor (sum of predicted times) of each; and the fused groups, as the\n"
            "device's executor groups them (the CPU's plans also put attention's dV into\n"
            "the backward attention group, which reads the same P and dC; GPU plans do not).\n"
            "Last, memory: the tensors the forward keeps for the backward, and the peak of\n"
            "the intermediates in the fused plan, the unfused one and the fused one with\n"
            "attention recomputed in the backward (--recompute of layer, bench, tune, train).\n"
            "With --recompute the fused plan analysed is that one: its groups, bytes and\n"
            "floor with the extra flop of the recomputation.\n"
            "\n"
            "options:\n");
    cli_config_help(out, CLI_CFG_ALL);
    fprintf(out,
            "  --device D       cpu (default; the profile from `dmove probe`), v100, a100,\n"
            "                   h100, h200 (datasheet rates, SXM boards)\n"
            "  --profile FILE   CPU profile (default $XDG_CACHE_HOME/dmove/cpu-profile.json\n"
            "                   or ~/.cache/dmove/cpu-profile.json)\n"
            "  --dtype T        fp32 (default), bf16 or fp16: the bytes per element, and the\n"
            "                   contraction rate (tensor cores for bf16/fp16 on GPUs)\n"
            "  --json           one JSON object: ops, groups, classes, totals, device, config\n"
            "  --csv            the operator table as CSV\n"
            "  --svg FILE       write a log-log roofline chart (one point per operator)\n"
            "  --plan FILE      show the layouts and contraction algorithms of a plan from\n"
            "                   `dmove tune` (for the same sizes), and which GEMMs it runs\n"
            "                   side by side; with --json, as its \"plan\" object (layouts by\n"
            "                   tensor, algorithms by contraction, \"side_by_side\" pairs)\n"
            "  --measure        also run the unfused step on this CPU (device cpu, fp32) and\n"
            "                   add per operator achieved ms, GB/s, GFLOP/s, %% of its\n"
            "                   roofline and MUE (see README)\n"
            "  --reps N         profiled steps for --measure (default 5, after 2 warm-up)\n"
            "  --recompute      the fused plan with attention's probabilities recomputed in\n"
            "                   the backward (Q K^T, mask, softmax, dropout again, inside the\n"
            "                   backward attention group) instead of kept from the forward\n"
            "  --help           this text\n"
            "\n"
            "exit status: 0 success, 1 runtime error (e.g. no profile), 2 usage error\n"
            "\n"
            "examples:\n"
            "  dmove probe && dmove analyze\n"
            "  dmove analyze --preset bert-large --device h100 --dtype bf16 --svg roof.svg\n"
            "  dmove analyze --measure --csv > ops.csv\n");
}

typedef struct {
    double secs, gbs, gflops, roof_pct, mue;
} measured;

static void measured_of(const dm_cost_report *r, int o, const double *op_secs, measured *m) {
    const dm_op_cost *c = &r->ops[o];
    memset(m, 0, sizeof *m);
    m->secs = op_secs[o];
    if (m->secs <= 0) return;
    m->gbs = c->bytes / m->secs / 1e9;
    m->gflops = c->flop / m->secs / 1e9;
    m->roof_pct = 100.0 * c->predicted_s / m->secs;
    /* MUE = (Q / D) * (B / B^): Q the op's minimal bytes (its own I/O), D the bytes it
     * moves: the same, as an unfused kernel streams each operand once (no hardware
     * counters: see README); B achieved = D / t, B^ the device bandwidth. */
    double Q = c->bytes, D = c->bytes;
    m->mue = 100.0 * (Q / D) * (m->gbs * 1e9 / r->dev.bandwidth);
}

/* What the step holds in memory: the tensors the forward keeps for the backward (made in
 * the forward, read in the backward) in the plan analysed (gf, plan: the fused one, or
 * with --recompute the recomputing one), and the intermediates of the
 * fused plan, the unfused one and the fused one with attention recomputed (--recompute)
 * at their peak (first-fit over live intervals: the arena's intermediate part), in the
 * storage type. */
typedef struct {
    int n;
    int t[64];             /* saved tensors of the fused graph, largest first */
    double saved_bytes;
    double fused, unfused, recompute; /* intermediates, bytes */
} mem_report;

static dm_status memory_report(const dm_layer_config *cfg, int cpu, const dm_graph *gf, const dm_plan *plan,
                               int dtype_bytes, mem_report *m) {
    memset(m, 0, sizeof *m);
    const double scale = dtype_bytes / 4.0;
    for (int t = 0; t < gf->nt; t++) {
        if (gf->t[t].base >= 0 || gf->t[t].role != DM_ROLE_ACT || gf->t[t].pass != 0 || !plan->in_memory[t]) continue;
        int read_bwd = 0;
        for (int o = 0; o < gf->nop && !read_bwd; o++)
            for (int k = 0; k < gf->op[o].nin; k++)
                read_bwd |= gf->op[o].pass == 1 && dm_tensor_root(gf, gf->op[o].in[k]) == t;
        if (!read_bwd) continue;
        m->saved_bytes += (double)gf->t[t].numel * dtype_bytes;
        if (m->n == 64) continue; /* listed: the 64 first (the encoder keeps 13) */
        int at = m->n++;
        while (at > 0 && gf->t[m->t[at - 1]].numel < gf->t[t].numel) {
            m->t[at] = m->t[at - 1];
            at--;
        }
        m->t[at] = t;
    }
    /* the three plans, built as dm_layer_new builds them (the one analysed among them) */
    for (int v = 0; v < 3; v++) {
        dm_graph g2;
        dm_encoder enc;
        dm_plan p2;
        memset(&p2, 0, sizeof p2);
        dm_graph_init(&g2);
        dm_status s = dm_build_encoder(&g2, cfg, 0, 1, &enc);
        if (s == DM_OK && v > 0) s = dm_rewrite_fused(&g2);
        if (s == DM_OK && v == 2) s = dm_rewrite_recompute_attention(&g2, NULL);
        if (s == DM_OK) s = dm_plan_build(&g2, v > 0, v > 0 && cpu, 0, &p2);
        if (s == DM_OK) *(v == 0 ? &m->unfused : v == 1 ? &m->fused : &m->recompute) = (double)p2.activation_bytes * scale;
        dm_plan_free(&p2);
        dm_graph_free(&g2);
        if (s != DM_OK) return s;
    }
    return DM_OK;
}

static void print_memory(const dm_graph *gf, const mem_report *m, int dtype_bytes, int recompute) {
    printf("\nmemory between the passes: the tensors the forward keeps for the backward (fused plan%s), %.2f MB:\n",
           recompute ? ", attention recomputed" : "", m->saved_bytes / 1e6);
    for (int k = 0; k < m->n; k++)
        printf("  %-24s %9.3f MB\n", gf->t[m->t[k]].name, (double)gf->t[m->t[k]].numel * dtype_bytes / 1e6);
    printf("intermediates at their peak (one arena, first fit over live intervals): fused %.2f MB, unfused "
           "%.2f MB, fused with --recompute %.2f MB (attention's probabilities recomputed in the backward)\n",
           m->fused / 1e6, m->unfused / 1e6, m->recompute / 1e6);
}

static void print_table(const cli_config *c, const dm_graph *g, const dm_cost_report *r,
                        const double *op_secs) {
    const dm_layer_config *cfg = &c->cfg;
    printf("dmove analyze: b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
           "%s, %s, %d ops, %d fused groups%s\n", cfg->batch, cfg->seq, cfg->hidden, cfg->heads,
           cfg->ffn, cli_variant(cfg), dm_dtype_bytes_name(r->dtype_bytes), r->nops, r->ngroups,
           r->recomputed_flop > 0 ? " (attention recomputed in the backward)" : "");
    printf("device %s: %s\n", r->dev.name, r->dev.desc);
    printf("  roofs: contraction %.1f GFLOP/s, vector %.1f GFLOP/s, memory %.1f GB/s\n\n",
           dm_device_contract_peak(&r->dev, r->dtype_bytes) / 1e9,
           dm_device_vector_peak(&r->dev, r->dtype_bytes) / 1e9, r->dev.bandwidth / 1e9);
    printf("%-26s %-4s %-13s %9s %9s %8s %-7s %9s", "operator", "pass", "class", "GFLOP", "MB",
           "flop/B", "bound", "pred ms");
    if (op_secs)
        printf(" %9s %8s %8s %7s %6s", "meas ms", "GB/s", "GFLOP/s", "%roof", "MUE%");
    printf("\n");
    for (int o = 0; o < r->nops; o++) {
        const dm_op_cost *oc = &r->ops[o];
        printf("%-26.26s %-4s %-13s %9.4f %9.3f %8.2f %-7s %9.4f", g->op[oc->op].name,
               oc->pass ? "bwd" : "fwd", dm_class_name(oc->cls), oc->flop / 1e9, oc->bytes / 1e6,
               oc->intensity, oc->memory_bound ? "memory" : "compute", oc->predicted_s * 1e3);
        if (op_secs) {
            measured m;
            measured_of(r, o, op_secs, &m);
            printf(" %9.4f %8.1f %8.1f %7.1f %6.1f", m.secs * 1e3, m.gbs, m.gflops, m.roof_pct,
                   m.mue);
        }
        printf("\n");
    }
    double tsum = r->class_time[0] + r->class_time[1] + r->class_time[2];
    double msum[DM_NUM_CLASSES] = {0}, mtot = 0;
    if (op_secs)
        for (int o = 0; o < r->nops; o++) msum[r->ops[o].cls] += op_secs[o], mtot += op_secs[o];
    printf("\nper class (unfused; %% of the step's flop vs %% of its predicted time%s):\n",
           op_secs ? ", and of its measured time" : "");
    printf("%-14s %10s %10s %10s %8s %8s", "class", "fwd GFLOP", "bwd GFLOP", "GFLOP", "% flop",
           "% pred");
    if (op_secs) printf(" %9s %7s", "meas ms", "% meas");
    printf("\n");
    for (int k = 0; k < DM_NUM_CLASSES; k++) {
        printf("%-14s %10.3f %10.3f %10.3f %8.2f %8.2f", dm_class_name((dm_op_class)k),
               r->pass_flop[0][k] / 1e9, r->pass_flop[1][k] / 1e9, r->class_flop[k] / 1e9,
               r->flop_total > 0 ? 100 * r->class_flop[k] / r->flop_total : 0,
               tsum > 0 ? 100 * r->class_time[k] / tsum : 0);
        if (op_secs) printf(" %9.3f %7.2f", msum[k] * 1e3, mtot > 0 ? 100 * msum[k] / mtot : 0);
        printf("\n");
    }
    printf("\ndata movement of the step (%s):\n", dm_dtype_bytes_name(r->dtype_bytes));
    printf("  unfused  %10.2f MB   roofline floor %9.3f ms\n", r->unfused_bytes / 1e6,
           r->unfused_floor_s * 1e3);
    printf("  fused    %10.2f MB   roofline floor %9.3f ms", r->fused_bytes / 1e6, r->fused_floor_s * 1e3);
    if (r->recomputed_flop > 0)
        printf("   (attention recomputed: +%.3f GFLOP, %.2f%% of the step's)", r->recomputed_flop / 1e9,
               100.0 * r->recomputed_flop / r->flop_total);
    printf("\n");
    printf("  reduction %.2f%% of the bytes; floor fused/unfused %.3f\n", r->reduction_pct,
           r->unfused_floor_s > 0 ? r->fused_floor_s / r->unfused_floor_s : 0);
    if (op_secs)
        printf("  measured unfused step (sum of profiled ops) %.3f ms = %.2fx its floor\n",
               mtot * 1e3, r->unfused_floor_s > 0 ? mtot / r->unfused_floor_s : 0);
    printf("\nfused groups (bytes = materialized external inputs read once + materialized "
           "outputs written once):\n");
    printf("%5s %-4s %-13s %9s %9s %9s  %s\n", "group", "pass", "class", "read MB", "write MB",
           "pred ms", "ops");
    for (int G = 0; G < r->ngroups; G++) {
        const dm_group_cost *gc = &r->groups[G];
        printf("%5d %-4s %-13s %9.3f %9.3f %9.4f  ", G, gc->pass ? "bwd" : "fwd",
               dm_class_name(gc->cls), gc->bytes_read / 1e6, gc->bytes_written / 1e6,
               gc->predicted_s * 1e3);
        for (int k = 0; k < gc->nops; k++) printf("%s%s", k ? " " : "", r->fused_graph->op[gc->ops[k]].name);
        if (gc->in_epilogue)
            printf("  (in the epilogue of %s: its floor counted there)",
                   r->fused_graph->op[r->groups[G - 1].ops[0]].name);
        printf("\n");
    }
    if (r->bias_epilogues > 0)
        printf("(%d bias add%s in the GEMM's cuBLASLt epilogue, as the CUDA executor runs %s: the "
               "pre-bias tensor never reaches memory)\n",
               r->bias_epilogues, r->bias_epilogues > 1 ? "s" : "", r->bias_epilogues > 1 ? "them" : "it");
}

static int jnum(cJSON *o, const char *k, double v) {
    return cJSON_AddNumberToObject(o, k, isfinite(v) ? v : 0.0) != NULL;
}

static int print_json(const cli_config *c, const dm_graph *g, const dm_cost_report *r,
                      const double *op_secs, cJSON *plan_json, const dm_graph *gf, const mem_report *m) {
    cJSON *root = dm_cost_json(g, r, &c->cfg);
    int ok = root != NULL;
    cJSON *mo = ok ? cJSON_AddObjectToObject(root, "memory") : NULL, *sv = NULL;
    ok = ok && mo && jnum(mo, "saved_for_backward_bytes", m->saved_bytes) &&
         jnum(mo, "intermediates_fused_bytes", m->fused) && jnum(mo, "intermediates_unfused_bytes", m->unfused) &&
         jnum(mo, "intermediates_recompute_bytes", m->recompute) &&
         (sv = cJSON_AddArrayToObject(mo, "saved_for_backward")) != NULL;
    for (int k = 0; ok && k < m->n; k++) {
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(sv, e)) {
            cJSON_Delete(e);
            ok = 0;
            break;
        }
        ok = cJSON_AddStringToObject(e, "tensor", gf->t[m->t[k]].name) &&
             jnum(e, "bytes", (double)gf->t[m->t[k]].numel * r->dtype_bytes);
    }
    if (plan_json && (!ok || !cJSON_AddItemToObject(root, "plan", plan_json))) { /* owned by root if added */
        cJSON_Delete(plan_json);
        ok = 0;
    }
    if (ok && op_secs) {
        cJSON *ops = cJSON_GetObjectItemCaseSensitive(root, "ops"), *e;
        int o = 0;
        double mtot = 0;
        cJSON_ArrayForEach(e, ops) {
            measured m;
            measured_of(r, o, op_secs, &m);
            mtot += op_secs[o++];
            cJSON *x = cJSON_AddObjectToObject(e, "measured");
            ok = ok && x && jnum(x, "seconds", m.secs) && jnum(x, "gbs", m.gbs) &&
                 jnum(x, "gflops", m.gflops) && jnum(x, "roofline_pct", m.roof_pct) &&
                 jnum(x, "mue_pct", m.mue);
        }
        cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "totals");
        ok = ok && t && jnum(t, "measured_unfused_seconds", mtot) &&
             cJSON_AddStringToObject(t, "mue_bytes_moved",
                                     "D = the op's own I/O: each unfused operand read or "
                                     "written once (a model, not a hardware count)");
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        cli_error(CMD, "out of memory building the JSON report");
        return -1;
    }
    int wr = puts(text);
    cJSON_free(text);
    return wr == EOF ? -1 : 0;
}

static int print_csv(const dm_graph *g, const dm_cost_report *r, const double *op_secs) {
    char *text = dm_cost_csv(g, r);
    if (!text) {
        cli_error(CMD, "out of memory building the CSV");
        return -1;
    }
    if (!op_secs) {
        int wr = fputs(text, stdout);
        free(text);
        return wr == EOF ? -1 : 0;
    }
    /* append the measured columns line by line */
    char *line = text, *nl;
    int o = -1;
    while ((nl = strchr(line, '\n')) != NULL) {
        *nl = 0;
        if (o < 0) {
            printf("%s,measured_seconds,gbs,gflops,roofline_pct,mue_pct\n", line);
        } else {
            measured m;
            measured_of(r, o, op_secs, &m);
            printf("%s,%.9g,%.6g,%.6g,%.4g,%.4g\n", line, m.secs, m.gbs, m.gflops, m.roof_pct,
                   m.mue);
        }
        o++;
        line = nl + 1;
    }
    free(text);
    return 0;
}

/* The plan's layouts and algorithms as a JSON object (for --json), or NULL. */
static cJSON *plan_to_json(const char *path, const dm_graph *g, const dm_choices *ch) {
    cJSON *o = cJSON_CreateObject();
    int ok = o && cJSON_AddStringToObject(o, "file", path) &&
             cJSON_AddStringToObject(o, "tuned_on", ch->machine[0] ? ch->machine : "unknown") &&
             jnum(o, "default_ms", ch->default_ms) && jnum(o, "tuned_ms", ch->tuned_ms) &&
             dm_choices_add_json(o, g, ch); /* as the plan file has them */
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* --plan: loads the plan and applies it to plan; shows the layouts and algorithms it
 * chooses, beside the builder's, as a table (on stderr when to_stderr: stdout carries
 * CSV), or, given as_json, as a JSON object there instead. */
static int show_plan(const cli_config *c, const char *path, int recompute, dm_graph *g, dm_plan *plan,
                     int to_stderr, cJSON **as_json) {
    dm_layer_options opt = {.schedule = DM_SCHED_FUSED, .recompute = recompute};
    dm_choices ch;
    char def[DM_MAX_DIMS + 1];
    if (dm_plan_load(path, &c->cfg, &opt, g, &ch) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    if (as_json && !(*as_json = plan_to_json(path, g, &ch))) {
        cli_error(CMD, "out of memory building the JSON report");
        dm_choices_free(&ch);
        return -1;
    }
    /* partner[G]: the group run beside G; beside[G]: the group G runs beside */
    dm_status s = dm_choices_apply(&ch, g, plan);
    int *partner = s == DM_OK ? malloc(sizeof(int) * 2 * (size_t)(plan->ngroups + 1)) : NULL;
    int *beside = partner ? partner + plan->ngroups + 1 : NULL;
    if (s == DM_OK) s = partner ? dm_plan_pairs(plan, partner, beside) : DM_ERR_OOM;
    if (s != DM_OK) {
        cli_error(CMD, "%s", s == DM_ERR_OOM ? "out of memory" : dm_last_error());
        free(partner);
        dm_choices_free(&ch);
        return -1;
    }
    if (as_json) {
        dm_choices_free(&ch);
        /* the pairs run side by side: [{"first": op, "beside": op}, ...] */
        cJSON *arr = cJSON_AddArrayToObject(*as_json, "side_by_side");
        int ok = arr != NULL;
        for (int G = 0; ok && G < plan->ngroups; G++) {
            if (partner[G] < 0) continue;
            cJSON *p = cJSON_CreateObject();
            if (!p || !cJSON_AddItemToArray(arr, p)) { /* not owned by the array: ours to free */
                cJSON_Delete(p);
                ok = 0;
                break;
            }
            ok = cJSON_AddStringToObject(p, "first", g->op[plan->order[plan->groups[G].first]].name) &&
                 cJSON_AddStringToObject(p, "beside", g->op[plan->order[plan->groups[partner[G]].first]].name);
        }
        free(partner);
        if (!ok) {
            cli_error(CMD, "out of memory building the JSON report");
            return -1;
        }
        return 0;
    }
    FILE *out = to_stderr ? stderr : stdout;
    fprintf(out, "plan %s (tuned on %s; sum over groups: default %.2f ms, tuned %.2f ms)\n", path,
            ch.machine[0] ? ch.machine : "unknown machine", ch.default_ms, ch.tuned_ms);
    fprintf(out, "  %-22s %-9s %-9s\n", "tensor", "default", "layout");
    for (int t = 0; t < g->nt; t++) {
        if (!ch.layout[t][0]) continue;
        dm_tensor_layout(g, t, def);
        fprintf(out, "  %-22s %-9s %-9s%s\n", g->t[t].name, def, ch.layout[t], strcmp(def, ch.layout[t]) ? "  changed" : "");
    }
    fprintf(out, "  %-22s %-9s\n", "contraction", "algorithm");
    for (int o = 0; o < g->nop; o++) {
        int G = -1; /* the group o is the first op of (pairs are lone contractions) */
        for (int H = 0; H < plan->ngroups && G < 0; H++)
            if (plan->order[plan->groups[H].first] == o) G = H;
        int pa = G >= 0 ? partner[G] : -1, be = G >= 0 ? beside[G] : -1;
        if (!ch.algo[o] && be < 0) continue;
        fprintf(out, "  %-22s %-9s", g->op[o].name, dm_gemm_algo_name((dm_gemm_algo)ch.algo[o]));
        if (pa >= 0) fprintf(out, "  (%s runs beside it)", g->op[plan->order[plan->groups[pa].first]].name);
        if (be >= 0)
            fprintf(out, "  (runs beside %s; its own algorithm applies alone)",
                    g->op[plan->order[plan->groups[be].first]].name);
        fputc('\n', out);
    }
    fputc('\n', out);
    free(partner);
    dm_choices_free(&ch);
    return 0;
}

int cmd_analyze(int argc, char **argv) {
    const char *device = "cpu", *profile = NULL, *svg = NULL, *planfile = NULL;
    int dtype_bytes = 4, json = 0, csv = 0, measure = 0, reps = 5, recompute = 0;
    cli_config c;
    cli_config_init(&c, CLI_CFG_ALL);
    for (int a = 1; a < argc; a++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--device", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            dm_device probe_dev;
            if (strcmp(v, "cpu") != 0 && dm_device_preset(v, &probe_dev) != DM_OK) {
                cli_usage_error(CMD, "--device: unknown device '%s' (known: %s)", v,
                                dm_device_names());
                return CLI_USAGE;
            }
            device = v;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--dtype", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            if (!strcmp(v, "fp32"))
                dtype_bytes = 4;
            else if (!strcmp(v, "bf16") || !strcmp(v, "fp16"))
                dtype_bytes = 2;
            else {
                cli_usage_error(CMD, "--dtype: unknown dtype '%s' (known: fp32, bf16, fp16)", v);
                return CLI_USAGE;
            }
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--profile", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            if (!*v) {
                cli_usage_error(CMD, "--profile: empty file name");
                return CLI_USAGE;
            }
            profile = v;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--svg", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            if (!*v) {
                cli_usage_error(CMD, "--svg: empty file name");
                return CLI_USAGE;
            }
            svg = v;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--reps", &v)) != 0) {
            if (r < 0 || cli_parse_int(CMD, "--reps", v, 1, 100000, &reps)) return CLI_USAGE;
            continue;
        }
        if ((r = cli_flag(CMD, argv, a, "--json")) != 0) {
            if (r < 0) return CLI_USAGE;
            json = 1;
            continue;
        }
        if ((r = cli_flag(CMD, argv, a, "--csv")) != 0) {
            if (r < 0) return CLI_USAGE;
            csv = 1;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--plan", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            planfile = v;
            continue;
        }
        if ((r = cli_flag(CMD, argv, a, "--measure")) != 0) {
            if (r < 0) return CLI_USAGE;
            measure = 1;
            continue;
        }
        if ((r = cli_flag(CMD, argv, a, "--recompute")) != 0) {
            if (r < 0) return CLI_USAGE;
            recompute = 1;
            continue;
        }
        if ((r = cli_config_option(&c, CMD, argc, argv, &a)) != 0) {
            if (r < 0) return CLI_USAGE;
            continue;
        }
        return cli_unknown(CMD, argv[a], "");
    }
    if (json && csv) {
        cli_usage_error(CMD, "--json and --csv: choose one output format");
        return CLI_USAGE;
    }
    if (measure && strcmp(device, "cpu") != 0) {
        cli_usage_error(CMD, "--measure runs on this CPU: it needs --device cpu (not '%s'); "
                        "to time the step on a GPU, per group, use dmove bench --device cuda --groups", device);
        return CLI_USAGE;
    }
    if (measure && dtype_bytes != 4) {
        cli_usage_error(CMD, "--measure: the CPU backend computes in fp32: use --dtype fp32");
        return CLI_USAGE;
    }
    if (cli_config_finish(&c, CMD, 1)) return CLI_USAGE;

    dm_device dev;
    if (!strcmp(device, "cpu")) {
        char defpath[4096];
        if (!profile) {
            if (dm_profile_default_path(defpath, sizeof defpath) != DM_OK) {
                cli_error(CMD, "%s", dm_last_error());
                return CLI_FAIL;
            }
            profile = defpath;
        }
        dm_cpu_profile p;
        if (dm_profile_load(profile, &p) != DM_OK ||
            dm_device_from_profile(&p, cli_threads(c.threads), &dev) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return CLI_FAIL;
        }
    } else if (dm_device_preset(device, &dev) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }

    int rc = CLI_FAIL;
    /* g: the step's graph, as the unfused schedule runs it (the operator table); gf: the
     * fused schedule's graph, g after its rewrites (graph/rewrite.c keeps op ids, so the
     * fused plan's groups index g's operators too) */
    dm_graph g, gf;
    dm_plan plan;
    dm_cost_report rep;
    double *op_secs = NULL;
    cJSON *plan_json = NULL; /* --plan with --json: the plan, for the report */
    memset(&rep, 0, sizeof rep);
    if (dm_cost_build(&c.cfg, dev.is_cpu, recompute, &g, &gf, &plan) != DM_OK ||
        dm_cost_analyze(&g, &plan, &dev, dtype_bytes, &rep) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    if (planfile && show_plan(&c, planfile, recompute, &gf, &plan, json || csv, json ? &plan_json : NULL)) goto done;
    mem_report mem;
    if (memory_report(&c.cfg, dev.is_cpu, &gf, &plan, dtype_bytes, &mem) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    if (measure) {
        op_secs = calloc((size_t)g.nop, sizeof *op_secs);
        if (!op_secs) {
            cli_error(CMD, "out of memory");
            goto done;
        }
        fprintf(stderr, "analyze: measuring the unfused step on this CPU (%d profiled steps)\n",
                reps);
        if (dm_cost_measure(&c.cfg, c.threads, 2, reps, &g, op_secs) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            goto done;
        }
    }
    if (svg) {
        char title[256];
        snprintf(title, sizeof title,
                 "dmove roofline: BERT layer b=%" PRId64 " j=%" PRId64 " i=%" PRId64
                 " h=%" PRId64 " u=%" PRId64 "%s, %s, training step (%d ops)",
                 c.cfg.batch, c.cfg.seq, c.cfg.hidden, c.cfg.heads, c.cfg.ffn, cli_variant(&c.cfg),
                 dm_dtype_bytes_name(dtype_bytes), rep.nops);
        if (dm_cost_write_svg(&g, &rep, title, svg) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            goto done;
        }
    }
    if (json) {
        cJSON *pj = plan_json;
        plan_json = NULL; /* print_json owns it now */
        if (print_json(&c, &g, &rep, op_secs, pj, &gf, &mem)) goto done;
    } else if (csv) {
        if (print_csv(&g, &rep, op_secs)) goto done;
    } else if (!svg) {
        print_table(&c, &g, &rep, op_secs);
        print_memory(&gf, &mem, dtype_bytes, recompute);
    } else {
        printf("wrote %s (%d operators)\n", svg, rep.nops);
    }
    if (fflush(stdout) != 0) {
        cli_error(CMD, "cannot write the report to stdout");
        goto done;
    }
    rc = CLI_OK;
done:
    cJSON_Delete(plan_json);
    free(op_secs);
    dm_cost_free(&rep);
    dm_plan_free(&plan);
    dm_graph_free(&gf);
    dm_graph_free(&g);
    return rc;
}
