/* hfload.h: a whole model's parameters from a Hugging Face checkpoint (hfload.c). */
#ifndef DM_TRAIN_HFLOAD_H
#define DM_TRAIN_HFLOAD_H

#include <stddef.h>

#include "core/safetensors.h"
#include "core/strbuf.h"
#include "dmove_tools.h"
#include "train/model.h"

/* Takes every parameter of m from the file, walking the model's parameters by their
 * Hugging Face names (bert.embeddings.*, bert.encoder.layer.<l>.*, the head's): each found
 * under the file's prefix for the encoder ("bert.", none, "0.auto_model." or "model."; a
 * head's own names as they are), a LayerNorm's weight and bias also as gamma and beta;
 * f32, f64, f16 or bf16. The model's encoder layer l takes the file's layer first + l.
 * The embeddings and the encoder must be there (DM_ERR_NOT_FOUND names the tensor); a head
 * parameter the file lacks (a BertModel has no cls.*) keeps its value and is listed in
 * note ("" when none; note may be NULL); the tied decoder is the word table. Every tensor
 * is checked (dtype, shape) before any parameter changes. */
enum { DM_LOAD_NEW_CLASSIFIER = 1 /* a classifier's classifier.* left as it is (new classes) */ };
dm_status dm_model_load_hf(dm_model *m, const dm_tensor_file *f, int first, int flags, char *note, size_t nn);
/* The same from a model directory (its model.safetensors) or a safetensors file; a
 * config.json there is read and checked against the tensors first (a contradiction names
 * the value). */
dm_status dm_model_load_path(dm_model *m, const char *path, int first, int flags, char *note, size_t nn);
/* A parameter file's tensor (named fname) refused if a value is not finite: what --init of
 * a stack or of a whole model checks before anything changes. */
dm_status dm_param_values_check(const dm_st_tensor *t, const char *fname);

/* dm_hf_config_write's text, into *out (a new buffer the caller frees with dm_sb_done). */
dm_status dm_hf_config_text(const dm_hf_config *c, const char *architecture, dm_sbuf *out);

#endif
