/* backends.h: the registry of the backends this dmove was built with (backends.c). */
#ifndef DM_LAYER_BACKENDS_H
#define DM_LAYER_BACKENDS_H

#include "plan/backend.h"

/* The backend of device d, or NULL if this dmove was built without it. */
const dm_backend *dm_backend_get(dm_device_kind d);
/* The k-th backend built (k from 0), or NULL past the last: for what runs every backend
 * (tests/test_ops.c). */
const dm_backend *dm_backend_at(int k);
/* The same, or DM_ERR_UNSUPPORTED saying how to build it (DM_ERR_INVALID_ARG for a device
 * that does not exist). */
dm_status dm_backend_find(dm_device_kind d, const dm_backend **out);

#endif
