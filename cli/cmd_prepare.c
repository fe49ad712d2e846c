/* cmd_prepare.c: `dmove prepare`: text files -> a dataset directory of token shards
 * (dm_prepare), with a progress bar on stderr and a summary; and the tokenizer loading
 * (--tokenizer, --lowercase / --cased) `dmove batches` shares. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_common.h"
#include "dmove_data.h"
#include "dmove_text.h"

static const char *const CMD = "prepare";

const char *cli_init_tokenizer(const char *init, char *buf, size_t n) {
    if (!init) return NULL;
    struct stat sb;
    if (stat(init, &sb) != 0) return NULL;
    if (!S_ISDIR(sb.st_mode)) return cli_parent_dir(init, buf, n);
    snprintf(buf, n, "%s", init);
    return buf;
}

int cli_open_tokenizer(const char *cmd, const char *path, int lowercase, int cased, struct dm_tokenizer **out) {
    *out = NULL;
    if (!path || !*path) {
        cli_usage_error(cmd, "--tokenizer FILE is required (a tokenizer.json, or a vocab.txt with --lowercase "
                        "or --cased)");
        return CLI_USAGE;
    }
    if (lowercase && cased) {
        cli_usage_error(cmd, "--lowercase and --cased exclude each other");
        return CLI_USAGE;
    }
    dm_case c = lowercase ? DM_CASE_LOWER : cased ? DM_CASE_CASED : DM_CASE_FILE;
    dm_status st = dm_tokenizer_load(out, path, c);
    if (st == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "its casing: ")) { /* the flags that say it */
        cli_usage_error(cmd, "%s: %s", dm_last_error(),
                        c == DM_CASE_FILE ? "give --lowercase or --cased" : "leave out --lowercase/--cased");
        return CLI_USAGE;
    }
    if (st != DM_OK) {
        cli_error(cmd, "%s", dm_last_error());
        return CLI_FAIL;
    }
    return CLI_OK;
}

typedef struct {
    const char *tokenizer, *out;
    int lowercase, cased, doc_per_file, force, quiet, threads;
    double valid_fraction;
    int64_t shard_mb;
    uint64_t seed;
} prepare_opts;

static void init(void *p) {
    prepare_opts *o = p;
    o->shard_mb = 128;
    o->seed = 1;
}

#define O(field) .off = offsetof(prepare_opts, field)
static const cli_option k_options[] = {
    {.kind = CLI_PATH, .name = "--tokenizer", .arg = "FILE", O(tokenizer),
     .help = "the model's tokenizer: a Hugging Face tokenizer.json (WordPiece),\n"
             "a vocab.txt with --lowercase or --cased, or the model's\n"
             "directory (its tokenizer.json, else its vocab.txt) (required)"},
    {.kind = CLI_FLAG, .name = "--lowercase", O(lowercase), .lo = 1, .left = "--lowercase, --cased",
     .help = "how a vocab.txt normalizes (BertTokenizerFast's do_lower_case)"},
    {.kind = CLI_FLAG, .name = "--cased", O(cased), .lo = 1},
    {.kind = CLI_PATH, .name = "--out", .arg = "DIR", O(out),
     .help = "the dataset directory to write (required): dataset.json,\n"
             "train-00000.shard ..., valid.shard; made under a temporary\n"
             "name and renamed at the end, nothing left on an error"},
    {.kind = CLI_DOUBLE, .name = "--valid-fraction", .arg = "F", O(valid_fraction),
     .help = "hold out this fraction of the documents (0 .. 0.5) in\n"
             "valid.shard, drawn by --seed (default {})"},
    {.kind = CLI_FLAG, .name = "--doc-per-file", O(doc_per_file), .lo = 1,
     .help = "a file is a document (default: a block of lines between\n"
             "blank lines is one; a line is always a sentence)"},
    {.kind = CLI_I64, .name = "--shard-mb", .arg = "N", O(shard_mb), .lo = 1, .hi = 1 << 20,
     .help = "start a new training shard after N MiB (default {})"},
    {.kind = CLI_INT, .name = "--threads", .arg = "N", O(threads), .lo = 0, .hi = 4096,
     .help = "tokenizer threads (default {}: all cores)"},
    {.kind = CLI_U64, .name = "--seed", .arg = "S", O(seed), .help = "which documents are held out (default {})"},
    {.kind = CLI_FLAG, .name = "--force", O(force), .lo = 1,
     .help = "replace a dataset already in --out (another non-empty\n"
             "directory is never touched)"},
    {.kind = CLI_FLAG, .name = "--quiet", O(quiet), .lo = 1, .help = "no progress bar"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};
#undef O

static const cli_command k_prepare = {
    .name = "prepare",
    .head = "usage: dmove prepare --tokenizer FILE --out DIR [options] TEXT...\n"
            "\n"
            "Tokenizes UTF-8 text files (- for standard input) into token shards for\n"
            "pretraining: a line is a sentence, a blank line (or a file's end) ends a\n"
            "document, as BERT's data has it (blank: whitespace alone, Unicode's too, as\n"
            "Python's str.strip() sees it).\n"
            "No special tokens are added here; the loader (dmove batches, the trainer) adds\n"
            "[CLS] and [SEP] when it builds sequences. The shards record the tokenizer's hash:\n"
            "a model with another vocabulary refuses them.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "Invalid UTF-8 stops it, naming the file and byte offset. A progress bar (MB/s,\n"
            "time left) goes to stderr, a summary (documents, tokens, unknown-token rate) to\n"
            "stdout.\n"
            "\n"
            "exit status: 0 success, 1 runtime error (bad input: nothing written), 2 usage error\n"
            "\n"
            "examples:\n"
            "  dmove prepare --tokenizer bert-base-uncased/tokenizer.json --out data books/*.txt\n"
            "  dmove prepare --tokenizer vocab.txt --lowercase --valid-fraction 0.01 --out data \\\n"
            "      --doc-per-file wiki/*.txt\n"
            "  dmove batches --data data --tokenizer vocab.txt --lowercase --show 2\n",
    .options = k_options,
    .hint = " (text files come after the options)",
    .size = sizeof(prepare_opts),
    .init = init,
};

typedef struct {
    int tty, drawn;
    double last;
} bar_state;

static void fmt_time(char *buf, size_t n, double s) {
    if (!(s >= 0) || s > 360000) snprintf(buf, n, "--:--");
    else if (s >= 3600) snprintf(buf, n, "%d:%02d:%02d", (int)s / 3600, (int)s / 60 % 60, (int)s % 60);
    else snprintf(buf, n, "%d:%02d", (int)s / 60, (int)s % 60);
}

static void progress(void *ctx, const dm_prepare_progress *p) {
    bar_state *b = ctx;
    int end = p->bytes_total && p->bytes_done >= p->bytes_total; /* a bar ends full */
    if (p->seconds < 0.5 || (p->seconds - b->last < (b->tty ? 0.2 : 5.0) && !(end && b->tty && b->drawn)))
        return;
    b->last = p->seconds;
    double frac = p->bytes_total ? (double)p->bytes_done / (double)p->bytes_total : 0; /* pipes: 0 */
    if (frac > 1) frac = 1;
    double mbs = (double)p->bytes_done / 1e6 / p->seconds;
    char left[32];
    fmt_time(left, sizeof left, frac > 0 ? p->seconds * (1 - frac) / frac : -1);
    if (b->tty) {
        char bar[31];
        int full = (int)(frac * 30);
        for (int k = 0; k < 30; k++) bar[k] = k < full ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r  [%s] %5.1f%%  %7.1f MB/s  %s left  %" PRIu64 " tokens   ", bar, 100 * frac, mbs,
                left, p->tokens);
        b->drawn = 1;
    } else {
        fprintf(stderr, "dmove prepare: %.1f%% (%.1f of %.1f MB), %.1f MB/s, %s left\n", 100 * frac,
                (double)p->bytes_done / 1e6, (double)p->bytes_total / 1e6, mbs, left);
    }
    fflush(stderr);
}

static void print_split(const char *name, const dm_shard_info *in, size_t shards) {
    printf("  %s: %" PRIu64 " documents, %" PRIu64 " sentences, %" PRIu64 " tokens, %" PRIu64
           " unknown (%.3f%%), %zu shard%s, %.1f MB\n", name, in->documents, in->sentences, in->tokens,
           in->unknown, in->tokens ? 100.0 * (double)in->unknown / (double)in->tokens : 0.0, shards,
           shards == 1 ? "" : "s", (double)in->bytes / 1e6);
}

static int parse(prepare_opts *o, int argc, char **argv, const char ***files, size_t *nfiles) {
    memset(o, 0, sizeof *o);
    init(o);
    *files = calloc((size_t)argc, sizeof **files);
    if (!*files) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    int only_files = 0;
    for (int a = 1; a < argc; a++) {
        if (only_files || argv[a][0] != '-' || !strcmp(argv[a], "-")) {
            (*files)[(*nfiles)++] = !only_files && !strcmp(argv[a], "-") ? "/dev/stdin" : argv[a];
            continue;
        }
        if (!strcmp(argv[a], "--")) {
            only_files = 1;
            continue;
        }
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            cli_help(&k_prepare, stdout);
            return CLI_OK;
        }
        int r = cli_parse_one(k_options, ~0u, o, CMD, argc, argv, &a);
        if (r < 0) return CLI_USAGE;
        if (r == 0) return cli_unknown(CMD, argv[a], "");
    }
    return CLI_GO;
}

int cmd_prepare(int argc, char **argv) {
    prepare_opts o;
    const char **files = NULL;
    size_t nfiles = 0;
    int rc = parse(&o, argc, argv, &files, &nfiles);
    if (rc == CLI_GO && !o.out) rc = (cli_usage_error(CMD, "--out DIR is required"), CLI_USAGE);
    if (rc == CLI_GO && nfiles == 0)
        rc = (cli_usage_error(CMD, "no text file given (they come after the options)"), CLI_USAGE);
    if (rc == CLI_GO && !(o.valid_fraction >= 0 && o.valid_fraction <= 0.5))
        rc = (cli_usage_error(CMD, "--valid-fraction %g: give a value in [0, 0.5]", o.valid_fraction), CLI_USAGE);
    dm_tokenizer *t = NULL;
    if (rc == CLI_GO) {
        rc = cli_open_tokenizer(CMD, o.tokenizer, o.lowercase, o.cased, &t);
        if (rc == CLI_OK) rc = CLI_GO;
    }
    if (rc != CLI_GO) {
        free(files);
        return rc;
    }
    dm_prepare_config cfg;
    dm_prepare_config_default(&cfg);
    cfg.valid_fraction = o.valid_fraction;
    cfg.doc_per_file = o.doc_per_file;
    cfg.shard_bytes = (uint64_t)o.shard_mb << 20;
    cfg.threads = o.threads;
    cfg.seed = o.seed;
    cfg.force = o.force;
    cfg.tokenizer_path = o.tokenizer;
    bar_state bar = {.tty = isatty(2)};
    if (!o.quiet) {
        cfg.progress = progress;
        cfg.progress_ctx = &bar;
    }
    dm_prepare_stats s;
    dm_status st = dm_prepare(t, files, nfiles, o.out, &cfg, &s);
    if (bar.drawn) fprintf(stderr, "\n");
    if (st != DM_OK) {
        cli_error(CMD, "%s", dm_last_error());
        dm_tokenizer_free(t);
        free(files);
        return CLI_FAIL;
    }
    printf("dmove prepare: %zu file%s, %.1f MB in %.2f s (%.1f MB/s, %d thread%s)\n", s.files,
           s.files == 1 ? "" : "s", (double)s.bytes / 1e6, s.seconds,
           s.seconds > 0 ? (double)s.bytes / 1e6 / s.seconds : 0.0, cli_threads(o.threads),
           cli_threads(o.threads) == 1 ? "" : "s");
    print_split("train", &s.train, s.train_shards);
    if (s.has_valid) print_split("valid", &s.valid, 1);
    if (s.has_valid && s.valid.documents == 0)
        printf("  note: no document was drawn for the valid split: give a larger --valid-fraction\n");
    printf("  tokenizer: %s (hash %016" PRIx64 ")\n", dm_tokenizer_describe(t), dm_tokenizer_hash(t));
    printf("  written: %s/dataset.json\n", o.out);
    dm_tokenizer_free(t);
    free(files);
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}
