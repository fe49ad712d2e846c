/* tensorfile.h: inside the public tensor-file API (tensorfile.c): the safetensors file a
 * dm_tensor_file holds, for the library's own readers of it (train/data.c). */
#ifndef DM_TENSORFILE_H
#define DM_TENSORFILE_H

#include "core/safetensors.h"
#include "dmove_tools.h"

const dm_st_file *dm_tensor_file_st(const dm_tensor_file *f);

#endif
