/* fuzz_checkpoint: the checkpoint loaders (src/train/ckpt.c) on a one-layer trainer set
 * up as `dmove train --layers 1 --batch 1 --seq 2 --hidden 8 --heads 2 --ffn 16` sets up
 * its own (the seed corpus's checkpoints come from that command): the first byte picks dm_trainer_load (a
 * checkpoint: even) or dm_trainer_load_params (a model's parameters: odd); the rest is
 * the file. The fuzzing build skips the checksum comparison (DM_FUZZING_BUILD), so edited
 * checkpoints reach the checks behind it. */
#include "dmove.h"
#include "fuzz_util.h"

static dm_trainer *trainer(void) {
    static dm_trainer *T;
    if (T) return T;
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 1, cfg.seq = 2, cfg.hidden = 8, cfg.heads = 2, cfg.ffn = 16;
    dm_optim_config o;
    dm_optim_config_default(&o);
    if (dm_trainer_new(&T, &cfg, 1, NULL, &o) != DM_OK || dm_trainer_set_run_tag(T, "teacher scale 5") != DM_OK) {
        fprintf(stderr, "fuzz_checkpoint: %s\n", dm_last_error());
        abort();
    }
    return T;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    dm_trainer *T = trainer();
    const char *path = fuzz_file(data + 1, size - 1, "run.ckpt");
    const dm_status st = data[0] & 1 ? dm_trainer_load_params(T, path) : dm_trainer_load(T, path);
    return st == DM_OK ? 0 : fuzz_rejected();
}
