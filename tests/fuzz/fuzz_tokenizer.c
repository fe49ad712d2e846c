/* fuzz_tokenizer: the tokenizer files (dm_tokenizer_load, src/text/tok_load.c): the first
 * byte picks the form (bit 0 clear: tokenizer.json; set: vocab.txt, bit 1 its casing); the
 * rest is the file. A tokenizer it accepts encodes and decodes a little text. */
#include "dmove_text.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const int txt = data[0] & 1;
    const dm_case casing = !txt ? DM_CASE_FILE : (data[0] & 2) ? DM_CASE_LOWER : DM_CASE_CASED;
    const char *path = fuzz_file(data + 1, size - 1, txt ? "vocab.txt" : "tokenizer.json");
    dm_tokenizer *t = NULL;
    if (dm_tokenizer_load(&t, path, casing) != DM_OK) return fuzz_rejected();
    static const char text[] = "Hello, world! Unaffable caf\xc3\xa9 [MASK] \xe4\xb8\xad\xe6\x96\x87 x\t\x01y";
    dm_ids ids = {0};
    (void)dm_tokenizer_encode(t, text, sizeof text - 1, 1, &ids, NULL);
    dm_ids_free(&ids);
    dm_special_ids sp;
    (void)dm_tokenizer_specials(t, &sp);
    (void)dm_tokenizer_describe(t);
    (void)dm_tokenizer_hash(t);
    const int32_t n = dm_tokenizer_vocab_size(t);
    (void)dm_tokenizer_token(t, n - 1);
    (void)dm_tokenizer_token(t, n);
    (void)dm_tokenizer_token_id(t, "[UNK]");
    dm_tokenizer_free(t);
    return 0;
}
