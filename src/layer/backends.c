/* backends.c: the registry of the backends built: the Makefile lists them as
 * -DDM_BACKEND_LIST='X(cpu) X(cuda)' (a backend is a folder defining
 * `const dm_backend dm_backend_<name>` and its line in the Makefile); a device asked for
 * whose backend was not built says how to build it. */
#include "layer/backends.h"

#include "core/status.h"

#ifndef DM_BACKEND_LIST
#define DM_BACKEND_LIST X(cpu)
#endif

#define X(name) extern const dm_backend dm_backend_##name;
DM_BACKEND_LIST
#undef X

static const dm_backend *const built[] = {
#define X(name) &dm_backend_##name,
    DM_BACKEND_LIST
#undef X
};

/* What to install for a backend a build may leave out. */
static const struct {
    dm_device_kind device;
    const char *what, *how;
} missing[] = {
    {DM_DEVICE_CUDA, "CUDA", "install the CUDA toolkit (nvcc) and rebuild"},
};

const dm_backend *dm_backend_get(dm_device_kind d) {
    for (size_t k = 0; k < sizeof built / sizeof built[0]; k++)
        if (built[k]->device == d) return built[k];
    return NULL;
}

const dm_backend *dm_backend_at(int k) {
    return k >= 0 && (size_t)k < sizeof built / sizeof built[0] ? built[k] : NULL;
}

dm_status dm_backend_find(dm_device_kind d, const dm_backend **out) {
    *out = dm_backend_get(d);
    if (*out) return DM_OK;
    for (size_t k = 0; k < sizeof missing / sizeof missing[0]; k++)
        if (missing[k].device == d)
            return dm_fail(DM_ERR_UNSUPPORTED, "dmove was built without %s: %s", missing[k].what, missing[k].how);
    return dm_fail(DM_ERR_INVALID_ARG, "unknown device %d", (int)d);
}
