/* tok_internal.h: the tokenizer's insides, shared by tok_load.c (tokenizer.json and
 * vocab.txt into a dm_tokenizer), tok_encode.c (text into ids) and tok_misc.c. */
#ifndef DM_TEXT_TOK_INTERNAL_H
#define DM_TEXT_TOK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dmove_text.h"

/* An open-addressing hash of byte strings to ids (linear probing, capacity a power of 2). */
typedef struct {
    uint64_t h;      /* the key's hash; 0: an empty slot (hashes are never 0) */
    const char *key; /* into the tokenizer's string pool */
    uint32_t len;
    int32_t id;
} tok_slot;

typedef struct {
    tok_slot *slots;
    size_t mask; /* capacity - 1 */
    size_t maxlen; /* the longest key, bytes */
} tok_map;

/* The vocabulary as a trie of bytes whose nodes are the tokens' prefixes, held in one
 * open-addressing hash keyed by the prefix's rolling hash (so the slots of a word's next
 * prefixes are known before the walk gets there, and are fetched ahead). A slot is exact
 * by induction: its parent slot (the prefix one byte shorter) and its last byte. */
typedef struct {
    uint32_t tag;    /* the hash's low bits */
    uint32_t parent; /* 1 + the parent's slot; 0: the root (the empty prefix) */
    int32_t id;      /* the token that ends here, or -1 */
    uint32_t byte;   /* 1 + the prefix's last byte; 0: an empty slot */
} tok_node;

typedef struct {
    tok_node *s;
    uint32_t bits; /* capacity 1 << bits */
    uint32_t nodes;
    size_t maxlen; /* the longest key */
} tok_trie;

static inline uint64_t tok_trie_next(uint64_t h, uint8_t b) { return (h ^ b) * 0x100000001b3ull; }
#define TOK_TRIE_SEED 0xcbf29ce484222325ull
static inline uint64_t tok_trie_mix(uint64_t h) {
    h ^= h >> 31;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

/* The slot (1 + index) of the prefix with hash h, parent slot `parent` and last byte b, or 0. */
static inline uint32_t tok_trie_find(const tok_trie *t, uint64_t h, uint32_t parent, uint8_t b) {
    uint64_t m = tok_trie_mix(h);
    size_t mask = ((size_t)1 << t->bits) - 1;
    uint32_t tag = (uint32_t)m;
    for (size_t i = (size_t)(m >> (64 - t->bits));; i = (i + 1) & mask) {
        const tok_node *e = &t->s[i];
        if (!e->byte) return 0;
        if (e->tag == tag && e->parent == parent && e->byte == (uint32_t)b + 1) return (uint32_t)i + 1;
    }
}

static inline const tok_node *tok_trie_slot(const tok_trie *t, uint64_t h) {
    return &t->s[tok_trie_mix(h) >> (64 - t->bits)];
}

#define TOK_MAX_SPECIAL 63 /* bytes of the name of a special token ([CLS] ...) */

/* tokenizer_config.json's keys of the special tokens, in special_names' order */
extern const char *const tok_special_keys[5];

/* The bytes of the Unicode White_Space character (the ASCII ones and the few of Latin-1 /
 * general punctuation: U+0085, U+00A0, U+1680, U+2000-200A, U+2028/9, U+202F, U+205F,
 * U+3000; what a vocab.txt line's trim_end drops) that ends (end 1) or starts (end 0)
 * p[0..n), 0 when none. */
static inline size_t tok_space_len(const unsigned char *p, size_t n, int end) {
    for (size_t w = 1; w <= 3 && w <= n; w++) {
        const unsigned char *c = end ? p + n - w : p;
        if (w == 1 && (c[0] == ' ' || (c[0] >= 9 && c[0] <= 13))) return 1;
        if (w == 2 && c[0] == 0xC2 && (c[1] == 0x85 || c[1] == 0xA0)) return 2;
        if (w == 3 && ((c[0] == 0xE1 && c[1] == 0x9A && c[2] == 0x80) || (c[0] == 0xE3 && c[1] == 0x80 && c[2] == 0x80) ||
                       (c[0] == 0xE2 && c[1] == 0x80 && (c[2] <= 0x8A || c[2] == 0xA8 || c[2] == 0xA9 || c[2] == 0xAF)) ||
                       (c[0] == 0xE2 && c[1] == 0x81 && c[2] == 0x9F)))
            return 3;
    }
    return 0;
}

/* An added token (tokenizer.json's added_tokens, or the specials of a vocab.txt). */
typedef struct {
    const char *s; /* the content (normalized ones: as the normalizer makes it) */
    size_t len;
    int32_t id;
    uint8_t lstrip, rstrip, single_word, normalized, special;
    uint8_t implied; /* a special token the file lacks, given a new id as BertTokenizerFast does */
    uint8_t pending; /* a directory's added_tokens.json entry: its id set once the vocabulary is read */
} tok_added;

/* A node of an added-token set's byte trie: its first child and next sibling (-1: none),
 * the byte that leads to it, and the token that ends at it (an index into v, -1: none). */
typedef struct {
    int32_t child, sibling, tok;
    uint8_t byte;
} tok_anode;

/* The added tokens of one kind (normalized or not) in the file's order, a byte trie of
 * them (node[root[b]]: the tokens that start with byte b, root[b] -1 where none does; a
 * content twice: the first), and the only first byte (memchr) or -1 for several. */
typedef struct {
    tok_added *v;
    size_t n;
    tok_anode *node;
    size_t nnode;
    int32_t root[256];
    int one_first;
} tok_addset;

struct dm_tokenizer {
    int32_t size;        /* ids 0 .. size-1 */
    const char **tok;    /* id -> token text (NUL-terminated, into pool) */
    uint32_t *tok_len;
    char *pool;          /* the token strings */
    tok_map full;        /* the model's vocabulary */
    tok_trie tfull, tcont; /* WordPiece's: every token; the continuations, less the prefix */
    int32_t unk;
    char prefix[64];
    int max_chars;
    /* normalizer */
    int has_norm, clean, chinese, strip, lower;
    int norm_cfg; /* 1: a model directory's BertTokenizer changed what tokenizer.json says */
    char *json;      /* the tokenizer.json it was read from, as read (less a byte-order mark); NULL: a vocab.txt */
    size_t json_len;
    int pretok; /* 1: BertPreTokenizer, 0: none (the whole text one word) */
    tok_addset raw, normed;
    tok_added *added; /* all, as the file lists them (the sets point into own copies) */
    size_t n_added;
    /* post-processor: ids before and after the text */
    int32_t pre_ids[8], post_ids[8];
    int n_pre, n_post;
    char special_names[5][TOK_MAX_SPECIAL + 1]; /* pad unk cls sep mask */
    uint64_t hash;
    char describe[320];
    /* the ASCII fast path: what the normalizer makes of a byte < 0x80 (-1: dropped) and
     * the pre-tokenizer's class of it (0 word, 1 whitespace, 2 punctuation) */
    int16_t asc_norm[128];
    uint8_t asc_class[128];
};

/* tok_map */
uint64_t tok_hash(const char *p, size_t n);
int32_t tok_map_get(const tok_map *m, const char *p, size_t n);

/* tok_encode.c: the normalized form of `s` (for normalized added tokens): a malloc'ed
 * string, NULL on no memory. */
char *tok_normalize_string(const dm_tokenizer *t, const char *s, size_t len, size_t *out_len);
/* Fills asc_norm/asc_class from the settings. */
void tok_setup_ascii(dm_tokenizer *t);

#endif
