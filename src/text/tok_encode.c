/* tok_encode.c: text into ids, as BertTokenizerFast (tokenizers) does it:
 *   1. the added tokens that are not normalized are found in the raw text (leftmost-
 *      longest, with their single_word / lstrip / rstrip rules); the text between them
 *   2. is normalized (BertNormalizer: clean_text, handle_chinese_chars, strip_accents as
 *      NFD less the nonspacing marks, lowercase), the normalized added tokens found in it,
 *   3. split on whitespace and around each punctuation character (BertPreTokenizer),
 *   4. and each word cut by WordPiece (greedy longest match first, "##" continuations, the
 *      unknown token for a word that does not split or has too many characters);
 *   5. the post-processor's ids ([CLS], [SEP]) go around.
 * The per-character rules come from unitab.c, measured from the reference. Bytes below
 * 0x80 take a fast path of per-tokenizer tables. One pass per stage, no allocation per
 * word: a work area per call (per thread in a batch) holds the normalized text. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "text/tok_internal.h"
#include "text/unitab.h"

typedef struct {
    char *buf; /* the normalized text of the current segment */
    size_t n, cap;
    uint32_t *pend; /* NFD: the non-starters waiting for canonical ordering */
    size_t pn, pcap;
    uint32_t *tmp; /* the ordering's scratch */
    size_t tcap;
} work;

static void work_free(work *w) {
    free(w->buf);
    free(w->pend);
    free(w->tmp);
    memset(w, 0, sizeof *w);
}

static int grow_bytes(work *w, size_t extra) {
    size_t need;
    if (!dm_add_ok(w->n, extra, &need)) return -1;
    if (need <= w->cap) return 0;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < need) {
        if (!dm_mul_ok(cap, 2, &cap)) return -1;
    }
    char *p = realloc(w->buf, cap);
    if (!p) return -1;
    w->buf = p;
    w->cap = cap;
    return 0;
}

static inline int reserve(work *w, size_t extra) {
    return w->cap - w->n >= extra ? 0 : grow_bytes(w, extra);
}

static int ids_reserve(dm_ids *o, size_t extra) {
    size_t need;
    if (!dm_add_ok(o->n, extra, &need)) return -1;
    if (need <= o->cap) return 0;
    size_t cap = o->cap ? o->cap : 64;
    while (cap < need) {
        if (!dm_mul_ok(cap, 2, &cap)) return -1;
    }
    size_t bytes;
    if (!dm_mul_ok(cap, sizeof(int32_t), &bytes)) return -1;
    int32_t *v = realloc(o->v, bytes);
    if (!v) return -1;
    o->v = v;
    o->cap = cap;
    return 0;
}

void dm_ids_free(dm_ids *ids) {
    if (!ids) return;
    free(ids->v);
    ids->v = NULL;
    ids->n = ids->cap = 0;
}

/* --- UTF-8 ---------------------------------------------------------------------------- */

size_t dm_utf8_invalid_at(const char *str, size_t len) {
    const uint8_t *s = (const uint8_t *)str;
    size_t i = 0;
    if (!s) return 0;
    while (i < len) {
        if (i + 8 <= len) {
            uint64_t v;
            memcpy(&v, s + i, 8);
            if (!(v & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t c, min;
        if (b >= 0xC2 && b <= 0xDF) n = 2, c = b & 0x1F, min = 0x80;
        else if (b >= 0xE0 && b <= 0xEF) n = 3, c = b & 0x0F, min = 0x800;
        else if (b >= 0xF0 && b <= 0xF4) n = 4, c = b & 0x07, min = 0x10000;
        else return i;
        if (len - i < n) return i;
        for (size_t k = 1; k < n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            c = c << 6 | (s[i + k] & 0x3F);
        }
        if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return i;
        i += n;
    }
    return len;
}

/* Decodes the (valid) character at s[*i], advancing *i. */
static inline uint32_t utf8_next(const uint8_t *s, size_t *i) {
    uint8_t b = s[*i];
    if (b < 0x80) {
        (*i)++;
        return b;
    }
    if (b < 0xE0) {
        uint32_t c = (uint32_t)(b & 0x1F) << 6 | (s[*i + 1] & 0x3F);
        *i += 2;
        return c;
    }
    if (b < 0xF0) {
        uint32_t c = (uint32_t)(b & 0x0F) << 12 | (uint32_t)(s[*i + 1] & 0x3F) << 6 | (s[*i + 2] & 0x3F);
        *i += 3;
        return c;
    }
    uint32_t c = (uint32_t)(b & 0x07) << 18 | (uint32_t)(s[*i + 1] & 0x3F) << 12 |
                 (uint32_t)(s[*i + 2] & 0x3F) << 6 | (s[*i + 3] & 0x3F);
    *i += 4;
    return c;
}

/* The character ending at s[end) (end > 0, valid text). */
static uint32_t utf8_prev(const uint8_t *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
    return utf8_next(s, &i);
}

static inline size_t put_utf8(char *o, uint32_t c) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | c >> 6);
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | c >> 12);
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | c >> 18);
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* --- the normalizer -------------------------------------------------------------------- */

/* The last stage: lowercase (when set) and out as UTF-8. */
static inline int emit(const dm_tokenizer *t, work *w, uint32_t c) {
    if (reserve(w, 16)) return -1;
    if (t->lower) {
        const dm_uni_info *u = dm_uni(c);
        if (u->lower) {
            int k;
            const uint32_t *q = dm_uni_seq(u->lower, &k);
            if (reserve(w, (size_t)k * 4)) return -1;
            for (int j = 0; j < k; j++) w->n += put_utf8(w->buf + w->n, q[j]);
            return 0;
        }
    }
    w->n += put_utf8(w->buf + w->n, c);
    return 0;
}

/* The waiting non-starters in canonical order (stable by class), less the nonspacing marks. */
static int flush_marks(const dm_tokenizer *t, work *w) {
    size_t n = w->pn;
    w->pn = 0;
    uint32_t *p = w->pend;
    if (n > 1 && n <= 32) {
        for (size_t i = 1; i < n; i++) {
            uint32_t c = p[i];
            uint8_t cc = dm_uni(c)->ccc;
            size_t j = i;
            while (j > 0 && dm_uni(p[j - 1])->ccc > cc) {
                p[j] = p[j - 1];
                j--;
            }
            p[j] = c;
        }
    } else if (n > 32) { /* counting sort by class: long runs of marks stay linear */
        if (w->tcap < n) {
            uint32_t *q = realloc(w->tmp, n * sizeof *q);
            if (!q) return -1;
            w->tmp = q;
            w->tcap = n;
        }
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++) count[dm_uni(p[i])->ccc + 1]++;
        for (int k = 1; k < 257; k++) count[k] += count[k - 1];
        for (size_t i = 0; i < n; i++) w->tmp[count[dm_uni(p[i])->ccc]++] = p[i];
        memcpy(p, w->tmp, n * sizeof *p);
    }
    for (size_t i = 0; i < n; i++)
        if (!(dm_uni(p[i])->flags & DM_UNI_MN) && emit(t, w, p[i])) return -1;
    return 0;
}

/* strip_accents: NFD, the non-starters held for ordering, nonspacing marks dropped. */
static int strip_stage(const dm_tokenizer *t, work *w, uint32_t c) {
    if (!t->strip) return emit(t, w, c);
    const dm_uni_info *u = dm_uni(c);
    uint32_t buf[3];
    const uint32_t *q = buf;
    int k = 1;
    buf[0] = c;
    if (u->flags & DM_UNI_HANGUL) {
        uint32_t s = c - 0xAC00;
        buf[0] = 0x1100 + s / 588;
        buf[1] = 0x1161 + (s % 588) / 28;
        buf[2] = 0x11A7 + s % 28;
        k = s % 28 ? 3 : 2;
    } else if (u->nfd) {
        q = dm_uni_seq(u->nfd, &k);
    }
    for (int j = 0; j < k; j++) {
        const dm_uni_info *v = (q == buf && k == 1) ? u : dm_uni(q[j]);
        if (v->ccc == 0) {
            if (w->pn && flush_marks(t, w)) return -1;
            if (!(v->flags & DM_UNI_MN) && emit(t, w, q[j])) return -1;
        } else {
            if (w->pn == w->pcap) {
                size_t cap = w->pcap ? w->pcap * 2 : 16;
                uint32_t *p = realloc(w->pend, cap * sizeof *p);
                if (!p) return -1;
                w->pend = p;
                w->pcap = cap;
            }
            w->pend[w->pn++] = q[j];
        }
    }
    return 0;
}

/* The classes that may change a character in the normalizer. */
#define PLAIN_NOT (DM_UNI_REMOVE | DM_UNI_CLEANWS | DM_UNI_CHINESE | DM_UNI_MN | DM_UNI_HANGUL)

/* Normalizes s[0..n) into w->buf (w->n bytes). */
static int normalize(const dm_tokenizer *t, work *w, const uint8_t *s, size_t n) {
    w->n = 0;
    w->pn = 0;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            size_t j = i;
            while (j < n && s[j] < 0x80) j++;
            while (i < j && t->asc_norm[s[i]] < 0) i++; /* removed: the marks still wait */
            if (i == j) continue;
            if (w->pn && flush_marks(t, w)) return -1;
            if (reserve(w, j - i)) return -1;
            char *o = w->buf + w->n;
            for (; i < j; i++) {
                int v = t->asc_norm[s[i]];
                if (v >= 0) *o++ = (char)v;
            }
            w->n = (size_t)(o - w->buf);
            continue;
        }
        size_t at = i;
        uint32_t c = utf8_next(s, &i);
        const dm_uni_info *u = dm_uni(c);
        if (!(u->flags & PLAIN_NOT) && !u->ccc && !u->nfd && !u->lower && !w->pn) {
            /* a character every step keeps as it is: its bytes */
            if (reserve(w, 4)) return -1;
            memcpy(w->buf + w->n, s + at, i - at);
            w->n += i - at;
            continue;
        }
        if (t->clean) {
            if (u->flags & DM_UNI_REMOVE) continue;
            if (u->flags & DM_UNI_CLEANWS) {
                if (strip_stage(t, w, ' ')) return -1;
                continue;
            }
        }
        if (t->chinese && (u->flags & DM_UNI_CHINESE)) {
            if (strip_stage(t, w, ' ') || strip_stage(t, w, c) || strip_stage(t, w, ' ')) return -1;
        } else if (strip_stage(t, w, c)) {
            return -1;
        }
    }
    if (w->pn && flush_marks(t, w)) return -1;
    return 0;
}

char *tok_normalize_string(const dm_tokenizer *t, const char *s, size_t len, size_t *out_len) {
    work w = {0};
    if (!t->has_norm) {
        w.buf = malloc(len + 1);
        if (!w.buf) return NULL;
        memcpy(w.buf, s, len);
        w.n = len;
    } else if (normalize(t, &w, (const uint8_t *)s, len) || reserve(&w, 1)) {
        work_free(&w);
        return NULL;
    }
    char *r = w.buf;
    r[w.n] = 0;
    *out_len = w.n;
    free(w.pend);
    free(w.tmp);
    return r;
}

void tok_setup_ascii(dm_tokenizer *t) {
    for (uint32_t c = 0; c < 128; c++) {
        const dm_uni_info *u = dm_uni(c);
        int v = (int)c;
        if (t->has_norm && t->clean && (u->flags & DM_UNI_REMOVE)) v = -1;
        else if (t->has_norm && t->clean && (u->flags & DM_UNI_CLEANWS)) v = ' ';
        if (v >= 0 && t->has_norm && t->lower && dm_uni((uint32_t)v)->lower) {
            int k;
            const uint32_t *q = dm_uni_seq(dm_uni((uint32_t)v)->lower, &k);
            v = (int)q[0]; /* ASCII lowercases to one ASCII letter (the tables say so) */
        }
        t->asc_norm[c] = (int16_t)v;
        const dm_uni_info *o = dm_uni(c);
        t->asc_class[c] = !t->pretok ? 0 : (o->flags & DM_UNI_WS) ? 1 : (o->flags & DM_UNI_PUNCT) ? 2 : 0;
    }
}

/* --- WordPiece -------------------------------------------------------------------------- */

uint64_t tok_hash(const char *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t k = 0; k < n; k++) v |= (uint64_t)(uint8_t)p[k] << (8 * k);
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h ? h : 1;
}

int32_t tok_map_get(const tok_map *m, const char *p, size_t n) {
    if (!m->slots || n > m->maxlen) return -1;
    uint64_t h = tok_hash(p, n);
    for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
        const tok_slot *s = &m->slots[i];
        if (!s->h) return -1;
        if (s->h == h && s->len == n && !memcmp(s->key, p, n)) return s->id;
    }
}

/* The word w[0..n) (nch characters) cut into pieces; ids appended (room reserved). Each
 * piece is the longest vocabulary token that the rest of the word starts with (a "##"
 * continuation after the first): one walk down the trie. */
static void wordpiece(const dm_tokenizer *t, const uint8_t *w, size_t n, size_t nch, dm_ids *o) {
    if (nch > (size_t)t->max_chars) {
        o->v[o->n++] = t->unk;
        return;
    }
    size_t mark = o->n, start = 0;
    while (start < n) {
        const tok_trie *tr = start ? &t->tcont : &t->tfull;
        size_t stop = n - start > tr->maxlen ? start + tr->maxlen : n, lead = start, end = 0;
        uint64_t h = TOK_TRIE_SEED, hl = TOK_TRIE_SEED;
        uint32_t node = 0;
        int32_t id = -1;
        for (; lead < stop && lead < start + 6; lead++) {
            hl = tok_trie_next(hl, w[lead]);
            __builtin_prefetch(tok_trie_slot(tr, hl));
        }
        for (size_t k = start; k < stop; k++) {
            if (lead < stop) { /* fetch the slot of a prefix a few bytes ahead */
                hl = tok_trie_next(hl, w[lead++]);
                __builtin_prefetch(tok_trie_slot(tr, hl));
            }
            h = tok_trie_next(h, w[k]);
            node = tok_trie_find(tr, h, node, w[k]);
            if (!node) break;
            if (tr->s[node - 1].id >= 0) {
                id = tr->s[node - 1].id;
                end = k + 1;
            }
        }
        if (id < 0) {
            o->n = mark;
            o->v[o->n++] = t->unk;
            return;
        }
        o->v[o->n++] = id;
        start = end;
    }
}

/* BertPreTokenizer: words between whitespace, each punctuation character a word. */
/* Room for the ids of a word of n bytes (at most one a byte). */
static inline int room(dm_ids *o, size_t n) { return o->cap - o->n > n ? 0 : ids_reserve(o, n + 1); }

static int pretok(const dm_tokenizer *t, const uint8_t *s, size_t n, dm_ids *o) {
    if (!t->pretok) {
        size_t nch = 0;
        for (size_t i = 0; i < n; i++) nch += (s[i] & 0xC0) != 0x80;
        if (n && room(o, nch > (size_t)t->max_chars ? 1 : n)) return -1;
        if (n) wordpiece(t, s, n, nch, o);
        return 0;
    }
    if (room(o, 64)) return -1;
    size_t i = 0, ws = 0, nch = 0;
    while (i < n) {
        uint8_t b = s[i];
        int cls;
        size_t len = 1;
        if (b < 0x80) {
            cls = t->asc_class[b];
        } else {
            size_t j = i;
            uint8_t f = dm_uni(utf8_next(s, &j))->flags;
            len = j - i;
            cls = (f & DM_UNI_WS) ? 1 : (f & DM_UNI_PUNCT) ? 2 : 0;
        }
        if (cls == 0) {
            i += len;
            nch++;
            continue;
        }
        if (room(o, i - ws + 1)) return -1; /* the word's ids and the punctuation's */
        if (i > ws) wordpiece(t, s + ws, i - ws, nch, o);
        if (cls == 2) wordpiece(t, s + i, len, 1, o);
        i += len;
        ws = i;
        nch = 0;
    }
    if (room(o, i - ws)) return -1;
    if (i > ws) wordpiece(t, s + ws, i - ws, nch, o);
    return 0;
}

/* --- added tokens ---------------------------------------------------------------------- */

/* The leftmost-longest match of set a in s[from..n) (tokenizers' LeftmostLongest). */
static const tok_added *find_added(const tok_addset *a, const uint8_t *s, size_t n, size_t from,
                                   size_t *at) {
    for (size_t p = from; p < n; p++) {
        if (a->one_first >= 0) {
            const uint8_t *q = memchr(s + p, a->one_first, n - p);
            if (!q) return NULL;
            p = (size_t)(q - s);
        }
        int32_t k = a->root[s[p]], best = -1;
        for (size_t d = p + 1; k >= 0;) {
            if (a->node[k].tok >= 0) best = a->node[k].tok;
            if (d == n) break;
            k = a->node[k].child;
            while (k >= 0 && a->node[k].byte != s[d]) k = a->node[k].sibling;
            d++;
        }
        if (best >= 0) {
            *at = p;
            return &a->v[best];
        }
    }
    return NULL;
}

static inline int is_ws(uint32_t c) { return (dm_uni(c)->flags & DM_UNI_WS) != 0; }
static inline int is_word(uint32_t c) { return (dm_uni(c)->flags & DM_UNI_WORD) != 0; }

static int segment(const dm_tokenizer *t, work *w, const uint8_t *s, size_t n, dm_ids *o);

/* Splits s[0..n) on the tokens of set a: their ids, and the text between through
 * `segment` (raw: normalize and go on) or the pre-tokenizer (normalized). */
static int split_added(const dm_tokenizer *t, work *w, const tok_addset *a, const uint8_t *s,
                       size_t n, dm_ids *o, int raw) {
    size_t seg = 0, from = 0, at;
    const tok_added *x;
    while ((x = find_added(a, s, n, from, &at)) != NULL) {
        size_t start = at, stop = at + x->len;
        from = stop;
        if (x->single_word) {
            int left_ok = start == 0 || !is_word(utf8_prev(s, start));
            size_t j = stop;
            int right_ok = stop == n || !is_word(utf8_next(s, &j));
            if (!left_ok || !right_ok) continue;
        }
        if (x->lstrip) {
            size_t ns = start;
            while (ns > 0 && is_ws(utf8_prev(s, ns))) {
                ns--;
                while (ns > 0 && (s[ns] & 0xC0) == 0x80) ns--;
            }
            start = ns > seg ? ns : seg;
        }
        if (x->rstrip) {
            while (stop < n) {
                size_t j = stop;
                if (!is_ws(utf8_next(s, &j))) break;
                stop = j;
            }
        }
        /* a token inside the whitespace an earlier one's rstrip took, which its own lstrip
         * moves to the end of that run: nothing of the text is left to it (tokenizers drops
         * such an empty match) */
        if (start >= stop) continue;
        if (seg < start) {
            int rc = raw ? segment(t, w, s + seg, start - seg, o) : pretok(t, s + seg, start - seg, o);
            if (rc) return rc;
        }
        if (ids_reserve(o, 1)) return -1;
        o->v[o->n++] = x->id;
        seg = stop;
    }
    if (seg < n) return raw ? segment(t, w, s + seg, n - seg, o) : pretok(t, s + seg, n - seg, o);
    return 0;
}

/* A piece between raw added tokens: normalized, then the normalized added tokens, then
 * the pre-tokenizer and WordPiece. */
static int segment(const dm_tokenizer *t, work *w, const uint8_t *s, size_t n, dm_ids *o) {
    if (!t->has_norm) {
        if (t->normed.n) return split_added(t, w, &t->normed, s, n, o, 0);
        return pretok(t, s, n, o);
    }
    if (normalize(t, w, s, n)) return -1;
    if (t->normed.n) return split_added(t, w, &t->normed, (const uint8_t *)w->buf, w->n, o, 0);
    return pretok(t, (const uint8_t *)w->buf, w->n, o);
}

static int encode_one(const dm_tokenizer *t, work *w, const char *text, size_t len, int add_special,
                      dm_ids *o) {
    if (ids_reserve(o, (size_t)t->n_pre + (size_t)t->n_post)) return -1;
    if (add_special)
        for (int k = 0; k < t->n_pre; k++) o->v[o->n++] = t->pre_ids[k];
    const uint8_t *s = (const uint8_t *)text;
    int rc = t->raw.n ? split_added(t, w, &t->raw, s, len, o, 1) : segment(t, w, s, len, o);
    if (rc) return rc;
    if (add_special) {
        if (ids_reserve(o, (size_t)t->n_post)) return -1;
        for (int k = 0; k < t->n_post; k++) o->v[o->n++] = t->post_ids[k];
    }
    return 0;
}

dm_status dm_tokenizer_encode(const dm_tokenizer *t, const char *text, size_t len, int add_special,
                              dm_ids *out, size_t *bad_offset) {
    if (bad_offset) *bad_offset = (size_t)-1;
    if (!t || (!text && len) || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_encode: NULL argument");
    if (!text) text = "";
    size_t bad = dm_utf8_invalid_at(text, len);
    if (bad < len) {
        if (bad_offset) *bad_offset = bad;
        return dm_fail(DM_ERR_FORMAT, "invalid UTF-8 at byte offset %zu", bad);
    }
    work w = {0};
    int rc = encode_one(t, &w, text, len, add_special, out);
    work_free(&w);
    if (rc) return dm_fail(DM_ERR_OOM, "out of memory encoding %zu bytes of text", len);
    return DM_OK;
}

dm_status dm_tokenizer_encode_batch(const dm_tokenizer *t, const char *const *texts, const size_t *lens,
                                    size_t count, int add_special, int threads, dm_ids *out,
                                    size_t *bad_index, size_t *bad_offset) {
    if (bad_index) *bad_index = (size_t)-1;
    if (bad_offset) *bad_offset = (size_t)-1;
    if (!t || (count && (!texts || !lens || !out)))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_encode_batch: NULL argument");
    if (threads < 0) return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_encode_batch: threads %d < 0", threads);
    for (size_t k = 0; k < count; k++)
        if (!texts[k] && lens[k])
            return dm_fail(DM_ERR_INVALID_ARG, "dm_tokenizer_encode_batch: text %zu is NULL", k);
    int nth = threads > 0 ? threads : omp_get_max_threads();
    if ((size_t)nth > count) nth = count ? (int)count : 1;
    size_t first_bad = (size_t)-1, first_off = 0;
    int oom = 0;
#pragma omp parallel num_threads(nth)
    {
        work w = {0};
#pragma omp for schedule(dynamic, 8)
        for (size_t k = 0; k < count; k++) {
            const char *s = texts[k] ? texts[k] : "";
            size_t bad = dm_utf8_invalid_at(s, lens[k]);
            if (bad < lens[k]) {
#pragma omp critical(dm_tok_bad)
                if (k < first_bad) {
                    first_bad = k;
                    first_off = bad;
                }
                continue;
            }
            if (encode_one(t, &w, s, lens[k], add_special, &out[k])) {
#pragma omp atomic write
                oom = 1;
            }
        }
        work_free(&w);
    }
    if (first_bad != (size_t)-1) {
        if (bad_index) *bad_index = first_bad;
        if (bad_offset) *bad_offset = first_off;
        return dm_fail(DM_ERR_FORMAT, "text %zu: invalid UTF-8 at byte offset %zu", first_bad, first_off);
    }
    if (oom) return dm_fail(DM_ERR_OOM, "out of memory encoding %zu texts", count);
    return DM_OK;
}
