/* file.h: writing files safely, reading small ones whole (file.c). */
#ifndef DM_FILE_H
#define DM_FILE_H

#include <stddef.h>

#include "dmove.h"

/* mkdir -p of the directory part of path. */
dm_status dm_make_parent(const char *path);
/* Writes len bytes to path atomically: a temporary file in the same directory, then
 * rename; on failure nothing is left behind and the target is unchanged. */
dm_status dm_write_file_atomic(const char *path, const void *data, size_t len);
/* Reads a whole file of at most `max` bytes (a configuration: JSON, text) into *text, NUL
 * terminated (the caller frees it), its length into *len (may be NULL). A missing file, a
 * directory, a larger file or a read error: a message naming the path. */
dm_status dm_read_file(const char *path, size_t max, char **text, size_t *len);

#endif
