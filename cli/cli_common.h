/* cli_common.h: what the dmove subcommands share: strict option parsing (every error names
 * the option and the bad value), the layer configuration options (--preset, sizes, dropout,
 * seed, activation, eps, threads) with their help text, a clock and a small RNG. */
#ifndef DM_CLI_COMMON_H
#define DM_CLI_COMMON_H

#include <stdint.h>
#include <stdio.h>

#include "dmove.h"

/* Exit codes of every subcommand. */
enum { CLI_OK = 0, CLI_FAIL = 1, CLI_USAGE = 2 };

/* Subcommands: argv[0] is the subcommand's name. */
int cmd_layer(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_example(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_probe(int argc, char **argv);

/* "dmove <cmd>: <message>" on stderr. */
void cli_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* A usage error: the message, then "run 'dmove <cmd> --help' ..." on stderr. */
void cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Matches argv[*i] against option `name` ("--seed"), as "--seed V" or "--seed=V".
 * Returns 1 and sets *val (advancing *i past a separate value), 0 if argv[*i] is another
 * option, -1 after a usage error (value missing). */
int cli_opt(const char *cmd, int argc, char **argv, int *i, const char *name, const char **val);
/* Checks before any work that `path` can be written: not a directory, its directory
 * exists and takes new files. 0 ok, else the exit code after the error is printed
 * (naming `opt`): CLI_USAGE for no name or a directory, CLI_FAIL for the rest. */
int cli_check_output(const char *cmd, const char *opt, const char *path);
/* Matches a flag (no value); "--json=x" is a usage error (-1). */
int cli_flag(const char *cmd, char **argv, int i, const char *name);
/* The end of an option loop, where `arg` matched nothing: "unknown option" (it starts
 * with '-') or "unexpected argument" with `hint` after it (e.g. where files go; "" for
 * none) as a usage error. Returns CLI_USAGE. */
int cli_unknown(const char *cmd, const char *arg, const char *hint);

/* Strict parsers: the whole string, no spaces, range checked. 0 ok, -1 after a usage error
 * naming the option and the value. */
int cli_parse_i64(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi,
                  int64_t *out);
int cli_parse_int(const char *cmd, const char *opt, const char *s, int lo, int hi, int *out);
int cli_parse_u64(const char *cmd, const char *opt, const char *s, uint64_t *out);
int cli_parse_double(const char *cmd, const char *opt, const char *s, double *out);

/* The layer configuration options. `accept` says which a subcommand takes. */
enum {
    CLI_CFG_SIZES = 1,   /* --preset --batch --seq --hidden --ffn */
    CLI_CFG_HEADS = 2,   /* --heads */
    CLI_CFG_TRAIN = 4,   /* --dropout --seed --act --eps */
    CLI_CFG_THREADS = 8, /* --threads */
    CLI_CFG_ARCH = 16,   /* --norm --causal */
    CLI_CFG_ALL = 31
};

typedef struct {
    unsigned accept;
    const char *preset; /* NULL: the default (bert-base) */
    int64_t size[5];    /* batch seq hidden heads ffn, as given */
    int size_set[5];
    double dropout, eps;
    int dropout_set, eps_set, act_set, seed_set, norm_set, causal_set;
    dm_act act;
    dm_norm norm;
    int causal;
    uint64_t seed;
    int threads; /* 0: all cores */
    dm_layer_config cfg; /* filled by cli_config_finish */
} cli_config;

void cli_config_init(cli_config *c, unsigned accept);
/* Tries argv[*i] as a configuration option: 1 consumed, 0 not one, -1 usage error. */
int cli_config_option(cli_config *c, const char *cmd, int argc, char **argv, int *i);
/* Builds c->cfg: defaults, then the preset, then each size given, then the rest; checks it
 * with dm_layer_config_check unless check == 0. 0 ok, -1 after printing the error. */
int cli_config_finish(cli_config *c, const char *cmd, int check);
/* The layer variant in words for the headers ("", ", pre-LN", ", causal", ", pre-LN,
 * causal"): BERT's post-LN bidirectional layer says nothing. */
const char *cli_variant(const dm_layer_config *cfg);
/* The help lines of the accepted configuration options, with their defaults. */
void cli_config_help(FILE *out, unsigned accept);

/* --device D, --dtype T, --rows K and --streams N, shared by the commands that run steps: 1 consumed, 0 not one,
 * -1 usage error (printed). cli_device_help prints their help lines. */
int cli_device_option(const char *cmd, int argc, char **argv, int *i, dm_device_kind *dev,
                      dm_dtype *dtype, dm_rows *rows, int *streams);
void cli_device_help(FILE *out);
/* ", emulated on the host by DMOVE_CUDA_EMULATE=1" when --device cuda runs emulated (the
 * tests' setting: its times are not a GPU's), else "". */
const char *cli_emulated_note(dm_device_kind dev);
/* The help lines of --recompute (layer, bench, tune, train), ending with `scope` in
 * parentheses: where it applies. */
void cli_recompute_help(FILE *out, const char *scope);
/* The layer options together, as the library checks them before any work (bf16/fp16,
 * --rows and --streams need --device cuda; --recompute the fused schedule): 0 ok, -1
 * after a usage error. */
int cli_options_check(const char *cmd, const dm_layer_options *o);

double cli_now(void); /* monotonic seconds */
int cli_threads(int threads); /* --threads as run: 0 resolves to all cores (OpenMP's count) */

/* Deterministic generator: splitmix64 words, and N(0,1) by Box-Muller. */
typedef struct {
    uint64_t s;
    int have;
    double spare;
} cli_rng;
void cli_rng_seed(cli_rng *r, uint64_t seed);
uint64_t cli_rng_u64(cli_rng *r);
double cli_rng_normal(cli_rng *r);

#endif
