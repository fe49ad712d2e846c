/* file.h: writing files safely (file.c). */
#ifndef DM_FILE_H
#define DM_FILE_H

#include <stddef.h>

#include "dmove.h"

/* mkdir -p of the directory part of path. */
dm_status dm_make_parent(const char *path);
/* Writes len bytes to path atomically: a temporary file in the same directory, then
 * rename; on failure nothing is left behind and the target is unchanged. */
dm_status dm_write_file_atomic(const char *path, const void *data, size_t len);

#endif
