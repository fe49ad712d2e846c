/* fuzz_dataset: a dataset directory's manifest, dataset.json (dm_dataset_open,
 * src/text/dataset.c), and the accessors on what it accepts. */
#include "dmove_data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    (void)fuzz_file(data, size, "dataset.json");
    dm_dataset *d = NULL;
    if (dm_dataset_open(&d, fuzz_dir()) != DM_OK) return fuzz_rejected();
    (void)dm_dataset_vocab_hash(d);
    (void)dm_dataset_tokenizer(d);
    const char *splits[3] = {"train", "valid", "test"};
    for (int k = 0; k < 3; k++) {
        const size_t n = dm_dataset_shard_count(d, splits[k]);
        for (size_t i = 0; i <= n && i < 4; i++) (void)dm_dataset_shard_path(d, splits[k], i);
        dm_shard_info in;
        (void)dm_dataset_split_info(d, splits[k], &in);
    }
    dm_dataset_free(d);
    return 0;
}
