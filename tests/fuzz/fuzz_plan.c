/* fuzz_plan: a plan file (dm_plan_load, src/plan/planfile.c, through
 * dm_analysis_load_plan) for a small layer: batch 2, seq 8, hidden 16, heads 2, ffn 32
 * (the seed corpus's plans are `dmove tune` outputs for it). The fuzzing build skips the
 * checksum comparison (DM_FUZZING_BUILD), so edited plans reach the checks behind it. */
#include "dmove_tools.h"
#include "fuzz_util.h"

static dm_analysis *fresh(void) {
    static dm_device_model *dev;
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 2, cfg.seq = 8, cfg.hidden = 16, cfg.heads = 2, cfg.ffn = 32;
    dm_analysis *a = NULL;
    if ((!dev && dm_device_model_preset(&dev, "h100") != DM_OK) || dm_analysis_new(&a, &cfg, dev, 4, 0) != DM_OK) {
        fprintf(stderr, "fuzz_plan: %s\n", dm_last_error());
        abort();
    }
    return a;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static dm_analysis *a;
    if (!a) a = fresh();
    const char *path = fuzz_file(data, size, "plan.json");
    if (dm_analysis_load_plan(a, path) != DM_OK) return fuzz_rejected(); /* a failed load leaves a as it was */
    char *text = NULL;
    if (dm_analysis_plan_text(a, &text) == DM_OK) free(text);
    dm_analysis_free(a); /* one plan an analysis */
    a = fresh();
    return 0;
}
