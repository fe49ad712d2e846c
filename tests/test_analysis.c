/* test_analysis.c: the cost model against independent arithmetic.
 *  1. BERT-large (b=8 j=512 i=1024 h=16 u=4096): contraction flop 111.67 GFLOP forward,
 *     223.34 backward, from the sizes by hand (not via dm_op_flop).
 *  2. Every fused group's bytes equal its materialized external inputs + outputs,
 *     recounted here tensor by tensor; external inputs are materialized; the groups sum
 *     to the fused total; fused <= unfused; unfused groups == their op's own I/O.
 *  3. dtype: bf16 bytes are half of fp32; predicted time = max(flop/peak, bytes/bw).
 *  4. JSON has one op entry per graph op with the documented fields.
 *  5. SVG: parsed with expat: well-formed, root <svg>, exactly one point per op.
 *  6. The CPU profile: save/load round trip; missing, malformed, wrong-typed files fail.
 *  7. --recompute's report: the recomputed flop are the four forward ops' (QK^T 2 b h j^2 p
 *     by hand, mask, softmax, dropout), the groups' flop the plain fused plan's plus them,
 *     its groups' bytes recounted as in 2., fewer than the plain fused plan's.
 *  8. A layer's groups (dm_layer_group_info, what `bench --groups` holds to the roofline):
 *     their flop sum to dm_layer_flop's, their floors (dm_roofline_seconds) to the cost
 *     model's fused floor for the same sizes, their profiled times to the class times;
 *     bad indices fail; GPU names map to the presets of their boards only.
 *  9. The groups chart (bench --svg): well-formed, one bar per timed group, one floor
 *     band per floor, widths in proportion to milliseconds. */
#include <expat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "analysis/cost.h"
#include "analysis/device.h"
#include "dmove.h"
#include "graph/encoder.h"
#include "testutil.h"

typedef struct {
    dm_layer_config cfg;
    dm_graph g;
    dm_encoder enc;
    dm_plan fused, unfused;
} setup;

static int build(setup *s, int64_t b, int64_t j, int64_t i, int64_t h, int64_t u) {
    memset(s, 0, sizeof *s);
    dm_layer_config_default(&s->cfg);
    s->cfg.batch = b, s->cfg.seq = j, s->cfg.hidden = i, s->cfg.heads = h, s->cfg.ffn = u;
    dm_graph_init(&s->g);
    dm_status st = dm_build_encoder(&s->g, &s->cfg, 0, 1, 0, 0, &s->enc);
    if (st == DM_OK) st = dm_plan_build(&s->g, 1, 0, 0, &s->fused);
    if (st == DM_OK) st = dm_plan_build(&s->g, 0, 0, 0, &s->unfused);
    CHECK_OK(st);
    return st == DM_OK ? 0 : -1;
}

static void teardown(setup *s) {
    dm_plan_free(&s->fused);
    dm_plan_free(&s->unfused);
    dm_graph_free(&s->g);
}

/* Group G's bytes recounted tensor by tensor: a tensor the group writes costs a write if
 * its root is materialized; a tensor it reads costs a read unless the group writes it (or
 * its whole root). */
static double recount_group(const dm_plan *p, int G, int dtype, int *bad_input) {
    const dm_graph *g = p->g;
    const dm_group *gr = &p->groups[G];
    double bytes = 0;
    for (int t = 0; t < g->nt; t++) {
        int reads = 0, writes = 0, root_written = 0, root = dm_tensor_root(g, t);
        for (int k = 0; k < gr->nops; k++) {
            const dm_op *op = &g->op[p->order[gr->first + k]];
            for (int s = 0; s < op->nin; s++) reads |= op->in[s] == t;
            for (int s = 0; s < op->nout; s++) {
                writes |= op->out[s] == t;
                root_written |= op->out[s] == root;
            }
        }
        if (writes && p->in_memory[root]) bytes += (double)g->t[t].numel * dtype;
        if (reads && !writes && !root_written) {
            bytes += (double)g->t[t].numel * dtype;
            if (!p->in_memory[root]) *bad_input = 1;
        }
    }
    return bytes;
}

/* recount_group, less what the GPU's qkv bias epilogue keeps out of memory: qkv_proj
 * (alone in its group) then writes no pre-bias tensor and qkv_bias (alone) reads none; the
 * one such pair of the BERT layer (cudaexec/epilogue.cu). */
static double recount_gpu(const dm_plan *p, int G, int dtype, int *bad_input) {
    const dm_graph *g = p->g;
    const dm_group *gr = &p->groups[G];
    double bytes = recount_group(p, G, dtype, bad_input);
    if (gr->nops != 1) return bytes;
    const dm_op *op = &g->op[p->order[gr->first]];
    if (!strcmp(op->name, "qkv_proj")) bytes -= (double)g->t[op->out[0]].numel * dtype;
    if (!strcmp(op->name, "qkv_bias")) bytes -= (double)g->t[op->in[0]].numel * dtype;
    return bytes;
}

static void test_bert_large_flop(void) {
    setup s;
    if (build(&s, 8, 512, 1024, 16, 4096)) return;
    dm_device dev;
    CHECK_OK(dm_device_preset("h100", &dev));
    dm_cost_report r;
    CHECK_OK(dm_cost_analyze(&s.g, &s.fused, &dev, 4, &r));
    double b = 8, j = 512, i = 1024, u = 4096;
    /* QKV (3i x i), scores and context (j x j x i over heads), out (i x i), FFN 2 x (i x u) */
    double fwd = 2 * b * j * (3 * i * i) + 2 * (2 * b * j * j * i) + 2 * b * j * i * i +
                 2 * (2 * b * j * i * u);
    double bwd = 2 * fwd; /* each contraction has two gradient contractions */
    double f = r.pass_flop[0][DM_CLASS_CONTRACTION], bk = r.pass_flop[1][DM_CLASS_CONTRACTION];
    printf("  BERT-large contractions: forward %.2f GFLOP (expected %.2f), backward %.2f "
           "(expected %.2f)\n", f / 1e9, fwd / 1e9, bk / 1e9, bwd / 1e9);
    CHECK(f == fwd);
    CHECK(bk == bwd);
    CHECK(fabs(f / 1e9 - 111.67) < 0.005);
    CHECK(fabs(bk / 1e9 - 223.34) < 0.01);
    dm_cost_free(&r);
    teardown(&s);
}

static void test_group_bytes(int64_t b, int64_t j, int64_t i, int64_t h, int64_t u,
                             const char *label) {
    setup s;
    if (build(&s, b, j, i, h, u)) return;
    dm_device dev;
    CHECK_OK(dm_device_preset("a100", &dev));
    dm_cost_report r, r16;
    CHECK_OK(dm_cost_analyze(&s.g, &s.fused, &dev, 4, &r));
    CHECK_OK(dm_cost_analyze(&s.g, &s.fused, &dev, 2, &r16));
    double sum = 0;
    int bad_input = 0, mismatches = 0, in_epi = 0;
    CHECK(r.ngroups == s.fused.ngroups && r.nops == s.g.nop);
    for (int G = 0; G < r.ngroups; G++) {
        double want = recount_gpu(&s.fused, G, 4, &bad_input);
        if (fabs(r.groups[G].bytes - want) > 0.5) {
            mismatches++;
            fprintf(stderr, "  group %d: %.0f bytes, recounted %.0f\n", G, r.groups[G].bytes, want);
        }
        sum += r.groups[G].bytes;
        if (r.groups[G].in_epilogue) {
            in_epi++;
            CHECK(!strcmp(s.g.op[s.fused.order[s.fused.groups[G].first]].name, "qkv_bias"));
            CHECK(r.groups[G].predicted_s == 0 && r.groups[G - 1].predicted_s > 0);
        }
    }
    CHECK(mismatches == 0);
    CHECK(in_epi == 1 && r.bias_epilogues == 1 && r16.bias_epilogues == 1);
    {
        /* the same plan counted for a CPU (its executor has no such epilogue): every group
         * as recounted, the floor no lower */
        dm_device cpu = dev;
        cpu.is_cpu = 1;
        dm_cost_report rc;
        CHECK_OK(dm_cost_analyze(&s.g, &s.fused, &cpu, 4, &rc));
        int cm = 0;
        for (int G = 0; G < rc.ngroups; G++) cm += fabs(rc.groups[G].bytes - recount_group(&s.fused, G, 4, &bad_input)) > 0.5;
        CHECK(cm == 0 && rc.bias_epilogues == 0 && rc.fused_floor_s >= r.fused_floor_s);
        CHECK(fabs(rc.fused_bytes - r.fused_bytes - 2.0 * 4 * (double)(b * j) * 3 * i) < 1);
        printf("  %s: the qkv bias in its GEMM's epilogue (GPU): %.3f MB less, floor %.4f ms (CPU count %.4f)\n",
               label, (rc.fused_bytes - r.fused_bytes) / 1e6, r.fused_floor_s * 1e3, rc.fused_floor_s * 1e3);
        dm_cost_free(&rc);
    }
    CHECK(!bad_input); /* every external input of a group is materialized */
    CHECK(fabs(sum - r.fused_bytes) < 1);
    CHECK(r.fused_bytes <= r.unfused_bytes);
    CHECK(r.fused_floor_s <= r.unfused_floor_s * (1 + 1e-12));
    /* the unfused schedule through the group formula gives every op's own I/O */
    double usum = 0;
    int umis = 0;
    for (int G = 0; G < s.unfused.ngroups; G++) {
        double rd, wr;
        CHECK(dm_cost_group_io(&s.unfused, G, 4, &rd, &wr) == DM_OK);
        int o = s.unfused.order[s.unfused.groups[G].first];
        umis += s.unfused.groups[G].nops != 1 || fabs(rd + wr - r.ops[o].bytes) > 0.5;
        usum += rd + wr;
    }
    CHECK(umis == 0);
    CHECK(fabs(usum - r.unfused_bytes) < 1);
    /* bytes from element counts, independently: dm_op_bytes counts fp32 */
    double gb = 0;
    for (int o = 0; o < s.g.nop; o++) gb += dm_op_bytes(&s.g, &s.g.op[o]);
    CHECK(fabs(gb - r.unfused_bytes) <= 1e-9 * gb);
    CHECK(fabs(r16.unfused_bytes * 2 - r.unfused_bytes) < 1);
    CHECK(fabs(r16.fused_bytes * 2 - r.fused_bytes) < 1);
    /* predicted time = max(flop / peak, bytes / bandwidth) */
    int tmis = 0;
    for (int o = 0; o < r.nops; o++) {
        const dm_op_cost *c = &r.ops[o];
        double peak = c->cls == DM_CLASS_CONTRACTION ? 19.5e12 : 19.5e12;
        double want = fmax(c->flop / peak, c->bytes / 2039e9);
        tmis += fabs(c->predicted_s - want) > 1e-12 * want;
        const dm_op_cost *c16 = &r16.ops[o];
        double peak16 = c16->cls == DM_CLASS_CONTRACTION ? 312e12 : 19.5e12;
        double want16 = fmax(c16->flop / peak16, c16->bytes / 2039e9);
        tmis += fabs(c16->predicted_s - want16) > 1e-12 * want16;
        tmis += c->memory_bound != (c->bytes / 2039e9 >= c->flop / peak);
    }
    CHECK(tmis == 0);
    printf("  %s: unfused %.2f MB, fused %.2f MB: reduction %.2f%% (fp32); floors %.3f / %.3f ms "
           "on A100 fp32\n", label, r.unfused_bytes / 1e6, r.fused_bytes / 1e6, r.reduction_pct,
           r.unfused_floor_s * 1e3, r.fused_floor_s * 1e3);

    /* JSON */
    cJSON *j_ = dm_cost_json(&s.g, &r, &s.cfg);
    CHECK(j_ != NULL);
    if (j_) {
        const cJSON *ops = cJSON_GetObjectItemCaseSensitive(j_, "ops"), *e;
        CHECK(cJSON_GetArraySize(ops) == s.g.nop);
        int badf = 0;
        cJSON_ArrayForEach(e, ops) {
            const char *num[] = {"flop", "bytes", "intensity", "predicted_seconds"};
            for (int k = 0; k < 4; k++)
                badf += !cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(e, num[k]));
            const cJSON *p = cJSON_GetObjectItemCaseSensitive(e, "pass"),
                        *c = cJSON_GetObjectItemCaseSensitive(e, "class"),
                        *bd = cJSON_GetObjectItemCaseSensitive(e, "bound"),
                        *n = cJSON_GetObjectItemCaseSensitive(e, "name");
            badf += !cJSON_IsString(n) || !cJSON_IsString(p) || !cJSON_IsString(c) ||
                    !cJSON_IsString(bd);
            if (badf) continue;
            badf += strcmp(p->valuestring, "forward") && strcmp(p->valuestring, "backward");
            badf += strcmp(c->valuestring, "contraction") && strcmp(c->valuestring, "normalization") &&
                    strcmp(c->valuestring, "elementwise");
            badf += strcmp(bd->valuestring, "memory") && strcmp(bd->valuestring, "compute");
        }
        CHECK(badf == 0);
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(j_, "groups")) == r.ngroups);
        CHECK(cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j_, "totals")));
        cJSON_Delete(j_);
    }
    dm_cost_free(&r);
    dm_cost_free(&r16);
    teardown(&s);
}

/* --- SVG through expat ------------------------------------------------------------------ */

typedef struct {
    int depth, points, root_svg, elements;
    int bars, floors;     /* groups chart: rect class "group <class>", rect class "floor" */
    double bar_w[64], floor_w[64];
} svg_count;

static void XMLCALL on_start(void *ud, const XML_Char *name, const XML_Char **attr) {
    svg_count *c = ud;
    if (c->depth == 0) c->root_svg = !strcmp(name, "svg");
    c->depth++;
    c->elements++;
    if (!strcmp(name, "rect")) {
        const char *cls = NULL, *w = NULL;
        for (int k = 0; attr[k]; k += 2) {
            if (!strcmp(attr[k], "class")) cls = attr[k + 1];
            if (!strcmp(attr[k], "width")) w = attr[k + 1];
        }
        if (cls && w && !strncmp(cls, "group ", 6) && c->bars < 64) c->bar_w[c->bars++] = atof(w);
        if (cls && w && !strcmp(cls, "floor") && c->floors < 64) c->floor_w[c->floors++] = atof(w);
        return;
    }
    if (strcmp(name, "circle") != 0) return;
    for (int k = 0; attr[k]; k += 2)
        if (!strcmp(attr[k], "class") && !strncmp(attr[k + 1], "op ", 3)) c->points++;
}

static void XMLCALL on_end(void *ud, const XML_Char *name) {
    (void)name;
    ((svg_count *)ud)->depth--;
}

/* 0: well-formed; counts in *c. */
static int parse_svg(const char *text, size_t len, svg_count *c) {
    memset(c, 0, sizeof *c);
    XML_Parser p = XML_ParserCreate("UTF-8");
    if (!p) return -1;
    XML_SetUserData(p, c);
    XML_SetElementHandler(p, on_start, on_end);
    int ok = XML_Parse(p, text, (int)len, 1) == XML_STATUS_OK;
    if (!ok)
        fprintf(stderr, "  SVG not well-formed: %s at line %lu\n",
                XML_ErrorString(XML_GetErrorCode(p)), (unsigned long)XML_GetCurrentLineNumber(p));
    XML_ParserFree(p);
    return ok ? 0 : -1;
}

static void test_recompute(void) {
    const int64_t b = 4, j = 64, i = 128, h = 4, u = 256;
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = b, cfg.seq = j, cfg.hidden = i, cfg.heads = h, cfg.ffn = u;
    dm_device dev;
    CHECK_OK(dm_device_preset("h100", &dev));
    dm_graph g[2], gf[2];
    dm_plan p[2];
    dm_cost_report r[2];
    memset(r, 0, sizeof r);
    for (int v = 0; v < 2; v++) {
        CHECK_OK(dm_cost_build(&cfg, 0, v, 0, &g[v], &gf[v], &p[v]));
        CHECK_OK(dm_cost_analyze(&g[v], &p[v], &dev, 2, &r[v]));
    }
    /* the recomputed ops, from the unfused graph: scores, mask, softmax, dropout */
    double four = 0, scores = 0;
    const dm_op_kind kinds[4] = {DM_OP_CONTRACT, DM_OP_MASK_ADD, DM_OP_SOFTMAX, DM_OP_DROPOUT};
    const char *names[4] = {"attn_scores", "attn_mask", "attn_softmax", "attn_probs_dropout"};
    for (int o = 0; o < g[0].nop; o++)
        for (int k = 0; k < 4; k++)
            if (g[0].op[o].kind == kinds[k] && !strcmp(g[0].op[o].name, names[k])) {
                four += dm_op_flop(&g[0], &g[0].op[o]);
                if (k == 0) scores = dm_op_flop(&g[0], &g[0].op[o]);
            }
    const double qk = 2.0 * b * h * j * j * (i / h);
    double bytes = 0;
    int bad = 0;
    for (int G = 0; G < p[1].ngroups; G++) bytes += recount_gpu(&p[1], G, 2, &bad);
    printf("  --recompute: +%.4f GFLOP (QK^T by hand %.4f), fused bytes %.3f MB (recounted %.3f; without %.3f)\n",
           r[1].recomputed_flop / 1e9, qk / 1e9, r[1].fused_bytes / 1e6, bytes / 1e6, r[0].fused_bytes / 1e6);
    /* the row ops: a few flop per score against QK^T's 2p */
    CHECK(r[0].recomputed_flop == 0 && r[1].recomputed_flop == four && scores == qk && four < 1.25 * qk);
    CHECK(fabs(r[1].fused_flop - (r[0].fused_flop + four)) < 1.0);
    CHECK(r[1].flop_total == r[0].flop_total); /* the operator table: the plain graph */
    CHECK(!bad && fabs(bytes - r[1].fused_bytes) < 0.5 && r[1].fused_bytes < r[0].fused_bytes);
    for (int v = 0; v < 2; v++) {
        dm_cost_free(&r[v]);
        dm_plan_free(&p[v]);
        dm_graph_free(&gf[v]);
        dm_graph_free(&g[v]);
    }
}

static void test_svg(void) {
    setup s;
    if (build(&s, 2, 64, 128, 4, 512)) return;
    const char *devs[] = {"v100", "h200"};
    for (int d = 0; d < 2; d++) {
        dm_device dev;
        CHECK_OK(dm_device_preset(devs[d], &dev));
        dm_cost_report r;
        CHECK_OK(dm_cost_analyze(&s.g, &s.fused, &dev, d ? 2 : 4, &r));
        char path[] = "/tmp/dmove_test_svg_XXXXXX";
        int fd = mkstemp(path);
        CHECK(fd >= 0);
        if (fd < 0) continue;
        close(fd);
        CHECK_OK(dm_cost_write_svg(&s.g, &r, "title with <&> \"quotes\"", path));
        FILE *f = fopen(path, "rb");
        CHECK(f != NULL);
        if (f) {
            static char buf[1 << 20];
            size_t n = fread(buf, 1, sizeof buf, f);
            fclose(f);
            svg_count c;
            CHECK(n > 0 && n < sizeof buf);
            CHECK(parse_svg(buf, n, &c) == 0);
            CHECK(c.root_svg);
            CHECK(c.points == s.g.nop);
            printf("  SVG on %s: well-formed, %d elements, %d points for %d ops\n", devs[d],
                   c.elements, c.points, s.g.nop);
        }
        unlink(path);
        dm_cost_free(&r);
    }
    teardown(&s);
}

/* The groups chart (bench --svg): well-formed, a bar per group timed apart, a floor band
 * per group with a floor, every width in proportion to its milliseconds on one axis. */
static void test_groups_chart(void) {
    const dm_chart_bar a[] = {
        {"qkv_proj", 0, DM_CLASS_CONTRACTION, 2.0, 1.0, NULL},
        {"qkv_bias", 0, DM_CLASS_ELEMENTWISE, -1, -1, "timed with qkv_proj"},
        {"a <&> \"quoted\" group", 1, DM_CLASS_NORMALIZATION, 0.5, 0.125, NULL},
    };
    const dm_chart_bar b[] = {{"ffn_in_proj", 0, DM_CLASS_CONTRACTION, 4.0, -1, NULL}};
    const dm_chart_section sec[2] = {{"fused", "sum <1>", a, 3}, {"unfused", NULL, b, 1}};
    char *text = dm_groups_svg("title & more", NULL, sec, 2);
    CHECK(text != NULL);
    if (!text) return;
    svg_count c;
    CHECK(parse_svg(text, strlen(text), &c) == 0);
    CHECK(c.root_svg && c.bars == 3 && c.floors == 2);
    if (c.bars == 3 && c.floors == 2) {
        const double px_per_ms = c.bar_w[0] / 2.0;
        CHECK(px_per_ms > 10);
        CHECK(fabs(c.bar_w[1] - 0.5 * px_per_ms) < 0.11 && fabs(c.bar_w[2] - 4.0 * px_per_ms) < 0.11);
        CHECK(fabs(c.floor_w[0] - 1.0 * px_per_ms) < 0.11 && fabs(c.floor_w[1] - 0.125 * px_per_ms) < 0.11);
    }
    CHECK(strstr(text, "timed with qkv_proj") != NULL && strstr(text, "(2x floor)") != NULL);
    printf("  groups chart: well-formed, %d bars, %d floors, widths in proportion\n", c.bars, c.floors);
    free(text);
    CHECK(dm_groups_svg("t", "s", sec, 0) == NULL);
    CHECK(dm_groups_write_svg("t", "s", sec, 2, "/nonexistent-dir/x.svg") != DM_OK);
}

/* --- the CPU profile -------------------------------------------------------------------- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_profile(void) {
    char dir[] = "/tmp/dmove_test_prof_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256], bad[256];
    snprintf(path, sizeof path, "%s/sub/dir/cpu-profile.json", dir); /* parents created */
    dm_cpu_profile p = {0}, q;
    p.version = DM_PROFILE_VERSION;
    snprintf(p.machine, sizeof p.machine, "Test CPU \"quoted\"");
    snprintf(p.host, sizeof p.host, "host");
    snprintf(p.date, sizeof p.date, "2026-01-01T00:00:00Z");
    p.threads = 2;
    p.triad_bw = 30e9, p.read_bw = 32e9, p.vector_flops = 200e9, p.sgemm_n = 2048;
    p.nsgemm = 2;
    p.sgemm_threads[0] = 1, p.sgemm_flops[0] = 95e9;
    p.sgemm_threads[1] = 2, p.sgemm_flops[1] = 188e9;
    CHECK_OK(dm_profile_save(path, &p));
    CHECK_OK(dm_profile_load(path, &q));
    CHECK(q.nsgemm == 2 && fabs(q.sgemm_flops[1] - 188e9) < 1 && fabs(q.triad_bw - 30e9) < 1);
    CHECK(!strcmp(q.machine, p.machine));
    dm_device dev;
    CHECK_OK(dm_device_from_profile(&q, 1, &dev));
    CHECK(fabs(dev.contract_fp32 - 95e9) < 1 && fabs(dev.vector_flops - 100e9) < 1);
    CHECK_OK(dm_device_from_profile(&q, 0, &dev));
    CHECK(fabs(dev.contract_fp32 - 188e9) < 1 && dev.is_cpu && dev.bandwidth == q.triad_bw);
    CHECK(q.direct_flops[0] == 0 && q.direct_kernel[0] == 0); /* none measured: none read */
    /* dmove's own kernel beside SGEMM: the contraction rate is the faster at each count */
    p.direct_flops[0] = 90e9, p.direct_flops[1] = 400e9;
    snprintf(p.direct_kernel, sizeof p.direct_kernel, "amx");
    CHECK_OK(dm_profile_save(path, &p));
    CHECK_OK(dm_profile_load(path, &q));
    CHECK(fabs(q.direct_flops[1] - 400e9) < 1 && !strcmp(q.direct_kernel, "amx"));
    CHECK_OK(dm_device_from_profile(&q, 1, &dev));
    CHECK(fabs(dev.contract_fp32 - 95e9) < 1); /* SGEMM the faster on 1 thread */
    CHECK_OK(dm_device_from_profile(&q, 0, &dev));
    CHECK(fabs(dev.contract_fp32 - 400e9) < 1 && strstr(dev.desc, "dmove's amx GEMM 400.0") != NULL);

    snprintf(bad, sizeof bad, "%s/missing.json", dir);
    CHECK(dm_profile_load(bad, &q) == DM_ERR_NOT_FOUND);
    CHECK(strstr(dm_last_error(), "dmove probe") != NULL);
    const char *cases[] = {
        "", "{", "[]", "{\"version\": 1}", "{\"version\": 2, \"machine\": {}}",
        "{\"version\": 1, \"machine\": {}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": -1, "
        "\"read\": 1}, \"vector_gflops\": 1, \"sgemm_n\": 8, \"sgemm\": [{\"threads\": 1, "
        "\"gflops\": 1}]}",
        "{\"version\": 1, \"machine\": {}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": 1, "
        "\"read\": 1}, \"vector_gflops\": 1, \"sgemm_n\": 8, \"sgemm\": []}",
        "{\"version\": 1, \"machine\": {}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": 1, "
        "\"read\": 1}, \"vector_gflops\": 1, \"sgemm_n\": 8, \"sgemm\": [{\"threads\": 3, "
        "\"gflops\": 1}]}",
        "{\"version\": 1, \"machine\": {}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": 1, "
        "\"read\": 1}, \"vector_gflops\": \"fast\", \"sgemm_n\": 8, \"sgemm\": [{\"threads\": 1, "
        "\"gflops\": 1}]}",
        "{\"version\": 1, \"machine\": {}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": 1, "
        "\"read\": 1}, \"vector_gflops\": 1, \"sgemm_n\": 8, \"sgemm\": [{\"threads\": 1, "
        "\"gflops\": 1, \"direct_gflops\": -5}]}",
        "{\"version\": 1, \"machine\": {}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": 1, "
        "\"read\": 1}, \"vector_gflops\": 1, \"sgemm_n\": 8, \"sgemm\": [{\"threads\": 1, "
        "\"gflops\": 1, \"direct_gflops\": \"fast\"}]}",
        "{\"version\": 1, \"machine\": {}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": 1, "
        "\"read\": 1}, \"vector_gflops\": 1, \"sgemm_n\": 8, \"sgemm\": [{\"threads\": 1, "
        "\"gflops\": 1, \"direct_gflops\": 2}], \"direct_kernel\": \"amx\\u001b[31m\"}",
        "{\"version\": 1, \"machine\": {}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": 1, "
        "\"read\": 1}, \"vector_gflops\": 1, \"sgemm_n\": 8, \"sgemm\": [{\"threads\": 1, "
        "\"gflops\": 1, \"direct_gflops\": 2}]}",
        "{\"version\": 1, \"machine\": {}, \"threads\": 2, \"bandwidth_gbs\": {\"triad\": 1, "
        "\"read\": 1}, \"vector_gflops\": 1, \"sgemm_n\": 8, \"sgemm\": [{\"threads\": 1, "
        "\"gflops\": 1, \"direct_gflops\": 2}], \"direct_kernel\": 5}",
    };
    int nbad = 0;
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        snprintf(bad, sizeof bad, "%s/bad.json", dir);
        write_text(bad, cases[k]);
        nbad += dm_profile_load(bad, &q) == DM_ERR_FORMAT;
    }
    CHECK(nbad == (int)(sizeof cases / sizeof cases[0]));
    printf("  profile: round trip ok, %d malformed files refused\n", nbad);
    unlink(bad);
    unlink(path);
    char sub[300];
    snprintf(sub, sizeof sub, "%s/sub/dir", dir);
    rmdir(sub);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    rmdir(sub);
    rmdir(dir);
}

static void test_layer_groups(void) {
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2;
    cfg.seq = 16;
    cfg.hidden = 32;
    cfg.heads = 4;
    cfg.ffn = 64;
    dm_layer_options opt = {.schedule = DM_SCHED_FUSED, .threads = 1};
    dm_layer *L = NULL;
    CHECK_OK(dm_layer_new(&L, &cfg, &opt));
    if (!L) return;
    CHECK_OK(dm_layer_init_params(L, 1));
    dm_layer_profile(L, 1);
    dm_layer_profile_reset(L);
    CHECK_OK(dm_layer_forward(L));
    CHECK_OK(dm_layer_backward(L));
    dm_layer_profile(L, 0);
    double flop[2][DM_NUM_CLASSES], secs[2][DM_NUM_CLASSES];
    dm_layer_flop(L, flop);
    dm_layer_profile_read(L, secs);
    dm_device dev;
    CHECK_OK(dm_device_preset("h100", &dev));
    const int n = dm_layer_num_groups(L);
    CHECK(n > 10);
    double want_flop = 0, want_s = 0, got_flop = 0, got_s = 0, floor_s = 0;
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < DM_NUM_CLASSES; k++) {
            want_flop += flop[p][k];
            want_s += secs[p][k];
        }
    int timed = 0, first_ok = 0;
    for (int G = 0; G < n; G++) {
        dm_layer_group x;
        CHECK_OK(dm_layer_group_info(L, G, &x));
        got_flop += x.contraction_flop + x.other_flop;
        got_s += x.seconds;
        timed += x.seconds > 0;
        CHECK(x.timed_with == -1); /* the default plan runs no group inside another */
        CHECK(x.nops >= 1 && x.ops[0] && x.bytes_read > 0 && x.bytes_written >= 0);
        CHECK((x.cls == DM_CLASS_CONTRACTION) == (x.contraction_flop > 0));
        if (G == 0) first_ok = !strcmp(x.ops, "qkv_proj") && x.pass == 0;
        floor_s += dm_roofline_seconds(&dev, 4, x.contraction_flop, x.other_flop, x.bytes_read + x.bytes_written);
    }
    CHECK(first_ok);
    CHECK(timed == n);
    CHECK(fabs(got_flop - want_flop) <= 1e-9 * want_flop);
    CHECK(fabs(got_s - want_s) <= 1e-9 + 1e-9 * want_s);
    double unfused_s = 0, fused_s = 0;
    dm_device as_cpu = dev; /* the H100's rates, the CPU executor's grouping (the layer's) */
    as_cpu.is_cpu = 1;
    CHECK_OK(dm_cost_floors(&cfg, &as_cpu, 4, 0, &unfused_s, &fused_s));
    printf("  layer groups: %d, %.0f flop (dm_layer_flop %.0f), floors %.6g s (cost model %.6g s)\n", n, got_flop,
           want_flop, floor_s, fused_s);
    CHECK(fused_s > 0 && fabs(floor_s - fused_s) <= 1e-12 * fused_s);
    dm_layer_group x;
    CHECK(dm_layer_group_info(L, n, &x) == DM_ERR_INVALID_ARG);
    CHECK(dm_layer_group_info(L, -1, &x) == DM_ERR_INVALID_ARG);
    CHECK(dm_layer_group_info(NULL, 0, &x) == DM_ERR_INVALID_ARG);
    CHECK(dm_layer_num_groups(NULL) == 0);
    dm_layer_free(L);
    /* a roofline time is the larger of compute and memory time */
    CHECK(dm_roofline_seconds(&dev, 2, 989.5e12, 0, 0) == 1.0);
    CHECK(fabs(dm_roofline_seconds(&dev, 2, 0, 67e12, 3350e9 * 0.5) - 1.0) < 1e-12);
    CHECK(fabs(dm_roofline_seconds(&dev, 4, 0, 0, 3350e9 * 2) - 2.0) < 1e-12);
    /* the driver's board names */
    static const struct { const char *gpu, *want; } names[] = {
        {"NVIDIA H100 80GB HBM3", "h100"}, {"NVIDIA H200", "h200"}, {"NVIDIA A100-SXM4-80GB", "a100"},
        {"Tesla V100-SXM2-32GB", "v100"}, {"NVIDIA H100 PCIe", NULL}, {"NVIDIA H100 NVL", NULL},
        {"NVIDIA A100-SXM4-40GB", NULL}, {"NVIDIA GeForce RTX 4090", NULL}, {"", NULL}, {NULL, NULL},
        {"NVIDIA H100 80GB HBM3 MIG 1g.10gb", NULL}, {"NVIDIA GH200 480GB", NULL}, {"NVIDIA A100-PCIE-40GB", NULL},
        {"NVIDIA H200 NVL", NULL},
    };
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        const char *got = dm_device_for_gpu(names[k].gpu);
        CHECK(got == names[k].want || (got && names[k].want && !strcmp(got, names[k].want)));
    }
}

int main(void) {
    test_bert_large_flop();
    test_group_bytes(8, 128, 768, 12, 3072, "BERT-base");
    test_group_bytes(8, 512, 1024, 16, 4096, "BERT-large");
    test_group_bytes(3, 17, 40, 5, 72, "odd sizes");
    test_recompute();
    test_svg();
    test_profile();
    test_layer_groups();
    test_groups_chart();
    TEST_END();
}
