/* fuzz_shard: a token shard (dm_shard_open, src/text/shard.c) and its accessors on what
 * it accepts: documents, sentences and ids, first and last. */
#include "dmove_data.h"
#include "fuzz_util.h"

static void probe(const dm_shard *s) {
    dm_shard_info in;
    if (dm_shard_get_info(s, &in) != DM_OK) return;
    uint64_t first, count;
    int32_t ids[64];
    const uint64_t docs[3] = {0, in.documents ? in.documents - 1 : 0, in.documents};
    for (int k = 0; k < 3; k++)
        if (dm_shard_document(s, docs[k], &first, &count) == DM_OK) {
            size_t n = count < 64 ? (size_t)count : 64;
            (void)dm_shard_ids(s, first, n, ids);
        }
    const uint64_t sents[3] = {0, in.sentences ? in.sentences - 1 : 0, in.sentences};
    for (int k = 0; k < 3; k++)
        if (dm_shard_sentence(s, sents[k], &first, &count) == DM_OK) {
            size_t n = count < 64 ? (size_t)count : 64;
            (void)dm_shard_ids(s, first, n, ids);
        }
    if (in.tokens) (void)dm_shard_ids(s, in.tokens - 1, 1, ids);
    (void)dm_shard_ids(s, in.tokens, 1, ids); /* past the end: refused */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, "shard.bin");
    dm_shard *s = NULL;
    if (dm_shard_open(&s, path, 0) != DM_OK) return fuzz_rejected();
    probe(s);
    dm_shard_free(s);
    return 0;
}
