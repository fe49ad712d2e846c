/* tensorfile.h: inside the public tensor-file API (tensorfile.c): the safetensors file a
 * dm_tensor_file holds, for the library's own readers of it (train/data.c). */
#ifndef DM_TENSORFILE_H
#define DM_TENSORFILE_H

#include "core/safetensors.h"
#include "dmove_tools.h"

const dm_st_file *dm_tensor_file_st(const dm_tensor_file *f);
/* The file's header alone (names, dtypes, shapes, metadata; validated against the file's
 * size): reading a tensor of it fails. For checks before a load. */
dm_status dm_tensor_file_open_header(dm_tensor_file **out, const char *path);

#endif
