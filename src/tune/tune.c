/* tune.c: candidates and measurement for `dmove tune`.
 *
 * Variables: the tensors whose memory layout is a choice. Pruning rules, in order:
 *  1. Only activations the plan materializes: tensors inside a fused group have no
 *     layout (per-thread rows and tiles), and the tensors a user reads and writes
 *     (inputs, parameters and their gradients, outputs) keep the API's row-major layout.
 *  2. A layout must run without a copy: every contraction touching the tensor maps to
 *     BLAS calls by strides (dm_gemm_prepare), and every row op touching it finds its
 *     columns contiguous and innermost (row kernels vectorize along them).
 *  3. A layout may not turn a contraction into more BLAS calls than the builder's layout
 *     needs (a loop of smaller GEMMs; these are slower at every size we measured, and
 *     they multiply the tuning time).
 *  4. Layouts with the same strides (they differ only in size-1 letters) count once.
 * Judged with the other tensors in their default layouts; joint combinations that do not
 * map are measured as infeasible (infinite time) and the selection avoids them.
 *
 * Algorithms: each lone contraction runs with BLAS threads inside one call, OpenMP over
 * the batch (batched only), the M or N dimension split between our threads with
 * single-threaded BLAS, or dmove's own kernel that reads the operands in place ("direct",
 * on CPUs with AVX-512 or AVX2; cpu/contract.h). The contractions inside a fused batched group
 * (attention's) run per batch index on the group's threads: their choice is the kernel,
 * BLAS or direct, one for all of them. After the selection, a lone contraction whose
 * partner (dm_plan_partner: the weight gradient beside an input gradient) can run at its
 * turn is timed one-then-the-other against side-by-side on the chosen layouts, and gets
 * the algorithm "concurrent" where that is faster (dm_tuner_pair; pairs whose GEMMs
 * differ by more than 2x in work are not tried). That choice couples two groups, so it
 * is made there and not in the shortest path, whose nodes are single groups. So is the
 * last choice, "direct_rows" (dm_tuner_rows): a lone contraction on the direct kernel
 * that runs the next group, a row group, on each block of its output rows while they
 * are in cache, timed against the two apart on the chosen plan.
 *
 * Measurement: for each group and each combination of its variables' layouts, a layer is
 * built with those layouts (the rest default), its arena filled with random values, and
 * the group timed: warm-up, then repetitions, each after an untimed run of the group
 * before it in the step (run_before: the caches as in the step), median. Results go to an append-only
 * cache file, one line per measurement, keyed by machine, configuration, group and the
 * layout of every operand, so a second run is fast and an interrupted one keeps its work.
 */
#include "tune/tune.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "analysis/device.h"
#include "core/status.h"
#include "core/file.h"
#include "plan/compile.h"
#include "core/sysinfo.h"
#include "cpu/backend.h"
#include "cpu/exec.h"
#include "layer/layer_internal.h"

#define CACHE_HEADER "# dmove tune cache v1: key<TAB>median seconds\n"

static int is_export_root(const dm_tuner *T, int r) {
    for (int k = 0; k < T->enc.n; k++)
        if (dm_tensor_root(&T->g, T->enc.e[k].tensor) == r) return 1;
    return 0;
}

/* Does group op o touch root r (as an operand, through any view)? */
static int op_touches(const dm_graph *g, const dm_op *op, int r) {
    for (int s = 0; s < op->nin; s++)
        if (dm_tensor_root(g, op->in[s]) == r) return 1;
    for (int s = 0; s < op->nout; s++)
        if (dm_tensor_root(g, op->out[s]) == r) return 1;
    return 0;
}

static int64_t calls_of(const dm_graph *g, const dm_op *op, dm_status *st) {
    static float dummy[1];
    dm_gemm gm;
    *st = dm_gemm_prepare(&gm, g, op, dummy, dummy, dummy);
    return *st == DM_OK ? gm.nbatch : 0;
}

/* Rule 2 and 3 for root r in its current layout; default_calls per op (NULL: record). */
static int layout_ok(dm_tuner *T, int r, int64_t *default_calls) {
    const dm_graph *g = &T->g;
    for (int o = 0; o < g->nop; o++) {
        const dm_op *op = &g->op[o];
        if (!op_touches(g, op, r)) continue;
        if (op->kind == DM_OP_CONTRACT) {
            dm_status st;
            int64_t c = calls_of(g, op, &st);
            if (st != DM_OK) return 0;
            if (!default_calls) continue;
            if (default_calls[o] == 0) default_calls[o] = c;
            else if (c > default_calls[o]) return 0;
            continue;
        }
        for (int io = 0; io < 2; io++) {
            int n = io ? op->nout : op->nin;
            for (int s = 0; s < n; s++) {
                int t = io ? op->out[s] : op->in[s];
                if (dm_tensor_root(g, t) != r) continue;
                dm_operand d = {.kind = io ? dm_arg_out(op->kind, s) : dm_arg_in(op->kind, s)};
                if (d.kind == DM_ARG_COLVEC || d.kind == DM_ARG_COLACC || d.kind == DM_ARG_INDEXED ||
                    d.kind == DM_ARG_SCATTER)
                    return 0;
                /* batched groups address their row ops' memory operands the same way */
                if (dm_cpu_row_map(g, op, t, op->cols, &d) != DM_OK) return 0;
            }
        }
    }
    return 1;
}

static int same_strides(const dm_tensor *t, const int64_t *st) {
    for (int d = 0; d < t->ndim; d++)
        if (t->size[d] > 1 && t->stride[d] != st[d]) return 0;
    return 1;
}

/* Every permutation of the letters of root r, by Heap's algorithm; keeps those allowed. */
static dm_status enumerate(dm_tuner *T, int r, dm_tune_var *v, int64_t *default_calls) {
    dm_graph *g = &T->g;
    dm_tensor *t = &g->t[r];
    int n = t->ndim;
    char def[DM_MAX_DIMS + 1], cur[DM_MAX_DIMS + 1];
    dm_tensor_layout(g, r, def);
    v->t = r;
    v->ncand = 1;
    memcpy(v->cand[0], def, sizeof def);
    int64_t seen[DM_TUNE_MAX_CAND][DM_MAX_DIMS];
    memcpy(seen[0], t->stride, sizeof seen[0]);
    memcpy(cur, def, sizeof cur);
    int c[DM_MAX_DIMS] = {0}, i = 1;
    while (i < n && v->ncand < DM_TUNE_MAX_CAND) {
        if (c[i] < i) {
            int j = (i % 2 == 0) ? 0 : c[i];
            char tmp = cur[j];
            cur[j] = cur[i];
            cur[i] = tmp;
            c[i]++;
            i = 1;
            DM_TRY(dm_graph_set_layout(g, r, cur));
            int dup = 0;
            for (int k = 0; k < v->ncand && !dup; k++) dup = same_strides(t, seen[k]);
            if (!dup && layout_ok(T, r, default_calls)) {
                memcpy(v->cand[v->ncand], cur, sizeof cur);
                memcpy(seen[v->ncand], t->stride, sizeof seen[0]);
                v->ncand++;
            }
        } else {
            c[i] = 0;
            i++;
        }
    }
    return dm_graph_set_layout(g, r, def);
}

int dm_tune_comb_index(const dm_tuner *T, const dm_tune_group *G, int64_t comb, int s) {
    for (int q = G->nscope - 1; q > s; q--) comb /= T->vars[G->scope[q]].ncand;
    return (int)(comb % T->vars[G->scope[s]].ncand);
}

const char *dm_tuner_layout(const dm_tuner *T, int v, int c) { return T->vars[v].cand[c]; }

dm_status dm_tuner_new(dm_tuner **out, const dm_layer_config *cfg, const dm_layer_options *opt) {
    *out = NULL;
    DM_TRY(dm_layer_config_check(cfg));
    if (opt->device == DM_DEVICE_CUDA) /* it times groups with the CPU executor, on the CPU's plan */
        return dm_fail(DM_ERR_UNSUPPORTED, "dmove tune measures on the CPU: tune without --device cuda");
    dm_tuner *T = calloc(1, sizeof *T);
    if (!T) return dm_fail(DM_ERR_OOM, "out of memory");
    T->cfg = *cfg;
    T->opt = *opt;
    T->opt.plan = NULL;
    T->threads = opt->threads > 0 ? opt->threads : omp_get_max_threads();
    T->reps = 7;
    T->warmup = 2;
    char cpu[120];
    dm_cpu_model_name(cpu, sizeof cpu, "unknown CPU");
    /* the direct kernel's variant too: times taken with DMOVE_ISA=avx2 on an AVX-512 CPU are
     * not that CPU's */
    snprintf(T->machine, sizeof T->machine, "%s, %d threads, direct kernel %s", cpu, T->threads,
             dm_isa_name(dm_gemm_direct_isa()));
    dm_status s = dm_layer_options_check(opt);
    /* the graph and plan dm_layer_new makes (the CPU's groups) */
    dm_compile_opts co = {.cfg = cfg, .schedule = opt->schedule, .recompute = opt->recompute,
                          .forward_only = opt->forward_only, .no_input_grad = opt->no_input_grad};
    if (s == DM_OK) s = dm_compile(&co, &T->g, &T->enc, &T->plan);
    int64_t *dcalls = calloc((size_t)T->g.nop + 1, sizeof(int64_t));
    T->vars = calloc((size_t)T->g.nt + 1, sizeof(dm_tune_var));
    T->groups = calloc((size_t)T->plan.ngroups + 1, sizeof(dm_tune_group));
    if (s == DM_OK && (!dcalls || !T->vars || !T->groups)) s = dm_fail(DM_ERR_OOM, "out of memory");
    /* default call counts first (rule 3 compares against them) */
    for (int r = 0; s == DM_OK && r < T->g.nt; r++)
        if (T->g.t[r].base < 0) layout_ok(T, r, dcalls);
    for (int r = 0; s == DM_OK && r < T->g.nt; r++) {
        const dm_tensor *t = &T->g.t[r];
        if (t->base >= 0 || t->role != DM_ROLE_ACT || !T->plan.in_memory[r] || t->ndim < 2 ||
            is_export_root(T, r))
            continue;
        dm_tune_var *v = &T->vars[T->nvars];
        s = enumerate(T, r, v, dcalls);
        if (s == DM_OK && v->ncand > 1) T->nvars++;
    }
    free(dcalls);
    for (int gi = 0; s == DM_OK && gi < T->plan.ngroups; gi++) {
        const dm_group *gr = &T->plan.groups[gi];
        dm_tune_group *G = &T->groups[T->ngroups++];
        G->gi = gi;
        G->op = -1;
        G->ncomb = 1;
        for (int v = 0; v < T->nvars; v++) {
            int hit = 0;
            for (int k = 0; k < gr->nops && !hit; k++)
                hit = op_touches(&T->g, &T->g.op[T->plan.order[gr->first + k]], T->vars[v].t);
            if (!hit) continue;
            if (G->nscope >= DM_TUNE_MAX_SCOPE) {
                s = dm_fail(DM_ERR_UNSUPPORTED, "group %d touches more than %d tensors with layout choices",
                            gi, DM_TUNE_MAX_SCOPE);
                break;
            }
            G->scope[G->nscope++] = v;
            G->ncomb *= T->vars[v].ncand;
        }
        const dm_op *first = &T->g.op[T->plan.order[gr->first]];
        G->algo[G->nalgo++] = DM_GEMM_DEFAULT;
        if (gr->nops == 1 && first->kind == DM_OP_CONTRACT && gr->nbatch <= 1) {
            G->op = T->plan.order[gr->first];
            dm_status st;
            int64_t calls = calls_of(&T->g, first, &st);
            /* DEFAULT is what dm_gemm_default_algo makes of it: list the others */
            const dm_gemm_algo dflt = dm_gemm_default_algo(calls),
                               cand[] = {DM_GEMM_BATCH, DM_GEMM_BLAS, DM_GEMM_SPLIT_M, DM_GEMM_SPLIT_N, DM_GEMM_DIRECT};
            for (size_t c = 0; c < sizeof cand / sizeof cand[0]; c++)
                if (cand[c] != dflt && (cand[c] != DM_GEMM_BATCH || calls > 1) &&
                    (cand[c] != DM_GEMM_DIRECT || dm_gemm_direct_available()))
                    G->algo[G->nalgo++] = cand[c];
        } else if (gr->nbatch > 1 && dm_gemm_direct_available()) {
            for (int k = 0; k < gr->nops && !G->kernels; k++)
                G->kernels = T->g.op[T->plan.order[gr->first + k]].kind == DM_OP_CONTRACT;
            /* the kernel of the group's GEMMs: the one DEFAULT is not */
            if (G->kernels)
                G->algo[G->nalgo++] = dm_gemm_default_algo(2) == DM_GEMM_DIRECT ? DM_GEMM_BLAS : DM_GEMM_DIRECT;
        }
        G->secs = malloc(sizeof(double) * (size_t)(G->ncomb * G->nalgo));
        if (!G->secs) {
            s = dm_fail(DM_ERR_OOM, "out of memory");
            break;
        }
        for (int64_t k = 0; k < G->ncomb * G->nalgo; k++) G->secs[k] = NAN;
        G->refined_comb = -1;
        T->ntasks += G->ncomb * G->nalgo;
    }
    if (s != DM_OK) {
        dm_tuner_free(T);
        return s;
    }
    *out = T;
    return DM_OK;
}

void dm_tuner_free(dm_tuner *T) {
    if (!T) return;
    for (int k = 0; k < T->ngroups; k++) free(T->groups[k].secs);
    free(T->groups);
    free(T->vars);
    dm_plan_free(&T->plan);
    dm_graph_free(&T->g);
    free(T);
}

int64_t dm_tuner_tasks(const dm_tuner *T) { return T->ntasks; }

/* ---- the cache ---------------------------------------------------------------------- */

dm_status dm_tune_cache_default_path(char *buf, size_t n) {
    if (!buf) return dm_fail(DM_ERR_INVALID_ARG, "dm_tune_cache_default_path: NULL argument");
    char prof[4096];
    DM_TRY(dm_profile_default_path(prof, sizeof prof));
    char *slash = strrchr(prof, '/');
    if (!slash) return dm_fail(DM_ERR_INTERNAL, "no cache directory");
    *slash = 0;
    if ((size_t)snprintf(buf, n, "%s/tune-cache.tsv", prof) >= n)
        return dm_fail(DM_ERR_INVALID_ARG, "cache path too long");
    return DM_OK;
}

typedef struct {
    char *key;
    double secs;
    int seq; /* line order */
} centry;

typedef struct {
    centry *e;
    int n, cap;
    int64_t skipped; /* damaged lines left out */
    FILE *append;
} cache;

enum { CACHE_MAX_LINES = 1 << 22 }; /* 4 M measurements: far more than any tuning makes */

/* A cache line's time: seconds a group's run took, a normal number in (0, 1 hour], or inf
 * (what the tuner writes for a candidate that cannot run). */
static int cache_value(const char *s, double *v) {
    if (!strcmp(s, "inf")) { /* as the tuner writes it; no "infinity", no overflow */
        *v = INFINITY;
        return 1;
    }
    if (!*s || strspn(s, "0123456789.eE+-") != strlen(s)) return 0; /* no hex, no nan */
    char *end;
    errno = 0;
    *v = strtod(s, &end);
    if (end == s || *end) return 0;
    return !errno && isnormal(*v) && *v > 0 && *v <= 3600.0;
}

static int ckey_cmp(const void *a, const void *b) {
    const centry *x = a, *y = b;
    int r = strcmp(x->key, y->key);
    return r ? r : (x->seq > y->seq) - (x->seq < y->seq);
}

static void cache_free(cache *c) {
    for (int k = 0; k < c->n; k++) free(c->e[k].key);
    free(c->e);
    if (c->append) fclose(c->append);
    memset(c, 0, sizeof *c);
}

static dm_status cache_add(cache *c, const char *key, double secs) {
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 256;
        centry *ne = realloc(c->e, sizeof(centry) * (size_t)nc);
        if (!ne) return dm_fail(DM_ERR_OOM, "out of memory");
        c->e = ne;
        c->cap = nc;
    }
    c->e[c->n].key = strdup(key);
    if (!c->e[c->n].key) return dm_fail(DM_ERR_OOM, "out of memory");
    c->e[c->n].seq = c->n;
    c->e[c->n++].secs = secs;
    return DM_OK;
}

/* Reads every complete, well-formed line (CRLF endings too); a torn last line (an
 * interrupted write), a damaged one or a value that is not a time (nan, inf, negative,
 * denormal, past an hour) is skipped and counted, never trusted; past CACHE_MAX_LINES the
 * rest is left. Later lines win. */
static dm_status cache_load(cache *c, const char *path) {
    if (dm_input_regular(path) != DM_OK) return dm_fail_context(dm_last_status(), "the tune cache: ");
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? DM_OK : dm_fail(DM_ERR_IO, "cannot read the tune cache '%s': %s", path, strerror(errno));
    char line[2048];
    int cont = 0; /* the chunk read continues a line too long for the buffer */
    for (int64_t lines = 0; fgets(line, sizeof line, f); lines++) {
        if (lines >= CACHE_MAX_LINES) {
            c->skipped++;
            break;
        }
        size_t len = strlen(line);
        const int was_cont = cont;
        cont = len > 0 && line[len - 1] != '\n';
        if (was_cont || (line[0] == '#' && !cont)) continue;
        if (len < 3 || cont) {
            c->skipped++;
            continue;
        }
        line[--len] = 0;
        if (len && line[len - 1] == '\r') line[--len] = 0;
        char *tab = strrchr(line, '\t');
        double v;
        if (!tab || tab == line || !cache_value(tab + 1, &v)) {
            c->skipped++;
            continue;
        }
        *tab = 0;
        dm_status s = cache_add(c, line, v);
        if (s != DM_OK) {
            fclose(f);
            return s;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (err) return dm_fail(DM_ERR_IO, "error reading the tune cache '%s'", path);
    /* equal keys stay in file order (seq); lookups take the last */
    if (c->n > 1) qsort(c->e, (size_t)c->n, sizeof(centry), ckey_cmp);
    return DM_OK;
}

static int cache_find(const cache *c, const char *key, double *secs) {
    int lo = 0, hi = c->n - 1, found = -1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, r = strcmp(c->e[mid].key, key);
        if (r == 0) { found = mid; lo = mid + 1; }
        else if (r < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    if (found < 0) return 0;
    *secs = c->e[found].secs;
    return 1;
}

static dm_status cache_open_append(cache *c, const char *path) {
    DM_TRY(dm_make_parent(path));
    struct stat sb;
    const int fresh = stat(path, &sb) != 0;
    if (!fresh && !S_ISREG(sb.st_mode))
        return dm_fail(DM_ERR_IO, "the tune cache '%s' is not a regular file: give a file (--cache PATH) or "
                       "--no-cache", path);
    c->append = fopen(path, "a");
    if (!c->append)
        return dm_fail(DM_ERR_IO, "cannot write the tune cache '%s': %s (use --cache PATH or --no-cache)",
                       path, strerror(errno));
    if (fresh && fputs(CACHE_HEADER, c->append) == EOF)
        return dm_fail(DM_ERR_IO, "cannot write the tune cache '%s'", path);
    return DM_OK;
}

/* One line, flushed and synced: a crash loses at most the measurement in flight. */
static dm_status cache_append(cache *c, const char *key, double secs) {
    if (!c->append) return DM_OK;
    if (fprintf(c->append, "%s\t%.9g\n", key, secs) < 0 || fflush(c->append) != 0 ||
        fsync(fileno(c->append)) != 0)
        return dm_fail(DM_ERR_IO, "cannot append to the tune cache: %s", strerror(errno));
    return DM_OK;
}

/* ---- measurement -------------------------------------------------------------------- */

/* Applies combination comb of group G to T->g (others default); undo with comb 0 of
 * every variable (restore_defaults). */
static dm_status set_comb(dm_tuner *T, const dm_tune_group *G, int64_t comb) {
    for (int s = 0; s < G->nscope; s++) {
        const dm_tune_var *v = &T->vars[G->scope[s]];
        DM_TRY(dm_graph_set_layout(&T->g, v->t, v->cand[dm_tune_comb_index(T, G, comb, s)]));
    }
    return DM_OK;
}

static dm_status restore_defaults(dm_tuner *T) {
    for (int v = 0; v < T->nvars; v++) DM_TRY(dm_graph_set_layout(&T->g, T->vars[v].t, T->vars[v].cand[0]));
    return DM_OK;
}

/* The cache key of group G in T->g's current layouts with algorithm a. */
static void task_key(const dm_tuner *T, const dm_tune_group *G, int a, char *key, size_t n) {
    const dm_graph *g = &T->g;
    const dm_group *gr = &T->plan.groups[G->gi];
    /* "after3": timed after the group before (run_before), with the row groups writing in
     * place (memplan.c), and "default" the rule since lone contractions run the direct
     * kernel by default; keys of times taken alone, before that or under the old rule, by
     * an older dmove, never match */
    size_t len = (size_t)snprintf(key, n, "after3|%s|b%lld j%lld i%lld h%lld u%lld %s%s%s%s %s%s|", T->machine,
                                  (long long)T->cfg.batch, (long long)T->cfg.seq, (long long)T->cfg.hidden,
                                  (long long)T->cfg.heads, (long long)T->cfg.ffn, dm_act_name(T->cfg.act),
                                  T->cfg.norm == DM_NORM_PRE ? " pre" : "", T->cfg.causal ? " causal" : "",
                                  /* the forward attention group keeps its op names with
                                   * recompute, but no longer writes the probabilities */
                                  T->opt.recompute ? " recompute" : "",
                                  T->opt.schedule == DM_SCHED_UNFUSED ? "unfused" : "fused",
                                  T->opt.forward_only ? " fwd" : "");
    for (int k = 0; k < gr->nops && len < n; k++) {
        const dm_op *op = &g->op[T->plan.order[gr->first + k]];
        len += (size_t)snprintf(key + len, n - len, "%s%s", k ? "," : "", op->name);
        for (int io = 0; io < 2 && len < n; io++)
            for (int s = 0; s < (io ? op->nout : op->nin) && len < n; s++) {
                int t = io ? op->out[s] : op->in[s], r = dm_tensor_root(g, t);
                char lay[DM_MAX_DIMS + 1];
                dm_tensor_layout(g, r, lay);
                len += (size_t)snprintf(key + len, n - len, " %s:%s", g->t[r].name, lay);
            }
    }
    if (len < n) snprintf(key + len, n - len, "|%s", dm_gemm_algo_name((dm_gemm_algo)G->algo[a]));
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Algorithm a of G on its executor group eg (a lone contraction's, or the kernel of
 * every contraction in a batched group). */
static dm_status apply_algo(const dm_tuner *T, const dm_tune_group *G, dm_exgroup *eg, int a) {
    if (G->op >= 0) return dm_gemm_set_algo(&eg->gemm, (dm_gemm_algo)G->algo[a], T->threads);
    for (int k = 0; G->kernels && k < eg->nops; k++)
        if (eg->ops[k].op->kind == DM_OP_CONTRACT)
            DM_TRY(dm_gemm_set_algo(&eg->ops[k].gemm, (dm_gemm_algo)G->algo[a], T->threads));
    return DM_OK;
}

/* The CPU executor of a layer the tuner made (on the CPU: its options' device). */
static dm_cpu_exec *cpu_ex(const dm_layer *L) { return dm_cpu_backend_exec(L->bk, L->st); }

/* The group before gi in the step, untimed, before each timed run of gi: gi then finds
 * the caches nearer to how it does in a step (the data the step just touched, not only
 * its own operands from the run before, which a group timed over and over finds there).
 * On BERT-base, plans tuned so ran 1.015x and 1.033x the default as whole steps where
 * plans tuned on groups timed alone ran 0.977x and 0.998x (pairs of runs on this 2-core
 * VM); the sums over groups still overstate the whole step (by 4-19% on 2026-11-24). */
static dm_status run_before(const dm_cpu_exec *ex, int gi) {
    if (gi < 1 || ex->groups[gi - 1].unusable) return DM_OK;
    return dm_cpu_exec_group(ex, gi - 1, 1, 0);
}

/* Median seconds of group gi of L, run after the group before it (run_before). */
static dm_status time_group(dm_tuner *T, dm_layer *L, int gi, double *out) {
    double t[64];
    if (T->reps < 1 || T->reps > 64) /* dm_tuning_new takes 1 .. 63 */
        return dm_fail(DM_ERR_INVALID_ARG, "timing a group: %d repetitions (1 to 64)", T->reps);
    const int reps = T->reps;
    for (int w = 0; w < T->warmup; w++) DM_TRY(dm_cpu_exec_group(cpu_ex(L), gi, 1, 0));
    for (int r = 0; r < reps; r++) {
        DM_TRY(run_before(cpu_ex(L), gi));
        double t0 = omp_get_wtime();
        DM_TRY(dm_cpu_exec_group(cpu_ex(L), gi, 1, 0));
        t[r] = omp_get_wtime() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    *out = t[reps / 2];
    return DM_OK;
}

/* 1 if an operand before operand s of op k of group gr has root r (filled already). */
static int root_seen_before(const dm_graph *g, const dm_plan *plan, const dm_group *gr, int k,
                            int s, int r) {
    for (int k2 = 0; k2 <= k; k2++) {
        const dm_op *op = &g->op[plan->order[gr->first + k2]];
        int ns = k2 < k ? op->nin + op->nout : s;
        for (int s2 = 0; s2 < ns; s2++)
            if (dm_tensor_root(g, s2 < op->nin ? op->in[s2] : op->out[s2 - op->nin]) == r) return 1;
    }
    return 0;
}

/* Random values in [-1, 1] in every tensor group gi touches (the kernels' speed does not
 * depend on the values, but NaNs and denormals would). Only those: the rest of a large
 * arena is never touched, so it costs neither filling nor page faults. */
static void fill_group(dm_layer *L, int gi) {
    const dm_graph *g = &L->g;
    const dm_group *gr = &L->plan.groups[gi];
    uint32_t x = 2463534242u;
    for (int k = 0; k < gr->nops; k++) {
        const dm_op *op = &g->op[L->plan.order[gr->first + k]];
        for (int s = 0; s < op->nin + op->nout; s++) {
            int r = dm_tensor_root(g, s < op->nin ? op->in[s] : op->out[s - op->nin]);
            if (L->plan.offset[r] < 0 || root_seen_before(g, &L->plan, gr, k, s, r)) continue;
            float *p = (float *)dm_layer_root_addr(L, r);
            for (int64_t i = 0; i < g->t[r].numel; i++) {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                p[i] = (float)((double)x / 2147483648.0 - 1.0);
            }
        }
    }
}

/* A layer with group G's tensors in layout combination comb (the others as built), its
 * tensors filled; ch is scratch (initialised). */
static dm_status layer_for(dm_tuner *T, const dm_tune_group *G, int64_t comb, dm_choices *ch, dm_layer **L) {
    for (int v = 0; v < T->nvars; v++) ch->layout[T->vars[v].t][0] = 0;
    for (int q = 0; q < G->nscope; q++) {
        const dm_tune_var *v = &T->vars[G->scope[q]];
        memcpy(ch->layout[v->t], v->cand[dm_tune_comb_index(T, G, comb, q)], DM_MAX_DIMS + 1);
    }
    DM_TRY(dm_layer_new_with(L, &T->cfg, &T->opt, ch, 1));
    fill_group(*L, G->gi);
    return DM_OK;
}

/* Medians of two candidates timed in alternation, run by run (reps runs each, at most
 * DM_TUNE_MAX_RETIMED): run(arg, q) runs candidate q once, after before(arg, q), untimed.
 * Candidate 0 goes first in even rounds, 1 in odd ones, so a change of the machine's
 * speed during the timing hits both. */
static dm_status time_alternating(int reps, dm_status (*before)(void *arg, int q), dm_status (*run)(void *arg, int q),
                                  void *arg, double med[2]) {
    double t[2][DM_TUNE_MAX_RETIMED];
    if (reps > DM_TUNE_MAX_RETIMED) reps = DM_TUNE_MAX_RETIMED;
    if (reps < 1) reps = 1;
    for (int r = 0; r < reps; r++)
        for (int q0 = 0; q0 < 2; q0++) {
            const int q = r % 2 ? 1 - q0 : q0;
            DM_TRY(before(arg, q));
            double t0 = omp_get_wtime();
            DM_TRY(run(arg, q));
            t[q][r] = omp_get_wtime() - t0;
        }
    for (int q = 0; q < 2; q++) {
        qsort(t[q], (size_t)reps, sizeof(double), cmp_double);
        med[q] = t[q][reps / 2];
    }
    return DM_OK;
}

typedef struct {
    dm_layer *L[2];
    int gi;
} refine_run;

static dm_status run_refine(void *arg, int q) {
    const refine_run *a = arg;
    return dm_cpu_exec_group(cpu_ex(a->L[q]), a->gi, 1, 0);
}

static dm_status before_refine(void *arg, int q) {
    const refine_run *a = arg;
    return run_before(cpu_ex(a->L[q]), a->gi);
}

dm_status dm_tuner_refine(dm_tuner *T, const char *cache_path, int *nrefined) {
    dm_choices ch;
    cache kc = {0};
    char *key = malloc(4096);
    if (!key) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status s = cache_path ? cache_open_append(&kc, cache_path) : DM_OK;
    if (s != DM_OK || (s = dm_choices_init(&ch, &T->g, &dm_cpu_gemm_algos)) != DM_OK) {
        cache_free(&kc);
        free(key);
        return s;
    }
    int n = 0;
    for (int k = 0; s == DM_OK && k < T->ngroups; k++) {
        dm_tune_group *G = &T->groups[k];
        const int64_t c[2] = {0, G->chosen_comb};
        const int a[2] = {0, G->chosen_algo};
        double *dst[2] = {&G->secs[0], &G->secs[G->chosen_comb * G->nalgo + G->chosen_algo]};
        if ((c[1] == 0 && a[1] == 0) || !isfinite(*dst[0]) || !isfinite(*dst[1])) continue;
        if (G->refined_comb == c[1] && G->refined_algo == a[1]) continue;
        G->refined_comb = c[1];
        G->refined_algo = a[1];
        refine_run rr = {.L = {NULL, NULL}, .gi = G->gi};
        for (int q = 0; q < 2 && s == DM_OK; q++) {
            s = layer_for(T, G, c[q], &ch, &rr.L[q]);
            if (s == DM_OK) s = apply_algo(T, G, &cpu_ex(rr.L[q])->groups[G->gi], a[q]);
            for (int w = 0; w < T->warmup && s == DM_OK; w++) s = dm_cpu_exec_group(cpu_ex(rr.L[q]), G->gi, 1, 0);
        }
        double med[2]; /* default, chosen */
        if (s == DM_OK) s = time_alternating(T->reps, before_refine, run_refine, &rr, med);
        dm_layer_free(rr.L[0]);
        dm_layer_free(rr.L[1]);
        if (s != DM_OK) break;
        /* the new times replace the old in the cache too (lookups take a key's last line) */
        for (int q = 0; q < 2 && s == DM_OK; q++) {
            *dst[q] = med[q];
            s = set_comb(T, G, c[q]);
            if (s == DM_OK) {
                task_key(T, G, a[q], key, 4096);
                s = cache_append(&kc, key, *dst[q]);
            }
            dm_status r = restore_defaults(T);
            if (s == DM_OK) s = r;
        }
        n += s == DM_OK;
    }
    dm_choices_free(&ch);
    cache_free(&kc);
    free(key);
    if (nrefined) *nrefined = n;
    return s;
}

/* The time the tuned sum holds for plan group gi (its chosen configuration's), or -1. */
static double chosen_secs(const dm_tuner *T, int gi) {
    for (int k = 0; k < T->ngroups; k++) {
        const dm_tune_group *G = &T->groups[k];
        if (G->gi != gi || G->chosen_comb < 0) continue;
        const double t = G->secs[G->chosen_comb * G->nalgo + G->chosen_algo];
        return isfinite(t) && t > 0 ? t : -1;
    }
    return -1;
}

/* A pair timed apart (seq_s) and together (pair_s): kept where together is faster, and
 * then the tuned sum drops by the same fraction of what it holds for the two groups (their
 * times in the sum may come from the cache, taken under other conditions than these fresh
 * ones: a difference of fresh times could exceed them). Test hook: the environment
 * variable `hook` (DMOVE_TEST_PAIRS, DMOVE_TEST_ROWS) set to "keep" keeps it whatever the
 * times. */
static int keep_timed(dm_tuner *T, dm_tune_pair *p, const char *hook) {
    const char *h = getenv(hook);
    p->kept = (h && !strcmp(h, "keep")) || p->pair_s < p->seq_s;
    const double a = chosen_secs(T, p->g1), b = chosen_secs(T, p->g2);
    if (p->kept && p->pair_s < p->seq_s && p->seq_s > 0 && a > 0 && b > 0)
        T->tuned_s -= (a + b) * (p->seq_s - p->pair_s) / p->seq_s;
    return p->kept;
}

typedef struct {
    const dm_cpu_exec *ex;
    int g1, g2;
} pair_run;

/* g1 then g2 (q = 0) or both at once (q = 1), once. */
static dm_status run_pair(void *arg, int q) {
    const pair_run *p = arg;
    const dm_gemm *a = &p->ex->groups[p->g1].gemm, *b = &p->ex->groups[p->g2].gemm;
    if (q) return dm_gemm_run_pair(a, b, p->ex->nthreads);
    DM_TRY(dm_gemm_run(a));
    return dm_gemm_run(b);
}

static dm_status before_pair(void *arg, int q) {
    const pair_run *p = arg;
    return run_before(p->ex, p->g1);
}

dm_status dm_tuner_pair(dm_tuner *T, dm_choices *ch, dm_tune_pair *pairs, int max, int *npairs) {
    if (npairs) *npairs = 0;
    if (!T || !ch) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuner_pair: NULL argument");
    if (T->threads < 2) return DM_OK;
    dm_layer *L = NULL;
    DM_TRY(dm_layer_new_with(&L, &T->cfg, &T->opt, ch, 1));
    const dm_plan *plan = &L->plan;
    uint8_t *claimed = calloc((size_t)plan->ngroups + 1, 1);
    dm_status s = claimed ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory");
    int n = 0;
    for (int g1 = 0; s == DM_OK && g1 < plan->ngroups; g1++) {
        int g2 = dm_plan_partner(plan, g1, claimed);
        if (g2 < 0) continue;
        const dm_exgroup *e1 = &cpu_ex(L)->groups[g1], *e2 = &cpu_ex(L)->groups[g2];
        if (!e1->contract || !e2->contract || e1->unusable || e2->unusable) continue;
        /* on half the threads each, the pair lasts as long as its larger GEMM: one more
         * than twice the other's work leaves half the machine idle most of the time */
        double w1 = (double)e1->gemm.m * e1->gemm.n * e1->gemm.k * (double)e1->gemm.nbatch,
               w2 = (double)e2->gemm.m * e2->gemm.n * e2->gemm.k * (double)e2->gemm.nbatch;
        if (w1 > 2 * w2 || w2 > 2 * w1) continue;
        /* the first keeps its chosen kernel ("concurrent_direct" after "direct"); the
         * partner keeps its own algorithm, whose kernel runs its share */
        const dm_gemm_algo side = dm_gemm_algo_direct(e1->gemm.algo) ? DM_GEMM_CONCURRENT_DIRECT : DM_GEMM_CONCURRENT;
        fill_group(L, g1);
        fill_group(L, g2);
        pair_run pr = {.ex = cpu_ex(L), .g1 = g1, .g2 = g2};
        for (int w = 0; w < T->warmup && s == DM_OK; w++)
            for (int q = 0; q < 2 && s == DM_OK; q++) s = run_pair(&pr, q);
        double med[2]; /* one then the other, both at once */
        if (s == DM_OK) s = time_alternating(T->reps, before_pair, run_pair, &pr, med);
        if (s != DM_OK) break;
        dm_tune_pair p = {.g1 = g1, .g2 = g2, .seq_s = med[0], .pair_s = med[1]};
        if (keep_timed(T, &p, "DMOVE_TEST_PAIRS")) {
            claimed[g1] = claimed[g2] = 1;
            ch->algo[plan->order[plan->groups[g1].first]] = (uint8_t)side;
        }
        if (pairs && n < max) pairs[n] = p;
        n++;
    }
    free(claimed);
    dm_layer_free(L);
    ch->tuned_ms = T->tuned_s * 1e3;
    if (npairs) *npairs = n;
    return s;
}

typedef struct {
    const dm_cpu_exec *apart, *fused;
    int g;
} rows_run;

/* The contraction then its row group (q = 0), or the two as one, in its epilogue (q = 1). */
static dm_status run_rows(void *arg, int q) {
    const rows_run *r = arg;
    if (q) return dm_cpu_exec_group(r->fused, r->g, 1, 0);
    DM_TRY(dm_cpu_exec_group(r->apart, r->g, 1, 0));
    return dm_cpu_exec_group(r->apart, r->g + 1, 1, 0);
}

static dm_status before_rows(void *arg, int q) {
    const rows_run *r = arg;
    return run_before(q ? r->fused : r->apart, r->g);
}

dm_status dm_tuner_rows(dm_tuner *T, dm_choices *ch, dm_tune_pair *res, int max, int *nres) {
    if (nres) *nres = 0;
    if (!T || !ch) return dm_fail(DM_ERR_INVALID_ARG, "dm_tuner_rows: NULL argument");
    if (!dm_gemm_direct_available()) return DM_OK;
    dm_layer *L = NULL;
    DM_TRY(dm_layer_new_with(&L, &T->cfg, &T->opt, ch, 1));
    const dm_plan *plan = &L->plan;
    dm_status s = DM_OK;
    int n = 0;
    for (int g = 0; s == DM_OK && g + 1 < plan->ngroups; g++) {
        const dm_exgroup *e = &cpu_ex(L)->groups[g];
        if (!e->contract || e->unusable || e->partner >= 0 || e->beside >= 0 || cpu_ex(L)->groups[g + 1].unusable)
            continue;
        const int op = plan->order[plan->groups[g].first];
        const uint8_t was = ch->algo[op];
        ch->algo[op] = DM_GEMM_DIRECT_ROWS;
        dm_layer *F = NULL;
        s = dm_layer_new_with(&F, &T->cfg, &T->opt, ch, 1); /* lenient: not fusable = unusable */
        ch->algo[op] = was;
        if (s != DM_OK) break;
        if (cpu_ex(F)->groups[g].rows_next != g + 1) {
            dm_layer_free(F);
            dm_clear_error();
            continue;
        }
        fill_group(L, g);
        fill_group(L, g + 1);
        fill_group(F, g);
        fill_group(F, g + 1);
        rows_run rr = {.apart = cpu_ex(L), .fused = cpu_ex(F), .g = g};
        for (int w = 0; w < T->warmup && s == DM_OK; w++)
            for (int q = 0; q < 2 && s == DM_OK; q++) s = run_rows(&rr, q);
        double med[2]; /* apart, in the epilogue */
        if (s == DM_OK) s = time_alternating(T->reps, before_rows, run_rows, &rr, med);
        dm_layer_free(F);
        if (s != DM_OK) break;
        dm_tune_pair p = {.g1 = g, .g2 = g + 1, .seq_s = med[0], .pair_s = med[1]};
        if (keep_timed(T, &p, "DMOVE_TEST_ROWS")) ch->algo[op] = DM_GEMM_DIRECT_ROWS;
        if (res && n < max) res[n] = p;
        n++;
    }
    dm_layer_free(L);
    ch->tuned_ms = T->tuned_s * 1e3;
    if (nres) *nres = n;
    return s;
}

dm_status dm_tuner_measure(dm_tuner *T, const char *cache_path,
                           void (*progress)(int64_t, int64_t, int64_t, double, void *), void *arg) {
    cache c = {0};
    dm_status s = DM_OK;
    if (cache_path) {
        s = cache_load(&c, cache_path);
        if (s == DM_OK) s = cache_open_append(&c, cache_path);
        T->cache_skipped = c.skipped;
    }
    char *key = malloc(4096);
    dm_choices ch;
    int have_ch = 0;
    if (s == DM_OK && !key) s = dm_fail(DM_ERR_OOM, "out of memory");
    if (s == DM_OK) {
        s = dm_choices_init(&ch, &T->g, &dm_cpu_gemm_algos);
        have_ch = s == DM_OK;
    }
    double t0 = omp_get_wtime();
    T->ndone = T->nfrom_cache = 0;
    /* pass 1: what the cache already knows */
    for (int k = 0; s == DM_OK && k < T->ngroups; k++) {
        dm_tune_group *G = &T->groups[k];
        G->cached = 0;
        for (int64_t comb = 0; s == DM_OK && comb < G->ncomb; comb++) {
            s = set_comb(T, G, comb);
            for (int a = 0; s == DM_OK && a < G->nalgo; a++) {
                task_key(T, G, a, key, 4096);
                if (cache_find(&c, key, &G->secs[comb * G->nalgo + a])) {
                    G->cached++;
                    T->nfrom_cache++;
                    T->ndone++;
                }
            }
            if (s == DM_OK) s = restore_defaults(T);
        }
    }
    if (s == DM_OK && progress) progress(T->ndone, T->ntasks, T->nfrom_cache, omp_get_wtime() - t0, arg);
    /* pass 2: measure the rest, one layer per (group, combination) */
    for (int k = 0; s == DM_OK && k < T->ngroups; k++) {
        dm_tune_group *G = &T->groups[k];
        for (int64_t comb = 0; s == DM_OK && comb < G->ncomb; comb++) {
            int missing = 0;
            for (int a = 0; a < G->nalgo; a++) missing += isnan(G->secs[comb * G->nalgo + a]);
            if (!missing) continue;
            dm_layer *L = NULL;
            s = layer_for(T, G, comb, &ch, &L);
            if (s != DM_OK) break;
            s = set_comb(T, G, comb);
            dm_exgroup *eg = &cpu_ex(L)->groups[G->gi];
            for (int a = 0; s == DM_OK && a < G->nalgo; a++) {
                double *dst = &G->secs[comb * G->nalgo + a];
                if (!isnan(*dst)) continue;
                if (eg->unusable) *dst = INFINITY;
                else {
                    s = apply_algo(T, G, eg, a);
                    if (s == DM_OK) s = time_group(T, L, G->gi, dst);
                }
                if (s == DM_OK) {
                    task_key(T, G, a, key, 4096);
                    s = cache_append(&c, key, *dst);
                }
                T->ndone++;
                if (s == DM_OK && progress) progress(T->ndone, T->ntasks, T->nfrom_cache, omp_get_wtime() - t0, arg);
            }
            dm_layer_free(L);
            dm_status r = restore_defaults(T);
            if (s == DM_OK) s = r;
        }
    }
    if (have_ch) dm_choices_free(&ch);
    free(key);
    cache_free(&c);
    return s;
}
