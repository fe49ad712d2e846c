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

/* An added token (tokenizer.json's added_tokens, or the specials of a vocab.txt). */
typedef struct {
    const char *s; /* the content (normalized ones: as the normalizer makes it) */
    size_t len;
    int32_t id;
    uint8_t lstrip, rstrip, single_word, normalized, special;
} tok_added;

/* The added tokens of one kind (normalized or not), sorted longest first, with the bytes
 * they may start with. */
typedef struct {
    tok_added *v;
    size_t n;
    uint8_t first[256];
    int one_first; /* -1: several first bytes, else the only one (memchr) */
} tok_addset;

struct dm_tokenizer {
    int32_t size;        /* ids 0 .. size-1 */
    const char **tok;    /* id -> token text (NUL-terminated, into pool) */
    uint32_t *tok_len;
    char *pool;          /* the token strings */
    tok_map full;        /* the model's vocabulary */
    tok_map cont;        /* the tokens that begin with the continuation prefix, less it */
    int32_t unk;
    char prefix[64];
    int max_chars;
    /* normalizer */
    int has_norm, clean, chinese, strip, lower;
    int pretok; /* 1: BertPreTokenizer, 0: none (the whole text one word) */
    tok_addset raw, normed;
    tok_added *added; /* all, as the file lists them (the sets point into own copies) */
    size_t n_added;
    /* post-processor: ids before and after the text */
    int32_t pre_ids[8], post_ids[8];
    int n_pre, n_post;
    char special_names[5][64]; /* pad unk cls sep mask */
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
