/* test_hf.c: Hugging Face models on disk (src/train/hfconfig.c): config.json read (real
 * keys, defaults, every refusal naming its key), written and read back, the layer
 * configuration it gives; the model's files found from a directory or a file; the encoder's
 * prefix; its tensors checked against the config; and a trainer taking any run of the
 * model's layers (dm_trainer_load_layers); a whole BERT's decoder refused when untied. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dmove.h"
#include "dmove_tools.h"
#include "graph/encoder.h"
#include "testutil.h"

static char g_dir[64];

static void put(const char *name, const char *text) {
    char path[160];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    CHECK(fclose(f) == 0);
}

static dm_status read_text(const char *text, dm_hf_config *c) {
    put("config.json", text);
    return dm_hf_config_read(g_dir, c); /* the directory: its config.json */
}

/* MiniLM-L6's config as transformers 4.8 wrote it. */
static const char k_minilm[] =
    "{\"_name_or_path\": \"nreimers/MiniLM-L6-H384-uncased\", \"architectures\": [\"BertModel\"],\n"
    " \"attention_probs_dropout_prob\": 0.1, \"gradient_checkpointing\": false, \"hidden_act\": \"gelu\",\n"
    " \"hidden_dropout_prob\": 0.1, \"hidden_size\": 384, \"initializer_range\": 0.02,\n"
    " \"intermediate_size\": 1536, \"layer_norm_eps\": 1e-12, \"max_position_embeddings\": 512,\n"
    " \"model_type\": \"bert\", \"num_attention_heads\": 12, \"num_hidden_layers\": 6, \"pad_token_id\": 0,\n"
    " \"position_embedding_type\": \"absolute\", \"transformers_version\": \"4.8.2\", \"type_vocab_size\": 2,\n"
    " \"use_cache\": true, \"vocab_size\": 30522}\n";

static void test_read(void) {
    dm_hf_config c;
    CHECK_OK(read_text(k_minilm, &c));
    CHECK(c.hidden_size == 384 && c.num_hidden_layers == 6 && c.num_attention_heads == 12 &&
          c.intermediate_size == 1536 && c.vocab_size == 30522 && c.max_position_embeddings == 512 &&
          c.type_vocab_size == 2 && c.layer_norm_eps == 1e-12 && c.act == DM_ACT_GELU &&
          !strcmp(c.architecture, "BertModel"));
    dm_layer_config lc;
    dm_layer_config_default(&lc);
    CHECK_OK(dm_hf_config_layer(&c, &lc));
    CHECK(lc.hidden == 384 && lc.heads == 12 && lc.ffn == 1536 && lc.eps == 1e-12 && lc.dropout == 0.1);
    /* an empty object: BertConfig's defaults (bert-base) */
    CHECK_OK(read_text("{}", &c));
    CHECK(c.hidden_size == 768 && c.num_hidden_layers == 12 && c.vocab_size == 30522);
    CHECK_OK(read_text("{\"hidden_act\": \"gelu_new\"}", &c));
    CHECK(c.act == DM_ACT_GELU_TANH);
    CHECK_OK(read_text("{\"hidden_act\": \"gelu_accurate\"}", &c)); /* transformers' other names */
    CHECK(c.act == DM_ACT_GELU_TANH);
    CHECK_OK(read_text("{\"hidden_act\": \"gelu_python\"}", &c));
    CHECK(c.act == DM_ACT_GELU);
    /* written and read back */
    char out[160];
    snprintf(out, sizeof out, "%s/written.json", g_dir);
    CHECK_OK(read_text(k_minilm, &c));
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0.125;
    CHECK_OK(dm_hf_config_write(&c, "BertForMaskedLM", out));
    dm_hf_config d;
    CHECK_OK(dm_hf_config_read(out, &d));
    CHECK(d.hidden_size == c.hidden_size && d.num_hidden_layers == c.num_hidden_layers &&
          d.hidden_dropout_prob == 0.125 && d.layer_norm_eps == c.layer_norm_eps &&
          !strcmp(d.architecture, "BertForMaskedLM"));
}

static void test_refusals(void) {
    const struct {
        const char *text, *says;
        dm_status want;
    } bad[] = {
        {"{\"model_type\": \"roberta\"}", "model_type", DM_ERR_UNSUPPORTED},
        {"{\"position_embedding_type\": \"relative_key\"}", "position_embedding_type", DM_ERR_UNSUPPORTED},
        {"{\"is_decoder\": true}", "is_decoder", DM_ERR_UNSUPPORTED},
        {"{\"hidden_act\": \"swish\"}", "hidden_act", DM_ERR_UNSUPPORTED},
        {"{\"hidden_size\": 100, \"num_attention_heads\": 12}", "divisible", DM_ERR_FORMAT},
        {"{\"hidden_size\": \"768\"}", "hidden_size", DM_ERR_FORMAT},
        {"{\"hidden_size\": 768.5}", "hidden_size", DM_ERR_FORMAT},
        {"{\"num_hidden_layers\": -1}", "num_hidden_layers", DM_ERR_FORMAT},
        {"{\"vocab_size\": 1e30}", "vocab_size", DM_ERR_FORMAT},
        {"{\"layer_norm_eps\": 0}", "layer_norm_eps", DM_ERR_FORMAT},
        {"{\"pad_token_id\": 40000}", "pad_token_id", DM_ERR_FORMAT},
        {"{\"architectures\": \"BertModel\"}", "architectures", DM_ERR_FORMAT},
        {"{\"hidden_size\": 768,", "JSON", DM_ERR_FORMAT},
        {"[1, 2]", "JSON", DM_ERR_FORMAT},
        {"", "JSON", DM_ERR_FORMAT},
        {"{\"hidden_act\": \"gelu\", \"hidden_act\": \"relu\"}", "\"hidden_act\" appears twice", DM_ERR_FORMAT},
        {"{\"a\": {\"x\": 1, \"x\": 2}}", "\"x\" appears twice", DM_ERR_FORMAT},
        {"{\"hidden_size\": 768} {\"hidden_size\": 1024}", "not one JSON object", DM_ERR_FORMAT},
        {"\xEF\xBB\xBF{\"hidden_size\": 768}", "byte-order mark", DM_ERR_FORMAT},
        {"{\"add_cross_attention\": true}", "add_cross_attention", DM_ERR_UNSUPPORTED},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        dm_hf_config c;
        const dm_status s = read_text(bad[k].text, &c);
        CHECK(s == bad[k].want && strstr(dm_last_error(), bad[k].says));
        if (s != bad[k].want || !strstr(dm_last_error(), bad[k].says))
            printf("  config %s: got %s: %s\n", bad[k].text, dm_status_name(s), dm_last_error());
    }
    dm_hf_config c;
    CHECK_OK(read_text("{\"hidden_dropout_prob\": 0.1, \"attention_probs_dropout_prob\": 0.2}", &c));
    dm_layer_config lc;
    dm_layer_config_default(&lc);
    CHECK(dm_hf_config_layer(&c, &lc) == DM_ERR_UNSUPPORTED && strstr(dm_last_error(), "attention_probs"));
    char none[96];
    snprintf(none, sizeof none, "%s/none", g_dir);
    CHECK(mkdir(none, 0755) == 0);
    CHECK(dm_hf_config_read(none, &c) == DM_ERR_IO && strstr(dm_last_error(), "no config.json"));
    CHECK(dm_hf_config_read(NULL, &c) == DM_ERR_INVALID_ARG);
    rmdir(none);
}

/* A tiny BERT's encoder (i=8, u=12, `layers` layers) under `prefix`, each tensor filled
 * with 100 * layer + its parameter index; embeddings (vocab 20, positions 16, types 2). */
static void write_model_dec(const char *path, const char *prefix, int layers, int64_t ffn, float decoder);
static void write_model(const char *path, const char *prefix, int layers, int64_t ffn) {
    write_model_dec(path, prefix, layers, ffn, NAN);
}

/* The same with the embeddings' LayerNorm and an MLM decoder (cls.predictions.decoder.weight,
 * 20 x 8) of every value `decoder` (NaN: neither; 0: the word table's values, a tied
 * decoder written out). */
static void write_model_dec(const char *path, const char *prefix, int layers, int64_t ffn, float decoder) {
    dm_tensor_writer *w = NULL;
    CHECK_OK(dm_tensor_writer_new(&w));
    if (!w) return;
    float buf[64 * 64];
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < DM_NUM_PARAMS; k++) {
            const char *pn = dm_param_names[k];
            int64_t sh[2] = {8, 8};
            int nd = strstr(pn, "weight") && !strstr(pn, "LayerNorm") ? 2 : 1;
            if (strstr(pn, "intermediate")) sh[0] = ffn;
            if (!strcmp(pn, "output.dense.weight")) sh[1] = ffn;
            for (int e = 0; e < sh[0] * (nd == 2 ? sh[1] : 1); e++) buf[e] = (float)(100 * l + k);
            char name[160];
            snprintf(name, sizeof name, "%sencoder.layer.%d.%s", prefix, l, pn);
            CHECK_OK(dm_tensor_writer_add_f32(w, name, nd, sh, buf));
        }
    const int64_t emb[3][2] = {{20, 8}, {16, 8}, {2, 8}};
    const char *en[3] = {"word_embeddings", "position_embeddings", "token_type_embeddings"};
    memset(buf, 0, sizeof buf);
    for (int k = 0; k < 3; k++) {
        char name[160];
        snprintf(name, sizeof name, "%sembeddings.%s.weight", prefix, en[k]);
        CHECK_OK(dm_tensor_writer_add_f32(w, name, 2, emb[k], buf));
    }
    if (!isnan(decoder)) { /* a whole BertForMaskedLM's: the embeddings' LayerNorm too */
        const int64_t n8[1] = {8};
        char name[160];
        snprintf(name, sizeof name, "%sembeddings.LayerNorm.bias", prefix);
        CHECK_OK(dm_tensor_writer_add_f32(w, name, 1, n8, buf));
        for (int e = 0; e < 8; e++) buf[e] = 1.0f;
        snprintf(name, sizeof name, "%sembeddings.LayerNorm.weight", prefix);
        CHECK_OK(dm_tensor_writer_add_f32(w, name, 1, n8, buf));
        for (int e = 0; e < 20 * 8; e++) buf[e] = decoder;
        CHECK_OK(dm_tensor_writer_add_f32(w, "cls.predictions.decoder.weight", 2, emb[0], buf));
    }
    CHECK_OK(dm_tensor_writer_write(w, path));
    dm_tensor_writer_free(w);
}

static const char k_tiny[] = "{\"hidden_size\": 8, \"num_attention_heads\": 2, \"intermediate_size\": 12, "
                             "\"num_hidden_layers\": 3, \"vocab_size\": 20, \"max_position_embeddings\": 16, "
                             "\"hidden_dropout_prob\": 0, \"attention_probs_dropout_prob\": 0}";

static void test_tensors(void) {
    char weights[160], cfgp[160], w2[4096], c2[4096];
    snprintf(weights, sizeof weights, "%s/model.safetensors", g_dir);
    snprintf(cfgp, sizeof cfgp, "%s/config.json", g_dir);
    dm_hf_config c;
    CHECK_OK(read_text(k_tiny, &c));
    static const char *const prefixes[3] = {"", "bert.", "0.auto_model."};
    for (int p = 0; p < 3; p++) {
        write_model(weights, prefixes[p], 3, 12);
        dm_tensor_file *f = NULL;
        CHECK_OK(dm_tensor_file_open(&f, weights));
        char pre[32];
        CHECK_OK(dm_hf_encoder_prefix(f, pre, sizeof pre));
        CHECK(!strcmp(pre, prefixes[p]));
        CHECK_OK(dm_hf_config_check_tensors(&c, f));
        dm_tensor_file_free(f);
    }
    /* the directory and the file both find the weights and the config beside them */
    CHECK_OK(dm_hf_model_files(g_dir, w2, sizeof w2, c2, sizeof c2));
    CHECK(!strcmp(w2, weights) && !strcmp(c2, cfgp));
    CHECK_OK(dm_hf_model_files(weights, w2, sizeof w2, c2, sizeof c2));
    CHECK(!strcmp(w2, weights) && !strcmp(c2, cfgp));
    /* contradictions name the tensor and the config's value */
    dm_tensor_file *f = NULL;
    write_model(weights, "bert.", 2, 12);
    CHECK_OK(dm_tensor_file_open(&f, weights));
    CHECK(dm_hf_config_check_tensors(&c, f) == DM_ERR_SHAPE && strstr(dm_last_error(), "num_hidden_layers says 3"));
    dm_tensor_file_free(f);
    write_model(weights, "bert.", 3, 16);
    CHECK_OK(dm_tensor_file_open(&f, weights));
    CHECK(dm_hf_config_check_tensors(&c, f) == DM_ERR_SHAPE &&
          strstr(dm_last_error(), "bert.encoder.layer.0.intermediate.dense.weight is (16, 8)") &&
          strstr(dm_last_error(), "intermediate_size"));
    dm_tensor_file_free(f);
    CHECK_OK(read_text("{\"hidden_size\": 8, \"num_attention_heads\": 2, \"intermediate_size\": 16, "
                       "\"num_hidden_layers\": 3, \"vocab_size\": 30, \"max_position_embeddings\": 16}", &c));
    CHECK_OK(dm_tensor_file_open(&f, weights));
    CHECK(dm_hf_config_check_tensors(&c, f) == DM_ERR_SHAPE && strstr(dm_last_error(), "word_embeddings") &&
          strstr(dm_last_error(), "vocab_size"));
    dm_tensor_file_free(f);
    /* an MLM head of another vocabulary */
    write_model(weights, "bert.", 3, 16);
    {
        dm_tensor_file *g = NULL;
        dm_tensor_writer *hw = NULL;
        CHECK_OK(dm_tensor_file_open(&g, weights));
        CHECK_OK(dm_tensor_writer_new(&hw));
        float v[64] = {0};
        for (int k = 0; g && hw && k < dm_tensor_file_count(g); k++) {
            dm_tensor_info ti;
            CHECK_OK(dm_tensor_file_info(g, k, &ti));
            size_t n = 1;
            for (int d = 0; d < ti.ndim; d++) n *= (size_t)ti.shape[d];
            float *q = malloc(n * sizeof *q);
            CHECK_OK(dm_tensor_file_read_f32(g, k, q, n));
            CHECK_OK(dm_tensor_writer_add_f32(hw, ti.name, ti.ndim, ti.shape, q));
            free(q);
        }
        const int64_t vb = 31;
        CHECK_OK(dm_tensor_writer_add_f32(hw, "cls.predictions.bias", 1, &vb, v));
        dm_tensor_file_free(g);
        CHECK_OK(dm_tensor_writer_write(hw, weights));
        dm_tensor_writer_free(hw);
        c.vocab_size = 20;
        CHECK_OK(dm_tensor_file_open(&f, weights));
        CHECK(dm_hf_config_check_tensors(&c, f) == DM_ERR_SHAPE &&
              strstr(dm_last_error(), "cls.predictions.bias is (31)") && strstr(dm_last_error(), "vocab_size"));
        dm_tensor_file_free(f);
    }
    /* a file without an encoder */
    dm_tensor_writer *w = NULL;
    CHECK_OK(dm_tensor_writer_new(&w));
    float one = 1;
    int64_t sh1 = 1;
    CHECK_OK(dm_tensor_writer_add_f32(w, "classifier.bias", 1, &sh1, &one));
    CHECK_OK(dm_tensor_writer_write(w, weights));
    dm_tensor_writer_free(w);
    CHECK_OK(dm_tensor_file_open(&f, weights));
    char pre[32];
    CHECK(dm_hf_encoder_prefix(f, pre, sizeof pre) == DM_ERR_NOT_FOUND && strstr(dm_last_error(), "0.auto_model."));
    dm_tensor_file_free(f);
    unlink(weights);
    CHECK(dm_hf_model_files(g_dir, w2, sizeof w2, c2, sizeof c2) == DM_ERR_IO &&
          strstr(dm_last_error(), "model.safetensors") && !strstr(dm_last_error(), "pytorch_model.bin"));
    /* a PyTorch pickle instead is named as such; a config.json for the weights refused */
    char bin[200];
    snprintf(bin, sizeof bin, "%s/pytorch_model.bin", g_dir);
    FILE *b = fopen(bin, "wb");
    CHECK(b && fputs("PK", b) >= 0 && fclose(b) == 0);
    CHECK(dm_hf_model_files(g_dir, w2, sizeof w2, c2, sizeof c2) == DM_ERR_UNSUPPORTED &&
          strstr(dm_last_error(), "pytorch_model.bin"));
    unlink(bin);
    CHECK(dm_hf_model_files(cfgp, w2, sizeof w2, c2, sizeof c2) == DM_ERR_INVALID_ARG &&
          strstr(dm_last_error(), "a JSON file"));
}

/* A 2-layer trainer takes the model's layers 1 and 2 (under "0.auto_model."). */
static void test_load_layers(void) {
    char weights[160];
    snprintf(weights, sizeof weights, "%s/model.safetensors", g_dir);
    write_model(weights, "0.auto_model.", 3, 12);
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 1, cfg.seq = 4, cfg.hidden = 8, cfg.heads = 2, cfg.ffn = 12;
    dm_trainer *T = NULL;
    CHECK_OK(dm_trainer_new(&T, &cfg, 2, NULL, NULL));
    if (!T) return;
    CHECK_OK(dm_trainer_load_layers(T, weights, 1));
    float *p;
    CHECK_OK(dm_trainer_tensor(T, "encoder.layer.0.intermediate.dense.bias", &p, NULL, NULL));
    CHECK(p[0] == 100.0f + 11.0f); /* the file's layer 1, parameter 11 */
    CHECK_OK(dm_trainer_tensor(T, "encoder.layer.1.output.LayerNorm.weight", &p, NULL, NULL));
    CHECK(p[3] == 200.0f + 14.0f);
    CHECK(dm_trainer_load_layers(T, weights, 2) == DM_ERR_NOT_FOUND && strstr(dm_last_error(), "holds 3 layer"));
    CHECK(dm_trainer_load_layers(T, weights, -1) == DM_ERR_INVALID_ARG);
    dm_trainer_free(T);
    unlink(weights);
}

/* A whole BERT's --init: a decoder in the file that is the word table loads (tied); one
 * that differs is refused, nothing loaded (dmove would train it tied: another model). */
static void test_decoder_tie(void) {
    char weights[160];
    snprintf(weights, sizeof weights, "%s/model.safetensors", g_dir);
    dm_layer_config cfg;
    dm_layer_config_default(&cfg);
    cfg.batch = 1, cfg.seq = 4, cfg.hidden = 8, cfg.heads = 2, cfg.ffn = 12, cfg.dropout = 0;
    const dm_bert_model bm = {.vocab = 20, .positions = 16, .types = 2, .pad_id = 0};
    dm_trainer *T = NULL;
    CHECK_OK(dm_trainer_new_bert(&T, &cfg, 3, &bm, NULL, NULL));
    if (!T) return;
    CHECK_OK(dm_trainer_init_params(T, 1));
    put("config.json", k_tiny); /* beside the weights: checked against them */
    write_model_dec(weights, "bert.", 3, 12, 0.0f);
    CHECK_OK(dm_trainer_load_layers(T, weights, 0));
    float *p;
    CHECK_OK(dm_trainer_tensor(T, "bert.encoder.layer.2.intermediate.dense.bias", &p, NULL, NULL));
    CHECK(p && p[0] == 200.0f + 11.0f);
    write_model_dec(weights, "bert.", 3, 12, 0.5f);
    CHECK(dm_trainer_load_layers(T, weights, 0) == DM_ERR_UNSUPPORTED &&
          strstr(dm_last_error(), "differs from the word embeddings") && strstr(dm_last_error(), "untied"));
    dm_trainer_free(T);
    unlink(weights);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dmove_test_hf.XXXXXX");
    if (!mkdtemp(g_dir)) {
        printf("cannot make a temporary directory\n");
        return 1;
    }
    test_read();
    test_refusals();
    test_tensors();
    test_load_layers();
    test_decoder_tie();
    char p[160];
    snprintf(p, sizeof p, "%s/config.json", g_dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/written.json", g_dir);
    unlink(p);
    rmdir(g_dir);
    TEST_END();
}
