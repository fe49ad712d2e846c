/* hfconfig.c: Hugging Face BERT models on disk: config.json (BertConfig) read, checked and
 * written, where a model's files are, and its tensors checked against its config. What a
 * config says is never asked for again (dmove_tools.h). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/file.h"
#include "core/safetensors.h"
#include "core/status.h"
#include "core/strbuf.h"
#include "core/tensorfile.h"
#include "dmove_tools.h"
#include "train/hfload.h"

#define MAX_CONFIG_BYTES (1 << 26) /* a classifier's id2label of many classes fits */

void dm_hf_config_default(dm_hf_config *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->vocab_size = 30522;
    c->hidden_size = 768;
    c->num_hidden_layers = 12;
    c->num_attention_heads = 12;
    c->intermediate_size = 3072;
    c->max_position_embeddings = 512;
    c->type_vocab_size = 2;
    c->pad_token_id = 0;
    c->layer_norm_eps = 1e-12;
    c->hidden_dropout_prob = 0.1;
    c->attention_probs_dropout_prob = 0.1;
    c->classifier_dropout = NAN;
    c->tie_word_embeddings = 1;
    c->act = DM_ACT_GELU;
}

/* Key `k` of the config as an integer in [lo, hi] into *v (absent: *v unchanged). */
static dm_status get_int(const cJSON *root, const char *path, const char *k, int64_t lo, int64_t hi, int64_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, k);
    if (!x || cJSON_IsNull(x)) return DM_OK;
    const double d = cJSON_IsNumber(x) ? x->valuedouble : NAN;
    if (!(d >= (double)lo && d <= (double)hi) || d != floor(d))
        return dm_fail(DM_ERR_FORMAT, "%s: \"%s\" must be a whole number from %" PRId64 " to %" PRId64, path, k, lo,
                       hi);
    *v = (int64_t)d;
    return DM_OK;
}

static dm_status get_real(const cJSON *root, const char *path, const char *k, double lo, double hi, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, k);
    if (!x || cJSON_IsNull(x)) return DM_OK;
    const double d = cJSON_IsNumber(x) ? x->valuedouble : NAN;
    if (!(d >= lo && d <= hi)) return dm_fail(DM_ERR_FORMAT, "%s: \"%s\" must be a number from %g to %g", path, k, lo, hi);
    *v = d;
    return DM_OK;
}

/* A string key: NULL when absent; DM_ERR_FORMAT when not a string. */
static dm_status get_str(const cJSON *root, const char *path, const char *k, const char **v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(root, k);
    *v = NULL;
    if (!x || cJSON_IsNull(x)) return DM_OK;
    if (!cJSON_IsString(x)) return dm_fail(DM_ERR_FORMAT, "%s: \"%s\" must be a string", path, k);
    *v = x->valuestring;
    return DM_OK;
}

/* The keys that say what model it is and which variant of BERT. */
static dm_status read_kind(const cJSON *root, const char *path, dm_hf_config *c) {
    const char *s;
    DM_TRY(get_str(root, path, "model_type", &s));
    if (s && strcmp(s, "bert") != 0)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: model_type \"%s\": dmove trains BERT models (model_type \"bert\")",
                       path, s);
    DM_TRY(get_str(root, path, "position_embedding_type", &s));
    if (s && strcmp(s, "absolute") != 0)
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: position_embedding_type \"%s\": dmove has absolute position "
                       "embeddings only", path, s);
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "is_decoder");
    if (cJSON_IsTrue(dec))
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: is_decoder is true: dmove trains encoders (a causal encoder "
                       "layer is `--causal`, but not a BERT decoder with cross-attention)", path);
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(root, "add_cross_attention")))
        return dm_fail(DM_ERR_UNSUPPORTED, "%s: add_cross_attention is true: dmove's layers are encoder layers, "
                       "without cross-attention", path);
    DM_TRY(get_str(root, path, "hidden_act", &s));
    if (s) {
        /* transformers' names of the same functions: the erf GELU, its tanh form, ReLU */
        if (!strcmp(s, "gelu") || !strcmp(s, "gelu_python")) c->act = DM_ACT_GELU;
        else if (!strcmp(s, "gelu_new") || !strcmp(s, "gelu_pytorch_tanh") || !strcmp(s, "gelu_fast") ||
                 !strcmp(s, "gelu_python_tanh") || !strcmp(s, "gelu_accurate"))
            c->act = DM_ACT_GELU_TANH;
        else if (!strcmp(s, "relu")) c->act = DM_ACT_RELU;
        else
            return dm_fail(DM_ERR_UNSUPPORTED, "%s: hidden_act \"%s\": dmove has gelu (gelu_python), gelu_new "
                           "(gelu_pytorch_tanh, gelu_fast, gelu_accurate) and relu", path, s);
    }
    /* tie_word_embeddings: checked as a boolean; what counts is the file's decoder, whether
     * it is the word table (hfload.c's check_tied) */
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (tie && !cJSON_IsNull(tie) && !cJSON_IsBool(tie))
        return dm_fail(DM_ERR_FORMAT, "%s: \"tie_word_embeddings\" must be true or false", path);
    c->tie_word_embeddings = !cJSON_IsFalse(tie);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    if (cJSON_IsArray(arch) && cJSON_GetArraySize(arch) > 0) {
        const cJSON *a0 = cJSON_GetArrayItem(arch, 0);
        if (!cJSON_IsString(a0)) return dm_fail(DM_ERR_FORMAT, "%s: \"architectures\" must list strings", path);
        snprintf(c->architecture, sizeof c->architecture, "%s", a0->valuestring);
    } else if (arch && !cJSON_IsNull(arch) && !cJSON_IsArray(arch)) {
        return dm_fail(DM_ERR_FORMAT, "%s: \"architectures\" must be a list", path);
    }
    return DM_OK;
}

static dm_status read_sizes(const cJSON *root, const char *path, dm_hf_config *c) {
    DM_TRY(get_int(root, path, "vocab_size", 1, INT32_MAX, &c->vocab_size));
    DM_TRY(get_int(root, path, "hidden_size", 1, 1 << 20, &c->hidden_size));
    DM_TRY(get_int(root, path, "num_hidden_layers", 1, 1024, &c->num_hidden_layers));
    DM_TRY(get_int(root, path, "num_attention_heads", 1, 1 << 16, &c->num_attention_heads));
    DM_TRY(get_int(root, path, "intermediate_size", 1, 1 << 22, &c->intermediate_size));
    DM_TRY(get_int(root, path, "max_position_embeddings", 1, 1 << 24, &c->max_position_embeddings));
    DM_TRY(get_int(root, path, "type_vocab_size", 1, 1 << 16, &c->type_vocab_size));
    DM_TRY(get_int(root, path, "pad_token_id", 0, INT32_MAX, &c->pad_token_id));
    DM_TRY(get_real(root, path, "layer_norm_eps", 0.0, 1.0, &c->layer_norm_eps));
    DM_TRY(get_real(root, path, "hidden_dropout_prob", 0.0, 0.999, &c->hidden_dropout_prob));
    DM_TRY(get_real(root, path, "attention_probs_dropout_prob", 0.0, 0.999, &c->attention_probs_dropout_prob));
    DM_TRY(get_real(root, path, "classifier_dropout", 0.0, 1.0, &c->classifier_dropout));
    if (c->hidden_size % c->num_attention_heads)
        return dm_fail(DM_ERR_FORMAT, "%s: hidden_size %" PRId64 " is not divisible by num_attention_heads %" PRId64,
                       path, c->hidden_size, c->num_attention_heads);
    if (c->pad_token_id >= c->vocab_size)
        return dm_fail(DM_ERR_FORMAT, "%s: pad_token_id %" PRId64 " is past the vocabulary (vocab_size %" PRId64 ")",
                       path, c->pad_token_id, c->vocab_size);
    if (!(c->layer_norm_eps > 0.0))
        return dm_fail(DM_ERR_FORMAT, "%s: layer_norm_eps must be positive", path);
    return DM_OK;
}

static int cmp_key(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A key that appears twice in one object of the tree, or NULL; *oom set when memory ran
 * out (the keys of an object are sorted: a 1 MB config of one object stays fast). */
static const char *duplicate_key(const cJSON *o, int *oom) {
    if (cJSON_IsObject(o)) {
        size_t n = 0;
        for (const cJSON *a = o->child; a; a = a->next) n++;
        const char **keys = n > 1 ? malloc(n * sizeof *keys) : NULL;
        if (n > 1 && !keys) {
            *oom = 1;
            return NULL;
        }
        size_t m = 0;
        for (const cJSON *a = o->child; a && keys; a = a->next)
            if (a->string) keys[m++] = a->string;
        const char *twice = NULL;
        if (m > 1) qsort(keys, m, sizeof *keys, cmp_key);
        for (size_t k = 1; k < m && !twice; k++)
            if (!strcmp(keys[k - 1], keys[k])) twice = keys[k];
        free(keys);
        if (twice) return twice;
    }
    for (const cJSON *a = o ? o->child : NULL; a; a = a->next) {
        const char *d = duplicate_key(a, oom);
        if (d || *oom) return d;
    }
    return NULL;
}

dm_status dm_hf_config_read(const char *path, dm_hf_config *out) {
    if (!path || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_hf_config_read: NULL argument");
    char file[4096];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if ((size_t)snprintf(file, sizeof file, "%s/config.json", path) >= sizeof file)
            return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", path);
        if (stat(file, &sb) != 0)
            return dm_fail(DM_ERR_IO, "'%s' has no config.json: a Hugging Face model directory holds its "
                           "configuration there", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    char *text = NULL;
    DM_TRY(dm_read_file(file, MAX_CONFIG_BYTES, &text, NULL));
    if (!strncmp(text, "\xEF\xBB\xBF", 3)) {
        free(text);
        return dm_fail(DM_ERR_FORMAT, "%s starts with a UTF-8 byte-order mark, which transformers' JSON reader "
                       "refuses: save it without one", file);
    }
    /* the whole text one object: what follows it (transformers refuses that too) is an error */
    cJSON *root = cJSON_ParseWithOpts(text, NULL, 1);
    free(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return dm_fail(DM_ERR_FORMAT, "%s: not one JSON object (a model's config.json is one)", file);
    }
    int oom = 0;
    const char *twice = duplicate_key(root, &oom);
    if (oom) {
        cJSON_Delete(root);
        return dm_fail(DM_ERR_OOM, "out of memory reading %s", file);
    }
    if (twice) {
        dm_status d = dm_fail(DM_ERR_FORMAT, "%s: the key \"%.64s\" appears twice (which one counts is "
                              "ambiguous: transformers takes the last): keep one", file, twice);
        cJSON_Delete(root);
        return d;
    }
    dm_hf_config c;
    dm_hf_config_default(&c);
    dm_status s = read_kind(root, file, &c);
    if (s == DM_OK) s = read_sizes(root, file, &c);
    cJSON_Delete(root);
    if (s == DM_OK) *out = c;
    return s;
}

dm_status dm_hf_config_write(const dm_hf_config *c, const char *architecture, const char *path) {
    if (!c || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_hf_config_write: NULL argument");
    dm_sbuf b = {0};
    DM_TRY(dm_hf_config_text(c, architecture, &b));
    const size_t len = b.n;
    char *text = dm_sb_done(&b);
    if (!text) return dm_fail(DM_ERR_OOM, "out of memory writing '%s'", path);
    dm_status s = dm_write_file_atomic(path, text, len);
    free(text);
    return s;
}

dm_status dm_hf_config_text(const dm_hf_config *c, const char *architecture, dm_sbuf *out) {
    const char *arch = architecture ? architecture : c->architecture;
    static const char *const act[3] = {"gelu", "gelu_new", "relu"};
    char eps[32], hd[32], ad[32];
    dm_fmt_exact(eps, sizeof eps, c->layer_norm_eps);
    dm_fmt_exact(hd, sizeof hd, c->hidden_dropout_prob);
    dm_fmt_exact(ad, sizeof ad, c->attention_probs_dropout_prob);
    dm_sbuf b = {0};
    dm_sb_printf(&b, "{\n");
    if (arch && *arch) {
        dm_sb_printf(&b, "  \"architectures\": [\"");
        for (const char *q = arch; *q; q++) /* a class name: letters, digits, _ */
            if ((*q >= 'A' && *q <= 'Z') || (*q >= 'a' && *q <= 'z') || (*q >= '0' && *q <= '9') || *q == '_')
                dm_sb_printf(&b, "%c", *q);
        dm_sb_printf(&b, "\"],\n");
    }
    dm_sb_printf(&b,
                 "  \"model_type\": \"bert\",\n  \"vocab_size\": %" PRId64 ",\n  \"hidden_size\": %" PRId64
                 ",\n  \"num_hidden_layers\": %" PRId64 ",\n  \"num_attention_heads\": %" PRId64
                 ",\n  \"intermediate_size\": %" PRId64 ",\n  \"hidden_act\": \"%s\",\n"
                 "  \"hidden_dropout_prob\": %s,\n  \"attention_probs_dropout_prob\": %s,\n"
                 "  \"max_position_embeddings\": %" PRId64 ",\n  \"type_vocab_size\": %" PRId64
                 ",\n  \"layer_norm_eps\": %s,\n  \"pad_token_id\": %" PRId64
                 ",\n  \"position_embedding_type\": \"absolute\",\n  \"tie_word_embeddings\": true,\n"
                 "  \"initializer_range\": 0.02\n}\n",
                 c->vocab_size, c->hidden_size, c->num_hidden_layers, c->num_attention_heads, c->intermediate_size,
                 act[(unsigned)c->act < 3 ? c->act : 0], hd, ad, c->max_position_embeddings, c->type_vocab_size, eps,
                 c->pad_token_id);
    *out = b;
    return DM_OK;
}

dm_status dm_hf_config_layer(const dm_hf_config *c, dm_layer_config *cfg) {
    if (!c || !cfg) return dm_fail(DM_ERR_INVALID_ARG, "dm_hf_config_layer: NULL argument");
    if (c->hidden_dropout_prob != c->attention_probs_dropout_prob)
        return dm_fail(DM_ERR_UNSUPPORTED, "hidden_dropout_prob %g and attention_probs_dropout_prob %g differ: "
                       "dmove's layer has one dropout probability for all three of its dropouts",
                       c->hidden_dropout_prob, c->attention_probs_dropout_prob);
    cfg->hidden = c->hidden_size;
    cfg->heads = c->num_attention_heads;
    cfg->ffn = c->intermediate_size;
    cfg->eps = c->layer_norm_eps;
    cfg->act = c->act;
    cfg->dropout = c->hidden_dropout_prob;
    return DM_OK;
}

dm_status dm_hf_model_files(const char *path, char *weights, size_t wn, char *config, size_t cn) {
    if (!path || !weights || !config || !wn || !cn)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_hf_model_files: NULL argument");
    weights[0] = config[0] = 0;
    struct stat sb;
    if (stat(path, &sb) != 0) return dm_fail(DM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    size_t dirlen;
    if (S_ISDIR(sb.st_mode)) {
        if ((size_t)snprintf(weights, wn, "%s/model.safetensors", path) >= wn)
            return dm_fail(DM_ERR_INVALID_ARG, "path too long: '%s'", path);
        char index[4096];
        snprintf(index, sizeof index, "%s.index.json", weights);
        if (stat(weights, &sb) == 0 && S_ISDIR(sb.st_mode))
            return dm_fail(DM_ERR_IO, "'%s' is a directory, not a safetensors file", weights);
        if (stat(weights, &sb) != 0 && stat(index, &sb) == 0)
            return dm_fail(DM_ERR_UNSUPPORTED, "'%s' holds a sharded checkpoint (model.safetensors.index.json and "
                           "its shards): dmove reads one model.safetensors: save the model in one file, "
                           "save_pretrained(DIR, max_shard_size=\"100GB\")", path);
        if (stat(weights, &sb) != 0) {
            snprintf(index, sizeof index, "%s/pytorch_model.bin", path);
            if (stat(index, &sb) == 0)
                return dm_fail(DM_ERR_UNSUPPORTED, "'%s' has a pytorch_model.bin and no model.safetensors: dmove reads "
                               "safetensors: save the model again with transformers (save_pretrained writes "
                               "model.safetensors)", path);
            return dm_fail(DM_ERR_IO, "'%s' has no model.safetensors: give a model directory as transformers' "
                           "save_pretrained writes it, or the model.safetensors file", path);
        }
        dirlen = strlen(path);
    } else {
        const size_t pl = strlen(path);
        if (pl >= 5 && !strcmp(path + pl - 5, ".json"))
            return dm_fail(DM_ERR_INVALID_ARG, "'%s' is a JSON file: give the model's directory (its config.json "
                           "and model.safetensors) or its model.safetensors", path);
        if ((size_t)snprintf(weights, wn, "%s", path) >= wn) return dm_fail(DM_ERR_INVALID_ARG, "path too long");
        const char *slash = strrchr(path, '/');
        dirlen = slash ? (size_t)(slash - path) : 0;
    }
    /* config.json beside the weights */
    char cand[4096];
    if (dirlen) snprintf(cand, sizeof cand, "%.*s/config.json", (int)dirlen, path);
    else snprintf(cand, sizeof cand, "config.json");
    if (stat(cand, &sb) == 0 && !S_ISDIR(sb.st_mode) && strlen(cand) < cn) snprintf(config, cn, "%s", cand);
    return DM_OK;
}

static const char *const k_prefixes[] = {"", "bert.", "0.auto_model.", "model."};
enum { NUM_PREFIXES = sizeof k_prefixes / sizeof k_prefixes[0] };

dm_status dm_hf_encoder_prefix(const dm_tensor_file *f, char *prefix, size_t n) {
    if (!f || !prefix || !n) return dm_fail(DM_ERR_INVALID_ARG, "dm_hf_encoder_prefix: NULL argument");
    prefix[0] = 0;
    const dm_st_file *st = dm_tensor_file_st(f);
    for (int p = 0; p < NUM_PREFIXES; p++) {
        char name[128];
        snprintf(name, sizeof name, "%sencoder.layer.0.attention.self.query.weight", k_prefixes[p]);
        if (dm_st_find(st, name)) {
            snprintf(prefix, n, "%s", k_prefixes[p]);
            return DM_OK;
        }
    }
    return dm_fail(DM_ERR_NOT_FOUND, "%s holds no BERT encoder: no encoder.layer.0.attention.self.query.weight "
                   "under the prefixes '', 'bert.', '0.auto_model.' or 'model.'", dm_tensor_file_path(f));
}

/* Tensor `name` (under prefix) has the shape (d0) or (d0, d1) (d1 < 0: one dimension). */
static dm_status check_shape(const dm_st_file *st, const char *path, const char *prefix, const char *name, int64_t d0,
                             int64_t d1, const char *what) {
    char full[192];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    const dm_st_tensor *t = dm_st_find(st, full);
    if (!t) return DM_OK;
    const int nd = d1 < 0 ? 1 : 2;
    if (t->ndim == nd && t->shape[0] == d0 && (nd == 1 || t->shape[1] == d1)) return DM_OK;
    char got[64] = "(";
    for (int d = 0; d < t->ndim && d < 4; d++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%" PRId64, d ? ", " : "", t->shape[d]);
    strcat(got, ")");
    if (nd == 1)
        return dm_fail(DM_ERR_SHAPE, "%s: %s is %s, but the config's %s makes it (%" PRId64 ")", path, full, got, what,
                       d0);
    return dm_fail(DM_ERR_SHAPE, "%s: %s is %s, but the config's %s makes it (%" PRId64 ", %" PRId64 ")", path, full,
                   got, what, d0, d1);
}

static dm_status check_layer(const dm_hf_config *c, const dm_st_file *st, const char *path, const char *pre, int l) {
    const int64_t I = c->hidden_size, U = c->intermediate_size;
    static const char *const sq[4] = {"attention.self.query", "attention.self.key", "attention.self.value",
                                      "attention.output.dense"};
    char n[160];
    for (int k = 0; k < 4; k++) {
        snprintf(n, sizeof n, "encoder.layer.%d.%s.weight", l, sq[k]);
        DM_TRY(check_shape(st, path, pre, n, I, I, "hidden_size"));
        snprintf(n, sizeof n, "encoder.layer.%d.%s.bias", l, sq[k]);
        DM_TRY(check_shape(st, path, pre, n, I, -1, "hidden_size"));
    }
    snprintf(n, sizeof n, "encoder.layer.%d.intermediate.dense.weight", l);
    DM_TRY(check_shape(st, path, pre, n, U, I, "intermediate_size and hidden_size"));
    snprintf(n, sizeof n, "encoder.layer.%d.intermediate.dense.bias", l);
    DM_TRY(check_shape(st, path, pre, n, U, -1, "intermediate_size"));
    snprintf(n, sizeof n, "encoder.layer.%d.output.dense.weight", l);
    DM_TRY(check_shape(st, path, pre, n, I, U, "hidden_size and intermediate_size"));
    snprintf(n, sizeof n, "encoder.layer.%d.output.dense.bias", l);
    return check_shape(st, path, pre, n, I, -1, "hidden_size");
}

dm_status dm_hf_check_weights(const dm_hf_config *c, const char *path) {
    if (!c || !path) return dm_fail(DM_ERR_INVALID_ARG, "dm_hf_check_weights: NULL argument");
    char weights[4096], config[4096];
    DM_TRY(dm_hf_model_files(path, weights, sizeof weights, config, sizeof config));
    dm_tensor_file *f = NULL;
    dm_status s = dm_tensor_file_open_header(&f, weights); /* kilobytes, not the weights */
    if (s == DM_OK) s = dm_hf_config_check_tensors(c, f);
    dm_tensor_file_free(f);
    return s;
}

dm_status dm_hf_config_check_tensors(const dm_hf_config *c, const dm_tensor_file *f) {
    if (!c || !f) return dm_fail(DM_ERR_INVALID_ARG, "dm_hf_config_check_tensors: NULL argument");
    char pre[32];
    DM_TRY(dm_hf_encoder_prefix(f, pre, sizeof pre));
    const dm_st_file *st = dm_tensor_file_st(f);
    const char *path = dm_tensor_file_path(f);
    int64_t layers = 0;
    char n[160];
    for (;; layers++) {
        snprintf(n, sizeof n, "%sencoder.layer.%" PRId64 ".attention.self.query.weight", pre, layers);
        if (!dm_st_find(st, n) || layers > 4096) break;
    }
    if (layers != c->num_hidden_layers)
        return dm_fail(DM_ERR_SHAPE, "%s holds %" PRId64 " encoder layers, its config's num_hidden_layers says %" PRId64,
                       path, layers, c->num_hidden_layers);
    for (int l = 0; l < (int)layers; l++) DM_TRY(check_layer(c, st, path, pre, l));
    const int64_t I = c->hidden_size;
    DM_TRY(check_shape(st, path, pre, "embeddings.word_embeddings.weight", c->vocab_size, I,
                       "vocab_size and hidden_size"));
    DM_TRY(check_shape(st, path, pre, "embeddings.position_embeddings.weight", c->max_position_embeddings, I,
                       "max_position_embeddings and hidden_size"));
    DM_TRY(check_shape(st, path, pre, "embeddings.token_type_embeddings.weight", c->type_vocab_size, I,
                       "type_vocab_size and hidden_size"));
    DM_TRY(check_shape(st, path, pre, "embeddings.LayerNorm.weight", I, -1, "hidden_size"));
    DM_TRY(check_shape(st, path, pre, "embeddings.LayerNorm.bias", I, -1, "hidden_size"));
    /* BertForMaskedLM's head, where the file has it (its names have no prefix) */
    DM_TRY(check_shape(st, path, "", "cls.predictions.transform.dense.weight", I, I, "hidden_size"));
    DM_TRY(check_shape(st, path, "", "cls.predictions.transform.dense.bias", I, -1, "hidden_size"));
    DM_TRY(check_shape(st, path, "", "cls.predictions.transform.LayerNorm.weight", I, -1, "hidden_size"));
    DM_TRY(check_shape(st, path, "", "cls.predictions.transform.LayerNorm.bias", I, -1, "hidden_size"));
    DM_TRY(check_shape(st, path, "", "cls.predictions.decoder.weight", c->vocab_size, I,
                       "vocab_size and hidden_size"));
    return check_shape(st, path, "", "cls.predictions.bias", c->vocab_size, -1, "vocab_size");
}
