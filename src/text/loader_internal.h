/* loader_internal.h: the loader's pieces (loader.c: opening, the background thread;
 * loader_seq.c: the corpus view, the sequence sets, building and masking a batch). */
#ifndef DM_TEXT_LOADER_INTERNAL_H
#define DM_TEXT_LOADER_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dmove_data.h"

/* The shards as one stream of documents, sentences and tokens. */
typedef struct {
    dm_shard **shards;
    size_t nshards;
    uint64_t *shard_tok;  /* (nshards + 1) the first global token of each shard */
    uint64_t docs, sents, toks;
    uint64_t *doc_sent;   /* (docs + 1) the first global sentence of each document */
    uint64_t *sent_tok;   /* (sents + 1) the first global token of each sentence */
} dm_corpus;

/* What the batches are made of: the corpus, the sequences of an epoch, the settings. */
typedef struct {
    dm_corpus c;
    dm_loader_config cfg;
    dm_vocab_info vocab;
    int64_t nseq;        /* sequences an epoch */
    uint64_t *bounds;    /* (nseq + 1) packed: token bounds; pairs: sentence bounds (chunks) */
    int32_t *plain;      /* the ids a random replacement draws from (no special) */
    int32_t nplain;
    uint32_t thr_select, thr_mask, thr_random; /* Philox word thresholds */
    int feistel_half;    /* the shuffle's half-width in bits */
} dm_seqset;

/* Builds the corpus view of opened shards (takes them over: freed by dm_corpus_free). */
dm_status dm_corpus_init(dm_corpus *c, dm_shard **shards, size_t n);
void dm_corpus_free(dm_corpus *c);
/* The sequences of cfg->mode over the corpus; checks cfg and vocab against the data. */
dm_status dm_seqset_init(dm_seqset *s, const dm_loader_config *cfg, const dm_vocab_info *vocab);
void dm_seqset_free(dm_seqset *s);
/* Batch `step` into b (sized cfg.batch x cfg.seq); step checked by the caller. */
void dm_seqset_build(const dm_seqset *s, int64_t step, dm_batch *b);

#endif
