/* bench_lengths.c: `dmove bench --lengths SPEC`: the layer's step on batches whose
 * sequences have lengths drawn from a distribution, padded (attention_mask) against
 * unpadded (dm_layer_options.unpad: the real tokens alone). Each repetition draws one
 * batch of lengths and times both layers on it, interleaved, so their ratio is taken on
 * the same batches and machine state. The distribution: "uniform:LO-HI" (whole numbers,
 * each equally likely), or a file of lengths (whitespace-separated whole numbers, one per
 * sequence of a real corpus; '#' starts a comment) drawn from uniformly; lengths above
 * the layer's j are cut to j, as a tokenizer's truncation does. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "bench.h"
#include "cli_common.h"

static const char *const CMD = "bench";

typedef struct {
    int64_t lo, hi;  /* uniform:LO-HI */
    int64_t *v, n;   /* a file's lengths */
    int64_t cut;     /* of them, how many were above j */
} lengths_dist;

/* One whole number of at least 1 at *p (then past it), ended by white space, the string's
 * end or `term`; or -1 (not one) / -2 (too large). */
static long long read_length(char **p, char term) {
    char *end;
    errno = 0;
    const long long x = strtoll(*p, &end, 10);
    if (end == *p || (*end && !isspace((unsigned char)*end) && *end != term)) return -1;
    if (errno == ERANGE) return -2;
    *p = end;
    return x >= 1 ? x : -1;
}

/* Reads a lengths file (lines of any length); an error names the line. 0 or -1 (said; d
 * then holds nothing). */
static int read_lengths_file(const char *path, int64_t J, lengths_dist *d) {
    FILE *f = fopen(path, "r");
    if (!f) {
        cli_error(CMD, "--lengths: cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t linecap = 0;
    int64_t cap = 0, lineno = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &linecap, f) >= 0) {
        lineno++;
        char *h = strchr(line, '#');
        if (h) *h = 0;
        for (char *p = line; rc == 0;) {
            while (isspace((unsigned char)*p)) p++;
            if (!*p) break;
            char *at = p;
            const long long x = read_length(&p, 0);
            const int wlen = (int)strcspn(at, " \t\r\n\v\f");
            int text = wlen <= 40;
            for (int c = 0; c < wlen && text; c++) text = isprint((unsigned char)at[c]) != 0;
            if (x < 0 && !text) {
                cli_error(CMD, "--lengths: %s line %" PRId64 ": no length there (a whole number of tokens, at least "
                          "1; is this a text file?)", path, lineno);
                rc = -1;
                break;
            }
            if (x < 0) {
                cli_error(CMD, "--lengths: %s line %" PRId64 ": '%.*s' is no length (a whole number of tokens, "
                          "at least 1%s)", path, lineno, wlen, at, x == -2 ? ", within 64 bits" : "");
                rc = -1;
                break;
            }
            if (d->n == cap) {
                int64_t *nv = realloc(d->v, sizeof(int64_t) * (size_t)(cap ? 2 * cap : 1024));
                if (!nv) {
                    cli_error(CMD, "out of memory reading %s", path);
                    rc = -1;
                    break;
                }
                d->v = nv;
                cap = cap ? 2 * cap : 1024;
            }
            d->cut += x > J;
            d->v[d->n++] = x > J ? J : (int64_t)x;
        }
    }
    if (rc == 0 && ferror(f)) {
        cli_error(CMD, "--lengths: reading %s failed: %s", path, strerror(errno));
        rc = -1;
    }
    free(line);
    fclose(f);
    if (rc == 0 && d->n == 0) {
        cli_error(CMD, "--lengths: %s holds no lengths", path);
        rc = -1;
    }
    if (rc) {
        free(d->v);
        memset(d, 0, sizeof *d);
    }
    return rc;
}

/* 0, -1 (a file's error) or -2 (a usage error), said. */
static int parse_dist(const char *spec, int64_t J, lengths_dist *d) {
    memset(d, 0, sizeof *d);
    if (!strncmp(spec, "uniform:", 8)) {
        char *p = (char *)spec + 8;
        const long long lo = read_length(&p, '-'), hi = lo > 0 && *p == '-' ? (p++, read_length(&p, 0)) : -1;
        if (lo < 0 || hi < lo || hi > J || *p) {
            cli_usage_error(CMD, "--lengths %s: give uniform:LO-HI with 1 <= LO <= HI <= --seq (%" PRId64 ")", spec, J);
            return -2;
        }
        d->lo = lo;
        d->hi = hi;
        return 0;
    }
    return read_lengths_file(spec, J, d);
}

static int64_t draw(const lengths_dist *d, cli_rng *r) {
    if (d->v) return d->v[cli_rng_u64(r) % (uint64_t)d->n];
    return d->lo + (int64_t)(cli_rng_u64(r) % (uint64_t)(d->hi - d->lo + 1));
}

typedef struct {
    dm_layer *L;
    float *x, *mask, *len, *dy; /* mask: padded; len: unpadded */
    double *ms;
} side;

static int side_new(const cli_config *c, const dm_layer_options *lo, int unpad, int reps, side *s) {
    dm_layer_options o = *lo;
    o.unpad = unpad;
    memset(s, 0, sizeof *s);
    int nd;
    int64_t sh[4];
    if (dm_layer_new(&s->L, &c->cfg, &o) != DM_OK || dm_layer_init_params(s->L, c->cfg.seed) != DM_OK ||
        dm_layer_tensor(s->L, "hidden_states", &s->x, &nd, sh) != DM_OK ||
        dm_layer_tensor(s->L, "grad_output", &s->dy, &nd, sh) != DM_OK ||
        dm_layer_tensor(s->L, unpad ? "seq_lengths" : "attention_mask", unpad ? &s->len : &s->mask, &nd, sh) !=
            DM_OK) {
        cli_error(CMD, "%s layer: %s", unpad ? "unpadded" : "padded", dm_last_error());
        return -1;
    }
    if (!(s->ms = calloc((size_t)reps, sizeof(double)))) {
        cli_error(CMD, "out of memory");
        return -1;
    }
    return 0;
}

/* One batch of lengths into both layers' inputs (random values on the real tokens, the
 * padded one's mask and zero output gradient on the padding); returns the real tokens. */
static int64_t fill_batch(const dm_layer_config *cfg, const int64_t *len, side *pad, side *unp, cli_rng *r) {
    const int64_t B = cfg->batch, J = cfg->seq, I = cfg->hidden;
    int64_t t = 0;
    for (int64_t s = 0; s < B; s++) {
        unp->len[s] = (float)len[s];
        for (int64_t j = 0; j < J; j++) {
            const int real = j < len[s];
            pad->mask[s * J + j] = (float)real;
            for (int64_t c = 0; c < I; c++) {
                const int64_t e = (s * J + j) * I + c;
                pad->x[e] = (float)cli_rng_normal(r);
                pad->dy[e] = real ? 1e-3f * (float)cli_rng_normal(r) : 0.0f;
                if (real) {
                    unp->x[t * I + c] = pad->x[e];
                    unp->dy[t * I + c] = pad->dy[e];
                }
            }
            t += real;
        }
    }
    return t;
}

static int timed_step(side *s, int r) {
    if (dm_layer_to_device(s->L) != DM_OK) { /* the batch's inputs (a GPU's copy) */
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    double t0 = cli_now();
    if (dm_layer_forward(s->L) != DM_OK || dm_layer_backward(s->L) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    if (r >= 0) s->ms[r] = 1e3 * (cli_now() - t0);
    return 0;
}

/* The unpadded layer's attention alone (its ATTN and ATTN_BWD groups), profiled over
 * `steps` more steps on the last batch (lengths len): milliseconds a pass, and the flop of
 * its real tokens (4 H P sum L^2 forward, 8 backward: the GEMMs; causal counted as dense). */
typedef struct {
    double ms[2], flop[2];
    int found, flash, padded_flash; /* padded_flash: the padded layer's attention as one op on them */
    char why[200]; /* the CUDA backend's flash_unavailable note, or "" */
} attn_time;

static int attn_profile(const dm_layer_config *cfg, side *u, const int64_t *len, int steps, attn_time *at) {
    memset(at, 0, sizeof *at);
    double sq = 0;
    for (int64_t s = 0; s < cfg->batch; s++) sq += (double)len[s] * (double)len[s];
    at->flop[0] = 4.0 * (double)cfg->hidden * sq, at->flop[1] = 8.0 * (double)cfg->hidden * sq;
    at->flash = (int)dm_layer_note_value(u->L, "attention_flash", 0);
    snprintf(at->why, sizeof at->why, "%s", dm_layer_note_text(u->L, "flash_unavailable"));
    dm_layer_profile(u->L, 1);
    dm_layer_profile_reset(u->L);
    for (int r = 0; r < steps; r++)
        if (timed_step(u, -1)) return -1;
    for (int gi = 0; gi < dm_layer_num_groups(u->L); gi++) {
        dm_layer_group x;
        if (dm_layer_group_info(u->L, gi, &x) != DM_OK) continue;
        const char *dot = strrchr(x.ops, '.'), *name = dot ? dot + 1 : x.ops;
        const int k = !strcmp(name, "attn") ? 0 : !strcmp(name, "attn_bwd") ? 1 : -1;
        if (x.nops != 1 || k < 0) continue;
        at->ms[k] += 1e3 * x.seconds / steps;
        at->found |= 1 << k;
    }
    dm_layer_profile(u->L, 0);
    return 0;
}

static int report(const cli_config *c, const dm_layer_options *lo, const char *spec, const lengths_dist *d,
                  double fill, double pad_ms, double unp_ms, const attn_time *at, int warmup, int reps, int json) {
    const dm_layer_config *cfg = &c->cfg;
    const double tokens = fill * (double)(cfg->batch * cfg->seq);
    char where[160];
    cli_device_where(where, sizeof where, lo->device, lo->dtype, cli_threads(c->threads));
    if (at->why[0])
        fprintf(stderr, "dmove bench: note: the unpadded attention runs without the flash kernels (cuBLAS over "
                "padded copies): %s\n", at->why);
    if (!json) {
        printf("dmove %s bench --lengths %s: b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
               ", dropout %g, %s; medians of %d batches after %d warm-up\n",
               DMOVE_VERSION, spec, cfg->batch, cfg->seq, cfg->hidden, cfg->heads, cfg->ffn, cfg->dropout, where, reps,
               warmup);
        if (d->cut)
            printf("(%" PRId64 " of the file's %" PRId64 " lengths were above j and cut to %" PRId64 ")\n", d->cut, d->n,
                   cfg->seq);
        printf("\nfill (real tokens / b x j): %.3f, %.0f tokens a batch on average\n\n", fill, tokens);
        printf("%-10s %10s %14s\n", "layer", "step ms", "real tokens/s");
        printf("%-10s %10.2f %14.0f\n", "padded", pad_ms, tokens / (pad_ms * 1e-3));
        printf("%-10s %10.2f %14.0f\n", "unpadded", unp_ms, tokens / (unp_ms * 1e-3));
        printf("\nunpadded speedup (padded step / unpadded step): %.3f\n", pad_ms / unp_ms);
        for (int k = 0; k < 2; k++)
            if (at->found >> k & 1)
                printf("unpadded attention %s: %.3f ms, %.2f TFLOP/s of the real tokens (last batch, %s)\n",
                       k ? "backward" : "forward", at->ms[k], at->flop[k] / (at->ms[k] * 1e-3) / 1e12,
                       at->flash                          ? "flash kernels"
                       : lo->device == DM_DEVICE_CUDA ? "cuBLAS over padded copies"
                                                      : "the CPU's kernel");
        if (lo->device == DM_DEVICE_CUDA)
            printf("padded attention: %s\n", at->padded_flash ? "one op on the flash kernels, its mask inside"
                                                               : "its ops (scores, mask, softmax, dropout, context)");
        return fflush(stdout) ? (cli_error(CMD, "cannot write the report to stdout"), -1) : 0;
    }
    cJSON *root = cJSON_CreateObject(), *conf = NULL;
    int ok = root && (conf = cJSON_AddObjectToObject(root, "config")) != NULL &&
             bench_jnum(conf, "batch", (double)cfg->batch) && bench_jnum(conf, "seq", (double)cfg->seq) &&
             bench_jnum(conf, "hidden", (double)cfg->hidden) && bench_jnum(conf, "heads", (double)cfg->heads) &&
             bench_jnum(conf, "ffn", (double)cfg->ffn) && bench_jnum(conf, "dropout", cfg->dropout) &&
             bench_jnum(conf, "threads", cli_threads(c->threads)) && bench_jnum(conf, "warmup", warmup) &&
             cJSON_AddStringToObject(conf, "device", dm_device_kind_name(lo->device)) &&
             cJSON_AddStringToObject(conf, "dtype", dm_dtype_name(lo->dtype)) &&
             bench_jnum(conf, "reps", reps) && cJSON_AddStringToObject(conf, "lengths", spec) &&
             bench_jnum(root, "fill", fill) && bench_jnum(root, "padded_step_ms", pad_ms) &&
             bench_jnum(root, "unpadded_step_ms", unp_ms) && bench_jnum(root, "unpadded_speedup", pad_ms / unp_ms) &&
             (!(at->found & 1) || bench_jnum(root, "attention_forward_ms", at->ms[0])) &&
             (!(at->found & 2) || bench_jnum(root, "attention_backward_ms", at->ms[1])) &&
             bench_jnum(root, "attention_forward_flop", at->flop[0]) &&
             bench_jnum(root, "attention_backward_flop", at->flop[1]) &&
             bench_jnum(root, "attention_flash_groups", at->flash) &&
             bench_jnum(root, "padded_attention_flash_groups", at->padded_flash) &&
             cJSON_AddStringToObject(root, "flash_unavailable", at->why) &&
             cJSON_AddStringToObject(root, "dmove_version", DMOVE_VERSION);
    /* where and when, as the other bench reports record them */
    char cpu[256], date[32];
    const char *isa;
    dm_cpu_model_name(cpu, sizeof cpu, "unknown");
    dm_cpu_kernel_isa(&isa, NULL, NULL);
    time_t now = time(NULL);
    struct tm tmv;
    if (now == (time_t)-1 || !gmtime_r(&now, &tmv) || !strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &tmv))
        snprintf(date, sizeof date, "unknown");
    cJSON *mach = NULL;
    ok = ok && (mach = cJSON_AddObjectToObject(root, "machine")) != NULL && cJSON_AddStringToObject(mach, "cpu", cpu) &&
         cJSON_AddStringToObject(mach, "cpu_kernel_isa", isa) && cJSON_AddStringToObject(root, "date", date) &&
         bench_jnum(root, "real_tokens_per_batch", fill * (double)(cfg->batch * cfg->seq));
    return bench_json_emit(root, ok);
}

int bench_lengths_run(const cli_config *c, const char *spec, const dm_layer_options *lo, int warmup, int reps,
                      int json) {
    const dm_layer_config *cfg = &c->cfg;
    lengths_dist d;
    const int bad = parse_dist(spec, cfg->seq, &d);
    if (bad) return bad == -2 ? CLI_USAGE : CLI_FAIL;
    side pad, unp;
    int64_t *len = malloc(sizeof(int64_t) * (size_t)cfg->batch);
    double fill = 0, start = cli_now(), last = 0;
    int rc = CLI_FAIL;
    memset(&pad, 0, sizeof pad);
    memset(&unp, 0, sizeof unp);
    if (!len) {
        cli_error(CMD, "out of memory");
        goto done;
    }
    if (side_new(c, lo, 0, reps, &pad) || side_new(c, lo, 1, reps, &unp)) goto done;
    cli_rng rng;
    cli_rng_seed(&rng, cfg->seed);
    for (int r = -warmup; r < reps; r++) {
        for (int64_t s = 0; s < cfg->batch; s++) len[s] = draw(&d, &rng);
        const int64_t t = fill_batch(cfg, len, &pad, &unp, &rng);
        if (r >= 0) fill += (double)t / (double)(cfg->batch * cfg->seq) / reps;
        /* alternate which goes first: neither always meets the other's caches */
        side *first = r & 1 ? &unp : &pad, *second = r & 1 ? &pad : &unp;
        if (timed_step(first, r) || timed_step(second, r)) goto done;
        const double now = cli_now();
        if (now - start > 3.0 && now - last > 1.0) {
            last = now;
            fprintf(stderr, "bench --lengths: batch %d of %d\n", r + warmup + 1, warmup + reps);
        }
    }
    attn_time at;
    if (attn_profile(cfg, &unp, len, reps < 5 ? reps : 5, &at)) goto done;
    at.padded_flash = (int)dm_layer_note_value(pad.L, "attention_flash", 0);
    rc = report(c, lo, spec, &d, fill, bench_median(pad.ms, reps), bench_median(unp.ms, reps), &at, warmup, reps,
                json);
    rc = rc ? CLI_FAIL : CLI_OK;
done:
    dm_layer_free(pad.L);
    dm_layer_free(unp.L);
    free(pad.ms);
    free(unp.ms);
    free(len);
    free(d.v);
    return rc;
}
