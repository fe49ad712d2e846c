/* cmd_finetune.c: `dmove finetune`: sequence classification (BertForSequenceClassification:
 * embeddings, encoder layers, pooler, classifier) from a TSV or JSONL file of (text[, text_b],
 * label), from scratch or from a Hugging Face model (--init), with a held-out file's
 * accuracy and loss, progress, a chart, checkpoints and an export transformers loads.
 * Its structure follows cmd_pretrain.c (options table, setup, run loop, summary). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli_common.h"
#include "dmove_data.h"
#include "dmove_text.h"

static const char *const CMD = "finetune";

typedef struct {
    const char *train, *eval, *tokenizer, *init, *config, *labels, *svg, *save, *resume, *export_dir;
    int lowercase, cased, layers, layers_set, json, positions_set, types_set, no_unpad, layers_from;
    int64_t epochs, until, eval_every, log_every, positions, types, save_every;
    cli_optim opt;
    cli_config c;
    cli_device dev;
    char init_dir[4096]; /* the tokenizer's place when --tokenizer is not given: --init's */
} ft_opts;

static void init(void *p) {
    ft_opts *o = p;
    o->layers = 2;
    o->epochs = 3;
    o->eval_every = -1; /* not given: about 10 times a run (0 given: at the end only) */
    o->positions = 512;
    o->types = 2;
    cli_optim_init(&o->opt);
    o->opt.optim.lr = 5e-5;
    o->opt.optim.clip_norm = 1.0;
    cli_config_init(&o->c, CLI_CFG_ALL & ~CLI_CFG_ARCH);
    o->c.size[0] = 32, o->c.size_set[0] = 1; /* batch */
    o->c.size[1] = 128, o->c.size_set[1] = 1; /* seq */
}

#define O(field) .off = offsetof(ft_opts, field)
#define I64(nm, a, field, min, h) {.kind = CLI_I64, .name = nm, .arg = a, O(field), .lo = min, .hi = INT64_C(1000000000), .help = h}
static const cli_option k_options[] = {
    {.kind = CLI_PATH, .name = "--train", .arg = "FILE", O(train),
     .help = "the training examples (required): TSV, a line text TAB label\n"
             "or text TAB text_b TAB label (a first line ending in\n"
             "'label' is a header), or JSONL, a line {\"text\": ...,\n"
             "\"text_b\" (or \"text_pair\"): ..., \"label\": ...}"},
    {.kind = CLI_PATH, .name = "--eval", .arg = "FILE", O(eval),
     .help = "held-out examples in the same form: accuracy and loss every\n"
             "--eval-every steps and at the end (no dropout)"},
    {.kind = CLI_PATH, .name = "--tokenizer", .arg = "FILE", O(tokenizer),
     .help = "the tokenizer (required; a vocab.txt with --lowercase or\n"
             "--cased, a tokenizer.json, or the model's directory;\n"
             "default with --init: its directory's)"},
    {.kind = CLI_FLAG, .name = "--lowercase", O(lowercase), .lo = 1, .left = "--lowercase, --cased",
     .help = "how a vocab.txt normalizes, as for dmove prepare"},
    {.kind = CLI_FLAG, .name = "--cased", O(cased), .lo = 1},
    {.kind = CLI_STR, .name = "--labels", .arg = "A,B,..", O(labels),
     .help = "the classes in order (class 0 first); default: those of\n"
             "--train, sorted (as numbers when all are numbers)"},
    {.kind = CLI_PATH, .name = "--init", .arg = "DIR", O(init),
     .help = "start from a Hugging Face BERT (a directory with\n"
             "model.safetensors and config.json): its sizes, embeddings,\n"
             "encoder layers and pooler (if it has one); the classifier\n"
             "starts new"},
    {.kind = CLI_INT, .name = "--layers-from", .arg = "N", O(layers_from), .lo = 0, .hi = 4095,
     .help = "with --init: the encoder takes the model's layers N, N+1, ...\n"
             "(default {}; --layers of them, default all the rest)"},
    {.kind = CLI_PATH, .name = "--config", .arg = "FILE", O(config),
     .help = "from scratch with the sizes of a Hugging Face config.json;\n"
             "else the options below"},
    {.kind = CLI_INT, .name = "--layers", .arg = "L", O(layers), .set = offsetof(ft_opts, layers_set) + 1,
     .lo = 1, .hi = 256, .help = "encoder layers from scratch (default {}); with --init, how many\n"
                                 "of its layers (from --layers-from) to take"},
    {.kind = CLI_I64, .name = "--positions", .arg = "P", O(positions), .set = offsetof(ft_opts, positions_set) + 1,
     .lo = 1, .hi = INT64_C(1) << 24, .help = "position embeddings from scratch (default {}, at least --seq)"},
    {.kind = CLI_I64, .name = "--types", .arg = "T", O(types), .set = offsetof(ft_opts, types_set) + 1, .lo = 2,
     .hi = 1 << 16, .help = "token types from scratch (default {})"},
    I64("--epochs", "E", epochs, 1, "passes over --train (default {}; the examples shuffled\n"
                                    "each epoch from --seed, in batches of --batch, the\n"
                                    "last one short, as a DataLoader's)"),
    CLI_OPTIM(ft_opts, opt),
    I64("--eval-every", "K", eval_every, 0, "evaluate every K steps (default: about 10 times a run;\n"
                                           "0: at the end only)"),
    I64("--log-every", "K", log_every, 1, "a progress line every K steps (default: about 15 lines)"),
    {.kind = CLI_STR, .name = "--save", .arg = "FILE", O(save),
     .help = "write a checkpoint at the end (atomically; also every\n"
             "--save-every K steps, and on Ctrl-C)"},
    I64("--save-every", "K", save_every, 1, "checkpoint every K steps as well (needs --save)"),
    {.kind = CLI_STR, .name = "--resume", .arg = "FILE", O(resume),
     .help = "continue a run from its checkpoint: with the same options,\n"
             "the same batches and the same result as an uninterrupted run"},
    I64("--until", "K", until, 1, "stop after step K this time (needs --save)"),
    {.kind = CLI_PATH, .name = "--export", .arg = "DIR", O(export_dir),
     .help = "at the end, write DIR/model.safetensors and DIR/config.json\n"
             "as transformers saves a BertForSequenceClassification (with\n"
             "id2label / label2id: the class names)"},
    {.kind = CLI_STR, .name = "--svg", .arg = "FILE", O(svg),
     .help = "draw the training loss and the held-out accuracy (SVG)"},
    {.kind = CLI_FLAG, .name = "--no-unpad", O(no_unpad), .lo = 1,
     .help = "run the padding too: by default the encoder layers work on\n"
             "each batch's real tokens alone (its attention masks' 1s),\n"
             "packed, and attention over each sequence's own length"},
    {.kind = CLI_FLAG, .name = "--json", O(json), .lo = 1, .help = "print one JSON object at the end"},
    CLI_CONFIG(ft_opts, c, CLI_CFG_ALL & ~CLI_CFG_ARCH),
    CLI_DEVICE(ft_opts, dev),
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};
#undef O
#undef I64

static const cli_command k_finetune = {
    .name = "finetune",
    .head = "usage: dmove finetune --train FILE (--tokenizer FILE | --init DIR) [--eval FILE] [options]\n"
            "\n"
            "Fine-tunes a BERT for sequence classification, as Hugging Face's\n"
            "BertForSequenceClassification: pooled = tanh(dense(hidden[CLS])), dropout, a\n"
            "linear classifier, the cross-entropy over the batch. Each example is one text\n"
            "or a pair, tokenized as [CLS] a [SEP] (b [SEP]) with token types 0 and 1, cut\n"
            "to --seq tokens (the longer text first) and padded. Labels are any words or\n"
            "numbers; --labels fixes their order. Start from a pretrained model (--init) or\n"
            "from scratch (--config, --preset or the sizes). Progress goes to stderr: loss,\n"
            "accuracy, learning rate, then the held-out figures (--eval) every --eval-every\n"
            "steps. --save / --resume continue a run bit-identically; --export writes a\n"
            "model transformers' from_pretrained loads. Errors in a data file name the file\n"
            "and the line.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 runtime error, 2 usage error\n"
            "\n"
            "example (sentiment from a pretrained BERT; train.tsv lines: text TAB pos|neg):\n"
            "  dmove finetune --init bert-base-uncased --tokenizer bert-base-uncased/vocab.txt \\\n"
            "      --lowercase --train train.tsv --eval dev.tsv --seq 128 --batch 32 \\\n"
            "      --epochs 3 --lr 2e-5 --warmup 100 --lr-schedule linear --svg ft.svg \\\n"
            "      --export sentiment-model\n"
            "  python3 -c \"from transformers import BertForSequenceClassification as B; \\\n"
            "      print(B.from_pretrained('sentiment-model').config.id2label)\"\n",
    .options = k_options,
    .hint = " (the data files go with --train and --eval)",
    .size = sizeof(ft_opts),
    .init = init,
};

static int fail_dm(const char *what) { return cli_fail_dm(CMD, what); }

/* --- the data files ------------------------------------------------------------------ */

/* A parsed line: its texts and label (owned), and where it came from. */
typedef struct {
    char *text, *text_b, *label;
    int64_t line;
} ft_row;

typedef struct {
    ft_row *v;
    int64_t n, cap;
} ft_rows;

static void rows_free(ft_rows *r) {
    for (int64_t k = 0; k < r->n; k++) free(r->v[k].text), free(r->v[k].text_b), free(r->v[k].label);
    free(r->v);
    memset(r, 0, sizeof *r);
}

/* The byte offset of the first invalid UTF-8 sequence in s[0 .. n), or -1. */
static int64_t utf8_bad(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const unsigned c = s[i];
        size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!len || i + len > n || (len == 2 && c < 0xc2) || (len == 4 && c > 0xf4)) return (int64_t)i;
        unsigned cp = len == 1 ? c : c & (0x7f >> len);
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xc0) != 0x80) return (int64_t)i;
            cp = cp << 6 | (s[i + k] & 0x3f);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return (int64_t)i;
        i += len;
    }
    return -1;
}

static char *dup_n(const char *s, size_t n) {
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n), d[n] = 0;
    return d;
}

/* A TSV line's fields: text TAB label, or text TAB text_b TAB label. */
static int parse_tsv(const char *path, int64_t ln, char *s, size_t n, ft_row *row) {
    const char *f[4];
    size_t fl[4];
    int nf = 0;
    const char *p = s, *end = s + n;
    while (nf < 4) {
        const char *t = memchr(p, '\t', (size_t)(end - p));
        f[nf] = p, fl[nf] = (size_t)((t ? t : end) - p), nf++;
        if (!t) break;
        p = t + 1;
    }
    if (nf == 1 || (nf >= 2 && fl[nf - 1] == 0)) {
        cli_error(CMD, "%s:%" PRId64 ": no label (a line is text TAB label, or text TAB text_b TAB label)", path, ln);
        return CLI_FAIL;
    }
    if (nf > 3) {
        cli_error(CMD, "%s:%" PRId64 ": more than 3 tab-separated fields (a line is text TAB label, or text TAB "
                  "text_b TAB label)", path, ln);
        return CLI_FAIL;
    }
    row->text = dup_n(f[0], fl[0]);
    row->text_b = nf == 3 ? dup_n(f[1], fl[1]) : NULL;
    row->label = dup_n(f[nf - 1], fl[nf - 1]);
    if (!row->text || !row->label || (nf == 3 && !row->text_b)) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    return 0;
}

/* --- a strict reading of a JSONL line ------------------------------------------------
 * cJSON reads more than JSON: invalid \u escapes (read as NUL, cutting the text there),
 * text after the object, numbers such as 01. A line is first checked as RFC 8259 JSON, as
 * Python's json reads it (NaN, Infinity and -Infinity too, read as 0 by cJSON, refused as
 * a label; a raw tab inside a string is let through, as most writers of JSONL let it; a lone
 * surrogate and \u0000, which Python takes, are refused: no text holds them), and the raw
 * text of its top-level "label" is kept: a number label is named as written (Python's int)
 * or by its shortest form (Python's float repr). */
typedef struct {
    const char *p, *end, *err, *at;
    const char *label, *label_end; /* the raw value of the top-level key "label" */
} jscan;

static int js_fail(jscan *j, const char *msg) {
    if (!j->err) j->err = msg, j->at = j->p;
    return -1;
}

static int js_fail_at(jscan *j, const char *at, const char *msg) {
    j->p = at;
    return js_fail(j, msg);
}

static void js_ws(jscan *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int js_hex4(const char *p, const char *end, unsigned *v) {
    if (end - p < 4) return -1;
    *v = 0;
    for (int k = 0; k < 4; k++) {
        const char c = p[k];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v << 4 | (unsigned)d;
    }
    return 0;
}

static int js_string(jscan *j) {
    j->p++; /* the opening quote */
    for (;;) {
        if (j->p >= j->end) return js_fail(j, "a string without its closing quote");
        const unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            return 0;
        }
        if (c < 0x20 && c != '\t') return js_fail(j, "a control character inside a string (write it as an escape)");
        if (c != '\\') {
            j->p++;
            continue;
        }
        const char *bs = j->p; /* the backslash: where an escape's error is named */
        if (++j->p >= j->end) return js_fail(j, "a string without its closing quote");
        const char e = *j->p;
        if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't') {
            j->p++;
            continue;
        }
        unsigned v, w;
        if (e != 'u' || js_hex4(j->p + 1, j->end, &v)) return js_fail_at(j, bs, "an invalid escape (\\\" \\\\ \\/ \\b \\f \\n \\r \\t or \\u and four hex digits)");
        if (v == 0) return js_fail_at(j, bs, "\\u0000, a NUL character, in a string");
        if (v >= 0xdc00 && v <= 0xdfff) return js_fail_at(j, bs, "a lone UTF-16 low surrogate (\\udc00-\\udfff)");
        j->p += 5;
        if (v >= 0xd800 && v <= 0xdbff) {
            if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || js_hex4(j->p + 2, j->end, &w) || w < 0xdc00 ||
                w > 0xdfff)
                return js_fail_at(j, bs, "a UTF-16 high surrogate (\\ud800-\\udbff) without its low half");
            j->p += 6;
        }
    }
}

static int js_number(jscan *j) {
    const char *p = j->p, *e = j->end;
    if (p < e && *p == '-') p++;
    if (p < e && *p == '0') p++;
    else if (p < e && *p >= '1' && *p <= '9')
        while (p < e && *p >= '0' && *p <= '9') p++;
    else return js_fail(j, "an invalid number");
    if (p < e && *p == '.') {
        if (++p >= e || *p < '0' || *p > '9') return js_fail(j, "an invalid number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
        if (++p < e && (*p == '+' || *p == '-')) p++;
        if (p >= e || *p < '0' || *p > '9') return js_fail(j, "an invalid number");
        while (p < e && *p >= '0' && *p <= '9') p++;
    }
    if (p < e && ((*p >= '0' && *p <= '9') || *p == '.' || *p == 'x' || *p == 'X'))
        return js_fail(j, "an invalid number (a leading zero?)");
    j->p = p;
    return 0;
}

static int js_value(jscan *j, int depth);

/* An object or an array (open: '{' or '['); depth 0 is the line's object. */
static int js_container(jscan *j, int depth) {
    const char open = *j->p, close = open == '{' ? '}' : ']';
    j->p++;
    js_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return 0;
    }
    for (;;) {
        const char *key = NULL, *key_end = NULL;
        if (open == '{') {
            js_ws(j);
            if (j->p >= j->end || *j->p != '"') return js_fail(j, "an object's key must be a string");
            key = j->p;
            if (js_string(j)) return -1;
            key_end = j->p;
            js_ws(j);
            if (j->p >= j->end || *j->p != ':') return js_fail(j, "a ':' missing after a key");
            j->p++;
        }
        js_ws(j);
        const char *v = j->p;
        if (js_value(j, depth + 1)) return -1;
        if (depth == 0 && key && key_end - key == 7 && !memcmp(key, "\"label\"", 7)) j->label = v, j->label_end = j->p;
        js_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return 0;
        }
        return js_fail(j, open == '{' ? "a ',' or '}' missing" : "a ',' or ']' missing");
    }
}

static int js_value(jscan *j, int depth) {
    if (depth > 900) return js_fail(j, "nested more than 900 deep");
    js_ws(j);
    if (j->p >= j->end) return js_fail(j, "a value missing");
    const char c = *j->p;
    if (c == '{' || c == '[') return js_container(j, depth);
    /* Python's json writes and reads NaN, Infinity and -Infinity; cJSON does not: each is
     * read as the number 0 written over it in place (the label is refused before) */
    static const char *const nonfinite[3] = {"NaN", "Infinity", "-Infinity"};
    for (int k = 0; k < 3; k++) {
        const size_t n = strlen(nonfinite[k]);
        if ((size_t)(j->end - j->p) >= n && !memcmp(j->p, nonfinite[k], n)) {
            char *w = (char *)j->p; /* the line's copy (parse_jsonl) */
            w[0] = '0';
            memset(w + 1, ' ', n - 1);
            j->p += n;
            return 0;
        }
    }
    if (c == '"') return js_string(j);
    if (c == '-' || (c >= '0' && c <= '9')) return js_number(j);
    static const char *const lit[3] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        const size_t n = strlen(lit[k]);
        if ((size_t)(j->end - j->p) >= n && !memcmp(j->p, lit[k], n)) {
            j->p += n;
            return 0;
        }
    }
    return js_fail(j, "not a JSON value (strings are in double quotes)");
}

/* A number label's name: an integer as written ("-0" as "0"); a fraction or an exponent by
 * the shortest text that reads back as the same double, written as Python's repr writes a
 * float (1.0, 0.1, 1e-07, 1e+22). */
static void float_name(double v, char *out, size_t on);

static void number_name(const char *raw, size_t n, double v, char *out, size_t on) {
    if (!raw) { /* the key was written with escapes: the value alone, an integer if it is one */
        if (v == floor(v) && fabs(v) < 9007199254740992.0) snprintf(out, on, "%.0f", v == 0 ? 0.0 : v);
        else float_name(v, out, on);
        return;
    }
    if (!memchr(raw, '.', n) && !memchr(raw, 'e', n) && !memchr(raw, 'E', n)) {
        if (n == 2 && !memcmp(raw, "-0", 2)) raw++, n--;
        snprintf(out, on, "%.*s", (int)(n < on ? n : on - 1), raw);
        return;
    }
    float_name(v, out, on);
}

/* A float as Python's repr writes it: the fewest significant digits that read back as v. */
static void float_name(double v, char *out, size_t on) {
    char sci[40];
    int prec = 1;
    for (; prec < 17; prec++) { /* the fewest significant digits that read back exactly */
        snprintf(sci, sizeof sci, "%.*e", prec - 1, v);
        if (strtod(sci, NULL) == v) break;
    }
    snprintf(sci, sizeof sci, "%.*e", prec - 1, v);
    const int e10 = atoi(strchr(sci, 'e') + 1);
    if (v != 0 && (e10 < -4 || e10 >= 16)) {
        snprintf(out, on, "%s", sci);
        return;
    }
    const int decimals = prec - 1 - e10 > 0 ? prec - 1 - e10 : 0;
    snprintf(out, on, "%.*f", decimals, v);
    if (!strchr(out, '.')) {
        const size_t l = strlen(out);
        if (l + 2 < on) memcpy(out + l, ".0", 3);
    }
}

/* A JSONL line: {"text": .., "text_b" or "text_pair": .., "label": string or number}. */
static int parse_jsonl(const char *path, int64_t ln, const char *s, size_t n, ft_row *row) {
    char *c = malloc(n ? n : 1); /* the line as cJSON reads it: NaN and Infinity as 0 */
    if (!c) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    if (n) memcpy(c, s, n);
    jscan js = {.p = c, .end = c + n};
    js_ws(&js);
    if (js.p >= js.end || *js.p != '{') {
        free(c);
        cli_error(CMD, "%s:%" PRId64 ": not a JSON object (a line is {\"text\": ..., \"label\": ...})", path, ln);
        return CLI_FAIL;
    }
    if (js_container(&js, 0) == 0) {
        js_ws(&js);
        if (js.p < js.end) js_fail(&js, "text after the JSON object (one object a line)");
    }
    if (js.err) {
        cli_error(CMD, "%s:%" PRId64 ": not valid JSON at byte %td of the line: %s", path, ln, js.at - c + 1, js.err);
        free(c);
        return CLI_FAIL;
    }
    if (js.label && (s[js.label - c] == 'N' || s[js.label - c] == 'I' || s[js.label - c + 1] == 'I')) {
        free(c);
        cli_error(CMD, "%s:%" PRId64 ": \"label\" is %s: give a class name or a finite number", path, ln,
                  s[js.label - c] == 'N' ? "NaN" : "infinite");
        return CLI_FAIL;
    }
    if (js.label) /* the label's raw text in the line itself (the copy goes now) */
        js.label_end = s + (js.label_end - c), js.label = s + (js.label - c);
    cJSON *j = cJSON_ParseWithLength(c, n);
    free(c);
    if (!j || !cJSON_IsObject(j)) {
        cJSON_Delete(j);
        cli_error(CMD, "%s:%" PRId64 ": not a JSON object (a line is {\"text\": ..., \"label\": ...})", path, ln);
        return CLI_FAIL;
    }
    for (const cJSON *a = j->child; a; a = a->next) /* Python's json keeps the last of a key given twice */
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && !strcmp(a->string, b->string)) {
                cli_error(CMD, "%s:%" PRId64 ": the key \"%.64s\" twice (which one counts is ambiguous): keep one",
                          path, ln, a->string);
                cJSON_Delete(j);
                return CLI_FAIL;
            }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "text"), *l = cJSON_GetObjectItemCaseSensitive(j, "label");
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "text_b"), *bp = cJSON_GetObjectItemCaseSensitive(j, "text_pair");
    int rc = 0;
    char num[320];
    if (b && bp) {
        cli_error(CMD, "%s:%" PRId64 ": both \"text_b\" and \"text_pair\": give the second text once", path, ln);
        rc = CLI_FAIL;
    } else if (!b) {
        b = bp;
    }
    if (rc) {
    } else if (!cJSON_IsString(t) || (b && !cJSON_IsString(b) && !cJSON_IsNull(b))) {
        cli_error(CMD, "%s:%" PRId64 ": \"text\" (and \"text_b\" if there) must be strings", path, ln);
        rc = CLI_FAIL;
    } else if (!l || cJSON_IsNull(l) || (cJSON_IsString(l) && !*l->valuestring)) {
        cli_error(CMD, "%s:%" PRId64 ": no label (\"label\": a string or a number)", path, ln);
        rc = CLI_FAIL;
    } else if (!cJSON_IsString(l) && !cJSON_IsNumber(l)) {
        cli_error(CMD, "%s:%" PRId64 ": \"label\" must be a string or a number", path, ln);
        rc = CLI_FAIL;
    } else if (cJSON_IsNumber(l) && js.label && js.label_end - js.label > 300) {
        cli_error(CMD, "%s:%" PRId64 ": \"label\" is a number of more than 300 characters: give it as a string",
                  path, ln);
        rc = CLI_FAIL;
    } else if (cJSON_IsNumber(l) && !isfinite(l->valuedouble)) {
        cli_error(CMD, "%s:%" PRId64 ": \"label\" is a number out of range: give a class name or a finite number",
                  path, ln);
        rc = CLI_FAIL;
    } else {
        if (cJSON_IsNumber(l))
            number_name(js.label, js.label ? (size_t)(js.label_end - js.label) : 0, l->valuedouble, num, sizeof num);
        row->text = strdup(t->valuestring);
        row->text_b = cJSON_IsString(b) ? strdup(b->valuestring) : NULL;
        row->label = strdup(cJSON_IsNumber(l) ? num : l->valuestring);
        if (!row->text || !row->label || (cJSON_IsString(b) && !row->text_b)) {
            cli_error(CMD, "out of memory");
            rc = CLI_FAIL;
        }
    }
    cJSON_Delete(j);
    return rc;
}

static int read_text(const char *path, char **text, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        cli_error(CMD, "cannot open '%s': %s", path, strerror(errno));
        return CLI_FAIL;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        if (n + 1 >= cap) {
            char *nb = cap < ((size_t)1 << 40) ? realloc(b, cap * 2) : NULL;
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb, cap *= 2;
        }
        const size_t got = fread(b + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
    }
    const int err = ferror(f);
    fclose(f);
    if (!b || err) {
        free(b);
        cli_error(CMD, b ? "reading '%s' failed" : "out of memory reading '%s'", path);
        return CLI_FAIL;
    }
    b[n] = 0;
    *text = b, *len = n;
    return 0;
}

/* Whether a TSV's first line is a header: its last field "label" (any case), or a name
 * headers use (labels, gold_label, target, class, category, sentiment) that no other line
 * has as its label. */
static int is_header(const ft_rows *rows) {
    static const char *const names[] = {"labels", "gold_label", "target", "class", "category", "sentiment"};
    const char *l = rows->v[0].label;
    if (!strcasecmp(l, "label")) return 1;
    int named = 0;
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) named |= !strcasecmp(l, names[k]);
    for (int64_t k = 1; named && k < rows->n; k++)
        if (!strcmp(rows->v[k].label, l)) return 0;
    return named;
}

/* The rows of a TSV or JSONL file (JSONL when its first non-blank character is '{'). */
static int read_rows(const char *path, ft_rows *out) {
    char *text;
    size_t len;
    int rc = read_text(path, &text, &len);
    if (rc) return rc;
    size_t first = len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3) ? 3 : 0; /* a byte-order mark */
    const size_t start = first;
    while (first < len && (text[first] == ' ' || text[first] == '\n' || text[first] == '\r' || text[first] == '\t'))
        first++;
    const int jsonl = first < len && text[first] == '{';
    int64_t ln = 0;
    for (size_t p = start; p < len && !rc;) {
        char *nl = memchr(text + p, '\n', len - p);
        size_t e = nl ? (size_t)(nl - text) : len, n = e - p;
        ln++;
        char *s = text + p;
        p = e + 1;
        if (n && s[n - 1] == '\r') n--;
        size_t k = 0;
        while (k < n && (s[k] == ' ' || s[k] == '\t')) k++;
        if (k == n) continue; /* a blank line */
        const int64_t bad = utf8_bad((const unsigned char *)s, n);
        if (bad >= 0) {
            cli_error(CMD, "%s:%" PRId64 ": invalid UTF-8 at byte %" PRId64 " of the line", path, ln, bad + 1);
            rc = CLI_FAIL;
            break;
        }
        const char *nul = memchr(s, 0, n), *cr = jsonl ? NULL : memchr(s, '\r', n);
        if (nul || cr) { /* a NUL would end the text early; a CR alone ends lines on old Macs */
            cli_error(CMD, "%s:%" PRId64 ": %s at byte %td of the line%s", path, ln, nul ? "a NUL byte" : "a carriage return",
                      (nul ? nul : cr) - s + 1, nul ? ": a text holds none" : " (lines end in \\n or \\r\\n)");
            rc = CLI_FAIL;
            break;
        }
        if (out->n == out->cap) {
            const int64_t cap = out->cap ? out->cap * 2 : 256;
            ft_row *v = realloc(out->v, (size_t)cap * sizeof *v);
            if (!v) {
                cli_error(CMD, "out of memory reading '%s'", path);
                rc = CLI_FAIL;
                break;
            }
            out->v = v, out->cap = cap;
        }
        ft_row *row = &out->v[out->n];
        memset(row, 0, sizeof *row);
        row->line = ln;
        rc = jsonl ? parse_jsonl(path, ln, s, n, row) : parse_tsv(path, ln, s, n, row);
        out->n++; /* freed with the rest, parsed or not */
    }
    free(text);
    if (!rc && !jsonl && out->n > 0 && is_header(out)) {
        ft_row *h = &out->v[0];
        free(h->text), free(h->text_b), free(h->label);
        memmove(out->v, out->v + 1, (size_t)(out->n - 1) * sizeof *out->v);
        out->n--;
    }
    if (!rc && out->n == 0) {
        cli_error(CMD, "%s: no examples in it", path);
        rc = CLI_FAIL;
    }
    return rc;
}

/* --- the classes ------------------------------------------------------------------- */

typedef struct {
    char **name;
    int64_t n;
} ft_labels;

static void labels_free(ft_labels *l) {
    for (int64_t k = 0; k < l->n; k++) free(l->name[k]);
    free(l->name);
    memset(l, 0, sizeof *l);
}

static int is_number(const char *s, double *v) {
    char *end;
    *v = strtod(s, &end);
    return *s && !*end && isfinite(*v);
}

static int g_numeric; /* the sort's order: numbers as numbers */
static int cmp_label(const void *a, const void *b) {
    const char *x = *(char *const *)a, *y = *(char *const *)b;
    double u, v;
    if (g_numeric && is_number(x, &u) && is_number(y, &v) && u != v) return u < v ? -1 : 1;
    return strcmp(x, y);
}

static int64_t label_index(const ft_labels *l, const char *s) {
    for (int64_t k = 0; k < l->n; k++)
        if (!strcmp(l->name[k], s)) return k;
    return -1;
}

static int labels_add(ft_labels *l, const char *s, size_t n) {
    char **v = realloc(l->name, (size_t)(l->n + 1) * sizeof *v);
    if (!v) return -1;
    l->name = v;
    if (!(v[l->n] = dup_n(s, n))) return -1;
    l->n++;
    return 0;
}

/* --labels A,B,C as given, else the training file's, sorted. */
static int make_labels(const ft_opts *o, const ft_rows *rows, ft_labels *l) {
    if (o->labels) {
        for (const char *p = o->labels;;) {
            const char *c = strchr(p, ',');
            const size_t n = c ? (size_t)(c - p) : strlen(p);
            if (!n) {
                cli_usage_error(CMD, "--labels '%s': an empty class name", o->labels);
                return CLI_USAGE;
            }
            if (labels_add(l, p, n)) return CLI_FAIL;
            if (label_index(l, l->name[l->n - 1]) != l->n - 1) {
                cli_usage_error(CMD, "--labels '%s': '%s' twice", o->labels, l->name[l->n - 1]);
                return CLI_USAGE;
            }
            if (!c) break;
            p = c + 1;
        }
    } else {
        int numeric = 1;
        double v;
        for (int64_t k = 0; k < rows->n; k++)
            if (label_index(l, rows->v[k].label) < 0) {
                if (labels_add(l, rows->v[k].label, strlen(rows->v[k].label))) return CLI_FAIL;
                numeric &= is_number(rows->v[k].label, &v);
            }
        g_numeric = numeric;
        qsort(l->name, (size_t)l->n, sizeof *l->name, cmp_label);
    }
    if (l->n < 2) {
        char n0[48];
        (o->labels ? cli_usage_error : cli_error)(CMD, "%s: %" PRId64 " class (%s): a classifier needs 2 or more",
                                                  o->labels ? "--labels" : o->train, l->n,
                                                  l->n ? cli_short(l->name[0], n0, sizeof n0) : "");
        return o->labels ? CLI_USAGE : CLI_FAIL;
    }
    return 0;
}

/* --- examples as token ids --------------------------------------------------------- */

typedef struct {
    int64_t n, seq;
    int32_t *ids, *types, *label; /* n * seq, n * seq, n */
    float *mask;                  /* n * seq */
    int64_t truncated;            /* examples cut to --seq */
} ft_data;

static void data_free(ft_data *d) {
    free(d->ids), free(d->types), free(d->label), free(d->mask);
    memset(d, 0, sizeof *d);
}

/* Example k: [CLS] a [SEP] (b [SEP]), cut to fit J as transformers' truncation
 * "longest_first" cuts (dm_truncate_pair). */
static void assemble(ft_data *d, int64_t k, const dm_ids *a, const dm_ids *b, int has_b, const dm_special_ids *sp) {
    const int64_t J = d->seq;
    int64_t la = (int64_t)a->n, lb = has_b ? (int64_t)b->n : 0;
    const int64_t room = J - (has_b ? 3 : 2);
    if (la + lb > room) d->truncated++;
    dm_truncate_pair(la, lb, room, &la, &lb);
    int32_t *ids = d->ids + k * J, *tt = d->types + k * J;
    float *m = d->mask + k * J;
    int64_t p = 0;
    ids[p] = sp->cls, tt[p++] = 0;
    for (int64_t i = 0; i < la; i++) ids[p] = a->v[i], tt[p++] = 0;
    ids[p] = sp->sep, tt[p++] = 0;
    if (has_b) {
        for (int64_t i = 0; i < lb; i++) ids[p] = b->v[i], tt[p++] = 1;
        ids[p] = sp->sep, tt[p++] = 1;
    }
    for (int64_t j = 0; j < J; j++) {
        m[j] = j < p ? 1.0f : 0.0f;
        if (j >= p) ids[j] = sp->pad, tt[j] = 0;
    }
}

static int encode_rows(const char *path, const ft_rows *rows, const ft_labels *l, const dm_tokenizer *tok,
                       const dm_special_ids *sp, int64_t J, ft_data *d) {
    const int64_t n = rows->n;
    d->n = n, d->seq = J;
    d->ids = malloc((size_t)(n * J) * sizeof(int32_t));
    d->types = malloc((size_t)(n * J) * sizeof(int32_t));
    d->mask = malloc((size_t)(n * J) * sizeof(float));
    d->label = malloc((size_t)n * sizeof(int32_t));
    if (!d->ids || !d->types || !d->mask || !d->label) {
        cli_error(CMD, "out of memory for the examples of '%s'", path);
        return CLI_FAIL;
    }
    dm_ids a = {0}, b = {0};
    int rc = 0;
    for (int64_t k = 0; k < n && !rc; k++) {
        const ft_row *r = &rows->v[k];
        const int64_t c = label_index(l, r->label);
        if (c < 0) {
            char nl[64], n0[48], n1[48];
            cli_error(CMD, "%s:%" PRId64 ": label '%s' is not one of the %" PRId64 " classes (%s%s%s%s): give every "
                      "class with --labels", path, r->line, cli_short(r->label, nl, sizeof nl), l->n,
                      cli_short(l->name[0], n0, sizeof n0), l->n > 1 ? ", " : "", cli_short(l->name[1], n1, sizeof n1),
                      l->n > 2 ? ", ..." : "");
            rc = CLI_FAIL;
            break;
        }
        a.n = b.n = 0;
        if (dm_tokenizer_encode(tok, r->text, strlen(r->text), 0, &a, NULL) != DM_OK ||
            (r->text_b && dm_tokenizer_encode(tok, r->text_b, strlen(r->text_b), 0, &b, NULL) != DM_OK)) {
            cli_error(CMD, "%s:%" PRId64 ": %s", path, r->line, dm_last_error());
            rc = CLI_FAIL;
            break;
        }
        assemble(d, k, &a, &b, r->text_b != NULL, sp);
        d->label[k] = (int32_t)c;
    }
    dm_ids_free(&a);
    dm_ids_free(&b);
    return rc;
}

/* A file's examples, through its rows; the classes made from them when l is empty. */
static int load_examples(const ft_opts *o, const char *path, ft_labels *l, const dm_tokenizer *tok,
                         const dm_special_ids *sp, ft_data *d) {
    ft_rows rows = {0};
    int rc = read_rows(path, &rows);
    if (!rc && !l->n) rc = make_labels(o, &rows, l);
    if (!rc) rc = encode_rows(path, &rows, l, tok, sp, o->c.cfg.seq, d);
    rows_free(&rows);
    return rc;
}

/* --- the run ------------------------------------------------------------------------ */

typedef struct {
    int64_t step;
    double loss, acc;
} ft_eval;

typedef struct {
    ft_opts o;
    dm_tokenizer *tok;
    dm_vocab_info vocab;
    ft_labels labels;
    ft_data train, eval;
    dm_trainer *T;
    dm_bert_model bm;
    int64_t *perm, perm_epoch; /* the order of the training examples in epoch perm_epoch */
    int32_t *bids, *btypes, *blabel;
    float *bmask;
    double *losses;
    ft_eval *evals;
    int64_t nevals, steps, start, stop, ran, scored, correct;
    double t_total;
} ft_run;

/* Epoch e's order: a Fisher-Yates shuffle from the seed and e alone. */
static void make_perm(ft_run *r, int64_t e) {
    const int64_t n = r->train.n;
    cli_rng g;
    cli_rng_seed(&g, r->o.c.cfg.seed * 0x9E3779B97F4A7C15ull + (uint64_t)e + 1);
    for (int64_t k = 0; k < n; k++) r->perm[k] = k;
    for (int64_t k = n - 1; k > 0; k--) {
        const int64_t j = (int64_t)(cli_rng_u64(&g) % (uint64_t)(k + 1)), t = r->perm[k];
        r->perm[k] = r->perm[j], r->perm[j] = t;
    }
    r->perm_epoch = e;
}

/* Row b of the batch from example k of d (k < 0: a filler, [CLS] [SEP] without a label). */
static void put_row(ft_run *r, int64_t b, const ft_data *d, int64_t k) {
    const int64_t J = r->o.c.cfg.seq;
    if (k >= 0) {
        memcpy(r->bids + b * J, d->ids + k * J, (size_t)J * sizeof(int32_t));
        memcpy(r->btypes + b * J, d->types + k * J, (size_t)J * sizeof(int32_t));
        memcpy(r->bmask + b * J, d->mask + k * J, (size_t)J * sizeof(float));
        r->blabel[b] = d->label[k];
        return;
    }
    for (int64_t j = 0; j < J; j++) {
        r->bids[b * J + j] = j == 0 ? r->vocab.special.cls : j == 1 ? r->vocab.special.sep : r->vocab.special.pad;
        r->btypes[b * J + j] = 0;
        r->bmask[b * J + j] = j < 2 ? 1.0f : 0.0f;
    }
    r->blabel[b] = -1;
}

/* Micro-batch g (from 0) of the run: each epoch's shuffled examples in batches of B, its
 * last batch filled up with fillers (unlabelled rows, which weigh nothing: the batch's
 * loss is the mean over its examples, as a DataLoader's short last batch); past the last
 * epoch, fillers alone. */
static dm_status train_batch(ft_run *r, int64_t g) {
    const int64_t B = r->o.c.cfg.batch, N = r->train.n, per_epoch = (N + B - 1) / B;
    const int64_t e = g / per_epoch;
    if (e < r->o.epochs && e != r->perm_epoch) make_perm(r, e);
    for (int64_t b = 0; b < B; b++) {
        const int64_t p = (g % per_epoch) * B + b;
        put_row(r, b, &r->train, e < r->o.epochs && p < N ? r->perm[p] : -1);
    }
    return dm_trainer_set_cls_batch(r->T, r->bids, r->btypes, r->bmask, r->blabel);
}

/* The held-out accuracy and loss over the whole --eval file. */
static dm_status evaluate(ft_run *r, int64_t step) {
    const int64_t B = r->o.c.cfg.batch, N = r->eval.n;
    double sum = 0;
    int64_t scored = 0, correct = 0;
    for (int64_t k = 0; k < N; k += B) {
        for (int64_t b = 0; b < B; b++) put_row(r, b, &r->eval, k + b < N ? k + b : -1);
        dm_status s = dm_trainer_set_cls_batch(r->T, r->bids, r->btypes, r->bmask, r->blabel);
        double l = 0;
        dm_mlm_stats st;
        if (s == DM_OK) s = dm_trainer_evaluate(r->T, &l);
        if (s == DM_OK) s = dm_trainer_mlm_stats(r->T, &st);
        if (s != DM_OK) return s;
        sum += l * (double)st.scored;
        scored += st.scored, correct += st.correct;
    }
    ft_eval *e = &r->evals[r->nevals++];
    e->step = step;
    e->loss = scored ? sum / (double)scored : 0.0;
    e->acc = scored ? (double)correct / (double)scored : 0.0;
    return DM_OK;
}

/* Step s: its micro-batches and the update; the step's loss is the mean over all their
 * labelled sequences (one batch's mean, as the update weighs them). */
static int one_step(ft_run *r, int64_t s, double *loss) {
    const int k = r->o.opt.optim.accumulate;
    double sum = 0.0, plain = 0.0;
    int64_t scored = 0;
    *loss = 0;
    for (int m = 0; m < k; m++) {
        double l = 0;
        dm_mlm_stats st;
        if (train_batch(r, (s - 1) * k + m) != DM_OK || dm_trainer_step(r->T, &l) != DM_OK ||
            dm_trainer_mlm_stats(r->T, &st) != DM_OK)
            return -1;
        sum += l * (double)st.scored, scored += st.scored, plain += l / k;
        r->scored += st.scored, r->correct += st.correct;
    }
    *loss = scored ? sum / (double)scored : plain;
    return 0;
}

/* A model's sizes from a Hugging Face config (--init's, its tensors checked against it
 * before a model of its sizes is made, or --config's). */
static int apply_hf(ft_run *r, const char *opt, const char *path) {
    ft_opts *o = &r->o;
    const int init = !strcmp(opt, "--init"); /* --layers-from needs it (check_options) */
    dm_hf_config hc;
    if (dm_hf_config_read(path, &hc) != DM_OK || (init && dm_hf_check_weights(&hc, o->init) != DM_OK)) {
        cli_error(CMD, "%s: %s", opt, dm_last_error());
        return CLI_FAIL;
    }
    if (hc.vocab_size != r->vocab.vocab_size || hc.pad_token_id != r->vocab.special.pad) {
        cli_error(CMD, "%s: vocab_size %" PRId64 " and pad_token_id %" PRId64 ", but the tokenizer has %d tokens "
                  "and [PAD] %d: use the tokenizer the model was made for", opt, hc.vocab_size, hc.pad_token_id,
                  r->vocab.vocab_size, r->vocab.special.pad);
        return CLI_FAIL;
    }
    if (!isnan(hc.classifier_dropout) && hc.classifier_dropout != hc.hidden_dropout_prob && !o->c.dropout_set) {
        cli_error(CMD, "%s: classifier_dropout %g differs from hidden_dropout_prob %g: dmove's model has one "
                  "dropout probability: give --dropout P to train with one", opt, hc.classifier_dropout,
                  hc.hidden_dropout_prob);
        return CLI_FAIL;
    }
    int rc = cli_config_from_hf(&o->c, CMD, opt, path, &hc);
    if (rc) return rc;
    if (o->layers_from >= hc.num_hidden_layers) {
        cli_usage_error(CMD, "--layers-from %d: the model has layers 0 to %" PRId64, o->layers_from,
                        hc.num_hidden_layers - 1);
        return CLI_USAGE;
    }
    if (o->layers_set && (init ? o->layers_from + o->layers > hc.num_hidden_layers : o->layers != hc.num_hidden_layers)) {
        cli_usage_error(CMD, "--layers %d%s contradicts %s (num_hidden_layers %" PRId64 ")", o->layers,
                        o->layers_from ? " from --layers-from" : "", path, hc.num_hidden_layers);
        return CLI_USAGE;
    }
    if ((o->positions_set && o->positions != hc.max_position_embeddings) ||
        (o->types_set && o->types != hc.type_vocab_size)) {
        cli_usage_error(CMD, "--positions or --types contradicts %s (max_position_embeddings %" PRId64
                        ", type_vocab_size %" PRId64 "): leave them out", path, hc.max_position_embeddings,
                        hc.type_vocab_size);
        return CLI_USAGE;
    }
    if (!o->layers_set) o->layers = (int)(hc.num_hidden_layers - o->layers_from);
    o->positions = hc.max_position_embeddings;
    o->types = hc.type_vocab_size;
    return 0;
}

/* --init's parameters into the trainer (dm_trainer_load_body: every tensor checked, and a
 * config.json beside them against the tensors, before anything changes): the embeddings
 * and every encoder layer must be there, the pooler is taken if there; the classifier
 * starts new. */
static int load_init(ft_run *r, const char *weights) {
    if (dm_trainer_load_body(r->T, weights, r->o.layers_from) != DM_OK) return fail_dm("--init: ");
    if (!r->o.json) {
        const char *note = dm_trainer_load_note(r->T);
        fprintf(stderr, "  --init: parameters from %s", weights);
        if (r->o.layers_from || r->o.layers_set)
            fprintf(stderr, " (layers %d to %d)", r->o.layers_from, r->o.layers_from + r->o.layers - 1);
        fprintf(stderr, "; the classifier starts new%s%s\n", *note ? "; not in it, at BERT's initialisation: " : "",
                note);
    }
    return 0;
}

/* The run's tag: the training file's name and the classes (a checkpoint of another run is
 * not resumed). */
/* What the run trains on, in its checkpoints (a checkpoint of another run is not resumed):
 * the training examples as tokenized (ids, token types, mask, classes: other data, another
 * tokenizer of the same size, another --seq all differ), the class names, the epochs. */
static int set_tag(ft_run *r) {
    uint64_t h = 14695981039346656037ull;
    for (int64_t k = 0; k < r->labels.n; k++)
        for (const unsigned char *p = (const unsigned char *)r->labels.name[k];; p++) {
            h = (h ^ *p) * 1099511628211ull;
            if (!*p) break;
        }
    const ft_data *d = &r->train;
    const size_t nj = (size_t)(d->n * d->seq);
    const uint64_t part[4] = {dm_data_hash64(d->ids, nj * sizeof *d->ids), dm_data_hash64(d->types, nj * sizeof *d->types),
                              dm_data_hash64(d->mask, nj * sizeof *d->mask),
                              dm_data_hash64(d->label, (size_t)d->n * sizeof *d->label)};
    char tag[128], tag1[128];
    snprintf(tag, sizeof tag, "finetune data %016" PRIx64 " %" PRId64 " classes %016" PRIx64 " epochs %" PRId64,
             dm_data_hash64(part, sizeof part), r->labels.n, h, r->o.epochs);
    const char *base = strrchr(r->o.train, '/'); /* an older dmove's (version 1) tag of the run */
    snprintf(tag1, sizeof tag1, "finetune %.60s %" PRId64 " classes %016" PRIx64 " epochs %" PRId64,
             base ? base + 1 : r->o.train, r->labels.n, h, r->o.epochs);
    if (dm_trainer_set_run_tag(r->T, tag) != DM_OK ||
        dm_trainer_set_run_tag_v1(r->T, tag1, "its batches ran on across epochs, where each epoch now has its own "
                                              "(the last one short): it cannot go on as it would have; start the "
                                              "run again, or take its model (dmove export) as --init") != DM_OK)
        return fail_dm("");
    return 0;
}

static int check_options(ft_opts *o) {
    if (!o->train || (!o->tokenizer && !o->init)) {
        cli_usage_error(CMD, "--train FILE and --tokenizer FILE are required (or --init DIR: its tokenizer)");
        return CLI_USAGE;
    }
    if (o->init && o->config) {
        cli_usage_error(CMD, "--init and --config exclude each other (--init's directory has its config)");
        return CLI_USAGE;
    }
    if (o->layers_from && !o->init) {
        cli_usage_error(CMD, "--layers-from picks layers of a pretrained model: it needs --init");
        return CLI_USAGE;
    }
    const dm_layer_options chk = cli_device_layer_options(&o->dev, o->c.threads, !o->no_unpad);
    if (cli_options_check(CMD, &chk)) return CLI_USAGE;
    if ((o->until || o->save_every) && !o->save) {
        cli_usage_error(CMD, "--until and --save-every need --save FILE");
        return CLI_USAGE;
    }
    const cli_path reads[6] = {{.opt = "--train", .path = o->train},
                               {.opt = "--eval", .path = o->eval},
                               {.opt = "--tokenizer", .path = o->tokenizer},
                               {.opt = "--init", .path = o->init, .dir = 1},
                               {.opt = "--config", .path = o->config},
                               {.opt = "--resume", .path = o->resume, .same_ok = "--save"}};
    const cli_path writes[3] = {{.opt = "--save", .path = o->save},
                                {.opt = "--svg", .path = o->svg},
                                {.opt = "--export", .path = o->export_dir, .dir = 1}};
    int rc = cli_check_paths(CMD, reads, 6, writes, 3);
    if (rc) return rc;
    if (!o->tokenizer && !(o->tokenizer = cli_init_tokenizer(o->init, o->init_dir, sizeof o->init_dir))) {
        cli_error(CMD, "--init %s: %s", o->init, strerror(errno));
        return CLI_FAIL;
    }
    const char *outs[2] = {o->save, o->svg}, *outn[2] = {"--save", "--svg"};
    for (int k = 0; k < 2; k++) {
        rc = outs[k] ? cli_check_output(CMD, outn[k], outs[k]) : 0;
        if (rc) return rc;
    }
    return 0;
}

/* The model: its sizes (from --init, --config or the options), the trainer, its
 * parameters (new, --init's, or --resume's). */
static int make_model(ft_run *r, const char *weights) {
    ft_opts *o = &r->o;
    const dm_layer_config *cfg = &o->c.cfg;
    r->bm = (dm_bert_model){.vocab = r->vocab.vocab_size, .positions = o->positions, .types = o->types,
                            .pad_id = r->vocab.special.pad, .num_labels = r->labels.n};
    dm_layer_options lo = cli_device_layer_options(&o->dev, o->c.threads, !o->no_unpad);
    if (dm_trainer_new_bert(&r->T, cfg, o->layers, &r->bm, &lo, &o->opt.optim) != DM_OK) return fail_dm("");
    if (dm_trainer_set_label_names(r->T, (const char *const *)r->labels.name) != DM_OK) return fail_dm("");
    int rc = set_tag(r);
    if (rc) return rc;
    if (dm_trainer_init_params(r->T, cfg->seed) != DM_OK) return fail_dm("");
    if (o->resume) return dm_trainer_load(r->T, o->resume) != DM_OK ? fail_dm("--resume: ") : 0;
    return weights ? load_init(r, weights) : 0;
}

static int setup(ft_run *r) {
    ft_opts *o = &r->o;
    int rc = check_options(o);
    if (rc) return rc;
    if ((rc = cli_open_tokenizer(CMD, o->tokenizer, o->lowercase, o->cased, &r->tok)) != CLI_OK) return rc;
    if (dm_vocab_info_from(r->tok, &r->vocab) != DM_OK) return fail_dm("--tokenizer: ");
    char weights[4096] = "", config[4096] = "";
    if (o->init) {
        if (dm_hf_model_files(o->init, weights, sizeof weights, config, sizeof config) != DM_OK)
            return fail_dm("--init: ");
        if (!config[0]) {
            cli_error(CMD, "--init %s: no config.json beside the weights (it gives the model's sizes)", o->init);
            return CLI_FAIL;
        }
        if ((rc = apply_hf(r, "--init", config)) != 0) return rc;
    } else if (o->config && (rc = apply_hf(r, "--config", o->config)) != 0) {
        return rc;
    }
    if (cli_config_finish(&o->c, CMD, 1)) return CLI_USAGE;
    const int64_t J = o->c.cfg.seq, B = o->c.cfg.batch;
    if (J < 3) {
        cli_usage_error(CMD, "--seq %" PRId64 ": [CLS] a [SEP] needs 3 or more", J);
        return CLI_USAGE;
    }
    if ((rc = load_examples(o, o->train, &r->labels, r->tok, &r->vocab.special, &r->train)) != 0) return rc;
    if (o->eval && (rc = load_examples(o, o->eval, &r->labels, r->tok, &r->vocab.special, &r->eval)) != 0) return rc;
    for (int f = 0; f < 2 && o->types < 2; f++) { /* a pair's second text is token type 1 */
        const ft_data *d = f ? &r->eval : &r->train;
        for (int64_t q = 0; d->types && q < d->n * J; q++)
            if (d->types[q] > 0) {
                cli_error(CMD, "%s holds pairs of texts, whose second is token type 1, and the model has one token "
                          "type (type_vocab_size 1): give single texts", f ? o->eval : o->train);
                return CLI_FAIL;
            }
    }
    const int64_t K = o->opt.optim.accumulate;
    if (r->train.n > INT64_C(1) << 40 || o->epochs > (INT64_C(1) << 50) / r->train.n) {
        cli_usage_error(CMD, "--epochs %" PRId64 " of %" PRId64 " examples: too many", o->epochs, r->train.n);
        return CLI_USAGE;
    }
    /* each epoch its own batches, the last one short (as a DataLoader without drop_last) */
    const int64_t per_epoch = (r->train.n + B - 1) / B;
    r->steps = (per_epoch * o->epochs + K - 1) / K;
    if (cli_optim_finish(&o->opt, CMD, r->steps)) return CLI_USAGE;
    if (o->until > r->steps) {
        cli_usage_error(CMD, "--until %" PRId64 " is past the run's %" PRId64 " steps", o->until, r->steps);
        return CLI_USAGE;
    }
    if ((rc = make_model(r, o->init ? weights : NULL)) != 0) return rc;
    r->start = dm_trainer_step_count(r->T);
    r->stop = o->until ? o->until : r->steps;
    if (r->start >= r->stop) {
        cli_usage_error(CMD, "the checkpoint is at step %" PRId64 ", already at %s %" PRId64, r->start,
                        o->until ? "--until" : "the run's last step", r->stop);
        return CLI_USAGE;
    }
    if (o->eval_every < 0) o->eval_every = r->steps >= 10 ? r->steps / 10 : r->steps;
    if (!o->log_every) o->log_every = r->steps > 15 ? r->steps / 15 : 1;
    r->perm_epoch = -1;
    const size_t n = (size_t)(B * J);
    r->bids = malloc(n * sizeof(int32_t)), r->btypes = malloc(n * sizeof(int32_t)), r->bmask = malloc(n * sizeof(float));
    r->blabel = malloc((size_t)B * sizeof(int32_t)), r->perm = malloc((size_t)r->train.n * sizeof(int64_t));
    r->losses = malloc((size_t)r->steps * sizeof(double));
    r->evals = malloc((size_t)(r->steps / (o->eval_every ? o->eval_every : 1) + 2) * sizeof(ft_eval));
    if (!r->bids || !r->btypes || !r->bmask || !r->blabel || !r->perm || !r->losses || !r->evals) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    return 0;
}

static void header(const ft_run *r) {
    const ft_opts *o = &r->o;
    const dm_layer_config *cfg = &o->c.cfg;
    char n0[48], n1[48];
    fprintf(stderr, "dmove finetune: BertForSequenceClassification, %" PRId64 " classes (%s%s%s%s), %d layers (i=%" PRId64
                    " h=%" PRId64 " u=%" PRId64 "; %.2fM parameters)%s, b=%" PRId64 " j=%" PRId64 ", dropout %g\n",
            r->labels.n, cli_short(r->labels.name[0], n0, sizeof n0), ", ", cli_short(r->labels.name[1], n1, sizeof n1),
            r->labels.n > 2 ? ", ..." : "", o->layers,
            cfg->hidden, cfg->heads, cfg->ffn, (double)dm_trainer_num_params(r->T) / 1e6,
            o->init ? ", from --init" : ", from scratch", cfg->batch, cfg->seq, cfg->dropout);
    char where[160];
    if (o->dev.device == DM_DEVICE_CUDA)
        fprintf(stderr, "  %s\n", cli_device_where(where, sizeof where, o->dev.device, o->dev.dtype, 0));
    char lrb[32];
    dm_fmt_exact(lrb, sizeof lrb, o->opt.optim.lr);
    fprintf(stderr, "  train: %s, %" PRId64 " examples (%" PRId64 " cut to %" PRId64 " tokens)", o->train, r->train.n,
            r->train.truncated, cfg->seq);
    if (o->eval) fprintf(stderr, "; eval: %s, %" PRId64 " examples", o->eval, r->eval.n);
    fprintf(stderr, "\n  %" PRId64 " epochs, %" PRId64 " steps; %s lr %s\n", o->epochs, r->steps,
            o->opt.optim.kind == DM_OPT_LAMB ? "LAMB" : "AdamW", lrb);
}

static int save(ft_run *r) { return dm_trainer_save(r->T, r->o.save) != DM_OK ? fail_dm("--save: ") : 0; }

static int failed_step(ft_run *r, int64_t done, int rc) {
    if (r->o.save && done > r->start && save(r) == 0)
        cli_error(CMD, "the state after step %" PRId64 " is saved to %s", done, r->o.save);
    return rc;
}

static int run_loop(ft_run *r) {
    const ft_opts *o = &r->o;
    double t0 = cli_now(), t_last = t0;
    int64_t last = r->start, sc0 = 0, co0 = 0;
    int rc;
    cli_catch_signals(CMD, o->save != NULL);
    for (int64_t s = r->start + 1; s <= r->stop && !cli_interrupted(); s++) {
        double l;
        if (one_step(r, s, &l)) {
            char where[64];
            snprintf(where, sizeof where, "step %" PRId64 ": ", s);
            return failed_step(r, s - 1, fail_dm(where));
        }
        r->losses[s - r->start - 1] = l;
        r->ran = s - r->start;
        if (s % o->log_every == 0 || s == r->start + 1 || s == r->stop || cli_interrupted()) {
            const double t = cli_now(), per = (t - t_last) / (double)(s - last);
            const int64_t ds = r->scored - sc0, dc = r->correct - co0;
            fprintf(stderr, "step %" PRId64 "/%" PRId64 "  loss %.4f  acc %.3f  lr %.2e  %.3f s/step\n", s, r->steps, l,
                    ds ? (double)dc / (double)ds : 0.0, dm_optim_lr(&o->opt.optim, s), per);
            t_last = t, last = s, sc0 = r->scored, co0 = r->correct;
        }
        if (o->eval && ((o->eval_every && s % o->eval_every == 0) || s == r->stop)) {
            if (evaluate(r, s) != DM_OK) return failed_step(r, s, fail_dm("evaluation: "));
            const ft_eval *e = &r->evals[r->nevals - 1];
            fprintf(stderr, "  held-out at step %" PRId64 ": accuracy %.4f, loss %.4f\n", s, e->acc, e->loss);
        }
        if (o->save && o->save_every && s % o->save_every == 0 && s < r->stop && (rc = save(r)) != 0) return rc;
    }
    r->t_total = cli_now() - t0;
    if (o->save && r->ran > 0 && (rc = save(r)) != 0) return rc;
    if (cli_interrupted() && r->start + r->ran < r->stop)
        cli_error(CMD, "interrupted after step %" PRId64 "%s%s", r->start + r->ran,
                  o->save ? ": checkpoint saved to " : " (no --save: nothing kept)", o->save ? o->save : "");
    return 0;
}

/* The chart (dm_train_chart_svg): the training and held-out loss over the held-out
 * accuracy, by step. */
static int write_svg(const ft_run *r, const char *path) {
    const size_t ne = (size_t)(r->nevals > 0 ? r->nevals : 1);
    int64_t *es = malloc(ne * sizeof *es);
    double *el = malloc(ne * sizeof *el), *ea = malloc(ne * sizeof *ea);
    int rc = 0;
    if (!es || !el || !ea) {
        cli_error(CMD, "out of memory");
        rc = CLI_FAIL;
    }
    for (int64_t k = 0; !rc && k < r->nevals; k++) es[k] = r->evals[k].step, el[k] = r->evals[k].loss, ea[k] = r->evals[k].acc;
    char title[160];
    snprintf(title, sizeof title, "dmove finetune: %" PRId64 " classes, %d layers, i=%" PRId64, r->labels.n,
             r->o.layers, r->o.c.cfg.hidden);
    const dm_train_chart ch = {.title = title, .loss_name = "loss (cross-entropy)", .acc_name = "held-out accuracy",
                               .loss = r->losses, .n = r->ran, .first_step = r->start + 1, .eval_step = es,
                               .eval_loss = el, .eval_acc = ea, .neval = r->nevals};
    if (!rc && dm_train_chart_svg(&ch, path) != DM_OK) rc = fail_dm("--svg: ");
    free(es), free(el), free(ea);
    return rc;
}

static void summary(const ft_run *r) {
    const ft_opts *o = &r->o;
    const ft_eval *e = r->nevals ? &r->evals[r->nevals - 1] : NULL;
    if (o->json) {
        printf("{\"classes\":%" PRId64 ",\"layers\":%d,\"params\":%" PRId64 ",\"train_examples\":%" PRId64
               ",\"steps\":%" PRId64 ",\"loss_first\":%.6f,\"loss_last\":%.6f,\"eval_examples\":%" PRId64
               ",\"eval_accuracy\":%.6f,\"eval_loss\":%.6f,\"seconds\":%.3f}\n", r->labels.n, o->layers,
               dm_trainer_num_params(r->T), r->train.n, r->start + r->ran, r->losses[0], r->losses[r->ran - 1],
               r->eval.n, e ? e->acc : -1.0, e ? e->loss : -1.0, r->t_total);
        return;
    }
    printf("loss %.4f (step %" PRId64 ") -> %.4f (step %" PRId64 ")", r->losses[0], r->start + 1,
           r->losses[r->ran - 1], r->start + r->ran);
    if (e) printf("; held-out accuracy %.4f (%" PRId64 " examples), loss %.4f", e->acc, r->eval.n, e->loss);
    printf("\n%.1f ms a step\n", 1e3 * r->t_total / (double)r->ran);
}

static void run_free(ft_run *r) {
    dm_trainer_free(r->T);
    dm_tokenizer_free(r->tok);
    labels_free(&r->labels);
    data_free(&r->train);
    data_free(&r->eval);
    free(r->perm), free(r->bids), free(r->btypes), free(r->bmask), free(r->blabel), free(r->losses), free(r->evals);
}

int cmd_finetune(int argc, char **argv) {
    ft_run r;
    memset(&r, 0, sizeof r);
    int rc = cli_parse(&k_finetune, &r.o, argc, argv);
    if (rc != CLI_GO) return rc;
    if ((rc = setup(&r)) == 0) {
        header(&r);
        rc = run_loop(&r);
    }
    if (rc == 0 && r.ran > 0) {
        summary(&r);
        if (r.o.svg) rc = write_svg(&r, r.o.svg);
        if (rc == 0 && r.o.export_dir) {
            if (dm_trainer_export(r.T, r.o.export_dir) != DM_OK) rc = fail_dm("--export: ");
            else fprintf(stderr, "exported: %s/model.safetensors and %s/config.json (BertForSequenceClassification)\n",
                         r.o.export_dir, r.o.export_dir);
        }
        if (rc == 0 && cli_interrupted() && r.start + r.ran < r.stop) rc = 130;
        if (rc == 0 && r.o.save)
            fprintf(stderr, "checkpoint: %s (step %" PRId64 "%s)\n", r.o.save, r.start + r.ran,
                    r.start + r.ran < r.steps ? "; go on with --resume" : "");
    }
    run_free(&r);
    return rc;
}
