/* file.h: writing files safely, reading small ones whole (file.c). */
#ifndef DM_FILE_H
#define DM_FILE_H

#include <stdio.h>
#include <stddef.h>

#include "dmove.h"

/* mkdir -p of the directory part of path. */
dm_status dm_make_parent(const char *path);

/* An output being written. A regular file (or a new name) is written to a temporary beside
 * it, "<name>.tmp.<pid>.XXXXXX" (the name cut so that the temporary stays within the
 * file-name limit), and renamed over it by dm_out_commit: a crash never leaves half a
 * file, and the next write of the same name removes the temporaries that dead processes
 * left. A symbolic link's target is written, the link kept. A FIFO or character device
 * (a pipe, /dev/null) is written directly, never replaced; a directory, socket or block
 * device is refused. A temporary is registered until committed or aborted, so that
 * dm_remove_partial_outputs (a signal handler's) removes it. */
typedef struct {
    int fd;
    int stream;    /* writing to the path itself (FIFO, character device) */
    int slot;      /* the temporary's registration, or -1 */
    char *path;    /* the file written (a link's target) */
    char *tmp;     /* the temporary, or NULL */
} dm_out_file;
dm_status dm_out_open(dm_out_file *o, const char *path);
dm_status dm_out_write(dm_out_file *o, const void *data, size_t len);
/* Flushes to disk and puts the file in place; on failure the temporary is removed and
 * the target unchanged. Either way o is closed. */
dm_status dm_out_commit(dm_out_file *o);
/* Gives up: the temporary removed, the target unchanged. */
void dm_out_abort(dm_out_file *o);

/* Writes len bytes to path atomically (dm_out_file). */
dm_status dm_write_file_atomic(const char *path, const void *data, size_t len);

/* Opens an input for reading, refusing anything but a regular file (a FIFO would block,
 * a device never end) without blocking on it: a message naming the path and what it is.
 * *size: its size in bytes (may be NULL). */
dm_status dm_open_input(const char *path, int *fd, size_t *size);
dm_status dm_fopen_input(const char *path, FILE **f, size_t *size);
/* The same check alone, before a caller's own open (which then reports a missing file in
 * its own words): DM_OK for a regular file or a path that does not exist. */
dm_status dm_input_regular(const char *path);
/* Reads a whole file of at most `max` bytes (a configuration: JSON, text) into *text, NUL
 * terminated (the caller frees it), its length into *len (may be NULL). A missing file, a
 * directory, a larger file or a read error: a message naming the path. */
dm_status dm_read_file(const char *path, size_t max, char **text, size_t *len);
/* The rest of an open file, at most `max` bytes, into *text (NUL terminated; the caller
 * frees it) and *len; `size` (its size as stat gives it, 0 when unknown) sizes the buffer,
 * which grows when the file proves longer: memory follows the file, not `max`. Past max:
 * DM_ERR_FORMAT and *too_large = 1; a read error DM_ERR_IO; the caller names the file. */
dm_status dm_read_stream(FILE *f, size_t size, size_t max, char **text, size_t *len, int *too_large);

#endif
