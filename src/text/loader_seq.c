/* loader_seq.c: the loader's arithmetic (include/dmove_data.h, SEQUENCES, MASKING,
 * RANDOMNESS): the shards seen as one corpus, the sequences of an epoch (packed token
 * ranges or pair chunks), the shuffle, and batch k built and masked as a pure function of
 * (data, config, k). */
#include <stdlib.h>
#include <string.h>

#include "core/philox.h"
#include "core/status.h"
#include "text/loader_internal.h"
#include "text/shard_internal.h"

enum { PURPOSE_MASK = 1, PURPOSE_PAIR = 2, PURPOSE_SHUFFLE = 3 };

/* --- The corpus ----------------------------------------------------------------------- */

void dm_corpus_free(dm_corpus *c) {
    for (size_t k = 0; k < c->nshards; k++) dm_shard_free(c->shards[k]);
    free(c->shards);
    free(c->shard_tok);
    free(c->doc_sent);
    free(c->sent_tok);
    memset(c, 0, sizeof *c);
}

dm_status dm_corpus_init(dm_corpus *c, dm_shard **shards, size_t n) {
    memset(c, 0, sizeof *c);
    c->shards = shards;
    c->nshards = n;
    dm_shard_info in;
    for (size_t k = 0; k < n; k++) {
        dm_shard_get_info(shards[k], &in);
        c->docs += in.documents;
        c->sents += in.sentences;
        c->toks += in.tokens;
    }
    if (c->docs >= SIZE_MAX / 8 - 1 || c->sents >= SIZE_MAX / 8 - 1) return dm_fail(DM_ERR_OOM, "corpus too large");
    c->shard_tok = malloc((n + 1) * sizeof *c->shard_tok);
    c->doc_sent = malloc((size_t)(c->docs + 1) * sizeof *c->doc_sent);
    c->sent_tok = malloc((size_t)(c->sents + 1) * sizeof *c->sent_tok);
    if (!c->shard_tok || !c->doc_sent || !c->sent_tok)
        return dm_fail(DM_ERR_OOM, "out of memory for the corpus tables (%llu sentences)",
                       (unsigned long long)c->sents);
    uint64_t d0 = 0, s0 = 0, t0 = 0;
    for (size_t k = 0; k < n; k++) {
        dm_shard_get_info(shards[k], &in);
        c->shard_tok[k] = t0;
        for (uint64_t d = 0; d < in.documents; d++) c->doc_sent[d0 + d] = s0 + dm_shard_table(shards[k], 0, d);
        for (uint64_t s = 0; s < in.sentences; s++) c->sent_tok[s0 + s] = t0 + dm_shard_table(shards[k], 1, s);
        d0 += in.documents;
        s0 += in.sentences;
        t0 += in.tokens;
    }
    c->shard_tok[n] = t0;
    c->doc_sent[d0] = s0;
    c->sent_tok[s0] = t0;
    return DM_OK;
}

/* The last index k in [0, n) with a[k] <= v (a[0] <= v). */
static uint64_t find_le(const uint64_t *a, uint64_t n, uint64_t v) {
    uint64_t lo = 0, hi = n; /* a[lo] <= v, answer in [lo, hi) */
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (a[mid] <= v) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Global ids [pos, pos + n) into out. */
static void corpus_ids(const dm_corpus *c, uint64_t pos, uint64_t n, int32_t *out) {
    while (n > 0) {
        uint64_t k = find_le(c->shard_tok, c->nshards, pos);
        while (c->shard_tok[k + 1] <= pos) k++; /* skip empty shards */
        uint64_t m = c->shard_tok[k + 1] - pos;
        if (m > n) m = n;
        dm_shard_copy_ids(c->shards[k], pos - c->shard_tok[k], (size_t)m, out);
        out += m;
        pos += m;
        n -= m;
    }
}

static uint64_t doc_tok(const dm_corpus *c, uint64_t d) { return c->sent_tok[c->doc_sent[d]]; }
/* The document holding global token pos. */
static uint64_t doc_of_token(const dm_corpus *c, uint64_t pos) {
    uint64_t lo = 0, hi = c->docs;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (doc_tok(c, mid) <= pos) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* --- Philox streams ------------------------------------------------------------------- */

typedef struct {
    uint32_t key[2], ctr[4], buf[4];
    int left;
} seq_rng;

static void rng_init(seq_rng *r, uint64_t seed, uint64_t seq, uint64_t epoch, uint32_t purpose) {
    r->key[0] = (uint32_t)seed;
    r->key[1] = (uint32_t)(seed >> 32);
    r->ctr[0] = (uint32_t)seq;
    r->ctr[1] = (uint32_t)(seq >> 32);
    r->ctr[2] = (uint32_t)epoch;
    r->ctr[3] = purpose << 24;
    r->left = 0;
}
static uint32_t rng_next(seq_rng *r) {
    if (r->left == 0) {
        dm_philox4x32_10(r->ctr, r->key, r->buf);
        r->ctr[3]++;
        r->left = 4;
    }
    return r->buf[4 - r->left--];
}
static uint64_t below(uint32_t w, uint64_t n) { return (uint64_t)(((uint64_t)w * n) >> 32); }

/* Position p of epoch e's order: a keyed Feistel permutation of [0, 4^half), walked
 * until it lands below n. */
static uint64_t shuffle_at(const dm_seqset *s, uint64_t epoch, uint64_t p) {
    if (!s->cfg.shuffle) return p;
    int h = s->feistel_half;
    uint64_t mask = ((uint64_t)1 << h) - 1, x = p;
    uint32_t key[2] = {(uint32_t)s->cfg.seed, (uint32_t)(s->cfg.seed >> 32)};
    do {
        uint64_t l = x >> h, r = x & mask;
        for (uint32_t round = 0; round < 6; round++) {
            uint32_t ctr[4] = {(uint32_t)r, (uint32_t)(r >> 32), (uint32_t)epoch,
                               (uint32_t)PURPOSE_SHUFFLE << 24 | round}, out[4];
            dm_philox4x32_10(ctr, key, out);
            uint64_t f = ((uint64_t)out[1] << 32 | out[0]) & mask;
            uint64_t nl = r;
            r = l ^ f;
            l = nl;
        }
        x = l << h | r;
    } while (x >= (uint64_t)s->nseq);
    return x;
}

/* --- The sequence sets ---------------------------------------------------------------- */

typedef struct {
    uint64_t *v;
    size_t n, cap;
} u64vec;
static int push(u64vec *a, uint64_t x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? 2 * a->cap : 4096;
        uint64_t *q = nc < SIZE_MAX / 8 ? realloc(a->v, nc * sizeof *q) : NULL;
        if (!q) return -1;
        a->v = q;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return 0;
}

/* Packing: greedy over the sentences, up to cap = j - 2 tokens a sequence with a [SEP]
 * counted between documents; a sentence that does not fit closes the sequence, one
 * longer than cap is cut in pieces of cap. Bounds are global token positions. */
static int packed_bounds(const dm_corpus *c, int64_t j, u64vec *b) {
    uint64_t cap = (uint64_t)j - 2, cur = 0;
    if (push(b, 0)) return -1;
    for (uint64_t d = 0; d < c->docs; d++)
        for (uint64_t s = c->doc_sent[d]; s < c->doc_sent[d + 1]; s++) {
            uint64_t pos = c->sent_tok[s], end = c->sent_tok[s + 1];
            while (pos < end) {
                uint64_t cost = end - pos + (cur > 0 && s == c->doc_sent[d]);
                if (cur + cost <= cap) {
                    cur += cost;
                    pos = end;
                } else if (cur > 0) {
                    if (push(b, pos)) return -1;
                    cur = 0;
                } else {
                    pos += cap;
                    if (push(b, pos)) return -1;
                }
            }
        }
    if (cur > 0 && push(b, c->toks)) return -1;
    return 0;
}

/* Pairs: each document's sentences in chunks of up to cap = j - 3 tokens (a longer
 * sentence alone). Bounds are global sentence indices. */
static int pair_bounds(const dm_corpus *c, int64_t j, u64vec *b) {
    uint64_t cap = (uint64_t)j - 3;
    if (push(b, 0)) return -1;
    for (uint64_t d = 0; d < c->docs; d++) {
        uint64_t cur = 0;
        for (uint64_t s = c->doc_sent[d]; s < c->doc_sent[d + 1]; s++) {
            uint64_t n = c->sent_tok[s + 1] - c->sent_tok[s];
            if (cur > 0 && cur + n > cap) {
                if (push(b, s)) return -1;
                cur = 0;
            }
            cur += n;
        }
        if (push(b, c->doc_sent[d + 1])) return -1;
    }
    return 0;
}

void dm_seqset_free(dm_seqset *s) {
    dm_corpus_free(&s->c);
    free(s->bounds);
    free(s->plain);
    s->bounds = NULL;
    s->plain = NULL;
}

static int is_special(const dm_special_ids *sp, int32_t id) {
    return id == sp->pad || id == sp->unk || id == sp->cls || id == sp->sep || id == sp->mask;
}

static dm_status check_config(const dm_loader_config *cfg, const dm_vocab_info *v) {
    int64_t jmin = cfg->mode == DM_SEQ_PAIRS ? 5 : 3;
    if (cfg->mode != DM_SEQ_PACKED && cfg->mode != DM_SEQ_PAIRS)
        return dm_fail(DM_ERR_INVALID_ARG, "loader: unknown sequence mode %d", (int)cfg->mode);
    if (cfg->seq < jmin)
        return dm_fail(DM_ERR_INVALID_ARG, "sequence length %lld is too small for the special tokens: %s "
                       "needs j >= %lld (%s)", (long long)cfg->seq,
                       cfg->mode == DM_SEQ_PAIRS ? "pair mode" : "packing", (long long)jmin,
                       cfg->mode == DM_SEQ_PAIRS ? "[CLS] A [SEP] B [SEP]" : "[CLS] tokens [SEP]");
    if (cfg->seq > (1 << 20) || cfg->batch < 1 || cfg->batch > (1 << 20))
        return dm_fail(DM_ERR_INVALID_ARG, "loader: batch %lld x seq %lld out of range (1 .. 2^20 each)",
                       (long long)cfg->batch, (long long)cfg->seq);
    if (cfg->parts < 0 || cfg->parts > (1 << 20) || cfg->part < 0 || cfg->part >= (cfg->parts > 1 ? cfg->parts : 1))
        return dm_fail(DM_ERR_INVALID_ARG, "loader: part %d of %d: parts 0 .. 2^20, part 0 .. parts - 1", cfg->part,
                       cfg->parts);
    if (cfg->nsp && cfg->mode != DM_SEQ_PAIRS)
        return dm_fail(DM_ERR_INVALID_ARG, "next-sentence labels need pair mode");
    if (!(cfg->mask_prob >= 0 && cfg->mask_prob <= 1) || !(cfg->mask_token_prob >= 0) ||
        !(cfg->random_token_prob >= 0) || !(cfg->mask_token_prob + cfg->random_token_prob <= 1))
        return dm_fail(DM_ERR_INVALID_ARG, "masking probabilities %g, %g, %g: each in [0, 1], [MASK] + "
                       "random at most 1", cfg->mask_prob, cfg->mask_token_prob, cfg->random_token_prob);
    if (cfg->prefetch < 0 || cfg->prefetch > 256 || cfg->start_step < 0)
        return dm_fail(DM_ERR_INVALID_ARG, "loader: prefetch %d (0 .. 256) or start step %lld (>= 0)",
                       cfg->prefetch, (long long)cfg->start_step);
    const int32_t sp[5] = {v->special.pad, v->special.unk, v->special.cls, v->special.sep, v->special.mask};
    static const char *const names[5] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (int k = 0; k < 5; k++)
        if (sp[k] < 0 || sp[k] >= v->vocab_size)
            return dm_fail(DM_ERR_INVALID_ARG, "the vocabulary has no %s token (id %d of %d): the loader "
                           "needs [PAD] [UNK] [CLS] [SEP] [MASK]", names[k], (int)sp[k], (int)v->vocab_size);
    return DM_OK;
}

static uint32_t thr(double p) { return p >= 1 ? UINT32_MAX : dm_fraction_threshold(p); }

dm_status dm_seqset_init(dm_seqset *s, const dm_loader_config *cfg, const dm_vocab_info *vocab) {
    DM_TRY(check_config(cfg, vocab));
    s->cfg = *cfg;
    s->vocab = *vocab;
    const dm_corpus *c = &s->c;
    if (c->toks == 0) return dm_fail(DM_ERR_INVALID_ARG, "the data holds no token");
    if (cfg->nsp && c->docs < 2)
        return dm_fail(DM_ERR_INVALID_ARG, "next-sentence labels need at least 2 documents (a random B "
                       "comes from another document); the data has %llu", (unsigned long long)c->docs);
    u64vec b = {0};
    if ((cfg->mode == DM_SEQ_PAIRS ? pair_bounds : packed_bounds)(c, cfg->seq, &b)) {
        free(b.v);
        return dm_fail(DM_ERR_OOM, "out of memory for the sequence table");
    }
    s->bounds = b.v;
    s->nseq = (int64_t)b.n - 1;
    int h = 1;
    while (h < 31 && ((uint64_t)1 << (2 * h)) < (uint64_t)s->nseq) h++;
    s->feistel_half = h;
    s->plain = malloc((size_t)vocab->vocab_size * sizeof *s->plain);
    if (!s->plain) return dm_fail(DM_ERR_OOM, "out of memory");
    s->nplain = 0;
    for (int32_t id = 0; id < vocab->vocab_size; id++)
        if (!is_special(&vocab->special, id)) s->plain[s->nplain++] = id;
    if (s->nplain == 0) return dm_fail(DM_ERR_INVALID_ARG, "the vocabulary has only special tokens");
    s->thr_select = thr(cfg->mask_prob);
    s->thr_mask = thr(cfg->mask_token_prob);
    s->thr_random = thr(cfg->mask_token_prob + cfg->random_token_prob);
    return DM_OK;
}

/* --- Building sequences --------------------------------------------------------------- */

/* Packed sequence k into row (ids, types zero-filled by the caller): its length. */
static int64_t build_packed(const dm_seqset *s, uint64_t k, int32_t *ids) {
    const dm_corpus *c = &s->c;
    uint64_t pos = s->bounds[k], end = s->bounds[k + 1];
    uint64_t d = doc_of_token(c, pos);
    int64_t p = 0;
    ids[p++] = s->vocab.special.cls;
    while (pos < end) {
        uint64_t run = doc_tok(c, d + 1);
        if (run > end) run = end;
        corpus_ids(c, pos, run - pos, ids + p);
        p += (int64_t)(run - pos);
        pos = run;
        if (pos < end) {
            ids[p++] = s->vocab.special.sep;
            d++;
        }
    }
    ids[p++] = s->vocab.special.sep;
    return p;
}

/* Heads among k fair coins (the bits of the stream's next words): how many of the k
 * tokens a truncation takes from the front rather than the back. */
static uint64_t coins(seq_rng *r, uint64_t k) {
    uint64_t heads = 0;
    for (; k >= 32; k -= 32) heads += (uint64_t)__builtin_popcount(rng_next(r));
    if (k) heads += (uint64_t)__builtin_popcount(rng_next(r) & ((1u << k) - 1));
    return heads;
}

/* B from a random document other than d: sentences from a random one on, up to `room`
 * tokens (at least one sentence). */
static void random_b(const dm_seqset *s, seq_rng *r, uint64_t d, uint64_t room, uint64_t *b0, uint64_t *b1) {
    const dm_corpus *c = &s->c;
    uint64_t od = d;
    if (c->docs > 1) {
        od = below(rng_next(r), c->docs - 1);
        if (od >= d) od++;
    }
    uint64_t first = c->doc_sent[od], n = c->doc_sent[od + 1] - first;
    uint64_t st = first + below(rng_next(r), n), en = st + 1;
    while (en < c->doc_sent[od + 1] && c->sent_tok[en + 1] - c->sent_tok[st] <= room) en++;
    *b0 = c->sent_tok[st];
    *b1 = c->sent_tok[en];
}

/* Pair chunk k of `epoch` into row: its length; *nsp the label (0 next, 1 random). */
static int64_t build_pair(const dm_seqset *s, uint64_t epoch, uint64_t k, int32_t *ids, int32_t *types,
                          int32_t *nsp) {
    const dm_corpus *c = &s->c;
    seq_rng r;
    rng_init(&r, s->cfg.seed, k, epoch, PURPOSE_PAIR);
    uint64_t s0 = s->bounds[k], s1 = s->bounds[k + 1], cap = (uint64_t)s->cfg.seq - 3;
    uint64_t d = find_le(c->doc_sent, c->docs, s0);
    int rand_b = s->cfg.nsp && rng_next(&r) >= 0x80000000u;
    uint64_t a0 = c->sent_tok[s0], a1, b0, b1;
    if (s1 - s0 >= 2) {
        a1 = c->sent_tok[s0 + 1 + below(rng_next(&r), s1 - s0 - 1)];
        b0 = a1;
        b1 = c->sent_tok[s1];
    } else {
        uint64_t n = c->sent_tok[s1] - a0;
        if (n >= 2 && !rand_b) {
            a1 = a0 + 1 + below(rng_next(&r), n - 1);
        } else {
            a1 = a0 + n;
            rand_b = 1;
        }
        b0 = a1;
        b1 = a0 + n;
    }
    if (rand_b) random_b(s, &r, d, a1 - a0 < cap ? cap - (a1 - a0) : 0, &b0, &b1);
    uint64_t la = a1 - a0, lb = b1 - b0;
    if (la + lb > cap) { /* BERT's truncate_seq_pair, in closed form */
        uint64_t ex = la + lb - cap, ka = 0, kb = 0, t;
        if (la > lb) {
            t = ex < la - lb ? ex : la - lb;
            ka = t;
        } else {
            t = ex < lb - la ? ex : lb - la;
            kb = t;
        }
        ka += (ex - t) / 2; /* then both sides in turn, B first */
        kb += (ex - t) - (ex - t) / 2;
        uint64_t fa = coins(&r, ka), fb = coins(&r, kb);
        a0 += fa;
        a1 -= ka - fa;
        b0 += fb;
        b1 -= kb - fb;
    }
    int64_t p = 0;
    ids[p++] = s->vocab.special.cls;
    corpus_ids(c, a0, a1 - a0, ids + p);
    p += (int64_t)(a1 - a0);
    ids[p++] = s->vocab.special.sep;
    int64_t bstart = p;
    corpus_ids(c, b0, b1 - b0, ids + p);
    p += (int64_t)(b1 - b0);
    ids[p++] = s->vocab.special.sep;
    for (int64_t t = bstart; t < p; t++) types[t] = 1;
    *nsp = s->cfg.nsp ? rand_b : -100;
    return p;
}

/* BERT's 80/10/10 over the row's n tokens; labels prefilled with -100. Returns the number
 * chosen. */
static int64_t mask_row(const dm_seqset *s, uint64_t epoch, uint64_t k, int32_t *ids, int32_t *labels,
                        int64_t n) {
    uint32_t key[2] = {(uint32_t)s->cfg.seed, (uint32_t)(s->cfg.seed >> 32)};
    int64_t chosen = 0;
    for (int64_t t = 0; t < n; t++) {
        if (is_special(&s->vocab.special, ids[t])) continue;
        uint32_t ctr[4] = {(uint32_t)k, (uint32_t)(k >> 32), (uint32_t)epoch,
                           (uint32_t)PURPOSE_MASK << 24 | (uint32_t)t}, w[4];
        dm_philox4x32_10(ctr, key, w);
        if (w[0] >= s->thr_select || s->thr_select == 0) continue;
        labels[t] = ids[t];
        chosen++;
        if (w[1] < s->thr_mask) ids[t] = s->vocab.special.mask;
        else if (w[1] < s->thr_random) ids[t] = s->plain[below(w[2], (uint64_t)s->nplain)];
    }
    return chosen;
}

void dm_seqset_build(const dm_seqset *s, int64_t step, dm_batch *b) {
    const int64_t B = s->cfg.batch, J = s->cfg.seq;
    b->step = step;
    b->tokens = b->masked = 0;
    const uint64_t parts = s->cfg.parts > 1 ? (uint64_t)s->cfg.parts : 1; /* the global batch's */
    for (int64_t i = 0; i < B; i++) {
        uint64_t p = (uint64_t)step * (uint64_t)B * parts + (uint64_t)s->cfg.part * (uint64_t)B + (uint64_t)i;
        uint64_t epoch = p / (uint64_t)s->nseq, k = shuffle_at(s, epoch, p % (uint64_t)s->nseq);
        int32_t *ids = b->input_ids + i * J, *types = b->token_type_ids + i * J;
        int32_t *att = b->attention_mask + i * J, *lab = b->labels + i * J;
        memset(types, 0, (size_t)J * sizeof *types);
        int32_t nsp = -100;
        int64_t n = s->cfg.mode == DM_SEQ_PAIRS ? build_pair(s, epoch, k, ids, types, &nsp)
                                                 : build_packed(s, k, ids);
        for (int64_t t = 0; t < J; t++) {
            att[t] = t < n;
            lab[t] = -100;
        }
        for (int64_t t = n; t < J; t++) ids[t] = s->vocab.special.pad;
        b->masked += mask_row(s, epoch, k, ids, lab, n);
        b->tokens += n;
        b->nsp_labels[i] = nsp;
        b->sequence[i] = (int64_t)k;
        b->epoch[i] = (int64_t)epoch;
    }
}
