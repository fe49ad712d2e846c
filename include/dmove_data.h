/* dmove_data.h: from token ids to training batches. Token shards (the files `dmove prepare`
 * writes), datasets (a directory of shards and a manifest), and the loader that makes
 * masked-language-model batches of them on a background thread. The conventions of
 * dmove_tools.h hold: opaque handles, every fallible function returns dm_status and leaves
 * its message in dm_last_error(), nothing exits, NULL arguments are refused
 * (DM_ERR_INVALID_ARG), every *_free takes NULL.
 *
 * Text model (BERT's): a line of text is a sentence; a document is a file (--doc-per-file)
 * or a block of lines between blank lines. Both boundaries are kept, so pair mode can pick
 * sentences and packing can put [SEP] between documents.
 *
 * SHARD FORMAT (version 1; every integer little-endian; a file's length is a multiple of 8)
 *   offset  size  field
 *        0     8  magic "DMSHARD\0"
 *        8     4  version (1)
 *       12     4  header size in bytes (128)
 *       16     4  id width in bytes: 2 when vocab_size <= 65536 (ids 0 .. 65535), else 4
 *       20     4  flags (0)
 *       24     8  vocabulary hash (dm_tokenizer_hash of the tokenizer that made the ids)
 *       32     4  vocab_size (every id is below it)
 *       36     4  [UNK]'s id (what the unknown count counts; -1 none)
 *       40     8  documents D
 *       48     8  sentences S
 *       56     8  tokens T
 *       64     8  unknown tokens (ids equal to [UNK]'s)
 *       72     8  offset of the document table  (= 128)
 *       80     8  offset of the sentence table  (= 128 + 8 (D + 1))
 *       88     8  offset of the ids             (= that + 8 (S + 1))
 *       96     8  file size F in bytes (ids padded with zeros to a multiple of 8, + 8)
 *      104    24  zero
 *      128        document table: D + 1 u64, the first sentence of each document; [0] = 0,
 *                 [D] = S, strictly increasing (no empty document)
 *                 sentence table: S + 1 u64, the first token of each sentence; [0] = 0,
 *                 [S] = T, strictly increasing (no empty sentence)
 *                 ids: T ids of the id width (u16 or u32), zero padding to a multiple of 8
 *    F - 8     8  checksum: dm_data_hash64 of bytes [0, F - 8)
 * A reader checks all of it (magic, version, sizes against the file's length, the tables,
 * every id < vocab_size, the unknown count, the checksum) and refuses the file naming it
 * and what is wrong; the loader also refuses a vocabulary hash other than the model's.
 *
 * DATASET: a directory with dataset.json (the manifest: format "dmove-dataset", version 1,
 * the tokenizer's hash as 16 hex digits, its description and vocab_size, the settings
 * prepare used, totals, and per split the shard files with their counts), the training
 * shards train-00000.shard, train-00001.shard, ... (a new one begins after a document once
 * one passes --shard-mb) and valid.shard (the held-out documents; present, maybe empty,
 * when --valid-fraction > 0: document n, counted from 0 over all files in order, is held
 * out when word n of dm_philox_words(seed, 0x76616c69, ...) is below floor(F 2^32)). `dmove prepare` writes it into a temporary directory beside
 * the target and renames it at the end: on any error nothing is left.
 *
 * SEQUENCES (length j, every one [CLS] first, [SEP] last, [PAD] after):
 *   packing (the default; RoBERTa's FULL-SENTENCES): consecutive sentences as they come,
 *     across documents with a [SEP] between documents, up to j - 2 tokens: a sentence that
 *     does not fit starts the next sequence; one longer than j - 2 is split in pieces.
 *     Segment ids all 0. Needs j >= 3.
 *   pairs: [CLS] A [SEP] B [SEP] (segment 0 up to the first [SEP], 1 after). A document's
 *     sentences are grouped in chunks of up to j - 3 tokens; each epoch a chunk is split at
 *     a random sentence (a single sentence at a random token) into A and B. With nsp, B is
 *     replaced half of the time by sentences from a random other document (needs >= 2
 *     documents) and nsp_labels says which (Hugging Face's convention: 0 B follows A, 1 B
 *     is random). The pair is cut to j - 3 tokens as BERT does (tokens go from the longer
 *     side, then from both in turn; each from the front or the back by a coin). Needs j >= 5.
 *   Each epoch visits every sequence once in a shuffled order (a keyed Feistel permutation
 *   of the sequence indices); batch k holds the sequences at positions k b .. k b + b - 1
 *   of the endless stream epoch 0, epoch 1, ...
 *
 * MASKING (BERT's 80/10/10): each token other than [PAD] [UNK] [CLS] [SEP] [MASK] is chosen
 * with probability mask_prob; a chosen one becomes [MASK] (mask_token_prob), a random id
 * that is not one of those five (random_token_prob), or stays. labels: the original id at
 * chosen positions, -100 elsewhere.
 *
 * RANDOMNESS: every draw is Philox-4x32-10 keyed by the seed (key = seed's low and high
 * words), counter (sequence index low, high, epoch, purpose << 24 | block): purpose 1
 * masking (block t: word 0 chooses, word 1 the 80/10/10 kind, word 2 the random id, of
 * position t), purpose 2 the pair structure (words drawn in order from block 0: the NSP
 * coin, the split, the random document and sentence, then the cut's coins, 32 a word: A's,
 * B's), purpose 3 the shuffle: position p of epoch e is a 6-round Feistel network over [0,
 * 4^h) (h >= 1 the least with 4^h >= N, the sequences an epoch), round r mapping (L, R) to
 * (R, L ^ F) with F words 1:0 of the block at counter (R low, R high, e, 3 << 24 | r) cut
 * to h bits, applied again until the result is below N. So batch k of a run is a pure
 * function of (data, config, k): a run resumed at step k (dm_loader_seek, or start_step)
 * sees exactly the batches an uninterrupted one does. */
#ifndef DMOVE_DATA_H
#define DMOVE_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dmove.h"
#include "dmove_text.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The 64-bit checksum of the shard files (a 4-lane multiply-rotate hash over 8-byte
 * little-endian words, the tail zero-padded, the length mixed in; src/text/shard.c). */
uint64_t dm_data_hash64(const void *data, size_t len);

/* What the ids were made with: all a shard and the loader need to know of a tokenizer. */
typedef struct {
    uint64_t hash;        /* dm_tokenizer_hash */
    int32_t vocab_size;
    dm_special_ids special;
} dm_vocab_info;
/* From a tokenizer: fails naming the special tokens its vocabulary lacks (also those the
 * tokenizer added with new ids, as BertTokenizerFast does, for want of them in the file). */
dm_status dm_vocab_info_from(const dm_tokenizer *t, dm_vocab_info *out);

/* The counts of a shard, a split or a dataset. */
typedef struct {
    uint64_t documents, sentences, tokens, unknown;
    uint64_t bytes;      /* file bytes */
    int id_bytes;        /* 2 or 4 (shards) */
    uint64_t vocab_hash;
    int32_t vocab_size;
    uint64_t checksum;   /* a shard's stored checksum, its content's fingerprint (shards) */
} dm_shard_info;

/* --- Writing shards ------------------------------------------------------------------- */

typedef struct dm_shard_writer dm_shard_writer;
/* The vocabulary's hash, size and [UNK] id go in the header. */
dm_status dm_shard_writer_new(dm_shard_writer **out, const dm_vocab_info *vocab);
void dm_shard_writer_free(dm_shard_writer *w);
/* Appends a sentence of n >= 1 ids (each in 0 .. vocab_size - 1) to the open document. */
dm_status dm_shard_writer_add_sentence(dm_shard_writer *w, const int32_t *ids, size_t n);
/* Closes the open document (nothing when it has no sentence). */
dm_status dm_shard_writer_end_document(dm_shard_writer *w);
/* The counts so far (the open document's sentences included), bytes: the file's size if
 * written now (the open document closed). */
dm_status dm_shard_writer_info(const dm_shard_writer *w, dm_shard_info *out);
/* Closes the open document, writes the shard to `path` atomically and empties the writer
 * for the next shard. */
dm_status dm_shard_writer_write(dm_shard_writer *w, const char *path);

/* --- Reading shards ------------------------------------------------------------------- */

typedef struct dm_shard dm_shard;
/* Maps `path` and validates it whole (see SHARD FORMAT); expect_hash != 0: a shard of
 * another vocabulary is refused. */
dm_status dm_shard_open(dm_shard **out, const char *path, uint64_t expect_hash);
void dm_shard_free(dm_shard *s);
dm_status dm_shard_get_info(const dm_shard *s, dm_shard_info *out);
/* Document d's sentences [*first, *first + *count). */
dm_status dm_shard_document(const dm_shard *s, uint64_t d, uint64_t *first, uint64_t *count);
/* Sentence k's tokens [*first, *first + *count). */
dm_status dm_shard_sentence(const dm_shard *s, uint64_t k, uint64_t *first, uint64_t *count);
/* Ids [first, first + n) as int32. */
dm_status dm_shard_ids(const dm_shard *s, uint64_t first, size_t n, int32_t *out);

/* --- Datasets and `dmove prepare` ----------------------------------------------------- */

typedef struct dm_dataset dm_dataset;
/* Reads and checks DIR/dataset.json (the shards themselves are checked when opened). */
dm_status dm_dataset_open(dm_dataset **out, const char *dir);
void dm_dataset_free(dm_dataset *d);
uint64_t dm_dataset_vocab_hash(const dm_dataset *d);          /* NULL d: 0 */
const char *dm_dataset_tokenizer(const dm_dataset *d);        /* its description; NULL d: "" */
/* split "train" or "valid": its number of shards (0 for an unknown split) and their paths
 * (NULL out of range; live as long as d), and its counts. */
size_t dm_dataset_shard_count(const dm_dataset *d, const char *split);
const char *dm_dataset_shard_path(const dm_dataset *d, const char *split, size_t k);
dm_status dm_dataset_split_info(const dm_dataset *d, const char *split, dm_shard_info *out);

/* Where `dmove prepare` is, for a progress bar. */
typedef struct {
    uint64_t bytes_done, bytes_total;
    size_t file, files;          /* the file being read (0-based) of how many */
    uint64_t documents, sentences, tokens, unknown;
    double seconds;
} dm_prepare_progress;

typedef struct {
    double valid_fraction;   /* documents held out to valid.shard, 0 .. 0.5 */
    int doc_per_file;        /* 1: a file is a document (blank lines ignored) */
    uint64_t shard_bytes;    /* a new training shard after this many bytes (0: 128 MiB) */
    int threads;             /* encoding threads (0: all cores) */
    uint64_t seed;           /* which documents are held out */
    int force;               /* replace an existing dataset directory */
    const char *tokenizer_path; /* recorded in the manifest (may be NULL) */
    /* called every few MB and at the end (may be NULL) */
    void (*progress)(void *ctx, const dm_prepare_progress *p);
    void *progress_ctx;
} dm_prepare_config;
void dm_prepare_config_default(dm_prepare_config *c);

typedef struct {
    size_t files;
    uint64_t bytes;
    dm_shard_info train, valid;   /* bytes: of the shards */
    size_t train_shards;
    int has_valid;
    double seconds;
} dm_prepare_stats;

/* Tokenizes `files` (UTF-8 text, a sentence a line) without special tokens and writes the
 * dataset directory `out_dir`. Refused, with nothing written: a tokenizer without the five
 * special tokens, a file that is missing, a directory or unreadable, invalid UTF-8 (file
 * and byte offset named), a corpus without a single token, an existing out_dir that is not
 * empty (unless force and it holds a dataset.json). stats may be NULL. */
dm_status dm_prepare(const dm_tokenizer *t, const char *const *files, size_t nfiles,
                     const char *out_dir, const dm_prepare_config *cfg, dm_prepare_stats *stats);

/* --- The masked-LM batch loader ------------------------------------------------------- */

typedef enum { DM_SEQ_PACKED = 0, DM_SEQ_PAIRS = 1 } dm_seq_mode;

typedef struct {
    int64_t batch, seq;          /* b sequences of j tokens */
    uint64_t seed;
    dm_seq_mode mode;
    int nsp;                     /* pairs: a random B half of the time, nsp_labels */
    int shuffle;                 /* 1 (default): a new order each epoch; 0: in file order */
    double mask_prob;            /* 0.15 */
    double mask_token_prob;      /* 0.8: of the chosen, -> [MASK] */
    double random_token_prob;    /* 0.1: of the chosen, -> a random token (the rest stay) */
    int prefetch;                /* batches kept ready by the background thread (0: none,
                                  * next() builds the batch itself); default 4 */
    int64_t start_step;          /* the first batch next() gives */
    /* data parallelism: batch k of this loader is part `part` (0 .. parts - 1) of global
     * batch k of batch * parts sequences (its sequences part * batch .. (part + 1) * batch
     * - 1), the same sequences and masks a loader of batch * parts gives there; parts 0
     * or 1: the whole batch */
    int part, parts;
} dm_loader_config;
void dm_loader_config_default(dm_loader_config *c);

/* A batch: (b, j) int32 arrays, row-major. */
typedef struct {
    int64_t batch, seq;
    int64_t step;               /* k */
    int32_t *input_ids;         /* [PAD]-padded, masked */
    int32_t *token_type_ids;    /* 0, or 1 for pairs' B and its [SEP] */
    int32_t *attention_mask;    /* 1 real token, 0 [PAD] */
    int32_t *labels;            /* original id where chosen for masking, else -100 */
    int32_t *nsp_labels;        /* (b): 0 B follows A, 1 random B; -100 without nsp */
    int64_t *sequence;          /* (b): which sequence (index in the epoch's set) */
    int64_t *epoch;             /* (b): and of which epoch */
    int64_t tokens, masked;     /* real tokens, chosen positions */
} dm_batch;

typedef struct dm_loader dm_loader;
/* A dataset directory's split ("train", "valid"); vocab: the model's tokenizer (a dataset
 * or shard of another vocabulary hash is refused). */
dm_status dm_loader_open(dm_loader **out, const char *dir, const char *split,
                         const dm_vocab_info *vocab, const dm_loader_config *cfg);
/* The same from a list of shard files. */
dm_status dm_loader_open_shards(dm_loader **out, const char *const *paths, size_t n,
                                const dm_vocab_info *vocab, const dm_loader_config *cfg);
void dm_loader_free(dm_loader *l);
/* The next batch; *out stays valid (and unchanged) until the next call of next, seek or
 * free. */
dm_status dm_loader_next(dm_loader *l, const dm_batch **out);
/* The next batch next() gives is batch `step`. */
dm_status dm_loader_seek(dm_loader *l, int64_t step);
/* Builds batch `step` into `out` (from dm_batch_alloc with the loader's sizes) on the
 * caller's thread, leaving the loader's position alone. */
dm_status dm_loader_batch_at(const dm_loader *l, int64_t step, dm_batch *out);
int64_t dm_loader_sequences(const dm_loader *l);   /* sequences an epoch; NULL l: 0 */
/* The fingerprint of the loader's shards, their checksums in order: two loaders over the
 * same token data (wherever its files are) have the same; NULL l: 0. */
uint64_t dm_loader_fingerprint(const dm_loader *l);
/* Seconds next() spent waiting for a batch (with prefetch 0: building it), and calls. */
double dm_loader_wait_seconds(const dm_loader *l);  /* NULL l: 0 */
int64_t dm_loader_batches(const dm_loader *l);       /* next() calls; NULL l: 0 */

dm_status dm_batch_alloc(dm_batch *b, int64_t batch, int64_t seq);
void dm_batch_free(dm_batch *b);

#ifdef __cplusplus
}
#endif

#endif
