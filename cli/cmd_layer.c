/* cmd_layer.c: `dmove layer`: one training step (forward, backward) of a BERT encoder
 * layer on the user's own tensors, read from and written to safetensors files, so dmove can
 * be compared with any framework. Everything is validated before the layer is built, and
 * the output is written atomically only when the whole step succeeded. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_common.h"
#include "core/strbuf.h"
#include "core/safetensors.h"

static const char *const CMD = "layer";

/* The parameters of Hugging Face's BertLayer, shapes by dimension letter (0: none);
 * weights are (out, in) as torch.nn.Linear stores them. */
static const struct {
    const char *name;
    char d0, d1;
} k_params[] = {
    {"attention.self.query.weight", 'i', 'i'},
    {"attention.self.query.bias", 'i', 0},
    {"attention.self.key.weight", 'i', 'i'},
    {"attention.self.key.bias", 'i', 0},
    {"attention.self.value.weight", 'i', 'i'},
    {"attention.self.value.bias", 'i', 0},
    {"attention.output.dense.weight", 'i', 'i'},
    {"attention.output.dense.bias", 'i', 0},
    {"attention.output.LayerNorm.weight", 'i', 0},
    {"attention.output.LayerNorm.bias", 'i', 0},
    {"intermediate.dense.weight", 'u', 'i'},
    {"intermediate.dense.bias", 'u', 0},
    {"output.dense.weight", 'i', 'u'},
    {"output.dense.bias", 'i', 0},
    {"output.LayerNorm.weight", 'i', 0},
    {"output.LayerNorm.bias", 'i', 0},
};
enum { NUM_PARAMS = (int)(sizeof k_params / sizeof k_params[0]) };

static void usage(FILE *out) {
    fprintf(out,
            "usage: dmove layer --in IN.safetensors --out OUT.safetensors --heads H [options]\n"
            "\n"
            "Runs one training step (forward and backward) of a BERT encoder layer\n"
            "(post-LayerNorm, the semantics of Hugging Face BertLayer in training mode) on\n"
            "your own tensors, so you can compare dmove with any other framework.\n"
            "\n"
            "IN must hold (any float dtype: F32, F64, F16, BF16; converted to float32):\n"
            "  hidden_states    (b, j, i)  the layer input; b, j and i are taken from it\n"
            "  attention_mask   (b, j)     optional: 1 for tokens, 0 for padding (default all 1)\n"
            "  grad_output      (b, j, i)  optional: gradient of the loss w.r.t. the output\n"
            "                              (default all ones)\n"
            "  the 16 parameters under BertLayer's names, weights as (out, in):\n"
            "    attention.self.{query,key,value}.weight (i, i)  and .bias (i)\n"
            "    attention.output.dense.weight (i, i)            and .bias (i)\n"
            "    attention.output.LayerNorm.weight (i)           and .bias (i)\n"
            "    intermediate.dense.weight (u, i)                and .bias (u)\n"
            "    output.dense.weight (i, u)                      and .bias (i)\n"
            "    output.LayerNorm.weight (i)                     and .bias (i)\n"
            "  (u is taken from intermediate.dense.weight)\n"
            "OUT gets, in float32: output (b, j, i), grad_hidden_states (b, j, i) and\n"
            "<parameter>.grad for every parameter, plus __metadata__ recording the dmove\n"
            "version and the options used. OUT is written atomically: on any error nothing\n"
            "is written and an existing OUT is left as it was.\n"
            "\n"
            "options:\n"
            "  --in FILE        input safetensors file (required)\n"
            "  --out FILE       output safetensors file (required)\n"
            "  --heads H        attention heads (i must be divisible by H); required unless\n"
            "                   IN's metadata has it (as `dmove example` writes it, with\n"
            "                   dropout, seed, act, eps, norm and causal: those become\n"
            "                   the defaults, and a note says so; options given here win)\n");
    cli_config_help(out, CLI_CFG_TRAIN | CLI_CFG_ARCH | CLI_CFG_THREADS);
    cli_device_help(out);
    fprintf(out,
            "  --schedule S     fused (default) or unfused: the same graph, run with fused\n"
            "                   groups or one operator at a time; results agree to rounding\n"
            "  --forward-only   run the forward pass only; OUT then holds only output\n");
    cli_recompute_help(out, "fused schedule");
    fprintf(out,
            "  --plan FILE      run a plan from `dmove tune` (tensor layouts and contraction\n"
            "                   algorithms) for these sizes; results agree to rounding\n"
            "  --help           this text\n"
            "\n"
            "exit status: 0 success, 1 bad input or runtime error, 2 usage error\n"
            "\n"
            "example:\n"
            "  dmove example --out in.safetensors --batch 2 --seq 16 --hidden 64 --heads 4 "
            "--ffn 256\n"
            "  dmove layer --in in.safetensors --out out.safetensors --heads 4 --dropout 0\n");
}

/* 1 if a and b name the same existing file (device and inode). */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* The options `dmove example` records in the file's __metadata__ (heads, dropout, seed,
 * act, eps, norm, causal) become the defaults of those not given on the command line,
 * with a note saying which; the command line wins. 0 ok, -1 after the error (a bad
 * value). */
static int from_metadata(const dm_st_file *f, const char *in, cli_config *c) {
    static const char *const keys[] = {"heads", "dropout", "seed", "act", "eps", "norm", "causal"};
    int *set[] = {&c->size_set[3], &c->dropout_set, &c->seed_set, &c->act_set, &c->eps_set, &c->norm_set,
                  &c->causal_set};
    char used[256] = "";
    size_t len = 0;
    for (int k = 0; k < 7; k++) {
        const char *v = dm_st_metadata(f, keys[k]);
        if (!v || *set[k]) continue;
        if (!strcmp(keys[k], "causal")) { /* a flag on the command line, 0 or 1 here */
            if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0) {
                cli_error(CMD, "the \"causal\" in the metadata of '%s' is '%s', not 0 or 1 (give --causal or "
                          "--causal=0 on the command line, or fix the file)", in, v);
                return -1;
            }
            c->causal = v[0] == '1';
            c->causal_set = 1;
            if (c->causal && len < sizeof used) len += (size_t)snprintf(used + len, sizeof used - len, " --causal");
            continue;
        }
        /* the option parser checks the value exactly as if it had been typed */
        char opt[32], arg[96];
        snprintf(opt, sizeof opt, "--%s", keys[k]);
        snprintf(arg, sizeof arg, "%s", v);
        char *argv[3] = {(char *)"layer", opt, arg};
        int i = 1;
        if (cli_config_option(c, CMD, 3, argv, &i) != 1) {
            fprintf(stderr, "dmove layer: (that value, \"%s\", is the \"%s\" in the metadata of '%s'; give %s "
                    "on the command line to override it)\n", v, keys[k], in, opt);
            return -1;
        }
        if (len < sizeof used)
            len += (size_t)snprintf(used + len, sizeof used - len, " %s %s", opt, v);
    }
    if (len) fprintf(stderr, "dmove layer: note: from the metadata of '%s':%s\n", in, used);
    return 0;
}

static int is_float_dtype(dm_st_dtype d) {
    return d == DM_ST_F32 || d == DM_ST_F64 || d == DM_ST_F16 || d == DM_ST_BF16;
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    int p = snprintf(buf, n, "[");
    for (int k = 0; k < ndim && p > 0 && (size_t)p < n; k++)
        p += snprintf(buf + p, n - (size_t)p, k ? ", %" PRId64 : "%" PRId64, shape[k]);
    if (p > 0 && (size_t)p < n) snprintf(buf + p, n - (size_t)p, "]");
}

/* A hint when `name` is missing but a tensor ends with ".name" (a model's state_dict
 * with its prefix, e.g. "bert.encoder.layer.0."). */
static int g_hinted;       /* the prefix hint was given */
static int g_missing_more; /* missing tensors not listed after it */

static void missing(const dm_st_file *f, const char *name, const char *what) {
    if (g_hinted) { /* one hint is enough: all names usually share the prefix */
        g_missing_more++;
        return;
    }
    cli_error(CMD, "tensor '%s' is missing from --in: %s", name, what);
    size_t n = strlen(name);
    for (int k = 0; k < dm_st_count(f); k++) {
        const char *t = dm_st_get(f, k)->name;
        size_t m = strlen(t);
        if (m > n + 1 && t[m - n - 1] == '.' && strcmp(t + m - n, name) == 0) {
            fprintf(stderr, "  (the file has '%s': rename the tensors without the prefix "
                            "'%.*s')\n", t, (int)(m - n), t);
            g_hinted = 1;
            return;
        }
    }
}

/* Checks a tensor's dtype (float) and shape; prints what is wrong; 0 ok, -1 bad. */
static int check_tensor(const dm_st_tensor *t, int ndim, const int64_t *want, const char *letters,
                        const char *sizes, int need_float) {
    char got[160], exp[160];
    if (need_float && !is_float_dtype(t->dtype)) {
        cli_error(CMD, "tensor '%s' has dtype %s; it must be a float dtype (F32, F64, F16 or "
                  "BF16)", t->name, dm_st_dtype_name(t->dtype));
        return -1;
    }
    int ok = t->ndim == ndim;
    for (int k = 0; ok && k < ndim; k++) ok = want[k] < 0 || t->shape[k] == want[k];
    if (ok) return 0;
    shape_str(got, sizeof got, t->ndim, t->shape);
    shape_str(exp, sizeof exp, ndim, want);
    cli_error(CMD, "tensor '%s' has shape %s, expected %s = %s%s", t->name, got, exp, letters,
              sizes);
    return -1;
}

/* Reads and checks every input tensor; fills the sizes. Reports every problem. */
static int validate(const dm_st_file *f, int64_t *b, int64_t *j, int64_t *i, int64_t *u,
                    int forward_only) {
    int bad = 0;
    const dm_st_tensor *hs = dm_st_find(f, "hidden_states");
    if (!hs) {
        missing(f, "hidden_states", "it must hold the layer input, shape (b, j, i)");
        return -1;
    }
    if (!is_float_dtype(hs->dtype)) {
        cli_error(CMD, "tensor 'hidden_states' has dtype %s; it must be a float dtype (F32, F64, "
                  "F16 or BF16)", dm_st_dtype_name(hs->dtype));
        return -1;
    }
    if (hs->ndim != 3) {
        char got[160];
        shape_str(got, sizeof got, hs->ndim, hs->shape);
        cli_error(CMD, "tensor 'hidden_states' has shape %s; it must have 3 dimensions "
                  "(batch b, sequence j, hidden i)", got);
        return -1;
    }
    *b = hs->shape[0];
    *j = hs->shape[1];
    *i = hs->shape[2];
    if (*b < 1 || *j < 1 || *i < 1) {
        cli_error(CMD, "tensor 'hidden_states' has shape [%" PRId64 ", %" PRId64 ", %" PRId64
                  "]; every size must be at least 1", *b, *j, *i);
        return -1;
    }
    *u = -1;
    const dm_st_tensor *iw = dm_st_find(f, "intermediate.dense.weight");
    if (iw && iw->ndim == 2) {
        if (iw->shape[0] < 1) {
            cli_error(CMD, "tensor 'intermediate.dense.weight' has %" PRId64 " rows; its rows "
                      "are the feed-forward width u, which must be at least 1", iw->shape[0]);
            return -1;
        }
        *u = iw->shape[0];
    }

    char sizes[200];
    snprintf(sizes, sizeof sizes, " (b = %" PRId64 ", j = %" PRId64 ", i = %" PRId64
             " from hidden_states%s)", *b, *j, *i,
             *u > 0 ? ", u from intermediate.dense.weight" : "");
    for (int p = 0; p < NUM_PARAMS; p++) {
        const dm_st_tensor *t = dm_st_find(f, k_params[p].name);
        if (!t) {
            missing(f, k_params[p].name, "dmove layer needs all 16 BertLayer parameters "
                    "(see 'dmove layer --help')");
            bad = 1;
            continue;
        }
        int64_t want[2];
        char letters[16];
        int nd = k_params[p].d1 ? 2 : 1;
        for (int k = 0; k < nd; k++) {
            char c = k ? k_params[p].d1 : k_params[p].d0;
            want[k] = c == 'i' ? *i : *u; /* u unknown: -1 matches anything */
        }
        if (nd == 2)
            snprintf(letters, sizeof letters, "(%c, %c)", k_params[p].d0, k_params[p].d1);
        else
            snprintf(letters, sizeof letters, "(%c)", k_params[p].d0);
        if (check_tensor(t, nd, want, letters, sizes, 1)) bad = 1;
    }
    const dm_st_tensor *m = dm_st_find(f, "attention_mask");
    if (m && check_tensor(m, 2, (int64_t[]){*b, *j}, "(b, j)", sizes, 0)) bad = 1;
    const dm_st_tensor *g = dm_st_find(f, "grad_output");
    if (g && check_tensor(g, 3, (int64_t[]){*b, *j, *i}, "(b, j, i)", sizes, 1)) bad = 1;
    if (g && forward_only)
        fprintf(stderr, "dmove layer: note: --forward-only: grad_output is not used\n");

    /* Tensors we do not use are probably a naming mistake: say so, but go on. */
    int unused = 0;
    for (int k = 0; k < dm_st_count(f); k++) {
        const char *n = dm_st_get(f, k)->name;
        int known = !strcmp(n, "hidden_states") || !strcmp(n, "attention_mask") ||
                    !strcmp(n, "grad_output");
        for (int p = 0; !known && p < NUM_PARAMS; p++) known = !strcmp(n, k_params[p].name);
        if (!known && unused++ < 5 && !g_hinted)
            fprintf(stderr, "dmove layer: note: ignoring tensor '%s' (not an input of the "
                            "layer)\n", n);
    }
    if (g_missing_more)
        fprintf(stderr, "dmove layer: ... and %d more tensors missing, likely under the same prefix\n",
                g_missing_more);
    if (g_hinted && unused) /* the prefixed tensors themselves: one line for all */
        fprintf(stderr, "dmove layer: note: %d tensors not used, by name (the prefixed ones, likely)\n", unused);
    else if (unused > 5) fprintf(stderr, "dmove layer: note: ... and %d more\n", unused - 5);
    return bad ? -1 : 0;
}

/* Copies file tensor `name` into the layer's tensor of the same name. */
static int load(dm_layer *layer, const dm_st_file *f, const char *name, const char *lname) {
    const dm_st_tensor *t = dm_st_find(f, name);
    float *dst = NULL;
    int nd = 0;
    int64_t shape[4] = {0};
    if (dm_layer_tensor(layer, lname, &dst, &nd, shape) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    size_t n = 1;
    for (int k = 0; k < nd; k++) n *= (size_t)shape[k]; /* sizes checked by the layer */
    if (!t) return 0;
    if (dm_st_to_f32(t, dst, n) != DM_OK) {
        cli_error(CMD, "tensor '%s': %s (dmove's layer tensor has %zu elements)", name,
                  dm_last_error(), n);
        return -1;
    }
    /* NaN or infinity spreads to every output it touches: say so, then compute as asked */
    size_t bad = 0, first = 0;
    for (size_t e = 0; e < n; e++)
        if (!isfinite(dst[e]) && bad++ == 0) first = e;
    if (bad)
        fprintf(stderr, "dmove layer: note: tensor '%s' has %zu NaN or infinite values (the first at flat "
                "index %zu): the results they reach will be NaN too\n", name, bad, first);
    return 0;
}

static int fill(dm_layer *layer, const char *name, float v) {
    float *dst = NULL;
    int nd = 0;
    int64_t shape[4] = {0};
    if (dm_layer_tensor(layer, name, &dst, &nd, shape) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    size_t n = 1;
    for (int k = 0; k < nd; k++) n *= (size_t)shape[k];
    for (size_t k = 0; k < n; k++) dst[k] = v;
    return 0;
}

/* attention_mask must be 0 or 1; checked on the converted values, so any dtype works. */
static int check_mask(dm_layer *layer, int64_t b, int64_t j) {
    float *m = NULL;
    int nd = 0;
    int64_t shape[4] = {0};
    if (dm_layer_tensor(layer, "attention_mask", &m, &nd, shape) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    for (int64_t s = 0; s < b; s++) {
        int64_t tokens = 0;
        for (int64_t t = 0; t < j; t++) {
            float v = m[s * j + t];
            if (v != 0.0f && v != 1.0f) {
                cli_error(CMD, "attention_mask[%" PRId64 ", %" PRId64 "] is %g; the mask must "
                          "hold 1 for tokens and 0 for padding", s, t, (double)v);
                return -1;
            }
            tokens += v == 1.0f;
        }
        if (tokens == 0)
            fprintf(stderr, "dmove layer: note: sequence %" PRId64 " of attention_mask is all "
                            "padding\n", s);
    }
    return 0;
}

/* Adds layer tensor `lname` to the writer as `oname`. */
static int save(dm_st_writer *w, dm_layer *layer, const char *lname, const char *oname) {
    float *src = NULL;
    int nd = 0;
    int64_t shape[4] = {0};
    if (dm_layer_tensor(layer, lname, &src, &nd, shape) != DM_OK ||
        dm_st_writer_add(w, oname, DM_ST_F32, nd, shape, src) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    return 0;
}

static int add_meta(dm_st_writer *w, const char *key, const char *val) {
    if (dm_st_writer_set_metadata(w, key, val) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    return 0;
}

int cmd_layer(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    int forward_only = 0, recompute = 0;
    dm_device_kind device = DM_DEVICE_CPU;
    dm_dtype dtype = DM_DTYPE_FP32;
    dm_rows rows = DM_ROWS_DEFAULT;
    int streams = 0;
    const char *plan = NULL;
    dm_schedule sched = DM_SCHED_FUSED;
    cli_config c;
    cli_config_init(&c, CLI_CFG_HEADS | CLI_CFG_TRAIN | CLI_CFG_ARCH | CLI_CFG_THREADS);

    for (int a = 1; a < argc; a++) {
        const char *v = NULL;
        int r;
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            usage(stdout);
            return CLI_OK;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--in", &in)) != 0) {
            if (r < 0) return CLI_USAGE;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--out", &out)) != 0) {
            if (r < 0) return CLI_USAGE;
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--schedule", &v)) != 0) {
            if (r < 0) return CLI_USAGE;
            if (!strcmp(v, "fused"))
                sched = DM_SCHED_FUSED;
            else if (!strcmp(v, "unfused"))
                sched = DM_SCHED_UNFUSED;
            else {
                cli_usage_error(CMD, "--schedule: unknown schedule '%s' (known: fused, unfused)",
                                v);
                return CLI_USAGE;
            }
            continue;
        }
        if ((r = cli_opt(CMD, argc, argv, &a, "--plan", &plan)) != 0) {
            if (r < 0) return CLI_USAGE;
            continue;
        }
        if ((r = cli_device_option(CMD, argc, argv, &a, &device, &dtype, &rows, &streams)) != 0) {
            if (r < 0) return CLI_USAGE;
            continue;
        }
        if ((r = cli_flag(CMD, argv, a, "--forward-only")) != 0) {
            if (r < 0) return CLI_USAGE;
            forward_only = 1;
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
        static const char *const sizes[] = {"--preset", "--batch", "--seq", "--hidden", "--ffn"};
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
            size_t n = strlen(sizes[k]);
            if (!strncmp(argv[a], sizes[k], n) && (argv[a][n] == 0 || argv[a][n] == '=')) {
                cli_usage_error(CMD, "%s: dmove layer takes the sizes from the tensors in --in; "
                                "only --heads is needed", sizes[k]);
                return CLI_USAGE;
            }
        }
        return cli_unknown(CMD, argv[a], " (files are given with --in and --out)");
    }
    if (!in || !*in) {
        cli_usage_error(CMD, "--in IN.safetensors is required");
        return CLI_USAGE;
    }
    if (!out || !*out) {
        cli_usage_error(CMD, "--out OUT.safetensors is required");
        return CLI_USAGE;
    }
    const dm_layer_options chk = {.device = device, .dtype = dtype, .rows = rows, .streams = streams,
                                  .schedule = sched, .recompute = recompute};
    if (cli_options_check(CMD, &chk)) return CLI_USAGE;
    if (same_file(in, out)) {
        cli_usage_error(CMD, "--out '%s' is the --in file: writing it would replace your inputs with "
                        "the results; give another name", out);
        return CLI_USAGE;
    }
    int bad_out = cli_check_output(CMD, "--out", out);
    if (bad_out) return bad_out;

    dm_st_file *f = NULL;
    if (dm_st_read(in, &f) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }
    const int heads_given = c.size_set[3];
    if (from_metadata(f, in, &c)) { /* a bad value in the file: bad input */
        dm_st_free(f);
        return CLI_FAIL;
    }
    if (!c.size_set[3]) {
        cli_usage_error(CMD, "--heads H is required (the number of attention heads is not "
                        "stored in the tensors, and '%s' has no \"heads\" in its metadata)", in);
        dm_st_free(f);
        return CLI_USAGE;
    }
    int64_t b, j, i, u;
    if (validate(f, &b, &j, &i, &u, forward_only)) {
        dm_st_free(f);
        return CLI_FAIL;
    }
    c.size[0] = b, c.size[1] = j, c.size[2] = i, c.size[4] = u;
    c.size_set[0] = c.size_set[1] = c.size_set[2] = c.size_set[4] = 1;
    if (cli_config_finish(&c, CMD, 0)) {
        dm_st_free(f);
        return CLI_FAIL;
    }
    if (dm_layer_config_check(&c.cfg) != DM_OK) {
        cli_error(CMD, "%s (b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " u=%" PRId64
                  " from --in, h=%" PRId64 " from %s)",
                  dm_last_error(), b, j, i, u, c.cfg.heads, heads_given ? "--heads" : "its metadata");
        dm_st_free(f);
        return CLI_FAIL;
    }

    dm_layer_options opt = {.schedule = sched, .forward_only = forward_only,
                            .threads = c.threads, .plan = plan, .recompute = recompute};
    opt.device = device;
    opt.dtype = dtype;
    opt.rows = rows;
    opt.streams = streams;
    dm_layer *layer = NULL;
    dm_st_writer *w = NULL;
    int rc = CLI_FAIL;
    if (dm_layer_new(&layer, &c.cfg, &opt) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    const char *gen_unavailable = dm_layer_note_text(layer, "gen_unavailable");
    if (gen_unavailable[0])
        fprintf(stderr, "dmove layer: note: --rows auto runs the row groups and attention with the "
                "interpreter and cuBLAS: the generated kernels could not be built: %s\n", gen_unavailable);
    /* The layer's parameter list must be exactly BertLayer's. */
    if (dm_layer_num_params(layer) != NUM_PARAMS) {
        cli_error(CMD, "internal error: the layer has %d parameters, BertLayer has %d (please "
                  "report this)", dm_layer_num_params(layer), NUM_PARAMS);
        goto done;
    }
    for (int p = 0; p < NUM_PARAMS; p++) {
        const char *pn = dm_layer_param_name(layer, p);
        if (!pn || !dm_st_find(f, pn)) {
            cli_error(CMD, "internal error: layer parameter '%s' is not a BertLayer parameter "
                      "(please report this)", pn ? pn : "(null)");
            goto done;
        }
        if (load(layer, f, pn, pn)) goto done;
    }
    if (load(layer, f, "hidden_states", "hidden_states")) goto done;
    if (dm_st_find(f, "attention_mask")) {
        if (load(layer, f, "attention_mask", "attention_mask") || check_mask(layer, b, j))
            goto done;
    } else if (fill(layer, "attention_mask", 1.0f)) {
        goto done;
    }
    if (!forward_only) {
        if (dm_st_find(f, "grad_output")) {
            if (load(layer, f, "grad_output", "grad_output")) goto done;
        } else if (fill(layer, "grad_output", 1.0f)) {
            goto done;
        }
    }
    dm_st_free(f); /* the input copy is no longer needed: free it before the step */
    f = NULL;

    /* to_device / to_host: the tensors to and from the GPU (no-ops on the CPU) */
    if (dm_layer_to_device(layer) != DM_OK || dm_layer_forward(layer) != DM_OK ||
        (!forward_only && dm_layer_backward(layer) != DM_OK) || dm_layer_to_host(layer) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }

    if (dm_st_writer_new(&w) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    char num[64];
    if (add_meta(w, "format", "pt") || add_meta(w, "dmove_version", DMOVE_VERSION))
        goto done;
    snprintf(num, sizeof num, "%" PRId64, c.cfg.heads);
    if (add_meta(w, "heads", num)) goto done;
    dm_fmt_exact(num, sizeof num, c.cfg.dropout);
    if (add_meta(w, "dropout", num)) goto done;
    snprintf(num, sizeof num, "%" PRIu64, c.cfg.seed);
    if (add_meta(w, "seed", num)) goto done;
    dm_fmt_exact(num, sizeof num, c.cfg.eps);
    if (add_meta(w, "eps", num) || add_meta(w, "act", dm_act_name(c.cfg.act)) ||
        add_meta(w, "norm", dm_norm_name(c.cfg.norm)) || add_meta(w, "causal", c.cfg.causal ? "1" : "0") ||
        add_meta(w, "schedule", sched == DM_SCHED_FUSED ? "fused" : "unfused") ||
        add_meta(w, "forward_only", forward_only ? "1" : "0") ||
        add_meta(w, "device", dm_device_kind_name(device)) ||
        add_meta(w, "dtype", dm_dtype_name(dtype)))
        goto done;

    if (save(w, layer, "output", "output")) goto done;
    if (!forward_only) {
        if (save(w, layer, "grad_hidden_states", "grad_hidden_states")) goto done;
        for (int p = 0; p < dm_layer_num_params(layer); p++) {
            char gname[256];
            const char *pn = dm_layer_param_name(layer, p);
            snprintf(gname, sizeof gname, "%s.grad", pn);
            if (save(w, layer, gname, gname)) goto done;
        }
    }
    if (dm_st_writer_write(w, out) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    printf("dmove layer: wrote %s: %s (b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
           ", %s)\n", out, forward_only ? "output" : "output, grad_hidden_states and the 16 parameter gradients",
           b, j, i, c.cfg.heads, u, device == DM_DEVICE_CUDA ? "cuda" : "cpu");
    rc = CLI_OK;
done:
    dm_st_writer_free(w);
    dm_layer_free(layer);
    dm_st_free(f);
    return rc;
}
