// bench/dump_batches.c: the masked-LM batches `dmove pretrain` trains and evaluates on,
// written raw for a peer (bench/peers/*.py) to read, so PyTorch trains on the very same
// batches: the loader of a dataset split with pretrain's settings (packed sentences; the
// held-out split's seed is seed ^ 0x5eed and its batches 0 .. E-1, as cli/cmd_pretrain.c
// opens it), batches START .. START+COUNT-1 built by dm_loader_batch_at.
//
// Output (little-endian): "DMB1", int64 count, batch, seq, then per batch four int32
// (batch x seq) arrays: input_ids, token_type_ids, attention_mask, labels (-100: not
// chosen). The peer keeps the first PREDICTIONS chosen positions of a batch (row-major), as
// dmove's trainer scores them (src/train/model.c, batch_head).
//
// Build: cc -O2 -Iinclude bench/dump_batches.c build-cpu/libdmove.a -o build-cpu/dump_batches
//   -fopenmp $(pkg-config --libs openblas) -lcjson -lm     (bench/pretrain_race.sh does it)
// Usage: dump_batches DATA TOKENIZER SPLIT SEED BATCH SEQ START COUNT OUT [MASK_PROB]
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dmove.h"
#include "dmove_data.h"
#include "dmove_text.h"

static int die(const char *what) {
    fprintf(stderr, "dump_batches: %s: %s\n", what, dm_last_error());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 10) {
        fprintf(stderr, "usage: dump_batches DATA TOKENIZER SPLIT SEED BATCH SEQ START COUNT OUT [MASK_PROB]\n");
        return 2;
    }
    const char *data = argv[1], *tokp = argv[2], *split = argv[3], *out = argv[9];
    uint64_t seed = strtoull(argv[4], NULL, 10);
    int64_t batch = strtoll(argv[5], NULL, 10), seq = strtoll(argv[6], NULL, 10);
    int64_t start = strtoll(argv[7], NULL, 10), count = strtoll(argv[8], NULL, 10);
    if (batch < 1 || seq < 3 || start < 0 || count < 1) {
        fprintf(stderr, "dump_batches: bad sizes\n");
        return 2;
    }
    dm_tokenizer *t = NULL;
    const size_t n = strlen(tokp);
    dm_case cs = n > 4 && !strcmp(tokp + n - 4, ".txt") ? DM_CASE_LOWER : DM_CASE_FILE;
    if (dm_tokenizer_load(&t, tokp, cs) != DM_OK) return die(tokp);
    dm_vocab_info v;
    if (dm_vocab_info_from(t, &v) != DM_OK) return die("vocabulary");
    dm_loader_config lc;
    dm_loader_config_default(&lc);
    lc.batch = batch, lc.seq = seq, lc.mode = DM_SEQ_PACKED, lc.prefetch = 0;
    lc.seed = strcmp(split, "valid") ? seed : seed ^ 0x5eedull;
    if (argc > 10) lc.mask_prob = strtod(argv[10], NULL);
    dm_loader *l = NULL;
    if (dm_loader_open(&l, data, split, &v, &lc) != DM_OK) return die(data);
    dm_batch b;
    if (dm_batch_alloc(&b, batch, seq) != DM_OK) return die("alloc");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        perror(tmp);
        return 1;
    }
    int64_t head[3] = {count, batch, seq};
    int ok = fwrite("DMB1", 1, 4, f) == 4 && fwrite(head, sizeof head, 1, f) == 1;
    const size_t nb = (size_t)(batch * seq);
    for (int64_t k = 0; ok && k < count; k++) {
        if (dm_loader_batch_at(l, start + k, &b) != DM_OK) return die("batch");
        const int32_t *arr[4] = {b.input_ids, b.token_type_ids, b.attention_mask, b.labels};
        for (int a = 0; a < 4 && ok; a++) ok = fwrite(arr[a], sizeof(int32_t), nb, f) == nb;
    }
    if (fclose(f) != 0 || !ok || rename(tmp, out) != 0) {
        perror(out);
        remove(tmp);
        return 1;
    }
    dm_batch_free(&b);
    dm_loader_free(l);
    dm_tokenizer_free(t);
    return 0;
}
