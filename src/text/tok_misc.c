/* tok_misc.c: what a loaded tokenizer tells: sizes, ids of tokens and back, the special
 * tokens, its description and hash, and decoding ids to text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "core/file.h"
#include "core/status.h"
#include "core/strbuf.h"
#include "text/tok_internal.h"

int32_t dm_tokenizer_vocab_size(const dm_tokenizer *t) { return t ? t->size : 0; }

uint64_t dm_tokenizer_hash(const dm_tokenizer *t) { return t ? t->hash : 0; }

int dm_tokenizer_lowercases(const dm_tokenizer *t) { return t ? t->has_norm && t->lower : 0; }

const char *dm_tokenizer_describe(const dm_tokenizer *t) { return t ? t->describe : ""; }

int32_t dm_tokenizer_token_id(const dm_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].s, token, n)) return t->added[i].id;
    return tok_map_get(&t->full, token, n);
}

const char *dm_tokenizer_token(const dm_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->size) return NULL;
    return t->tok[id];
}

dm_status dm_tokenizer_specials(const dm_tokenizer *t, dm_special_ids *out) {
    if (!t || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_specials: NULL argument");
    int32_t v[5];
    char missing[400] = "";
    size_t o = 0;
    for (int k = 0; k < 5; k++) {
        v[k] = dm_tokenizer_token_id(t, t->special_names[k]);
        int implied = 0; /* not in the file: BertTokenizerFast gave it a new id */
        for (size_t i = 0; i < t->n_added; i++) implied |= t->added[i].id == v[k] && t->added[i].implied;
        if ((v[k] < 0 || implied) && o < sizeof missing - 80)
            o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%s", o ? " " : "", t->special_names[k]);
    }
    out->pad = v[0];
    out->unk = v[1];
    out->cls = v[2];
    out->sep = v[3];
    out->mask = v[4];
    if (o)
        return dm_fail(DM_ERR_NOT_FOUND, "the vocabulary lacks %s (BERT pretraining needs [PAD] [UNK] [CLS] [SEP] "
                       "[MASK]); use a BERT tokenizer that has them", missing);
    return DM_OK;
}

/* The WordPiece decoder's cleanup (tokenizers' decoders/wordpiece.rs), applied to each
 * token as it is joined (" ," -> "," and the like): the patterns in its order. */
static const char *const k_clean[][2] = {{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
                                         {" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"},
                                         {" 've", "'ve"}, {" 're", "'re"}};

/* Replaces every `from` in s[0..*n) by `to` (never longer), in place. */
static void replace_all(char *s, size_t *n, const char *from, const char *to) {
    size_t fl = strlen(from), tl = strlen(to), r = 0, w = 0;
    while (r < *n) {
        if (*n - r >= fl && !memcmp(s + r, from, fl)) {
            memmove(s + w, to, tl);
            w += tl;
            r += fl;
        } else {
            s[w++] = s[r++];
        }
    }
    *n = w;
}

dm_status dm_tokenizer_decode(const dm_tokenizer *t, const int32_t *ids, size_t n, char **text) {
    if (!t || (!ids && n) || !text) return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_decode: NULL argument");
    *text = NULL;
    size_t pl = strlen(t->prefix), total = 1;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->size)
            return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_decode: id %d at %zu is not in 0 .. %d", ids[i], i,
                           t->size - 1);
        total += t->tok_len[ids[i]] + 1;
    }
    char *s = malloc(total);
    if (!s) return dm_fail(DM_ERR_OOM, "out of memory decoding %zu ids", n);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        const char *tk = t->tok[ids[i]];
        size_t len = t->tok_len[ids[i]], at = o;
        if (i && pl && len >= pl && !memcmp(tk, t->prefix, pl)) {
            tk += pl;
            len -= pl;
        } else if (i) {
            s[o++] = ' ';
        }
        memcpy(s + o, tk, len);
        o += len;
        size_t piece = o - at; /* " " + token, or the token: cleaned (" do not" keeps its length) */
        for (size_t k = 0; k < sizeof k_clean / sizeof *k_clean; k++) replace_all(s + at, &piece, k_clean[k][0], k_clean[k][1]);
        o = at + piece;
    }
    s[o] = 0;
    *text = s;
    return DM_OK;
}

void dm_truncate_pair(int64_t la, int64_t lb, int64_t room, int64_t *keep_a, int64_t *keep_b) {
    if (room < 0) room = 0;
    if (la + lb > room) {
        const int swap = la > lb; /* n1: the shorter text's length, n2 the longer's */
        int64_t n1 = swap ? lb : la, n2;
        n2 = n1 > room ? n1 : (n1 > room - n1 ? n1 : room - n1);
        if (n1 + n2 > room) n1 = room / 2, n2 = n1 + room % 2;
        const int64_t ka = swap ? n2 : n1, kb = swap ? n1 : n2;
        if (la > ka) la = ka;
        if (lb > kb) lb = kb;
    }
    *keep_a = la, *keep_b = lb;
}

/* --- saving as transformers saves a tokenizer ------------------------------------------- */

/* Why t cannot be written as transformers' BertTokenizer (vocab.txt and its arguments in
 * tokenizer_config.json), NULL when it can. */
static const char *bert_why(const dm_tokenizer *t) {
    const char *why = !t->has_norm ? "it has no normalizer"
                      : !t->clean  ? "its normalizer keeps control characters (clean_text false)"
                      : !t->pretok ? "it has no BERT pre-tokenizer"
                      : t->max_chars != 100 ? "its words are cut at another length than 100 characters"
                      : strcmp(t->prefix, "##") ? "its continuations have another prefix than ##"
                                                : NULL;
    const int32_t cls = dm_tokenizer_token_id(t, t->special_names[2]), sep = dm_tokenizer_token_id(t, t->special_names[3]);
    if (!why && (t->n_pre != 1 || t->n_post != 1 || cls < 0 || sep < 0 || t->pre_ids[0] != cls || t->post_ids[0] != sep))
        why = "its post-processor puts other tokens around a text than its [CLS] and [SEP]";
    for (size_t i = 0; i < t->n_added && !why; i++)
        if (t->added[i].implied) why = "it lacks a special token that BertTokenizer would add";
    for (int32_t i = 0; i < t->size && !why; i++)
        if (!t->tok_len[i] || memchr(t->tok[i], '\n', t->tok_len[i]) || memchr(t->tok[i], '\r', t->tok_len[i]) ||
            memchr(t->tok[i], 0, t->tok_len[i]) ||
            (i == 0 && t->tok_len[0] >= 3 && !memcmp(t->tok[0], "\xEF\xBB\xBF", 3)))
            why = "a token of it cannot be a line of a vocab.txt (empty, a line break, NUL, a byte-order mark)";
    return why;
}

/* Files in dir that transformers reads before (tokenizer.json, for the BertTokenizer form)
 * or beside what dm_tokenizer_save writes, from another tokenizer. */
static dm_status stale_files(const char *dir, int bert) {
    static const char *const names[3] = {"tokenizer.json", "special_tokens_map.json", "added_tokens.json"};
    for (int k = !bert; k < 3; k++) {
        char p[4096];
        struct stat sb;
        if ((size_t)snprintf(p, sizeof p, "%s/%s", dir, names[k]) >= sizeof p)
            return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
        if (lstat(p, &sb) == 0)
            return dm_fail(DM_ERR_INVALID_ARG, "%s already holds %s (another tokenizer's?), which transformers would "
                           "read %s the files written here: remove it, or write to another directory", dir, names[k],
                           k ? "beside" : "instead of");
    }
    return DM_OK;
}

dm_status dm_tokenizer_check_save(const dm_tokenizer *t, const char *dir, int *json_form) {
    if (!t || !dir) return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_check_save: NULL argument");
    const char *why = bert_why(t);
    if (why && (!t->json || t->norm_cfg))
        return dm_fail(DM_ERR_UNSUPPORTED, "the tokenizer cannot be saved for transformers: %s, so BertTokenizer "
                       "(vocab.txt) cannot be it, and %s", why, t->json ? "its tokenizer.json alone is not it either "
                       "(its directory's tokenizer_config.json changed its normalizer)" : "it was read from no tokenizer.json");
    if (json_form) *json_form = why != NULL;
    return stale_files(dir, !why);
}

/* Adds the added tokens as transformers' save_pretrained writes them: "added_tokens_decoder",
 * {"id": {"content", "lstrip", "normalized", "rstrip", "single_word", "special"}}. */
static int add_added_tokens(const dm_tokenizer *t, cJSON *c) {
    cJSON *d = cJSON_AddObjectToObject(c, "added_tokens_decoder");
    for (size_t i = 0; d && i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        char id[16];
        snprintf(id, sizeof id, "%d", (int)a->id);
        if (cJSON_GetObjectItemCaseSensitive(d, id)) continue; /* a second entry: tokenizers keeps the first */
        cJSON *e = cJSON_AddObjectToObject(d, id);
        if (!e || !cJSON_AddStringToObject(e, "content", t->tok[a->id]) ||
            !cJSON_AddBoolToObject(e, "lstrip", a->lstrip) || !cJSON_AddBoolToObject(e, "normalized", a->normalized) ||
            !cJSON_AddBoolToObject(e, "rstrip", a->rstrip) || !cJSON_AddBoolToObject(e, "single_word", a->single_word) ||
            !cJSON_AddBoolToObject(e, "special", a->special))
            return 0;
    }
    return d != NULL;
}

dm_status dm_tokenizer_save(const dm_tokenizer *t, const char *dir, int64_t model_max_length, int *json_form) {
    int jf = 0;
    DM_TRY(dm_tokenizer_check_save(t, dir, &jf));
    if (json_form) *json_form = jf;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer_config.json", dir) >= sizeof path)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
    dm_sbuf v = {0};
    for (int32_t i = 0; i < t->size && !jf; i++) dm_sb_printf(&v, "%.*s\n", (int)t->tok_len[i], t->tok[i]);
    const size_t vlen = v.n;
    char *vocab = dm_sb_done(&v);
    cJSON *c = cJSON_CreateObject();
    static const char *const keys[5] = {"pad_token", "unk_token", "cls_token", "sep_token", "mask_token"};
    int ok = (jf || vocab) && c && cJSON_AddStringToObject(c, "tokenizer_class", jf ? "PreTrainedTokenizerFast" : "BertTokenizer");
    if (ok && !jf)
        ok = cJSON_AddBoolToObject(c, "do_lower_case", t->lower) &&
             (t->strip == t->lower ? cJSON_AddNullToObject(c, "strip_accents") != NULL
                                   : cJSON_AddBoolToObject(c, "strip_accents", t->strip) != NULL) &&
             cJSON_AddBoolToObject(c, "tokenize_chinese_chars", t->chinese) && add_added_tokens(t, c);
    if (ok && model_max_length > 0) ok = cJSON_AddNumberToObject(c, "model_max_length", (double)model_max_length) != NULL;
    for (int k = 0; k < 5 && ok; k++)
        if (dm_tokenizer_token_id(t, t->special_names[k]) >= 0)
            ok = cJSON_AddStringToObject(c, keys[k], t->special_names[k]) != NULL;
    char *cfg = ok ? cJSON_Print(c) : NULL;
    cJSON_Delete(c);
    dm_status s = cfg ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory saving the tokenizer");
    /* the model's file first, the configuration that names its class last */
    char mpath[4096];
    snprintf(mpath, sizeof mpath, "%s/%s", dir, jf ? "tokenizer.json" : "vocab.txt");
    if (!s) s = jf ? dm_write_file_atomic(mpath, t->json, t->json_len) : dm_write_file_atomic(mpath, vocab, vlen);
    if (!s) s = dm_write_file_atomic(path, cfg, strlen(cfg));
    free(cfg);
    free(vocab);
    return s;
}
