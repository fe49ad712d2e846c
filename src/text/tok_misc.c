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

/* The ids of t's WordPiece vocabulary: 0 .. n-1 (the added tokens past it after them). */
static int32_t vocab_count(const dm_tokenizer *t) {
    int32_t n = 0;
    while (n < t->size && tok_map_get(&t->full, t->tok[n], t->tok_len[n]) == n) n++;
    return n;
}

/* Why t cannot be written as transformers' BertTokenizer (vocab.txt and its arguments in
 * tokenizer_config.json), NULL when it can. */
static const char *bert_why(const dm_tokenizer *t) {
    static _Thread_local char buf[256];
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
        if (t->added[i].implied) {
            snprintf(buf, sizeof buf, "it lacks the special token \"%.64s\" (BertTokenizer would add it at id %d)",
                     t->tok[t->added[i].id], (int)t->added[i].id);
            why = buf;
        }
    const int32_t nv = vocab_count(t);
    for (int32_t i = nv; i < t->size && !why; i++)
        if (tok_map_get(&t->full, t->tok[i], t->tok_len[i]) >= 0) {
            snprintf(buf, sizeof buf, "its vocabulary's ids are not 0 .. N-1 with the added tokens after them (id %d "
                     "is an added token's, %d the vocabulary's)", (int)nv, (int)i);
            why = buf;
        }
    for (int32_t i = 0; i < nv && !why; i++) {
        const unsigned char *s = (const unsigned char *)t->tok[i];
        const size_t n = t->tok_len[i];
        const char *what = !n ? "empty"
                           : memchr(s, '\n', n) || memchr(s, '\r', n) ? "a line break"
                           : memchr(s, 0, n) ? "a NUL"
                           : i == 0 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3) ? "a byte-order mark"
                           : tok_space_len(s, n, 0) || tok_space_len(s, n, 1) ? "white space at an end (trimmed from a line)"
                                                              : NULL;
        if (what) {
            snprintf(buf, sizeof buf, "its token %d (\"%.32s\") cannot be a line of a vocab.txt: %s", (int)i, t->tok[i], what);
            why = buf;
        }
    }
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
                       "(its directory's tokenizer_config.json changed its normalizer): give the tokenizer.json file "
                       "itself, or a directory whose tokenizer_config.json BertTokenizer can say"
                       : "it was read from no tokenizer.json: give one (transformers' tokenizer.save_pretrained writes it)");
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

/* A TemplateProcessing of the tokens dmove puts around a text (its pre_ids and post_ids,
 * as BertTokenizerFast's rule makes them whatever the file's post-processor) and a pair. */
static cJSON *template_of(const dm_tokenizer *t) {
    cJSON *p = cJSON_CreateObject(), *sp = NULL;
    int ok = p && cJSON_AddStringToObject(p, "type", "TemplateProcessing") && (sp = cJSON_CreateObject()) != NULL;
    static const char *const parts[2] = {"single", "pair"};
    for (int pair = 0; pair < 2 && ok; pair++) {
        cJSON *a = cJSON_AddArrayToObject(p, parts[pair]);
        ok = a != NULL;
        /* [pre] A [post] (type 0), B [post] (type 1) */
        for (int seg = 0; seg <= pair && ok; seg++) {
            const int n_sp_before = seg ? 0 : t->n_pre;
            for (int k = 0; k < n_sp_before + 1 + t->n_post && ok; k++) {
                const int is_seq = k == n_sp_before;
                const int32_t id = is_seq ? -1 : k < n_sp_before ? t->pre_ids[k] : t->post_ids[k - n_sp_before - 1];
                cJSON *item = cJSON_CreateObject();
                cJSON *in = item ? cJSON_AddObjectToObject(item, is_seq ? "Sequence" : "SpecialToken") : NULL;
                ok = in && cJSON_AddStringToObject(in, "id", is_seq ? (seg ? "B" : "A") : t->tok[id]) &&
                     cJSON_AddNumberToObject(in, "type_id", seg) && cJSON_AddItemToArray(a, item);
                if (!ok) {
                    cJSON_Delete(item);
                    break;
                }
                if (!is_seq && !cJSON_GetObjectItemCaseSensitive(sp, t->tok[id])) {
                    cJSON *e = cJSON_AddObjectToObject(sp, t->tok[id]), *ids, *toks;
                    ok = e && cJSON_AddStringToObject(e, "id", t->tok[id]) && (ids = cJSON_AddArrayToObject(e, "ids")) &&
                         cJSON_AddItemToArray(ids, cJSON_CreateNumber(id)) &&
                         (toks = cJSON_AddArrayToObject(e, "tokens")) &&
                         cJSON_AddItemToArray(toks, cJSON_CreateString(t->tok[id]));
                }
            }
        }
    }
    if (ok && cJSON_AddItemToObject(p, "special_tokens", sp)) sp = NULL;
    else ok = 0;
    cJSON_Delete(sp);
    if (!ok) cJSON_Delete(p);
    return ok ? p : NULL;
}

/* t's tokenizer.json with dmove's post-processor in place of the file's: malloc'ed text. */
static char *json_as_used(const dm_tokenizer *t) {
    cJSON *root = cJSON_ParseWithLength(t->json, t->json_len), *tp = root ? template_of(t) : NULL;
    char *out = NULL;
    if (tp) {
        const int put = cJSON_GetObjectItemCaseSensitive(root, "post_processor")
                            ? cJSON_ReplaceItemInObjectCaseSensitive(root, "post_processor", tp)
                            : cJSON_AddItemToObject(root, "post_processor", tp);
        if (put) out = cJSON_PrintUnformatted(root);
        else cJSON_Delete(tp);
    }
    cJSON_Delete(root);
    return out;
}

dm_status dm_tokenizer_save(const dm_tokenizer *t, const char *dir, int64_t model_max_length, int *json_form) {
    int jf = 0;
    DM_TRY(dm_tokenizer_check_save(t, dir, &jf));
    if (json_form) *json_form = jf;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/tokenizer_config.json", dir) >= sizeof path)
        return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", dir);
    /* the form's model file: the WordPiece vocabulary's lines (the added tokens past it only in
     * added_tokens_decoder), or the tokenizer.json with the post-processor dmove uses */
    dm_sbuf v = {0};
    const int32_t nv = jf ? 0 : vocab_count(t);
    for (int32_t i = 0; i < nv; i++) dm_sb_printf(&v, "%.*s\n", (int)t->tok_len[i], t->tok[i]);
    size_t mlen = v.n;
    char *model = jf ? json_as_used(t) : dm_sb_done(&v);
    if (jf) mlen = model ? strlen(model) : 0; /* (v is empty) */
    cJSON *c = cJSON_CreateObject();
    int ok = model && c && cJSON_AddStringToObject(c, "tokenizer_class", jf ? "PreTrainedTokenizerFast" : "BertTokenizer");
    if (ok && !jf)
        ok = cJSON_AddBoolToObject(c, "do_lower_case", t->lower) &&
             (t->strip == t->lower ? cJSON_AddNullToObject(c, "strip_accents") != NULL
                                   : cJSON_AddBoolToObject(c, "strip_accents", t->strip) != NULL) &&
             cJSON_AddBoolToObject(c, "tokenize_chinese_chars", t->chinese) && add_added_tokens(t, c);
    if (ok && model_max_length > 0) ok = cJSON_AddNumberToObject(c, "model_max_length", (double)model_max_length) != NULL;
    for (int k = 0; k < 5 && ok; k++) { /* the unknown token WordPiece's own */
        const char *name = k == 1 && t->unk >= 0 ? t->tok[t->unk] : t->special_names[k];
        if (dm_tokenizer_token_id(t, name) >= 0) ok = cJSON_AddStringToObject(c, tok_special_keys[k], name) != NULL;
    }
    char *cfg = ok ? cJSON_Print(c) : NULL;
    cJSON_Delete(c);
    dm_status s = cfg ? DM_OK : dm_fail(DM_ERR_OOM, "out of memory saving the tokenizer");
    /* the model's file first, the configuration that names its class last */
    char mpath[4096];
    snprintf(mpath, sizeof mpath, "%s/%s", dir, jf ? "tokenizer.json" : "vocab.txt");
    if (!s) s = dm_write_file_atomic(mpath, model, mlen);
    if (!s) s = dm_write_file_atomic(path, cfg, strlen(cfg));
    free(cfg);
    free(model);
    return s;
}
