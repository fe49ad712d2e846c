/* cmd_tokenize.c: `dmove tokenize`: text into WordPiece ids, as Hugging Face's
 * BertTokenizerFast gives them, one input per line: the ids, the tokens, or a digest (count
 * and FNV-1a 64 of the ids) to compare with a reference. Lines are read in blocks and
 * encoded on all cores (dm_tokenizer_encode_batch); output keeps the input's order. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_common.h"
#include "dmove_text.h"

static const char *const CMD = "tokenize";

#define BLOCK_BYTES ((size_t)8 << 20) /* read this much at a time */
#define BLOCK_LINES 65536
#define PROGRESS_MIN ((uint64_t)64 << 20)
#define MAX_PARTS 64 /* output formatted in up to this many pieces on the threads */

enum { OUT_IDS = 0, OUT_TOKENS, OUT_DIGEST };

typedef struct {
    const char *tokenizer;
    int lowercase, cased, no_special, describe, threads, out;
} tok_opts;

static void init(void *p) {
    tok_opts *o = p;
    o->threads = 0;
}

static const cli_option k_options[] = {
    {.kind = CLI_PATH, .name = "--tokenizer", .arg = "FILE", .off = offsetof(tok_opts, tokenizer),
     .help = "the tokenizer (required): a Hugging Face tokenizer.json\n"
             "of a WordPiece model (BERT's), a vocab.txt (one token\n"
             "a line) with --lowercase or --cased, or a model's directory\n"
             "(its tokenizer.json, else its vocab.txt, cased as its\n"
             "tokenizer_config.json's do_lower_case says)"},
    {.kind = CLI_FLAG, .name = "--lowercase", .off = offsetof(tok_opts, lowercase), .lo = 1,
     .help = "vocab.txt of an uncased model: lowercase and strip accents\n"
             "(BertTokenizerFast's do_lower_case=True)"},
    {.kind = CLI_FLAG, .name = "--cased", .off = offsetof(tok_opts, cased), .lo = 1,
     .help = "vocab.txt of a cased model (do_lower_case=False)"},
    {.kind = CLI_FLAG, .name = "--tokens", .off = offsetof(tok_opts, out), .lo = OUT_TOKENS,
     .help = "print the tokens (\"[CLS] hello world ! [SEP]\") instead\n"
             "of the ids"},
    {.kind = CLI_FLAG, .name = "--digest", .off = offsetof(tok_opts, out), .lo = OUT_DIGEST,
     .help = "print \"COUNT HASH\" a line: the number of ids and the FNV-1a 64 hash\n"
             "of the ids as little-endian int32 (16 hex digits), to compare\n"
             "with a reference cheaply"},
    {.kind = CLI_FLAG, .name = "--no-special", .off = offsetof(tok_opts, no_special), .lo = 1,
     .help = "leave out the special tokens around each input ([CLS] ... [SEP])"},
    {.kind = CLI_INT, .name = "--threads", .arg = "N", .off = offsetof(tok_opts, threads), .lo = 0, .hi = 4096,
     .help = "encode on N threads (0: all cores; default {}); the\n"
             "output is the same"},
    {.kind = CLI_FLAG, .name = "--describe", .off = offsetof(tok_opts, describe), .lo = 1,
     .help = "print what the tokenizer does (model, size, normalization, special\n"
             "tokens, hash) and exit"},
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};

static const cli_command k_tokenize = {
    .name = "tokenize",
    .head = "usage: dmove tokenize --tokenizer FILE [options] [TEXT...]\n"
            "\n"
            "Turns text into the token ids of a BERT WordPiece tokenizer, exactly as Hugging\n"
            "Face's BertTokenizerFast does (its added tokens, normalizer, pre-tokenizer,\n"
            "WordPiece and [CLS]/[SEP]). Each line of each TEXT file (standard input when none\n"
            "is given, or for '-') is one input; the output has one line per input line, in\n"
            "order. A line's \"\\n\" and a \"\\r\" before it are not part of the input. Text must\n"
            "be UTF-8: invalid bytes stop with the file, byte offset and line.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 runtime error (unreadable or invalid input or\n"
            "tokenizer), 2 usage error\n"
            "\n"
            "examples:\n"
            "  echo 'Hello, world!' | dmove tokenize --tokenizer bert-base-uncased/tokenizer.json\n"
            "      101 7592 1010 2088 999 102\n"
            "  echo 'Hello, world!' | dmove tokenize --tokenizer vocab.txt --lowercase --tokens\n"
            "      [CLS] hello , world ! [SEP]\n"
            "  dmove tokenize --tokenizer tokenizer.json --digest corpus.txt > corpus.digest\n"
            "      (one \"COUNT HASH\" line per line of corpus.txt)\n"
            "  dmove tokenize --tokenizer tokenizer.json --describe\n",
    .options = k_options,
    .hint = "",
    .size = sizeof(tok_opts),
    .init = init,
};

/* --- output ------------------------------------------------------------------------------ */

typedef struct {
    char *v;
    size_t n, cap;
} obuf;

static int ob_room(obuf *b, size_t extra) {
    if (b->cap - b->n >= extra) return 0;
    size_t cap = b->cap ? b->cap : 1 << 16;
    while (cap - b->n < extra) cap *= 2;
    char *p = realloc(b->v, cap);
    if (!p) return -1;
    b->v = p;
    b->cap = cap;
    return 0;
}

static size_t put_u64(char *o, uint64_t u) {
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    for (size_t k = 0; k < n; k++) o[k] = tmp[n - 1 - k];
    return n;
}

static uint64_t digest(const int32_t *v, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)v[i];
        for (int k = 0; k < 4; k++) h = (h ^ ((u >> (8 * k)) & 0xff)) * 0x100000001b3ull;
    }
    return h;
}

/* One output line for ids. 0 ok, -1 no memory. */
static int format_line(obuf *b, const dm_tokenizer *t, const dm_ids *ids, int mode) {
    if (mode == OUT_DIGEST) {
        if (ob_room(b, 48)) return -1;
        char *o = b->v + b->n;
        o += put_u64(o, ids->n);
        *o++ = ' ';
        uint64_t h = digest(ids->v, ids->n);
        for (int k = 15; k >= 0; k--) *o++ = "0123456789abcdef"[(h >> (4 * k)) & 15];
        *o++ = '\n';
        b->n = (size_t)(o - b->v);
        return 0;
    }
    for (size_t k = 0; k < ids->n; k++) {
        if (mode == OUT_IDS) {
            if (ob_room(b, 24)) return -1;
        } else {
            const char *s = dm_tokenizer_token(t, ids->v[k]);
            size_t n = strlen(s);
            if (ob_room(b, n + 2)) return -1;
            if (k) b->v[b->n++] = ' ';
            memcpy(b->v + b->n, s, n);
            b->n += n;
            continue;
        }
        if (k) b->v[b->n++] = ' ';
        b->n += put_u64(b->v + b->n, (uint32_t)ids->v[k]); /* ids are >= 0 */
    }
    if (ob_room(b, 1)) return -1;
    b->v[b->n++] = '\n';
    return 0;
}

/* --- input ------------------------------------------------------------------------------- */

typedef struct {
    const dm_tokenizer *t;
    const tok_opts *o;
    int threads;
    const char **lines;
    size_t *lens;
    dm_ids *ids;
    obuf out[MAX_PARTS];
    double t0, last_progress;
    int progress, shown;
} run_state;

/* Encodes and prints lines [0, n) of the block; line_base: lines before it in the file,
 * off: its byte offsets in the file. 0 ok, else the exit status after the message. */
static int encode_block(run_state *r, const char *name, size_t n, uint64_t line_base, const uint64_t *off) {
    for (size_t k = 0; k < n; k++) r->ids[k].n = 0;
    size_t bad_i, bad_off;
    dm_status st = dm_tokenizer_encode_batch(r->t, r->lines, r->lens, n, !r->o->no_special, r->threads,
                                             r->ids, &bad_i, &bad_off);
    size_t upto = st == DM_OK ? n : (st == DM_ERR_FORMAT && bad_i < n ? bad_i : 0);
    /* formatted on the threads too, a contiguous range of lines each, written in order */
    int parts = upto < 4096 ? 1 : r->threads < MAX_PARTS ? r->threads : MAX_PARTS, oom = 0;
#pragma omp parallel for num_threads(parts) schedule(static, 1) if (parts > 1)
    for (int p = 0; p < parts; p++) {
        obuf *b = &r->out[p];
        b->n = 0;
        for (size_t k = upto * (size_t)p / (size_t)parts; k < upto * (size_t)(p + 1) / (size_t)parts; k++)
            if (format_line(b, r->t, &r->ids[k], r->o->out)) {
#pragma omp atomic write
                oom = 1;
                break;
            }
    }
    if (oom) {
        cli_error(CMD, "out of memory formatting the output");
        return CLI_FAIL;
    }
    for (int p = 0; p < parts; p++)
        if (r->out[p].n && fwrite(r->out[p].v, 1, r->out[p].n, stdout) != r->out[p].n) {
            cli_error(CMD, "writing the output: %s", strerror(errno));
            return CLI_FAIL;
        }
    if (st == DM_ERR_FORMAT && bad_i < n) {
        fflush(stdout);
        cli_error(CMD, "%s: invalid UTF-8 at byte offset %" PRIu64 " (line %" PRIu64 ")", name,
                  off[bad_i] + bad_off, line_base + bad_i + 1);
        return CLI_FAIL;
    }
    if (st != DM_OK) {
        cli_error(CMD, "%s: %s", name, dm_last_error());
        return CLI_FAIL;
    }
    return 0;
}

static void show_progress(run_state *r, const char *name, uint64_t done, uint64_t total, int final) {
    double now = cli_now();
    /* on a terminal, for an input over 64 MB (or once that much of a pipe is read), every
     * half second; the last line only after others */
    if (!r->progress || (!r->shown && (final || (total ? total : done) <= PROGRESS_MIN))) return;
    if (!final && now - r->last_progress < 0.5) return;
    r->last_progress = now;
    r->shown = 1;
    double mb = (double)done / 1e6, dt = now - r->t0, rate = dt > 0 ? mb / dt : 0;
    if (total)
        fprintf(stderr, "\rdmove tokenize: %s: %.0f of %.0f MB, %.1f MB/s, %.0f s left   %s", name, mb,
                (double)total / 1e6, rate, rate > 0 ? ((double)total / 1e6 - mb) / rate : 0.0, final ? "\n" : "");
    else
        fprintf(stderr, "\rdmove tokenize: %s: %.0f MB, %.1f MB/s   %s", name, mb, rate, final ? "\n" : "");
    fflush(stderr);
}

/* Reads fd in blocks, cuts lines, encodes them. 0 ok, else the exit status. */
static int run_file(run_state *r, const char *name, int fd, uint64_t total) {
    size_t cap = BLOCK_BYTES, have = 0;
    char *buf = malloc(cap);
    uint64_t *off = malloc(BLOCK_LINES * sizeof *off);
    uint64_t base = 0, line_no = 0; /* file offset of buf[0]; lines done */
    int rc = 0, eof = 0;
    if (!buf || !off) {
        cli_error(CMD, "out of memory");
        rc = CLI_FAIL;
    }
    r->t0 = r->last_progress = cli_now();
    r->progress = isatty(2);
    r->shown = 0;
    while (!rc && !(eof && have == 0)) {
        while (!eof && have < cap) {
            ssize_t got = read(fd, buf + have, cap - have);
            if (got < 0 && errno == EINTR) continue;
            if (got < 0) {
                cli_error(CMD, "%s: read failed: %s", name, strerror(errno));
                rc = CLI_FAIL;
                break;
            }
            if (got == 0) eof = 1;
            have += (size_t)got;
            if (got > 0 && memchr(buf + have - (size_t)got, '\n', (size_t)got)) break;
        }
        if (rc) break;
        size_t n = 0, pos = 0;
        while (n < BLOCK_LINES && pos < have) {
            const char *nl = memchr(buf + pos, '\n', have - pos);
            if (!nl && !eof) break;
            size_t end = nl ? (size_t)(nl - buf) : have;
            size_t len = end - pos;
            if (len && buf[end - 1] == '\r') len--;
            r->lines[n] = buf + pos;
            r->lens[n] = len;
            off[n++] = base + pos;
            pos = nl ? end + 1 : have;
        }
        if (n == 0 && !eof) { /* a line longer than the buffer: grow it */
            char *bigger = cap > ((size_t)1 << 40) ? NULL : realloc(buf, cap * 2);
            if (!bigger) {
                cli_error(CMD, "%s: out of memory for a line of over %zu bytes", name, cap);
                rc = CLI_FAIL;
                break;
            }
            buf = bigger;
            cap *= 2;
            continue;
        }
        rc = encode_block(r, name, n, line_no, off);
        line_no += n;
        memmove(buf, buf + pos, have - pos);
        have -= pos;
        base += pos;
        show_progress(r, name, base, total, 0);
    }
    if (!rc) show_progress(r, name, base, total, 1);
    free(buf);
    free(off);
    return rc;
}

static int describe(const dm_tokenizer *t) {
    dm_special_ids sp;
    dm_status st = dm_tokenizer_specials(t, &sp);
    printf("%s\n", dm_tokenizer_describe(t));
    if (st == DM_OK)
        printf("special tokens: [PAD] %d, [UNK] %d, [CLS] %d, [SEP] %d, [MASK] %d\n", sp.pad, sp.unk, sp.cls,
               sp.sep, sp.mask);
    else
        printf("special tokens: %s\n", dm_last_error());
    printf("hash %016" PRIx64 "\n", dm_tokenizer_hash(t));
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}

static int run_inputs(run_state *r, char **files, int nfiles) {
    static char dash[] = "-";
    char *std_only[] = {dash};
    if (!nfiles) {
        files = std_only;
        nfiles = 1;
    }
    for (int k = 0; k < nfiles; k++) {
        int is_std = !strcmp(files[k], "-");
        const char *name = is_std ? "standard input" : files[k];
        int fd = is_std ? 0 : open(files[k], O_RDONLY);
        if (fd < 0) {
            cli_error(CMD, "%s: cannot open: %s", name, strerror(errno));
            return CLI_FAIL;
        }
        struct stat st;
        uint64_t total = 0;
        if (fstat(fd, &st) == 0) {
            if (S_ISDIR(st.st_mode)) {
                cli_error(CMD, "%s: is a directory; give text files", name);
                if (!is_std) close(fd);
                return CLI_FAIL;
            }
            if (S_ISREG(st.st_mode)) total = (uint64_t)st.st_size;
        }
        int rc = run_file(r, name, fd, total);
        if (!is_std) close(fd);
        if (rc) return rc;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        cli_error(CMD, "writing the output: %s", strerror(errno));
        return CLI_FAIL;
    }
    return CLI_OK;
}

int cmd_tokenize(int argc, char **argv) {
    tok_opts o;
    memset(&o, 0, sizeof o);
    init(&o);
    char **files = calloc((size_t)argc + 1, sizeof *files);
    int nfiles = 0, opts_done = 0;
    if (!files) return CLI_FAIL;
    for (int a = 1; a < argc; a++) {
        if (!opts_done && (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h"))) {
            cli_help(&k_tokenize, stdout);
            free(files);
            return CLI_OK;
        }
        if (!opts_done && !strcmp(argv[a], "--")) {
            opts_done = 1;
            continue;
        }
        if (opts_done || argv[a][0] != '-' || !argv[a][1]) {
            files[nfiles++] = argv[a];
            continue;
        }
        int r = cli_parse_one(k_options, ~0u, &o, CMD, argc, argv, &a);
        if (r <= 0) {
            free(files);
            return r < 0 ? CLI_USAGE : cli_unknown(CMD, argv[a], "");
        }
    }
    int rc = CLI_USAGE;
    dm_tokenizer *t = NULL;
    if (!o.tokenizer) cli_usage_error(CMD, "--tokenizer FILE is required (a tokenizer.json or a vocab.txt)");
    else if (o.lowercase && o.cased) cli_usage_error(CMD, "--lowercase and --cased exclude each other");
    else {
        dm_case c = o.lowercase ? DM_CASE_LOWER : o.cased ? DM_CASE_CASED : DM_CASE_FILE;
        dm_status st = dm_tokenizer_load(&t, o.tokenizer, c);
        if (st == DM_ERR_INVALID_ARG && strstr(dm_last_error(), "its casing: "))
            cli_usage_error(CMD, "%s: %s", dm_last_error(),
                            c == DM_CASE_FILE ? "give --lowercase or --cased" : "leave out --lowercase/--cased");
        else if (st != DM_OK) {
            cli_error(CMD, "%s", dm_last_error());
            rc = CLI_FAIL;
        } else if (o.describe) {
            rc = describe(t);
        } else {
            run_state r = {.t = t, .o = &o, .threads = cli_threads(o.threads)};
            r.lines = malloc(BLOCK_LINES * sizeof *r.lines);
            r.lens = malloc(BLOCK_LINES * sizeof *r.lens);
            r.ids = calloc(BLOCK_LINES, sizeof *r.ids);
            if (!r.lines || !r.lens || !r.ids) {
                cli_error(CMD, "out of memory");
                rc = CLI_FAIL;
            } else {
                rc = run_inputs(&r, files, nfiles);
            }
            for (size_t k = 0; r.ids && k < BLOCK_LINES; k++) dm_ids_free(&r.ids[k]);
            free(r.lines);
            free(r.lens);
            free(r.ids);
            for (int p = 0; p < MAX_PARTS; p++) free(r.out[p].v);
        }
    }
    dm_tokenizer_free(t);
    free(files);
    return rc;
}
