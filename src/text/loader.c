/* loader.c: the masked-LM batch loader's handle (include/dmove_data.h): opening a dataset
 * split or shard list against the model's vocabulary, and the background thread that keeps
 * the next batches ready in a ring of slots while next() hands them out in order and
 * counts the time it waited. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/status.h"
#include "text/loader_internal.h"

struct dm_loader {
    dm_seqset s;
    dm_batch *slots;
    int nslots;
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t ready, space;
    int stop;
    int64_t filled; /* batches < filled are built (the producer builds them in order) */
    int64_t keep;   /* the slot of this step and later ones may not be overwritten */
    int64_t next;   /* the step next() hands out */
    double wait;
    int64_t calls;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

void dm_loader_config_default(dm_loader_config *c) {
    if (!c) return;
    memset(c, 0, sizeof *c);
    c->batch = 32;
    c->seq = 128;
    c->seed = 1;
    c->mode = DM_SEQ_PACKED;
    c->shuffle = 1;
    c->mask_prob = 0.15;
    c->mask_token_prob = 0.8;
    c->random_token_prob = 0.1;
    c->prefetch = 4;
}

dm_status dm_batch_alloc(dm_batch *b, int64_t batch, int64_t seq) {
    if (!b) return dm_fail(DM_ERR_INVALID_ARG, "dm_batch_alloc: NULL argument");
    memset(b, 0, sizeof *b);
    size_t n;
    if (batch < 1 || seq < 1 || !dm_mul_ok((size_t)batch, (size_t)seq, &n) || n > ((size_t)1 << 40))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_batch_alloc: %lld x %lld", (long long)batch, (long long)seq);
    b->batch = batch;
    b->seq = seq;
    b->input_ids = malloc(n * sizeof(int32_t));
    b->token_type_ids = malloc(n * sizeof(int32_t));
    b->attention_mask = malloc(n * sizeof(int32_t));
    b->labels = malloc(n * sizeof(int32_t));
    b->nsp_labels = malloc((size_t)batch * sizeof(int32_t));
    b->sequence = malloc((size_t)batch * sizeof(int64_t));
    b->epoch = malloc((size_t)batch * sizeof(int64_t));
    if (!b->input_ids || !b->token_type_ids || !b->attention_mask || !b->labels || !b->nsp_labels ||
        !b->sequence || !b->epoch) {
        dm_batch_free(b);
        return dm_fail(DM_ERR_OOM, "out of memory for a batch of %lld x %lld", (long long)batch, (long long)seq);
    }
    return DM_OK;
}

void dm_batch_free(dm_batch *b) {
    if (!b) return;
    free(b->input_ids);
    free(b->token_type_ids);
    free(b->attention_mask);
    free(b->labels);
    free(b->nsp_labels);
    free(b->sequence);
    free(b->epoch);
    memset(b, 0, sizeof *b);
}

static void *producer(void *arg) {
    dm_loader *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        int64_t s = l->filled;
        if (s >= l->keep + l->nslots) {
            pthread_cond_wait(&l->space, &l->mu);
            continue;
        }
        pthread_mutex_unlock(&l->mu);
        dm_seqset_build(&l->s, s, &l->slots[s % l->nslots]);
        pthread_mutex_lock(&l->mu);
        l->filled = s + 1;
        pthread_cond_signal(&l->ready);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static dm_status start_thread(dm_loader *l, int64_t step) {
    l->filled = l->keep = l->next = step;
    l->stop = 0;
    if (l->s.cfg.prefetch == 0) return DM_OK;
    int e = pthread_create(&l->thread, NULL, producer, l);
    if (e != 0) return dm_fail(DM_ERR_BACKEND, "cannot start the loader's thread (error %d)", e);
    l->running = 1;
    return DM_OK;
}

static void stop_thread(dm_loader *l) {
    if (!l->running) return;
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_broadcast(&l->space);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    l->running = 0;
}

void dm_loader_free(dm_loader *l) {
    if (!l) return;
    stop_thread(l);
    for (int k = 0; k < l->nslots; k++) dm_batch_free(&l->slots[k]);
    free(l->slots);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->ready);
    pthread_cond_destroy(&l->space);
    dm_seqset_free(&l->s);
    free(l);
}

static int64_t max_step(const dm_loader_config *c) {
    return INT64_MAX / (c->batch * (c->parts > 1 ? c->parts : 1)) - 1; /* the global batch's */
}

dm_status dm_loader_open_shards(dm_loader **out, const char *const *paths, size_t n,
                                const dm_vocab_info *vocab, const dm_loader_config *cfg) {
    if (out) *out = NULL;
    if (!out || (!paths && n) || !vocab || !cfg) return dm_fail(DM_ERR_INVALID_ARG, "dm_loader_open_shards: NULL argument");
    if (n == 0) return dm_fail(DM_ERR_INVALID_ARG, "the loader was given no shard");
    dm_loader *l = calloc(1, sizeof *l);
    dm_shard **sh = calloc(n, sizeof *sh);
    if (!l || !sh) {
        free(l);
        free(sh);
        return dm_fail(DM_ERR_OOM, "out of memory");
    }
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->ready, NULL);
    pthread_cond_init(&l->space, NULL);
    dm_status st = DM_OK;
    for (size_t k = 0; k < n && st == DM_OK; k++) {
        if (!paths[k]) st = dm_fail(DM_ERR_INVALID_ARG, "dm_loader_open_shards: NULL path");
        else st = dm_shard_open(&sh[k], paths[k], vocab->hash);
        /* the same tokenizer hash with another vocabulary size: a damaged or edited header
         * (its ids could pass the vocabulary's end) */
        dm_shard_info si;
        if (st == DM_OK && (st = dm_shard_get_info(sh[k], &si)) == DM_OK && si.vocab_size != vocab->vocab_size)
            st = dm_fail(DM_ERR_FORMAT, "shard '%s' says vocab_size %d, its tokenizer has %d tokens: the "
                         "file is damaged; make it again with dmove prepare", paths[k], (int)si.vocab_size,
                         (int)vocab->vocab_size);
    }
    if (st != DM_OK) {
        for (size_t k = 0; k < n; k++) dm_shard_free(sh[k]);
        free(sh);
        dm_loader_free(l);
        return st;
    }
    st = dm_corpus_init(&l->s.c, sh, n); /* owns the shards from here */
    if (st == DM_OK) st = dm_seqset_init(&l->s, cfg, vocab);
    if (st == DM_OK && cfg->start_step > max_step(cfg))
        st = dm_fail(DM_ERR_INVALID_ARG, "loader: start step %lld too large", (long long)cfg->start_step);
    if (st == DM_OK) {
        l->nslots = cfg->prefetch + 1;
        l->slots = calloc((size_t)l->nslots, sizeof *l->slots);
        if (!l->slots) st = dm_fail(DM_ERR_OOM, "out of memory");
        for (int k = 0; k < l->nslots && st == DM_OK; k++) st = dm_batch_alloc(&l->slots[k], cfg->batch, cfg->seq);
    }
    if (st == DM_OK) st = start_thread(l, cfg->start_step);
    if (st != DM_OK) {
        dm_loader_free(l);
        return st;
    }
    *out = l;
    return DM_OK;
}

dm_status dm_loader_open(dm_loader **out, const char *dir, const char *split, const dm_vocab_info *vocab,
                         const dm_loader_config *cfg) {
    if (out) *out = NULL;
    if (!out || !dir || !split || !vocab || !cfg) return dm_fail(DM_ERR_INVALID_ARG, "dm_loader_open: NULL argument");
    dm_dataset *d = NULL;
    DM_TRY(dm_dataset_open(&d, dir));
    dm_status st = DM_OK;
    size_t n = dm_dataset_shard_count(d, split);
    if (dm_dataset_vocab_hash(d) != vocab->hash)
        st = dm_fail(DM_ERR_FORMAT, "dataset '%s' was made with another tokenizer (vocabulary hash %016llx, "
                     "the model's is %016llx; it was: %s): prepare the text again with the model's tokenizer",
                     dir, (unsigned long long)dm_dataset_vocab_hash(d), (unsigned long long)vocab->hash,
                     dm_dataset_tokenizer(d));
    else if (n == 0)
        st = dm_fail(DM_ERR_NOT_FOUND, "dataset '%s' has no %s split%s", dir, split,
                     strcmp(split, "valid") == 0 ? " (prepare it with --valid-fraction)" : "");
    const char **paths = NULL;
    if (st == DM_OK && !(paths = malloc(n * sizeof *paths))) st = dm_fail(DM_ERR_OOM, "out of memory");
    if (st == DM_OK) {
        for (size_t k = 0; k < n; k++) paths[k] = dm_dataset_shard_path(d, split, k);
        st = dm_loader_open_shards(out, paths, n, vocab, cfg);
        if (st != DM_OK) dm_fail_context(st, "dataset '%s', split %s: ", dir, split);
    }
    dm_shard_info want;
    if (st == DM_OK && dm_dataset_split_info(d, split, &want) == DM_OK) {
        const dm_corpus *c = &(*out)->s.c;
        if (c->docs != want.documents || c->sents != want.sentences || c->toks != want.tokens) {
            st = dm_fail(DM_ERR_FORMAT, "dataset '%s': the %s shards hold %llu documents, %llu tokens; "
                         "dataset.json says %llu, %llu: a shard was replaced or the manifest edited; "
                         "prepare the data again", dir, split, (unsigned long long)c->docs,
                         (unsigned long long)c->toks, (unsigned long long)want.documents,
                         (unsigned long long)want.tokens);
            dm_loader_free(*out);
            *out = NULL;
        }
    }
    free(paths);
    dm_dataset_free(d);
    return st;
}

dm_status dm_loader_next(dm_loader *l, const dm_batch **out) {
    if (out) *out = NULL;
    if (!l || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_loader_next: NULL argument");
    if (l->next > max_step(&l->s.cfg)) return dm_fail(DM_ERR_INVALID_ARG, "loader: past the last step");
    double t0 = now_s();
    dm_batch *b;
    if (!l->running) {
        b = &l->slots[0];
        dm_seqset_build(&l->s, l->next, b);
    } else {
        pthread_mutex_lock(&l->mu);
        l->keep = l->next; /* the batch handed out last is free again */
        pthread_cond_signal(&l->space);
        while (l->filled <= l->next) pthread_cond_wait(&l->ready, &l->mu);
        pthread_mutex_unlock(&l->mu);
        b = &l->slots[l->next % l->nslots];
    }
    l->next++;
    l->wait += now_s() - t0;
    l->calls++;
    *out = b;
    return DM_OK;
}

dm_status dm_loader_seek(dm_loader *l, int64_t step) {
    if (!l) return dm_fail(DM_ERR_INVALID_ARG, "dm_loader_seek: NULL argument");
    if (step < 0 || step > max_step(&l->s.cfg))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_loader_seek: step %lld out of range", (long long)step);
    stop_thread(l);
    return start_thread(l, step);
}

dm_status dm_loader_batch_at(const dm_loader *l, int64_t step, dm_batch *out) {
    if (!l || !out) return dm_fail(DM_ERR_INVALID_ARG, "dm_loader_batch_at: NULL argument");
    if (step < 0 || step > max_step(&l->s.cfg))
        return dm_fail(DM_ERR_INVALID_ARG, "dm_loader_batch_at: step %lld out of range", (long long)step);
    if (out->batch != l->s.cfg.batch || out->seq != l->s.cfg.seq || !out->input_ids)
        return dm_fail(DM_ERR_INVALID_ARG, "dm_loader_batch_at: the batch is %lld x %lld, the loader's "
                       "%lld x %lld", (long long)out->batch, (long long)out->seq,
                       (long long)l->s.cfg.batch, (long long)l->s.cfg.seq);
    dm_seqset_build(&l->s, step, out);
    return DM_OK;
}

int64_t dm_loader_sequences(const dm_loader *l) { return l ? l->s.nseq : 0; }

uint64_t dm_loader_fingerprint(const dm_loader *l) {
    uint64_t h = 14695981039346656037ull;
    for (size_t k = 0; l && k < l->s.c.nshards; k++) {
        dm_shard_info si;
        if (dm_shard_get_info(l->s.c.shards[k], &si) != DM_OK) return 0;
        for (int b = 0; b < 8; b++) h = (h ^ ((si.checksum >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
    return l ? h : 0;
}
double dm_loader_wait_seconds(const dm_loader *l) { return l ? l->wait : 0; }
int64_t dm_loader_batches(const dm_loader *l) { return l ? l->calls : 0; }
