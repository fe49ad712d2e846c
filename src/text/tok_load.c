/* tok_load.c: a dm_tokenizer from a Hugging Face tokenizer.json (WordPiece model,
 * BertNormalizer, BertPreTokenizer, TemplateProcessing / BertProcessing, added tokens) or a
 * vocab.txt (built as transformers 5's BertTokenizerFast builds it from one). Everything is
 * validated before use; a file that does not fit is refused with what to do. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "text/tok_internal.h"

#define TOK_MAX_FILE ((size_t)1 << 30)  /* a tokenizer file is a few MB; refuse past 1 GiB */
#define TOK_MAX_TOKEN 4096              /* bytes of one token */
#define TOK_MAX_VOCAB (1 << 24)

/* A token as a source gives it: text not NUL-terminated, in the file or the JSON tree. */
typedef struct {
    const char *s;
    size_t len;
    int32_t id;
} tok_entry;

typedef struct {
    tok_entry *vocab;
    size_t nv, cap;
    tok_added *added; /* s points into the source */
    size_t na;
    const char *unk;
    const char *names[5]; /* pad unk cls sep mask, as the source names them */
    const char **extra;   /* a directory's additional special tokens (its vocab.txt's) */
    size_t nextra;
} tok_src;

static void src_free(tok_src *s) {
    free(s->vocab);
    free(s->added);
    free(s->extra);
}

static const char *k_default_names[5] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
const char *const tok_special_keys[5] = {"pad_token", "unk_token", "cls_token", "sep_token", "mask_token"};

/* --- reading ------------------------------------------------------------------------------ */

static dm_status read_whole(const char *path, char **out, size_t *out_len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK); /* a FIFO: refused below, not waited on */
    if (fd < 0) return dm_fail(DM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return dm_fail(DM_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return dm_fail(DM_ERR_IO, "%s: is a directory; give the tokenizer.json or vocab.txt inside it", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dm_fail(DM_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > TOK_MAX_FILE) {
        close(fd);
        return dm_fail(DM_ERR_FORMAT, "%s: %lld bytes; a tokenizer file is at most 1 GiB (is this the right file?)",
                       path, (long long)st.st_size);
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return dm_fail(DM_ERR_OOM, "%s: out of memory reading %zu bytes", path, n);
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            return dm_fail(DM_ERR_IO, "%s: read failed: %s", path, r < 0 ? strerror(e) : "the file shrank while read");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = 0;
    *out = buf;
    *out_len = n;
    return DM_OK;
}

static dm_status src_add(tok_src *s, const char *tok, size_t len, int32_t id) {
    if (s->nv == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        tok_entry *v = realloc(s->vocab, cap * sizeof *v);
        if (!v) return dm_fail(DM_ERR_OOM, "out of memory reading the vocabulary");
        s->vocab = v;
        s->cap = cap;
    }
    s->vocab[s->nv++] = (tok_entry){tok, len, id};
    return DM_OK;
}

/* Printable excerpt of a token for messages. */
static const char *shown(const char *s, size_t len, char *buf, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < len && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    buf[o] = 0;
    return buf;
}

/* --- vocab.txt ---------------------------------------------------------------------------- */

/* One token a line, its line number (from 0) the id; lines split on "\n", trailing
 * whitespace dropped (tokenizers' WordPiece::read_file, which transformers uses). */
static dm_status parse_vocab_txt(tok_src *src, char *buf, size_t len, const char *path) {
    size_t bad = dm_utf8_invalid_at(buf, len);
    if (bad < len) {
        size_t line = 1;
        for (size_t i = 0; i < bad; i++) line += buf[i] == '\n';
        return dm_fail(DM_ERR_FORMAT, "%s: invalid UTF-8 at byte offset %zu (line %zu); a vocab.txt is UTF-8 text",
                       path, bad, line);
    }
    size_t i = 0;
    int32_t id = 0;
    while (i < len) {
        const char *e = memchr(buf + i, '\n', len - i);
        size_t end = e ? (size_t)(e - buf) : len;
        size_t n = end - i;
        /* trim_end: Unicode whitespace */
        for (size_t w; (w = tok_space_len((const unsigned char *)buf + i, n, 1)) != 0;) n -= w;
        if (n > TOK_MAX_TOKEN)
            return dm_fail(DM_ERR_FORMAT, "%s: line %d has %zu bytes; a token is at most %d (is this a vocab.txt?)",
                           path, id + 1, n, TOK_MAX_TOKEN);
        if (id >= TOK_MAX_VOCAB)
            return dm_fail(DM_ERR_FORMAT, "%s: more than %d lines; dmove takes vocabularies up to that size",
                           path, TOK_MAX_VOCAB);
        DM_TRY(src_add(src, buf + i, n, id));
        id++;
        i = end + 1;
    }
    if (!src->nv) return dm_fail(DM_ERR_FORMAT, "%s: empty vocabulary (a vocab.txt has one token a line)", path);
    return DM_OK;
}

/* As BertTokenizerFast (transformers 5) sets up any file: the five special tokens are
 * added tokens (not normalized; an entry of the file's own added_tokens for the same text
 * stays as it is); those the vocabulary lacks get new ids, in the order unk, sep, pad, cls,
 * mask (tokenizers' rule: the vocabulary's size, or one past the largest added id when
 * that is beyond it); the post-processor is "[CLS] $A [SEP]" with their ids, whatever
 * the file's says. */
static dm_status add_bert_specials(dm_tokenizer *t, tok_src *src) {
    static const int order[5] = {1, 3, 0, 2, 4};
    tok_added *a = realloc(src->added, (src->na + 5 + src->nextra) * sizeof *a);
    if (!a) return dm_fail(DM_ERR_OOM, "out of memory");
    src->added = a;
    for (size_t o = 0; o < 5 + src->nextra; o++) { /* (then the additional special tokens) */
        const char *name = o < 5 ? src->names[order[o]] : src->extra[o - 5];
        size_t len = strlen(name);
        int32_t id = -1;
        for (size_t i = 0; i < src->na && id < 0; i++)
            if (a[i].len == len && !memcmp(a[i].s, name, len)) id = a[i].id;
        if (id >= 0 || !len) continue;
        for (size_t i = 0; i < src->nv && id < 0; i++)
            if (src->vocab[i].len == len && !memcmp(src->vocab[i].s, name, len)) id = src->vocab[i].id;
        int implied = id < 0;
        if (implied) {
            int32_t max = -1;
            for (size_t i = 0; i < src->na; i++) max = a[i].id > max ? a[i].id : max;
            id = (max >= (int32_t)src->nv) ? max + 1 : (int32_t)src->nv;
        }
        a[src->na++] = (tok_added){.s = name, .len = len, .id = id, .special = 1, .implied = (uint8_t)implied};
    }
    for (size_t i = 0; i < src->na; i++) {
        if (a[i].len == strlen(src->names[2]) && !memcmp(a[i].s, src->names[2], a[i].len)) t->pre_ids[0] = a[i].id;
        if (a[i].len == strlen(src->names[3]) && !memcmp(a[i].s, src->names[3], a[i].len)) t->post_ids[0] = a[i].id;
    }
    t->n_pre = t->n_post = 1;
    return DM_OK;
}

/* A directory's added_tokens.json entries (dir_vocab_extras), in their order: a token of
 * the vocabulary keeps its id (and is matched as an added token), another takes the next
 * new one, from the vocabulary's size (as transformers 5.24 adds them; the file's ids only
 * order them). */
static void resolve_pending(tok_src *src) {
    int32_t next = (int32_t)src->nv;
    for (size_t i = 0; i < src->na; i++)
        if (!src->added[i].pending && src->added[i].id >= next) next = src->added[i].id + 1;
    for (size_t i = 0; i < src->na; i++) {
        tok_added *a = &src->added[i];
        if (!a->pending) continue;
        a->id = -1;
        for (size_t v = 0; v < src->nv && a->id < 0; v++)
            if (src->vocab[v].len == a->len && !memcmp(src->vocab[v].s, a->s, a->len)) a->id = src->vocab[v].id;
        if (a->id < 0) a->id = next++;
        a->pending = 0;
    }
}

/* vocab.txt: as BertTokenizerFast(vocab=..., do_lower_case=...) builds it. */
static dm_status setup_vocab_txt(dm_tokenizer *t, tok_src *src, dm_case casing, const char *path) {
    t->has_norm = t->clean = t->chinese = 1;
    t->lower = t->strip = casing == DM_CASE_LOWER;
    t->pretok = 1;
    t->max_chars = 100;
    strcpy(t->prefix, "##");
    for (int k = 0; k < 5; k++)
        if (!src->names[k]) src->names[k] = k_default_names[k]; /* (a directory's tokenizer_config.json names some) */
    src->unk = src->names[1];
    int found_unk = 0;
    const size_t ul = strlen(src->unk);
    for (size_t i = 0; i < src->nv; i++) found_unk |= src->vocab[i].len == ul && !memcmp(src->vocab[i].s, src->unk, ul);
    if (!found_unk)
        return dm_fail(DM_ERR_FORMAT, "%s: no %s line: WordPiece needs the unknown token in the vocabulary", path,
                       src->unk);
    resolve_pending(src);
    return add_bert_specials(t, src);
}

/* --- tokenizer.json ----------------------------------------------------------------------- */

static const char *jtype(const cJSON *j) {
    if (!j) return "missing";
    if (cJSON_IsNull(j)) return "null";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsObject(j)) return "an object";
    return "invalid";
}

/* obj.key as a boolean (def < 0: required, as tokenizers requires it; else missing or
 * null: def). */
static dm_status jbool(const cJSON *obj, const char *key, int def, int *out, const char *ctx) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (def < 0 && !cJSON_IsBool(j))
        return dm_fail(DM_ERR_FORMAT, "%s.%s is %s, not true or false (tokenizers requires it)", ctx, key, jtype(j));
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return DM_OK;
    }
    if (!cJSON_IsBool(j))
        return dm_fail(DM_ERR_FORMAT, "%s.%s is %s, not true or false", ctx, key, jtype(j));
    *out = cJSON_IsTrue(j);
    return DM_OK;
}

/* A JSON number that is an integer in [lo, hi]. */
static dm_status jint_val(const cJSON *j, double lo, double hi, int64_t *out, const char *what) {
    if (!cJSON_IsNumber(j)) return dm_fail(DM_ERR_FORMAT, "%s is %s, not an integer", what, jtype(j));
    double d = j->valuedouble;
    if (!(d >= lo && d <= hi) || d != floor(d))
        return dm_fail(DM_ERR_FORMAT, "%s is %.17g: not an integer in %.0f .. %.0f", what, d, lo, hi);
    *out = (int64_t)d;
    return DM_OK;
}

static dm_status jstr(const cJSON *obj, const char *key, const char **out, const char *ctx) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsString(j) || !j->valuestring)
        return dm_fail(DM_ERR_FORMAT, "%s.%s is %s, not a string", ctx, key, jtype(j));
    *out = j->valuestring;
    return DM_OK;
}

static dm_status parse_model(dm_tokenizer *t, tok_src *src, const cJSON *model) {
    if (!model)
        return dm_fail(DM_ERR_FORMAT, "no \"model\": not a Hugging Face tokenizer.json (dmove takes the tokenizer.json "
                       "of a WordPiece model, or a BERT vocab.txt)");
    if (!cJSON_IsObject(model)) return dm_fail(DM_ERR_FORMAT, "\"model\" is %s, not an object", jtype(model));
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(model, "type");
    const char *type = cJSON_IsString(ty) ? ty->valuestring : NULL;
    if (!type) type = cJSON_GetObjectItemCaseSensitive(model, "merges") ? "BPE" : NULL;
    if (!type) return dm_fail(DM_ERR_FORMAT, "model.type is %s: say which model it is (dmove supports WordPiece)", jtype(ty));
    if (strcmp(type, "WordPiece"))
        return dm_fail(DM_ERR_UNSUPPORTED, "the model is %s: dmove supports only WordPiece (BERT) tokenizers "
                       "(a tokenizer.json whose model.type is \"WordPiece\", or a BERT vocab.txt)", type);
    DM_TRY(jstr(model, "unk_token", &src->unk, "model"));
    const char *prefix = "##";
    DM_TRY(jstr(model, "continuing_subword_prefix", &prefix, "model"));
    if (strlen(prefix) >= sizeof t->prefix)
        return dm_fail(DM_ERR_FORMAT, "model.continuing_subword_prefix is %zu bytes long; at most %zu",
                       strlen(prefix), sizeof t->prefix - 1);
    strcpy(t->prefix, prefix);
    const cJSON *mx = cJSON_GetObjectItemCaseSensitive(model, "max_input_chars_per_word");
    int64_t m = 100;
    DM_TRY(jint_val(mx, 0, 2147483647.0, &m, "model.max_input_chars_per_word"));
    t->max_chars = (int)m;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return dm_fail(DM_ERR_FORMAT, "model.vocab is %s, not an object of token: id", jtype(vocab));
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        size_t len = strlen(e->string);
        double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
        if (!(d >= 0 && d <= TOK_MAX_VOCAB - 1 && d == floor(d))) { /* the message */
            char what[160], b[64];
            int64_t id = 0;
            snprintf(what, sizeof what, "the id of token \"%s\"", shown(e->string, len, b, sizeof b));
            DM_TRY(jint_val(e, 0, TOK_MAX_VOCAB - 1, &id, what));
        }
        DM_TRY(src_add(src, e->string, len, (int32_t)d));
    }
    if (!src->nv) return dm_fail(DM_ERR_FORMAT, "model.vocab is empty");
    return DM_OK;
}

static dm_status parse_bert_normalizer(dm_tokenizer *t, const cJSON *n) {
    t->has_norm = 1;
    DM_TRY(jbool(n, "clean_text", -1, &t->clean, "normalizer"));
    DM_TRY(jbool(n, "handle_chinese_chars", -1, &t->chinese, "normalizer"));
    DM_TRY(jbool(n, "lowercase", -1, &t->lower, "normalizer"));
    DM_TRY(jbool(n, "strip_accents", t->lower, &t->strip, "normalizer")); /* null: as lowercase */
    return DM_OK;
}

static dm_status parse_normalizer(dm_tokenizer *t, const cJSON *n) {
    if (!n || cJSON_IsNull(n)) return DM_OK;
    const char *type = NULL;
    if (!cJSON_IsObject(n) || jstr(n, "type", &type, "normalizer") != DM_OK)
        return dm_fail(DM_ERR_FORMAT, "\"normalizer\" is not an object with a \"type\"");
    if (!strcmp(type, "BertNormalizer")) return parse_bert_normalizer(t, n);
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        if (!cJSON_IsArray(list)) return dm_fail(DM_ERR_FORMAT, "normalizer.normalizers is %s, not an array", jtype(list));
        int k = cJSON_GetArraySize(list);
        if (k == 0) return DM_OK;
        const cJSON *one = cJSON_GetArrayItem(list, 0);
        const char *t1 = NULL;
        if (k == 1 && cJSON_IsObject(one) && jstr(one, "type", &t1, "normalizer") == DM_OK && !strcmp(t1, "BertNormalizer"))
            return parse_bert_normalizer(t, one);
        return dm_fail(DM_ERR_UNSUPPORTED, "the normalizer is a Sequence of %d: dmove supports BertNormalizer "
                       "(alone or as the only member of a Sequence) or none", k);
    }
    return dm_fail(DM_ERR_UNSUPPORTED, "the normalizer is %s: dmove supports BertNormalizer (BERT's) or none", type);
}

static dm_status parse_pretok(dm_tokenizer *t, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) {
        t->pretok = 0;
        return DM_OK;
    }
    const char *type = NULL;
    if (!cJSON_IsObject(p) || jstr(p, "type", &type, "pre_tokenizer") != DM_OK)
        return dm_fail(DM_ERR_FORMAT, "\"pre_tokenizer\" is not an object with a \"type\"");
    if (!strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        const cJSON *one = cJSON_GetArrayItem(list, 0);
        const char *t1 = NULL;
        if (cJSON_IsArray(list) && cJSON_GetArraySize(list) == 1 && cJSON_IsObject(one) &&
            jstr(one, "type", &t1, "pre_tokenizer") == DM_OK && !strcmp(t1, "BertPreTokenizer")) {
            t->pretok = 1;
            return DM_OK;
        }
        return dm_fail(DM_ERR_UNSUPPORTED, "the pre_tokenizer is a Sequence: dmove supports BertPreTokenizer "
                       "(alone or as the only member of a Sequence) or none");
    }
    if (strcmp(type, "BertPreTokenizer"))
        return dm_fail(DM_ERR_UNSUPPORTED, "the pre_tokenizer is %s: dmove supports BertPreTokenizer (BERT's) or none", type);
    t->pretok = 1;
    return DM_OK;
}

/* TemplateProcessing's "single", checked (the ids come from BertTokenizerFast's rule). */
static dm_status parse_template(const cJSON *p) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    if (!cJSON_IsArray(single)) return dm_fail(DM_ERR_FORMAT, "post_processor.single is %s, not an array", jtype(single));
    if (!cJSON_IsObject(specials))
        return dm_fail(DM_ERR_FORMAT, "post_processor.special_tokens is %s, not an object", jtype(specials));
    int seen_a = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, single) {
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(item, "Sequence");
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(item, "SpecialToken");
        const char *id = NULL;
        if (seq) {
            if (jstr(seq, "id", &id, "post_processor.single[].Sequence") || strcmp(id, "A") || seen_a)
                return dm_fail(DM_ERR_FORMAT, "post_processor.single: one Sequence \"A\" expected");
            seen_a = 1;
            continue;
        }
        if (!sp || jstr(sp, "id", &id, "post_processor.single[].SpecialToken"))
            return dm_fail(DM_ERR_FORMAT, "post_processor.single: each item is a Sequence or a SpecialToken with an id");
        const cJSON *entry = cJSON_GetObjectItemCaseSensitive(specials, id);
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
        if (!cJSON_IsArray(ids))
            return dm_fail(DM_ERR_FORMAT, "post_processor.special_tokens has no \"ids\" array for \"%s\"", id);
        const cJSON *v;
        cJSON_ArrayForEach(v, ids) {
            int64_t x;
            DM_TRY(jint_val(v, 0, TOK_MAX_VOCAB - 1, &x, "a post_processor special token id"));
        }
    }
    if (!seen_a) return dm_fail(DM_ERR_FORMAT, "post_processor.single has no Sequence \"A\"");
    return DM_OK;
}

/* The file's post-processor is checked when it is one of BERT's, else ignored:
 * BertTokenizerFast replaces it by "[CLS] $A [SEP]" (add_bert_specials). */
static dm_status parse_post(const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return DM_OK;
    const char *type = NULL;
    if (!cJSON_IsObject(p) || jstr(p, "type", &type, "post_processor") != DM_OK)
        return dm_fail(DM_ERR_FORMAT, "\"post_processor\" is not an object with a \"type\"");
    if (!strcmp(type, "TemplateProcessing")) return parse_template(p);
    if (strcmp(type, "BertProcessing") && strcmp(type, "RobertaProcessing")) return DM_OK;
    static const char *const keys[2] = {"cls", "sep"};
    for (int k = 0; k < 2; k++) {
        const cJSON *pair = cJSON_GetObjectItemCaseSensitive(p, keys[k]);
        const cJSON *name = cJSON_GetArrayItem(pair, 0);
        int64_t id;
        if (!cJSON_IsArray(pair) || cJSON_GetArraySize(pair) != 2 || !cJSON_IsString(name))
            return dm_fail(DM_ERR_FORMAT, "post_processor.%s is not a [token, id] pair", keys[k]);
        DM_TRY(jint_val(cJSON_GetArrayItem(pair, 1), 0, TOK_MAX_VOCAB - 1, &id, "the post_processor's id"));
    }
    return DM_OK;
}

static dm_status parse_added(tok_src *src, const cJSON *a) {
    if (!a || cJSON_IsNull(a)) return DM_OK;
    if (!cJSON_IsArray(a)) return dm_fail(DM_ERR_FORMAT, "\"added_tokens\" is %s, not an array", jtype(a));
    int n = cJSON_GetArraySize(a);
    src->added = calloc((size_t)n + 1, sizeof *src->added);
    if (!src->added) return dm_fail(DM_ERR_OOM, "out of memory");
    const cJSON *e;
    int k = 0;
    cJSON_ArrayForEach(e, a) {
        char ctx[48];
        snprintf(ctx, sizeof ctx, "added_tokens[%d]", k++);
        if (!cJSON_IsObject(e)) return dm_fail(DM_ERR_FORMAT, "%s is %s, not an object", ctx, jtype(e));
        tok_added *x = &src->added[src->na];
        int64_t id;
        int f[5];
        DM_TRY(jstr(e, "content", &x->s, ctx));
        char what[64];
        snprintf(what, sizeof what, "%s.id", ctx);
        DM_TRY(jint_val(cJSON_GetObjectItemCaseSensitive(e, "id"), 0, TOK_MAX_VOCAB - 1, &id, what));
        DM_TRY(jbool(e, "single_word", -1, &f[0], ctx));
        DM_TRY(jbool(e, "lstrip", -1, &f[1], ctx));
        DM_TRY(jbool(e, "rstrip", -1, &f[2], ctx));
        DM_TRY(jbool(e, "special", -1, &f[4], ctx));
        DM_TRY(jbool(e, "normalized", -1, &f[3], ctx));
        x->len = strlen(x->s);
        x->id = (int32_t)id;
        x->single_word = (uint8_t)f[0];
        x->lstrip = (uint8_t)f[1];
        x->rstrip = (uint8_t)f[2];
        x->normalized = (uint8_t)f[3];
        x->special = (uint8_t)f[4];
        if (x->len > TOK_MAX_TOKEN) return dm_fail(DM_ERR_FORMAT, "%s.content is over %d bytes", ctx, TOK_MAX_TOKEN);
        if (x->len) src->na++; /* tokenizers ignores empty ones */
    }
    return DM_OK;
}

static dm_status parse_json(dm_tokenizer *t, tok_src *src, const cJSON *root) {
    if (!cJSON_IsObject(root)) return dm_fail(DM_ERR_FORMAT, "the JSON is %s, not a tokenizer object", jtype(root));
    for (int k = 0; k < 5; k++) src->names[k] = k_default_names[k];
    DM_TRY(parse_model(t, src, cJSON_GetObjectItemCaseSensitive(root, "model")));
    DM_TRY(parse_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer")));
    DM_TRY(parse_pretok(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")));
    DM_TRY(parse_post(cJSON_GetObjectItemCaseSensitive(root, "post_processor")));
    /* the padding section's pad_token is not the pad token: BertTokenizerFast (transformers
     * 4 and 5) keeps its own, [PAD], and the text "[unused5]" stays four word pieces even
     * where a file pads with it */
    DM_TRY(parse_added(src, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")));
    return add_bert_specials(t, src);
}

/* --- building ----------------------------------------------------------------------------- */

static dm_status map_init(tok_map *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    m->slots = calloc(cap, sizeof *m->slots);
    if (!m->slots) return dm_fail(DM_ERR_OOM, "out of memory for the vocabulary's hash");
    m->mask = cap - 1;
    m->maxlen = 0;
    return DM_OK;
}

/* Inserts key -> id; returns the id already there for the same key, else -1. */
static int32_t map_put(tok_map *m, const char *key, size_t len, int32_t id) {
    uint64_t h = tok_hash(key, len);
    size_t i = h & m->mask;
    for (;; i = (i + 1) & m->mask) {
        tok_slot *s = &m->slots[i];
        if (!s->h) break;
        if (s->h == h && s->len == len && !memcmp(s->key, key, len)) return s->id;
    }
    m->slots[i] = (tok_slot){h, key, (uint32_t)len, id};
    if (len > m->maxlen) m->maxlen = len;
    return -1;
}

/* id -> token over the vocabulary and the added tokens: ids 0 .. size-1, no holes, no
 * token twice, the strings copied into t->pool. */
static dm_status build_ids(dm_tokenizer *t, const tok_src *src) {
    int32_t maxid = -1;
    for (size_t i = 0; i < src->nv; i++) maxid = src->vocab[i].id > maxid ? src->vocab[i].id : maxid;
    for (size_t i = 0; i < src->na; i++) maxid = src->added[i].id > maxid ? src->added[i].id : maxid;
    size_t size = (size_t)maxid + 1;
    if (size > src->nv + src->na)
        return dm_fail(DM_ERR_FORMAT, "the ids go up to %d with %zu tokens: ids must be 0 .. size-1 without holes",
                       maxid, src->nv + src->na);
    const char **txt = calloc(size, sizeof *txt);
    size_t *len = calloc(size, sizeof *len);
    if (!txt || !len) {
        free(txt);
        free(len);
        return dm_fail(DM_ERR_OOM, "out of memory");
    }
    dm_status st = DM_OK;
    char b1[64], b2[64];
    size_t total = 0;
    for (size_t i = 0; i < src->nv && !st; i++) {
        const tok_entry *e = &src->vocab[i];
        if (txt[e->id])
            st = dm_fail(DM_ERR_FORMAT, "id %d is given twice (\"%s\" and \"%s\")", e->id,
                         shown(txt[e->id], len[e->id], b1, sizeof b1), shown(e->s, e->len, b2, sizeof b2));
        txt[e->id] = e->s;
        len[e->id] = e->len;
    }
    for (size_t i = 0; i < src->na && !st; i++) {
        const tok_added *a = &src->added[i];
        if (!txt[a->id]) {
            txt[a->id] = a->s;
            len[a->id] = a->len;
        } else if (len[a->id] != a->len || memcmp(txt[a->id], a->s, a->len)) {
            st = dm_fail(DM_ERR_FORMAT, "added token \"%s\" has id %d, which the vocabulary gives to \"%s\"",
                         shown(a->s, a->len, b1, sizeof b1), a->id, shown(txt[a->id], len[a->id], b2, sizeof b2));
        }
        /* the vocabulary's own token under another id: tokenizers would keep the vocabulary's
         * id and number the added tokens after it anew, so the file's ids are not its */
        for (size_t v = 0; v < src->nv && !st; v++) {
            const tok_entry *e = &src->vocab[v];
            if (e->id != a->id && e->len == a->len && !memcmp(e->s, a->s, a->len))
                st = dm_fail(DM_ERR_FORMAT, "added token \"%s\" has id %d, and the vocabulary has it as id %d: "
                             "tokenizers would give it %d and number the added tokens anew: save the tokenizer "
                             "again with tokenizers or transformers", shown(a->s, a->len, b1, sizeof b1), a->id,
                             e->id, e->id);
        }
    }
    for (size_t i = 0; i < size && !st; i++) {
        if (!txt[i]) st = dm_fail(DM_ERR_FORMAT, "no token has id %zu: ids must be 0 .. %zu without holes", i, size - 1);
        else if (dm_utf8_invalid_at(txt[i], len[i]) < len[i])
            st = dm_fail(DM_ERR_FORMAT, "token %zu (\"%s\") is not valid UTF-8", i, shown(txt[i], len[i], b1, sizeof b1));
        else total += len[i] + 1;
    }
    if (!st) {
        t->pool = malloc(total ? total : 1);
        t->tok = malloc(size * sizeof *t->tok);
        t->tok_len = malloc(size * sizeof *t->tok_len);
        if (!t->pool || !t->tok || !t->tok_len) st = dm_fail(DM_ERR_OOM, "out of memory");
    }
    for (size_t i = 0, o = 0; i < size && !st; i++) {
        memcpy(t->pool + o, txt[i], len[i]);
        t->pool[o + len[i]] = 0;
        t->tok[i] = t->pool + o;
        t->tok_len[i] = (uint32_t)len[i];
        o += len[i] + 1;
    }
    if (!st) t->size = (int32_t)size;
    free(txt);
    free(len);
    return st;
}

static dm_status trie_init(tok_trie *t, size_t nodes) {
    uint32_t bits = 4;
    while (((size_t)1 << bits) < nodes + nodes / 3 + 2) bits++; /* load at most 3/4 */
    if (bits > 30) return dm_fail(DM_ERR_OOM, "the vocabulary is too large for the trie");
    t->s = calloc((size_t)1 << bits, sizeof *t->s);
    if (!t->s) return dm_fail(DM_ERR_OOM, "out of memory for the vocabulary's trie");
    t->bits = bits;
    t->nodes = 0;
    t->maxlen = 0;
    return DM_OK;
}

static void trie_put(tok_trie *t, const char *s, size_t n, int32_t id) {
    uint64_t h = TOK_TRIE_SEED;
    uint32_t parent = 0;
    size_t mask = ((size_t)1 << t->bits) - 1;
    for (size_t k = 0; k < n; k++) {
        uint8_t b = (uint8_t)s[k];
        h = tok_trie_next(h, b);
        uint32_t found = tok_trie_find(t, h, parent, b);
        if (!found) {
            uint64_t m = tok_trie_mix(h);
            size_t i = (size_t)(m >> (64 - t->bits));
            while (t->s[i].byte) i = (i + 1) & mask;
            t->s[i] = (tok_node){(uint32_t)m, parent, -1, (uint32_t)b + 1};
            t->nodes++;
            found = (uint32_t)i + 1;
        }
        parent = found;
        if (k + 1 == n && t->s[found - 1].id < 0) t->s[found - 1].id = id;
    }
    if (n > t->maxlen) t->maxlen = n;
}

/* The model's vocabulary into t->full (token -> id) and the tries WordPiece walks: t->tfull
 * (every token) and t->tcont (the continuations, less their prefix). */
static dm_status build_maps(dm_tokenizer *t, const tok_src *src) {
    DM_TRY(map_init(&t->full, src->nv));
    size_t pl = strlen(t->prefix), bytes = 0;
    for (size_t i = 0; i < src->nv; i++) bytes += src->vocab[i].len;
    if (bytes > ((size_t)1 << 23))
        return dm_fail(DM_ERR_FORMAT, "the vocabulary's tokens have %zu bytes together; dmove takes up to 8 MiB", bytes);
    char b[64];
    for (size_t i = 0; i < src->nv; i++) {
        int32_t id = src->vocab[i].id;
        const char *s = t->tok[id];
        size_t n = t->tok_len[id];
        int32_t old = map_put(&t->full, s, n, id);
        if (old >= 0)
            return dm_fail(DM_ERR_FORMAT, "token \"%s\" appears twice (ids %d and %d); each token once, please",
                           shown(s, n, b, sizeof b), old, id);
    }
    /* sized twice: by the bytes (a bound on the nodes), then by the nodes counted */
    for (int pass = 0; pass < 2; pass++) {
        size_t nf = t->tfull.nodes, nc = t->tcont.nodes;
        free(t->tfull.s);
        free(t->tcont.s);
        DM_TRY(trie_init(&t->tfull, pass ? nf : bytes));
        DM_TRY(trie_init(&t->tcont, pass ? nc : bytes));
        for (size_t i = 0; i < src->nv; i++) {
            int32_t id = src->vocab[i].id;
            const char *s = t->tok[id];
            size_t n = t->tok_len[id];
            trie_put(&t->tfull, s, n, id);
            if (n >= pl && !memcmp(s, t->prefix, pl)) trie_put(&t->tcont, s + pl, n - pl, id);
        }
    }
    t->unk = tok_map_get(&t->full, src->unk, strlen(src->unk));
    if (t->unk < 0)
        return dm_fail(DM_ERR_FORMAT, "the unknown token \"%s\" is not in the vocabulary (WordPiece needs it)",
                       shown(src->unk, strlen(src->unk), b, sizeof b));
    for (int k = 0; k < 5; k++) {
        if (strlen(src->names[k]) > TOK_MAX_SPECIAL)
            return dm_fail(DM_ERR_UNSUPPORTED, "the special token \"%s\" is longer than %d bytes, which dmove takes",
                           shown(src->names[k], strlen(src->names[k]), b, sizeof b), TOK_MAX_SPECIAL);
        snprintf(t->special_names[k], sizeof t->special_names[k], "%s", src->names[k]);
    }
    for (int k = 0; k < t->n_pre; k++)
        if (t->pre_ids[k] >= t->size) return dm_fail(DM_ERR_FORMAT, "the post-processor's id %d is past the vocabulary", t->pre_ids[k]);
    for (int k = 0; k < t->n_post; k++)
        if (t->post_ids[k] >= t->size) return dm_fail(DM_ERR_FORMAT, "the post-processor's id %d is past the vocabulary", t->post_ids[k]);
    return DM_OK;
}

/* The trie of set s (tok_addset); a content already in it keeps its first token. */
static dm_status addset_finish(tok_addset *s) {
    for (int b = 0; b < 256; b++) s->root[b] = -1;
    size_t bytes = 0;
    for (size_t i = 0; i < s->n; i++) bytes += s->v[i].len;
    if (bytes > INT32_MAX) return dm_fail(DM_ERR_FORMAT, "the added tokens hold %zu bytes; at most 2^31", bytes);
    s->node = malloc((bytes + 1) * sizeof *s->node);
    if (!s->node) return dm_fail(DM_ERR_OOM, "out of memory");
    int kinds = 0, one = -1;
    for (size_t i = 0; i < s->n; i++) {
        const uint8_t *c = (const uint8_t *)s->v[i].s;
        if (!s->v[i].len) continue;
        int32_t *link = &s->root[c[0]], k = -1;
        if (*link < 0) kinds++, one = c[0];
        for (size_t d = 0; d < s->v[i].len; d++) {
            if (d) { /* the child with byte c[d], else a new one first among them */
                link = &s->node[k].child;
                int32_t q = *link;
                while (q >= 0 && s->node[q].byte != c[d]) q = s->node[q].sibling;
                if (q >= 0) {
                    k = q;
                    continue;
                }
            } else if (*link >= 0) {
                k = *link;
                continue;
            }
            s->node[s->nnode] = (tok_anode){.child = -1, .sibling = d ? *link : -1, .tok = -1, .byte = c[d]};
            k = *link = (int32_t)s->nnode++;
        }
        if (s->node[k].tok < 0) s->node[k].tok = (int32_t)i;
    }
    s->one_first = kinds == 1 ? one : -1;
    return DM_OK;
}

static int by_content(const void *a, const void *b) {
    const tok_added *x = *(const tok_added *const *)a, *y = *(const tok_added *const *)b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x < y ? -1 : x > y; /* the file's order */
}

/* The added tokens, as the two sets the encoder matches (normalized ones in normal form). */
static dm_status build_added(dm_tokenizer *t, const tok_src *src) {
    t->added = calloc(src->na + 1, sizeof *t->added);
    t->raw.v = calloc(src->na + 1, sizeof *t->raw.v);
    t->normed.v = calloc(src->na + 1, sizeof *t->normed.v);
    const tok_added **order = malloc((src->na + 1) * sizeof *order);
    uint8_t *dup = calloc(src->na + 1, 1);
    if (!t->added || !t->raw.v || !t->normed.v || !order || !dup) {
        free(order);
        free(dup);
        return dm_fail(DM_ERR_OOM, "out of memory");
    }
    /* a second entry for the same content: tokenizers keeps the first */
    for (size_t i = 0; i < src->na; i++) order[i] = &src->added[i];
    qsort(order, src->na, sizeof *order, by_content);
    for (size_t i = 1; i < src->na; i++)
        if (order[i]->len == order[i - 1]->len && !memcmp(order[i]->s, order[i - 1]->s, order[i]->len))
            dup[order[i] - src->added] = 1;
    free(order);
    dm_status st = DM_OK;
    for (size_t i = 0; i < src->na && !st; i++) {
        tok_added a = src->added[i];
        a.s = t->tok[a.id];
        t->added[t->n_added++] = a;
        if (dup[i]) continue;
        if (!a.normalized) {
            t->raw.v[t->raw.n++] = a;
            continue;
        }
        size_t n = 0;
        char *s = tok_normalize_string(t, a.s, a.len, &n);
        if (!s) st = dm_fail(DM_ERR_OOM, "out of memory");
        else if (!n) free(s);
        else {
            a.s = s;
            a.len = n;
            t->normed.v[t->normed.n++] = a;
        }
    }
    free(dup);
    if (!st) st = addset_finish(&t->raw);
    if (!st) st = addset_finish(&t->normed);
    return st;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static int by_id(const void *a, const void *b) {
    const tok_added *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static void finish_describe(dm_tokenizer *t) {
    uint64_t h = fnv(0xcbf29ce484222325ull, "dmove-wordpiece-1", 17);
    for (int32_t i = 0; i < t->size; i++) {
        uint32_t n = t->tok_len[i];
        h = fnv(h, &n, 4);
        h = fnv(h, t->tok[i], n);
    }
    int32_t cfg[] = {t->has_norm, t->clean, t->chinese, t->strip, t->lower, t->pretok, t->max_chars,
                     t->unk, t->n_pre, t->n_post};
    h = fnv(h, cfg, sizeof cfg);
    h = fnv(h, t->pre_ids, sizeof t->pre_ids);
    h = fnv(h, t->post_ids, sizeof t->post_ids);
    h = fnv(h, t->prefix, strlen(t->prefix));
    /* the added tokens in id order (the file's order does not change the ids) */
    tok_added *sorted = malloc((t->n_added + 1) * sizeof *sorted);
    if (sorted) {
        memcpy(sorted, t->added, t->n_added * sizeof *sorted);
        qsort(sorted, t->n_added, sizeof *sorted, by_id);
    }
    for (size_t i = 0; i < t->n_added; i++) {
        const tok_added *a = sorted ? &sorted[i] : &t->added[i];
        uint8_t f[4] = {a->lstrip, a->rstrip, a->single_word, a->normalized};
        h = fnv(h, &a->id, 4);
        h = fnv(h, f, 4);
    }
    free(sorted);
    t->hash = h;
    char norm[160];
    if (!t->has_norm) snprintf(norm, sizeof norm, "no normalizer");
    else
        snprintf(norm, sizeof norm, "%s%s%s%s", t->lower ? "lowercase" : "cased",
                 t->strip ? ", strip accents" : "", t->chinese ? ", Chinese characters split" : "",
                 t->clean ? ", control characters cleaned" : "");
    snprintf(t->describe, sizeof t->describe, "WordPiece, %d tokens, %s%s, %s, max %d chars a word%s",
             t->size, norm, t->norm_cfg ? " (as its directory's tokenizer_config.json says, not tokenizer.json)" : "",
             t->pretok ? "BERT pre-tokenizer" : "no pre-tokenizer", t->max_chars,
             t->n_pre + t->n_post ? "" : ", no special tokens around the text");
}

void dm_tokenizer_free(dm_tokenizer *t) {
    if (!t) return;
    for (size_t i = 0; i < t->normed.n; i++) free((char *)t->normed.v[i].s);
    free(t->normed.v);
    free(t->raw.v);
    free(t->normed.node);
    free(t->raw.node);
    free(t->added);
    free(t->full.slots);
    free(t->tfull.s);
    free(t->tcont.s);
    free(t->tok);
    free(t->tok_len);
    free(t->pool);
    free(t->json);
    free(t);
}

static dm_status load_from(dm_tokenizer *t, tok_src *src, char *buf, size_t len, const char *path,
                           dm_case casing, cJSON **json) {
    const size_t bom = len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3) ? 3 : 0; /* a UTF-8 byte-order mark */
    size_t i = bom;
    while (i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r')) i++;
    if (i == len) return dm_fail(DM_ERR_FORMAT, "%s is empty: give a tokenizer.json or a vocab.txt", path);
    const size_t pl = strlen(path);
    const int txt = pl >= 4 && !strcmp(path + pl - 4, ".txt"); /* a vocab.txt whose first token is "{" */
    if (buf[i] != '{' && pl >= 5 && !strcmp(path + pl - 5, ".json"))
        return dm_fail(DM_ERR_FORMAT, "%s: not a JSON object (its text does not start with '{'): give a "
                       "tokenizer.json as transformers saves it", path);
    if (buf[i] == '{' && !txt) {
        buf += bom; /* cJSON does not take the mark */
        len -= bom;
        if (casing != DM_CASE_FILE)
            return dm_fail(DM_ERR_INVALID_ARG, "%s is a tokenizer.json, which says its own casing: give no "
                           "lowercase/cased choice (those are for a vocab.txt)", path);
        if (memmem(buf, len, "\\u0000", 6))
            return dm_fail(DM_ERR_UNSUPPORTED, "%s: a string holds \\u0000 (NUL); dmove takes tokens without it", path);
        *json = cJSON_ParseWithLength(buf, len);
        if (!*json) {
            const char *e = cJSON_GetErrorPtr();
            size_t at = e && e >= buf && e <= buf + len ? (size_t)(e - buf) : len;
            return dm_fail(DM_ERR_FORMAT, "%s: not valid JSON (error near byte %zu of %zu%s)", path, at, len,
                           at >= len ? ": truncated?" : "");
        }
        dm_status st = parse_json(t, src, *json);
        if (st) return dm_fail_context(st, "%s: ", path);
        return DM_OK;
    }
    if (casing == DM_CASE_FILE)
        return dm_fail(DM_ERR_INVALID_ARG, "%s is a vocab.txt, which does not say its casing: choose lowercase "
                       "(an uncased model, e.g. bert-base-uncased) or cased", path);
    if (casing != DM_CASE_LOWER && casing != DM_CASE_CASED)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_load: casing %d is not a dm_case", (int)casing);
    DM_TRY(parse_vocab_txt(src, buf, len, path));
    return setup_vocab_txt(t, src, casing, path);
}

/* A model directory's vocab.txt casing from its tokenizer_config.json (BertTokenizer's
 * do_lower_case; its strip_accents and tokenize_chinese_chars: dir_bert_norm). */
static dm_status dir_casing(const char *dir, dm_case *casing) {
    char cfg[4096];
    if ((size_t)snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir) >= sizeof cfg)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
    struct stat sb;
    if (stat(cfg, &sb) != 0)
        return dm_fail(DM_ERR_INVALID_ARG, "'%s' has a vocab.txt and no tokenizer.json or tokenizer_config.json to say "
                       "its casing: choose lowercase (an uncased model) or cased", dir);
    char *buf = NULL;
    size_t len = 0;
    DM_TRY(read_whole(cfg, &buf, &len));
    cJSON *j = cJSON_ParseWithLength(buf, len);
    free(buf);
    dm_status st = DM_OK;
    const cJSON *low = j ? cJSON_GetObjectItemCaseSensitive(j, "do_lower_case") : NULL;
    if (!j || !cJSON_IsObject(j)) st = dm_fail(DM_ERR_FORMAT, "%s: not a JSON object", cfg);
    else if (low && !cJSON_IsBool(low)) st = dm_fail(DM_ERR_FORMAT, "%s: do_lower_case must be true or false", cfg);
    else *casing = cJSON_IsFalse(low) ? DM_CASE_CASED : DM_CASE_LOWER; /* BertTokenizer's default: lowercase */
    cJSON_Delete(j);
    return st;
}

static int by_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* A JSON file's object (NULL where the file is absent: *j NULL, DM_OK); a top-level key
 * given twice refused. */
static dm_status read_json_object(const char *path, cJSON **j) {
    *j = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return DM_OK;
    char *buf = NULL;
    size_t len = 0;
    DM_TRY(read_whole(path, &buf, &len));
    const size_t bom = len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3) ? 3 : 0;
    *j = cJSON_ParseWithLength(buf + bom, len - bom);
    free(buf);
    if (!*j || !cJSON_IsObject(*j)) {
        cJSON_Delete(*j);
        *j = NULL;
        return dm_fail(DM_ERR_FORMAT, "%s: not a JSON object", path);
    }
    /* a key given twice: JSON readers differ (cJSON keeps the first, Python the last) */
    const size_t n = (size_t)cJSON_GetArraySize(*j);
    const char **keys = malloc((n + 1) * sizeof *keys);
    dm_status st = keys ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory");
    size_t k = 0;
    for (const cJSON *a = (*j)->child; a && keys; a = a->next) keys[k++] = a->string ? a->string : "";
    if (keys) qsort(keys, k, sizeof *keys, by_str);
    for (size_t i = 1; i < k && !st; i++)
        if (!strcmp(keys[i], keys[i - 1]))
            st = dm_fail(DM_ERR_FORMAT, "%s: \"%.64s\" is given twice (JSON readers differ on which counts): keep "
                         "one", path, keys[i]);
    free(keys);
    if (st) {
        cJSON_Delete(*j);
        *j = NULL;
    }
    return st;
}

/* What transformers' AutoTokenizer (5.x) makes of a model directory's tokenizer.json: where
 * the class is BertTokenizer (tokenizer_config.json's tokenizer_class BertTokenizer or
 * BertTokenizerFast, or none named and config.json's model_type "bert"), it builds the
 * tokenizer anew around the file's vocabulary and added tokens, as a vocab.txt's: a
 * BertNormalizer that cleans, whose lowercase, strip_accents and handle_chinese_chars are
 * tokenizer_config.json's do_lower_case (default true), strip_accents (default null: as
 * lowercase) and tokenize_chinese_chars (default true); the BERT pre-tokenizer; WordPiece
 * with "##" and 100 characters a word; whatever tokenizer.json says of those. *set 0:
 * another class, the file as it is. */
typedef struct {
    int set, lower, strip, chinese;
} dir_norm;

static dm_status dir_bert_norm(const char *dir, int vocab_txt, dir_norm *o) {
    memset(o, 0, sizeof *o);
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer_config.json", dir) >= sizeof path)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
    cJSON *cfg = NULL, *model = NULL;
    DM_TRY(read_json_object(path, &cfg));
    dm_status st = DM_OK;
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class");
    if (vocab_txt) {
        o->set = 1; /* a vocab.txt: BertTokenizer's file */
    } else if (cls && !cJSON_IsNull(cls)) {
        if (!cJSON_IsString(cls)) st = dm_fail(DM_ERR_FORMAT, "%s: tokenizer_class is not a string", path);
        else o->set = !strcmp(cls->valuestring, "BertTokenizer") || !strcmp(cls->valuestring, "BertTokenizerFast");
    } else {
        char mpath[4096];
        snprintf(mpath, sizeof mpath, "%s/config.json", dir);
        if (read_json_object(mpath, &model) != DM_OK) dm_clear_error(); /* its own reader says what is wrong */
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "model_type");
        o->set = cJSON_IsString(type) && !strcmp(type->valuestring, "bert");
    }
    if (!st && o->set) {
        st = jbool(cfg, "do_lower_case", 1, &o->lower, "tokenizer_config.json");
        if (!st) st = jbool(cfg, "strip_accents", o->lower, &o->strip, "tokenizer_config.json");
        if (!st) st = jbool(cfg, "tokenize_chinese_chars", 1, &o->chinese, "tokenizer_config.json");
        if (st) dm_fail_context(st, "%s: ", dir);
    }
    cJSON_Delete(cfg);
    cJSON_Delete(model);
    return st;
}

/* A token of a special-token setting: a string, or an AddedToken's {"content": ...}; NULL
 * for null, and *bad when it is neither. */
static const char *special_of(const cJSON *v, int *bad) {
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!v || cJSON_IsNull(v)) return NULL;
    if (!cJSON_IsString(v) || !v->valuestring[0] || strlen(v->valuestring) > TOK_MAX_SPECIAL) {
        *bad = 1;
        return NULL;
    }
    return v->valuestring;
}

/* The special tokens a special_tokens_map.json or tokenizer_config.json names: pad_token ..
 * mask_token into src->names, additional_special_tokens and extra_special_tokens (a list,
 * or in transformers 5 an object of names) into src->extra. */
static dm_status take_specials(tok_src *src, const cJSON *j, const char *path) {
    const char *const *keys = tok_special_keys;
    int bad = 0;
    for (int k = 0; k < 5; k++) {
        const cJSON *item = cJSON_GetObjectItemCaseSensitive(j, keys[k]);
        const char *v = special_of(item, &bad);
        if (bad)
            return dm_fail(DM_ERR_FORMAT, "%s: %s is not a token (a non-empty string of at most %d bytes, or "
                           "{\"content\": string})", path, keys[k], TOK_MAX_SPECIAL);
        if (v) src->names[k] = v;
        else if (cJSON_IsNull(item) && (k == 0 || k == 4)) src->names[k] = ""; /* none, as transformers takes it */
        else if (cJSON_IsNull(item) && k != 1)
            return dm_fail(DM_ERR_UNSUPPORTED, "%s: %s is null: dmove puts %s around every text (give the token)",
                           path, keys[k], k == 2 ? "a [CLS]" : "a [SEP]");
    }
    static const char *const lists[2] = {"additional_special_tokens", "extra_special_tokens"};
    for (int l = 0; l < 2; l++) {
        const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, lists[l]), *e;
        if (!arr || cJSON_IsNull(arr)) continue;
        if (!cJSON_IsArray(arr) && !cJSON_IsObject(arr))
            return dm_fail(DM_ERR_FORMAT, "%s: %s is %s, not a list of tokens", path, lists[l], jtype(arr));
        const size_t n = (size_t)cJSON_GetArraySize(arr);
        const char **x = realloc(src->extra, (src->nextra + n + 1) * sizeof *x);
        if (!x) return dm_fail(DM_ERR_OOM, "out of memory");
        src->extra = x;
        cJSON_ArrayForEach(e, arr) {
            const char *v = special_of(e, &bad);
            if (bad) return dm_fail(DM_ERR_FORMAT, "%s: %s holds something not a token", path, lists[l]);
            if (v) src->extra[src->nextra++] = v;
        }
    }
    return DM_OK;
}

/* Order of added_tokens.json's entries: by the number each names, then as in the file. */
typedef struct {
    const cJSON *e;
    double key;
    int at;
} atj_entry;

static int by_atj(const void *a, const void *b) {
    const atj_entry *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key ? 1 : x->at - y->at;
}

/* An older transformers' added_tokens.json ({"token": id, ...}), read where
 * tokenizer_config.json has no added_tokens_decoder (else transformers 5.24 ignores it):
 * each token added (not special, normalized, no stripping) in the order of the ids, which
 * transformers does not keep: resolve_pending gives them theirs; an id given twice keeps
 * the file's last token, as transformers' reversed dict does. keep holds the strings. */
static dm_status dir_added_json(const char *dir, tok_src *src, cJSON **keep, size_t ncfg) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/added_tokens.json", dir) >= sizeof path)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
    DM_TRY(read_json_object(path, keep));
    if (!*keep) return DM_OK;
    const int n = cJSON_GetArraySize(*keep);
    atj_entry *ord = calloc((size_t)n + 1, sizeof *ord);
    tok_added *a = ord ? realloc(src->added, (src->na + (size_t)n + 1) * sizeof *a) : NULL;
    if (!a) {
        free(ord);
        return dm_fail(DM_ERR_OOM, "out of memory");
    }
    src->added = a;
    int k = 0;
    for (const cJSON *e = (*keep)->child; e; e = e->next, k++) {
        if (!cJSON_IsNumber(e) && !cJSON_IsBool(e)) { /* (Python takes true and false as 1 and 0) */
            free(ord);
            return dm_fail(DM_ERR_FORMAT, "%s: \"%.40s\" is %s, not a token id (added_tokens.json maps each added "
                           "token to its id)", path, e->string, jtype(e));
        }
        if (strlen(e->string) > TOK_MAX_TOKEN) {
            free(ord);
            return dm_fail(DM_ERR_FORMAT, "%s: \"%.40s...\" is over %d bytes", path, e->string, TOK_MAX_TOKEN);
        }
        ord[k] = (atj_entry){.e = e, .key = cJSON_IsBool(e) ? (double)cJSON_IsTrue(e) : e->valuedouble, .at = k};
    }
    qsort(ord, (size_t)k, sizeof *ord, by_atj);
    for (int i = 0; i < k; i++) {
        const size_t len = strlen(ord[i].e->string);
        if (!len) continue; /* tokenizers ignores empty ones */
        if (i + 1 < k && ord[i + 1].key == ord[i].key) continue; /* an id given twice: the last token (Python's dict) */
        /* one tokenizer_config.json names an additional special token: special, not
         * normalized (one special_tokens_map.json names stays as it is, as transformers 5.24) */
        int special = 0;
        for (size_t x = 0; x < ncfg && !special; x++) special = !strcmp(src->extra[x], ord[i].e->string);
        a[src->na++] = (tok_added){.s = ord[i].e->string, .len = len, .id = -1, .normalized = (uint8_t)!special,
                                   .special = (uint8_t)special, .pending = 1};
    }
    free(ord);
    return DM_OK;
}

/* A model directory's vocab.txt as transformers' BertTokenizer reads it with its
 * tokenizer_config.json and special_tokens_map.json (the latter's names win, as in
 * transformers 5.24): the special tokens
 * they name (take_specials) and tokenizer_config.json's added_tokens_decoder ({"id":
 * {"content", "lstrip", "rstrip", "single_word", "normalized", "special"}}, as
 * save_pretrained writes them), else an added_tokens.json (dir_added_json), into src;
 * keep[0..2] hold their strings (NULL: no file). */
static dm_status dir_vocab_extras(const char *dir, tok_src *src, cJSON *keep[3]) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/special_tokens_map.json", dir) >= sizeof path)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    DM_TRY(read_json_object(path, &keep[0]));
    if (keep[0]) DM_TRY(take_specials(src, keep[0], path));
    const size_t ncfg = src->nextra; /* the additional special tokens tokenizer_config.json names */
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    DM_TRY(read_json_object(path, &keep[1]));
    if (keep[1]) DM_TRY(take_specials(src, keep[1], path));
    const cJSON *d = keep[0] ? cJSON_GetObjectItemCaseSensitive(keep[0], "added_tokens_decoder") : NULL;
    if (!d || cJSON_IsNull(d)) return dir_added_json(dir, src, &keep[2], ncfg);
    if (!cJSON_IsObject(d)) return dm_fail(DM_ERR_FORMAT, "%s: added_tokens_decoder is %s, not an object", path, jtype(d));
    const int n = cJSON_GetArraySize(d);
    src->added = calloc((size_t)n + 1, sizeof *src->added);
    if (!src->added) return dm_fail(DM_ERR_OOM, "out of memory");
    const cJSON *e;
    cJSON_ArrayForEach(e, d) {
        char ctx[64], *end = NULL;
        snprintf(ctx, sizeof ctx, "added_tokens_decoder[\"%.20s\"]", e->string);
        const long id = strtol(e->string, &end, 10);
        if (!e->string[0] || *end || id < 0 || id >= TOK_MAX_VOCAB)
            return dm_fail(DM_ERR_FORMAT, "%s: %s: the key is not an id", path, ctx);
        if (!cJSON_IsObject(e)) return dm_fail(DM_ERR_FORMAT, "%s: %s is %s, not an object", path, ctx, jtype(e));
        tok_added *x = &src->added[src->na];
        int f[5];
        dm_status st = jstr(e, "content", &x->s, ctx);
        if (!st) st = jbool(e, "special", 0, &f[4], ctx);
        if (!st) st = jbool(e, "single_word", 0, &f[0], ctx);
        if (!st) st = jbool(e, "lstrip", 0, &f[1], ctx);
        if (!st) st = jbool(e, "rstrip", 0, &f[2], ctx);
        if (!st) st = jbool(e, "normalized", !f[4], &f[3], ctx);
        if (st) return dm_fail_context(st, "%s: ", path);
        x->len = strlen(x->s);
        if (x->len > TOK_MAX_TOKEN) return dm_fail(DM_ERR_FORMAT, "%s: %s.content is over %d bytes", path, ctx, TOK_MAX_TOKEN);
        x->id = (int32_t)id;
        x->single_word = (uint8_t)f[0], x->lstrip = (uint8_t)f[1], x->rstrip = (uint8_t)f[2];
        x->normalized = (uint8_t)f[3], x->special = (uint8_t)f[4];
        if (x->len) src->na++;
    }
    return DM_OK;
}

/* A model directory: its tokenizer.json, else its vocab.txt (cased as asked, or as its
 * tokenizer_config.json says), into path_out. */
static dm_status dir_tokenizer(const char *dir, dm_case *casing, char *path_out, size_t n) {
    struct stat sb;
    if ((size_t)snprintf(path_out, n, "%s/tokenizer.json", dir) >= n)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
    const int json = stat(path_out, &sb) == 0;
    snprintf(path_out, n, "%s/vocab.txt", dir);
    const int txt = stat(path_out, &sb) == 0;
    if (!json && !txt) return dm_fail(DM_ERR_IO, "'%s' is a directory with no tokenizer.json or vocab.txt: give the tokenizer's file", dir);
    if (txt && (*casing != DM_CASE_FILE || !json)) /* a casing asked for is a vocab.txt's */
        return *casing == DM_CASE_FILE ? dir_casing(dir, casing) : DM_OK;
    snprintf(path_out, n, "%s/tokenizer.json", dir); /* (with a casing: refused, saying why) */
    return DM_OK;
}

dm_status dm_tokenizer_load(dm_tokenizer **out, const char *path, dm_case casing) {
    if (!out || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_load: NULL argument");
    *out = NULL;
    struct stat sb;
    char inside[4096];
    dir_norm dn = {0};
    tok_src src = {0};
    cJSON *extras[3] = {NULL, NULL, NULL}; /* a directory's vocab.txt: its tokenizer_config.json,
                                           * special_tokens_map.json, added_tokens.json */
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        const dm_case asked = casing;
        DM_TRY(dir_tokenizer(path, &casing, inside, sizeof inside));
        const size_t il = strlen(inside);
        const int txt = il >= 9 && !strcmp(inside + il - 9, "vocab.txt");
        if (asked == DM_CASE_FILE) DM_TRY(dir_bert_norm(path, txt, &dn));
        dm_status st = txt ? dir_vocab_extras(path, &src, extras) : DM_OK;
        if (st) {
            for (int x = 0; x < 3; x++) cJSON_Delete(extras[x]);
            src_free(&src);
            return st;
        }
        path = inside;
    }
    char *buf = NULL;
    size_t len = 0;
    dm_status st = read_whole(path, &buf, &len);
    dm_tokenizer *t = st ? NULL : calloc(1, sizeof *t);
    cJSON *json = NULL;
    if (!st && !t) st = dm_fail(DM_ERR_OOM, "out of memory");
    if (!st) st = load_from(t, &src, buf, len, path, casing, &json);
    if (!st && dn.set) { /* before the vocabulary's maps and the added tokens are made */
        t->norm_cfg = json && (!t->has_norm || !t->clean || t->lower != dn.lower || t->strip != dn.strip ||
                      t->chinese != dn.chinese || !t->pretok || t->max_chars != 100 || strcmp(t->prefix, "##"));
        t->has_norm = t->clean = t->pretok = 1;
        t->lower = dn.lower, t->strip = dn.strip, t->chinese = dn.chinese;
        t->max_chars = 100;
        strcpy(t->prefix, "##");
    }
    if (!st) {
        st = build_ids(t, &src);
        if (!st) st = build_maps(t, &src);
        if (!st) {
            tok_setup_ascii(t);
            st = build_added(t, &src);
        }
        if (st) dm_fail_context(st, "%s: ", path);
    }
    if (!st) finish_describe(t);
    if (!st && json) { /* kept for dm_tokenizer_save */
        const size_t bom = len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3) ? 3 : 0;
        memmove(buf, buf + bom, len - bom);
        t->json = buf, t->json_len = len - bom;
        buf = NULL;
    }
    cJSON_Delete(json);
    for (int x = 0; x < 3; x++) cJSON_Delete(extras[x]);
    src_free(&src);
    free(buf);
    if (st) {
        dm_tokenizer_free(t);
        return st;
    }
    *out = t;
    return DM_OK;
}
