/* cli_common.c: strict option parsing, the shared layer configuration options and their
 * help, a monotonic clock and a deterministic normal RNG for the dmove subcommands. */
#include "cli_common.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static void vreport(const char *cmd, const char *fmt, va_list ap) {
    fprintf(stderr, "dmove %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

void cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vreport(cmd, fmt, ap);
    va_end(ap);
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
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
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

/* ------------------------------------------------------------------------------------- */

static const char *const k_size_opt[5] = {"--batch", "--seq", "--hidden", "--heads", "--ffn"};

void cli_config_init(cli_config *c, unsigned accept) {
    memset(c, 0, sizeof *c);
    c->accept = accept;
    dm_layer_config_default(&c->cfg);
}

int cli_config_option(cli_config *c, const char *cmd, int argc, char **argv, int *i) {
    const char *v = NULL;
    int r;
    if (c->accept & CLI_CFG_SIZES) {
        if ((r = cli_opt(cmd, argc, argv, i, "--preset", &v)) != 0) {
            if (r < 0) return -1;
            dm_layer_config scratch;
            dm_layer_config_default(&scratch);
            if (dm_layer_config_preset(&scratch, v) != DM_OK) {
                cli_usage_error(cmd, "--preset: unknown preset '%s' (known: bert-base, "
                                "bert-large)", v);
                return -1;
            }
            c->preset = v;
            return 1;
        }
    }
    for (int k = 0; k < 5; k++) {
        unsigned need = k == 3 ? CLI_CFG_HEADS : CLI_CFG_SIZES;
        if (!(c->accept & need)) continue;
        if ((r = cli_opt(cmd, argc, argv, i, k_size_opt[k], &v)) != 0) {
            if (r < 0) return -1;
            /* Only the lower bound here: dm_layer_config_check judges what is too large
             * (overflow, memory) with a message that says why. */
            if (cli_parse_i64(cmd, k_size_opt[k], v, 1, INT64_MAX, &c->size[k])) return -1;
            c->size_set[k] = 1;
            return 1;
        }
    }
    if (c->accept & CLI_CFG_TRAIN) {
        if ((r = cli_opt(cmd, argc, argv, i, "--dropout", &v)) != 0) {
            if (r < 0 || cli_parse_double(cmd, "--dropout", v, &c->dropout)) return -1;
            if (!(c->dropout >= 0.0 && c->dropout < 1.0)) {
                cli_usage_error(cmd, "--dropout: %s is outside [0, 1): p is the probability of "
                                "dropping an element (0 turns dropout off)", v);
                return -1;
            }
            c->dropout_set = 1;
            return 1;
        }
        if ((r = cli_opt(cmd, argc, argv, i, "--eps", &v)) != 0) {
            if (r < 0 || cli_parse_double(cmd, "--eps", v, &c->eps)) return -1;
            if (!(c->eps > 0.0)) {
                cli_usage_error(cmd, "--eps: %s must be positive (LayerNorm adds it to the "
                                "variance)", v);
                return -1;
            }
            c->eps_set = 1;
            return 1;
        }
        if ((r = cli_opt(cmd, argc, argv, i, "--seed", &v)) != 0) {
            if (r < 0 || cli_parse_u64(cmd, "--seed", v, &c->seed)) return -1;
            c->seed_set = 1;
            return 1;
        }
        if ((r = cli_opt(cmd, argc, argv, i, "--act", &v)) != 0) {
            if (r < 0) return -1;
            if (dm_act_parse(v, &c->act) != DM_OK) {
                cli_usage_error(cmd, "--act: unknown activation '%s' (known: gelu, gelu_tanh, "
                                "relu)", v);
                return -1;
            }
            c->act_set = 1;
            return 1;
        }
    }
    if (c->accept & CLI_CFG_ARCH) {
        if ((r = cli_opt(cmd, argc, argv, i, "--norm", &v)) != 0) {
            if (r < 0) return -1;
            if (dm_norm_parse(v, &c->norm) != DM_OK) {
                cli_usage_error(cmd, "--norm: unknown LayerNorm placement '%s' (known: post, as BERT; pre, "
                                "LayerNorm on the inputs of attention and feed-forward)", v);
                return -1;
            }
            c->norm_set = 1;
            return 1;
        }
        /* --causal, or --causal=0 / --causal=1 (0: bidirectional, over what a file's
         * metadata says) */
        if (!strncmp(argv[*i], "--causal=", 9)) {
            const char *x = argv[*i] + 9;
            if (strcmp(x, "0") != 0 && strcmp(x, "1") != 0) {
                cli_usage_error(cmd, "--causal takes no value, or 0 or 1 (got '%s')", argv[*i]);
                return -1;
            }
            c->causal = x[0] == '1';
            c->causal_set = 1;
            return 1;
        }
        if ((r = cli_flag(cmd, argv, *i, "--causal")) != 0) {
            if (r < 0) return -1;
            c->causal = 1;
            c->causal_set = 1;
            return 1;
        }
    }
    if (c->accept & CLI_CFG_THREADS) {
        if ((r = cli_opt(cmd, argc, argv, i, "--threads", &v)) != 0) {
            if (r < 0 || cli_parse_int(cmd, "--threads", v, 0, 4096, &c->threads)) return -1;
            long cores = sysconf(_SC_NPROCESSORS_ONLN);
            if (cores > 0 && c->threads > cores)
                fprintf(stderr, "dmove %s: note: --threads %d is more than the %ld cores online: threads "
                        "will take turns on the cores, which slows every parallel part\n", cmd, c->threads,
                        cores);
            return 1;
        }
    }
    return 0;
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

int cli_device_option(const char *cmd, int argc, char **argv, int *i, dm_device_kind *dev,
                      dm_dtype *dtype, dm_rows *rows, int *streams) {
    const char *v = NULL;
    int r;
    if ((r = cli_opt(cmd, argc, argv, i, "--streams", &v)) != 0) {
        if (r < 0) return -1;
        if (strcmp(v, "1") != 0 && strcmp(v, "2") != 0) {
            cli_usage_error(cmd, "--streams: '%s' is not 1 or 2", v);
            return -1;
        }
        *streams = v[0] - '0';
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--rows", &v)) != 0) {
        if (r < 0) return -1;
        if (dm_rows_parse(v, rows) != DM_OK) {
            cli_usage_error(cmd, "--rows: unknown row kernels '%s' (known: interp, gen, auto)", v);
            return -1;
        }
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--device", &v)) != 0) {
        if (r < 0) return -1;
        if (dm_device_kind_parse(v, dev) != DM_OK) {
            cli_usage_error(cmd, "--device: unknown device '%s' (known: cpu, cuda)", v);
            return -1;
        }
        return 1;
    }
    if ((r = cli_opt(cmd, argc, argv, i, "--dtype", &v)) != 0) {
        if (r < 0) return -1;
        if (dm_dtype_parse(v, dtype) != DM_OK) {
            cli_usage_error(cmd, "--dtype: unknown storage type '%s' (known: fp32, bf16, fp16)", v);
            return -1;
        }
        return 1;
    }
    return 0;
}

void cli_device_help(FILE *out) {
    fprintf(out,
            "  --device D       cpu (default) or cuda: where the steps run (cuda needs a\n"
            "                   dmove built with nvcc, and a GPU)\n"
            "  --dtype T        how the GPU stores tensors: fp32 (default), bf16 or fp16;\n"
            "                   arithmetic and accumulation stay fp32 (cuda only)\n"
            "  --rows K         how the GPU runs the fused element-wise and normalization\n"
            "                   groups: interp (one kernel interprets every group), gen (a\n"
            "                   kernel generated per group, compiled by NVRTC when the\n"
            "                   layer is made; with bf16/fp16 storage, attention's groups\n"
            "                   also fused into one tensor-core kernel each) or auto (the\n"
            "                   default: both measured per group when the layer is made,\n"
            "                   the faster kept); cuda only; DMOVE_CUDA_ROWS sets the\n"
            "                   default (interp when emulated, DMOVE_CUDA_EMULATE=1)\n"
            "  --streams N      2 (default) or 1: run the weight and bias gradients on a\n"
            "                   second CUDA stream, overlapping the groups after them\n"
            "                   (cuda only; DMOVE_CUDA_STREAMS sets the default; 1 when\n"
            "                   emulated)\n");
}

const char *cli_emulated_note(dm_device_kind dev) {
    const char *e = getenv("DMOVE_CUDA_EMULATE");
    return dev == DM_DEVICE_CUDA && e && !strcmp(e, "1") ? ", emulated on the host by DMOVE_CUDA_EMULATE=1" : "";
}

void cli_recompute_help(FILE *out, const char *scope) {
    fprintf(out,
            "  --recompute      recompute attention's probabilities in the backward pass\n"
            "                   instead of keeping them from the forward (Q K^T, mask,\n"
            "                   softmax and dropout again, inside the backward attention\n"
            "                   group): the same numbers (to rounding, with a tuned plan),\n"
            "                   2 b h j^2 floats less memory\n"
            "                   (%s)\n", scope);
}

void cli_config_help(FILE *out, unsigned accept) {
    dm_layer_config d, base, large;
    dm_layer_config_default(&d);
    base = d;
    large = d;
    int have_base = dm_layer_config_preset(&base, "bert-base") == DM_OK;
    int have_large = dm_layer_config_preset(&large, "bert-large") == DM_OK;
    if (accept & CLI_CFG_SIZES) {
        fprintf(out, "  --preset NAME    sizes of a known model (default bert-base):\n");
        if (have_base)
            fprintf(out, "                     bert-base:  b=%" PRId64 " j=%" PRId64 " i=%" PRId64
                         " h=%" PRId64 " u=%" PRId64 "\n",
                    base.batch, base.seq, base.hidden, base.heads, base.ffn);
        if (have_large)
            fprintf(out, "                     bert-large: b=%" PRId64 " j=%" PRId64 " i=%" PRId64
                         " h=%" PRId64 " u=%" PRId64 "\n",
                    large.batch, large.seq, large.hidden, large.heads, large.ffn);
        fprintf(out,
                "  --batch B        sequences per batch, b (overrides the preset)\n"
                "  --seq J          tokens per sequence, j\n"
                "  --hidden I       embedding width, i (divisible by the heads)\n");
    }
    if (accept & CLI_CFG_HEADS)
        fprintf(out, "  --heads H        attention heads, h (i %% h must be 0)\n");
    if (accept & CLI_CFG_SIZES)
        fprintf(out, "  --ffn U          feed-forward width, u\n");
    if (accept & CLI_CFG_TRAIN)
        fprintf(out,
                "  --dropout P      dropout probability of all three dropouts, in [0, 1)\n"
                "                   (default %g; 0 turns dropout off)\n"
                "  --seed S         dropout seed, an unsigned 64-bit integer (default %" PRIu64
                ");\n"
                "                   the same seed gives the same masks on every run\n"
                "  --act A          FFN activation: gelu (exact erf), gelu_tanh or relu\n"
                "                   (default %s)\n"
                "  --eps E          LayerNorm epsilon (default %g)\n",
                d.dropout, d.seed, dm_act_name(d.act), d.eps);
    if (accept & CLI_CFG_ARCH)
        fprintf(out,
                "  --norm N         where the LayerNorms sit: post (default; BERT: after each\n"
                "                   residual add) or pre (on the inputs of attention and the\n"
                "                   feed-forward block, residuals bypassing them: GPT-2,\n"
                "                   nn.TransformerEncoderLayer(norm_first=True))\n"
                "  --causal         each token attends to itself and the tokens before it only\n"
                "                   (a decoder's mask, on top of attention_mask); --causal=0:\n"
                "                   all tokens (the default), over a file's metadata\n");
    if (accept & CLI_CFG_THREADS)
        fprintf(out, "  --threads N      threads to use (default 0: all cores)\n");
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
