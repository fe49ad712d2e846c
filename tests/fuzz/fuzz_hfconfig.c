/* fuzz_hfconfig: a Hugging Face config.json (dm_hf_config_read, src/train/hfconfig.c)
 * and the layer configuration made from what it accepts. */
#include "dmove_tools.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, "config.json");
    dm_hf_config c;
    if (dm_hf_config_read(path, &c) != DM_OK) return fuzz_rejected();
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    (void)dm_hf_config_layer(&c, &cfg);
    return 0;
}
