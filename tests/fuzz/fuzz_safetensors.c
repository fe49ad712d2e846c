/* fuzz_safetensors: the safetensors parser (dm_st_parse, the buffer entry dm_st_read
 * uses) and every accessor on what it accepts. */
#include "core/safetensors.h"
#include "core/status.h"
#include "fuzz_util.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dm_st_file *f = NULL;
    if (dm_st_parse(data, size, &f) != DM_OK) return fuzz_rejected();
    const int n = dm_st_count(f);
    for (int i = 0; i < n; i++) {
        const dm_st_tensor *t = dm_st_get(f, i);
        if (!t) abort(); /* an index below the count has a tensor */
        if (dm_st_find(f, t->name) == NULL) abort();
        (void)dm_st_dtype_name(t->dtype);
        const size_t elems = t->nbytes / dm_st_dtype_size(t->dtype);
        if (elems <= (1u << 16)) {
            float *out = malloc((elems ? elems : 1) * sizeof(float));
            if (out) (void)dm_st_to_f32(t, out, elems);
            free(out);
        }
    }
    (void)dm_st_metadata(f, "format");
    (void)dm_st_metadata(f, "checksum");
    (void)dm_st_find(f, "absent");
    dm_st_free(f);
    return 0;
}
