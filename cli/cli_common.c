/* cli_common.c: strict option parsing, the option tables' parser and help printer, the
 * shared layer configuration and device options, a monotonic clock and a deterministic
 * normal RNG for the dmove subcommands. */
#include "cli_common.h"

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <signal.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static int g_rank = -1; /* this process's rank in a launch of several (cli_dist_start), else -1 */

/* The message as one line, written at once: several ranks' lines on one terminal do not
 * interleave mid-line (a message past the buffer is written in parts). */
static void vreport(const char *cmd, const char *fmt, va_list ap) {
    char line[4096];
    int n = g_rank >= 0 ? snprintf(line, sizeof line, "rank %d: dmove %s: ", g_rank, cmd)
                        : snprintf(line, sizeof line, "dmove %s: ", cmd);
    if (n < 0 || (size_t)n >= sizeof line - 2) n = 0;
    va_list aq;
    va_copy(aq, ap);
    const int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, aq);
    va_end(aq);
    if (m >= 0 && (size_t)(n + m) < sizeof line - 1) {
        line[n + m] = '\n';
        fwrite(line, 1, (size_t)(n + m + 1), stderr);
        return;
    }
    line[n] = 0; /* too long for one write: the prefix, then the message */
    fputs(line, stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, fmt, ap);
    va_end(ap);
}

int cli_fail_dm(const char *cmd, const char *what) {
    cli_error(cmd, "%s%s", what, dm_last_error());
    return CLI_FAIL;
}

const char *cli_parent_dir(const char *path, char *buf, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(buf, n, ".");
    else if (slash == path) snprintf(buf, n, "/");
    else snprintf(buf, n, "%.*s", (int)(slash - path), path);
    return buf;
}

const char *cli_short(const char *s, char *buf, size_t n) {
    if (!n) return "";
    const size_t l = strlen(s);
    if (l < n) {
        memcpy(buf, s, l + 1);
        return buf;
    }
    size_t k = n >= 4 ? n - 4 : 0;
    while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80) k--; /* not inside a character */
    memcpy(buf, s, k);
    snprintf(buf + k, n - k, "...");
    return buf;
}

void cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, fmt, ap);
    va_end(ap);
    fprintf(stderr, "run 'dmove %s --help' for its options and an example\n", cmd);
}

int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == '=') {
        *val = a + n + 1;
        return 1;
    }
    if (a[n] != 0) return 0;
    if (*i + 1 >= argc) {
        cli_usage_error(cmd, "%s needs a value", name);
        return -1;
    }
    const char *next = argv[*i + 1];
    if (next[0] == '-' && next[1] == '-') {
        /* "--svg --json": the user forgot the value; a value never starts with "--"
         * (a number does not, and a file that does can be given as --svg=--name) */
        cli_usage_error(cmd, "%s needs a value, but the next argument is the option '%s' (a value "
                        "starting with '--' can be given as %s=VALUE)", name, next, name);
        return -1;
    }
    *val = argv[++*i];
    return 1;
}

int cli_check_output(const char *cmd, const char *opt, const char *path) {
    struct stat st;
    if (!path || !*path) {
        cli_usage_error(cmd, "%s: the file name is empty", opt);
        return CLI_USAGE;
    }
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        cli_usage_error(cmd, "%s: '%s' is a directory: give the name of a file (in it or elsewhere)", opt,
                        path);
        return CLI_USAGE;
    }
    /* the directory the file goes in must exist and take new files (the file is written
     * as a temporary beside it, then renamed) */
    char dir[4096];
    cli_parent_dir(path, dir, sizeof dir);
    if (stat(dir, &st) != 0) {
        cli_error(cmd, "%s: cannot create '%s': the directory '%s' does not exist (create it first)", opt,
                  path, dir);
        return CLI_FAIL;
    }
    if (!S_ISDIR(st.st_mode)) {
        cli_error(cmd, "%s: cannot create '%s': '%s' is not a directory", opt, path, dir);
        return CLI_FAIL;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        cli_error(cmd, "%s: cannot create '%s': no permission to create files in '%s' (%s)", opt, path, dir,
                  strerror(errno));
        return CLI_FAIL;
    }
    return 0;
}

int cli_flag(const char *cmd, char **argv, int i, const char *name) {
    const char *a = argv[i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return 0;
    if (a[n] == 0) return 1;
    if (a[n] == '=') {
        cli_usage_error(cmd, "%s takes no value (got '%s')", name, a);
        return -1;
    }
    return 0;
}

int cli_unknown(const char *cmd, const char *arg, const char *hint) {
    if (arg[0] == '-') cli_usage_error(cmd, "unknown option '%s'", arg);
    else cli_usage_error(cmd, "unexpected argument '%s'%s", arg, hint ? hint : "");
    return CLI_USAGE;
}

/* strto* skip leading spaces and accept signs where we do not want them: the value must
 * start with a digit (or '-' where negatives make sense) and be consumed whole. */
static int starts_ok(const char *s, int allow_minus) {
    if (!s || !*s) return 0;
    if (isdigit((unsigned char)s[0])) return 1;
    return allow_minus && s[0] == '-' && isdigit((unsigned char)s[1]);
}

int cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi,
                  int64_t *out) {
    if (!starts_ok(s, 1)) {
        cli_usage_error(cmd, "%s: '%s' is not an integer", opt, s ? s : "");
        return -1;
    }
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (*end) {
        cli_usage_error(cmd, "%s: '%s' is not an integer", opt, s);
        return -1;
    }
    if (hi == INT64_MAX && (errno == ERANGE || v > hi)) {
        cli_usage_error(cmd, "%s: %s is too large", opt, s);
        return -1;
    }
    if (hi == INT64_MAX && v < lo) {
        cli_usage_error(cmd, "%s: %s is too small: it must be at least %" PRId64, opt, s, lo);
        return -1;
    }
    if (errno == ERANGE || v < lo || v > hi) {
        cli_usage_error(cmd, "%s: %s is out of range (%" PRId64 " to %" PRId64 ")", opt, s, lo,
                        hi);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

int cli_parse_int(const char *cmd, const char *opt, const char *s, int lo, int hi, int *out) {
    int64_t v;
    if (cli_parse_i64(cmd, opt, s, lo, hi, &v)) return -1;
    *out = (int)v;
    return 0;
}

int cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out) {
    if (!starts_ok(s, 0)) {
        cli_usage_error(cmd, "%s: '%s' is not a non-negative integer", opt, s ? s : "");
        return -1;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end) {
        cli_usage_error(cmd, "%s: '%s' is not a non-negative integer", opt, s);
        return -1;
    }
    if (errno == ERANGE) {
        cli_usage_error(cmd, "%s: %s is out of range (0 to %" PRIu64 ")", opt, s, UINT64_MAX);
        return -1;
    }
    *out = (uint64_t)v;
    return 0;
}

int cli_parse_double(const char *cmd, const char *opt, const char *s, double *out) {
    if (!s || !*s || isspace((unsigned char)s[0])) {
        cli_usage_error(cmd, "%s: '%s' is not a number", opt, s ? s : "");
        return -1;
    }
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end) {
        cli_usage_error(cmd, "%s: '%s' is not a number", opt, s);
        return -1;
    }
    if (!isfinite(v) || errno == ERANGE) {
        cli_usage_error(cmd, "%s: '%s' is not a finite number in range", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

/* --- option tables ------------------------------------------------------------------- */

/* "name" or "name=...": the option, whatever follows the '='. */
static int named(const char *a, const char *name) {
    size_t n = strlen(name);
    return !strncmp(a, name, n) && (a[n] == 0 || a[n] == '=');
}

/* Stores the value v of option e into the struct at b (the kinds with a value). 0 ok, -1
 * after a usage error. */
static int store(const cli_option *e, char *b, const char *cmd, const char *v, const char *raw) {
    void *t = b + e->off;
    switch (e->kind) {
    case CLI_PATH:
        if (!*v) {
            cli_usage_error(cmd, "%s: empty file name", e->name);
            return -1;
        }
        /* fall through */
    case CLI_STR: *(const char **)t = v; return 0;
    case CLI_INT: return cli_parse_int(cmd, e->name, v, (int)e->lo, (int)e->hi, (int *)t);
    case CLI_I64: return cli_parse_i64(cmd, e->name, v, e->lo, e->hi, (int64_t *)t);
    case CLI_U64: return cli_parse_u64(cmd, e->name, v, (uint64_t *)t);
    case CLI_DOUBLE: return cli_parse_double(cmd, e->name, v, (double *)t);
    case CLI_CHOICE:
        for (const cli_choice *c = e->choices; c->word; c++)
            if (!strcmp(v, c->word)) {
                *(int *)t = c->value;
                return 0;
            }
        cli_usage_error(cmd, e->msg, v);
        return -1;
    case CLI_CALL: return e->fn(b, cmd, v, raw);
    default: return -1;
    }
}

/* Tries argv[*i] against option e (targets in the struct at b): 1 consumed, 0 not it, -1
 * after a usage error. */
static int match(const cli_option *e, char *b, const char *cmd, int argc, char **argv, int *i) {
    const char *raw = argv[*i], *v = NULL;
    int r;
    if (e->kind == CLI_FLAG) {
        if ((r = cli_flag(cmd, argv, *i, e->name)) <= 0) return r;
        *(int *)(b + e->off) = (int)e->lo;
    } else if (e->kind == CLI_REJECT) {
        if (!named(raw, e->name)) return 0;
        cli_usage_error(cmd, e->msg, e->name);
        return -1;
    } else if (e->kind == CLI_CALL && !e->arg) { /* a flag that reads its own "=..." */
        if (!named(raw, e->name)) return 0;
        if (e->fn(b, cmd, NULL, raw)) return -1;
    } else {
        if ((r = cli_opt(cmd, argc, argv, i, e->name, &v)) <= 0) return r;
        if (store(e, b, cmd, v, raw)) return -1;
    }
    if (e->set) *(int *)(b + e->set - 1) = 1;
    if (e->fn && e->kind != CLI_CALL && e->fn(b, cmd, v, raw)) return -1;
    return 1;
}

int cli_parse_one(const cli_option *table, unsigned mask, void *opts, const char *cmd, int argc, char **argv,
                  int *i) {
    for (const cli_option *e = table; e->kind != CLI_END; e++) {
        if (e->mask && e->kind != CLI_GROUP && !(e->mask & mask)) continue;
        int r = 0;
        if (e->kind == CLI_GROUP) r = cli_parse_one(e->group, e->mask, (char *)opts + e->off, cmd, argc, argv, i);
        else if (e->name && e->kind != CLI_TEXT && e->kind != CLI_HELP) r = match(e, opts, cmd, argc, argv, i);
        if (r) return r;
    }
    return 0;
}

int cli_parse(const cli_command *c, void *opts, int argc, char **argv) {
    memset(opts, 0, c->size);
    c->init(opts);
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            cli_help(c, stdout);
            return CLI_OK;
        }
        int r = cli_parse_one(c->options, ~0u, opts, c->name, argc, argv, &a);
        if (r < 0) return CLI_USAGE;
        if (r == 0) return cli_unknown(c->name, argv[a], c->hint ? c->hint : "");
    }
    return CLI_GO;
}

/* Text as help: "%%" is "%". */
static void put_text(FILE *out, const char *s) {
    for (; s && *s; s++) {
        if (s[0] == '%' && s[1] == '%') s++;
        fputc(*s, out);
    }
}

/* Option e's value in the struct at b as its default in the help. */
static void show(const cli_option *e, const char *b, char *buf, size_t n) {
    const void *t = b + e->off;
    buf[0] = 0;
    switch (e->kind) {
    case CLI_FLAG:
    case CLI_INT: snprintf(buf, n, "%d", *(const int *)t); break;
    case CLI_I64: snprintf(buf, n, "%" PRId64, *(const int64_t *)t); break;
    case CLI_U64: snprintf(buf, n, "%" PRIu64, *(const uint64_t *)t); break;
    case CLI_DOUBLE: snprintf(buf, n, "%g", *(const double *)t); break;
    case CLI_STR:
    case CLI_PATH: snprintf(buf, n, "%s", *(const char *const *)t ? *(const char *const *)t : ""); break;
    case CLI_CHOICE:
        for (const cli_choice *c = e->choices; c->word; c++)
            if (c->value == *(const int *)t) {
                snprintf(buf, n, "%s", c->word);
                break;
            }
        break;
    case CLI_CALL:
        if (e->show) snprintf(buf, n, "%s", e->show(t, (char[64]){0}, 64));
        break;
    default: break;
    }
}

/* The help of option e: its left column, then its text, the lines after the first under
 * it; "{}" the defaults of e and of the entries after it without help of their own. */
static void help_option(FILE *out, const cli_option *e, const char *b, unsigned mask) {
    char left[128], text[2048], val[128];
    if (e->left) snprintf(left, sizeof left, "%s", e->left);
    else snprintf(left, sizeof left, "%s%s%s", e->name, e->arg ? " " : "", e->arg ? e->arg : "");
    size_t len = 0;
    const cli_option *next = e;
    for (const char *h = e->help; *h && len + 1 < sizeof text; h++) {
        if (h[0] == '{' && h[1] == '}') {
            while (next->kind != CLI_END && next != e && (next->help || (next->mask && !(next->mask & mask))))
                next++; /* the next entry documented by this one */
            show(next, b, val, sizeof val);
            len += (size_t)snprintf(text + len, sizeof text - len, "%s", val);
            next++;
            h++;
            continue;
        }
        if (h[0] == '%' && h[1] == '%') h++;
        text[len++] = *h;
    }
    text[len < sizeof text ? len : sizeof text - 1] = 0;
    if (strlen(left) <= 16) fprintf(out, "  %-16s ", left);
    else fprintf(out, "  %s\n%19s", left, "");
    for (const char *l = text; *l; l++) {
        fputc(*l, out);
        if (*l == '\n' && l[1]) fprintf(out, "%19s", "");
    }
    fputc('\n', out);
}

static void help_table(FILE *out, const cli_option *table, unsigned mask, const char *b) {
    for (const cli_option *e = table; e->kind != CLI_END; e++) {
        if (e->mask && e->kind != CLI_GROUP && !(e->mask & mask)) continue;
        if (e->kind == CLI_GROUP) help_table(out, e->group, e->mask, b + e->off);
        else if (e->help_fn) e->help_fn(out, b);
        else if (e->kind == CLI_TEXT) put_text(out, e->help);
        else if (e->help) help_option(out, e, b, mask);
    }
}

void cli_help(const cli_command *c, FILE *out) {
    void *d = calloc(1, c->size);
    if (!d) return;
    c->init(d);
    put_text(out, c->head);
    help_table(out, c->options, ~0u, d);
    put_text(out, c->foot);
    free(d);
}

/* --- the configuration options --------------------------------------------------------- */

static int cfg_preset(void *base, const char *cmd, const char *v, const char *raw) {
    dm_layer_config scratch;
    dm_layer_config_default(&scratch);
    if (dm_layer_config_preset(&scratch, v) != DM_OK) {
        cli_usage_error(cmd, "--preset: unknown preset '%s' (known: bert-base, "
                        "bert-large)", v);
        return -1;
    }
    ((cli_config *)base)->preset = v;
    return 0;
}

static void cfg_preset_help(FILE *out, const void *base) {
    dm_layer_config d, base_, large;
    dm_layer_config_default(&d);
    base_ = d;
    large = d;
    int have_base = dm_layer_config_preset(&base_, "bert-base") == DM_OK;
    int have_large = dm_layer_config_preset(&large, "bert-large") == DM_OK;
    fprintf(out, "  --preset NAME    sizes of a known model (default bert-base):\n");
    if (have_base)
        fprintf(out, "                     bert-base:  b=%" PRId64 " j=%" PRId64 " i=%" PRId64
                     " h=%" PRId64 " u=%" PRId64 "\n",
                base_.batch, base_.seq, base_.hidden, base_.heads, base_.ffn);
    if (have_large)
        fprintf(out, "                     bert-large: b=%" PRId64 " j=%" PRId64 " i=%" PRId64
                     " h=%" PRId64 " u=%" PRId64 "\n",
                large.batch, large.seq, large.hidden, large.heads, large.ffn);
}

static int cfg_dropout(void *base, const char *cmd, const char *v, const char *raw) {
    const cli_config *c = base;
    if (!(c->dropout >= 0.0 && c->dropout < 1.0)) {
        cli_usage_error(cmd, "--dropout: %s is outside [0, 1): p is the probability of "
                        "dropping an element (0 turns dropout off)", v);
        return -1;
    }
    return 0;
}

static int cfg_eps(void *base, const char *cmd, const char *v, const char *raw) {
    if (!(((const cli_config *)base)->eps > 0.0)) {
        cli_usage_error(cmd, "--eps: %s must be positive (LayerNorm adds it to the "
                        "variance)", v);
        return -1;
    }
    return 0;
}

static int cfg_act(void *base, const char *cmd, const char *v, const char *raw) {
    if (dm_act_parse(v, &((cli_config *)base)->act) != DM_OK) {
        cli_usage_error(cmd, "--act: unknown activation '%s' (known: gelu, gelu_tanh, "
                        "relu)", v);
        return -1;
    }
    ((cli_config *)base)->act_set = 1;
    return 0;
}

static const char *show_act(const void *t, char *buf, size_t n) { return dm_act_name(*(const dm_act *)t); }

static int cfg_norm(void *base, const char *cmd, const char *v, const char *raw) {
    if (dm_norm_parse(v, &((cli_config *)base)->norm) != DM_OK) {
        cli_usage_error(cmd, "--norm: unknown LayerNorm placement '%s' (known: post, as BERT; pre, "
                        "LayerNorm on the inputs of attention and feed-forward)", v);
        return -1;
    }
    ((cli_config *)base)->norm_set = 1;
    return 0;
}

/* --causal, or --causal=0 / --causal=1 (0: bidirectional, over what a file's metadata
 * says) */
static int cfg_causal(void *base, const char *cmd, const char *v, const char *raw) {
    cli_config *c = base;
    if (!strncmp(raw, "--causal=", 9)) {
        const char *x = raw + 9;
        if (strcmp(x, "0") != 0 && strcmp(x, "1") != 0) {
            cli_usage_error(cmd, "--causal takes no value, or 0 or 1 (got '%s')", raw);
            return -1;
        }
        c->causal = x[0] == '1';
    } else {
        c->causal = 1;
    }
    c->causal_set = 1;
    return 0;
}

static int cfg_threads(void *base, const char *cmd, const char *v, const char *raw) {
    const cli_config *c = base;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && c->threads > cores)
        fprintf(stderr, "dmove %s: note: --threads %d is more than the %ld cores online: threads "
                "will take turns on the cores, which slows every parallel part\n", cmd, c->threads,
                cores);
    return 0;
}

/* Only the lower bound of a size here: dm_layer_config_check judges what is too large
 * (overflow, memory) with a message that says why. */
#define CFG_SIZE(nm, a, k, m, h)                                                                               \
    {.kind = CLI_I64, .name = nm, .arg = a, .off = offsetof(cli_config, size[k]),                              \
     .set = offsetof(cli_config, size_set[k]) + 1, .lo = 1, .hi = INT64_MAX, .mask = m, .help = h}

const cli_option cli_config_options[] = {
    {.kind = CLI_CALL, .name = "--preset", .arg = "NAME", .fn = cfg_preset, .mask = CLI_CFG_SIZES,
     .help_fn = cfg_preset_help},
    CFG_SIZE("--batch", "B", 0, CLI_CFG_SIZES, "sequences per batch, b (overrides the preset)"),
    CFG_SIZE("--seq", "J", 1, CLI_CFG_SIZES, "tokens per sequence, j"),
    CFG_SIZE("--hidden", "I", 2, CLI_CFG_SIZES, "embedding width, i (divisible by the heads)"),
    CFG_SIZE("--heads", "H", 3, CLI_CFG_HEADS, "attention heads, h (i %% h must be 0)"),
    CFG_SIZE("--ffn", "U", 4, CLI_CFG_SIZES, "feed-forward width, u"),
    {.kind = CLI_DOUBLE, .name = "--dropout", .arg = "P", .off = offsetof(cli_config, dropout),
     .set = offsetof(cli_config, dropout_set) + 1, .fn = cfg_dropout, .mask = CLI_CFG_TRAIN,
     .help = "dropout probability of all three dropouts, in [0, 1)\n"
             "(default {}; 0 turns dropout off)"},
    {.kind = CLI_U64, .name = "--seed", .arg = "S", .off = offsetof(cli_config, seed),
     .set = offsetof(cli_config, seed_set) + 1, .mask = CLI_CFG_TRAIN,
     .help = "dropout seed, an unsigned 64-bit integer (default {});\n"
             "the same seed gives the same masks on every run"},
    {.kind = CLI_CALL, .name = "--act", .arg = "A", .off = offsetof(cli_config, act), .fn = cfg_act,
     .show = show_act, .mask = CLI_CFG_TRAIN,
     .help = "FFN activation: gelu (exact erf), gelu_tanh or relu\n"
             "(default {})"},
    {.kind = CLI_DOUBLE, .name = "--eps", .arg = "E", .off = offsetof(cli_config, eps),
     .set = offsetof(cli_config, eps_set) + 1, .fn = cfg_eps, .mask = CLI_CFG_TRAIN,
     .help = "LayerNorm epsilon (default {})"},
    {.kind = CLI_CALL, .name = "--norm", .arg = "N", .fn = cfg_norm, .mask = CLI_CFG_ARCH,
     .help = "where the LayerNorms sit: post (default; BERT: after each\n"
             "residual add) or pre (on the inputs of attention and the\n"
             "feed-forward block, residuals bypassing them: GPT-2,\n"
             "nn.TransformerEncoderLayer(norm_first=True))"},
    {.kind = CLI_CALL, .name = "--causal", .fn = cfg_causal, .mask = CLI_CFG_ARCH,
     .help = "each token attends to itself and the tokens before it only\n"
             "(a decoder's mask, on top of attention_mask); --causal=0:\n"
             "all tokens (the default), over a file's metadata"},
    {.kind = CLI_INT, .name = "--threads", .arg = "N", .off = offsetof(cli_config, threads), .lo = 0, .hi = 4096,
     .fn = cfg_threads, .mask = CLI_CFG_THREADS, .help = "threads to use (default {}: all cores)"},
    {.kind = CLI_END},
};

void cli_config_init(cli_config *c, unsigned accept) {
    memset(c, 0, sizeof *c);
    c->accept = accept;
    dm_layer_config_default(&c->cfg);
    /* the defaults, for the help (cli_config_finish takes only what was given) */
    c->dropout = c->cfg.dropout;
    c->eps = c->cfg.eps;
    c->act = c->cfg.act;
    c->seed = c->cfg.seed;
    c->norm = c->cfg.norm;
}

int cli_config_option(cli_config *c, const char *cmd, int argc, char **argv, int *i) {
    return cli_parse_one(cli_config_options, c->accept, c, cmd, argc, argv, i);
}

int cli_config_finish(cli_config *c, const char *cmd, int check) {
    dm_layer_config *cfg = &c->cfg;
    dm_layer_config_default(cfg);
    if (c->preset && dm_layer_config_preset(cfg, c->preset) != DM_OK) {
        cli_usage_error(cmd, "--preset: %s", dm_last_error());
        return -1;
    }
    int64_t *dst[5] = {&cfg->batch, &cfg->seq, &cfg->hidden, &cfg->heads, &cfg->ffn};
    for (int k = 0; k < 5; k++)
        if (c->size_set[k]) *dst[k] = c->size[k];
    if (c->dropout_set) cfg->dropout = c->dropout;
    if (c->eps_set) cfg->eps = c->eps;
    if (c->act_set) cfg->act = c->act;
    if (c->seed_set) cfg->seed = c->seed;
    if (c->norm_set) cfg->norm = c->norm;
    if (c->causal_set) cfg->causal = c->causal;
    if (check && dm_layer_config_check(cfg) != DM_OK) {
        cli_usage_error(cmd, "%s", dm_last_error());
        return -1;
    }
    return 0;
}

const char *cli_variant(const dm_layer_config *cfg) {
    if (cfg->norm == DM_NORM_PRE) return cfg->causal ? ", pre-LN, causal" : ", pre-LN";
    return cfg->causal ? ", causal" : "";
}

/* --- the device options ---------------------------------------------------------------- */

static int dev_streams(void *base, const char *cmd, const char *v, const char *raw) {
    if (strcmp(v, "1") != 0 && strcmp(v, "2") != 0) {
        cli_usage_error(cmd, "--streams: '%s' is not 1 or 2", v);
        return -1;
    }
    ((cli_device *)base)->streams = v[0] - '0';
    return 0;
}

static int dev_rows(void *base, const char *cmd, const char *v, const char *raw) {
    if (dm_rows_parse(v, &((cli_device *)base)->rows) != DM_OK) {
        cli_usage_error(cmd, "--rows: unknown row kernels '%s' (known: interp, gen, auto)", v);
        return -1;
    }
    return 0;
}

static int dev_device(void *base, const char *cmd, const char *v, const char *raw) {
    if (dm_device_kind_parse(v, &((cli_device *)base)->device) != DM_OK) {
        cli_usage_error(cmd, "--device: unknown device '%s' (known: cpu, cuda)", v);
        return -1;
    }
    return 0;
}

static int dev_dtype(void *base, const char *cmd, const char *v, const char *raw) {
    if (dm_dtype_parse(v, &((cli_device *)base)->dtype) != DM_OK) {
        cli_usage_error(cmd, "--dtype: unknown storage type '%s' (known: fp32, bf16, fp16)", v);
        return -1;
    }
    return 0;
}

const cli_option cli_device_options[] = {
    {.kind = CLI_CALL, .name = "--device", .arg = "D", .fn = dev_device,
     .help = "cpu (default) or cuda: where the steps run (cuda needs a\n"
             "dmove built with nvcc, and a GPU)"},
    {.kind = CLI_CALL, .name = "--dtype", .arg = "T", .fn = dev_dtype,
     .help = "how the GPU stores tensors: fp32 (default), bf16 or fp16;\n"
             "arithmetic and accumulation stay fp32 (cuda only)"},
    {.kind = CLI_CALL, .name = "--rows", .arg = "K", .fn = dev_rows,
     .help = "how the GPU runs the fused element-wise and normalization\n"
             "groups: interp (one kernel interprets every group), gen (a\n"
             "kernel generated per group, compiled by NVRTC when the\n"
             "layer is made; with bf16/fp16 storage, attention's groups\n"
             "also fused into one tensor-core kernel each) or auto (the\n"
             "default: both measured per group when the layer is made,\n"
             "the faster kept); cuda only; DMOVE_CUDA_ROWS sets the\n"
             "default (interp when emulated, DMOVE_CUDA_EMULATE=1)"},
    {.kind = CLI_CALL, .name = "--streams", .arg = "N", .fn = dev_streams,
     .help = "2 (default) or 1: run the weight and bias gradients on a\n"
             "second CUDA stream, overlapping the groups after them\n"
             "(cuda only; DMOVE_CUDA_STREAMS sets the default; 1 when\n"
             "emulated)"},
    {.kind = CLI_END},
};

const char *cli_device_where(char *buf, size_t n, dm_device_kind dev, dm_dtype dtype, int threads) {
    if (dev == DM_DEVICE_CUDA) snprintf(buf, n, "on the GPU (%s storage%s)", dm_dtype_name(dtype), cli_emulated_note(dev));
    else snprintf(buf, n, "%d thread%s", threads, threads > 1 ? "s" : "");
    return buf;
}

dm_layer_options cli_device_layer_options(const cli_device *d, int threads, int unpad) {
    return (dm_layer_options){.threads = threads, .unpad = unpad, .device = d->device, .dtype = d->dtype,
                              .rows = d->rows, .streams = d->streams};
}

const char *cli_emulated_note(dm_device_kind dev) {
    const char *e = getenv("DMOVE_CUDA_EMULATE");
    if (dev != DM_DEVICE_CUDA || !e) return "";
    return !strcmp(e, "1") ? ", emulated on the host by DMOVE_CUDA_EMULATE=1"
           : !strcmp(e, "lanes") ? ", emulated on the host by DMOVE_CUDA_EMULATE=lanes" : "";
}

double cli_now(void) {
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) return 0.0; /* cannot fail on Linux */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_rng_seed(cli_rng *r, uint64_t seed) {
    r->s = seed;
    r->have = 0;
    r->spare = 0;
}

uint64_t cli_rng_u64(cli_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double cli_rng_normal(cli_rng *r) {
    if (r->have) {
        r->have = 0;
        return r->spare;
    }
    /* u1 in (0, 1]: log never sees 0 */
    double u1 = ((double)(cli_rng_u64(r) >> 11) + 1.0) * 0x1p-53;
    double u2 = (double)(cli_rng_u64(r) >> 11) * 0x1p-53;
    double m = sqrt(-2.0 * log(u1)), a = 6.283185307179586 * u2;
    r->spare = m * sin(a);
    r->have = 1;
    return m * cos(a);
}

int cli_threads(int threads) {
    if (threads > 0) return threads;
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
#endif
}

int cli_options_check(const char *cmd, const dm_layer_options *o) {
    if (dm_layer_options_check(o) == DM_OK) return 0;
    cli_usage_error(cmd, "%s", dm_last_error());
    return -1;
}

/* --- the optimizer's options (train, pretrain) ------------------------------------------ */

static const cli_choice k_lr_schedules[] = {{"constant", 0}, {"linear", 1}, {"poly", 2}, {NULL, 0}};
static const cli_choice k_optimizers[] = {{"adamw", DM_OPT_ADAMW}, {"lamb", DM_OPT_LAMB}, {NULL, 0}};

#define OO(field) .off = offsetof(cli_optim, field)
const cli_option cli_optim_options[] = {
    {.kind = CLI_DOUBLE, .name = "--lr", .arg = "LR", OO(optim.lr), .help = "peak learning rate (default {})"},
    {.kind = CLI_I64, .name = "--warmup", .arg = "W", OO(optim.warmup), .lo = 0, .hi = INT64_C(1000000000),
     .help = "steps of linear warm-up from 0 to LR (default {})"},
    {.kind = CLI_CHOICE, .name = "--lr-schedule", .arg = "S", OO(schedule), .choices = k_lr_schedules,
     .msg = "--lr-schedule: '%s' is not constant, linear or poly",
     .help = "constant (default), linear or poly: after the warm-up,\n"
             "fall linearly (BERT's shape), or as ((N-s+1)/(N-W))^P, to\n"
             "--lr-end at step N (step s of the warm-up takes LR*s/W,\n"
             "so no update has rate 0)"},
    {.kind = CLI_DOUBLE, .name = "--power", .arg = "P", OO(optim.power),
     .help = "the poly schedule's power (default {}: linear)"},
    {.kind = CLI_DOUBLE, .name = "--lr-end", .arg = "LR", OO(optim.lr_end),
     .help = "the rate the decay ends at (default {})"},
    {.kind = CLI_CHOICE, .name = "--optimizer", .arg = "O", OO(optim.kind), .choices = k_optimizers,
     .msg = "--optimizer: '%s' is not adamw or lamb",
     .help = "adamw (default; torch.optim.AdamW) or lamb (layer-wise\n"
             "trust ratios, for large batches: BERT's pretraining at\n"
             "scale; NVIDIA's FusedLAMB)"},
    {.kind = CLI_DOUBLE, .name = "--clip-norm", .arg = "C", OO(optim.clip_norm),
     .help = "clip the global gradient norm to C (default {}; 0: no\n"
             "clipping; BERT uses 1), as torch.nn.utils.clip_grad_norm_"},
    {.kind = CLI_INT, .name = "--accumulate", .arg = "K", OO(optim.accumulate), .lo = 1, .hi = 65536,
     .help = "micro-batches per update (default {}): a step takes K\n"
             "batches of --batch and averages their gradients"},
    {.kind = CLI_DOUBLE, .name = "--weight-decay", .arg = "D", OO(optim.weight_decay),
     .help = "decoupled weight decay on the weights, not on biases\n"
             "and LayerNorm parameters (default {})"},
    {.kind = CLI_DOUBLE, .name = "--beta1", .arg = "B", OO(optim.beta1), .left = "--beta1 B, --beta2 B, --adam-eps E",
     .help = "the moments' decays and epsilon (default {}, {}, {})"},
    {.kind = CLI_DOUBLE, .name = "--beta2", .arg = "B", OO(optim.beta2)},
    {.kind = CLI_DOUBLE, .name = "--adam-eps", .arg = "E", OO(optim.eps)},
    {.kind = CLI_INT, .name = "--zero", .arg = "Z", OO(zero), .lo = 0, .hi = 1,
     .help = "under mpirun: 1 shards the optimizer's moments over the\n"
             "ranks (ZeRO stage 1: each keeps and updates its share of\n"
             "the parameters; memory for the moments / ranks); default {}"},
    {.kind = CLI_END},
};
#undef OO

void cli_optim_init(cli_optim *o) {
    dm_optim_config_default(&o->optim);
    o->schedule = 0;
}

int cli_optim_finish(cli_optim *o, const char *cmd, int64_t steps) {
    if (o->schedule) o->optim.total = steps;
    if (o->schedule == 1 && o->optim.power != 1.0) {
        cli_usage_error(cmd, "--power applies to --lr-schedule poly");
        return CLI_USAGE;
    }
    if (!o->schedule && o->optim.lr_end != 0.0) {
        cli_usage_error(cmd, "--lr-end applies to the linear and poly schedules");
        return CLI_USAGE;
    }
    if (dm_optim_config_check(&o->optim) != DM_OK) {
        cli_usage_error(cmd, "%s", dm_last_error());
        return CLI_USAGE;
    }
    return 0;
}

/* --- Ctrl-C, SIGTERM and SIGHUP during a run -------------------------------------------- */

static volatile sig_atomic_t g_interrupted;
static char g_signal_msg[192];
static size_t g_signal_len;
static const int k_stop_signals[3] = {SIGINT, SIGTERM, SIGHUP};

static volatile sig_atomic_t g_caught[3]; /* the stop signals this run handles (not ignored before) */

static void set_handlers(void (*fn)(int), int flags) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < 3; k++)
        if (g_caught[k]) (void)sigaction(k_stop_signals[k], &sa, NULL);
}

/* A second signal: the run ends at once, the outputs being written (a checkpoint half
 * saved) removed, the target files as they were. */
static void on_second_signal(int sig) {
    dm_remove_partial_outputs();
    set_handlers(SIG_DFL, 0);
    (void)raise(sig);
}

static void on_signal(int sig) {
    g_interrupted = sig;
    set_handlers(on_second_signal, 0);
    ssize_t w = write(STDERR_FILENO, g_signal_msg, g_signal_len); /* nothing to do if stderr is gone */
    (void)w;
}

void cli_catch_signals(const char *cmd, int saving) {
    snprintf(g_signal_msg, sizeof g_signal_msg, "\ndmove %s: interrupted: finishing this step%s (again to quit at once)\n",
             cmd, saving ? ", then saving the checkpoint" : "");
    g_signal_len = strlen(g_signal_msg);
    /* SIGHUP too (a closed terminal or ssh session stops the run as Ctrl-C does), unless
     * the run was started ignoring it (nohup); SIGINT and SIGTERM always (a shell starts a
     * background job with SIGINT ignored, and kill -INT of it should still stop it) */
    for (int k = 0; k < 3; k++) {
        struct sigaction old;
        g_caught[k] = k_stop_signals[k] != SIGHUP ||
                      (sigaction(SIGHUP, NULL, &old) == 0 && old.sa_handler != SIG_IGN);
    }
    set_handlers(on_signal, SA_RESTART); /* a write or read under way goes on after the first */
    /* a closed stdout (dmove train | head) ends the printing, not the run: writes fail with EPIPE */
    struct sigaction ign;
    memset(&ign, 0, sizeof ign);
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    (void)sigaction(SIGPIPE, &ign, NULL);
    /* a file past `ulimit -f`: the write fails (EFBIG) and says so, its temporary removed,
     * instead of the signal ending the process silently */
    (void)sigaction(SIGXFSZ, &ign, NULL);
}

int cli_interrupted(void) { return (int)g_interrupted; }

/* --- the paths a run reads and writes -------------------------------------------------- */

typedef struct {
    int exists;
    dev_t dev;
    ino_t ino;
    char *canon; /* not existing: the real parent directory and the name */
} path_id;

static void path_identify(const char *path, path_id *id) {
    memset(id, 0, sizeof *id);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        id->exists = 1, id->dev = sb.st_dev, id->ino = sb.st_ino;
        return;
    }
    const char *slash = strrchr(path, '/');
    char parent[4096];
    const size_t n = slash ? (slash == path ? 1 : (size_t)(slash - path)) : 1;
    if (n >= sizeof parent) return;
    if (slash) memcpy(parent, path, n), parent[n] = 0;
    else snprintf(parent, sizeof parent, ".");
    char *rp = realpath(parent, NULL);
    const char *base = slash ? slash + 1 : path;
    const size_t len = (rp ? strlen(rp) : strlen(path)) + strlen(base) + 2;
    if ((id->canon = malloc(len)) != NULL) {
        if (rp) snprintf(id->canon, len, "%s/%s", rp, base);
        else snprintf(id->canon, len, "%s", path); /* no parent: as written */
    }
    free(rp);
}

static int path_same(const path_id *a, const path_id *b) {
    if (a->exists != b->exists) return 0;
    if (a->exists) return a->dev == b->dev && a->ino == b->ino;
    return a->canon && b->canon && !strcmp(a->canon, b->canon);
}

/* The directory a dir option names: itself, or for a file (--init model.safetensors) the
 * directory it lies in (whose config.json and tokenizer are read too). */
static void dir_identify(const char *path, int parent, path_id *id) {
    struct stat sb;
    if (!parent && (stat(path, &sb) != 0 || S_ISDIR(sb.st_mode))) {
        path_identify(path, id);
        return;
    }
    char dir[4096];
    path_identify(cli_parent_dir(path, dir, sizeof dir), id);
}

/* Whether a file name is one a run reads from a model's or a dataset's directory. */
static int input_name(const char *base) {
    static const char *const names[] = {"model.safetensors", "config.json", "tokenizer.json", "vocab.txt",
                                        "tokenizer_config.json", "modules.json", "sentence_bert_config.json",
                                        "dataset.json"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++)
        if (!strcmp(base, names[k])) return 1;
    const size_t n = strlen(base);
    return n > 6 && !strcmp(base + n - 6, ".shard");
}

/* A file written into a directory the run reads, over one it reads there (a shard, the
 * model's weights, config or tokenizer), or into the one it exports to under a name the
 * export writes (model.safetensors, config.json): refused. Other files there are the
 * user's (a checkpoint kept beside the data, a second run's outputs). */
static int inside_dirs(const char *cmd, const cli_path *pw, const path_id *wid, const cli_path *reads, int nreads,
                       const cli_path *writes, int nwrites) {
    const char *base = strrchr(pw->path, '/');
    base = base ? base + 1 : pw->path;
    const int export_name = !strcmp(base, "model.safetensors") || !strcmp(base, "config.json");
    if (!input_name(base)) return 0;
    path_id pid, did;
    dir_identify(pw->path, 1, &pid);
    const cli_path *in = NULL;
    int read = 0;
    for (int k = 0; k < nreads + nwrites && !in; k++) {
        const cli_path *c = k < nreads ? &reads[k] : &writes[k - nreads];
        if (!c->path || !c->dir || c == pw || (k < nreads ? !wid->exists : !export_name)) continue;
        dir_identify(c->path, 0, &did);
        if (path_same(&did, &pid)) in = c, read = k < nreads;
        free(did.canon);
    }
    free(pid.canon);
    if (!in) return 0;
    cli_usage_error(cmd, "%s %s is inside %s %s: the run %s; give a path outside it", pw->opt, pw->path, in->opt,
                    in->path, read ? "reads the files there" : "writes that name there");
    return CLI_USAGE;
}

/* The writes' checks, the identities made (ids: nreads + nwrites). */
static int paths_conflict(const char *cmd, const cli_path *reads, int nreads, const cli_path *writes, int nwrites,
                          path_id *ids) {
    int rc;
    for (int w = 0; w < nwrites; w++) {
        const cli_path *pw = &writes[w];
        if (!pw->path) continue;
        struct stat sb;
        if (!pw->dir && stat(pw->path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            cli_usage_error(cmd, "%s %s: that is a directory: give a file name", pw->opt, pw->path);
            return CLI_USAGE;
        }
        if (pw->dir && stat(pw->path, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
            cli_usage_error(cmd, "%s %s: that is a file, not a directory: give a directory's name", pw->opt, pw->path);
            return CLI_USAGE;
        }
        for (int r = 0; r < nreads; r++)
            if (reads[r].path && path_same(&ids[nwrites + r], &ids[w]) &&
                !(reads[r].same_ok && !strcmp(reads[r].same_ok, pw->opt))) {
                cli_usage_error(cmd, "%s %s is also %s: writing it would destroy what the run reads; give "
                                "another name", pw->opt, pw->path, reads[r].opt);
                return CLI_USAGE;
            }
        if (!pw->dir && (rc = inside_dirs(cmd, pw, &ids[w], reads, nreads, writes, nwrites)) != 0) return rc;
        const int device = stat(pw->path, &sb) == 0 && (S_ISCHR(sb.st_mode) || S_ISFIFO(sb.st_mode));
        for (int v = 0; v < w && !device; v++) /* /dev/null twice is fine: a device is streamed to */
            if (writes[v].path && path_same(&ids[v], &ids[w])) {
                cli_usage_error(cmd, "%s %s and %s %s are the same file: one output would replace the other; "
                                "give two names", writes[v].opt, writes[v].path, pw->opt, pw->path);
                return CLI_USAGE;
            }
    }
    return 0;
}

int cli_check_paths(const char *cmd, const cli_path *reads, int nreads, const cli_path *writes, int nwrites) {
    path_id *ids = calloc((size_t)(nreads + nwrites) + 1, sizeof *ids);
    if (!ids) {
        cli_error(cmd, "out of memory");
        return CLI_FAIL;
    }
    for (int w = 0; w < nwrites; w++)
        if (writes[w].path) path_identify(writes[w].path, &ids[w]);
    for (int r = 0; r < nreads; r++)
        if (reads[r].path) path_identify(reads[r].path, &ids[nwrites + r]);
    const int rc = paths_conflict(cmd, reads, nreads, writes, nwrites, ids);
    for (int k = 0; k < nreads + nwrites; k++) free(ids[k].canon);
    free(ids);
    return rc;
}

int cli_finish_stdout(const char *cmd) {
    errno = 0;
    if (fflush(stdout) == 0 && !ferror(stdout)) return CLI_OK;
    int e = errno;
    struct pollfd pf = {.fd = STDOUT_FILENO, .events = POLLOUT};
    if (e != EPIPE && poll(&pf, 1, 0) == 1 && (pf.revents & POLLERR)) e = EPIPE; /* a pipe without a reader */
    if (e == EPIPE) {
        fprintf(stderr, "dmove %s: the reader of its output went away (a closed pipe): the run went on to its end "
                "without printing\n", cmd);
        return CLI_OK;
    }
    cli_error(cmd, "cannot write the output: %s", e ? strerror(e) : "write error");
    return CLI_FAIL;
}

/* --- the sizes of a Hugging Face config.json ------------------------------------------- */

int cli_config_from_hf(cli_config *c, const char *cmd, const char *opt, const char *source, const dm_hf_config *hc) {
    dm_layer_config lc;
    dm_layer_config_default(&lc);
    dm_hf_config h = *hc;
    if (c->dropout_set) /* --dropout replaces the config's dropouts, even two that differ */
        h.hidden_dropout_prob = h.attention_probs_dropout_prob = c->dropout;
    if (dm_hf_config_layer(&h, &lc) != DM_OK) {
        cli_error(cmd, "%s: %s%s", opt, dm_last_error(),
                  !c->dropout_set && hc->hidden_dropout_prob != hc->attention_probs_dropout_prob
                      ? ": give --dropout P to train with one" : "");
        return CLI_FAIL;
    }
    if (c->preset) {
        cli_usage_error(cmd, "--preset with %s: %s gives the model's sizes", opt, source);
        return CLI_USAGE;
    }
    static const char *const name[3] = {"--hidden", "--heads", "--ffn"}, *const key[3] = {
        "hidden_size", "num_attention_heads", "intermediate_size"};
    const int64_t want[3] = {lc.hidden, lc.heads, lc.ffn};
    for (int k = 0; k < 3; k++)
        if (c->size_set[2 + k] && c->size[2 + k] != want[k]) {
            cli_usage_error(cmd, "%s %" PRId64 " contradicts %s (%s %" PRId64 "): leave it out, the model's config "
                            "gives it", name[k], c->size[2 + k], source, key[k], want[k]);
            return CLI_USAGE;
        }
    if ((c->eps_set && c->eps != lc.eps) || (c->act_set && c->act != lc.act)) {
        cli_usage_error(cmd, "--eps or --act contradicts %s (layer_norm_eps %g, hidden_act %s): leave them out", source,
                        lc.eps, dm_act_name(lc.act));
        return CLI_USAGE;
    }
    for (int k = 0; k < 3; k++) c->size[2 + k] = want[k], c->size_set[2 + k] = 1;
    c->eps = lc.eps, c->eps_set = 1;
    c->act = lc.act, c->act_set = 1;
    if (!c->dropout_set) c->dropout = lc.dropout, c->dropout_set = 1; /* a training choice: --dropout may differ */
    return 0;
}

/* --- data parallelism ------------------------------------------------------------------ */

/* Option `name` of table t (its groups' too), or NULL. */
static const cli_option *option_named(const cli_option *t, const char *name, size_t len) {
    for (const cli_option *e = t; e && e->kind != CLI_END; e++) {
        if (e->kind == CLI_GROUP) {
            const cli_option *g = option_named(e->group, name, len);
            if (g) return g;
        } else if (e->name && strlen(e->name) == len && !strncmp(e->name, name, len)) {
            return e;
        }
    }
    return NULL;
}

/* The run's options as the ranks must share them: each option once (its last value, as
 * parsed), "--x=v" as "--x v", a number by its value (canon_value), in name order; the
 * per-process ones (threads, logging, JSON) left out. */
typedef struct {
    char name[64], value[1024];
} rank_opt;

/* An option's value as its kind reads it: a number by its value (a double's "1e-4" and
 * "0.0001" alike; a whole number exactly), anything else as written. */
static void canon_value(const cli_option *e, const char *val, char *out, size_t n) {
    char *end;
    errno = 0;
    if (e && (e->kind == CLI_INT || e->kind == CLI_I64)) {
        const long long x = strtoll(val, &end, 10);
        if (*val && !*end && !errno) {
            snprintf(out, n, "%lld", x);
            return;
        }
    } else if (e && e->kind == CLI_U64) {
        const unsigned long long x = strtoull(val, &end, 10);
        if (*val && !*end && !errno) {
            snprintf(out, n, "%llu", x);
            return;
        }
    } else if (e && e->kind == CLI_DOUBLE) {
        const double x = strtod(val, &end);
        if (*val && !*end && isfinite(x)) {
            snprintf(out, n, "%.17g", x);
            return;
        }
    }
    snprintf(out, n, "%s", val);
}
static int canon_opts(const cli_command *c, int argc, char **argv, rank_opt *o, int cap) {
    static const char *const mine[] = {"--threads", "--log-every", "--json", NULL};
    int n = 0, positional = 0;
    for (int k = 1; k < argc && n < cap; k++) {
        const char *a = argv[k], *eq = strchr(a, '='), *val = NULL;
        const cli_option *e = NULL;
        char name[64];
        if (strncmp(a, "--", 2) != 0) {
            snprintf(name, sizeof name, "(argument %d)", ++positional);
            val = a;
        } else {
            const size_t len = eq ? (size_t)(eq - a) : strlen(a);
            snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name ? len : sizeof name - 1), a);
            e = option_named(c->options, a, len);
            const int flag = e && (e->kind == CLI_FLAG || e->kind == CLI_HELP || (e->kind == CLI_CALL && !e->arg));
            val = eq ? eq + 1 : !flag && k + 1 < argc ? argv[++k] : "";
        }
        int skip = 0;
        for (int m = 0; mine[m]; m++) skip |= !strcmp(name, mine[m]);
        if (skip) continue;
        int at = n;
        for (int q = 0; q < n; q++)
            if (!strcmp(o[q].name, name)) at = q; /* given again: the last value counts */
        snprintf(o[at].name, sizeof o[at].name, "%s", name);
        canon_value(e, val, o[at].value, sizeof o[at].value);
        n += at == n;
    }
    for (int i = 1; i < n; i++) /* insertion sort by name */
        for (int j = i; j > 0 && strcmp(o[j - 1].name, o[j].name) > 0; j--) {
            rank_opt t = o[j];
            o[j] = o[j - 1], o[j - 1] = t;
        }
    return n;
}

int cli_dist_start(const char *cmd, const cli_command *c, int argc, char **argv, dm_dist **out) {
    *out = NULL;
    if (dm_dist_start(out, 0) != DM_OK) return cli_fail_dm(cmd, "");
    dm_dist *d = *out;
    if (dm_dist_size(d) < 2) return 0;
    g_rank = dm_dist_rank(d);
    /* the same dmove (version, build) and the same options on every rank: their names
     * first (one collective), then each value (as many on every rank) */
    enum { CAP = 128 };
    rank_opt *o = calloc(CAP, sizeof *o);
    if (!o) {
        cli_error(cmd, "out of memory");
        return cli_dist_end(d, CLI_FAIL);
    }
    const int n = canon_opts(c, argc, argv, o, CAP);
    char names[1024];
    size_t len = 0;
    for (int k = 0; k < n && len < sizeof names; k++)
        len += (size_t)snprintf(names + len, sizeof names - len, "%s%s", k ? " " : "", o[k].name);
    dm_status s = dm_dist_agree(d, "dmove's build", "dmove " DMOVE_VERSION " built " __DATE__ " " __TIME__);
    if (s == DM_OK) s = dm_dist_agree(d, "the options given", n ? names : "(none)");
    for (int k = 0; s == DM_OK && k < n; k++) s = dm_dist_agree(d, o[k].name, o[k].value);
    free(o);
    if (s != DM_OK) {
        cli_fail_dm(cmd, "");
        return cli_dist_end(d, CLI_FAIL);
    }
    return 0;
}

FILE *cli_dist_info(FILE *info) {
    static FILE *sink;
    if (g_rank <= 0) return info;
    if (!sink) sink = fopen("/dev/null", "w");
    return sink ? sink : info;
}

int cli_dist_interrupted(dm_dist *d) {
    double any = cli_interrupted();
    if (dm_dist_size(d) > 1 && dm_dist_sum(d, &any, 1) != DM_OK) {
        cli_fail_dm("run", ""); /* a rank gone or hung: every rank stops now */
        exit(cli_dist_end(d, CLI_FAIL));
    }
    return any > 0;
}

int cli_dist_end(dm_dist *d, int rc) {
    /* 130: every rank stopped after the same step (cli_dist_interrupted), none waits */
    if (rc != 0 && rc != 130 && dm_dist_size(d) > 1) {
        fflush(stdout);
        fflush(stderr);
        dm_dist_abort(d, rc);
    }
    dm_dist_finish(d);
    return rc;
}

void cli_dist_header(FILE *info, dm_dist *d, int64_t batch, int zero) {
    const int n = dm_dist_size(d);
    if (n < 2) return;
    fprintf(info, "  data-parallel: %d ranks over MPI, each b=%" PRId64 " of a global batch of %" PRId64 "; the gradients "
                  "summed over the ranks as the backward pass produces them%s\n", n, batch, batch * n,
            zero ? "; the optimizer's moments sharded over the ranks (ZeRO 1)" : "");
}

void cli_dist_summary(FILE *out, dm_dist *d, const dm_trainer *t, double steps) {
    if (dm_dist_size(d) < 2 || steps <= 0) return;
    double busy, exposed;
    dm_trainer_reduce_times(t, &busy, &exposed);
    fprintf(out, "gradient sums over %d ranks: %.1f ms/step at work, %.1f ms/step waited for after the backward "
                 "pass (%.0f%% hidden behind it)\n", dm_dist_size(d), 1e3 * busy / steps, 1e3 * exposed / steps,
            busy > 0 ? 100.0 * (1.0 - (exposed < busy ? exposed : busy) / busy) : 100.0);
}
