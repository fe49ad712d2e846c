/* fuzz_profile: the CPU profile (dm_profile_load, src/analysis/device.c) and the device
 * model made from what it accepts, at every thread count. */
#include "analysis/device.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size, "cpu-profile.json");
    dm_cpu_profile p;
    if (dm_profile_load(path, &p) != DM_OK) return fuzz_rejected();
    dm_device dev;
    for (int t = 0; t <= p.threads + 1 && t <= 300; t++)
        if (dm_device_from_profile(&p, t, &dev) == DM_OK) {
            (void)dm_device_contract_peak(&dev, 4);
            (void)dm_device_vector_peak(&dev, 2);
        }
    return 0;
}
