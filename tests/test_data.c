/* test_data.c: token shards and the masked-LM loader (include/dmove_data.h), from ids
 * written here (no tokenizer needed): shards written from ids round-trip (16- and 32-bit ids); truncated, edited and
 * other-vocabulary shards are refused; packed sequences cover the corpus exactly once an
 * epoch, each within j, [CLS] first and [SEP] last, padded and masked right; the masking
 * rates are within 5 sigma of 15% and 80/10/10 and never touch a special token; pairs have
 * their segments and next-sentence labels right; batches are a pure function of (seed, k):
 * the same seed the same batches, resume by seek or start step, background thread ==
 * synchronous; too small a j is refused. Then dm_prepare with the tokenizer on a small
 * vocab.txt: each document, line by line as dm_tokenizer_encode gives it, whole in the
 * training or the valid shard; an existing dataset, invalid UTF-8 (file and offset), an
 * empty corpus, a directory refused, the old dataset kept, nothing left behind. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <unistd.h>

#include "dmove_data.h"
#include "testutil.h"

enum { PAD = 0, UNK = 100, CLS = 101, SEP = 102, MASK = 103 };

static uint64_t g_rng = 12345;
static uint32_t rnd(uint32_t n) {
    g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((g_rng >> 33) % n);
}

static dm_vocab_info vocab(int32_t size, uint64_t hash) {
    dm_vocab_info v = {.hash = hash, .vocab_size = size};
    v.special = (dm_special_ids){.pad = PAD, .unk = UNK, .cls = CLS, .sep = SEP, .mask = MASK};
    return v;
}

/* A corpus: docs documents of 1..maxs sentences of 1..maxt tokens; document d's ids in
 * [base(d), base(d) + 900) when per_doc (else in [104, vocab)), an [UNK] now and then; and
 * one long sentence. Kept flat for checking. */
typedef struct {
    int32_t *ids;
    size_t n;
    size_t docs, sents, unk;
} corpus_t;

static int32_t doc_base(size_t d) { return (int32_t)(1000 * (d + 1)); }

static void make_corpus(corpus_t *c, dm_shard_writer *w, size_t docs, int maxs, int maxt, int32_t vsize,
                        int per_doc, int long_len) {
    memset(c, 0, sizeof *c);
    c->ids = malloc(sizeof(int32_t) * docs * (size_t)(maxs * maxt + long_len + 1));
    int32_t sent[4096];
    for (size_t d = 0; d < docs; d++) {
        int ns = 1 + (int)rnd((uint32_t)maxs);
        for (int s = 0; s < ns; s++) {
            int nt = (d == 3 && s == 0 && long_len) ? long_len : 1 + (int)rnd((uint32_t)maxt);
            for (int t = 0; t < nt; t++) {
                int32_t id = per_doc ? doc_base(d) + (int32_t)rnd(900) : 104 + (int32_t)rnd((uint32_t)vsize - 104);
                if (!per_doc && rnd(50) == 0) id = UNK;
                c->unk += id == UNK;
                sent[t] = id;
                c->ids[c->n++] = id;
            }
            CHECK_OK(dm_shard_writer_add_sentence(w, sent, (size_t)nt));
            c->sents++;
        }
        CHECK_OK(dm_shard_writer_end_document(w));
        c->docs++;
    }
}

static char g_dir[] = "/tmp/test_data_XXXXXX";

static void path_of(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", g_dir, name); }

static void test_roundtrip(int32_t vsize, int expect_width) {
    dm_vocab_info v = vocab(vsize, 0x1234abcd5678ull + (uint64_t)vsize);
    dm_shard_writer *w = NULL;
    CHECK_OK(dm_shard_writer_new(&w, &v));
    corpus_t c;
    make_corpus(&c, w, 20, 6, 30, vsize, 0, 0);
    int32_t big[2] = {vsize - 1, 104}; /* the largest id survives */
    CHECK_OK(dm_shard_writer_add_sentence(w, big, 2));
    c.ids[c.n++] = vsize - 1;
    c.ids[c.n++] = 104;
    c.sents++;
    c.docs++;
    int32_t bad = vsize;
    CHECK(dm_shard_writer_add_sentence(w, &bad, 1) == DM_ERR_INVALID_ARG);
    CHECK(dm_shard_writer_add_sentence(w, big, 0) == DM_ERR_INVALID_ARG);
    dm_shard_info wi;
    CHECK_OK(dm_shard_writer_info(w, &wi));
    char path[256];
    path_of(path, sizeof path, "rt.shard");
    CHECK_OK(dm_shard_writer_write(w, path));
    dm_shard *s = NULL;
    CHECK_OK(dm_shard_open(&s, path, v.hash));
    dm_shard_info in;
    CHECK_OK(dm_shard_get_info(s, &in));
    CHECK(in.id_bytes == expect_width);
    CHECK(in.documents == c.docs && in.sentences == c.sents && in.tokens == c.n && in.unknown == c.unk);
    CHECK(in.bytes == wi.bytes && in.vocab_hash == v.hash && in.vocab_size == vsize);
    int32_t *ids = malloc(c.n * sizeof *ids);
    CHECK_OK(dm_shard_ids(s, 0, c.n, ids));
    CHECK(memcmp(ids, c.ids, c.n * sizeof *ids) == 0);
    uint64_t first, count, total = 0;
    for (uint64_t d = 0; d < in.documents; d++) {
        CHECK_OK(dm_shard_document(s, d, &first, &count));
        CHECK(first == total && count >= 1);
        total += count;
    }
    CHECK(total == c.sents);
    CHECK(dm_shard_document(s, in.documents, &first, &count) == DM_ERR_INVALID_ARG);
    CHECK(dm_shard_ids(s, c.n, 1, ids) == DM_ERR_INVALID_ARG);
    dm_shard_free(s);
    /* the writer is empty again: a second, small shard */
    CHECK_OK(dm_shard_writer_info(w, &wi));
    CHECK(wi.tokens == 0 && wi.documents == 0);
    free(ids);
    free(c.ids);
    dm_shard_writer_free(w);
}

static unsigned char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n);
    CHECK(fread(b, 1, *n, f) == *n);
    fclose(f);
    return b;
}
static void write_all(const char *path, const unsigned char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(fwrite(b, 1, n, f) == n);
    fclose(f);
}

/* The refusal of `path` with its message containing `what`. */
static void check_refused(const char *path, uint64_t hash, const char *what) {
    dm_shard *s = (dm_shard *)1;
    dm_status st = dm_shard_open(&s, path, hash);
    CHECK(st != DM_OK && s == NULL);
    CHECK(strstr(dm_last_error(), what) != NULL);
    CHECK(strstr(dm_last_error(), path) != NULL);
    if (!strstr(dm_last_error(), what)) fprintf(stderr, "  message: %s\n", dm_last_error());
}

static void test_refusals(void) {
    char path[256], bad[256];
    path_of(path, sizeof path, "rt.shard");
    path_of(bad, sizeof bad, "bad.shard");
    size_t n;
    unsigned char *b = read_all(path, &n);
    uint64_t hash = 0x1234abcd5678ull + 70000;
    write_all(bad, b, n - 8);
    check_refused(bad, hash, "truncated");
    write_all(bad, b, 50);
    check_refused(bad, hash, "truncated");
    b[n - 100] ^= 1; /* an id */
    write_all(bad, b, n);
    check_refused(bad, hash, "checksum");
    b[n - 100] ^= 1;
    b[0] = 'X';
    write_all(bad, b, n);
    check_refused(bad, hash, "not a dmove token shard");
    b[0] = 'D';
    write_all(bad, b, n);
    dm_shard *s = NULL;
    CHECK_OK(dm_shard_open(&s, bad, hash));
    dm_shard_free(s);
    check_refused(bad, hash + 1, "another tokenizer");
    check_refused("/nonexistent/x.shard", 0, "cannot open");
    check_refused(g_dir, 0, "not a regular file");
    /* every truncation, and random byte changes: refused, never a crash */
    int all_refused = 1;
    dm_shard *x = NULL;
    for (size_t len = 0; len < n; len += 1 + len / 64) {
        write_all(bad, b, len);
        all_refused &= dm_shard_open(&x, bad, 0) != DM_OK;
        dm_shard_free(x);
    }
    for (int k = 0; k < 400; k++) {
        size_t at = rnd((uint32_t)n);
        unsigned char was = b[at];
        b[at] ^= (unsigned char)(1 + rnd(255));
        write_all(bad, b, n);
        all_refused &= dm_shard_open(&x, bad, 0) != DM_OK;
        dm_shard_free(x);
        b[at] = was;
    }
    CHECK(all_refused);
    free(b);
    unlink(bad);
}

/* A loader over the corpus shard, sync (prefetch 0) unless said. */
static dm_loader *open_loader(const char *path, const dm_vocab_info *v, dm_loader_config *cfg) {
    dm_loader *l = NULL;
    const char *p[1] = {path};
    CHECK_OK(dm_loader_open_shards(&l, p, 1, v, cfg));
    return l;
}

static int is_special(int32_t id) { return id == PAD || id == UNK || id == CLS || id == SEP || id == MASK; }

/* Row checks common to both modes: [CLS] first, [SEP] last real, attention a prefix,
 * [PAD] after, labels only on chosen non-special positions; the row unmasked into orig.
 * Returns the real length. */
static int64_t check_row(const dm_batch *b, int64_t i, int32_t *orig, int64_t *stats) {
    const int64_t J = b->seq;
    const int32_t *ids = b->input_ids + i * J, *att = b->attention_mask + i * J, *lab = b->labels + i * J;
    int64_t n = 0;
    while (n < J && att[n]) n++;
    for (int64_t t = n; t < J; t++) CHECK(att[t] == 0 && ids[t] == PAD && lab[t] == -100 && b->token_type_ids[i * J + t] == 0);
    CHECK(n >= 3 && ids[0] == CLS && ids[n - 1] == SEP);
    for (int64_t t = 0; t < n; t++) {
        orig[t] = lab[t] != -100 ? lab[t] : ids[t];
        if (lab[t] == -100) continue;
        CHECK(!is_special(lab[t]));       /* never a special chosen */
        CHECK(!is_special(ids[t]) || ids[t] == MASK); /* never a special as the random one */
        stats[1]++;
        if (ids[t] == MASK) stats[2]++;
        else if (ids[t] != lab[t]) stats[3]++;
        else stats[4]++;
    }
    for (int64_t t = 0; t < n; t++) stats[0] += !is_special(orig[t]);
    return n;
}

static void within(double count, double total, double p, const char *what) {
    double sd = sqrt(total * p * (1 - p));
    int ok = fabs(count - total * p) <= 5 * sd;
    CHECK(ok);
    printf("  %s: %.0f of %.0f = %.4f (expected %.4f, %.1f sigma)\n", what, count, total, count / total, p,
           (count - total * p) / sd);
}

/* Epoch 1 visits every sequence once again, in another order, masked anew. */
static void check_epoch1(dm_loader *l, const dm_loader_config *cfg, int64_t N) {
    int64_t *order0 = malloc((size_t)N * sizeof *order0), *order1 = malloc((size_t)N * sizeof *order1);
    int *seen = calloc((size_t)N, sizeof *seen);
    int64_t got = 0, remask = 0, pairs = 0;
    dm_batch b1;
    CHECK_OK(dm_batch_alloc(&b1, cfg->batch, cfg->seq));
    for (int64_t p = 0; p < 2 * N; p++) {
        int64_t k = p / cfg->batch, i = p % cfg->batch;
        CHECK_OK(dm_loader_batch_at(l, k, &b1));
        if (p < N) {
            order0[p] = b1.sequence[i];
            continue;
        }
        CHECK(b1.epoch[i] == 1);
        int64_t q = b1.sequence[i];
        order1[p - N] = q;
        if (q >= 0 && q < N && !seen[q]++) got++;
    }
    CHECK(got == N && memcmp(order0, order1, (size_t)N * sizeof *order0) != 0);
    /* the same sequence in epochs 0 and 1: the same tokens, other masks */
    for (int64_t p = 0; p < 20; p++) {
        int64_t q = order0[p], p1 = 0;
        while (order1[p1] != q) p1++;
        dm_batch b0;
        CHECK_OK(dm_batch_alloc(&b0, cfg->batch, cfg->seq));
        CHECK_OK(dm_loader_batch_at(l, p / cfg->batch, &b0));
        CHECK_OK(dm_loader_batch_at(l, (N + p1) / cfg->batch, &b1));
        const int32_t *l0 = b0.labels + (p % cfg->batch) * cfg->seq, *l1 = b1.labels + ((N + p1) % cfg->batch) * cfg->seq;
        const int32_t *i0 = b0.input_ids + (p % cfg->batch) * cfg->seq, *i1 = b1.input_ids + ((N + p1) % cfg->batch) * cfg->seq;
        for (int64_t t = 0; t < cfg->seq; t++) {
            int32_t o0 = l0[t] != -100 ? l0[t] : i0[t], o1 = l1[t] != -100 ? l1[t] : i1[t];
            CHECK(o0 == o1);
            remask += (l0[t] != -100) != (l1[t] != -100);
        }
        pairs++;
        dm_batch_free(&b0);
    }
    CHECK(pairs == 20 && remask > 0);
    dm_batch_free(&b1);
    free(order0);
    free(order1);
    free(seen);
}

static void test_packed(const char *path, const corpus_t *c, const dm_vocab_info *v) {
    dm_loader_config cfg;
    dm_loader_config_default(&cfg);
    cfg.batch = 7;
    cfg.seq = 64;
    cfg.prefetch = 0;
    dm_loader *l = open_loader(path, v, &cfg);
    if (!l) return;
    int64_t N = dm_loader_sequences(l);
    CHECK(N > 0);
    int32_t **seqs = calloc((size_t)N, sizeof *seqs);
    int64_t *lens = calloc((size_t)N, sizeof *lens);
    int32_t orig[64];
    int64_t stats[5] = {0};
    dm_batch b;
    CHECK_OK(dm_batch_alloc(&b, cfg.batch, cfg.seq));
    int64_t steps = (N + cfg.batch - 1) / cfg.batch;
    int ordered = 1;
    for (int64_t k = 0; k < steps; k++) {
        CHECK_OK(dm_loader_batch_at(l, k, &b));
        for (int64_t i = 0; i < b.batch; i++) {
            int64_t n = check_row(&b, i, orig, stats);
            if (b.epoch[i] != 0) continue;
            int64_t q = b.sequence[i];
            ordered &= q == k * cfg.batch + i;
            CHECK(q >= 0 && q < N && seqs[q] == NULL);
            if (q < 0 || q >= N || seqs[q]) continue;
            seqs[q] = malloc((size_t)n * sizeof **seqs);
            int64_t m = 0;
            for (int64_t t = 1; t < n - 1; t++)
                if (orig[t] != SEP) seqs[q][m++] = orig[t];
            lens[q] = m;
            for (int64_t t = 0; t < cfg.seq; t++) CHECK(b.token_type_ids[i * cfg.seq + t] == 0);
            CHECK(b.nsp_labels[i] == -100);
        }
    }
    CHECK(!ordered); /* shuffled */
    check_epoch1(l, &cfg, N);
    size_t pos = 0;
    int same = 1;
    for (int64_t q = 0; q < N; q++) {
        CHECK(seqs[q] != NULL);
        if (!seqs[q]) continue;
        same &= pos + (size_t)lens[q] <= c->n && memcmp(seqs[q], c->ids + pos, (size_t)lens[q] * 4) == 0;
        pos += (size_t)lens[q];
        free(seqs[q]);
    }
    CHECK(same && pos == c->n); /* every token once an epoch, in order within the sequences */
    printf("  packed: %lld sequences of <= %lld tokens cover the %zu tokens once\n", (long long)N,
           (long long)cfg.seq, c->n);
    free(seqs);
    free(lens);
    /* masking statistics over many batches */
    for (int64_t k = steps; k < steps + 3000; k++) {
        CHECK_OK(dm_loader_batch_at(l, k, &b));
        for (int64_t i = 0; i < b.batch; i++) check_row(&b, i, orig, stats);
    }
    double nplain = v->vocab_size - 5;
    within((double)stats[1], (double)stats[0], 0.15, "chosen");
    within((double)stats[2], (double)stats[1], 0.8, "[MASK] of chosen");
    within((double)stats[3], (double)stats[1], 0.1 * (1 - 1 / nplain), "random of chosen");
    within((double)stats[4], (double)stats[1], 0.1 + 0.1 / nplain, "unchanged of chosen");
    dm_batch_free(&b);
    dm_loader_free(l);
}

static int batch_eq(const dm_batch *a, const dm_batch *b) {
    size_t n = (size_t)(a->batch * a->seq) * 4;
    return a->batch == b->batch && a->seq == b->seq && !memcmp(a->input_ids, b->input_ids, n) &&
           !memcmp(a->labels, b->labels, n) && !memcmp(a->attention_mask, b->attention_mask, n) &&
           !memcmp(a->token_type_ids, b->token_type_ids, n) &&
           !memcmp(a->nsp_labels, b->nsp_labels, (size_t)a->batch * 4);
}

static void copy_batch(dm_batch *dst, const dm_batch *src) {
    size_t n = (size_t)(src->batch * src->seq) * 4;
    memcpy(dst->input_ids, src->input_ids, n);
    memcpy(dst->labels, src->labels, n);
    memcpy(dst->attention_mask, src->attention_mask, n);
    memcpy(dst->token_type_ids, src->token_type_ids, n);
    memcpy(dst->nsp_labels, src->nsp_labels, (size_t)src->batch * 4);
}

static void test_determinism(const char *path, const dm_vocab_info *v, dm_seq_mode mode) {
    enum { K = 40 };
    dm_loader_config cfg;
    dm_loader_config_default(&cfg);
    cfg.batch = 5;
    cfg.seq = 48;
    cfg.mode = mode;
    cfg.nsp = mode == DM_SEQ_PAIRS;
    cfg.seed = 77;
    dm_batch ref[K];
    cfg.prefetch = 0;
    dm_loader *sync = open_loader(path, v, &cfg);
    cfg.prefetch = 3;
    dm_loader *bg = open_loader(path, v, &cfg);
    if (!sync || !bg) return;
    const dm_batch *x, *y;
    int same_bg = 1, steps_ok = 1;
    for (int k = 0; k < K; k++) {
        CHECK_OK(dm_batch_alloc(&ref[k], cfg.batch, cfg.seq));
        CHECK_OK(dm_loader_next(sync, &x));
        copy_batch(&ref[k], x);
        CHECK_OK(dm_loader_next(bg, &y));
        same_bg &= batch_eq(x, y);
        steps_ok &= x->step == k && y->step == k;
    }
    CHECK(same_bg && steps_ok);
    CHECK(dm_loader_batches(bg) == K && dm_loader_wait_seconds(bg) >= 0);
    /* resume: seek back and forth, a start step, batch_at */
    CHECK_OK(dm_loader_seek(bg, 17));
    int resumed = 1;
    for (int k = 17; k < K; k++) {
        CHECK_OK(dm_loader_next(bg, &y));
        resumed &= batch_eq(&ref[k], y);
    }
    CHECK(resumed);
    CHECK_OK(dm_loader_seek(bg, 3));
    CHECK_OK(dm_loader_next(bg, &y));
    CHECK(batch_eq(&ref[3], y));
    cfg.start_step = 25;
    dm_loader *late = open_loader(path, v, &cfg);
    if (late) {
        CHECK_OK(dm_loader_next(late, &y));
        CHECK(batch_eq(&ref[25], y) && y->step == 25);
    }
    dm_loader_free(late);
    dm_batch at;
    CHECK_OK(dm_batch_alloc(&at, cfg.batch, cfg.seq));
    CHECK_OK(dm_loader_batch_at(sync, 31, &at));
    CHECK(batch_eq(&ref[31], &at));
    /* another seed differs */
    cfg.start_step = 0;
    cfg.seed = 78;
    dm_loader *other = open_loader(path, v, &cfg);
    if (other) {
        CHECK_OK(dm_loader_next(other, &y));
        CHECK(!batch_eq(&ref[0], y));
    }
    dm_loader_free(other);
    dm_batch_free(&at);
    for (int k = 0; k < K; k++) dm_batch_free(&ref[k]);
    dm_loader_free(sync);
    dm_loader_free(bg);
}

/* Data parallelism: part p of P of batch k (batch b) is rows p*b .. (p+1)*b-1 of batch k of
 * a loader of batch P*b: the same sequences, masks and labels, across epochs too. */
static void test_parts(const char *path, const dm_vocab_info *v, dm_seq_mode mode) {
    enum { P = 3, B = 2, K = 50 }; /* 50 batches of 6: past an epoch of either corpus */
    dm_loader_config cfg;
    dm_loader_config_default(&cfg);
    cfg.batch = P * B, cfg.seq = 48, cfg.mode = mode, cfg.nsp = mode == DM_SEQ_PAIRS, cfg.seed = 5;
    cfg.prefetch = 0;
    dm_loader *whole = open_loader(path, v, &cfg), *part[P] = {0};
    cfg.batch = B;
    for (int p = 0; p < P; p++) {
        cfg.part = p, cfg.parts = P, cfg.prefetch = p; /* with and without the thread */
        part[p] = open_loader(path, v, &cfg);
    }
    dm_batch rows;
    CHECK_OK(dm_batch_alloc(&rows, B, cfg.seq));
    int same = 1, seqs = 1;
    for (int k = 0; whole && k < K; k++) {
        const dm_batch *w, *x;
        CHECK_OK(dm_loader_next(whole, &w));
        for (int p = 0; p < P && part[p]; p++) {
            CHECK_OK(dm_loader_next(part[p], &x));
            const size_t n = (size_t)B * (size_t)cfg.seq, o = (size_t)p * n;
            memcpy(rows.input_ids, w->input_ids + o, n * 4);
            memcpy(rows.labels, w->labels + o, n * 4);
            memcpy(rows.attention_mask, w->attention_mask + o, n * 4);
            memcpy(rows.token_type_ids, w->token_type_ids + o, n * 4);
            memcpy(rows.nsp_labels, w->nsp_labels + p * B, (size_t)B * 4);
            same &= batch_eq(&rows, x);
            for (int i = 0; i < B; i++) seqs &= x->sequence[i] == w->sequence[p * B + i] && x->epoch[i] == w->epoch[p * B + i];
        }
    }
    CHECK(same && seqs);
    /* batch_at and seek agree with next */
    if (part[1]) {
        const dm_batch *x;
        CHECK_OK(dm_loader_seek(part[1], 7));
        CHECK_OK(dm_loader_next(part[1], &x));
        dm_batch at;
        CHECK_OK(dm_batch_alloc(&at, B, cfg.seq));
        CHECK_OK(dm_loader_batch_at(part[1], 7, &at));
        CHECK(batch_eq(&at, x));
        dm_batch_free(&at);
    }
    /* a part past the parts is refused */
    dm_loader *bad = NULL;
    cfg.part = P, cfg.parts = P;
    const char *p1[1] = {path};
    CHECK(dm_loader_open_shards(&bad, p1, 1, v, &cfg) == DM_ERR_INVALID_ARG && !bad);
    cfg.part = -1;
    CHECK(dm_loader_open_shards(&bad, p1, 1, v, &cfg) == DM_ERR_INVALID_ARG && !bad);
    dm_batch_free(&rows);
    for (int p = 0; p < P; p++) dm_loader_free(part[p]);
    dm_loader_free(whole);
}

static size_t doc_of(int32_t id) { return (size_t)(id / 1000 - 1); }

static void test_pairs(const char *path, const dm_vocab_info *v, int nsp) {
    dm_loader_config cfg;
    dm_loader_config_default(&cfg);
    cfg.batch = 8;
    cfg.seq = 40;
    cfg.mode = DM_SEQ_PAIRS;
    cfg.nsp = nsp;
    dm_loader *l = open_loader(path, v, &cfg);
    if (!l) return;
    int32_t orig[40];
    int64_t stats[5] = {0}, rows = 0, random_b = 0;
    int ok_seg = 1, ok_doc = 1, ok_label = 1;
    const dm_batch *b;
    for (int k = 0; k < 400; k++) {
        CHECK_OK(dm_loader_next(l, &b));
        for (int64_t i = 0; i < b->batch; i++) {
            int64_t n = check_row(b, i, orig, stats);
            const int32_t *tt = b->token_type_ids + i * b->seq;
            int64_t sep1 = 1;
            while (sep1 < n && orig[sep1] != SEP) sep1++;
            ok_seg &= sep1 >= 2 && sep1 <= n - 3; /* A and B not empty */
            for (int64_t t = 0; t < n; t++) ok_seg &= tt[t] == (t > sep1);
            size_t da = doc_of(orig[1]), db = doc_of(orig[sep1 + 1]);
            for (int64_t t = 1; t < sep1; t++) ok_doc &= doc_of(orig[t]) == da;
            for (int64_t t = sep1 + 1; t < n - 1; t++) ok_doc &= doc_of(orig[t]) == db;
            int32_t lab = b->nsp_labels[i];
            /* without nsp B follows A, but for a chunk of one one-token sentence (nothing follows) */
            if (!nsp) ok_label &= lab == -100 && (da == db || sep1 == 2);
            else {
                ok_label &= (lab == 0 && da == db) || (lab == 1 && da != db);
                random_b += lab == 1;
            }
            rows++;
        }
    }
    CHECK(ok_seg && ok_doc && ok_label);
    if (nsp) within((double)random_b, (double)rows, 0.5, "random B");
    printf("  pairs%s: %lld rows, segments right\n", nsp ? " + nsp" : "", (long long)rows);
    dm_loader_free(l);
}

static void test_config_refusals(const char *path, const char *one_doc, const dm_vocab_info *v) {
    dm_loader_config cfg;
    dm_loader_config_default(&cfg);
    dm_loader *l = (dm_loader *)1;
    const char *p[1] = {path};
    cfg.seq = 2;
    CHECK(dm_loader_open_shards(&l, p, 1, v, &cfg) == DM_ERR_INVALID_ARG && l == NULL);
    CHECK(strstr(dm_last_error(), "too small") != NULL);
    cfg.seq = 3;
    CHECK_OK(dm_loader_open_shards(&l, p, 1, v, &cfg));
    dm_loader_free(l);
    cfg.mode = DM_SEQ_PAIRS;
    cfg.seq = 4;
    CHECK(dm_loader_open_shards(&l, p, 1, v, &cfg) == DM_ERR_INVALID_ARG);
    CHECK(strstr(dm_last_error(), "pair mode needs j >= 5") != NULL);
    cfg.seq = 5;
    CHECK_OK(dm_loader_open_shards(&l, p, 1, v, &cfg));
    const dm_batch *b;
    if (l) {
        CHECK_OK(dm_loader_next(l, &b));
        CHECK(b->input_ids[0] == CLS && b->input_ids[2] == SEP && b->input_ids[4] == SEP);
    }
    dm_loader_free(l);
    dm_vocab_info other = *v;
    other.hash ^= 1;
    CHECK(dm_loader_open_shards(&l, p, 1, &other, &cfg) == DM_ERR_FORMAT);
    CHECK(strstr(dm_last_error(), "another tokenizer") != NULL);
    other = *v; /* the same tokenizer hash, another size: a shard header edited or damaged */
    other.vocab_size -= 1;
    CHECK(dm_loader_open_shards(&l, p, 1, &other, &cfg) == DM_ERR_FORMAT && l == NULL);
    CHECK(strstr(dm_last_error(), "says vocab_size") != NULL);
    other = *v;
    other.special.mask = -1;
    CHECK(dm_loader_open_shards(&l, p, 1, &other, &cfg) == DM_ERR_INVALID_ARG);
    CHECK(strstr(dm_last_error(), "[MASK]") != NULL);
    p[0] = one_doc;
    cfg.nsp = 1;
    CHECK(dm_loader_open_shards(&l, p, 1, v, &cfg) == DM_ERR_INVALID_ARG);
    CHECK(strstr(dm_last_error(), "2 documents") != NULL);
    cfg.nsp = 0;
    CHECK(dm_loader_open_shards(&l, p, 0, v, &cfg) == DM_ERR_INVALID_ARG);
    CHECK(dm_loader_open(&l, "/nonexistent", "train", v, &cfg) != DM_OK && l == NULL);
}

/* --- dm_prepare with the real tokenizer ----------------------------------------------- */

static void progress_count(void *ctx, const dm_prepare_progress *p) {
    (void)p;
    ++*(int *)ctx;
}

/* The ids of shard s's document d, sentence by sentence, appended to out with a -1 after
 * each sentence. */
static void doc_ids(const dm_shard *s, uint64_t d, int32_t *out, size_t *n) {
    uint64_t f, c, tf, tc;
    dm_shard_document(s, d, &f, &c);
    for (uint64_t k = f; k < f + c; k++) {
        dm_shard_sentence(s, k, &tf, &tc);
        dm_shard_ids(s, tf, (size_t)tc, out + *n);
        *n += (size_t)tc;
        out[(*n)++] = -1;
    }
}

static void test_prepare(void) {
    char vocab_path[256], text_path[256], text2[256], out[256], path[512];
    path_of(vocab_path, sizeof vocab_path, "vocab.txt");
    path_of(text_path, sizeof text_path, "a.txt");
    path_of(text2, sizeof text2, "b.txt");
    path_of(out, sizeof out, "ds");
    static const char *const words[] = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "dog", "sat",
                                        "on", "mat", "ran", "home", ".", ",", "##s", "play", "##ing", "a"};
    FILE *f = fopen(vocab_path, "w");
    for (size_t k = 0; k < sizeof words / sizeof *words; k++) fprintf(f, "%s\n", words[k]);
    fclose(f);
    /* 40 documents of 1..4 lines; separators: blank lines, spaces and tabs, CRLF; no final
     * newline. The expected ids come from dm_tokenizer_encode line by line. */
    dm_tokenizer *t = NULL;
    CHECK_OK(dm_tokenizer_load(&t, vocab_path, DM_CASE_LOWER));
    if (!t) return;
    enum { DOCS = 40 };
    int32_t *want[DOCS];
    size_t want_n[DOCS];
    f = fopen(text_path, "w");
    for (int d = 0; d < DOCS; d++) {
        want[d] = malloc(4096 * sizeof **want);
        want_n[d] = 0;
        int lines = 1 + (int)rnd(4);
        for (int l = 0; l < lines; l++) {
            char line[256] = "";
            int nw = 1 + (int)rnd(8);
            for (int w = 0; w < nw; w++) {
                strcat(line, w ? " " : "");
                strcat(line, rnd(9) == 0 ? "Zebra" : words[5 + rnd(14)]);
                if (rnd(5) == 0) strcat(line, "s.");
            }
            fprintf(f, "%s%s", line, (d == DOCS - 1 && l == lines - 1) ? "" : (rnd(3) == 0 ? "\r\n" : "\n"));
            dm_ids ids = {0};
            CHECK_OK(dm_tokenizer_encode(t, line, strlen(line), 0, &ids, NULL));
            memcpy(want[d] + want_n[d], ids.v, ids.n * sizeof *ids.v);
            want_n[d] += ids.n;
            want[d][want_n[d]++] = -1;
            dm_ids_free(&ids);
        }
        if (d < DOCS - 1) fprintf(f, "%s", rnd(2) ? "\n" : " \t\n\n");
    }
    fclose(f);
    dm_prepare_config cfg;
    dm_prepare_config_default(&cfg);
    cfg.valid_fraction = 0.3;
    cfg.seed = 7;
    cfg.threads = 2;
    int calls = 0;
    cfg.progress = progress_count;
    cfg.progress_ctx = &calls;
    dm_prepare_stats st;
    const char *files[1] = {text_path};
    CHECK_OK(dm_prepare(t, files, 1, out, &cfg, &st));
    CHECK(calls >= 1 && st.files == 1 && st.has_valid && st.train_shards == 1);
    CHECK(st.train.documents + st.valid.documents == DOCS && st.valid.documents > 0);
    /* every document in exactly one split, whole and in order */
    dm_dataset *ds = NULL;
    CHECK_OK(dm_dataset_open(&ds, out));
    dm_vocab_info v;
    CHECK_OK(dm_vocab_info_from(t, &v));
    CHECK(ds && dm_dataset_vocab_hash(ds) == v.hash);
    dm_shard *tr = NULL, *va = NULL;
    CHECK_OK(dm_shard_open(&tr, dm_dataset_shard_path(ds, "train", 0), v.hash));
    CHECK_OK(dm_shard_open(&va, dm_dataset_shard_path(ds, "valid", 0), v.hash));
    if (tr && va) {
        uint64_t dt = 0, dv = 0;
        int same = 1;
        int32_t got[4096];
        for (int d = 0; d < DOCS; d++) {
            size_t n = 0;
            dm_shard_info ti, vi;
            dm_shard_get_info(tr, &ti);
            dm_shard_get_info(va, &vi);
            /* the document is the next one of the split it went to */
            if (dt < ti.documents) doc_ids(tr, dt, got, &n);
            if (n == want_n[d] && !memcmp(got, want[d], n * 4)) {
                dt++;
                continue;
            }
            n = 0;
            if (dv < vi.documents) doc_ids(va, dv, got, &n);
            if (n == want_n[d] && !memcmp(got, want[d], n * 4)) dv++;
            else same = 0;
        }
        CHECK(same && dt == st.train.documents && dv == st.valid.documents);
    }
    dm_shard_free(tr);
    dm_shard_free(va);
    dm_dataset_free(ds);
    /* refusals leave the dataset and the directory as they were */
    CHECK(dm_prepare(t, files, 1, out, &cfg, &st) == DM_ERR_INVALID_ARG);
    CHECK(strstr(dm_last_error(), "--force") != NULL);
    f = fopen(text2, "w");
    fprintf(f, "the cat\nthe \xc3\x28 dog\n");
    fclose(f);
    char out2[256];
    path_of(out2, sizeof out2, "ds2");
    const char *files2[2] = {text_path, text2};
    CHECK(dm_prepare(t, files2, 2, out2, &cfg, &st) == DM_ERR_FORMAT);
    CHECK(strstr(dm_last_error(), "b.txt") && strstr(dm_last_error(), "byte offset 12"));
    cfg.force = 1;
    CHECK(dm_prepare(t, files2, 2, out, &cfg, &st) == DM_ERR_FORMAT); /* the old dataset stays */
    CHECK_OK(dm_dataset_open(&ds, out));
    dm_dataset_free(ds);
    CHECK_OK(dm_prepare(t, files, 1, out, &cfg, &st)); /* replaced */
    const char *none[1] = {vocab_path};
    f = fopen(text2, "w");
    fprintf(f, "\n \n");
    fclose(f);
    none[0] = text2;
    CHECK(dm_prepare(t, none, 1, out2, &cfg, &st) == DM_ERR_INVALID_ARG);
    none[0] = g_dir;
    CHECK(dm_prepare(t, none, 1, out2, &cfg, &st) == DM_ERR_INVALID_ARG);
    CHECK(dm_prepare(t, files, 0, out2, &cfg, &st) == DM_ERR_INVALID_ARG);
    /* nothing left: only ds and the files this test wrote */
    DIR *dir = opendir(g_dir);
    struct dirent *e;
    int stray = 0;
    while (dir && (e = readdir(dir)) != NULL) stray |= strstr(e->d_name, ".tmp-") || strstr(e->d_name, ".old-") ||
                                                      !strcmp(e->d_name, "ds2");
    if (dir) closedir(dir);
    CHECK(!stray);
    snprintf(path, sizeof path, "rm -rf '%s'", out);
    CHECK(system(path) == 0);
    unlink(text2);
    unlink(text_path);
    unlink(vocab_path);
    for (int d = 0; d < DOCS; d++) free(want[d]);
    dm_tokenizer_free(t);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_roundtrip(1000, 2);
    test_roundtrip(65536, 2);
    test_roundtrip(70000, 4);
    test_refusals();

    /* the loader's corpus: 60 documents, one sentence of 300 tokens (split in packing) */
    dm_vocab_info v = vocab(30522, 0xfeedULL);
    dm_shard_writer *w = NULL;
    CHECK_OK(dm_shard_writer_new(&w, &v));
    corpus_t c;
    make_corpus(&c, w, 60, 8, 40, v.vocab_size, 0, 300);
    char packed[256], pairs[256], one[256];
    path_of(packed, sizeof packed, "packed.shard");
    CHECK_OK(dm_shard_writer_write(w, packed));
    dm_shard_writer_free(w);
    test_packed(packed, &c, &v);
    test_determinism(packed, &v, DM_SEQ_PACKED);
    test_parts(packed, &v, DM_SEQ_PACKED);

    /* pairs: document d's ids in their own range, so the test sees where B came from */
    dm_vocab_info pv = vocab(70000, 0xbeefULL);
    CHECK_OK(dm_shard_writer_new(&w, &pv));
    corpus_t pc;
    make_corpus(&pc, w, 60, 8, 20, pv.vocab_size, 1, 0);
    path_of(pairs, sizeof pairs, "pairs.shard");
    CHECK_OK(dm_shard_writer_write(w, pairs));
    int32_t lone[3] = {1000, 1001, 1002};
    CHECK_OK(dm_shard_writer_add_sentence(w, lone, 3));
    path_of(one, sizeof one, "one.shard");
    CHECK_OK(dm_shard_writer_write(w, one));
    dm_shard_writer_free(w);
    test_pairs(pairs, &pv, 0);
    test_pairs(pairs, &pv, 1);
    test_determinism(pairs, &pv, DM_SEQ_PAIRS);
    test_parts(pairs, &pv, DM_SEQ_PAIRS);
    test_config_refusals(pairs, one, &pv);
    test_prepare();

    free(c.ids);
    free(pc.ids);
    const char *names[] = {"rt.shard", "packed.shard", "pairs.shard", "one.shard"};
    char p[256];
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        path_of(p, sizeof p, names[k]);
        unlink(p);
    }
    rmdir(g_dir);
    TEST_END();
}
