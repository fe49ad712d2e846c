/* cli_common.h: what the dmove subcommands share: option tables from which both the
 * parsing (strict: every error names the option and the bad value) and the help are made,
 * the layer configuration and device options, a clock and a small RNG. The CLI includes
 * only the public headers (dmove.h, dmove_tools.h). */
#ifndef DM_CLI_COMMON_H
#define DM_CLI_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dmove.h"
#include "dmove_tools.h"

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
int cmd_tokenize(int argc, char **argv);
int cmd_prepare(int argc, char **argv);
int cmd_batches(int argc, char **argv);
int cmd_pretrain(int argc, char **argv);
int cmd_embed(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_finetune(int argc, char **argv);

/* --tokenizer FILE with --lowercase / --cased (a vocab.txt) or neither (a tokenizer.json):
 * CLI_OK with *out loaded, else the exit status after the error (cmd_prepare.c). */
struct dm_tokenizer;
int cli_open_tokenizer(const char *cmd, const char *path, int lowercase, int cased, struct dm_tokenizer **out);
/* Where the tokenizer is when --tokenizer is not given: the directory of --init's model (the
 * directory itself, or the one holding its weights file), written into buf; NULL without
 * --init, or with errno set when --init cannot be found. */
const char *cli_init_tokenizer(const char *init, char *buf, size_t n);

/* "dmove <cmd>: <message>" on stderr. */
void cli_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* The library's last message after `what` ("--data: "), as cli_error prints it: CLI_FAIL. */
int cli_fail_dm(const char *cmd, const char *what);
/* The directory path lies in ("." for a bare name, "/" at the root), into buf; returns buf. */
const char *cli_parent_dir(const char *path, char *buf, size_t n);
/* s for a message: whole when it fits buf (n bytes), else cut at a UTF-8 character's
 * start and ended with "..."; returns buf. */
const char *cli_short(const char *s, char *buf, size_t n);
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

/* --- Option tables ---------------------------------------------------------------------
 * A command declares its options once, in a table: each option's name, the kind of its
 * argument, where the value goes (an offset into the command's options struct), its
 * checks and its help text. cli_parse parses argv with it and cli_help prints the help
 * from it, in the table's order. A help text's lines after the first are indented under
 * it; "{}" in it is the option's default (its target's value in a freshly initialised
 * options struct), "{}" after the first the defaults of the entries after it that have no
 * help of their own (options documented together); "%%" is "%". */
typedef enum {
    CLI_END = 0, /* ends a table */
    CLI_FLAG,    /* no value: the int target takes `lo` */
    CLI_STR,     /* const char *target */
    CLI_PATH,    /* const char *target, not empty ("--x: empty file name") */
    CLI_INT,     /* int target in [lo, hi] */
    CLI_I64,     /* int64_t target in [lo, hi] */
    CLI_U64,     /* uint64_t target */
    CLI_DOUBLE,  /* double target */
    CLI_CHOICE,  /* int target: the value of the word given, else the usage error `msg` */
    CLI_CALL,    /* fn parses the value itself; with no `arg` it takes "name" and "name=..." */
    CLI_GROUP,   /* the options of table `group` selected by `mask`, their targets in the
                  * struct at offset `off` */
    CLI_TEXT,    /* help lines only, printed as they are */
    CLI_HELP,    /* --help and -h: the help on stdout, exit status 0 */
    CLI_REJECT   /* the usage error `msg` ('%s': the name), for "name" and "name=..." */
} cli_kind;

typedef struct {
    const char *word;
    int value;
} cli_choice;

typedef struct cli_option {
    cli_kind kind;
    const char *name;
    const char *arg;           /* the value's name in the help ("L"); NULL for a flag */
    size_t off;                /* the target: its offset in the options struct */
    size_t set;                /* 1 + the offset of an int set to 1 when the option is given; 0 none */
    int64_t lo, hi;            /* CLI_INT, CLI_I64: the range; CLI_FLAG: the value */
    const cli_choice *choices; /* CLI_CHOICE: ends with a NULL word */
    const char *msg;           /* CLI_CHOICE, CLI_REJECT: the usage error */
    /* CLI_CALL: parses val (NULL for a flag; raw: the argument as given) into the struct at
     * base; other kinds: a check after the value is stored. 0 ok, -1 after a usage error. */
    int (*fn)(void *base, const char *cmd, const char *val, const char *raw);
    /* CLI_CALL: the default for "{}" as text */
    const char *(*show)(const void *target, char *buf, size_t n);
    const struct cli_option *group; /* CLI_GROUP */
    unsigned mask;             /* CLI_GROUP: the options to take; an option: its bits (0: always) */
    const char *left;          /* the help's left column instead of "name arg" */
    const char *help;          /* NULL: documented by the entry before it */
    void (*help_fn)(FILE *out, const void *base); /* the help lines instead of `help` */
} cli_option;

/* A command: its help before and after the options, its table, and the hint after
 * "unexpected argument 'x'". init fills the options struct (size bytes) with the
 * defaults before parsing, and for the help. */
typedef struct {
    const char *name;
    const char *head, *foot;
    const cli_option *options;
    const char *hint;
    size_t size;
    void (*init)(void *opts);
} cli_command;

enum { CLI_GO = -1 };
/* Parses argv[1 .. argc) into opts (initialised here): CLI_GO when the command goes on,
 * else its exit status (CLI_OK after --help, CLI_USAGE after a usage error). */
int cli_parse(const cli_command *c, void *opts, int argc, char **argv);
/* Tries argv[*i] against a table (the options of `mask`): 1 consumed, 0 not one, -1 usage
 * error. */
int cli_parse_one(const cli_option *table, unsigned mask, void *opts, const char *cmd, int argc, char **argv,
                  int *i);
void cli_help(const cli_command *c, FILE *out);

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
    double dropout, eps; /* as given, else the defaults */
    int dropout_set, eps_set, act_set, seed_set, norm_set, causal_set;
    dm_act act;
    dm_norm norm;
    int causal;
    uint64_t seed;
    int threads; /* 0: all cores */
    dm_layer_config cfg; /* filled by cli_config_finish */
} cli_config;

/* The configuration options' table (the struct: a cli_config), for a CLI_GROUP entry. */
extern const cli_option cli_config_options[];
/* The configuration options' group entry: the cli_config at `field` of `type`, the
 * options of mask. */
#define CLI_CONFIG(type, field, m) {.kind = CLI_GROUP, .off = offsetof(type, field), .group = cli_config_options, .mask = (m)}

void cli_config_init(cli_config *c, unsigned accept);
/* Tries argv[*i] as a configuration option of c->accept: 1 consumed, 0 not one, -1 usage
 * error. */
int cli_config_option(cli_config *c, const char *cmd, int argc, char **argv, int *i);
/* Builds c->cfg: defaults, then the preset, then each size given, then the rest; checks it
 * with dm_layer_config_check unless check == 0. 0 ok, -1 after printing the error. */
int cli_config_finish(cli_config *c, const char *cmd, int check);
/* The layer variant in words for the headers ("", ", pre-LN", ", causal", ", pre-LN,
 * causal"): BERT's post-LN bidirectional layer says nothing. */
const char *cli_variant(const dm_layer_config *cfg);

/* The optimizer and its schedule (--lr, --warmup, --lr-schedule, --power, --lr-end,
 * --optimizer, --clip-norm, --accumulate, --weight-decay, --beta1, --beta2, --adam-eps,
 * --zero), shared by train, pretrain and finetune. */
typedef struct {
    dm_optim_config optim;
    int schedule; /* --lr-schedule: 0 constant, 1 linear, 2 poly */
    int zero;     /* --zero: ZeRO stage (0, 1) under mpirun (dm_trainer_set_zero) */
} cli_optim;
extern const cli_option cli_optim_options[];
#define CLI_OPTIM(type, field) {.kind = CLI_GROUP, .off = offsetof(type, field), .group = cli_optim_options}
void cli_optim_init(cli_optim *o);
/* After parsing: the decay's last step (steps) and the checks. 0 ok, else CLI_USAGE after
 * the message. */
int cli_optim_finish(cli_optim *o, const char *cmd, int64_t steps);

/* A run's Ctrl-C, SIGTERM and SIGHUP (unless started ignoring it: nohup): the first sets
 * cli_interrupted() (the signal) and says the step under way ends (and, saving, the
 * checkpoint is written); a second ends the process at once, the files it was writing
 * removed (the old ones stay). SIGPIPE is ignored: a closed stdout ends the printing, not
 * the run. */
void cli_catch_signals(const char *cmd, int saving);
int cli_interrupted(void);
/* The files of a run, by option: what it reads and what it writes. A written path that is
 * also read, or written twice (the same file, through links or another spelling too), or
 * an existing directory where a file is written (dir 0), is refused before any work:
 * CLI_USAGE after the message; else 0. NULL paths are skipped. */
typedef struct {
    const char *opt;  /* "--save" */
    const char *path;
    int dir;          /* a directory is read or written (--data DIR, --export DIR) */
    const char *same_ok; /* a read: the write that may name it (--resume C --save C) */
} cli_path;
int cli_check_paths(const char *cmd, const cli_path *reads, int nreads, const cli_path *writes, int nwrites);

/* --- data parallelism (mpirun -np N dmove train|pretrain ...) ---
 * cli_dist_start: joins the MPI launch this process is part of (dm_dist_start; alone
 * without one); with several ranks, checks that every rank runs the same dmove with the
 * same options of command c's table (as parsed: order, "--x=v" and the spelling of a
 * number do not matter; --threads, --log-every and --json may differ per rank; refused
 * naming the option, the rank and the values), and makes the ranks past
 * 0 quiet: their messages start "rank r:", their progress (cli_dist_info) goes nowhere.
 * 0 ok, else the exit status after the message.
 * cli_dist_info: `info` on rank 0, a sink on the others.
 * cli_dist_interrupted: 1 when any rank was interrupted (a collective: every rank asks at
 * the same step, and they stop together).
 * cli_dist_end: rc returned; a failure with several ranks first stops the others
 * (MPI_Abort: none waits for a rank that left), else (also 130: interrupted, every rank
 * after the same step) MPI is finalised. */
int cli_dist_start(const char *cmd, const cli_command *c, int argc, char **argv, dm_dist **out);
FILE *cli_dist_info(FILE *info);
int cli_dist_interrupted(dm_dist *d);
int cli_dist_end(dm_dist *d, int rc);
/* With several ranks: the header's line on them (batch: each rank's; zero: --zero), and the summary's
 * on the gradient sums (their time per step, busy and exposed; `steps` the steps run);
 * alone, nothing. */
void cli_dist_header(FILE *info, dm_dist *d, int64_t batch, int zero);
void cli_dist_summary(FILE *out, dm_dist *d, const dm_trainer *t, double steps);

/* Flushes stdout at the end of a run: CLI_OK, or CLI_FAIL with a message when the output
 * could not be written (a full disk); a reader that went away (EPIPE: dmove train | head)
 * is not a failure of the run, whose files are complete: a note on stderr, CLI_OK. */
int cli_finish_stdout(const char *cmd);

/* The layer sizes, eps, activation and dropout of a Hugging Face config (read from
 * `source`, given by option `opt`) into c: a --preset, or a size, --eps or --act that
 * contradicts it, is a usage error; --dropout may differ (a training choice). 0 ok, else
 * the exit status after the message. */
int cli_config_from_hf(cli_config *c, const char *cmd, const char *opt, const char *source, const dm_hf_config *hc);

/* --device D, --dtype T, --rows K and --streams N, shared by the commands that run steps. */
typedef struct {
    dm_device_kind device;
    dm_dtype dtype;
    dm_rows rows;
    int streams;
} cli_device;
extern const cli_option cli_device_options[];
#define CLI_DEVICE(type, field) {.kind = CLI_GROUP, .off = offsetof(type, field), .group = cli_device_options}

/* ", emulated on the host by DMOVE_CUDA_EMULATE=1" (or =lanes) when --device cuda runs
 * emulated (the tests' setting: its times are not a GPU's), else "". */
const char *cli_emulated_note(dm_device_kind dev);
/* Where a command's steps run, for its header, into buf (n bytes): "on the GPU (bf16
 * storage)" (with cli_emulated_note's words), or "N thread(s)" on the CPU. Returns buf. */
const char *cli_device_where(char *buf, size_t n, dm_device_kind dev, dm_dtype dtype, int threads);
/* The layer options of a model command (pretrain, finetune, embed): the device group's,
 * the threads, unpadded or not. */
dm_layer_options cli_device_layer_options(const cli_device *d, int threads, int unpad);
/* The help of --recompute (layer, bench, tune, train), ending with `scope` in parentheses:
 * where it applies. */
#define CLI_RECOMPUTE_HELP(scope)                                                          \
    "recompute attention's probabilities in the backward pass\n"                           \
    "instead of keeping them from the forward (Q K^T, mask,\n"                              \
    "softmax and dropout again, inside the backward attention\n"                           \
    "group): the same numbers (to rounding, with a tuned plan),\n"                         \
    "2 b h j^2 floats less memory\n"                                                       \
    "(" scope ")"
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
