/* planfile.c: tuned plan choices: applying them to a planned graph, and the JSON plan
 * file (cJSON). The file names tensors and operators, so it is readable and diffable;
 * a checksum over the configuration and the choices catches corruption and edits. */
#include "plan/planfile.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/file.h"
#include "core/status.h"

#define MAX_PLAN_BYTES (4 << 20)

dm_status dm_choices_init(dm_choices *c, const dm_graph *g, const dm_algo_table *algos) {
    memset(c, 0, sizeof *c);
    c->algos = algos;
    c->nt = g->nt;
    c->nop = g->nop;
    c->layout = calloc((size_t)(g->nt > 0 ? g->nt : 1), sizeof *c->layout);
    c->algo = calloc((size_t)(g->nop > 0 ? g->nop : 1), 1);
    if (!c->layout || !c->algo) {
        dm_choices_free(c);
        return dm_fail(DM_ERR_OOM, "out of memory");
    }
    return DM_OK;
}

void dm_choices_free(dm_choices *c) {
    free(c->layout);
    free(c->algo);
    memset(c, 0, sizeof *c);
}

dm_status dm_choices_apply(const dm_choices *c, dm_graph *g, dm_plan *plan) {
    if (c->nt != g->nt || c->nop != g->nop)
        return dm_fail(DM_ERR_INTERNAL, "plan choices were made for another graph");
    int laid = 0;
    for (int t = 0; t < g->nt; t++)
        if (c->layout[t][0]) {
            DM_TRY(dm_graph_set_layout(g, t, c->layout[t]));
            laid = 1;
        }
    /* offsets again: which outputs may take their input's bytes depends on the layouts */
    if (laid) DM_TRY(dm_plan_memory(plan, plan->no_reuse));
    free(plan->algo);
    plan->algo = malloc((size_t)(g->nop > 0 ? g->nop : 1));
    if (!plan->algo) return dm_fail(DM_ERR_OOM, "out of memory");
    memcpy(plan->algo, c->algo, (size_t)g->nop);
    plan->algos = c->algos;
    return DM_OK;
}

/* FNV-1a, 64 bits: enough to catch corruption and hand edits (not an adversary). */
static uint64_t fnv(uint64_t h, const char *s) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static uint64_t checksum(const dm_layer_config *cfg, const dm_layer_options *opt, const dm_graph *g,
                         const dm_choices *c) {
    char buf[256];
    /* the layer variants only where they differ from BERT's: older plans keep their sums */
    snprintf(buf, sizeof buf, "v%d b%lld j%lld i%lld h%lld u%lld %s%s%s %s%s %d;", DM_PLAN_VERSION,
             (long long)cfg->batch, (long long)cfg->seq, (long long)cfg->hidden, (long long)cfg->heads,
             (long long)cfg->ffn, dm_act_name(cfg->act), cfg->norm == DM_NORM_PRE ? " pre" : "",
             cfg->causal ? " causal" : "", opt->schedule == DM_SCHED_UNFUSED ? "unfused" : "fused",
             opt->recompute ? " recompute" : "", opt->forward_only);
    uint64_t h = fnv(14695981039346656037ull, buf);
    for (int t = 0; t < g->nt; t++)
        if (c->layout[t][0]) {
            h = fnv(h, g->t[t].name);
            h = fnv(h, "=");
            h = fnv(h, c->layout[t]);
            h = fnv(h, ";");
        }
    for (int o = 0; o < g->nop; o++)
        if (c->algo[o]) {
            h = fnv(h, g->op[o].name);
            h = fnv(h, "=");
            h = fnv(h, dm_algo_name(c->algos, c->algo[o]));
            h = fnv(h, ";");
        }
    return h;
}

int dm_choices_add_json(struct cJSON *obj, const dm_graph *g, const dm_choices *c) {
    cJSON *lay = cJSON_AddObjectToObject(obj, "layouts"), *alg = cJSON_AddObjectToObject(obj, "algorithms");
    int ok = lay && alg;
    for (int t = 0; ok && t < g->nt; t++)
        if (c->layout[t][0]) ok = cJSON_AddStringToObject(lay, g->t[t].name, c->layout[t]) != NULL;
    for (int o = 0; ok && o < g->nop; o++)
        if (c->algo[o])
            ok = cJSON_AddStringToObject(alg, g->op[o].name, dm_algo_name(c->algos, c->algo[o])) != NULL;
    return ok;
}

dm_status dm_plan_save(const char *path, const dm_layer_config *cfg, const dm_layer_options *opt,
                       const dm_graph *g, const dm_choices *c) {
    char sum[32];
    snprintf(sum, sizeof sum, "%016llx", (unsigned long long)checksum(cfg, opt, g, c));
    cJSON *root = cJSON_CreateObject(), *conf = NULL, *meas = NULL;
    int ok = root && cJSON_AddStringToObject(root, "format", DM_PLAN_FORMAT) &&
             cJSON_AddNumberToObject(root, "version", DM_PLAN_VERSION) &&
             cJSON_AddStringToObject(root, "dmove_version", DMOVE_VERSION) &&
             (conf = cJSON_AddObjectToObject(root, "config")) != NULL &&
             cJSON_AddNumberToObject(conf, "batch", (double)cfg->batch) &&
             cJSON_AddNumberToObject(conf, "seq", (double)cfg->seq) &&
             cJSON_AddNumberToObject(conf, "hidden", (double)cfg->hidden) &&
             cJSON_AddNumberToObject(conf, "heads", (double)cfg->heads) &&
             cJSON_AddNumberToObject(conf, "ffn", (double)cfg->ffn) &&
             cJSON_AddStringToObject(conf, "act", dm_act_name(cfg->act)) &&
             cJSON_AddStringToObject(conf, "norm", dm_norm_name(cfg->norm)) &&
             cJSON_AddBoolToObject(conf, "causal", cfg->causal) &&
             cJSON_AddStringToObject(conf, "schedule", opt->schedule == DM_SCHED_UNFUSED ? "unfused" : "fused") &&
             cJSON_AddBoolToObject(conf, "forward_only", opt->forward_only) &&
             cJSON_AddBoolToObject(conf, "recompute", opt->recompute) &&
             (meas = cJSON_AddObjectToObject(root, "measured")) != NULL &&
             cJSON_AddStringToObject(meas, "machine", c->machine) &&
             cJSON_AddNumberToObject(meas, "threads", c->threads) &&
             cJSON_AddNumberToObject(meas, "tuned_ms", isfinite(c->tuned_ms) ? c->tuned_ms : 0) &&
             cJSON_AddNumberToObject(meas, "default_ms", isfinite(c->default_ms) ? c->default_ms : 0) &&
             dm_choices_add_json(root, g, c);
    ok = ok && cJSON_AddStringToObject(root, "checksum", sum);
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) return dm_fail(DM_ERR_OOM, "out of memory writing the plan");
    size_t len = strlen(text);
    text[len] = '\n'; /* replaces the terminator; the length is passed */
    dm_status st = dm_write_file_atomic(path, text, len + 1);
    cJSON_free(text);
    return st;
}

static dm_status bad(const char *path, const char *what) {
    return dm_fail(DM_ERR_FORMAT, "plan '%s' is not usable: %s; run 'dmove tune' to make a new one",
                   path, what);
}

static int num_is(const cJSON *o, const char *k, double want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) && v->valuedouble == want;
}

static int str_is(const cJSON *o, const char *k, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) && v->valuestring && !strcmp(v->valuestring, want);
}

static int find_tensor(const dm_graph *g, const char *name) {
    for (int t = 0; t < g->nt; t++)
        if (!strcmp(g->t[t].name, name)) return t;
    return -1;
}

static int find_op(const dm_graph *g, const char *name) {
    for (int o = 0; o < g->nop; o++)
        if (!strcmp(g->op[o].name, name)) return o;
    return -1;
}

static dm_status parse(const char *path, const cJSON *root, const dm_layer_config *cfg,
                       const dm_layer_options *opt, const dm_graph *g, dm_choices *c) {
    char msg[512];
    if (!cJSON_IsObject(root)) return bad(path, "not a JSON object");
    if (!str_is(root, "format", DM_PLAN_FORMAT)) return bad(path, "no \"format\": \"dmove-plan\"");
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(root, "version");
    if (!cJSON_IsNumber(ver)) return bad(path, "no \"version\" number");
    if (ver->valuedouble != DM_PLAN_VERSION) {
        snprintf(msg, sizeof msg, "it has format version %g and this dmove reads version %d (%s)",
                 ver->valuedouble, DM_PLAN_VERSION,
                 ver->valuedouble < DM_PLAN_VERSION ? "written by an older dmove: run `dmove tune` again"
                                                     : "written by a newer dmove");
        return bad(path, msg);
    }
    const cJSON *conf = cJSON_GetObjectItemCaseSensitive(root, "config");
    if (!cJSON_IsObject(conf)) return bad(path, "no \"config\" object");
    const char *sched = opt->schedule == DM_SCHED_UNFUSED ? "unfused" : "fused";
    if (!num_is(conf, "batch", (double)cfg->batch) || !num_is(conf, "seq", (double)cfg->seq) ||
        !num_is(conf, "hidden", (double)cfg->hidden) || !num_is(conf, "heads", (double)cfg->heads) ||
        !num_is(conf, "ffn", (double)cfg->ffn) || !str_is(conf, "act", dm_act_name(cfg->act)) ||
        !str_is(conf, "schedule", sched)) {
        /* say what it was tuned for, as sizes and as the options that select them */
        static const char *const keys[] = {"batch", "seq", "hidden", "heads", "ffn"};
        static const char letter[] = "bjihu";
        char have[256] = "";
        size_t len = 0;
        for (int k = 0; k < 5; k++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(conf, keys[k]);
            if (!cJSON_IsNumber(v)) { /* a missing or mistyped size: say which */
                snprintf(msg, sizeof msg, "its config's \"%s\" is %s: the file was edited; run "
                         "'dmove tune' again", keys[k], v ? "not a number" : "missing");
                return bad(path, msg);
            }
            if (len < sizeof have) /* %g: an edited 4.5 shows as it is */
                len += (size_t)snprintf(have + len, sizeof have - len, "%s%c=%.15g", k ? " " : "", letter[k],
                                        v->valuedouble);
        }
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(conf, "act");
        const cJSON *sc = cJSON_GetObjectItemCaseSensitive(conf, "schedule");
        if (cJSON_IsString(a) && a->valuestring && len < sizeof have)
            len += (size_t)snprintf(have + len, sizeof have - len, " act=%.32s", a->valuestring);
        if (cJSON_IsString(sc) && sc->valuestring && len < sizeof have)
            snprintf(have + len, sizeof have - len, " schedule=%.32s", sc->valuestring);
        snprintf(msg, sizeof msg, "it was tuned for %s, not for b=%lld j=%lld i=%lld h=%lld u=%lld act=%s "
                 "schedule=%s; use it with those sizes (--batch, --seq, --hidden, --heads, --ffn; for "
                 "dmove layer, inputs of those shapes), or run 'dmove tune' for these",
                 have[0] ? have : "another configuration", (long long)cfg->batch, (long long)cfg->seq,
                 (long long)cfg->hidden, (long long)cfg->heads, (long long)cfg->ffn, dm_act_name(cfg->act), sched);
        return dm_fail(DM_ERR_FORMAT, "plan '%s' is not usable: %s", path, msg);
    }
    /* the layer variant: plans of an older dmove have neither key (post-LN, bidirectional) */
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(conf, "norm");
    const cJSON *ca = cJSON_GetObjectItemCaseSensitive(conf, "causal");
    if ((nm && !cJSON_IsString(nm)) || (ca && !cJSON_IsBool(ca)))
        return bad(path, "\"norm\" must be a string and \"causal\" true or false");
    const char *pn = nm && nm->valuestring ? nm->valuestring : "post";
    const int pc = ca ? cJSON_IsTrue(ca) : 0;
    if (strcmp(pn, dm_norm_name(cfg->norm)) != 0 || pc != (cfg->causal != 0)) {
        snprintf(msg, sizeof msg, "it was tuned for a %.16s-LN, %s layer, not a %s-LN, %s one: give --norm %.16s%s "
                 "to use it", pn, pc ? "causal" : "bidirectional", dm_norm_name(cfg->norm),
                 cfg->causal ? "causal" : "bidirectional", pn, pc ? " --causal" : " without --causal");
        return bad(path, msg);
    }
    /* recompute: its graph has the clones' ops (older plans: no key, no recompute) */
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(conf, "recompute");
    if (rc && !cJSON_IsBool(rc)) return bad(path, "\"recompute\" must be true or false");
    if ((rc && cJSON_IsTrue(rc)) != (opt->recompute != 0))
        return dm_fail(DM_ERR_FORMAT, "plan '%s' is not usable: it was tuned %s attention recomputed in the backward "
                       "pass: %s --recompute to use it", path, opt->recompute ? "without" : "with",
                       opt->recompute ? "run without" : "give");
    const cJSON *fo = cJSON_GetObjectItemCaseSensitive(conf, "forward_only");
    if (!cJSON_IsBool(fo) || cJSON_IsTrue(fo) != (opt->forward_only != 0))
        return opt->forward_only
                   ? dm_fail(DM_ERR_FORMAT, "plan '%s' is for the training step ('dmove tune' tunes "
                             "forward and backward together): run without --forward-only to use it", path)
                   : bad(path, "it was tuned forward-only, not for a training step");
    const cJSON *meas = cJSON_GetObjectItemCaseSensitive(root, "measured");
    if (cJSON_IsObject(meas)) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(meas, "machine");
        if (cJSON_IsString(v) && v->valuestring) snprintf(c->machine, sizeof c->machine, "%s", v->valuestring);
        v = cJSON_GetObjectItemCaseSensitive(meas, "threads");
        if (cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= 4096) c->threads = (int)v->valuedouble;
        v = cJSON_GetObjectItemCaseSensitive(meas, "tuned_ms");
        if (cJSON_IsNumber(v)) c->tuned_ms = v->valuedouble;
        v = cJSON_GetObjectItemCaseSensitive(meas, "default_ms");
        if (cJSON_IsNumber(v)) c->default_ms = v->valuedouble;
    }
    const cJSON *lay = cJSON_GetObjectItemCaseSensitive(root, "layouts");
    const cJSON *alg = cJSON_GetObjectItemCaseSensitive(root, "algorithms");
    if (!cJSON_IsObject(lay) || !cJSON_IsObject(alg)) return bad(path, "no \"layouts\" or \"algorithms\" object");
    const cJSON *e;
    cJSON_ArrayForEach(e, lay) {
        int t = e->string ? find_tensor(g, e->string) : -1;
        if (t < 0 || g->t[t].base >= 0) {
            snprintf(msg, sizeof msg, "layout for \"%s\", which is not a tensor of this layer", e->string ? e->string : "");
            return bad(path, msg);
        }
        if (!cJSON_IsString(e) || !e->valuestring || strlen(e->valuestring) != (size_t)g->t[t].ndim) {
            snprintf(msg, sizeof msg, "the layout of %s must be a string of its %d letters '%s'", g->t[t].name,
                     g->t[t].ndim, g->t[t].letters);
            return bad(path, msg);
        }
        for (int k = 0; k < g->t[t].ndim; k++) {
            const char *p = strchr(g->t[t].letters, e->valuestring[k]);
            if (!p || strchr(e->valuestring + k + 1, e->valuestring[k])) {
                snprintf(msg, sizeof msg, "layout '%s' of %s is not a permutation of '%s'", e->valuestring,
                         g->t[t].name, g->t[t].letters);
                return bad(path, msg);
            }
        }
        memcpy(c->layout[t], e->valuestring, (size_t)g->t[t].ndim + 1);
    }
    cJSON_ArrayForEach(e, alg) {
        int o = e->string ? find_op(g, e->string) : -1;
        if (o < 0 || g->op[o].kind != DM_OP_CONTRACT) {
            snprintf(msg, sizeof msg, "algorithm for \"%s\", which is not a contraction of this layer",
                     e->string ? e->string : "");
            return bad(path, msg);
        }
        int a = cJSON_IsString(e) ? dm_algo_parse(c->algos, e->valuestring) : -1;
        if (a < 0) {
            int l = snprintf(msg, sizeof msg, "unknown algorithm for %s (known:", g->op[o].name);
            /* the table's names but its default's (id 0) */
            for (int k = 1; c->algos && k < c->algos->count && l > 0 && l < (int)sizeof msg; k++)
                l += snprintf(msg + l, sizeof msg - (size_t)l, "%s %s", k > 1 ? "," : "",
                              dm_algo_name(c->algos, k));
            if (l > 0 && l < (int)sizeof msg) snprintf(msg + l, sizeof msg - (size_t)l, ")");
            return bad(path, msg);
        }
        c->algo[o] = (uint8_t)a;
    }
    const cJSON *sum = cJSON_GetObjectItemCaseSensitive(root, "checksum");
    char want[32];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)checksum(cfg, opt, g, c));
    /* the fuzzing build (tests/fuzz) reaches past the checksum: what it guards is checked too */
    if (!cJSON_IsString(sum) || !sum->valuestring || (strcmp(sum->valuestring, want) && !DM_FUZZING_BUILD))
        return bad(path, "its checksum does not match its contents (edited or corrupted)");
    return DM_OK;
}

dm_status dm_plan_load(const char *path, const dm_layer_config *cfg, const dm_layer_options *opt,
                       const dm_graph *g, const dm_algo_table *algos, dm_choices *c) {
    if (!path || !*path) return dm_fail(DM_ERR_INVALID_ARG, "no plan file given");
    if (dm_input_regular(path) != DM_OK) return dm_fail_context(dm_last_status(), "plan: ");
    DM_TRY(dm_choices_init(c, g, algos));
    FILE *f = fopen(path, "rb");
    if (!f) {
        dm_choices_free(c);
        return dm_fail(errno == ENOENT ? DM_ERR_NOT_FOUND : DM_ERR_IO, "cannot open plan '%s': %s%s", path,
                       strerror(errno), errno == ENOENT ? " (make one with 'dmove tune --out FILE')" : "");
    }
    /* memory as the file's size, not the 4 MiB limit (core/file.c) */
    struct stat sb;
    char *text = NULL;
    size_t n = 0;
    int too_large = 0;
    const size_t size = fstat(fileno(f), &sb) == 0 && sb.st_size > 0 ? (size_t)sb.st_size : 0;
    dm_status st = dm_read_stream(f, size, MAX_PLAN_BYTES, &text, &n, &too_large);
    int rerr = st == DM_ERR_IO ? (errno ? errno : EIO) : 0;
    fclose(f); /* read-only */
    if (st == DM_ERR_OOM) st = dm_fail(DM_ERR_OOM, "out of memory");
    else if (rerr) st = dm_fail(DM_ERR_IO, "cannot read plan '%s': %s", path, strerror(rerr));
    else if (too_large) st = bad(path, "larger than 4 MiB");
    cJSON *root = NULL;
    if (st == DM_OK) {
        root = cJSON_ParseWithLength(text, n);
        if (!root) st = bad(path, "not valid JSON (truncated?)");
    }
    if (st == DM_OK) st = parse(path, root, cfg, opt, g, c);
    cJSON_Delete(root);
    free(text);
    if (st != DM_OK) dm_choices_free(c);
    return st;
}
