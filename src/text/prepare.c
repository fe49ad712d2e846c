/* prepare.c: `dmove prepare`'s library half (include/dmove_data.h, dm_prepare): text files
 * read in large chunks, split in lines (a line a sentence; blank lines or files end
 * documents), tokenized on threads, the documents dealt to the training shards or the
 * held-out one by a seeded draw, and the dataset directory written under a temporary name
 * and renamed at the end, with nothing left behind on any error. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "core/file.h"
#include "core/philox.h"
#include "core/status.h"
#include "dmove_data.h"
#include "text/tok_internal.h"

#define CHUNK_BYTES ((size_t)16 << 20)
#define VALID_STREAM 0x76616c69u /* "vali" */

/* A special token BertTokenizerFast would add with a new id because the file's vocabulary
 * lacks it (the tokenizer does so, to give Hugging Face's ids) cannot train a model whose
 * embedding is the vocabulary's: refused here, naming them all. */
static dm_status check_specials_in_vocab(const dm_tokenizer *t) {
    char missing[400] = "";
    size_t o = 0;
    for (int k = 0; k < 5; k++) {
        const char *name = t->special_names[k];
        if (tok_map_get(&t->full, name, strlen(name)) < 0 && o < sizeof missing - 80)
            o += (size_t)snprintf(missing + o, sizeof missing - o, "%s%s", o ? " " : "", name);
    }
    if (o)
        return dm_fail(DM_ERR_NOT_FOUND, "the tokenizer's vocabulary lacks %s: masked-LM pretraining needs "
                       "[PAD] [UNK] [CLS] [SEP] [MASK] in it; use a BERT vocabulary that has them", missing);
    return DM_OK;
}

dm_status dm_vocab_info_from(const dm_tokenizer *t, dm_vocab_info *out) {
    if (!t || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_vocab_info_from: NULL argument");
    memset(out, 0, sizeof *out);
    DM_TRY(dm_tokenizer_specials(t, &out->special));
    DM_TRY(check_specials_in_vocab(t));
    out->hash = dm_tokenizer_hash(t);
    out->vocab_size = dm_tokenizer_vocab_size(t);
    return DM_OK;
}

void dm_prepare_config_default(dm_prepare_config *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->shard_bytes = (uint64_t)128 << 20;
    c->seed = 1;
}

typedef struct {
    const dm_tokenizer *t;
    const dm_prepare_config *cfg;
    dm_vocab_info v;
    char *tmp;                      /* the temporary directory */
    dm_shard_writer *train, *valid;
    size_t train_shards;
    cJSON *train_list, *valid_list; /* the manifest's shard entries */
    dm_shard_info tr, va;           /* the splits' totals */
    uint64_t doc_index;             /* documents begun */
    int dest;                       /* the open document's split: -1 none yet, 0 train, 1 valid */
    uint32_t valid_thr;
    /* one chunk's lines */
    const char **texts;
    size_t *lens, lines_cap;
    dm_ids *ids;
    dm_prepare_progress prog;
    double t0;
} prep;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void add_info(dm_shard_info *sum, const dm_shard_info *x) {
    sum->documents += x->documents;
    sum->sentences += x->sentences;
    sum->tokens += x->tokens;
    sum->unknown += x->unknown;
    sum->bytes += x->bytes;
}

static cJSON *info_json(const dm_shard_info *in, const char *file) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    if (file) cJSON_AddStringToObject(o, "file", file);
    cJSON_AddNumberToObject(o, "documents", (double)in->documents);
    cJSON_AddNumberToObject(o, "sentences", (double)in->sentences);
    cJSON_AddNumberToObject(o, "tokens", (double)in->tokens);
    cJSON_AddNumberToObject(o, "unknown", (double)in->unknown);
    cJSON_AddNumberToObject(o, "bytes", (double)in->bytes);
    return o;
}

/* Writes writer w as tmp/name, records it in list and adds it to sum. */
static dm_status flush_shard(prep *p, dm_shard_writer *w, const char *name, cJSON *list, dm_shard_info *sum) {
    dm_shard_info in;
    DM_TRY(dm_shard_writer_end_document(w));
    DM_TRY(dm_shard_writer_info(w, &in));
    size_t len = strlen(p->tmp) + strlen(name) + 2;
    char *path = malloc(len);
    if (!path) return dm_fail(DM_ERR_OOM, "out of memory");
    snprintf(path, len, "%s/%s", p->tmp, name);
    dm_status st = dm_shard_writer_write(w, path);
    free(path);
    if (st != DM_OK) return st;
    cJSON *o = info_json(&in, name);
    if (!o || !cJSON_AddItemToArray(list, o)) {
        cJSON_Delete(o);
        return dm_fail(DM_ERR_OOM, "out of memory");
    }
    add_info(sum, &in);
    return DM_OK;
}

static dm_status flush_train(prep *p) {
    char name[64];
    snprintf(name, sizeof name, "train-%05zu.shard", p->train_shards);
    DM_TRY(flush_shard(p, p->train, name, p->train_list, &p->tr));
    p->train_shards++;
    return DM_OK;
}

/* Ends the open document; a training shard past the size limit is written. */
static dm_status end_document(prep *p) {
    if (p->dest < 0) return DM_OK;
    dm_shard_writer *w = p->dest ? p->valid : p->train;
    DM_TRY(dm_shard_writer_end_document(w));
    p->dest = -1;
    dm_shard_info in;
    DM_TRY(dm_shard_writer_info(p->train, &in));
    if (in.bytes >= p->cfg->shard_bytes && in.documents > 0) DM_TRY(flush_train(p));
    return DM_OK;
}

static dm_status add_sentence(prep *p, const dm_ids *ids) {
    if (ids->n == 0) return DM_OK; /* nothing the tokenizer kept (e.g. control characters) */
    if (p->dest < 0) { /* a new document: which split */
        uint32_t w = 0;
        dm_philox_words(p->cfg->seed, VALID_STREAM, p->doc_index++, 1, &w);
        p->dest = w < p->valid_thr;
    }
    return dm_shard_writer_add_sentence(p->dest ? p->valid : p->train, ids->v, ids->n);
}

/* A line of whitespace alone, as Python's str.strip() (BERT's create_pretraining_data)
 * sees it: ASCII's, U+001C..U+001F, U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028,
 * U+2029, U+202F, U+205F, U+3000, each byte matched exactly (a line with any other byte,
 * invalid UTF-8 included, is not blank: the encoder judges it). */
static int blank(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    for (size_t k = 0; k < n;) {
        const unsigned char c = s[k];
        if (c == ' ' || c == '\t' || c == '\v' || c == '\f' || c == '\r' || (c >= 0x1c && c <= 0x1f)) {
            k++;
        } else if (c == 0xC2 && k + 1 < n && (s[k + 1] == 0x85 || s[k + 1] == 0xA0)) {
            k += 2;
        } else if (k + 2 < n && ((c == 0xE1 && s[k + 1] == 0x9A && s[k + 2] == 0x80) ||
                                 (c == 0xE2 && s[k + 1] == 0x80 &&
                                  ((s[k + 2] >= 0x80 && s[k + 2] <= 0x8A) || s[k + 2] == 0xA8 || s[k + 2] == 0xA9 ||
                                   s[k + 2] == 0xAF)) ||
                                 (c == 0xE2 && s[k + 1] == 0x81 && s[k + 2] == 0x9F) ||
                                 (c == 0xE3 && s[k + 1] == 0x80 && s[k + 2] == 0x80))) {
            k += 3; /* E2 80 80..8A: U+2000..U+200A */
        } else {
            return 0;
        }
    }
    return 1;
}

static dm_status grow_lines(prep *p, size_t need) {
    if (need <= p->lines_cap) return DM_OK;
    size_t cap = p->lines_cap ? p->lines_cap : 4096;
    while (cap < need) cap *= 2;
    const char **t = realloc(p->texts, cap * sizeof *t);
    if (t) p->texts = t;
    size_t *l = t ? realloc(p->lens, cap * sizeof *l) : NULL;
    if (l) p->lens = l;
    dm_ids *ids = l ? realloc(p->ids, cap * sizeof *ids) : NULL;
    if (!ids) return dm_fail(DM_ERR_OOM, "out of memory for %zu lines", cap);
    memset(ids + p->lines_cap, 0, (cap - p->lines_cap) * sizeof *ids);
    p->ids = ids;
    p->lines_cap = cap;
    return DM_OK;
}

/* The lines of buf[0, len) (the last one may lack its "\n"), the file offset of buf[0]
 * `base`: tokenized together, then put in documents in order. */
static dm_status do_lines(prep *p, const char *file, const char *buf, size_t len, uint64_t base) {
    size_t n = 0;
    for (size_t at = 0; at < len;) {
        const char *nl = memchr(buf + at, '\n', len - at);
        size_t end = nl ? (size_t)(nl - buf) : len, l = end - at;
        if (l > 0 && buf[at + l - 1] == '\r') l--;
        DM_TRY(grow_lines(p, n + 1));
        p->texts[n] = buf + at;
        p->lens[n] = blank(buf + at, l) ? 0 : l; /* a blank line: no ids, a document's end */
        p->ids[n].n = 0;
        n++;
        at = end + 1;
    }
    size_t bad_index = (size_t)-1, bad_offset = (size_t)-1;
    dm_status st = dm_tokenizer_encode_batch(p->t, p->texts, p->lens, n, 0, p->cfg->threads, p->ids,
                                             &bad_index, &bad_offset);
    if (st != DM_OK) {
        if (st == DM_ERR_FORMAT && base == 0 && len >= 2 && (unsigned char)buf[0] == 0x1f &&
            (unsigned char)buf[1] == 0x8b)
            return dm_fail(DM_ERR_FORMAT, "'%s' is gzip-compressed, not text: decompress it first (zcat '%s' > "
                           "FILE.txt)", file, file);
        if (st == DM_ERR_FORMAT && bad_index < n && bad_offset != (size_t)-1)
            return dm_fail(DM_ERR_FORMAT, "'%s': invalid UTF-8 at byte offset %" PRIu64 " (line starting at "
                           "byte %" PRIu64 "): convert the file to UTF-8 (e.g. iconv) or remove the bad bytes",
                           file, base + (uint64_t)(p->texts[bad_index] - buf) + bad_offset,
                           base + (uint64_t)(p->texts[bad_index] - buf));
        return dm_fail_context(st, "tokenizing '%s': ", file);
    }
    for (size_t k = 0; k < n; k++) {
        if (p->lens[k] == 0) {
            if (!p->cfg->doc_per_file) DM_TRY(end_document(p));
            continue;
        }
        DM_TRY(add_sentence(p, &p->ids[k]));
        p->prog.sentences += p->ids[k].n > 0;
        p->prog.tokens += p->ids[k].n;
        for (size_t t = 0; t < p->ids[k].n; t++) p->prog.unknown += p->ids[k].v[t] == p->v.special.unk;
    }
    return DM_OK;
}

static void report(prep *p) {
    p->prog.documents = p->doc_index;
    p->prog.seconds = now_s() - p->t0;
    if (p->cfg->progress) p->cfg->progress(p->cfg->progress_ctx, &p->prog);
}

/* One file, chunk by chunk (a chunk ends at its last "\n"; a longer line grows it). */
static dm_status do_file(prep *p, const char *file, char **buf, size_t *cap) {
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return dm_fail(DM_ERR_IO, "cannot open '%s': %s", file, strerror(errno));
    size_t have = 0;
    uint64_t base = 0;
    dm_status st = DM_OK;
    for (;;) {
        if (have == *cap) {
            char *nb = *cap < SIZE_MAX / 2 ? realloc(*buf, *cap * 2) : NULL;
            if (!nb) {
                st = dm_fail(DM_ERR_OOM, "'%s': a line longer than %zu bytes does not fit in memory", file, *cap);
                break;
            }
            *buf = nb;
            *cap *= 2;
        }
        ssize_t r = read(fd, *buf + have, *cap - have);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = dm_fail(DM_ERR_IO, "error reading '%s': %s", file, strerror(errno));
            break;
        }
        if (r == 0) { /* the end: the last line without its "\n" */
            if (have > 0) st = do_lines(p, file, *buf, have, base);
            p->prog.bytes_done += have;
            break;
        }
        have += (size_t)r;
        const char *last = NULL;
        for (size_t k = have; k > 0 && !last; k--)
            if ((*buf)[k - 1] == '\n') last = *buf + k - 1;
        if (!last) continue;
        size_t used = (size_t)(last - *buf) + 1;
        if ((st = do_lines(p, file, *buf, used, base)) != DM_OK) break;
        memmove(*buf, *buf + used, have - used);
        have -= used;
        base += used;
        p->prog.bytes_done += used;
        report(p);
    }
    close(fd);
    if (st == DM_OK) st = end_document(p);
    return st;
}

/* Every input a readable regular file or pipe; their total size (a pipe counts 0). */
static dm_status check_inputs(const char *const *files, size_t n, uint64_t *total) {
    *total = 0;
    if (n == 0) return dm_fail(DM_ERR_INVALID_ARG, "no text file given");
    for (size_t k = 0; k < n; k++) {
        struct stat st;
        if (!files[k]) return dm_fail(DM_ERR_INVALID_ARG, "dm_prepare: NULL file name");
        if (stat(files[k], &st) != 0) return dm_fail(DM_ERR_IO, "cannot read '%s': %s", files[k], strerror(errno));
        if (S_ISDIR(st.st_mode))
            return dm_fail(DM_ERR_INVALID_ARG, "'%s' is a directory: give the text files in it (e.g. %s/*.txt)",
                           files[k], files[k]);
        if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) /* a pipe: <(zcat x.gz) */
            return dm_fail(DM_ERR_INVALID_ARG, "'%s' is not a regular file or a pipe", files[k]);
        if (access(files[k], R_OK) != 0)
            return dm_fail(DM_ERR_IO, "cannot read '%s': %s", files[k], strerror(errno));
        if (S_ISREG(st.st_mode)) *total += (uint64_t)st.st_size;
    }
    return DM_OK;
}

/* Removes a directory of plain files (ours: the temporary one, or the dataset replaced). */
static void remove_flat(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char path[4096];
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            int n = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (n > 0 && (size_t)n < sizeof path) unlink(path); /* best effort, after an error reported */
        }
        closedir(d);
    }
    rmdir(dir);
}

/* out_dir may be written: absent, an empty directory, or (force) a dataset. *replace: 1
 * when a dataset is there. */
static dm_status check_out(const char *out, int force, int *replace) {
    struct stat st;
    *replace = 0;
    if (lstat(out, &st) != 0) {
        if (errno == ENOENT) return DM_OK;
        return dm_fail(DM_ERR_IO, "cannot use '%s': %s", out, strerror(errno));
    }
    if (!S_ISDIR(st.st_mode)) return dm_fail(DM_ERR_INVALID_ARG, "'%s' exists and is not a directory: choose another --out", out);
    DIR *d = opendir(out);
    if (!d) return dm_fail(DM_ERR_IO, "cannot read directory '%s': %s", out, strerror(errno));
    int entries = 0, manifest = 0, subdir = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        entries++;
        manifest |= !strcmp(e->d_name, "dataset.json");
        subdir |= e->d_type == DT_DIR;
    }
    closedir(d);
    if (entries == 0) return DM_OK;
    if (!manifest || subdir)
        return dm_fail(DM_ERR_INVALID_ARG, "'%s' is not empty and holds no dataset: choose another --out", out);
    if (!force)
        return dm_fail(DM_ERR_INVALID_ARG, "'%s' already holds a dataset: give --force to replace it, or "
                       "choose another --out", out);
    *replace = 1;
    return DM_OK;
}

static dm_status write_manifest(prep *p, const dm_prepare_stats *s) {
    cJSON *root = cJSON_CreateObject(), *tok = cJSON_CreateObject(), *set = cJSON_CreateObject();
    cJSON *src = cJSON_CreateObject(), *splits = cJSON_CreateObject();
    cJSON *tr = info_json(&p->tr, NULL), *va = p->valid ? info_json(&p->va, NULL) : NULL;
    char hash[20];
    snprintf(hash, sizeof hash, "%016" PRIx64, p->v.hash);
    dm_status st = DM_OK;
    if (!root || !tok || !set || !src || !splits || !tr || (p->valid && !va)) {
        st = dm_fail(DM_ERR_OOM, "out of memory");
        cJSON_Delete(tok), cJSON_Delete(set), cJSON_Delete(src), cJSON_Delete(splits), cJSON_Delete(tr), cJSON_Delete(va);
        cJSON_Delete(root);
        return st;
    }
    cJSON_AddStringToObject(root, "format", "dmove-dataset");
    cJSON_AddNumberToObject(root, "version", 1);
    cJSON_AddStringToObject(tok, "hash", hash);
    cJSON_AddStringToObject(tok, "description", dm_tokenizer_describe(p->t));
    cJSON_AddNumberToObject(tok, "vocab_size", p->v.vocab_size);
    if (p->cfg->tokenizer_path) cJSON_AddStringToObject(tok, "path", p->cfg->tokenizer_path);
    cJSON_AddItemToObject(root, "tokenizer", tok);
    cJSON_AddNumberToObject(set, "valid_fraction", p->cfg->valid_fraction);
    cJSON_AddBoolToObject(set, "doc_per_file", p->cfg->doc_per_file != 0);
    cJSON_AddNumberToObject(set, "shard_bytes", (double)p->cfg->shard_bytes);
    cJSON_AddNumberToObject(set, "seed", (double)p->cfg->seed);
    cJSON_AddItemToObject(root, "settings", set);
    cJSON_AddNumberToObject(src, "files", (double)s->files);
    cJSON_AddNumberToObject(src, "bytes", (double)s->bytes);
    cJSON_AddItemToObject(root, "sources", src);
    cJSON_AddItemToObject(tr, "shards", p->train_list);
    p->train_list = NULL;
    cJSON_AddItemToObject(splits, "train", tr);
    if (va) {
        cJSON_AddItemToObject(va, "shards", p->valid_list);
        p->valid_list = NULL;
        cJSON_AddItemToObject(splits, "valid", va);
    }
    cJSON_AddItemToObject(root, "splits", splits);
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    if (!text) return dm_fail(DM_ERR_OOM, "out of memory");
    size_t len = strlen(p->tmp) + 16;
    char *path = malloc(len);
    if (path) {
        snprintf(path, len, "%s/dataset.json", p->tmp);
        size_t tl = strlen(text);
        text[tl] = '\n'; /* cJSON_Print ends without one: the NUL becomes it */
        st = dm_write_file_atomic(path, text, tl + 1);
    } else {
        st = dm_fail(DM_ERR_OOM, "out of memory");
    }
    free(path);
    free(text);
    return st;
}

/* The temporary directory beside out (out without trailing slashes). */
static dm_status make_tmp(prep *p, const char *out) {
    size_t len = strlen(out) + 16;
    p->tmp = malloc(len);
    if (!p->tmp) return dm_fail(DM_ERR_OOM, "out of memory");
    snprintf(p->tmp, len, "%s.tmp-XXXXXX", out);
    if (!mkdtemp(p->tmp)) {
        dm_status st = dm_fail(DM_ERR_IO, "cannot create a directory beside '%s': %s (does the directory above "
                               "it exist, and can it be written?)", out, strerror(errno));
        free(p->tmp);
        p->tmp = NULL;
        return st;
    }
    return DM_OK;
}

/* The temporary directory becomes out (a dataset there, with force, is replaced). */
static dm_status install(prep *p, const char *out, int replace) {
    char *old = NULL;
    if (replace) {
        size_t len = strlen(out) + 16;
        old = malloc(len);
        if (!old) return dm_fail(DM_ERR_OOM, "out of memory");
        snprintf(old, len, "%s.old-XXXXXX", out);
        if (!mkdtemp(old) || rename(out, old) != 0) {
            dm_status st = dm_fail(DM_ERR_IO, "cannot move the old dataset '%s' aside: %s", out, strerror(errno));
            rmdir(old);
            free(old);
            return st;
        }
    }
    if (rename(p->tmp, out) != 0) {
        dm_status st = dm_fail(DM_ERR_IO, "cannot rename '%s' to '%s': %s", p->tmp, out, strerror(errno));
        if (old && rename(old, out) != 0) { /* put the old one back; nothing more to do if that fails */
        }
        free(old);
        return st;
    }
    if (old) remove_flat(old);
    free(old);
    free(p->tmp);
    p->tmp = NULL;
    return DM_OK;
}

static dm_status prepare_setup(prep *p, const dm_tokenizer *t, const dm_prepare_config *cfg) {
    p->t = t;
    p->cfg = cfg;
    p->dest = -1;
    dm_status st = dm_vocab_info_from(t, &p->v);
    if (st != DM_OK)
        return dm_fail_context(st, "the tokenizer cannot make training data (the loader needs [PAD] [UNK] [CLS] "
                               "[SEP] [MASK]): ");
    if (!(cfg->valid_fraction >= 0 && cfg->valid_fraction <= 0.5))
        return dm_fail(DM_ERR_INVALID_ARG, "valid fraction %g: give a value in [0, 0.5]", cfg->valid_fraction);
    if (cfg->threads < 0) return dm_fail(DM_ERR_INVALID_ARG, "threads %d: give 0 (all cores) or more", cfg->threads);
    p->valid_thr = dm_fraction_threshold(cfg->valid_fraction);
    DM_TRY(dm_shard_writer_new(&p->train, &p->v));
    if (cfg->valid_fraction > 0) DM_TRY(dm_shard_writer_new(&p->valid, &p->v));
    p->train_list = cJSON_CreateArray();
    p->valid_list = cJSON_CreateArray();
    if (!p->train_list || !p->valid_list) return dm_fail(DM_ERR_OOM, "out of memory");
    return DM_OK;
}

static void prepare_free(prep *p) {
    if (p->tmp) remove_flat(p->tmp);
    free(p->tmp);
    dm_shard_writer_free(p->train);
    dm_shard_writer_free(p->valid);
    cJSON_Delete(p->train_list);
    cJSON_Delete(p->valid_list);
    for (size_t k = 0; k < p->lines_cap; k++) dm_ids_free(&p->ids[k]);
    free(p->ids);
    free(p->texts);
    free(p->lens);
}

/* Reads every file, then writes the last shards and the manifest into p->tmp. */
static dm_status prepare_run(prep *p, const char *const *files, size_t nfiles, dm_prepare_stats *s) {
    size_t cap = CHUNK_BYTES;
    char *buf = malloc(cap);
    if (!buf) return dm_fail(DM_ERR_OOM, "out of memory");
    dm_status st = DM_OK;
    for (size_t k = 0; k < nfiles && st == DM_OK; k++) {
        p->prog.file = k;
        st = do_file(p, files[k], &buf, &cap);
    }
    free(buf);
    if (st != DM_OK) return st;
    report(p);
    if (p->prog.tokens == 0)
        return dm_fail(DM_ERR_INVALID_ARG, "the text holds no token (%zu file%s, %" PRIu64 " bytes): the corpus "
                       "is empty or blank", nfiles, nfiles == 1 ? "" : "s", p->prog.bytes_total);
    dm_shard_info in;
    DM_TRY(dm_shard_writer_info(p->train, &in));
    if (in.documents > 0 || p->train_shards == 0) DM_TRY(flush_train(p));
    if (p->tr.documents == 0)
        return dm_fail(DM_ERR_INVALID_ARG, "all %" PRIu64 " documents were drawn for the valid split: give a "
                       "smaller --valid-fraction or more text", p->doc_index);
    if (p->valid) DM_TRY(flush_shard(p, p->valid, "valid.shard", p->valid_list, &p->va));
    s->bytes = p->prog.bytes_done; /* pipes included */
    s->train = p->tr;
    s->valid = p->va;
    s->train_shards = p->train_shards;
    s->has_valid = p->valid != NULL;
    return write_manifest(p, s);
}

dm_status dm_prepare(const dm_tokenizer *t, const char *const *files, size_t nfiles, const char *out_dir,
                     const dm_prepare_config *cfg, dm_prepare_stats *stats) {
    if (!t || (!files && nfiles) || !out_dir || !cfg) return dm_fail(DM_ERR_INVALID_ARG, "dm_prepare: NULL argument");
    dm_prepare_stats s = {0};
    prep p = {0};
    p.t0 = now_s();
    size_t olen = strlen(out_dir);
    while (olen > 1 && out_dir[olen - 1] == '/') olen--;
    char *out = strndup(out_dir, olen);
    if (!out || !*out) {
        free(out);
        return dm_fail(out ? DM_ERR_INVALID_ARG : DM_ERR_OOM, "dm_prepare: no output directory given");
    }
    int replace = 0;
    dm_status st = prepare_setup(&p, t, cfg);
    if (st == DM_OK) st = check_inputs(files, nfiles, &p.prog.bytes_total);
    if (st == DM_OK) st = check_out(out, cfg->force, &replace);
    p.prog.files = nfiles;
    s.files = nfiles;
    s.bytes = p.prog.bytes_total;
    if (st == DM_OK) st = make_tmp(&p, out);
    if (st == DM_OK) st = prepare_run(&p, files, nfiles, &s);
    if (st == DM_OK) st = install(&p, out, replace);
    s.seconds = now_s() - p.t0;
    prepare_free(&p);
    free(out);
    if (st == DM_OK && stats) *stats = s;
    return st;
}
