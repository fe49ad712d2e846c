/* test_text.c: the tokenizer (include/dmove_text.h) on small files written here: UTF-8
 * validation, each normalization step, the pre-tokenizer, WordPiece's greedy longest match
 * and its unknown words, added tokens, the special tokens BertTokenizerFast adds, batches
 * on threads, decoding, and hostile tokenizer files refused with their reason. The ids
 * expected were checked against transformers' BertTokenizerFast (tokenizer_file=, or
 * vocab= with do_lower_case) when this test was written. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dmove.h"
#include "dmove_text.h"
#include "testutil.h"

static char g_dir[] = "/tmp/dmove_text.XXXXXX";

static const char *path_of(const char *name) {
    static char buf[4][256];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static const char *write_file(const char *name, const char *data, size_t len) {
    const char *p = path_of(name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f)) {
        fprintf(stderr, "cannot write %s\n", p);
        exit(1);
    }
    return p;
}

/* The whole of a file into *out (malloc'ed, NUL-terminated), 0 when it cannot be read. */
static int read_all(const char *p, char **out, size_t *n) {
    *out = NULL;
    FILE *f = fopen(p, "rb");
    if (!f) return 0;
    char *b = malloc(1 << 20);
    *n = b ? fread(b, 1, (1 << 20) - 1, f) : 0;
    fclose(f);
    if (b) b[*n] = 0;
    *out = b;
    return b != NULL;
}

static int path_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* The vocabulary of the tests, in id order. */
static const char *const k_vocab[] = {
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", ",", "!", "un",
    "##aff", "##able", "cafe", "caf\xc3\xa9", "\xe5\x8c\x97", "\xe4\xba\xac", "i", "##\xcc\x87", "a", "##a",
    "Hello", ".", "##b", "[", "]", "mask", "x", "##\xf0\x9d\x85\xa5", "##\xf0\x9d\x85\xad"};
enum { NV = (int)(sizeof k_vocab / sizeof *k_vocab) };

static int g_max_chars = 100; /* write_json's max_input_chars_per_word */

/* A tokenizer.json: the vocabulary above, `norm` the normalizer's JSON, `extra` more
 * top-level members (may be ""). */
static const char *write_json(const char *name, const char *norm, const char *model_extra, const char *extra) {
    static char buf[16384];
    size_t o = 0;
    o += (size_t)snprintf(buf + o, sizeof buf - o,
                          "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[");
    for (int k = 0; k < 5; k++)
        o += (size_t)snprintf(buf + o, sizeof buf - o,
                              "%s{\"id\":%d,\"content\":\"%s\",\"single_word\":false,\"lstrip\":false,"
                              "\"rstrip\":false,\"normalized\":false,\"special\":true}",
                              k ? "," : "", k, k_vocab[k]);
    o += (size_t)snprintf(buf + o, sizeof buf - o,
                          "],\"normalizer\":%s,\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
                          "\"post_processor\":{\"type\":\"BertProcessing\",\"sep\":[\"[SEP]\",3],\"cls\":[\"[CLS]\",2]},"
                          "\"decoder\":null%s,\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\","
                          "\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":%d%s,\"vocab\":{",
                          norm, extra, g_max_chars, model_extra);
    for (int k = 0; k < NV; k++) o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\"%s\":%d", k ? "," : "", k_vocab[k], k);
    o += (size_t)snprintf(buf + o, sizeof buf - o, "}}}");
    return write_file(name, buf, o);
}

static const char *write_vocab_txt(const char *name) {
    static char buf[4096];
    size_t o = 0;
    for (int k = 0; k < NV; k++) o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\n", k_vocab[k]);
    return write_file(name, buf, o);
}

#define NORM_LOWER "{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,\"strip_accents\":null,\"lowercase\":true}"
#define NORM_CASED "{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,\"strip_accents\":null,\"lowercase\":false}"
#define NORM_LOWER_KEEP "{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,\"strip_accents\":false,\"lowercase\":true}"

/* Encodes s and compares with want[0..n). */
static int ids_are(const dm_tokenizer *t, const char *s, int special, const int32_t *want, size_t n) {
    dm_ids ids = {0};
    size_t bad;
    dm_status st = dm_tokenizer_encode(t, s, strlen(s), special, &ids, &bad);
    int ok = st == DM_OK && ids.n == n && (n == 0 || !memcmp(ids.v, want, n * sizeof *want));
    if (!ok) {
        fprintf(stderr, "  encode(\"%s\"): status %d (%s), got", s, (int)st, st ? dm_last_error() : "");
        for (size_t k = 0; k < ids.n; k++) fprintf(stderr, " %d", ids.v[k]);
        fprintf(stderr, ", want");
        for (size_t k = 0; k < n; k++) fprintf(stderr, " %d", want[k]);
        fprintf(stderr, "\n");
    }
    dm_ids_free(&ids);
    return ok;
}
#define IDS(t, s, sp, ...)                                                                \
    do {                                                                                  \
        static const int32_t w_[] = {__VA_ARGS__};                                        \
        CHECK(ids_are(t, s, sp, w_, sizeof w_ / sizeof *w_));                             \
    } while (0)

static void test_utf8(void) {
    CHECK(dm_utf8_invalid_at("", 0) == 0);
    CHECK(dm_utf8_invalid_at("hello w\xc3\xa9rld \xe5\x8c\x97 \xf0\x9f\x98\x80", 21) == 21);
    CHECK(dm_utf8_invalid_at("ab\xc0\x80", 4) == 2);           /* overlong NUL */
    CHECK(dm_utf8_invalid_at("\xe0\x80\x80", 3) == 0);         /* overlong */
    CHECK(dm_utf8_invalid_at("x\xed\xa0\x80", 4) == 1);        /* surrogate U+D800 */
    CHECK(dm_utf8_invalid_at("\xf4\x90\x80\x80", 4) == 0);     /* past U+10FFFF */
    CHECK(dm_utf8_invalid_at("abc\xe5\x8c", 5) == 3);          /* truncated */
    CHECK(dm_utf8_invalid_at("abcdefgh\x80", 9) == 8);         /* stray continuation */
    CHECK(dm_utf8_invalid_at("abcdefghij\xff", 11) == 10);
    CHECK(dm_utf8_invalid_at("\xf4\x8f\xbf\xbf", 4) == 4);     /* U+10FFFF */
}

static void test_lower(void) {
    dm_tokenizer *t = NULL;
    CHECK_OK(dm_tokenizer_load(&t, write_json("lower.json", NORM_LOWER, "", ""), DM_CASE_FILE));
    if (!t) return;
    CHECK(dm_tokenizer_vocab_size(t) == NV);
    IDS(t, "Hello, World!", 1, 2, 5, 7, 6, 8, 3);
    IDS(t, "Hello, World!", 0, 5, 7, 6, 8);
    IDS(t, "", 1, 2, 3);
    IDS(t, "unaffable", 0, 9, 10, 11);
    IDS(t, "unaffablex", 0, 1);                     /* no "##x": the whole word unknown */
    IDS(t, "Caf\xc3\xa9 CAFE\xcc\x81", 0, 12, 12);    /* accents stripped, precomposed or not */
    IDS(t, "\xe5\x8c\x97\xe4\xba\xac", 0, 14, 15);    /* CJK split */
    IDS(t, "hello\x01world\x7f", 0, 1);            /* controls dropped: "helloworld" */
    IDS(t, "hello\t\xe3\x80\x80world\xc2\xa0", 0, 5, 6); /* whitespace of all kinds */
    IDS(t, "[MASK]hello [mask]", 0, 4, 5, 23, 25, 24);
    IDS(t, "\xc4\xb0", 0, 16);                      /* U+0130: NFD I + U+0307, mark dropped */
    /* marks (U+1D16D class 226, U+1D165 class 216: spacing, kept) put in canonical order
     * across a control that the cleaning drops, not across whitespace */
    IDS(t, "a\xf0\x9d\x85\xad\x01\xf0\x9d\x85\xa5", 0, 18, 27, 28);
    IDS(t, "a\xf0\x9d\x85\xad\x7f\x1f\xf0\x9d\x85\xa5x", 0, 1);
    IDS(t, "a\xf0\x9d\x85\xad\xf0\x9d\x85\xa5", 0, 18, 27, 28);
    IDS(t, "a\xf0\x9d\x85\xad\t\xf0\x9d\x85\xa5", 0, 18, 28, 1);
    char w[128];
    memset(w, 'a', 100);
    w[100] = 0;
    dm_ids ids = {0};
    CHECK_OK(dm_tokenizer_encode(t, w, 100, 0, &ids, NULL));
    CHECK(ids.n == 100 && ids.v[0] == 18 && ids.v[99] == 19);
    ids.n = 0;
    w[100] = 'a';
    CHECK_OK(dm_tokenizer_encode(t, w, 101, 0, &ids, NULL));
    CHECK(ids.n == 1 && ids.v[0] == 1); /* over max_input_chars_per_word */
    size_t bad = 0;
    ids.n = 0;
    CHECK(dm_tokenizer_encode(t, "ok\xc3", 3, 1, &ids, &bad) == DM_ERR_FORMAT && bad == 2);
    CHECK(strstr(dm_last_error(), "byte offset 2") != NULL);
    dm_ids_free(&ids);
    /* ids and tokens, specials, decoding */
    CHECK(dm_tokenizer_token_id(t, "##aff") == 10 && dm_tokenizer_token_id(t, "nope") == -1);
    CHECK(dm_tokenizer_token(t, 11) && !strcmp(dm_tokenizer_token(t, 11), "##able"));
    CHECK(dm_tokenizer_token(t, NV) == NULL && dm_tokenizer_token(t, -1) == NULL);
    dm_special_ids sp;
    CHECK_OK(dm_tokenizer_specials(t, &sp));
    CHECK(sp.pad == 0 && sp.unk == 1 && sp.cls == 2 && sp.sep == 3 && sp.mask == 4);
    const int32_t d[] = {2, 9, 10, 11, 7, 5, 3};
    char *text = NULL;
    CHECK_OK(dm_tokenizer_decode(t, d, 7, &text));
    CHECK(text && !strcmp(text, "[CLS] unaffable, hello [SEP]")); /* the decoder's cleanup: " ," */
    free(text);
    CHECK(dm_tokenizer_decode(t, (const int32_t[]){NV}, 1, &text) == DM_ERR_INVALID_ARG);
    const char *desc = dm_tokenizer_describe(t);
    CHECK(strstr(desc, "WordPiece") && strstr(desc, "lowercase") && strstr(desc, "strip accents"));
    dm_tokenizer_free(t);
}

static void test_cased_and_keep(void) {
    dm_tokenizer *c = NULL, *k = NULL, *v = NULL, *l = NULL;
    CHECK_OK(dm_tokenizer_load(&c, write_json("cased.json", NORM_CASED, "", ""), DM_CASE_FILE));
    CHECK_OK(dm_tokenizer_load(&k, write_json("keep.json", NORM_LOWER_KEEP, "", ""), DM_CASE_FILE));
    CHECK_OK(dm_tokenizer_load(&v, write_vocab_txt("vocab.txt"), DM_CASE_CASED));
    CHECK_OK(dm_tokenizer_load(&l, write_vocab_txt("vocab.txt"), DM_CASE_LOWER));
    if (!c || !k || !v || !l) goto out;
    IDS(c, "Hello hello caf\xc3\xa9 Caf\xc3\xa9", 0, 20, 5, 13, 1);
    IDS(v, "Hello hello caf\xc3\xa9 Caf\xc3\xa9", 0, 20, 5, 13, 1);
    IDS(l, "Hello hello caf\xc3\xa9 Caf\xc3\xa9", 0, 5, 5, 12, 12);
    IDS(k, "caf\xc3\xa9 CAF\xc3\x89", 0, 13, 13);        /* lowercase, accents kept */
    IDS(k, "\xc4\xb0", 0, 16, 17);                        /* U+0130 -> "i" U+0307 */
    IDS(c, "\xc4\xb0", 0, 1);
    CHECK(dm_tokenizer_hash(c) == dm_tokenizer_hash(v));  /* the same settings and vocabulary */
    CHECK(dm_tokenizer_hash(c) != dm_tokenizer_hash(l));
    CHECK(dm_tokenizer_hash(l) != dm_tokenizer_hash(k));
    /* a batch on threads gives what one at a time gives */
    const char *texts[] = {"Hello, World!", "", "unaffable caf\xc3\xa9", "\xe5\x8c\x97 x", "[MASK] a aa", "bad \xff here"};
    size_t lens[6];
    for (int j = 0; j < 6; j++) lens[j] = strlen(texts[j]);
    for (int th = 1; th <= 3; th++) {
        dm_ids out[6] = {{0}};
        size_t bi = 0, bo = 0;
        CHECK_OK(dm_tokenizer_encode_batch(l, texts, lens, 5, 1, th, out, &bi, &bo));
        CHECK(bi == (size_t)-1 && bo == (size_t)-1);
        for (int j = 0; j < 5; j++) {
            dm_ids one = {0};
            CHECK_OK(dm_tokenizer_encode(l, texts[j], lens[j], 1, &one, NULL));
            CHECK(one.n == out[j].n && !memcmp(one.v, out[j].v, one.n * sizeof *one.v));
            dm_ids_free(&one);
            dm_ids_free(&out[j]);
        }
        CHECK(dm_tokenizer_encode_batch(l, texts, lens, 6, 1, th, out, &bi, &bo) == DM_ERR_FORMAT);
        CHECK(bi == 5 && bo == 4);
        for (int j = 0; j < 6; j++) dm_ids_free(&out[j]);
    }
out:
    dm_tokenizer_free(c);
    dm_tokenizer_free(k);
    dm_tokenizer_free(v);
    dm_tokenizer_free(l);
}

/* a and b give the same ids (with the special tokens) on texts[0..n). */
static void same_ids(const dm_tokenizer *a, const dm_tokenizer *b, const char *const *texts, int n) {
    for (int j = 0; j < n; j++) {
        dm_ids x = {0}, y = {0};
        CHECK_OK(dm_tokenizer_encode(a, texts[j], strlen(texts[j]), 1, &x, NULL));
        CHECK_OK(dm_tokenizer_encode(b, texts[j], strlen(texts[j]), 1, &y, NULL));
        CHECK(x.n == y.n && !memcmp(x.v, y.v, x.n * sizeof *x.v));
        dm_ids_free(&x);
        dm_ids_free(&y);
    }
}

/* A model directory's tokenizer.json as transformers' AutoTokenizer reads the directory:
 * with BertTokenizer's class, tokenizer_config.json's casing (default lowercase) over the
 * file's, and a vocab.txt's word length; another class, the file as it is. */
static void test_dir_config(void) {
    static const struct {
        const char *name, *tok_cfg, *model_cfg;
        int file_lower;  /* the tokenizer.json's normalizer: NORM_LOWER, else NORM_CASED */
        int bert;        /* transformers makes a BertTokenizer of the directory */
        int lower, strip; /* then: what "Hello Caf\xc3\xa9" becomes */
    } cases[] = {
        {"d_cfg_lower", "{\"tokenizer_class\":\"BertTokenizer\",\"do_lower_case\":true}", NULL, 0, 1, 1, 1},
        {"d_cfg_cased", "{\"tokenizer_class\":\"BertTokenizerFast\",\"do_lower_case\":false}", NULL, 1, 1, 0, 0},
        {"d_cfg_keep", "{\"tokenizer_class\":\"BertTokenizer\",\"strip_accents\":false}", NULL, 0, 1, 1, 0},
        {"d_cfg_default", "{}", "{\"model_type\":\"bert\"}", 0, 1, 1, 1},
        {"d_no_cfg", NULL, "{\"model_type\":\"bert\"}", 0, 1, 1, 1},
        {"d_other_class", "{\"tokenizer_class\":\"PreTrainedTokenizerFast\",\"do_lower_case\":true}",
         "{\"model_type\":\"bert\"}", 0, 0, 0, 0},
        {"d_other_model", NULL, "{\"model_type\":\"roberta\"}", 0, 0, 0, 0},
        {"d_nothing", NULL, NULL, 1, 0, 0, 0},
    };
    char p[600];
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        snprintf(p, sizeof p, "%s", path_of(cases[c].name));
        CHECK(mkdir(p, 0700) == 0);
        char rel[300];
        snprintf(rel, sizeof rel, "%s/tokenizer.json", cases[c].name);
        g_max_chars = 3; /* BertTokenizer's 100 where transformers makes one */
        write_json(rel, cases[c].file_lower ? NORM_LOWER : NORM_CASED, "", "");
        g_max_chars = 100;
        if (cases[c].tok_cfg) {
            snprintf(rel, sizeof rel, "%s/tokenizer_config.json", cases[c].name);
            write_file(rel, cases[c].tok_cfg, strlen(cases[c].tok_cfg));
        }
        if (cases[c].model_cfg) {
            snprintf(rel, sizeof rel, "%s/config.json", cases[c].name);
            write_file(rel, cases[c].model_cfg, strlen(cases[c].model_cfg));
        }
        dm_tokenizer *t = NULL, *f = NULL;
        CHECK_OK(dm_tokenizer_load(&t, p, DM_CASE_FILE));
        snprintf(p + strlen(p), sizeof p - strlen(p), "/tokenizer.json");
        CHECK_OK(dm_tokenizer_load(&f, p, DM_CASE_FILE)); /* the file itself: as it says */
        if (t && f) {
            IDS(f, "unaffable", 0, 1); /* 9 characters: over the file's 3 */
            if (!cases[c].bert) {
                CHECK(dm_tokenizer_hash(t) == dm_tokenizer_hash(f));
                IDS(t, "unaffable", 0, 1);
            } else {
                IDS(t, "unaffable", 0, 9, 10, 11);
                if (cases[c].lower && cases[c].strip) IDS(t, "Hello Caf\xc3\xa9", 0, 5, 12);
                else if (cases[c].lower) IDS(t, "Hello Caf\xc3\xa9", 0, 5, 13);
                else IDS(t, "Hello Caf\xc3\xa9", 0, 20, 1);
            }
            CHECK((strstr(dm_tokenizer_describe(t), "tokenizer_config.json") != NULL) == cases[c].bert);
        }
        dm_tokenizer_free(t);
        dm_tokenizer_free(f);
    }
    /* saved as BertTokenizer (vocab.txt, tokenizer_config.json) and read back from its
     * directory: the same ids; what BertTokenizer cannot be refused */
    dm_tokenizer *k = NULL, *back = NULL;
    CHECK(mkdir(path_of("saved"), 0700) == 0);
    CHECK_OK(dm_tokenizer_load(&k, write_json("keep2.json", NORM_LOWER_KEEP, "", ""), DM_CASE_FILE));
    if (k) CHECK_OK(dm_tokenizer_save(k, path_of("saved"), 64, NULL));
    CHECK_OK(dm_tokenizer_load(&back, path_of("saved"), DM_CASE_FILE));
    if (k && back) {
        CHECK(dm_tokenizer_vocab_size(back) == NV);
        const char *const texts[] = {"Caf\xc3\xa9 CAF\xc3\x89 hello, [MASK] unaffable!", "\xe5\x8c\x97x\x01 a aa"};
        same_ids(k, back, texts, 2);
    }
    dm_tokenizer_free(k);
    dm_tokenizer_free(back);
    k = NULL;
    g_max_chars = 3;
    CHECK_OK(dm_tokenizer_load(&k, write_json("short.json", NORM_LOWER, "", ""), DM_CASE_FILE));
    g_max_chars = 100;
    /* BertTokenizer cannot be it: its tokenizer.json as it is, PreTrainedTokenizerFast */
    CHECK(mkdir(path_of("saved_json"), 0700) == 0);
    write_file("saved_json/config.json", "{\"model_type\":\"bert\"}", 22);
    int jf = 0;
    CHECK(k && dm_tokenizer_save(k, path_of("saved_json"), 0, &jf) == DM_OK && jf == 1);
    {
        char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        /* the file, with the post-processor dmove uses written out (BertTokenizerFast's) */
        CHECK(read_all(path_of("short.json"), &a, &na) && read_all(path_of("saved_json/tokenizer.json"), &b, &nb) &&
              strstr(b, "\"TemplateProcessing\"") && strstr(b, "\"max_input_chars_per_word\":3"));
        free(a);
        free(b);
        CHECK(read_all(path_of("saved_json/tokenizer_config.json"), &a, &na) &&
              strstr(a, "\"PreTrainedTokenizerFast\"") && strstr(a, "\"mask_token\":\t\"[MASK]\""));
        free(a);
    }
    CHECK_OK(dm_tokenizer_load(&back, path_of("saved_json"), DM_CASE_FILE)); /* model_type bert: the class wins */
    CHECK(k && back && dm_tokenizer_hash(back) == dm_tokenizer_hash(k));
    dm_tokenizer_free(back);
    back = NULL;
    /* a directory whose tokenizer.json transformers would read instead of a vocab.txt, or
     * with a special_tokens_map.json: refused before anything is written */
    dm_tokenizer *b2 = NULL;
    CHECK_OK(dm_tokenizer_load(&b2, write_json("keep3.json", NORM_LOWER_KEEP, "", ""), DM_CASE_FILE));
    CHECK(b2 && dm_tokenizer_check_save(b2, path_of("saved_json"), &jf) == DM_ERR_INVALID_ARG &&
          strstr(dm_last_error(), "tokenizer.json") && strstr(dm_last_error(), "instead of"));
    CHECK(b2 && dm_tokenizer_save(b2, path_of("saved_json"), 0, &jf) == DM_ERR_INVALID_ARG);
    CHECK(!path_exists(path_of("saved_json/vocab.txt")));
    write_file("saved/special_tokens_map.json", "{}", 2);
    CHECK(b2 && dm_tokenizer_save(b2, path_of("saved"), 0, &jf) == DM_ERR_INVALID_ARG &&
          strstr(dm_last_error(), "special_tokens_map.json"));
    CHECK(k && dm_tokenizer_save(k, path_of("saved"), 0, &jf) == DM_ERR_INVALID_ARG);
    dm_tokenizer_free(b2);
    dm_tokenizer_free(k);
    k = NULL;
    /* neither: a vocab.txt without [MASK] (BertTokenizer would add one) */
    {
        char buf[4096];
        size_t o = 0;
        for (int i = 0; i < NV; i++)
            if (i != 4) o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\n", k_vocab[i]);
        CHECK_OK(dm_tokenizer_load(&k, write_file("nomask.txt", buf, o), DM_CASE_LOWER));
        CHECK(mkdir(path_of("saved_none"), 0700) == 0);
        CHECK(k && dm_tokenizer_save(k, path_of("saved_none"), 0, &jf) == DM_ERR_UNSUPPORTED &&
              strstr(dm_last_error(), "lacks the special token \"[MASK]\"") && strstr(dm_last_error(), "no tokenizer.json"));
        dm_tokenizer_free(k);
        k = NULL;
    }
    /* more added tokens than BertTokenizer's five (a special one and one that strips on
     * its left): in added_tokens_decoder, the same ids read back; a directory's
     * tokenizer_config.json naming its specials otherwise */
    {
        char *a = NULL;
        size_t na = 0;
        CHECK(read_all(write_json("extra.json", NORM_LOWER, "", ""), &a, &na));
        const char *at = a ? strstr(a, "\"added_tokens\":[") : NULL;
        char buf[20000];
        if (at) {
            const size_t head = (size_t)(at - a) + 16;
            int o = snprintf(buf, sizeof buf, "%.*s{\"id\":25,\"content\":\"mask\",\"single_word\":false,\"lstrip\":false,"
                             "\"rstrip\":false,\"normalized\":false,\"special\":true},{\"id\":26,\"content\":\"x\","
                             "\"single_word\":false,\"lstrip\":true,\"rstrip\":false,\"normalized\":true,\"special\":false},%s",
                             (int)head, a, a + head);
            write_file("extra.json", buf, (size_t)o);
        }
        free(a);
        CHECK_OK(dm_tokenizer_load(&k, path_of("extra.json"), DM_CASE_FILE));
        CHECK(mkdir(path_of("saved_extra"), 0700) == 0);
        CHECK(k && dm_tokenizer_save(k, path_of("saved_extra"), 0, &jf) == DM_OK && jf == 0);
        CHECK_OK(dm_tokenizer_load(&back, path_of("saved_extra"), DM_CASE_FILE));
        if (k && back) {
            CHECK(dm_tokenizer_hash(back) == dm_tokenizer_hash(k));
            const char *const texts[] = {"a mask hello", "amaskx   x hello X", "MASK [MASK]mask"};
            same_ids(k, back, texts, 3);
            IDS(back, "amask", 0, 18, 25);
        }
        dm_tokenizer_free(back);
        back = NULL;
        /* the decoder's id naming another token than the vocab.txt's line: refused */
        write_file("saved_extra/tokenizer_config.json", "{\"added_tokens_decoder\":{\"25\":{\"content\":\"x\"}}}", 48);
        CHECK(dm_tokenizer_load(&back, path_of("saved_extra"), DM_CASE_FILE) == DM_ERR_FORMAT);
        write_file("saved_extra/tokenizer_config.json", "{\"mask_token\":{\"content\":\"mask\"}}", 34);
        CHECK_OK(dm_tokenizer_load(&back, path_of("saved_extra"), DM_CASE_FILE));
        if (back) {
            CHECK(dm_tokenizer_token_id(back, "mask") == 25);
            IDS(back, "amask", 0, 18, 25);
        }
        dm_tokenizer_free(back);
        back = NULL;
        /* special_tokens_map.json's and tokenizer_config.json's additional special tokens; the
         * former's names over the latter's (as transformers 5.24); a name over 63 bytes refused */
        static const char map[] = "{\"cls_token\":\"[CLS]\",\"additional_special_tokens\":[\"mask\"]}",
                          cfg[] = "{\"cls_token\":\"a\",\"extra_special_tokens\":{\"x\":\"x\"}}";
        write_file("saved_extra/special_tokens_map.json", map, strlen(map));
        write_file("saved_extra/tokenizer_config.json", cfg, strlen(cfg));
        CHECK_OK(dm_tokenizer_load(&back, path_of("saved_extra"), DM_CASE_FILE));
        if (back) {
            IDS(back, "amask", 1, 2, 18, 25, 3);
            IDS(back, "xamaskx", 0, 26, 18, 25, 26);
        }
        dm_tokenizer_free(back);
        back = NULL;
        static const char longname[] = "{\"mask_token\":\"[0000000000000000000000000000000000000000000000000000000000000000]\"}";
        write_file("saved_extra/tokenizer_config.json", longname, strlen(longname));
        CHECK(dm_tokenizer_load(&back, path_of("saved_extra"), DM_CASE_FILE) == DM_ERR_FORMAT &&
              strstr(dm_last_error(), "at most 63 bytes"));
        /* mask_token null: none (a [MASK] in the text is words); cls_token null refused; a
         * key given twice refused */
        remove(path_of("saved_extra/special_tokens_map.json"));
        static const char nomask[] = "{\"mask_token\":null}", nocls[] = "{\"cls_token\":null}",
                          twice[] = "{\"do_lower_case\":true,\"mask_token\":\"mask\",\"do_lower_case\":false}";
        write_file("saved_extra/tokenizer_config.json", nomask, strlen(nomask));
        CHECK_OK(dm_tokenizer_load(&back, path_of("saved_extra"), DM_CASE_FILE));
        if (back) IDS(back, "[MASK]", 0, 23, 25, 24);
        dm_tokenizer_free(back);
        back = NULL;
        write_file("saved_extra/tokenizer_config.json", nocls, strlen(nocls));
        CHECK(dm_tokenizer_load(&back, path_of("saved_extra"), DM_CASE_FILE) == DM_ERR_UNSUPPORTED &&
              strstr(dm_last_error(), "cls_token is null"));
        write_file("saved_extra/tokenizer_config.json", twice, strlen(twice));
        CHECK(dm_tokenizer_load(&back, path_of("saved_extra"), DM_CASE_FILE) == DM_ERR_FORMAT &&
              strstr(dm_last_error(), "\"do_lower_case\" is given twice"));
    }
    dm_tokenizer_free(k);
    /* a tokenizer_config.json that is no JSON object, or a do_lower_case not true or false */
    CHECK(mkdir(path_of("d_bad"), 0700) == 0);
    write_json("d_bad/tokenizer.json", NORM_CASED, "", "");
    write_file("d_bad/tokenizer_config.json", "[1]", 3);
    dm_tokenizer *t = NULL;
    CHECK(dm_tokenizer_load(&t, path_of("d_bad"), DM_CASE_FILE) == DM_ERR_FORMAT &&
          strstr(dm_last_error(), "tokenizer_config.json: not a JSON object"));
    write_file("d_bad/tokenizer_config.json", "{\"do_lower_case\":1}", 19);
    write_file("d_bad/config.json", "{\"model_type\":\"bert\"}", 21);
    CHECK(dm_tokenizer_load(&t, path_of("d_bad"), DM_CASE_FILE) == DM_ERR_FORMAT &&
          strstr(dm_last_error(), "do_lower_case"));
    CHECK(t == NULL);
}

/* Added tokens: single_word, lstrip/rstrip, normalized ones, and the specials
 * BertTokenizerFast adds when the file lacks them (new ids past the vocabulary). */
static void test_added(void) {
    static const char json[] =
        "{\"added_tokens\":[{\"id\":4,\"content\":\"[MASK]\",\"single_word\":false,\"lstrip\":true,"
        "\"rstrip\":true,\"normalized\":false,\"special\":true},"
        "{\"id\":6,\"content\":\"<W>\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":false},"
        "{\"id\":7,\"content\":\"Zz\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":true,\"special\":false}],"
        "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,\"lowercase\":true},\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},"
        "\"post_processor\":null,\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":100,\"vocab\":"
        "{\"[UNK]\":0,\"a\":1,\"##a\":2,\"[SEP]\":3,\"[MASK]\":4,\"<\":5}}}";
    dm_tokenizer *t = NULL;
    CHECK_OK(dm_tokenizer_load(&t, write_file("added.json", json, sizeof json - 1), DM_CASE_FILE));
    if (!t) return;
    /* [PAD] 7? no: 6 and 7 are taken by the added tokens; [PAD] 8, [CLS] 9 */
    CHECK(dm_tokenizer_vocab_size(t) == 10);
    CHECK(dm_tokenizer_token_id(t, "[PAD]") == 8 && dm_tokenizer_token_id(t, "[CLS]") == 9);
    IDS(t, "a [MASK]  a", 1, 9, 1, 4, 1, 3);       /* stripped spaces both sides */
    IDS(t, "a<W> <W> a", 0, 1, 5, 0, 0, 6, 1);      /* <W> only as a single word ("a<w>": a < w >) */
    IDS(t, "aZZa zz", 0, 1, 7, 1, 7);               /* normalized: matched after lowercasing */
    dm_special_ids sp;
    CHECK(dm_tokenizer_specials(t, &sp) == DM_ERR_NOT_FOUND); /* [PAD] and [CLS] are not in the file */
    CHECK(strstr(dm_last_error(), "lacks [PAD] [CLS] (") != NULL);
    CHECK(sp.pad == 8 && sp.cls == 9 && sp.sep == 3 && sp.mask == 4 && sp.unk == 0);
    dm_tokenizer_free(t);
    /* a token inside the whitespace an earlier token's rstrip took, moved by its own lstrip
     * to that run's end, is empty: dropped (tokenizers' ids, checked with tokenizers 0.22) */
    static const char tab[] =
        "{\"added_tokens\":[{\"id\":4,\"content\":\"[MASK]\",\"single_word\":false,\"lstrip\":false,"
        "\"rstrip\":true,\"normalized\":false,\"special\":true},{\"id\":6,\"content\":\"\\t\",\"single_word\":false,"
        "\"lstrip\":true,\"rstrip\":false,\"normalized\":false,\"special\":false}],"
        "\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,\"strip_accents\":null,"
        "\"lowercase\":true},\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"},\"post_processor\":null,\"decoder\":null,"
        "\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\","
        "\"max_input_chars_per_word\":100,\"vocab\":{\"[UNK]\":0,\"a\":1,\"[SEP]\":2,\"[CLS]\":3,\"[MASK]\":4,\"[PAD]\":5}}}";
    t = NULL;
    CHECK_OK(dm_tokenizer_load(&t, write_file("added_tab.json", tab, sizeof tab - 1), DM_CASE_FILE));
    if (!t) return;
    IDS(t, "[MASK]\ta", 0, 4, 1);  /* the tab is [MASK]'s: not a token of its own */
    IDS(t, "[MASK] \ta", 0, 4, 1);
    IDS(t, "\t\ta", 0, 6, 6, 1);   /* no earlier rstrip: both tabs are tokens */
    IDS(t, "a [MASK]\t", 0, 1, 4);
    dm_tokenizer_free(t);
    /* the padding section's pad_token is not the pad token (BertTokenizerFast keeps [PAD]) */
    char padded[sizeof tab + 160];
    int np = snprintf(padded, sizeof padded, "{\"padding\":{\"strategy\":\"BatchLongest\",\"direction\":\"Right\","
                      "\"pad_to_multiple_of\":null,\"pad_id\":1,\"pad_type_id\":0,\"pad_token\":\"a\"},%s", tab + 1);
    CHECK(np > 0 && (size_t)np < sizeof padded);
    t = NULL;
    CHECK_OK(dm_tokenizer_load(&t, write_file("added_pad.json", padded, strlen(padded)), DM_CASE_FILE));
    if (!t) return;
    CHECK(dm_tokenizer_specials(t, &sp) == DM_OK && sp.pad == 5);
    IDS(t, "a aa", 0, 1, 0); /* "a" a word piece, not a special token matched in the text */
    dm_tokenizer_free(t);
}

static void refused(const char *name, const char *data, dm_case c, dm_status want, const char *why) {
    dm_tokenizer *t = (dm_tokenizer *)1;
    dm_status st = dm_tokenizer_load(&t, write_file(name, data, strlen(data)), c);
    int ok = st == want && t == NULL && strstr(dm_last_error(), why) != NULL;
    if (!ok)
        fprintf(stderr, "  %s: status %d (want %d), message \"%s\" (want \"%s\")\n", name, (int)st, (int)want,
                dm_last_error(), why);
    CHECK(ok);
    if (st == DM_OK && t) dm_tokenizer_free(t);
}

#define WP_BODY "\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\",\"max_input_chars_per_word\":100,\"vocab\":"
#define WP_HEAD "{" WP_BODY
/* A model directory's vocab.txt with an older transformers' added_tokens.json, as
 * transformers 5.24's AutoTokenizer reads it (ids below taken from it): the tokens added in
 * the order of the file's ids, which are not kept (new ones from the vocabulary's size; a
 * token of the vocabulary keeps its own), normalized, not special; ignored where
 * tokenizer_config.json has an added_tokens_decoder; a file that is no object of numbers
 * refused. */
static void test_added_tokens_json(void) {
    static const char vocab[] = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n",
                      cfg[] = "{\"tokenizer_class\":\"BertTokenizer\",\"do_lower_case\":true}";
    CHECK(mkdir(path_of("atj"), 0700) == 0);
    write_file("atj/vocab.txt", vocab, sizeof vocab - 1);
    write_file("atj/tokenizer_config.json", cfg, sizeof cfg - 1);
    /* with an additional special token named; beside an added_tokens_decoder */
    static const char cfg_sp[] = "{\"tokenizer_class\":\"BertTokenizer\",\"additional_special_tokens\":[\"<e2>\"]}",
                      dec[] = "{\"tokenizer_class\":\"BertTokenizer\",\"added_tokens_decoder\":{\"8\":{\"content\":"
                              "\"<a>\",\"normalized\":true}}}";
    static const struct {
        const char *json, *text;
        int32_t ids[12];
        int n;
        const char *cfg; /* NULL: cfg */
    } c[] = {
        {"{\"foo\": 5}", "hello foo worlds", {2, 5, 8, 6, 7, 3}, 6, NULL},            /* id of "hello": not kept */
        {"{\"foo\": 20, \"<b>\": 3}", "foo <b>", {2, 9, 8, 3}, 4, NULL},          /* in the ids' order */
        {"{\"hello\": 9}", "helloworld", {2, 5, 6, 3}, 4, NULL},                 /* in the vocabulary: matched */
        {"{\"Bar\": 8}", "Bar bar BAR xbarx", {2, 8, 8, 8, 1, 8, 1, 3}, 8, NULL}, /* normalized, inside words */
        {"{\"Caf\u00e9\": 1}", "caf\xc3\xa9 CAFE", {2, 8, 8, 3}, 4, NULL},       /* accents stripped as the text's */
        {"{}", "foo", {2, 1, 3}, 3, NULL},
        {"{\"a2\": 5, \"x\": 1, \"b2\": 5}", "a2 b2 x", {2, 1, 9, 8, 3}, 5, NULL}, /* an id twice: the last token */
        {"{\"x\": true, \"y\": false}", "x y", {2, 9, 8, 3}, 4, NULL},            /* as Python: 1 and 0 */
        {"{\"x\": 1e400, \"y\": 3}", "x y", {2, 9, 8, 3}, 4, NULL},               /* infinite: last */
        {"{\"<e2>\": 30}", "<e2> <E2>", {2, 8, 1, 1, 1, 3}, 6, cfg_sp}, /* special, not normalized */
        {"{\"<b>\": 9}", "<a> <b>", {2, 8, 1, 1, 1, 3}, 6, dec},        /* not read: its <b> unknown */
    };
    for (size_t k = 0; k < sizeof c / sizeof *c; k++) {
        const char *ck = c[k].cfg ? c[k].cfg : cfg;
        write_file("atj/tokenizer_config.json", ck, strlen(ck));
        write_file("atj/added_tokens.json", c[k].json, strlen(c[k].json));
        dm_tokenizer *t = NULL, *back = NULL;
        CHECK_OK(dm_tokenizer_load(&t, path_of("atj"), DM_CASE_FILE));
        if (t) CHECK(ids_are(t, c[k].text, 1, c[k].ids, (size_t)c[k].n));
        /* saved (as dmove export saves it) and read back: the same ids */
        char dir[32];
        snprintf(dir, sizeof dir, "atj_saved%zu", k);
        CHECK(mkdir(path_of(dir), 0700) == 0);
        if (t) CHECK_OK(dm_tokenizer_save(t, path_of(dir), 64, NULL));
        CHECK_OK(dm_tokenizer_load(&back, path_of(dir), DM_CASE_FILE));
        if (back) CHECK(ids_are(back, c[k].text, 1, c[k].ids, (size_t)c[k].n));
        dm_tokenizer_free(back);
        dm_tokenizer_free(t);
    }
    dm_tokenizer *t = NULL;
    write_file("atj/tokenizer_config.json", cfg, sizeof cfg - 1);
    static const char *const bad[] = {"[\"foo\"]", "{\"foo\": \"8\"}", "{\"foo\": 1, \"foo\": 2}", "{\"foo\": null}"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        write_file("atj/added_tokens.json", bad[k], strlen(bad[k]));
        CHECK(dm_tokenizer_load(&t, path_of("atj"), DM_CASE_FILE) == DM_ERR_FORMAT &&
              strstr(dm_last_error(), "added_tokens.json"));
        CHECK(t == NULL);
    }
}

static void test_hostile(void) {
    dm_tokenizer *t = (dm_tokenizer *)1;
    CHECK(dm_tokenizer_load(&t, path_of("missing.json"), DM_CASE_FILE) == DM_ERR_IO && t == NULL);
    CHECK(strstr(dm_last_error(), "missing.json") != NULL);
    /* a directory: its tokenizer.json or vocab.txt (a model's directory); none there */
    CHECK(mkdir(path_of("nothing"), 0700) == 0);
    CHECK(dm_tokenizer_load(&t, path_of("nothing"), DM_CASE_FILE) == DM_ERR_IO && strstr(dm_last_error(), "directory"));
    CHECK(dm_tokenizer_load(NULL, "x", DM_CASE_FILE) == DM_ERR_INVALID_ARG);
    CHECK(dm_tokenizer_load(&t, NULL, DM_CASE_FILE) == DM_ERR_INVALID_ARG);
    refused("bpe.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}", DM_CASE_FILE,
            DM_ERR_UNSUPPORTED, "only WordPiece (BERT)");
    refused("unigram.json", "{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}", DM_CASE_FILE,
            DM_ERR_UNSUPPORTED, "is Unigram");
    refused("untyped.json", "{\"model\":{\"vocab\":{\"a\":0},\"merges\":[]}}", DM_CASE_FILE, DM_ERR_UNSUPPORTED, "BPE");
    refused("trunc.json", WP_HEAD "{\"[UNK]\":0,\"a\":", DM_CASE_FILE, DM_ERR_FORMAT, "not valid JSON");
    refused("empty.json", "", DM_CASE_LOWER, DM_ERR_FORMAT, "is empty");
    refused("array.json", "[1,2]", DM_CASE_FILE, DM_ERR_FORMAT, "not a JSON object"); /* not taken for a vocab.txt */
    refused("vocabarr.json", WP_HEAD "[\"a\"]}}", DM_CASE_FILE, DM_ERR_FORMAT, "model.vocab is an array");
    refused("strid.json", WP_HEAD "{\"[UNK]\":\"0\"}}}", DM_CASE_FILE, DM_ERR_FORMAT, "not an integer");
    refused("negid.json", WP_HEAD "{\"[UNK]\":0,\"a\":-1}}}", DM_CASE_FILE, DM_ERR_FORMAT, "not an integer in");
    refused("hugeid.json", WP_HEAD "{\"[UNK]\":0,\"a\":1e300}}}", DM_CASE_FILE, DM_ERR_FORMAT, "not an integer in");
    refused("fracid.json", WP_HEAD "{\"[UNK]\":0,\"a\":1.5}}}", DM_CASE_FILE, DM_ERR_FORMAT, "not an integer in");
    refused("dupid.json", WP_HEAD "{\"[UNK]\":0,\"a\":1,\"b\":1}}}", DM_CASE_FILE, DM_ERR_FORMAT, "given twice");
    refused("hole.json", WP_HEAD "{\"[UNK]\":0,\"a\":1,\"b\":30}}}", DM_CASE_FILE, DM_ERR_FORMAT, "without holes");
    refused("duptok.json", WP_HEAD "{\"[UNK]\":0,\"a\":1,\"a\":2}}}", DM_CASE_FILE, DM_ERR_FORMAT, "appears twice");
    refused("emptyvocab.json", WP_HEAD "{}}}", DM_CASE_FILE, DM_ERR_FORMAT, "empty");
    refused("nounk.json", WP_HEAD "{\"a\":0}}}", DM_CASE_FILE, DM_ERR_FORMAT, "unknown token");
    refused("badutf.json", WP_HEAD "{\"[UNK]\":0,\"a\xff\":1}}}", DM_CASE_FILE, DM_ERR_FORMAT, "UTF-8");
    refused("norm.json", "{\"normalizer\":{\"type\":\"NFKC\"}," WP_BODY "{\"[UNK]\":0}}}", DM_CASE_FILE,
            DM_ERR_UNSUPPORTED, "BertNormalizer");
    refused("pretok.json", "{\"pre_tokenizer\":{\"type\":\"ByteLevel\"}," WP_BODY "{\"[UNK]\":0}}}", DM_CASE_FILE,
            DM_ERR_UNSUPPORTED, "BertPreTokenizer");
    refused("normtype.json", "{\"normalizer\":{\"type\":\"BertNormalizer\",\"clean_text\":true,\"handle_chinese_chars\":true,\"lowercase\":1}," WP_BODY "{\"[UNK]\":0}}}",
            DM_CASE_FILE, DM_ERR_FORMAT, "lowercase is a number");
    refused("added1.json", "{\"added_tokens\":[{\"id\":0,\"content\":\"[X]\"}],"  WP_BODY "{\"[UNK]\":0}}}", DM_CASE_FILE,
            DM_ERR_FORMAT, "single_word is missing");
    refused("empty.json", "", DM_CASE_FILE, DM_ERR_FORMAT, "is empty");
    refused("blank.txt", " \n\t\n", DM_CASE_LOWER, DM_ERR_FORMAT, "is empty");
    refused("notjson.json", "[PAD]\n[UNK]\n", DM_CASE_FILE, DM_ERR_FORMAT, "not a JSON object");
    refused("added2.json", "{\"added_tokens\":[{\"id\":0,\"content\":\"[X]\",\"single_word\":false,\"lstrip\":false,"
            "\"rstrip\":false,\"normalized\":false,\"special\":true}]," WP_BODY "{\"[UNK]\":0}}}", DM_CASE_FILE,
            DM_ERR_FORMAT, "gives to");
    /* an added token that is the vocabulary's under another id: tokenizers would renumber */
    refused("added3.json", "{\"added_tokens\":[{\"id\":2,\"content\":\"a\",\"single_word\":false,\"lstrip\":false,"
            "\"rstrip\":false,\"normalized\":true,\"special\":false}]," WP_BODY "{\"[UNK]\":0,\"a\":1}}}",
            DM_CASE_FILE, DM_ERR_FORMAT, "the vocabulary has it as id 1");
    refused("noprefix.json", "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"max_input_chars_per_word\":100,"
            "\"vocab\":{\"[UNK]\":0}}}", DM_CASE_FILE, DM_ERR_FORMAT, "continuing_subword_prefix is missing");
    refused("negmax.json", "{\"model\":{\"type\":\"WordPiece\",\"unk_token\":\"[UNK]\",\"continuing_subword_prefix\":\"##\","
            "\"max_input_chars_per_word\":-1,\"vocab\":{\"[UNK]\":0}}}", DM_CASE_FILE, DM_ERR_FORMAT, "max_input_chars_per_word");
    refused("model.json", "{\"model\":7}", DM_CASE_FILE, DM_ERR_FORMAT, "\"model\" is a number");
    refused("vocab.json", "{\"a\":0,\"b\":1}", DM_CASE_FILE, DM_ERR_FORMAT, "not a Hugging Face tokenizer.json");
    refused("casing.json", WP_HEAD "{\"[UNK]\":0}}}", DM_CASE_LOWER, DM_ERR_INVALID_ARG, "own casing");
    refused("vocab1.txt", "[UNK]\na\n", DM_CASE_FILE, DM_ERR_INVALID_ARG, "choose lowercase");
    refused("vocab2.txt", "[UNK]\na\na\n", DM_CASE_CASED, DM_ERR_FORMAT, "appears twice");
    refused("vocab3.txt", "a\nb\n", DM_CASE_CASED, DM_ERR_FORMAT, "no [UNK]");
    refused("vocab4.txt", "[UNK]\na\xc3\n", DM_CASE_CASED, DM_ERR_FORMAT, "line 2");
    char *big = malloc(10000);
    if (big) {
        memcpy(big, "[UNK]\n", 6);
        memset(big + 6, 'x', 9000);
        big[9006] = 0;
        refused("vocab5.txt", big, DM_CASE_LOWER, DM_ERR_FORMAT, "line 2 has 9000 bytes");
        free(big);
    }
    /* a 2 GiB vocab.txt of one line (sparse: written in no time) is refused before it is read */
    FILE *f = fopen(path_of("huge.txt"), "wb");
    if (f && ftruncate(fileno(f), (off_t)2 << 30) == 0) {
        fclose(f);
        t = (dm_tokenizer *)1;
        CHECK(dm_tokenizer_load(&t, path_of("huge.txt"), DM_CASE_LOWER) == DM_ERR_FORMAT && t == NULL);
        CHECK(strstr(dm_last_error(), "at most 1 GiB") != NULL);
        unlink(path_of("huge.txt"));
    } else if (f) {
        fclose(f);
    }
    /* trailing whitespace goes, interior stays: "b " is "b"; CRLF lines */
    dm_tokenizer *v = NULL;
    CHECK_OK(dm_tokenizer_load(&v, write_file("vocab6.txt", "[UNK]\r\nb \r\n##b\n", 15), DM_CASE_CASED));
    if (v) {
        CHECK(dm_tokenizer_token_id(v, "b") == 1 && dm_tokenizer_token_id(v, "##b") == 2);
        CHECK(dm_tokenizer_vocab_size(v) == 7); /* + [SEP] [PAD] [CLS] [MASK] as BertTokenizerFast adds them */
        IDS(v, "bb", 1, 5, 1, 2, 3);
        dm_special_ids sp;
        CHECK(dm_tokenizer_specials(v, &sp) == DM_ERR_NOT_FOUND && strstr(dm_last_error(), "[PAD] [CLS] [SEP] [MASK]"));
        dm_tokenizer_free(v);
    }
    dm_tokenizer_free(NULL);
    CHECK(dm_tokenizer_vocab_size(NULL) == 0 && dm_tokenizer_hash(NULL) == 0);
    CHECK(!strcmp(dm_tokenizer_describe(NULL), ""));
}

#ifndef REF_DIR
#define REF_DIR "tests/ref"
#endif

/* dm_truncate_pair against tokenizers' "longest_first" (tests/ref/truncate_pair.txt, by
 * make_truncate_ref.py): every case. */
static void test_truncate_pair(void) {
    FILE *f = fopen(REF_DIR "/truncate_pair.txt", "r");
    CHECK(f != NULL);
    if (!f) return;
    long la, lb, room, ka, kb;
    int n = 0, cut = 0, odd = 0;
    while (fscanf(f, "%ld %ld %ld %ld %ld", &la, &lb, &room, &ka, &kb) == 5) {
        int64_t a = -1, b = -1;
        dm_truncate_pair(la, lb, room, &a, &b);
        CHECK(a == ka && b == kb);
        if (a != ka || b != kb)
            fprintf(stderr, "  truncate (%ld, %ld) to %ld: (%lld, %lld), tokenizers (%ld, %ld)\n", la, lb, room,
                    (long long)a, (long long)b, ka, kb);
        n++, cut += la + lb > room, odd += la > room / 2 && lb > room / 2 && room % 2;
    }
    fclose(f);
    CHECK(n == 1728 && cut > 600 && odd > 100);
    printf("  truncate_pair: %d cases (%d cut, %d with both halves cut and an odd room) as tokenizers\n", n, cut, odd);
}

int main(void) {
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_utf8();
    test_lower();
    test_cased_and_keep();
    test_dir_config();
    test_added();
    test_added_tokens_json();
    test_hostile();
    test_truncate_pair();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (getenv("DMOVE_TEST_KEEP")) printf("kept %s\n", g_dir);
    else if (system(cmd) != 0) fprintf(stderr, "note: could not remove %s\n", g_dir);
    TEST_END();
}
