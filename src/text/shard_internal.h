/* shard_internal.h: what the shard reader shares with the dataset and loader code of
 * src/text/ (shard.c). */
#ifndef DM_TEXT_SHARD_INTERNAL_H
#define DM_TEXT_SHARD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "dmove_data.h"

#define DM_SHARD_MAGIC "DMSHARD\0"
enum { DM_SHARD_VERSION = 1, DM_SHARD_HEADER = 128 };

/* 2 when every id of a vocabulary of vocab_size fits 16 bits, else 4. */
int dm_shard_id_bytes(int32_t vocab_size);
/* Ids [first, first + n) as int32, unchecked (the caller keeps in range). */
void dm_shard_copy_ids(const dm_shard *s, uint64_t first, size_t n, int32_t *out);
/* Entry k of the document table (sentences 0) or the sentence table (1), unchecked. */
uint64_t dm_shard_table(const dm_shard *s, int sentences, uint64_t k);

#endif
