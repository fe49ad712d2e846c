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

static const char *const CMD = "layer";

typedef struct {
    const char *in, *out, *plan;
    int forward_only, recompute, schedule;
    cli_device dev;
    cli_config c;
} layer_opts;

static void init(void *p) {
    layer_opts *o = p;
    cli_config_init(&o->c, CLI_CFG_HEADS | CLI_CFG_TRAIN | CLI_CFG_ARCH | CLI_CFG_THREADS);
}

static const cli_choice k_schedules[] = {{"fused", DM_SCHED_FUSED}, {"unfused", DM_SCHED_UNFUSED}, {NULL, 0}};

#define SIZE_REJECT(nm)                                                                                        \
    {.kind = CLI_REJECT, .name = nm,                                                                           \
     .msg = "%s: dmove layer takes the sizes from the tensors in --in; only --heads is needed"}

static const cli_option k_options[] = {
    {.kind = CLI_STR, .name = "--in", .arg = "FILE", .off = offsetof(layer_opts, in),
     .help = "input safetensors file (required)"},
    {.kind = CLI_STR, .name = "--out", .arg = "FILE", .off = offsetof(layer_opts, out),
     .help = "output safetensors file (required)"},
    {.kind = CLI_I64, .name = "--heads", .arg = "H", .off = offsetof(layer_opts, c.size[3]),
     .set = offsetof(layer_opts, c.size_set[3]) + 1, .lo = 1, .hi = INT64_MAX,
     .help = "attention heads (i must be divisible by H); required unless\n"
             "IN's metadata has it (as `dmove example` writes it, with\n"
             "dropout, seed, act, eps, norm and causal: those become\n"
             "the defaults, and a note says so; options given here win)"},
    CLI_CONFIG(layer_opts, c, CLI_CFG_TRAIN | CLI_CFG_ARCH | CLI_CFG_THREADS),
    CLI_DEVICE(layer_opts, dev),
    {.kind = CLI_CHOICE, .name = "--schedule", .arg = "S", .off = offsetof(layer_opts, schedule),
     .choices = k_schedules, .msg = "--schedule: unknown schedule '%s' (known: fused, unfused)",
     .help = "fused (default) or unfused: the same graph, run with fused\n"
             "groups or one operator at a time; results agree to rounding"},
    {.kind = CLI_FLAG, .name = "--forward-only", .off = offsetof(layer_opts, forward_only), .lo = 1,
     .help = "run the forward pass only; OUT then holds only output"},
    {.kind = CLI_FLAG, .name = "--recompute", .off = offsetof(layer_opts, recompute), .lo = 1,
     .help = CLI_RECOMPUTE_HELP("fused schedule")},
    {.kind = CLI_STR, .name = "--plan", .arg = "FILE", .off = offsetof(layer_opts, plan),
     .help = "run a plan from `dmove tune` (tensor layouts and contraction\n"
             "algorithms) for these sizes; results agree to rounding"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    SIZE_REJECT("--preset"), SIZE_REJECT("--batch"), SIZE_REJECT("--seq"), SIZE_REJECT("--hidden"),
    SIZE_REJECT("--ffn"),
    {.kind = CLI_END},
};

static const cli_command k_layer = {
    .name = "layer",
    .head = "usage: dmove layer --in IN.safetensors --out OUT.safetensors --heads H [options]\n"
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
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 bad input or runtime error, 2 usage error\n"
            "\n"
            "example:\n"
            "  dmove example --out in.safetensors --batch 2 --seq 16 --hidden 64 --heads 4 "
            "--ffn 256\n"
            "  dmove layer --in in.safetensors --out out.safetensors --heads 4 --dropout 0\n",
    .options = k_options,
    .hint = " (files are given with --in and --out)",
    .size = sizeof(layer_opts),
    .init = init,
};

/* 1 if a and b name the same existing file (device and inode). */
static int same_file(const char *a, const char *b) {
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* The options `dmove example` records in the file's __metadata__ (heads, dropout, seed,
 * act, eps, norm, causal) become the defaults of those not given on the command line,
 * with a note saying which; the command line wins. 0 ok, -1 after the error (a bad
 * value). */
static int from_metadata(const dm_tensor_file *f, const char *in, cli_config *c) {
    static const char *const keys[] = {"heads", "dropout", "seed", "act", "eps", "norm", "causal"};
    int *set[] = {&c->size_set[3], &c->dropout_set, &c->seed_set, &c->act_set, &c->eps_set, &c->norm_set,
                  &c->causal_set};
    char used[256] = "";
    size_t len = 0;
    for (int k = 0; k < 7; k++) {
        const char *v = dm_tensor_file_metadata(f, keys[k]);
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

static int is_float_dtype(dm_file_dtype d) {
    return d == DM_FILE_F32 || d == DM_FILE_F64 || d == DM_FILE_F16 || d == DM_FILE_BF16;
}

/* The tensor called `name` in f: 1 and its facts in t, or 0. */
static int find(const dm_tensor_file *f, const char *name, dm_tensor_info *t) {
    int k = dm_tensor_file_find(f, name);
    return k >= 0 && dm_tensor_file_info(f, k, t) == DM_OK;
}

/* The name of tensor k of f. */
static const char *name_of(const dm_tensor_file *f, int k) {
    dm_tensor_info t;
    return dm_tensor_file_info(f, k, &t) == DM_OK ? t.name : "";
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

static void missing(const dm_tensor_file *f, const char *name, const char *what) {
    if (g_hinted) { /* one hint is enough: all names usually share the prefix */
        g_missing_more++;
        return;
    }
    cli_error(CMD, "tensor '%s' is missing from --in: %s", name, what);
    size_t n = strlen(name);
    for (int k = 0; k < dm_tensor_file_count(f); k++) {
        const char *t = name_of(f, k);
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
static int check_tensor(const dm_tensor_info *t, int ndim, const int64_t *want, const char *letters,
                        const char *sizes, int need_float) {
    char got[160], exp[160];
    if (need_float && !is_float_dtype(t->dtype)) {
        cli_error(CMD, "tensor '%s' has dtype %s; it must be a float dtype (F32, F64, F16 or "
                  "BF16)", t->name, dm_file_dtype_name(t->dtype));
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
static int validate(const dm_tensor_file *f, int64_t *b, int64_t *j, int64_t *i, int64_t *u,
                    int forward_only) {
    int bad = 0;
    dm_tensor_info hs_, iw_, t_;
    const dm_tensor_info *hs = find(f, "hidden_states", &hs_) ? &hs_ : NULL;
    if (!hs) {
        missing(f, "hidden_states", "it must hold the layer input, shape (b, j, i)");
        return -1;
    }
    if (!is_float_dtype(hs->dtype)) {
        cli_error(CMD, "tensor 'hidden_states' has dtype %s; it must be a float dtype (F32, F64, "
                  "F16 or BF16)", dm_file_dtype_name(hs->dtype));
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
    const dm_tensor_info *iw = find(f, "intermediate.dense.weight", &iw_) ? &iw_ : NULL;
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
    dm_param_spec spec[32];
    const int nspec = dm_param_spec_count() < 32 ? dm_param_spec_count() : 32;
    for (int p = 0; p < nspec; p++)
        if (dm_param_spec_get(p, &spec[p]) != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            return -1;
        }
    for (int p = 0; p < nspec; p++) {
        const dm_param_spec ps = spec[p];
        const dm_tensor_info *t = find(f, ps.name, &t_) ? &t_ : NULL;
        if (!t) {
            missing(f, ps.name, "dmove layer needs all 16 BertLayer parameters "
                    "(see 'dmove layer --help')");
            bad = 1;
            continue;
        }
        int64_t want[2];
        char letters[16];
        int nd = ps.ndim;
        for (int k = 0; k < nd; k++) want[k] = ps.dims[k] == 'i' ? *i : *u; /* u unknown: -1 matches anything */
        if (nd == 2)
            snprintf(letters, sizeof letters, "(%c, %c)", ps.dims[0], ps.dims[1]);
        else
            snprintf(letters, sizeof letters, "(%c)", ps.dims[0]);
        if (check_tensor(t, nd, want, letters, sizes, 1)) bad = 1;
    }
    const dm_tensor_info *m = find(f, "attention_mask", &t_) ? &t_ : NULL;
    if (m && check_tensor(m, 2, (int64_t[]){*b, *j}, "(b, j)", sizes, 0)) bad = 1;
    const int g = find(f, "grad_output", &t_);
    if (g && check_tensor(&t_, 3, (int64_t[]){*b, *j, *i}, "(b, j, i)", sizes, 1)) bad = 1;
    if (g && forward_only)
        fprintf(stderr, "dmove layer: note: --forward-only: grad_output is not used\n");

    /* Tensors we do not use are probably a naming mistake: say so, but go on. */
    int unused = 0;
    for (int k = 0; k < dm_tensor_file_count(f); k++) {
        const char *n = name_of(f, k);
        int known = !strcmp(n, "hidden_states") || !strcmp(n, "attention_mask") ||
                    !strcmp(n, "grad_output");
        for (int p = 0; !known && p < nspec; p++) known = !strcmp(n, spec[p].name);
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
static int load(dm_layer *layer, const dm_tensor_file *f, const char *name, const char *lname) {
    const int t = dm_tensor_file_find(f, name);
    float *dst = NULL;
    int nd = 0;
    int64_t shape[4] = {0};
    if (dm_layer_tensor(layer, lname, &dst, &nd, shape) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    size_t n = 1;
    for (int k = 0; k < nd; k++) n *= (size_t)shape[k]; /* sizes checked by the layer */
    if (t < 0) return 0;
    if (dm_tensor_file_read_f32(f, t, dst, n) != DM_OK) {
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
static int save(dm_tensor_writer *w, dm_layer *layer, const char *lname, const char *oname) {
    float *src = NULL;
    int nd = 0;
    int64_t shape[4] = {0};
    if (dm_layer_tensor(layer, lname, &src, &nd, shape) != DM_OK ||
        dm_tensor_writer_add_f32(w, oname, nd, shape, src) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    return 0;
}

static int add_meta(dm_tensor_writer *w, const char *key, const char *val) {
    if (dm_tensor_writer_set_metadata(w, key, val) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    return 0;
}

/* Reads --in, takes the defaults its metadata records, checks every tensor and the
 * configuration they make (o->c.cfg; sz: b, j, i, u). 0 ok, else the exit status after
 * the error. */
static int read_input(layer_opts *o, dm_tensor_file **fp, int64_t sz[4]) {
    cli_config *c = &o->c;
    if (dm_tensor_file_open(fp, o->in) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return CLI_FAIL;
    }
    const dm_tensor_file *f = *fp;
    const int heads_given = c->size_set[3];
    if (from_metadata(f, o->in, c)) return CLI_FAIL; /* a bad value in the file: bad input */
    if (!c->size_set[3]) {
        cli_usage_error(CMD, "--heads H is required (the number of attention heads is not "
                        "stored in the tensors, and '%s' has no \"heads\" in its metadata)", o->in);
        return CLI_USAGE;
    }
    int64_t b, j, i, u;
    if (validate(f, &b, &j, &i, &u, o->forward_only)) return CLI_FAIL;
    c->size[0] = b, c->size[1] = j, c->size[2] = i, c->size[4] = u;
    c->size_set[0] = c->size_set[1] = c->size_set[2] = c->size_set[4] = 1;
    if (cli_config_finish(c, CMD, 0)) return CLI_FAIL;
    if (dm_layer_config_check(&c->cfg) != DM_OK) {
        cli_error(CMD, "%s (b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " u=%" PRId64
                  " from --in, h=%" PRId64 " from %s)",
                  dm_last_error(), b, j, i, u, c->cfg.heads, heads_given ? "--heads" : "its metadata");
        return CLI_FAIL;
    }
    sz[0] = b, sz[1] = j, sz[2] = i, sz[3] = u;
    return 0;
}

/* The layer's parameters and inputs from the file (mask and grad_output all ones where
 * the file has none). 0 ok, -1 after the error. */
static int load_inputs(dm_layer *layer, const dm_tensor_file *f, int64_t b, int64_t j, int forward_only) {
    /* The layer's parameter list must be exactly BertLayer's. */
    if (dm_layer_num_params(layer) != dm_param_spec_count()) {
        cli_error(CMD, "internal error: the layer has %d parameters, BertLayer has %d (please "
                  "report this)", dm_layer_num_params(layer), dm_param_spec_count());
        return -1;
    }
    for (int p = 0; p < dm_param_spec_count(); p++) {
        const char *pn = dm_layer_param_name(layer, p);
        if (!pn || dm_tensor_file_find(f, pn) < 0) {
            cli_error(CMD, "internal error: layer parameter '%s' is not a BertLayer parameter "
                      "(please report this)", pn ? pn : "(null)");
            return -1;
        }
        if (load(layer, f, pn, pn)) return -1;
    }
    if (load(layer, f, "hidden_states", "hidden_states")) return -1;
    const int mi = dm_tensor_file_find(f, "attention_mask");
    if (mi >= 0) {
        dm_tensor_info mt;
        if (dm_tensor_file_info(f, mi, &mt) == DM_OK && mt.dtype == DM_FILE_BOOL)
            fprintf(stderr, "dmove layer: note: attention_mask is BOOL, read as True = a token, False = padding "
                            "(Hugging Face's convention; PyTorch's key_padding_mask is the opposite)\n");
        if (load(layer, f, "attention_mask", "attention_mask") || check_mask(layer, b, j)) return -1;
    } else if (fill(layer, "attention_mask", 1.0f)) {
        return -1;
    }
    if (!forward_only) {
        if (dm_tensor_file_find(f, "grad_output") >= 0) {
            if (load(layer, f, "grad_output", "grad_output")) return -1;
        } else if (fill(layer, "grad_output", 1.0f)) {
            return -1;
        }
    }
    return 0;
}

/* The results and the options used, written atomically to --out. 0 ok, -1 after the
 * error. */
static int write_output(const layer_opts *o, dm_layer *layer) {
    const dm_layer_config *cfg = &o->c.cfg;
    dm_tensor_writer *w = NULL;
    int rc = -1;
    if (dm_tensor_writer_new(&w) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        return -1;
    }
    char num[64];
    if (add_meta(w, "format", "pt") || add_meta(w, "dmove_version", DMOVE_VERSION))
        goto done;
    snprintf(num, sizeof num, "%" PRId64, cfg->heads);
    if (add_meta(w, "heads", num)) goto done;
    dm_fmt_exact(num, sizeof num, cfg->dropout);
    if (add_meta(w, "dropout", num)) goto done;
    snprintf(num, sizeof num, "%" PRIu64, cfg->seed);
    if (add_meta(w, "seed", num)) goto done;
    dm_fmt_exact(num, sizeof num, cfg->eps);
    if (add_meta(w, "eps", num) || add_meta(w, "act", dm_act_name(cfg->act)) ||
        add_meta(w, "norm", dm_norm_name(cfg->norm)) || add_meta(w, "causal", cfg->causal ? "1" : "0") ||
        add_meta(w, "schedule", o->schedule == DM_SCHED_FUSED ? "fused" : "unfused") ||
        add_meta(w, "forward_only", o->forward_only ? "1" : "0") ||
        add_meta(w, "device", dm_device_kind_name(o->dev.device)) ||
        add_meta(w, "dtype", dm_dtype_name(o->dev.dtype)))
        goto done;

    if (save(w, layer, "output", "output")) goto done;
    if (!o->forward_only) {
        if (save(w, layer, "grad_hidden_states", "grad_hidden_states")) goto done;
        for (int p = 0; p < dm_layer_num_params(layer); p++) {
            char gname[256];
            const char *pn = dm_layer_param_name(layer, p);
            snprintf(gname, sizeof gname, "%s.grad", pn);
            if (save(w, layer, gname, gname)) goto done;
        }
    }
    if (dm_tensor_writer_write(w, o->out) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    rc = 0;
done:
    dm_tensor_writer_free(w);
    return rc;
}

int cmd_layer(int argc, char **argv) {
    layer_opts o;
    int rc = cli_parse(&k_layer, &o, argc, argv);
    if (rc != CLI_GO) return rc;
    if (!o.in || !*o.in) {
        cli_usage_error(CMD, "--in IN.safetensors is required");
        return CLI_USAGE;
    }
    if (!o.out || !*o.out) {
        cli_usage_error(CMD, "--out OUT.safetensors is required");
        return CLI_USAGE;
    }
    const dm_layer_options chk = {.device = o.dev.device, .dtype = o.dev.dtype, .rows = o.dev.rows,
                                  .streams = o.dev.streams, .schedule = o.schedule, .recompute = o.recompute};
    if (cli_options_check(CMD, &chk)) return CLI_USAGE;
    if (same_file(o.in, o.out)) {
        cli_usage_error(CMD, "--out '%s' is the --in file: writing it would replace your inputs with "
                        "the results; give another name", o.out);
        return CLI_USAGE;
    }
    const cli_path reads[2] = {{.opt = "--in", .path = o.in}, {.opt = "--plan", .path = o.plan}};
    const cli_path writes[1] = {{.opt = "--out", .path = o.out}};
    if ((rc = cli_check_paths(CMD, reads, 2, writes, 1)) != 0) return rc;
    int bad_out = cli_check_output(CMD, "--out", o.out);
    if (bad_out) return bad_out;

    dm_tensor_file *f = NULL;
    int64_t sz[4];
    if ((rc = read_input(&o, &f, sz)) != 0) {
        dm_tensor_file_free(f);
        return rc;
    }
    dm_layer_options opt = chk;
    opt.forward_only = o.forward_only;
    opt.threads = o.c.threads;
    opt.plan = o.plan;
    dm_layer *layer = NULL;
    rc = CLI_FAIL;
    if (dm_layer_new(&layer, &o.c.cfg, &opt) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    char note[512];
    snprintf(note, sizeof note, "%s", dm_layer_note_text(layer, "gen_unavailable"));
    if (note[0])
        fprintf(stderr, "dmove layer: note: --rows auto runs the row groups and attention with the "
                "interpreter and cuBLAS: the generated kernels could not be built: %s\n", note);
    if (load_inputs(layer, f, sz[0], sz[1], o.forward_only)) goto done;
    dm_tensor_file_free(f); /* the input copy is no longer needed: free it before the step */
    f = NULL;

    /* to_device / to_host: the tensors to and from the GPU (no-ops on the CPU) */
    if (dm_layer_to_device(layer) != DM_OK || dm_layer_forward(layer) != DM_OK ||
        (!o.forward_only && dm_layer_backward(layer) != DM_OK) || dm_layer_to_host(layer) != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        goto done;
    }
    if (write_output(&o, layer)) goto done;
    printf("dmove layer: wrote %s: %s (b=%" PRId64 " j=%" PRId64 " i=%" PRId64 " h=%" PRId64 " u=%" PRId64
           ", %s)\n", o.out, o.forward_only ? "output" : "output, grad_hidden_states and the 16 parameter gradients",
           sz[0], sz[1], sz[2], o.c.cfg.heads, sz[3], o.dev.device == DM_DEVICE_CUDA ? "cuda" : "cpu");
    rc = CLI_OK;
done:
    dm_layer_free(layer);
    dm_tensor_file_free(f);
    return rc;
}
