/* dmove.h: the public C API of dmove (train transformer encoders moving as little data
 * as possible). Opaque handles, every function returns dm_status, nothing ever exits. */
#ifndef DMOVE_H
#define DMOVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DMOVE_VERSION "0.1.0"

typedef enum {
    DM_OK = 0,
    DM_ERR_INVALID_ARG,  /* a value is out of range or inconsistent */
    DM_ERR_OOM,          /* an allocation failed, or a size overflowed */
    DM_ERR_IO,           /* a file could not be read or written */
    DM_ERR_FORMAT,       /* a file is malformed, truncated or corrupted */
    DM_ERR_SHAPE,        /* a tensor has the wrong shape or dtype */
    DM_ERR_NOT_FOUND,    /* a named tensor or object does not exist */
    DM_ERR_BACKEND,      /* BLAS / CUDA / system call failed */
    DM_ERR_UNSUPPORTED,  /* valid, but not implemented for this configuration */
    DM_ERR_INTERNAL      /* a bug in dmove: please report it */
} dm_status;

/* The message of the last error on this thread: what went wrong and what to do. */
const char *dm_last_error(void);
const char *dm_status_name(dm_status s);

/* DM_ACT_TANH: the pooler's (BertForSequenceClassification), not an encoder layer's. */
typedef enum { DM_ACT_GELU = 0, DM_ACT_GELU_TANH, DM_ACT_RELU, DM_ACT_TANH } dm_act;
/* Where the layer's two LayerNorms sit. Post-LN (BERT, Hugging Face BertLayer; the
 * default): after each residual add. Pre-LN (torch.nn.TransformerEncoderLayer with
 * norm_first=True, GPT-2's blocks): on the input of attention and of the feed-forward
 * block, the residuals bypassing them; attention.output.LayerNorm then normalizes the
 * attention's input and output.LayerNorm the feed-forward's. */
typedef enum { DM_NORM_POST = 0, DM_NORM_PRE } dm_norm;
typedef enum { DM_SCHED_FUSED = 0, DM_SCHED_UNFUSED } dm_schedule;

/* Operator classes of the paper. */
typedef enum { DM_CLASS_CONTRACTION = 0, DM_CLASS_NORMALIZATION, DM_CLASS_ELEMENTWISE,
               DM_NUM_CLASSES } dm_op_class;
const char *dm_class_name(dm_op_class c);

/* One BERT encoder layer (Hugging Face BertLayer semantics), post-LN by default. */
typedef struct {
    int64_t batch;   /* b */
    int64_t seq;     /* j (= k) */
    int64_t hidden;  /* i */
    int64_t heads;   /* h; i must be divisible by h */
    int64_t ffn;     /* u */
    double dropout;  /* p in [0, 1), all three dropouts */
    double eps;      /* LayerNorm epsilon (default 1e-12) */
    dm_act act;
    uint64_t seed;   /* dropout seed */
    dm_norm norm;    /* DM_NORM_POST (0, BERT) or DM_NORM_PRE */
    int causal;      /* 1: a query attends to the keys at or before its own position only
                      * (on top of attention_mask), as a decoder; 0 (default): all keys */
} dm_layer_config;

/* BERT-base defaults: b=8 j=128 i=768 h=12 u=3072, p=0.1, eps=1e-12, GELU, seed 0. */
void dm_layer_config_default(dm_layer_config *cfg);
/* Sets the sizes of a preset ("bert-base", "bert-large"); other fields unchanged. */
dm_status dm_layer_config_preset(dm_layer_config *cfg, const char *name);
/* Checks sizes (positive, i % h == 0, no overflow, within limits) and p, eps. */
dm_status dm_layer_config_check(const dm_layer_config *cfg);
const char *dm_act_name(dm_act a);
dm_status dm_act_parse(const char *s, dm_act *out);
const char *dm_norm_name(dm_norm n);
dm_status dm_norm_parse(const char *s, dm_norm *out); /* "post", "pre" */

/* Where a layer's steps run. CUDA: the layer's tensors live on the GPU; the pointers of
 * dm_layer_tensor are a host staging copy, moved by dm_layer_to_device / dm_layer_to_host.
 * DM_ERR_UNSUPPORTED if dmove was built without CUDA, DM_ERR_BACKEND if no GPU is usable. */
typedef enum { DM_DEVICE_CPU = 0, DM_DEVICE_CUDA } dm_device_kind;
const char *dm_device_kind_name(dm_device_kind d);
dm_status dm_device_kind_parse(const char *s, dm_device_kind *out); /* "cpu", "cuda" */

/* How a device layer stores its tensors: fp32, or bf16 / fp16 with fp32 arithmetic and
 * accumulation (LayerNorm's statistics stay fp32). The CPU backend is fp32 only. The host
 * staging copy is fp32 whatever the storage. */
typedef enum { DM_DTYPE_FP32 = 0, DM_DTYPE_BF16, DM_DTYPE_FP16 } dm_dtype;
const char *dm_dtype_name(dm_dtype d);
dm_status dm_dtype_parse(const char *s, dm_dtype *out); /* "fp32", "bf16", "fp16" */

/* How the CUDA backend runs the fused element-wise and normalization groups: one generic
 * kernel that interprets each group's ops (DM_ROWS_INTERP), or a
 * kernel generated for each group and compiled at layer creation by NVRTC, every value
 * of a row in registers (DM_ROWS_GEN; with it, attention's groups as fused tensor-core
 * kernels in bf16/fp16, and the qkv bias in the projection's cuBLASLt epilogue), or per
 * group whichever of the two measures faster when the layer is made (DM_ROWS_AUTO).
 * DM_ROWS_DEFAULT: the DMOVE_CUDA_ROWS environment variable (interp, gen or auto) if set,
 * else auto (the fastest on an H100), or interp where the backend is emulated on the host
 * (DMOVE_CUDA_EMULATE=1: auto's timings there say nothing about a GPU). */
typedef enum { DM_ROWS_DEFAULT = 0, DM_ROWS_INTERP, DM_ROWS_GEN, DM_ROWS_AUTO } dm_rows;
const char *dm_rows_name(dm_rows r);
dm_status dm_rows_parse(const char *s, dm_rows *out); /* "interp", "gen", "auto" */

typedef struct {
    dm_schedule schedule;  /* fused (default) or unfused */
    int forward_only;      /* build no backward graph; save nothing for it */
    int threads;           /* 0: all cores */
    int no_reuse;          /* give every tensor its own buffer (debugging, tests) */
    const char *plan;      /* a plan file from `dmove tune` (layouts, algorithms), or NULL */
    dm_device_kind device; /* where steps run: DM_DEVICE_CPU (default) or DM_DEVICE_CUDA */
    dm_dtype dtype;        /* storage on the device: fp32 (default), bf16, fp16 (CUDA only) */
    dm_rows rows;          /* CUDA only: interpreted or generated row kernels */
    int streams;           /* CUDA only: 1, one stream; 2, the groups no later group reads
                            * (weight and bias gradients) on a second stream, overlapping
                            * the groups after them; 0 (default):
                            * the DMOVE_CUDA_STREAMS environment variable if set, else 1 */
    int no_input_grad;     /* no gradient for hidden_states (grad_hidden_states does not
                            * exist): for a layer whose input is data, as the first of a
                            * stack; backward then skips the contraction and the addition
                            * that only it needs */
    int recompute;         /* fused schedule: the backward recomputes attention's
                            * probabilities (Q K^T, mask, softmax, dropout: the same numbers
                            * but for GEMM rounding where a plan gives the two Q K^T other
                            * kernels)
                            * instead of keeping them from the forward: 2 b h j^2 floats
                            * less memory between the passes, for one more Q K^T */
    int unpad;             /* the layer over packed tokens, no work on padding (CPU and
                            * CUDA; not with recompute or a plan file): hidden_states, output and
                            * their gradients hold the real tokens of the b sequences one
                            * after another from row 0 (sequence s from the sum of the
                            * lengths before it), as b x j rows; the input seq_lengths (b:
                            * whole numbers 0..j, at least one token in all; default j)
                            * replaces attention_mask. A step reads the lengths when it
                            * starts and works on their sum of rows: the input rows after
                            * them are not read (the CUDA backend may set those of
                            * hidden_states and grad_output, up to the sum rounded to 64,
                            * to 0: DMOVE_CUDA_LIVE_ROUND_K=0 leaves them), the output rows
                            * (output, grad_hidden_states) set to 0. The results on the real tokens are
                            * the padded layer's with attention_mask 1 on each sequence's
                            * first lengths[s] positions, dropout masks included (keyed by
                            * the padded positions). */
    int attention_op;      /* a padded layer's attention (scores, mask, softmax, dropout,
                            * context) as one fused op: 1 always (refused for a causal layer,
                            * with recompute or a plan file; an unpadded layer's is one op
                            * anyway), -1 never (its ops one by one, as the plan groups
                            * them), 0 (default) where the backend's kernels for it win:
                            * on the CPU, a training layer's fused schedule (not
                            * forward-only, not causal, no recompute or plan file: it keeps
                            * the dropped probabilities out of memory); on CUDA none yet
                            * (measured: its flash kernels lose to the ops on an H200;
                            * DMOVE_CUDA_ATTN_OP=1 makes them CUDA's default where they
                            * apply: bf16/fp16, heads of 64 or 128, j >= 4, not causal, the
                            * fused schedule, no recompute or plan file). The same results,
                            * to rounding. */
} dm_layer_options;

typedef struct dm_layer dm_layer;

/* The options alone, as dm_layer_new checks them (values in range; bf16/fp16, --rows and
 * --streams only with the CUDA device): DM_OK, or the error with its message. */
dm_status dm_layer_options_check(const dm_layer_options *opt);
dm_status dm_layer_new(dm_layer **out, const dm_layer_config *cfg, const dm_layer_options *opt);
/* The options a layer made with *opt runs with (*out): the defaults its device's backend
 * takes from the environment filled in (CUDA: rows from DMOVE_CUDA_ROWS, else auto, or
 * interp where emulated; streams from DMOVE_CUDA_STREAMS, else 2, or 1 emulated).
 * DM_ERR_INVALID_ARG for a bad variable, DM_ERR_UNSUPPORTED for a device this dmove was
 * built without; on any error *out is *opt as given, nothing resolved. out may be opt. */
dm_status dm_layer_options_resolve(const dm_layer_options *opt, dm_layer_options *out);
/* What a layer's backend chose for it, one named value per note: a number (`text` NULL)
 * or a text. The CPU backend has none; the CUDA backend's: row_programs (the plan's row
 * programs), row_programs_generated (of those, run as generated code, rows gen/auto: alone
 * or inside a fused kernel; a bias group a cuBLASLt epilogue absorbed runs nothing and is
 * not counted), attention_fused (attention groups run as one fused tensor-core kernel
 * each, bf16/fp16), attention_flash (unpadded attention groups, forward and backward, on
 * the flash kernels: bf16/fp16, head width 64 or 128), bias_epilogues (contractions adding the next group's bias in a
 * cuBLASLt epilogue), second_stream (groups on the second stream), and the texts
 * gen_unavailable (rows auto: why the generated kernels could not be built, the layer then
 * running the interpreter and cuBLAS; "" if they were built or not asked for),
 * flash_unavailable (why an unpadded attention group runs without the flash kernels, its
 * GEMMs on cuBLAS over padded copies; "" if none does) and gpu (the
 * GPU's name as the driver gives it, "" when emulated). */
typedef struct {
    const char *key;
    double value;
    const char *text;
} dm_layer_note;
/* The layer's notes (*notes valid until dm_layer_free); returns how many. */
int dm_layer_notes(const dm_layer *layer, const dm_layer_note **notes);
/* The number of note `key`, or `otherwise` if the layer has no such note. */
double dm_layer_note_value(const dm_layer *layer, const char *key, double otherwise);
/* The text of note `key`, or "" if the layer has no such text. */
const char *dm_layer_note_text(const dm_layer *layer, const char *key);
void dm_layer_free(dm_layer *layer);

/* Named tensors of the layer, fp32, row-major in the shapes given:
 *   hidden_states (b,j,i), attention_mask (b,j) 1=token 0=padding (default all ones),
 *   grad_output (b,j,i) (default all ones), output (b,j,i), grad_hidden_states (b,j,i),
 *   the parameters under Hugging Face BertLayer names (weights (out,in) as torch.nn.Linear),
 *   and "<parameter>.grad" for each. The pointer stays valid until dm_layer_free. */
dm_status dm_layer_tensor(dm_layer *layer, const char *name, float **data, int *ndim,
                          int64_t shape[4]);
/* The same tensor in the backend's own memory, for callers that keep their data there
 * (a framework's GPU tensors): its first element (on the CPU the pointer dm_layer_tensor
 * gives; with --device cuda an address in the device's memory, valid until dm_layer_free)
 * and its storage type there (the layer's dtype, or fp32 for tensors kept wide), dense
 * in the shape dm_layer_tensor gives. What is written there is the step's input as it
 * is (dm_layer_to_device would overwrite it with the host copy); the layer's passes end
 * with the device's work done. */
dm_status dm_layer_device_tensor(dm_layer *layer, const char *name, void **data, dm_dtype *dtype);
/* One tensor's host copy to the backend's memory (dm_layer_to_device for all inputs and
 * parameters at once). */
dm_status dm_layer_tensor_to_device(dm_layer *layer, const char *name);
int dm_layer_num_params(const dm_layer *layer);
const char *dm_layer_param_name(const dm_layer *layer, int index);
/* BERT initialisation: weights N(0, 0.02) (deterministic from seed), biases 0, LN gamma 1. */
dm_status dm_layer_init_params(dm_layer *layer, uint64_t seed);
dm_status dm_layer_set_seed(dm_layer *layer, uint64_t seed);
/* Training mode (1, the default: dropout at the layer's probability) or evaluation mode
 * (0: no dropout), for its forward passes from then on (the CPU backend; others
 * DM_ERR_UNSUPPORTED). */
dm_status dm_layer_set_training(dm_layer *layer, int training);

enum { DM_PASS_FORWARD = 1, DM_PASS_BACKWARD = 2 };
enum { DM_RUN_ALL = 7 }; /* class mask: bit c runs groups of class c */
dm_status dm_layer_forward(dm_layer *layer);
dm_status dm_layer_backward(dm_layer *layer);
/* Runs the groups of the given passes whose class is in class_mask (1u << dm_op_class);
 * with profiling on, adds each group's time to its pass and class: on the CPU (and the
 * emulated GPU) by the host's clock around each group, on a GPU by CUDA events recorded
 * around each group's own work (no wait after each; the pass waits once at its end). */
dm_status dm_layer_run(dm_layer *layer, int passes, unsigned class_mask);
void dm_layer_profile(dm_layer *layer, int enable);
/* Seconds accumulated since the last reset, [pass 0 fwd / 1 bwd][class]. */
void dm_layer_profile_read(const dm_layer *layer, double secs[2][DM_NUM_CLASSES]);
void dm_layer_profile_reset(dm_layer *layer);
/* The memory a layer holds (bytes, in its storage type): its arena, one allocation
 * (inputs, parameters, their gradients, outputs and every tensor that leaves its fused
 * group), of which `activations` are the intermediates planned by liveness (what fusion
 * saves: a tensor kept inside its group gets none), `parameters` the parameters and
 * `inputs` hidden_states, attention_mask and grad_output (a forward-only model's encoder
 * layers on the CPU hold their activations in one region they share: `arena` is then the
 * rest, `activations` still the plan's); and `scratch`: the CPU
 * executor's per-thread scratch (rows and tiles of the fused groups), or on the GPU the
 * executor's device memory beside the arena (batched groups' temporaries, spilled
 * scratch, column-sum partials, cuBLASLt's workspace; not cuBLAS's or the runtime's own). */
typedef struct {
    size_t arena, activations, parameters, inputs, scratch;
} dm_layer_memory;
void dm_layer_memory_info(const dm_layer *layer, dm_layer_memory *out);
/* flop of the training step by pass and class (from the graph). */
void dm_layer_flop(const dm_layer *layer, double flop[2][DM_NUM_CLASSES]);
/* A human-readable listing of the plan: groups, their ops and tensors. Caller frees. */
dm_status dm_layer_describe(const dm_layer *layer, char **text);
/* The groups of the layer's plan, in the order a step runs them (dm_layer_describe's
 * lines), each with what the roofline needs: its flop (contractions apart from the rest),
 * the bytes it reads (each input from outside the group once) and writes (each output
 * kept in memory once) in the layer's storage type, and its time in the profiled steps
 * since the last dm_layer_profile_reset. A group that runs inside or beside another (a
 * bias in a cuBLASLt epilogue on the GPU; on the CPU a row group in a GEMM's epilogue, a
 * GEMM beside another: `timed_with`) shows no time of its own: it is in that group's. */
typedef struct {
    int pass;                /* 0 forward, 1 backward */
    dm_op_class cls;         /* contraction if it holds one, else normalization if it
                              * holds a reduction, else element-wise */
    int nops;
    char ops[320];           /* its operators' names joined by " + " ("..." if cut) */
    double seconds;
    double contraction_flop, other_flop;
    double bytes_read, bytes_written;
    int timed_with;          /* the group whose time holds this one's, or -1 */
} dm_layer_group;
int dm_layer_num_groups(const dm_layer *layer);
dm_status dm_layer_group_info(const dm_layer *layer, int index, dm_layer_group *out);
/* Its `seconds` alone (0 for an index out of range): cheap, for every profiled step. */
double dm_layer_group_seconds(const dm_layer *layer, int index);
/* Device layers (DM_DEVICE_CUDA): to_device copies the inputs (hidden_states,
 * attention_mask, grad_output) and parameters the user wrote through dm_layer_tensor to
 * the GPU (call it after writing them and before a step; dm_layer_new uploads the
 * defaults); to_host copies the results (output, grad_hidden_states, parameter grads)
 * back (call it after a step, before reading them). No-ops on the CPU. */
dm_status dm_layer_to_device(dm_layer *layer);
dm_status dm_layer_to_host(dm_layer *layer);

/* --- Training a stack of layers (`dmove train`) --------------------------------------- */

/* The optimizer and its learning-rate schedule.
 * AdamW as torch.optim.AdamW (decoupled weight decay, bias-corrected moments, eps outside
 * the square root). LAMB as BERT is pretrained with at scale (You et al. 2019; NVIDIA's
 * FusedLAMB, its defaults): the AdamW direction u = m^ / (sqrt(v^) + eps) + decay * w,
 * scaled per tensor by the trust ratio ||w|| / ||u|| (1 where either norm is 0, and for the
 * tensors that take no weight decay: biases and LayerNorm parameters), w -= lr * ratio * u.
 * Gradients are the mean over `accumulate` micro-batches (one update per `accumulate`
 * dm_trainer_step calls) and, with clip_norm > 0, scaled by min(1, clip_norm / (||g|| +
 * 1e-6)) over all of them together, as torch.nn.utils.clip_grad_norm_ does, before the
 * optimizer sees them.
 * The learning rate rises linearly over `warmup` updates (update s <= warmup takes
 * lr * s / warmup) and then, if `total` > 0, decays to lr_end at update total + 1:
 * update s takes lr_end + (lr - lr_end) * ((total - s + 1) / (total - warmup))^power
 * (power 1: linear, BERT's schedule; Hugging Face's polynomial schedule otherwise), lr_end
 * past total. */
typedef enum { DM_OPT_ADAMW = 0, DM_OPT_LAMB } dm_optimizer;
const char *dm_optimizer_name(dm_optimizer o); /* "adamw", "lamb" */
typedef struct {
    dm_optimizer kind;   /* DM_OPT_ADAMW (default) or DM_OPT_LAMB */
    double lr;           /* peak learning rate (default 1e-4) */
    double beta1, beta2; /* 0.9, 0.999 */
    double eps;          /* 1e-6 (BERT's) */
    double weight_decay; /* 0.01, on weights only: biases and LayerNorm parameters take none */
    int64_t warmup;      /* warm-up updates (default 0) */
    int64_t total;       /* the last update of the decay (default 0: no decay) */
    double power;        /* the decay's power (default 1: linear) */
    double lr_end;       /* the rate the decay ends at (default 0) */
    double clip_norm;    /* global gradient-norm clipping (default 0: none; BERT: 1) */
    int accumulate;      /* micro-batches per update (default 1) */
} dm_optim_config;
void dm_optim_config_default(dm_optim_config *c);
dm_status dm_optim_config_check(const dm_optim_config *c);
/* The learning rate of update number `step` (from 1). */
double dm_optim_lr(const dm_optim_config *c, int64_t step);

/* A stack of `layers` encoder layers (Hugging Face BertEncoder without its embeddings),
 * trained to map hidden_states to target: loss = mean over the tokens the mask keeps and
 * their features of (output - target)^2. Each layer draws its own dropout masks, new each
 * step; the first layer computes no input gradient (no_input_grad; unless a plan is given).
 * Tensors by name (fp32, row-major; the pointer stays valid until dm_trainer_free):
 * hidden_states (b,j,i) the stack's input, attention_mask (b,j) (default all ones), target
 * (b,j,i) (default zeros), output (b,j,i) the last layer's, and for layer l
 * "encoder.layer.<l>.<BertLayer parameter>" with ".grad", ".exp_avg" and ".exp_avg_sq"
 * (the optimizer's moments, AdamW's and LAMB's) after it. The parameters start as the layers make them
 * (dm_trainer_init_params for BERT's initialisation).
 * With opt->device DM_DEVICE_CUDA the whole step runs on the GPU (layer to layer, loss,
 * AdamW over fp32 master weights in 16-bit storage) and these tensors are host copies:
 * hidden_states, attention_mask and target are sent up at every step or forward; output
 * is brought down by dm_trainer_forward and by asking for it; a parameter, gradient or
 * moment is brought down when asked for by name (after a step, ask again: the pointer is
 * the same, its contents are refreshed), and a parameter or moment asked for is sent up
 * again before the next pass (so writes through it count). */
typedef struct dm_trainer dm_trainer;
/* Phases of a step; DM_TRAIN_INPUT: on the GPU, sending the batch, mask and target up (and
 * parameters changed on the host), 0 on the CPU. */
enum { DM_TRAIN_FORWARD = 0, DM_TRAIN_LOSS, DM_TRAIN_BACKWARD, DM_TRAIN_OPTIMIZER, DM_TRAIN_INPUT, DM_TRAIN_NUM_PHASES };
dm_status dm_trainer_new(dm_trainer **out, const dm_layer_config *cfg, int layers,
                         const dm_layer_options *opt, const dm_optim_config *optim);
void dm_trainer_free(dm_trainer *t);
int dm_trainer_layers(const dm_trainer *t);
int64_t dm_trainer_num_params(const dm_trainer *t);
int64_t dm_trainer_step_count(const dm_trainer *t); /* updates taken */
/* A BERT trainer's updates left out so far (kept in its checkpoints): steps whose
 * micro-batches (on every rank) scored no masked position (labelled no example) change
 * nothing but the step count (the schedule and the data go on; the optimizer's bias
 * correction counts the updates taken, as torch.optim does a step GradScaler skips); such
 * a step's loss is 0 and means nothing. */
int64_t dm_trainer_skipped(const dm_trainer *t);
/* The trainer's segments, for profiling them (dm_layer_profile, dm_layer_group_info,
 * dm_layer_flop): a stack's layers (0 .. layers - 1); a whole BERT's embeddings (0), its
 * encoder layers (1 .. layers) and its head (layers + 1). NULL for k out of range. They
 * belong to the trainer: not to be freed, stepped or written through. */
int dm_trainer_num_segments(const dm_trainer *t);
dm_layer *dm_trainer_segment(dm_trainer *t, int k);
/* Micro-batches taken since the last update (0 .. accumulate - 1; 0 when accumulate is 1). */
int dm_trainer_micro(const dm_trainer *t);
/* The global gradient norm of the last update (before clipping; the mean over its
 * micro-batches): computed with --clip-norm or LAMB only, else -1 (also before the first
 * such update). */
double dm_trainer_grad_norm(const dm_trainer *t);
/* The memory the stack holds (bytes): its layers' dm_layer_memory summed (every layer's
 * arena lives through the step: the backward needs what each forward kept), and the
 * optimizer's state (its two moments, and the gradient sums with accumulate > 1). */
void dm_trainer_memory_info(const dm_trainer *t, dm_layer_memory *layers, size_t *optimizer);
/* BERT initialisation of every layer (each from its own seed derived from `seed`); the
 * moments and the step count back to 0. */
dm_status dm_trainer_init_params(dm_trainer *t, uint64_t seed);
dm_status dm_trainer_tensor(dm_trainer *t, const char *name, float **data, int *ndim, int64_t shape[4]);
/* Forward and loss only (the masks of the next step; parameters unchanged). */
dm_status dm_trainer_forward(dm_trainer *t, double *loss);
/* One training step on the batch written: forward, loss, backward, and the update (with
 * accumulate k > 1: the gradient added up, the update after every k-th call; the dropout
 * masks are new each call). A loss that is not finite stops it before the update
 * (DM_ERR_INVALID_ARG, the parameters unchanged); so does a global gradient norm that is
 * not finite (computed with clipping or LAMB), and the window of micro-batches then starts
 * over. */
dm_status dm_trainer_step(dm_trainer *t, double *loss);
dm_status dm_trainer_set_optim(dm_trainer *t, const dm_optim_config *optim);
/* What the run trains on (e.g. "teacher scale 5" or "data samples.safetensors"; at most
 * 127 characters): recorded in checkpoints, and a checkpoint of another run is not resumed. */
dm_status dm_trainer_set_run_tag(dm_trainer *t, const char *tag);
/* The same run's tag as a version-1 checkpoint (an older dmove) recorded it: such a file
 * with that tag is resumed (note NULL), or refused with note (the run changed since in a
 * way it cannot continue: what to do instead). */
dm_status dm_trainer_set_run_tag_v1(dm_trainer *t, const char *tag, const char *note);
/* flop of one training step of the stack, forward and backward (dm_layer_flop summed over
 * the layers; the loss and the optimizer, a few flop per element, not counted). */
double dm_trainer_step_flop(const dm_trainer *t);
/* Seconds spent since dm_trainer_new, by phase (DM_TRAIN_FORWARD ...). */
void dm_trainer_times(const dm_trainer *t, double secs[DM_TRAIN_NUM_PHASES]);
/* A checkpoint: every parameter, both moments, the step count and the configuration, in
 * one safetensors file with a checksum, written atomically (temporary file, rename).
 * Between updates (dm_trainer_micro > 0) it is the state after the last update: the
 * gradient sums of the micro-batches since are not in it. */
dm_status dm_trainer_save(const dm_trainer *t, const char *path);
/* Restores a checkpoint of dm_trainer_save: the file is validated whole (format, the
 * architecture against this trainer's, shapes, checksum) before anything changes, and
 * the run's settings must be this trainer's (dropout, seed, batch, seq, run tag, the optimizer
 * but for its last step `total`): DM_ERR_INVALID_ARG names the one that differs. */
dm_status dm_trainer_load(dm_trainer *t, const char *path);
/* (Under ranks, dm_trainer_set_dist, this and the loads below are collectives: once loaded,
 * every rank must hold the same step and parameters, each having read its own copy of the
 * file, else DM_ERR_INVALID_ARG on every rank names the rank that differs.) */
/* Takes the parameters alone from a safetensors file with Hugging Face BertEncoder names
 * ("encoder.layer.<l>.<parameter>", optionally under "bert.", "0.auto_model." or
 * "model.", LayerNorm parameters also as gamma and beta as in the original BERT
 * checkpoints; f32, f64, f16 or bf16), e.g. a pretrained BERT's model.safetensors; moments
 * and step count back to 0. Validated whole before anything changes. */
dm_status dm_trainer_load_params(dm_trainer *t, const char *path);
/* The same from the file's layers first .. first + layers - 1 (a model's upper layers,
 * or its lower ones with first 0: any contiguous run of them).
 * A BERT trainer (dm_trainer_new_bert) takes the whole model: `path` is a Hugging Face
 * model directory (its model.safetensors, and config.json if there, checked against the
 * tensors: a contradiction names the value) or a safetensors file; every parameter is
 * found by its name (bert.embeddings.*, bert.encoder.layer.<first + l>.* for layer l,
 * cls.predictions.*) under the prefix the file keeps the encoder under ("bert.", none,
 * "0.auto_model.", "model."), gamma/beta as above, any float dtype. The embeddings and
 * the encoder must be there (DM_ERR_NOT_FOUND names the missing tensor); head parameters
 * the file lacks (a BertModel checkpoint has no cls.*) keep their values (call
 * dm_trainer_init_params first) and are listed by dm_trainer_load_note. */
dm_status dm_trainer_load_layers(dm_trainer *t, const char *path, int first);
/* The same, a classifier's classifier.* left as it is (a pretrained model fine-tuned for
 * classes of its own: the classifier starts new, whatever the file holds); the pooler is
 * taken when the file has it. */
dm_status dm_trainer_load_body(dm_trainer *t, const char *path, int first);
/* After a load of a BERT trainer: the head parameters the file did not hold, left as they
 * were, comma-separated ("" when it held them all; lives as long as t). */
const char *dm_trainer_load_note(const dm_trainer *t);

/* --- A whole BERT: masked-language-model pretraining (BertForMaskedLM) --------------- */

/* The MLM head's decoder (logits = t . W^T + bias, m x vocabulary) and its cross-entropy:
 * FUSED, one operator that walks the vocabulary in chunks and never writes the logits
 * whole (the head's arena an m x vocab tensor smaller: BERT-base, m = 820 masked
 * positions, 330 -> 230 MB; but its backward computes the logits again, one GEMM more);
 * UNFUSED, the GEMM, the bias add and the cross-entropy apart; AUTO, the faster as
 * measured: unfused (BERT-base's head forward and backward on a 2-core EPYC: fused 0.99x
 * the time at m = 205, 1.26x at m = 820; on a GPU both run, the fused kernel not yet
 * timed against the unfused one, so auto stays unfused there too). */
typedef enum { DM_XENT_AUTO = 0, DM_XENT_FUSED, DM_XENT_UNFUSED } dm_xent_mode;
const char *dm_xent_mode_name(dm_xent_mode x);
/* -1 for an unknown name ("auto", "on", "off"; "fused", "unfused") */
int dm_xent_mode_parse(const char *s);

/* The model around the encoder layers: embeddings (word, position, token type, LayerNorm,
 * dropout) and the MLM head (dense, activation, LayerNorm, decoder tied to the word table,
 * bias), scored at the masked positions only, with the cross-entropy fused. */
typedef struct {
    int64_t vocab;       /* vocab_size */
    int64_t positions;   /* max_position_embeddings (at least the sequence length) */
    int64_t types;       /* type_vocab_size */
    int64_t pad_id;      /* the padding token: its word row starts at 0 and takes no gradient
                          * from the lookup (nn.Embedding's padding_idx; the tied decoder's
                          * gradient and weight decay still reach it, as in transformers) */
    int64_t predictions; /* masked positions scored per batch, ceil(predictions / b) at most
                          * in each sequence (0: b * ceil(j / 5); the masked positions past
                          * a sequence's share are left out and counted) */
    dm_xent_mode xent;   /* the MLM head's decoder and cross-entropy (dm_xent_mode) */
    int64_t num_labels;  /* 0: BertForMaskedLM; 2 or more: BertForSequenceClassification with
                          * that many classes (predictions then unused; 1, regression, is
                          * refused) */
} dm_bert_model;
/* A trainer of a whole BertForMaskedLM: the layers of cfg (its batch, seq, sizes, dropout,
 * seed), `layers` of them, and the model around them; the optimizer over every parameter
 * (the tied table once). Its tensors by Hugging Face names (bert.embeddings.*,
 * bert.encoder.layer.<l>.*, cls.predictions.*; ".grad", ".exp_avg", ".exp_avg_sq").
 * The CPU and the CUDA backends run it. "cls.predictions.decoder.weight" is the
 * word table itself. */
dm_status dm_trainer_new_bert(dm_trainer **out, const dm_layer_config *cfg, int layers, const dm_bert_model *bert,
                              const dm_layer_options *opt, const dm_optim_config *optim);
/* 1 for a trainer of dm_trainer_new_bert. */
int dm_trainer_is_bert(const dm_trainer *t);
/* Whether each forward pass counts the scored positions the argmax predicts
 * (dm_mlm_stats.correct; on by default). Counting reads the logits (predictions x
 * vocabulary) on the host: on a GPU, a copy a run that does not need the figure can leave
 * out (off: correct is -1). */
dm_status dm_trainer_set_count_correct(dm_trainer *t, int on);
/* The next (micro-)batch: input_ids, token_type_ids (NULL: 0), attention_mask (1 token, 0
 * padding; NULL: all 1) and labels (the original id at a masked position, negative
 * elsewhere), b * j each. Ids outside the vocabulary are refused. */
dm_status dm_trainer_set_mlm_batch(dm_trainer *t, const int32_t *input_ids, const int32_t *token_type_ids,
                                   const float *attention_mask, const int32_t *labels);
/* The MLM step's figures, after dm_trainer_step (or dm_trainer_forward): the positions
 * scored, how many of them the argmax predicted, and those left out (past predictions). */
typedef struct {
    int64_t scored, correct, dropped;
} dm_mlm_stats;
/* The loss of the batch set, in evaluation mode (no dropout), nothing changed: a held-out
 * evaluation (its figures by dm_trainer_mlm_stats). */
dm_status dm_trainer_evaluate(dm_trainer *t, double *loss);
/* A BERT trainer's model as Hugging Face saves a BertForMaskedLM: DIR/model.safetensors
 * (the parameters alone, fp32, under its names; the tied decoder left out, as
 * save_pretrained does) and DIR/config.json (model_type bert, the sizes, eps, activation,
 * dropout, vocabulary, positions, token types, padding id), both written atomically;
 * transformers' BertForMaskedLM.from_pretrained(DIR) loads it with no key missing or left
 * over. The optimizer's state stays in the checkpoint (dm_trainer_save). */
dm_status dm_trainer_export(const dm_trainer *t, const char *dir);
/* The step's or evaluation's figures; for a classifier: the labelled sequences scored and
 * how many of them the argmax predicted (dropped 0). */
dm_status dm_trainer_mlm_stats(const dm_trainer *t, dm_mlm_stats *out);
/* Exports the model of a checkpoint of a BERT trainer (dm_trainer_save of a trainer of
 * dm_trainer_new_bert) as dm_trainer_export does: the checkpoint validated whole (format,
 * every tensor, the checksum), the model rebuilt from its metadata, DIR/model.safetensors
 * and DIR/config.json written atomically. The same files as dm_trainer_export of the
 * trainer that saved it. */
dm_status dm_checkpoint_export(const char *checkpoint, const char *dir);
/* The sizes of the BERT a checkpoint holds (vocab, positions, types, pad_id, num_labels),
 * from its header alone (its data not read, so not validated). */
dm_status dm_checkpoint_bert_sizes(const char *checkpoint, dm_bert_model *bm);

/* --- Inference: hidden states and sentence embeddings (BertModel) -------------------- */

/* A BERT without a head (Hugging Face BertModel's embeddings and encoder, no pooler), run
 * forward only: no dropout, no backward, no gradients held. For a batch of b sequences of
 * j tokens (cfg->batch, cfg->seq; shorter ones padded, their attention mask 0 there) it
 * gives the last layer's hidden states and sentence embeddings pooled from them:
 * DM_POOL_MEAN, the mean over the tokens the attention mask keeps (sentence-transformers'
 * default; a row without any: zeros), or DM_POOL_CLS, the first token's vector; with
 * normalize, each divided by its L2 norm (sentence-transformers' Normalize: by max(norm,
 * 1e-12)). cfg's dropout is ignored (0); bert->predictions is unused.
 * Example (the sizes from a config.json by dm_hf_config_read and dm_hf_config_layer):
 *     dm_embedder *e;  dm_embedder_new(&e, &cfg, layers, &bert, NULL);
 *     dm_embedder_load(e, "all-MiniLM-L6-v2/");        (a model directory)
 *     dm_embedder_run(e, ids, NULL, mask);              (b * j each)
 *     dm_embedder_pool(e, DM_POOL_MEAN, 1, emb);        (b * hidden floats) */
typedef struct dm_embedder dm_embedder;
typedef enum { DM_POOL_MEAN = 0, DM_POOL_CLS } dm_pooling;
const char *dm_pooling_name(dm_pooling p);           /* "mean", "cls" */
dm_status dm_pooling_parse(const char *s, dm_pooling *out);
/* opt: threads, device (NULL: the defaults); forward_only is implied. */
dm_status dm_embedder_new(dm_embedder **out, const dm_layer_config *cfg, int layers, const dm_bert_model *bert,
                         const dm_layer_options *opt);
void dm_embedder_free(dm_embedder *e);
/* BERT's initialisation (tests; a real model loads its weights). */
dm_status dm_embedder_init_params(dm_embedder *e, uint64_t seed);
/* The weights of a Hugging Face model directory or safetensors file, as
 * dm_trainer_load_layers takes them for a BERT trainer (from its layer `first`; no head is
 * read: a pooler or MLM head in the file is ignored). */
dm_status dm_embedder_load(dm_embedder *e, const char *path, int first);
/* The same parameters as another encoder of the same model (another batch or length). */
dm_status dm_embedder_copy_params(dm_embedder *dst, const dm_embedder *src);
/* A parameter by its Hugging Face name (bert.embeddings.*, bert.encoder.layer.<l>.*),
 * fp32 host memory: writes count from the next run. */
dm_status dm_embedder_tensor(dm_embedder *e, const char *name, float **data, int *ndim, int64_t shape[4]);
/* Runs the batch: input_ids, token_type_ids (NULL: 0) and attention_mask (1 token, 0
 * padding; NULL: all 1), b * j each; ids outside the vocabulary refused. */
dm_status dm_embedder_run(dm_embedder *e, const int32_t *input_ids, const int32_t *token_type_ids,
                         const float *attention_mask);
/* After a run: the last layer's hidden states (b, j, hidden), valid until the next run. */
dm_status dm_embedder_hidden(dm_embedder *e, const float **hidden);
/* After a run: the sentence embeddings (b, hidden) into out. */
dm_status dm_embedder_pool(dm_embedder *e, dm_pooling pooling, int normalize, float *out);
/* The sizes it was made with. */
int64_t dm_embedder_batch(const dm_embedder *e);
int64_t dm_embedder_seq(const dm_embedder *e);
int64_t dm_embedder_hidden_size(const dm_embedder *e);

/* --- A whole BERT: sequence classification (BertForSequenceClassification) ----------- */

/* A trainer of dm_trainer_new_bert with bert->num_labels = C >= 2 is a
 * BertForSequenceClassification: the embeddings and layers as above, then transformers'
 * pooler (pooled = tanh(dense(hidden[:, 0]))), dropout (hidden_dropout_prob: cfg's) and the
 * classifier (C x hidden, bias), with the cross-entropy averaged over the sequences that have
 * a label. Its head's tensors: bert.pooler.dense.{weight,bias}, classifier.{weight,bias}
 * (with ".grad", ".exp_avg", ".exp_avg_sq"). dm_trainer_step, dm_trainer_evaluate,
 * dm_trainer_mlm_stats (scored: the labelled sequences, correct: the argmax hits),
 * dm_trainer_save / load work as for the MLM model; dm_trainer_export writes a
 * BertForSequenceClassification (config.json with num_labels and, when named,
 * id2label / label2id). */
/* The number of classes; 0 for any other trainer. */
int64_t dm_trainer_num_labels(const dm_trainer *t);
/* The next (micro-)batch of a classifier: input_ids, token_type_ids (NULL: 0),
 * attention_mask (NULL: all 1), b * j each (each sequence's first token is its [CLS]), and
 * labels (b: the class, 0 .. C - 1; negative: the sequence is not scored). A label of C or
 * more is refused (DM_ERR_INVALID_ARG naming it), as ids outside the vocabulary are. */
dm_status dm_trainer_set_cls_batch(dm_trainer *t, const int32_t *input_ids, const int32_t *token_type_ids,
                                   const float *attention_mask, const int32_t *labels);
/* The classes' names (C strings, copied; each non-empty UTF-8, else DM_ERR_INVALID_ARG)
 * for dm_trainer_export's id2label / label2id; without them: LABEL_0, LABEL_1, ... as
 * transformers names them. */
dm_status dm_trainer_set_label_names(dm_trainer *t, const char *const *names);

/* --- Data parallelism (MPI between processes, NCCL between GPUs) ------------------------
 *
 * Launched by `mpirun -np N` (or any launcher of an MPI the library was built with), each
 * of the N processes is a rank: it trains on its own part of every global batch, and the
 * gradients are summed over the ranks before each update, so every rank takes the same
 * update and holds the same parameters. */
typedef struct dm_dist dm_dist;
/* Joins the launch this process is part of: MPI initialised (threads: the reductions run
 * on a thread of their own) when a launcher's environment is present, else a world of one
 * process without MPI. A dmove built without MPI that finds itself one of several ranks is
 * refused (DM_ERR_UNSUPPORTED, saying how to build it with MPI). timeout_s (> 0): how long
 * a collective may wait for the other ranks before it fails (a rank died or hangs); 0: the
 * DMOVE_DIST_TIMEOUT environment variable's, else 600 s. */
dm_status dm_dist_start(dm_dist **out, double timeout_s);
/* The number of processes a launcher's environment says this one is part of (mpirun,
 * srun, hydra: 1 or more), or 0 when none: for commands that run alone to refuse a launch
 * of several. */
int dm_dist_launch_size(void);
/* Leaves the launch (MPI_Finalize); NULL: nothing. */
void dm_dist_finish(dm_dist *d);
/* Stops every rank of the launch now (MPI_Abort), after a failure on this one that the
 * others would otherwise wait for; a world of one: nothing. */
void dm_dist_abort(dm_dist *d, int code);
int dm_dist_rank(const dm_dist *d);        /* 0 .. size - 1; NULL: 0 */
int dm_dist_size(const dm_dist *d);        /* the ranks; NULL: 1 */
int dm_dist_local_rank(const dm_dist *d);  /* among the ranks of this machine (picks the GPU) */
/* 1 when this dmove was built with MPI (with NCCL, for the CUDA backend), else 0. */
int dm_dist_have_mpi(void);
int dm_dist_have_nccl(void);
/* What this dmove runs data-parallel with, for --version: "MPI (<the library's version
 * line>)", "+ NCCL <version>" where built, or how to build it with MPI. */
const char *dm_dist_build_info(void);
/* Every rank calls it with its own value of `what` (a text): fails on every rank when one
 * differs from rank 0's, naming the rank and both values (DM_ERR_INVALID_ARG). */
dm_status dm_dist_agree(dm_dist *d, const char *what, const char *value);
/* Sums n doubles over the ranks in place (every rank gets the sums). */
dm_status dm_dist_sum(dm_dist *d, double *v, int n);
/* Waits until every rank is here. */
dm_status dm_dist_barrier(dm_dist *d);
/* The trainer trains as one rank of d (NULL or a world of one: alone): its batches are its
 * rank's part of the global batch; the losses' normalisers (masked positions, labelled
 * sequences, kept tokens) and the losses and counts it reports are the global batch's;
 * the gradients are summed over the ranks as the backward pass produces them, so that N
 * ranks with batch b take the update one process takes with batch N * b (dropout aside:
 * each rank's masks are its own). Set before the first step; d must outlive the trainer. */
dm_status dm_trainer_set_dist(dm_trainer *t, dm_dist *d);
/* ZeRO stage 1 (stage 0: off, the default): with several ranks (after
 * dm_trainer_set_dist), each rank keeps and updates the optimizer's moments of its shard of
 * the parameters only (whole tensors, cut in slot order at equal shares): the gradients
 * are summed onto each tensor's rank (reduce, not all-reduce), which updates it and sends
 * it to the others (broadcast): the moments' memory per rank falls by the number of
 * ranks, the bytes moved per step stay those of an all-reduce. Checkpoints hold every
 * moment still (gathered to rank 0, which writes the file), so a run resumes with any
 * number of ranks, sharded or not. Alone: nothing to shard, nothing changes. */
dm_status dm_trainer_set_zero(dm_trainer *t, int stage);
/* The gradient reductions' seconds since dm_trainer_new: busy (the reduction thread or
 * stream working) and exposed (the step waiting for them after its backward pass); busy -
 * exposed was hidden behind the backward pass. */
void dm_trainer_reduce_times(const dm_trainer *t, double *busy, double *exposed);

#ifdef __cplusplus
}
#endif
#endif
