/* shard.c: token shard files (include/dmove_data.h, SHARD FORMAT): the checksum, the writer
 * (a shard built in memory, written atomically) and the reader (mapped, validated whole
 * before use). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/file.h"
#include "core/status.h"
#include "dmove_data.h"
#include "text/shard_internal.h"

/* --- The checksum --------------------------------------------------------------------- */

#define H_P1 0x9E3779B185EBCA87ull
#define H_P2 0xC2B2AE3D27D4EB4Full
#define H_P3 0x165667B19E3779F9ull

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t rd64(const unsigned char *p) {
    uint64_t v = 0;
    for (int k = 7; k >= 0; k--) v = (v << 8) | p[k];
    return v;
}
static inline uint64_t h_round(uint64_t acc, uint64_t w) { return rotl64(acc + w * H_P2, 31) * H_P1; }

uint64_t dm_data_hash64(const void *data, size_t len) {
    const unsigned char *p = data;
    uint64_t v[4] = {H_P1 + H_P2, H_P2, 0, (uint64_t)0 - H_P1};
    size_t n = len;
    if (!p) n = 0;
    while (n >= 32) {
        for (int k = 0; k < 4; k++) v[k] = h_round(v[k], rd64(p + 8 * k));
        p += 32;
        n -= 32;
    }
    if (n > 0) { /* the tail, zero-padded to a block */
        unsigned char tail[32] = {0};
        memcpy(tail, p, n);
        for (int k = 0; k < 4; k++) v[k] = h_round(v[k], rd64(tail + 8 * k));
    }
    uint64_t h = rotl64(v[0], 1) + rotl64(v[1], 7) + rotl64(v[2], 12) + rotl64(v[3], 18);
    for (int k = 0; k < 4; k++) h = (h ^ h_round(0, v[k])) * H_P1 + H_P3;
    h ^= (uint64_t)len * H_P3;
    h ^= h >> 33; /* murmur's finalizer */
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    return h;
}

/* --- Little-endian fields ------------------------------------------------------------- */

static void put32(unsigned char *p, uint32_t v) {
    for (int k = 0; k < 4; k++) p[k] = (unsigned char)(v >> (8 * k));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int k = 0; k < 8; k++) p[k] = (unsigned char)(v >> (8 * k));
}
static uint32_t get32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* --- The layout ----------------------------------------------------------------------- */

/* The offsets and size of a shard with these counts: 0, or -1 on overflow. */
static int shard_layout(uint64_t docs, uint64_t sents, uint64_t toks, int id_bytes,
                        uint64_t *sent_off, uint64_t *ids_off, uint64_t *file_bytes) {
    size_t a, b, c;
    if (docs >= SIZE_MAX / 8 || sents >= SIZE_MAX / 8) return -1;
    if (!dm_mul_ok((size_t)docs + 1, 8, &a) || !dm_add_ok(a, DM_SHARD_HEADER, &a)) return -1;
    if (!dm_mul_ok((size_t)sents + 1, 8, &b) || !dm_add_ok(a, b, &b)) return -1;
    if (toks > SIZE_MAX || !dm_mul_ok((size_t)toks, (size_t)id_bytes, &c)) return -1;
    if (!dm_add_ok(c, 7, &c)) return -1;
    c &= ~(size_t)7;
    if (!dm_add_ok(b, c, &c) || !dm_add_ok(c, 8, &c)) return -1;
    *sent_off = a;
    *ids_off = b;
    *file_bytes = c;
    return 0;
}

int dm_shard_id_bytes(int32_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

/* --- The writer ----------------------------------------------------------------------- */

struct dm_shard_writer {
    dm_vocab_info vocab;
    uint64_t *doc_first; /* first sentence of each closed document */
    size_t docs, docs_cap;
    uint64_t *sent_first; /* first token of each sentence */
    size_t sents, sents_cap;
    int32_t *ids;
    size_t toks, toks_cap;
    size_t open_first; /* the open document's first sentence */
    uint64_t unknown;
};

static dm_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return DM_OK;
    size_t n = *cap ? *cap : 1024, bytes;
    while (n < need) {
        if (!dm_mul_ok(n, 2, &n)) return dm_fail(DM_ERR_OOM, "shard writer: size overflow");
    }
    if (!dm_mul_ok(n, elem, &bytes)) return dm_fail(DM_ERR_OOM, "shard writer: size overflow");
    void *q = realloc(*p, bytes);
    if (!q) return dm_fail(DM_ERR_OOM, "shard writer: out of memory (%zu bytes)", bytes);
    *p = q;
    *cap = n;
    return DM_OK;
}

dm_status dm_shard_writer_new(dm_shard_writer **out, const dm_vocab_info *vocab) {
    if (out) *out = NULL;
    if (!out || !vocab) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_writer_new: NULL argument");
    if (vocab->vocab_size <= 0)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_writer_new: vocab_size %d (must be > 0)",
                       (int)vocab->vocab_size);
    dm_shard_writer *w = calloc(1, sizeof *w);
    if (!w) return dm_fail(DM_ERR_OOM, "out of memory");
    w->vocab = *vocab;
    *out = w;
    return DM_OK;
}

void dm_shard_writer_free(dm_shard_writer *w) {
    if (!w) return;
    free(w->doc_first);
    free(w->sent_first);
    free(w->ids);
    free(w);
}

dm_status dm_shard_writer_add_sentence(dm_shard_writer *w, const int32_t *ids, size_t n) {
    if (!w || !ids) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_writer_add_sentence: NULL argument");
    if (n == 0) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_writer_add_sentence: an empty sentence");
    uint64_t unk = 0;
    for (size_t k = 0; k < n; k++) {
        if (ids[k] < 0 || ids[k] >= w->vocab.vocab_size)
            return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_writer_add_sentence: id %d out of the "
                           "vocabulary (0 .. %d)", (int)ids[k], (int)w->vocab.vocab_size - 1);
        unk += ids[k] == w->vocab.special.unk;
    }
    size_t need;
    if (!dm_add_ok(w->toks, n, &need)) return dm_fail(DM_ERR_OOM, "shard writer: size overflow");
    DM_TRY(grow((void **)&w->ids, &w->toks_cap, need, sizeof *w->ids));
    DM_TRY(grow((void **)&w->sent_first, &w->sents_cap, w->sents + 1, sizeof *w->sent_first));
    w->sent_first[w->sents++] = w->toks;
    memcpy(w->ids + w->toks, ids, n * sizeof *ids);
    w->toks = need;
    w->unknown += unk;
    return DM_OK;
}

dm_status dm_shard_writer_end_document(dm_shard_writer *w) {
    if (!w) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_writer_end_document: NULL argument");
    if (w->sents == w->open_first) return DM_OK;
    DM_TRY(grow((void **)&w->doc_first, &w->docs_cap, w->docs + 1, sizeof *w->doc_first));
    w->doc_first[w->docs++] = w->open_first;
    w->open_first = w->sents;
    return DM_OK;
}

dm_status dm_shard_writer_info(const dm_shard_writer *w, dm_shard_info *out) {
    if (!w || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_writer_info: NULL argument");
    memset(out, 0, sizeof *out);
    out->documents = w->docs + (w->sents > w->open_first);
    out->sentences = w->sents;
    out->tokens = w->toks;
    out->unknown = w->unknown;
    out->id_bytes = dm_shard_id_bytes(w->vocab.vocab_size);
    out->vocab_hash = w->vocab.hash;
    out->vocab_size = w->vocab.vocab_size;
    uint64_t so, io;
    if (shard_layout(out->documents, out->sentences, out->tokens, out->id_bytes, &so, &io, &out->bytes))
        return dm_fail(DM_ERR_OOM, "shard writer: size overflow");
    return DM_OK;
}

/* The file's bytes in *buf (malloc'd), *len. */
static dm_status shard_encode(const dm_shard_writer *w, unsigned char **buf, uint64_t *len) {
    int width = dm_shard_id_bytes(w->vocab.vocab_size);
    uint64_t so, io, fb;
    if (shard_layout(w->docs, w->sents, w->toks, width, &so, &io, &fb))
        return dm_fail(DM_ERR_OOM, "shard writer: size overflow");
    unsigned char *b = calloc(1, (size_t)fb);
    if (!b) return dm_fail(DM_ERR_OOM, "shard writer: out of memory (%llu bytes)", (unsigned long long)fb);
    memcpy(b, DM_SHARD_MAGIC, 8);
    put32(b + 8, DM_SHARD_VERSION);
    put32(b + 12, DM_SHARD_HEADER);
    put32(b + 16, (uint32_t)width);
    put32(b + 20, 0);
    put64(b + 24, w->vocab.hash);
    put32(b + 32, (uint32_t)w->vocab.vocab_size);
    put32(b + 36, (uint32_t)w->vocab.special.unk);
    put64(b + 40, w->docs);
    put64(b + 48, w->sents);
    put64(b + 56, w->toks);
    put64(b + 64, w->unknown);
    put64(b + 72, DM_SHARD_HEADER);
    put64(b + 80, so);
    put64(b + 88, io);
    put64(b + 96, fb);
    unsigned char *p = b + DM_SHARD_HEADER;
    for (size_t d = 0; d < w->docs; d++, p += 8) put64(p, w->doc_first[d]);
    put64(p, w->sents);
    p = b + so;
    for (size_t s = 0; s < w->sents; s++, p += 8) put64(p, w->sent_first[s]);
    put64(p, w->toks);
    p = b + io;
    if (width == 2)
        for (size_t t = 0; t < w->toks; t++, p += 2) {
            p[0] = (unsigned char)w->ids[t];
            p[1] = (unsigned char)((uint32_t)w->ids[t] >> 8);
        }
    else
        for (size_t t = 0; t < w->toks; t++, p += 4) put32(p, (uint32_t)w->ids[t]);
    put64(b + fb - 8, dm_data_hash64(b, (size_t)fb - 8));
    *buf = b;
    *len = fb;
    return DM_OK;
}

dm_status dm_shard_writer_write(dm_shard_writer *w, const char *path) {
    if (!w || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_writer_write: NULL argument");
    DM_TRY(dm_shard_writer_end_document(w));
    unsigned char *buf = NULL;
    uint64_t len = 0;
    DM_TRY(shard_encode(w, &buf, &len));
    dm_status st = dm_write_file_atomic(path, buf, (size_t)len);
    free(buf);
    if (st != DM_OK) return st;
    w->docs = w->sents = w->toks = w->open_first = 0;
    w->unknown = 0;
    return DM_OK;
}

/* --- The reader ----------------------------------------------------------------------- */

struct dm_shard {
    char *path;
    const unsigned char *map;
    size_t map_len;
    dm_shard_info info;
    const unsigned char *doc_tab, *sent_tab, *ids;
};

void dm_shard_free(dm_shard *s) {
    if (!s) return;
    if (s->map) munmap((void *)s->map, s->map_len);
    free(s->path);
    free(s);
}

/* Maps the file read-only. */
static dm_status map_file(dm_shard *s, const char *path) {
    if (dm_input_regular(path) != DM_OK) return dm_fail_context(dm_last_status(), "shard: ");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dm_fail(DM_ERR_IO, "cannot open shard '%s': %s", path, strerror(errno));
    struct stat stt;
    if (fstat(fd, &stt) != 0) {
        dm_status st = dm_fail(DM_ERR_IO, "cannot stat shard '%s': %s", path, strerror(errno));
        close(fd);
        return st;
    }
    if (!S_ISREG(stt.st_mode)) {
        close(fd);
        return dm_fail(DM_ERR_IO, "'%s' is not a regular file (a shard was expected)", path);
    }
    if ((uint64_t)stt.st_size < DM_SHARD_HEADER + 24) {
        close(fd);
        return dm_fail(DM_ERR_FORMAT, "shard '%s' is truncated: %lld bytes, less than a header "
                       "and its tables: make it again with dmove prepare", path, (long long)stt.st_size);
    }
    void *m = mmap(NULL, (size_t)stt.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return dm_fail(DM_ERR_IO, "cannot map shard '%s': %s", path, strerror(e));
    s->map = m;
    s->map_len = (size_t)stt.st_size;
    return DM_OK;
}

/* The header's fields, checked against each other and the file's length. */
static dm_status check_header(dm_shard *s, const char *path) {
    const unsigned char *h = s->map;
    if (memcmp(h, DM_SHARD_MAGIC, 8) != 0)
        return dm_fail(DM_ERR_FORMAT, "'%s' is not a dmove token shard (its first bytes are not "
                       "\"DMSHARD\"): give the shards dmove prepare wrote", path);
    uint32_t ver = get32(h + 8), hsize = get32(h + 12), width = get32(h + 16), flags = get32(h + 20);
    if (ver != DM_SHARD_VERSION)
        return dm_fail(DM_ERR_FORMAT, "shard '%s' has format version %u; this dmove reads version %d: "
                       "make it again with this dmove's prepare", path, ver, DM_SHARD_VERSION);
    if (hsize != DM_SHARD_HEADER || flags != 0)
        return dm_fail(DM_ERR_FORMAT, "shard '%s': header size %u / flags %u (expected %d / 0): the "
                       "file is damaged", path, hsize, flags, DM_SHARD_HEADER);
    dm_shard_info *in = &s->info;
    in->vocab_hash = rd64(h + 24);
    in->vocab_size = (int32_t)get32(h + 32);
    in->documents = rd64(h + 40);
    in->sentences = rd64(h + 48);
    in->tokens = rd64(h + 56);
    in->unknown = rd64(h + 64);
    in->bytes = s->map_len;
    in->id_bytes = (int)width;
    if (in->vocab_size <= 0 || (width != 2 && width != 4) ||
        (int)width != dm_shard_id_bytes(in->vocab_size))
        return dm_fail(DM_ERR_FORMAT, "shard '%s': id width %u does not fit vocab_size %d: the file "
                       "is damaged", path, width, (int)in->vocab_size);
    uint64_t so, io, fb;
    if (shard_layout(in->documents, in->sentences, in->tokens, (int)width, &so, &io, &fb) ||
        rd64(h + 72) != DM_SHARD_HEADER || rd64(h + 80) != so || rd64(h + 88) != io)
        return dm_fail(DM_ERR_FORMAT, "shard '%s': its counts and table offsets disagree: the file "
                       "is damaged", path);
    for (int k = 104; k < DM_SHARD_HEADER; k++)
        if (h[k]) return dm_fail(DM_ERR_FORMAT, "shard '%s': reserved header bytes are not zero: "
                                 "the file is damaged", path);
    if (rd64(h + 96) != fb || fb != s->map_len)
        return dm_fail(DM_ERR_FORMAT, "shard '%s' is truncated or was extended: it is %zu bytes, its "
                       "header says %llu: make it again with dmove prepare", path, s->map_len,
                       (unsigned long long)rd64(h + 96));
    s->doc_tab = h + DM_SHARD_HEADER;
    s->sent_tab = h + so;
    s->ids = h + io;
    return DM_OK;
}

/* The tables (increasing, the right ends) and the ids (in the vocabulary, the unknown
 * count). */
static dm_status check_body(dm_shard *s, const char *path) {
    const dm_shard_info *in = &s->info;
    uint64_t prev = rd64(s->doc_tab);
    if (prev != 0 || rd64(s->doc_tab + 8 * in->documents) != in->sentences)
        return dm_fail(DM_ERR_FORMAT, "shard '%s': the document table's ends are wrong", path);
    for (uint64_t d = 1; d <= in->documents; d++) {
        uint64_t v = rd64(s->doc_tab + 8 * d);
        if (v <= prev)
            return dm_fail(DM_ERR_FORMAT, "shard '%s': document %llu is empty or out of order", path,
                           (unsigned long long)(d - 1));
        prev = v;
    }
    prev = rd64(s->sent_tab);
    if (prev != 0 || rd64(s->sent_tab + 8 * in->sentences) != in->tokens)
        return dm_fail(DM_ERR_FORMAT, "shard '%s': the sentence table's ends are wrong", path);
    for (uint64_t k = 1; k <= in->sentences; k++) {
        uint64_t v = rd64(s->sent_tab + 8 * k);
        if (v <= prev)
            return dm_fail(DM_ERR_FORMAT, "shard '%s': sentence %llu is empty or out of order", path,
                           (unsigned long long)(k - 1));
        prev = v;
    }
    uint32_t unk_id = get32(s->map + 36);
    uint64_t unk = 0;
    uint32_t vs = (uint32_t)in->vocab_size;
    for (uint64_t t = 0; t < in->tokens; t++) {
        uint32_t id = in->id_bytes == 2 ? (uint32_t)s->ids[2 * t] | (uint32_t)s->ids[2 * t + 1] << 8
                                        : get32(s->ids + 4 * t);
        if (id >= vs)
            return dm_fail(DM_ERR_FORMAT, "shard '%s': token %llu has id %u, past the vocabulary "
                           "(%u ids)", path, (unsigned long long)t, id, vs);
        unk += id == unk_id;
    }
    if (unk != in->unknown)
        return dm_fail(DM_ERR_FORMAT, "shard '%s': %llu unknown tokens, the header says %llu", path,
                       (unsigned long long)unk, (unsigned long long)in->unknown);
    return DM_OK;
}

dm_status dm_shard_open(dm_shard **out, const char *path, uint64_t expect_hash) {
    if (out) *out = NULL;
    if (!out || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_open: NULL argument");
    dm_shard *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return dm_fail(DM_ERR_OOM, "out of memory");
    }
    dm_status st = map_file(s, path);
    if (st == DM_OK) st = check_header(s, path);
    /* the fuzzing build (tests/fuzz) reaches past the checksum: what it guards is checked too */
    if (st == DM_OK && rd64(s->map + s->map_len - 8) != dm_data_hash64(s->map, s->map_len - 8) && !DM_FUZZING_BUILD)
        st = dm_fail(DM_ERR_FORMAT, "shard '%s' fails its checksum: it was changed or damaged after "
                     "it was written; make it again with dmove prepare", path);
    if (st == DM_OK) s->info.checksum = rd64(s->map + s->map_len - 8);
    if (st == DM_OK) st = check_body(s, path);
    if (st == DM_OK && expect_hash && s->info.vocab_hash != expect_hash)
        st = dm_fail(DM_ERR_FORMAT, "shard '%s' was made with another tokenizer (vocabulary hash "
                     "%016llx, the model's is %016llx): prepare the text again with the model's "
                     "tokenizer", path, (unsigned long long)s->info.vocab_hash,
                     (unsigned long long)expect_hash);
    if (st != DM_OK) {
        dm_shard_free(s);
        return st;
    }
    *out = s;
    return DM_OK;
}

dm_status dm_shard_get_info(const dm_shard *s, dm_shard_info *out) {
    if (!s || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_get_info: NULL argument");
    *out = s->info;
    return DM_OK;
}

dm_status dm_shard_document(const dm_shard *s, uint64_t d, uint64_t *first, uint64_t *count) {
    if (!s || !first || !count) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_document: NULL argument");
    if (d >= s->info.documents)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_document: document %llu of %llu",
                       (unsigned long long)d, (unsigned long long)s->info.documents);
    *first = rd64(s->doc_tab + 8 * d);
    *count = rd64(s->doc_tab + 8 * d + 8) - *first;
    return DM_OK;
}

dm_status dm_shard_sentence(const dm_shard *s, uint64_t k, uint64_t *first, uint64_t *count) {
    if (!s || !first || !count) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_sentence: NULL argument");
    if (k >= s->info.sentences)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_sentence: sentence %llu of %llu",
                       (unsigned long long)k, (unsigned long long)s->info.sentences);
    *first = rd64(s->sent_tab + 8 * k);
    *count = rd64(s->sent_tab + 8 * k + 8) - *first;
    return DM_OK;
}

void dm_shard_copy_ids(const dm_shard *s, uint64_t first, size_t n, int32_t *out) {
    if (s->info.id_bytes == 2) {
        const unsigned char *p = s->ids + 2 * first;
        for (size_t k = 0; k < n; k++) out[k] = (int32_t)((uint32_t)p[2 * k] | (uint32_t)p[2 * k + 1] << 8);
    } else {
        const unsigned char *p = s->ids + 4 * first;
        for (size_t k = 0; k < n; k++) out[k] = (int32_t)get32(p + 4 * k);
    }
}

dm_status dm_shard_ids(const dm_shard *s, uint64_t first, size_t n, int32_t *out) {
    if (!s || (!out && n)) return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_ids: NULL argument");
    if (first > s->info.tokens || n > s->info.tokens - first)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_shard_ids: ids %llu .. %llu of %llu",
                       (unsigned long long)first, (unsigned long long)(first + n),
                       (unsigned long long)s->info.tokens);
    dm_shard_copy_ids(s, first, n, out);
    return DM_OK;
}

uint64_t dm_shard_table(const dm_shard *s, int sentences, uint64_t k) {
    return rd64((sentences ? s->sent_tab : s->doc_tab) + 8 * k);
}
