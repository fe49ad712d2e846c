/* dmove_tools.h: the public C API of dmove's tools beside the layer and the trainer
 * (dmove.h): tensor files (safetensors), the roofline analysis of a training step on a
 * device model, CPU profiles, the tuner, the data and the teacher of a training run, and
 * the charts. What the `dmove` command does, any program (or a Python binding) can do
 * through it: opaque handles, every fallible function returns dm_status and leaves its
 * message in dm_last_error(), nothing ever exits. Text a function gives (char **text) is
 * the caller's to free().
 * NULL: a function returning dm_status refuses a NULL handle, out-pointer or required
 * string with DM_ERR_INVALID_ARG ("<function>: NULL argument"), and a constructor then
 * leaves *out NULL; a function returning a value gives the neutral value written beside
 * it (0, "", NULL or -1); a void one does nothing (a getter clears what it fills); every
 * *_free takes NULL. */
#ifndef DMOVE_TOOLS_H
#define DMOVE_TOOLS_H

#include <stddef.h>
#include <stdint.h>

#include "dmove.h"

#ifdef __cplusplus
extern "C" {
#endif

/* --- Small helpers ---------------------------------------------------------------------- */

/* v as the shortest "%g" text that reads back as exactly v ("0.1"): for messages and
 * file metadata. buf NULL or n 0: nothing written. */
void dm_fmt_exact(char *buf, size_t n, double v);
/* The CPU's model name (/proc/cpuinfo), or `fallback` ("" if NULL) when it cannot be read.
 * out NULL or n 0: nothing written. */
void dm_cpu_model_name(char *out, size_t n, const char *fallback);
/* A time-to-floor ratio as text (3 significant digits, no exponent). Returns buf ("" when
 * buf is NULL or n 0). */
const char *dm_ratio_text(double x, char *buf, size_t n);
/* "fp32" for 4 bytes per element, "bf16/fp16" for 2. */
const char *dm_dtype_bytes_name(int dtype_bytes);

/* The parameters of an encoder layer (Hugging Face BertLayer's), known before any layer
 * exists: the name, and the shape by dimension letter ('i' the hidden width, 'u' the
 * feed-forward width; weights (out, in) as torch.nn.Linear stores them). */
typedef struct {
    const char *name;
    int ndim;      /* 1 or 2 */
    char dims[2];  /* dims[0 .. ndim) */
} dm_param_spec;
int dm_param_spec_count(void);
dm_status dm_param_spec_get(int index, dm_param_spec *out);

/* --- Tensor files (safetensors) --------------------------------------------------------- */

/* The element types of a tensor file. */
typedef enum {
    DM_FILE_F32 = 0, DM_FILE_F64, DM_FILE_F16, DM_FILE_BF16, DM_FILE_I64, DM_FILE_I32, DM_FILE_I16,
    DM_FILE_I8, DM_FILE_U8, DM_FILE_BOOL
} dm_file_dtype;
const char *dm_file_dtype_name(dm_file_dtype d); /* "F32", ... as the file has it */

typedef struct {
    const char *name;      /* lives as long as the file */
    dm_file_dtype dtype;
    int ndim;
    int64_t shape[8];
} dm_tensor_info;

/* A safetensors file, read and validated whole (header, every entry's dtype, shape and
 * offsets). */
typedef struct dm_tensor_file dm_tensor_file;
dm_status dm_tensor_file_open(dm_tensor_file **out, const char *path);
void dm_tensor_file_free(dm_tensor_file *f);
const char *dm_tensor_file_path(const dm_tensor_file *f);  /* NULL f: NULL */
int dm_tensor_file_count(const dm_tensor_file *f);          /* NULL f: 0 */
/* The index of the tensor called `name`, or -1 (also for a NULL f or name). */
int dm_tensor_file_find(const dm_tensor_file *f, const char *name);
dm_status dm_tensor_file_info(const dm_tensor_file *f, int index, dm_tensor_info *out);
/* Tensor `index` as n floats (converted from any dtype; n must be its element count). */
dm_status dm_tensor_file_read_f32(const dm_tensor_file *f, int index, float *out, size_t n);
/* The value of `key` in the file's __metadata__, or NULL (also for a NULL f or key); lives
 * as long as the file. */
const char *dm_tensor_file_metadata(const dm_tensor_file *f, const char *key);

/* Writes len bytes to path as dmove writes every output: a regular file (or a new name)
 * through a temporary beside it, renamed over it once whole (a crash or a failure leaves
 * the old file); a symbolic link's target, the link kept; a FIFO or character device (a
 * pipe, /dev/null) written directly, never replaced; a directory refused. */
dm_status dm_write_output(const char *path, const void *data, size_t len);

/* A safetensors file being made: tensors and metadata, written atomically. */
typedef struct dm_tensor_writer dm_tensor_writer;
dm_status dm_tensor_writer_new(dm_tensor_writer **out);
void dm_tensor_writer_free(dm_tensor_writer *w);
/* Adds a float32 tensor (name, shape and data copied). */
dm_status dm_tensor_writer_add_f32(dm_tensor_writer *w, const char *name, int ndim, const int64_t *shape,
                                   const float *data);
dm_status dm_tensor_writer_set_metadata(dm_tensor_writer *w, const char *key, const char *value);
/* Writes to a temporary file beside path and renames it: on failure path is unchanged. */
dm_status dm_tensor_writer_write(dm_tensor_writer *w, const char *path);

/* --- CPU profiles (`dmove probe`) ------------------------------------------------------- */

/* Which variant of dmove's own CPU GEMM kernel ("direct") runs here: *in_use and *widest
 * get "amx", "avx512", "avx2" or "none" (BLAS only), in use and the widest this CPU has;
 * *note says why they differ (DMOVE_ISA in the environment, Linux refusing AMX's tile
 * state), or that DMOVE_ISA was not understood, else "". Any pointer may be NULL. */
void dm_cpu_kernel_isa(const char **in_use, const char **widest, const char **note);
/* With AMX in use, which GEMMs it takes and which the AVX-512 variant ("GEMMs with C at
 * least 32 x 96 and k >= 32, or C 64 or more wide with m and k >= 256, on AMX, the rest on
 * AVX-512"); else "". */
const char *dm_cpu_kernel_split(void);
/* Where the AVX-512 kernel packs a transposed op(A) (the weight gradients), and why: e.g.
 * "A^T packed from 2 column blocks (not an AMD CPU)". */
const char *dm_cpu_kernel_packing(void);

/* DM_OK when the address-space limit (ulimit -v) leaves room for OpenBLAS to start and
 * run `threads` threads (0: OpenMP's default): threads + 1 of its 136 MiB buffers, else
 * DM_ERR_OOM with the numbers. Under a tighter limit OpenBLAS would retry its allocation
 * forever. The dmove command checks it for one thread before any library starts, and the
 * CPU executor and the probe check their threads' buffers again themselves. */
dm_status dm_blas_room_check(int threads);

#define DM_PROBE_MAX_THREADS 64

/* What was measured on a CPU. */
typedef struct {
    char machine[256];        /* CPU model name */
    char host[128];
    char date[32];            /* UTC, ISO 8601 */
    int threads;              /* most threads measured */
    double triad_bw, read_bw; /* bytes/s: STREAM triad, read-only sum */
    double vector_flops;      /* flop/s of an in-cache FMA loop on all threads */
    int sgemm_n;              /* square SGEMM size */
    int nsgemm;
    int sgemm_threads[DM_PROBE_MAX_THREADS];
    double sgemm_flops[DM_PROBE_MAX_THREADS];
    /* dmove's own GEMM kernel on the same square problem, per sgemm entry (0: not
     * measured), and its variant ("amx", "avx512", "avx2"; "" if none ran) */
    double direct_flops[DM_PROBE_MAX_THREADS];
    char direct_kernel[16];
} dm_profile_info;

typedef struct dm_profile dm_profile;
/* $XDG_CACHE_HOME/dmove/cpu-profile.json, else ~/.cache/dmove/cpu-profile.json. */
dm_status dm_profile_default_path(char *buf, size_t n);
/* Measures this CPU (threads 1 .. max_threads, 0: all); progress (may be NULL) gets a
 * line per step. Well under a minute. */
dm_status dm_profile_measure(dm_profile **out, int max_threads, void (*progress)(const char *line));
/* Times dmove's own GEMM kernel (algorithm "direct", the variant in use) on the probe's
 * square problem at each of p's thread counts and keeps the rates in p: a device model
 * from p then takes the faster of it and BLAS as the contraction rate (on an AMX CPU the
 * kernel runs fp32 on the tile unit, well past SGEMM). No-op where the kernel does not
 * run (no AVX2, DMOVE_ISA=none). Seconds. */
dm_status dm_profile_measure_direct(dm_profile *p, void (*progress)(const char *line));
/* Loads and validates a profile file. */
dm_status dm_profile_open(dm_profile **out, const char *path);
/* Writes it atomically, making the parent directory if needed. */
dm_status dm_profile_write(const dm_profile *p, const char *path);
/* out NULL: nothing; p NULL: *out all zero. */
void dm_profile_get_info(const dm_profile *p, dm_profile_info *out);
void dm_profile_free(dm_profile *p);

/* --- Device models of the roofline ------------------------------------------------------ */

typedef struct dm_device_model dm_device_model;
/* A datasheet preset ("v100", "a100", "h100", "h200"); DM_ERR_NOT_FOUND names the known. */
dm_status dm_device_model_preset(dm_device_model **out, const char *name);
/* This CPU from a profile, at `threads` (0: the most measured). */
dm_status dm_device_model_cpu(dm_device_model **out, const dm_profile *p, int threads);
void dm_device_model_free(dm_device_model *m);
/* The known preset names, comma-separated, for messages. */
const char *dm_device_names(void);
/* The preset for a GPU of this name as its driver gives it, or NULL. */
const char *dm_device_for_gpu(const char *gpu);
/* The getters below give "" (texts) and 0 (numbers) for a NULL m. */
const char *dm_device_model_name(const dm_device_model *m);
const char *dm_device_model_desc(const dm_device_model *m);
int dm_device_model_is_cpu(const dm_device_model *m);
double dm_device_model_bandwidth(const dm_device_model *m); /* bytes/s */
/* Contraction and vector peaks (flop/s) for a dtype of dtype_bytes (4 fp32, 2 bf16/fp16). */
double dm_device_model_contract_peak(const dm_device_model *m, int dtype_bytes);
double dm_device_model_vector_peak(const dm_device_model *m, int dtype_bytes);
/* The roofline time of work on m: max(compute time, bytes / bandwidth). */
double dm_device_model_roofline(const dm_device_model *m, int dtype_bytes, double contract_flop,
                                double other_flop, double bytes);

/* --- The analysis of a training step (`dmove analyze`) ---------------------------------- */

/* One encoder layer's training step analysed on a device model without running it: per
 * operator flop, bytes, intensity, bound and predicted time; per class shares; unfused vs
 * fused bytes and floors; the fused groups; the memory between the passes. With
 * `recompute`, the fused plan recomputes attention in the backward. */
typedef struct dm_analysis dm_analysis;
dm_status dm_analysis_new(dm_analysis **out, const dm_layer_config *cfg, const dm_device_model *dev,
                          int dtype_bytes, int recompute);
void dm_analysis_free(dm_analysis *a);
int dm_analysis_num_ops(const dm_analysis *a); /* NULL a: 0 */
/* Applies a plan file from the tuner (for the same sizes) to the fused plan; its layouts,
 * algorithms and side-by-side pairs then appear in dm_analysis_plan_text and in the JSON
 * report's "plan" object. */
dm_status dm_analysis_load_plan(dm_analysis *a, const char *path);
dm_status dm_analysis_plan_text(const dm_analysis *a, char **text);
/* Runs the unfused step on this CPU (warmup untimed steps, reps profiled ones): the
 * reports then add each operator's achieved time, rates, roofline % and MUE. */
dm_status dm_analysis_measure(dm_analysis *a, int threads, int warmup, int reps);
/* The reports: the tables (operators, classes, data movement, groups, memory), one JSON
 * object, the operator table as CSV, and the roofline chart (SVG, written atomically;
 * title NULL: a default). */
dm_status dm_analysis_table(const dm_analysis *a, char **text);
dm_status dm_analysis_json(const dm_analysis *a, char **text);
dm_status dm_analysis_csv(const dm_analysis *a, char **text);
dm_status dm_analysis_write_svg(const dm_analysis *a, const char *title, const char *path);
/* The roofline floors (seconds) of the unfused and the fused step of cfg on m. */
dm_status dm_analysis_floors(const dm_layer_config *cfg, const dm_device_model *m, int dtype_bytes,
                             int recompute, double *unfused_s, double *fused_s);

/* --- The whole model's training step analysed (`dmove analyze --model`) ---------------- */

/* A whole BertForMaskedLM's training step (dm_trainer_new_bert's) on a device model, by
 * part: the embeddings, the encoder layers (one layer's analysis times L), the MLM head at
 * the scored positions (its decoder's gradient summed into the word table's), and the
 * update (clipping's norm and AdamW over every parameter, the tied table once, fp32
 * state: an estimate of 18 flop and 32 bytes a parameter). Each part: its parameters,
 * flop (by class), the bytes of the unfused and the fused schedule, and their roofline
 * floors, as `dmove analyze` counts a layer's; total: their sums. */
enum { DM_PART_EMBEDDINGS = 0, DM_PART_LAYERS, DM_PART_MLM_HEAD, DM_PART_OPTIMIZER, DM_NUM_PARTS };
/* "embeddings", "encoder layers", "MLM head", "optimizer"; NULL out of range. */
const char *dm_model_part_name(int part);
/* The update's work per parameter, fp32 (its state is fp32 in every storage type): the
 * clipping's norm reads the gradient (2 flop: square, add) and scales it; AdamW reads
 * the parameter, gradient and both moments and writes the parameter and moments back
 * (m: 3 flop, v: 4, the bias-corrected step with weight decay: 8). */
enum { DM_OPT_FLOP_PER_PARAM = 2 + 1 + 3 + 4 + 8, DM_OPT_BYTES_PER_PARAM = 4 + 7 * 4 };
typedef struct {
    const char *name;         /* "embeddings", "encoder layers", "MLM head", "optimizer" */
    int count;                /* segments of it (the layers: L) */
    int64_t params;
    double flop, class_flop[DM_NUM_CLASSES];
    double unfused_bytes, fused_bytes;
    double unfused_floor_s, fused_floor_s;
    double backward_floor_s;  /* of fused_floor_s, the backward pass's groups */
} dm_model_part_cost;
typedef struct {
    dm_model_part_cost part[DM_NUM_PARTS], total;
    int64_t tokens, predictions; /* b * j, and the positions the head scores */
} dm_model_cost;
dm_status dm_model_cost_analyze(const dm_layer_config *cfg, int layers, const dm_bert_model *bert,
                                const dm_device_model *dev, int dtype_bytes, dm_model_cost *out);

/* Data parallelism on paper: the step of a whole model (its cost, per rank's batch) on N
 * ranks that sum the gradients as dmove does, in buckets (each segment's gradients,
 * handed over as the backward pass finishes the segment: the head, the layers top down,
 * the embeddings with the tied table last), one bucket after the other on the link,
 * overlapping the backward of the segments below. A bucket of S bytes takes the ring
 * all-reduce's 2 (N - 1) / N * S / busbw plus 2 log2(N) * latency (NCCL's tree for the
 * latency term); what runs past the end of the backward pass is exposed. Times are the
 * cost model's fused roofline floors (forward, backward, optimizer), so the compute is the
 * fastest it can be and the efficiency a lower bound for this link. */
typedef struct {
    const char *name;    /* "NVLink", "InfiniBand" */
    double busbw;        /* all-reduce bus bandwidth, bytes/s per rank */
    double latency;      /* seconds per hop */
} dm_link;
typedef struct {
    int ranks;
    double grad_bytes;   /* the gradients summed per step (each rank's) */
    double wire_bytes;   /* what each rank sends per step: 2 (N - 1) / N of them */
    double compute_s;    /* forward + backward + optimizer, as alone */
    double comm_s;       /* the buckets' all-reduces, back to back */
    double exposed_s;    /* of it, past the end of the backward pass */
    double step_s;       /* compute_s + exposed_s */
    double efficiency;   /* compute_s / step_s: the throughput per rank against one alone */
} dm_dp_prediction;
dm_status dm_dp_predict(const dm_model_cost *m, int grad_bytes, int ranks, const dm_link *link,
                        dm_dp_prediction *out);

/* --- Charts ----------------------------------------------------------------------------- */

/* A step's groups as bars of their time, each with its roofline floor inside; one section
 * per schedule. ms < 0: a group timed with another (its note shown); floor_ms < 0: none.
 * Texts may be NULL (titles, names, summaries, labels, notes); bars only where nbars is 0,
 * and nbars is never negative. */
typedef struct {
    const char *label;
    int pass;
    dm_op_class cls;
    double ms, floor_ms;
    const char *note;
} dm_group_bar;
typedef struct {
    const char *name;
    const char *summary;
    const dm_group_bar *bars;
    int nbars;
} dm_group_chart;
dm_status dm_group_chart_write_svg(const char *title, const char *subtitle, const dm_group_chart *sec, int nsec,
                                   const char *path);
/* The loss curve of a training run (steps first_step .. first_step + n - 1), written
 * atomically; title NULL: a default. */
dm_status dm_loss_svg(const double *loss, int64_t n, int64_t first_step, const char *title, const char *path);
/* Removes the temporary files of the outputs being written now (each output is written
 * beside its name and renamed into place when complete): async-signal-safe, for a signal
 * handler that ends the process. */
void dm_remove_partial_outputs(void);

/* A training run with held-out evaluations (dmove pretrain, finetune): the loss panel
 * (training loss per step, its running mean past 50 steps, the held-out loss at its
 * steps) over an accuracy panel (when accuracies are given: the training accuracy per
 * step, the held-out at its steps; fractions 0-1). Written atomically. */
typedef struct {
    const char *title;          /* NULL: "training loss" */
    const char *loss_name;      /* the loss axis, e.g. "loss (cross-entropy)"; NULL: "loss" */
    const char *acc_name;       /* the accuracy axis; NULL: "accuracy" */
    const double *loss;         /* n training losses, steps first_step .. first_step + n - 1 */
    const double *train_acc;    /* n training accuracies, or NULL */
    int64_t n, first_step;
    const int64_t *eval_step;   /* neval held-out evaluations: their steps, */
    const double *eval_loss;    /* losses */
    const double *eval_acc;     /* and accuracies (or NULL) */
    int64_t neval;
} dm_train_chart;
dm_status dm_train_chart_svg(const dm_train_chart *c, const char *path);

/* --- Tuning (`dmove tune`) -------------------------------------------------------------- */

/* The candidates (layouts per tensor, algorithms per contraction) of every fused group of
 * a layer's step, measured on this CPU, the fastest configuration of the whole step by
 * shortest path, refined by alternate re-timing, pairs of contractions side by side and
 * row groups in GEMM epilogues; written as a plan file. */
typedef struct dm_tuning dm_tuning;
typedef struct {
    const char *machine;
    int groups, tensors;          /* fused groups; tensors with a layout choice */
    int64_t candidates;           /* candidate layouts over those tensors */
    int64_t tasks, from_cache;    /* measurements, and of them from the cache */
    int64_t cache_skipped;        /* damaged cache lines left out (never trusted) */
    int threads, reps;
    int retime_runs;              /* runs per candidate when two are re-timed alternately */
    int refined;                  /* re-timings so far (dm_tuning_refine) */
    double default_s, tuned_s;    /* sums over groups: the default plan, the tuned one */
} dm_tuning_info;
/* The $XDG_CACHE_HOME (else ~/.cache) dmove/tune-cache.tsv. */
dm_status dm_tune_cache_default_path(char *buf, size_t n);
/* reps: timed repetitions per candidate (their median counts), 1 to 63; DM_ERR_INVALID_ARG
 * otherwise. */
dm_status dm_tuning_new(dm_tuning **out, const dm_layer_config *cfg, const dm_layer_options *opt, int reps);
void dm_tuning_free(dm_tuning *t);
/* out NULL: nothing; t NULL: *out all zero, machine "". */
void dm_tuning_get_info(const dm_tuning *t, dm_tuning_info *out);
/* The tensors with a layout choice and their candidates: "; name {bji jbi}" each. */
dm_status dm_tuning_candidates(const dm_tuning *t, char **text);
/* Measures every candidate not in the cache (NULL: none); progress (may be NULL) after
 * each. */
dm_status dm_tuning_measure(dm_tuning *t, const char *cache,
                            void (*progress)(int64_t done, int64_t total, int64_t cached, double secs, void *arg),
                            void *arg);
/* The shortest-path selection over the measured times. */
dm_status dm_tuning_select(dm_tuning *t);
/* Re-times each changed group's default and choice alternately, then selects again;
 * nchanged: the groups re-timed (0: the selection is final). */
dm_status dm_tuning_refine(dm_tuning *t, const char *cache, int *nchanged);
/* Input- and weight-gradient contractions one after the other against side by side. */
dm_status dm_tuning_pairs(dm_tuning *t);
/* Row groups in their GEMM's epilogue against apart. */
dm_status dm_tuning_rows(dm_tuning *t);
/* The groups' candidates and choices, and what the pairs and epilogues timed. */
dm_status dm_tuning_report(const dm_tuning *t, char **text);
dm_status dm_tuning_save(const dm_tuning *t, const char *path);
/* 1 if the selection runs dmove's own GEMM kernel ("direct") anywhere (0 for a NULL t). */
int dm_tuning_uses_direct(const dm_tuning *t);
/* Violin plot of each group's spread of candidate times. */
dm_status dm_tuning_write_svg(const dm_tuning *t, const char *path);

/* --- What a training run learns (`dmove train`) ----------------------------------------- */

/* Samples from a tensor file: hidden_states (N, j, i), target (N, j, i), optionally
 * attention_mask (N, j). Batch s takes samples (s-1)*b .. s*b-1, wrapping around. */
typedef struct dm_train_data dm_train_data;
/* Takes the tensors of an open file (which must outlive the data) and checks their names
 * and shapes; the message starts with the file's path. */
dm_status dm_train_data_new(dm_train_data **out, const dm_tensor_file *f);
void dm_train_data_free(dm_train_data *d);
/* Any of the three may be NULL (not wanted); a NULL d gives 0 for each. */
void dm_train_data_sizes(const dm_train_data *d, int64_t *samples, int64_t *seq, int64_t *hidden);
/* A hash of the three tensors' types, shapes and bytes (ranks reading their own copies of a
 * file compare it); 0 for a NULL d. */
uint64_t dm_train_data_fingerprint(const dm_train_data *d);
/* hidden_states and target must be floats (f32, f64, bf16, f16), the mask any number. */
dm_status dm_train_data_check_dtypes(const dm_train_data *d);
/* Every value of hidden_states and target finite, and the attention_mask's each 0 or 1
 * with some 1 (found now, not when training reaches it); the message starts with the
 * file's path. DM_ERR_OOM without memory to check. */
dm_status dm_train_data_check_finite(const dm_train_data *d);
/* Batch `step` (from 1) of b samples (b >= 1): x, y (b, j, i) and mask (b, j), 1 token 0
 * padding. DM_ERR_INVALID_ARG for a step below 1, b below 1 or a NULL pointer. */
dm_status dm_train_data_batch(const dm_train_data *d, int64_t step, int64_t b, float *x, float *y, float *mask);
/* Part `part` (0 .. parts - 1) of batch `step` of b * parts samples: its samples part * b ..
 * (part + 1) * b - 1 (a rank's share of the global batch, dm_dist). */
dm_status dm_train_data_batch_part(const dm_train_data *d, int64_t step, int64_t b, int part, int parts, float *x,
                                   float *y, float *mask);

/* The teacher task: a second stack of `layers` layers of cfg (dropout off, BERT's
 * initialisation from cfg->seed, weights times `scale`) maps fresh inputs N(0, 1) with
 * random padding to the targets, forward only, on the device of opt. */
typedef struct dm_teacher dm_teacher;
/* DM_ERR_INTERNAL when the stack lacks a tensor the batches need. */
dm_status dm_teacher_new(dm_teacher **out, const dm_layer_config *cfg, int layers, const dm_layer_options *opt,
                         double scale);
void dm_teacher_free(dm_teacher *t);
/* Batch `step` (from 1): inputs x (b, j, i) and mask (b, j) from Philox (cfg->seed), the
 * teacher's outputs as targets y (b, j, i). DM_ERR_INVALID_ARG for a step below 1 or a NULL
 * pointer. */
dm_status dm_teacher_batch(dm_teacher *t, int64_t step, float *x, float *y, float *mask);
/* From now on, batch `step` is part `part` (0 .. parts - 1) of the teacher's batch of
 * b * parts samples (a rank's share of the global batch, dm_dist): the same inputs and
 * targets as its sequences part * b .. (part + 1) * b - 1 there. */
dm_status dm_teacher_set_part(dm_teacher *t, int part, int parts);


/* --- Hugging Face models ------------------------------------------------------------------ */

/* A BERT's config.json (transformers' BertConfig), as far as dmove reads it. */
typedef struct {
    int64_t vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size;
    int64_t max_position_embeddings, type_vocab_size, pad_token_id;
    double layer_norm_eps, hidden_dropout_prob, attention_probs_dropout_prob;
    double classifier_dropout;  /* a classifier's own dropout; NaN: none given (it takes hidden_dropout_prob) */
    int tie_word_embeddings;    /* the MLM decoder is the word table (1, the default) or a matrix of its own */
    dm_act act;                 /* hidden_act: gelu, gelu_new / gelu_pytorch_tanh, relu */
    char architecture[64];      /* the first of "architectures" ("BertForMaskedLM"), or "" */
} dm_hf_config;
/* BertConfig's defaults (bert-base-uncased's sizes). */
void dm_hf_config_default(dm_hf_config *c);
/* Reads `path`: a config.json, or a directory holding one. model_type must be "bert" (or
 * absent), position_embedding_type "absolute", the sizes positive and consistent (hidden
 * divisible by heads), hidden_act one dmove has: anything else is refused naming the key
 * and the value. Keys dmove does not use are ignored. */
dm_status dm_hf_config_read(const char *path, dm_hf_config *out);
/* Writes c as a config.json that transformers' from_pretrained reads (model_type bert),
 * atomically. `architecture` NULL: c->architecture, or none when that is empty. */
dm_status dm_hf_config_write(const dm_hf_config *c, const char *architecture, const char *path);
/* The layer configuration the model's encoder layers have: hidden, heads, ffn, eps, act
 * and the dropout (both of the config's dropouts, which must then be equal: else
 * DM_ERR_UNSUPPORTED); batch, seq, seed and the rest of *cfg are left as they are. */
dm_status dm_hf_config_layer(const dm_hf_config *c, dm_layer_config *cfg);

/* A sentence-transformers model directory: its modules.json (found 0 when there is none:
 * a plain transformers model, whose defaults are these: the directory itself, mean, no
 * normalization, no max_seq_length). encoder_dir: the Transformer module's folder (dir, or
 * dir/0_Transformer in older layouts); pooling: its Pooling module's, DM_POOL_MEAN or
 * DM_POOL_CLS, or -1 for another mode (max, weighted mean, last token, or several at once:
 * named in pooling_name); normalize: a Normalize module follows; max_seq_length: from the
 * encoder's sentence_bert_config.json, else its tokenizer_config.json's model_max_length
 * (0: neither), and the former's do_lower_case; other: the type of
 * a module dmove does not run (a Dense layer after the pooling), "" when none. A Pooling
 * config's mode absent takes sentence-transformers' default (mean on, the others off);
 * its "pooling_mode" (sentence-transformers 5 and later) names it. */
typedef struct {
    int found, pooling, normalize, do_lower_case; /* do_lower_case: the text lowercased first */
    int64_t max_seq_length;
    char encoder_dir[4096], pooling_name[160], other[112];
} dm_st_model;
dm_status dm_st_model_read(const char *dir, dm_st_model *m);

/* Where a model's files are: `path` is a directory (its model.safetensors and, if there,
 * config.json) or a safetensors file (config.json beside it, if there). *config gets ""
 * when there is none. Buffers of n bytes; DM_ERR_IO when the weights are not there. */
dm_status dm_hf_model_files(const char *path, char *weights, size_t wn, char *config, size_t cn);
/* The prefix under which a safetensors file keeps the encoder: "" (BertModel), "bert."
 * (BertFor...), "0.auto_model." (a sentence-transformers state dict) or "model.":
 * the first that has encoder.layer.0; DM_ERR_NOT_FOUND naming the ones tried. */
dm_status dm_hf_encoder_prefix(const dm_tensor_file *f, char *prefix, size_t n);
/* Checks the file's tensors against the config: the number of encoder layers and every
 * encoder tensor's shape (hidden, intermediate), and the embeddings' (vocabulary,
 * positions, token types, LayerNorm) and the MLM head's (cls.predictions.*) where the file
 * has them. DM_ERR_SHAPE names the tensor, its
 * shape and the config's value it contradicts. */
dm_status dm_hf_config_check_tensors(const dm_hf_config *c, const dm_tensor_file *f);
/* The same on the weights of the model at `path` (a directory or its safetensors file, as
 * dm_hf_model_files takes it), opened, checked and closed: for the commands to run before
 * they make a model of the config's sizes (a config that contradicts the file is named
 * before memory for it is taken). */
dm_status dm_hf_check_weights(const dm_hf_config *c, const char *path);

#ifdef __cplusplus
}
#endif
#endif
