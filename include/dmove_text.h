/* dmove_text.h: text in. A WordPiece tokenizer that gives the ids Hugging Face's
 * BertTokenizerFast gives (from a tokenizer.json or a vocab.txt), the token shards
 * `dmove prepare` writes, and the loader that makes masked-language-model batches of them.
 * The conventions of dmove_tools.h hold: opaque handles, every fallible function returns
 * dm_status and leaves its message in dm_last_error(), nothing exits, NULL arguments are
 * refused (DM_ERR_INVALID_ARG), every *_free takes NULL. */
#ifndef DMOVE_TEXT_H
#define DMOVE_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "dmove.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- The tokenizer ---------------------------------------------------------------------- */

typedef struct dm_tokenizer dm_tokenizer;

/* How a vocab.txt is normalized (a tokenizer.json says so itself and takes DM_CASE_FILE). */
typedef enum {
    DM_CASE_FILE = 0,  /* tokenizer.json: as the file configures; vocab.txt: refused */
    DM_CASE_LOWER,     /* vocab.txt: BertTokenizerFast(do_lower_case=True) */
    DM_CASE_CASED      /* vocab.txt: BertTokenizerFast(do_lower_case=False) */
} dm_case;

/* Loads `path`: a Hugging Face tokenizer.json whose model is WordPiece (another model type
 * is refused, naming what is supported), or a vocab.txt (one token per line, its line
 * number the id). The file is validated whole (JSON, duplicate tokens and ids, ids in
 * 0 .. size-1 without holes, special tokens present). `path` may also be a model
 * directory: its tokenizer.json, or else (or with a casing given) its vocab.txt, cased as
 * asked or, with DM_CASE_FILE, as its tokenizer_config.json's do_lower_case says. A
 * directory's tokenizer.json is read as transformers' AutoTokenizer (5.x) reads the
 * directory: where that makes a BertTokenizer (tokenizer_config.json's tokenizer_class, or
 * none there and config.json's model_type "bert"), the file gives the vocabulary and added
 * tokens, and the rest is a vocab.txt's, lowercased, accents stripped and Chinese
 * characters split as tokenizer_config.json's do_lower_case (default true), strip_accents
 * and tokenize_chinese_chars (default true) say; the file named itself is taken as it is
 * (as tokenizers' Tokenizer.from_file). */
dm_status dm_tokenizer_load(dm_tokenizer **out, const char *path, dm_case casing);
void dm_tokenizer_free(dm_tokenizer *t);

int32_t dm_tokenizer_vocab_size(const dm_tokenizer *t);           /* NULL t: 0 */
/* A 64-bit hash of what decides the ids: the vocabulary (tokens in id order) and the
 * normalization settings. Shards record it; the loader refuses another one. */
uint64_t dm_tokenizer_hash(const dm_tokenizer *t);                  /* NULL t: 0 */
/* The id of `token` (exactly, no normalization), or -1. */
int32_t dm_tokenizer_token_id(const dm_tokenizer *t, const char *token);
/* The text of id `id` (e.g. "##ing"), or NULL when out of range; lives as long as t. */
const char *dm_tokenizer_token(const dm_tokenizer *t, int32_t id);
/* Whether the tokenizer lowercases text (its normalizer's lowercase, a vocab.txt's
 * do_lower_case). */
int dm_tokenizer_lowercases(const dm_tokenizer *t);
/* Writes t as transformers saves a tokenizer, so that AutoTokenizer.from_pretrained(dir)
 * gives the ids dm_tokenizer_encode gives (dir existing; each file atomically, the one that
 * names the class last). Where BertTokenizer can be t (a cleaning BERT normalizer and
 * pre-tokenizer, 100 characters a word, "##", [CLS] and [SEP] around a text, every token a
 * line): dir/vocab.txt and dir/tokenizer_config.json (tokenizer_class BertTokenizer,
 * do_lower_case, strip_accents, tokenize_chinese_chars, the special tokens, every added
 * token in added_tokens_decoder, model_max_length when > 0). Otherwise, where t was read
 * from a tokenizer.json as it is: that file, as read, and a tokenizer_config.json of
 * tokenizer_class PreTrainedTokenizerFast; *json_form (may be NULL) says which. Neither
 * (DM_ERR_UNSUPPORTED, saying why), or dir holding files transformers would read instead
 * of these or beside them (tokenizer.json for the first form, special_tokens_map.json,
 * added_tokens.json: DM_ERR_INVALID_ARG, naming it), is refused before anything is
 * written; dm_tokenizer_check_save says so without writing. */
dm_status dm_tokenizer_save(const dm_tokenizer *t, const char *dir, int64_t model_max_length, int *json_form);
dm_status dm_tokenizer_check_save(const dm_tokenizer *t, const char *dir, int *json_form);
/* One line on the configuration, e.g. "WordPiece, 30522 tokens, lowercase, strip accents,
 * Chinese characters split, control characters cleaned, max 100 chars a word". */
const char *dm_tokenizer_describe(const dm_tokenizer *t);          /* NULL t: "" */

/* The special tokens' ids. dm_tokenizer_specials fails (DM_ERR_NOT_FOUND) naming the ones
 * the file lacks of [PAD] [UNK] [CLS] [SEP] [MASK] (neither in its vocabulary nor in a
 * tokenizer.json's added_tokens; *out still gets the ids BertTokenizerFast gives them:
 * new ones past the file's). */
typedef struct {
    int32_t pad, unk, cls, sep, mask;
} dm_special_ids;
dm_status dm_tokenizer_specials(const dm_tokenizer *t, dm_special_ids *out);

/* A growable list of ids; zero-initialise it, dm_ids_free it. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} dm_ids;
void dm_ids_free(dm_ids *ids);

/* Encodes `len` bytes of UTF-8 text as BertTokenizerFast does (added tokens matched
 * first, then normalizer, pre-tokenizer, WordPiece) and APPENDS the ids to *out (add_special
 * 1: "[CLS] ... [SEP]" around them, as BertTokenizerFast's post-processor does, whatever
 * the file's says). Invalid UTF-8
 * is refused with DM_ERR_FORMAT, naming the byte offset in `text`; *bad_offset (may be
 * NULL) gets it, else (size_t)-1. Thread-safe on one tokenizer. */
dm_status dm_tokenizer_encode(const dm_tokenizer *t, const char *text, size_t len,
                              int add_special, dm_ids *out, size_t *bad_offset);
/* Encodes `count` texts on `threads` threads (0: all cores); out[k] gets text k's ids
 * (appended, as above). On invalid UTF-8: DM_ERR_FORMAT naming the first text and offset;
 * *bad_index and *bad_offset (may be NULL) get them. */
dm_status dm_tokenizer_encode_batch(const dm_tokenizer *t, const char *const *texts,
                                    const size_t *lens, size_t count, int add_special,
                                    int threads, dm_ids *out, size_t *bad_index,
                                    size_t *bad_offset);
/* The ids as text, WordPiece's way: tokens joined by spaces, "##" continuations glued to
 * the token before, each token cleaned as the WordPiece decoder does (" ," -> ",", " ." ->
 * ".", ...): BertTokenizerFast.decode with clean_up_tokenization_spaces=False; specials
 * kept. The caller free()s *text. */
dm_status dm_tokenizer_decode(const dm_tokenizer *t, const int32_t *ids, size_t n,
                              char **text);

/* How many tokens of a pair of texts (la and lb tokens) fit a room of `room` tokens (the
 * sequence less its special tokens), cut as transformers' truncation "longest_first" cuts
 * (tokenizers' rule): only the longer text while the shorter fits in half; else each keeps
 * half, the odd token going to the one that was longer (to b when they were equal). A
 * single text: lb 0. */
void dm_truncate_pair(int64_t la, int64_t lb, int64_t room, int64_t *keep_a, int64_t *keep_b);

/* The first byte offset at which `s` is not valid UTF-8 (overlong forms, surrogates and
 * code points past U+10FFFF are invalid), or len when it is all valid. */
size_t dm_utf8_invalid_at(const char *s, size_t len);

#ifdef __cplusplus
}
#endif

#endif
