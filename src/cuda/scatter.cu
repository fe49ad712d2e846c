/* scatter.cu: EMBED_BWD on the device, the gradient of an embedding lookup: table[n, :] =
 * the sum of dy[r, :] over the rows r with idx[r] == n (ids < 0, >= the table's rows or
 * not integers skipped), every table row written. Deterministic: no float atomics; the
 * rows of each table row are added in one fixed order, a function of the indices alone.
 *  1. A stable counting sort of the rows by index: P threads own K consecutive rows each
 *     (P = ceil(R / K)); thread p counts its rows per index into hist[n * P + p] (its own
 *     column: no race), an exclusive scan of hist (index-major) gives where thread p's rows
 *     of index n go, and thread p places them there in row order. The sorted list (key,
 *     row) then holds every index's rows in increasing row order, valid rows only.
 *  2. The sums: the sorted list in chunks of S entries, a block per (chunk, 256 columns),
 *     a thread per column adds its chunk's entries in order. A run of one index wholly in
 *     the chunk is stored to the table; a run cut by the chunk's start goes to the chunk's
 *     head partial, one cut by its end (begun in it) to its tail partial.
 *  3. Runs that span chunks: the block of the chunk where the run ends adds the start
 *     chunk's tail partial, the head partials of the chunks between, and its own head
 *     partial, in chunk order, and stores the sum.
 * Cost (BERT-large, R = 32768 rows, the word table 30522 x 1024): K = 256 rows per
 * counting thread (hist = 30522 x 128 ints, 15.6 MB), two passes of 256 dependent global
 * read-modify-writes per thread (~0.1 ms each, latency bound), a scan of 3.9 M ints, the
 * table zeroed (125 MB fp32, 62 MB bf16), dy read once (fully coalesced): some 0.3 ms on an
 * H100; far less for the position and token-type tables (few indices: K = 16).
 * The per-thread work is in __host__ __device__ functions that emulate.cu runs on the
 * host in the same order (dmc_emu_scatter): the emulation gives the device's bits. */
#include <limits.h>
#include <string.h>

#include "cuda/rowmath.cuh"

enum { SC_THREADS = 256, SC_SCAN = 1024 };

static __host__ __device__ __forceinline__ long long sc_index(const dmc_scatter *s, int64_t r) {
    return dmc_index_row(dmc_load(s->idx, s->idx_dt, r), s->nindex);
}

/* Step 1 by counting thread p: count (place = 0) or place (1) its rows. */
static __host__ __device__ void sc_count_place(const dmc_scatter *s, int64_t p, int place) {
    const int64_t r1 = (p + 1) * s->per < s->rows ? (p + 1) * s->per : s->rows;
    for (int64_t r = p * s->per; r < r1; r++) {
        const long long n = sc_index(s, r);
        if (n < 0) continue;
        int *h = s->hist + n * s->nthr + p;
        if (place) {
            s->key[*h] = (int)n;
            s->row[*h] = (int)r;
        }
        (*h)++;
    }
}

/* Step 2 for chunk c, column col. M: valid rows (the sorted list's length). */
static __host__ __device__ void sc_sum(const dmc_scatter *s, int64_t c, int64_t col, int64_t M) {
    const int64_t lo = c * s->seg, hi = lo + s->seg < M ? lo + s->seg : M, C = s->cols;
    float acc = 0.0f;
    int64_t ps = lo; /* where the current run starts */
    for (int64_t i = lo; i < hi; i++) {
        const int n = s->key[i];
        acc += dmc_load(s->dy, s->dy_dt, (int64_t)s->row[i] * C + col);
        const int more = i + 1 < M && s->key[i + 1] == n; /* the index's run goes on */
        if (more && i + 1 < hi) continue;
        const int starts = ps == 0 || s->key[ps - 1] != n;
        if (starts && !more) dmc_store(s->table, s->table_dt, (int64_t)n * C + col, acc);
        else s->part[(c * 2 + (starts ? 1 : 0)) * C + col] = acc; /* 0: head, 1: tail */
        acc = 0.0f;
        ps = i + 1;
    }
}

/* Step 3 for chunk c, column col: the run cut by the chunk's start, if it ends here. */
static __host__ __device__ void sc_join(const dmc_scatter *s, int64_t c, int64_t col, int64_t M) {
    const int64_t lo = c * s->seg, hi = lo + s->seg < M ? lo + s->seg : M, C = s->cols;
    if (lo == 0 || lo >= M) return;
    const int n = s->key[lo];
    if (s->key[lo - 1] != n) return; /* the chunk starts a run: no head */
    if (hi < M && s->key[hi - 1] == n && s->key[hi] == n) return; /* the run goes on */
    int64_t a = 0, b = lo; /* the run's first entry: the first key == n (keys sorted) */
    while (a < b) {
        const int64_t m = a + (b - a) / 2;
        if (s->key[m] < n) a = m + 1;
        else b = m;
    }
    const int64_t c0 = a / s->seg;
    float acc = s->part[(c0 * 2 + 1) * C + col];
#ifdef __CUDA_ARCH__
#pragma unroll 8 /* loads in flight together (a run over all rows: R / S partials) */
#endif
    for (int64_t q = c0 + 1; q <= c; q++) acc += s->part[(q * 2) * C + col];
    dmc_store(s->table, s->table_dt, (int64_t)n * C + col, acc);
}

int64_t dmc_scatter_chunks(const dmc_scatter *s) { return (s->rows + s->seg - 1) / s->seg; }

void dmc_emu_scatter(const dmc_scatter *s) {
    const int64_t L = s->nindex * s->nthr + 1, NC = dmc_scatter_chunks(s);
    memset(s->hist, 0, sizeof(int) * (size_t)L);
    for (int64_t p = 0; p < s->nthr; p++) sc_count_place(s, p, 0);
    int run = 0;
    for (int64_t e = 0; e < L; e++) {
        int v = s->hist[e];
        s->hist[e] = run;
        run += v;
    }
    for (int64_t p = 0; p < s->nthr; p++) sc_count_place(s, p, 1);
    const int64_t M = s->hist[L - 1];
    memset(s->table, 0, (size_t)(s->nindex * s->cols) * (size_t)dmc_esize(s->table_dt));
    for (int64_t c = 0; c < NC; c++)
        for (int64_t col = 0; col < s->cols; col++) sc_sum(s, c, col, M);
    for (int64_t c = 0; c < NC; c++)
        for (int64_t col = 0; col < s->cols; col++) sc_join(s, c, col, M);
}

__global__ void sc_count_kernel(dmc_scatter s, int place) {
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (p < s.nthr) sc_count_place(&s, p, place);
}

/* Exclusive scan of SC_SCAN ints per block; the block's total to sums[blockIdx.x]. */
__global__ void __launch_bounds__(SC_SCAN) sc_scan_kernel(int *x, int64_t n, int *sums) {
    __shared__ int sh[SC_SCAN];
    const int64_t i = (int64_t)blockIdx.x * SC_SCAN + threadIdx.x;
    const int v = i < n ? x[i] : 0;
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int d = 1; d < SC_SCAN; d *= 2) { /* Hillis-Steele, inclusive */
        int t = threadIdx.x >= (unsigned)d ? sh[threadIdx.x - d] : 0;
        __syncthreads();
        sh[threadIdx.x] += t;
        __syncthreads();
    }
    if (i < n) x[i] = sh[threadIdx.x] - v;
    if (threadIdx.x == SC_SCAN - 1 && sums) sums[blockIdx.x] = sh[threadIdx.x];
}

/* The block totals, scanned by one block in pieces of SC_SCAN (exclusive). */
__global__ void __launch_bounds__(SC_SCAN) sc_scan_sums_kernel(int *sums, int64_t n) {
    __shared__ int sh[SC_SCAN];
    __shared__ int carry;
    if (threadIdx.x == 0) carry = 0;
    for (int64_t b = 0; b < n; b += SC_SCAN) {
        __syncthreads();
        const int64_t i = b + threadIdx.x;
        const int v = i < n ? sums[i] : 0;
        sh[threadIdx.x] = v;
        __syncthreads();
        for (int d = 1; d < SC_SCAN; d *= 2) {
            int t = threadIdx.x >= (unsigned)d ? sh[threadIdx.x - d] : 0;
            __syncthreads();
            sh[threadIdx.x] += t;
            __syncthreads();
        }
        if (i < n) sums[i] = carry + sh[threadIdx.x] - v;
        __syncthreads();
        if (threadIdx.x == SC_SCAN - 1) carry += sh[threadIdx.x];
    }
}

__global__ void sc_add_kernel(int *x, int64_t n, const int *sums) {
    const int64_t i = (int64_t)blockIdx.x * SC_SCAN + threadIdx.x;
    if (i < n) x[i] += sums[blockIdx.x];
}

__global__ void sc_sum_kernel(dmc_scatter s, int join) {
    const int64_t M = s.hist[s.nindex * s.nthr], col = (int64_t)blockIdx.y * SC_THREADS + threadIdx.x;
    if (col >= s.cols) return;
    if (join) sc_join(&s, blockIdx.x, col, M);
    else sc_sum(&s, blockIdx.x, col, M);
}

dm_status dmc_scatter_plan(dmc_scatter *s) {
    const int64_t R = s->rows, N = s->nindex;
    if (R < 1 || N < 1 || s->cols < 1 || R >= INT_MAX || N >= INT_MAX)
        return dm_fail(DM_ERR_UNSUPPORTED, "embedding gradient of %lld rows into a table of %lld "
                       "rows: the CUDA kernel takes 1 to %d of each", (long long)R, (long long)N, INT_MAX - 1);
    s->per = 16; /* the counts (N x P ints) kept to 4 Mi entries where the rows allow */
    while ((R + s->per - 1) / s->per * N > (1 << 22) && s->per < R) s->per *= 2;
    s->nthr = (R + s->per - 1) / s->per;
    if (N * s->nthr >= INT_MAX)
        return dm_fail(DM_ERR_UNSUPPORTED, "embedding gradient: a table of %lld rows is too large "
                       "for the CUDA kernel's counts", (long long)N);
    s->seg = 64;
    return DM_OK;
}

size_t dmc_scatter_work_bytes(const dmc_scatter *s) {
    const int64_t L = s->nindex * s->nthr + 1, nb = (L + SC_SCAN - 1) / SC_SCAN;
    return sizeof(int) * (size_t)(L + nb + 2 * s->rows) + sizeof(float) * (size_t)(2 * dmc_scatter_chunks(s) * s->cols) + 1024;
}

void dmc_scatter_bind(dmc_scatter *s, void *work) {
    const int64_t L = s->nindex * s->nthr + 1, nb = (L + SC_SCAN - 1) / SC_SCAN;
    char *w = (char *)work;
    s->part = (float *)w; /* first: aligned */
    w += sizeof(float) * (size_t)(2 * dmc_scatter_chunks(s) * s->cols);
    s->hist = (int *)w;
    s->sums = s->hist + L;
    s->key = s->sums + nb;
    s->row = s->key + s->rows;
}

dm_status dmc_scatter_launch(const dmc_scatter *s, cudaStream_t st) {
    const int64_t L = s->nindex * s->nthr + 1, nb = (L + SC_SCAN - 1) / SC_SCAN;
    const int64_t NC = dmc_scatter_chunks(s), cb = (s->cols + SC_THREADS - 1) / SC_THREADS;
    const unsigned tb = (unsigned)((s->nthr + SC_THREADS - 1) / SC_THREADS);
    if (nb > INT_MAX || NC > INT_MAX || cb > 65535)
        return dm_fail(DM_ERR_UNSUPPORTED, "embedding gradient: too large a launch");
    DMC_CUDA(cudaMemsetAsync(s->hist, 0, sizeof(int) * (size_t)L, st));
    sc_count_kernel<<<tb, SC_THREADS, 0, st>>>(*s, 0);
    DMC_LAUNCHED("the embedding gradient's count kernel");
    sc_scan_kernel<<<(unsigned)nb, SC_SCAN, 0, st>>>(s->hist, L, s->sums);
    DMC_LAUNCHED("the embedding gradient's scan kernel");
    if (nb > 1) {
        sc_scan_sums_kernel<<<1, SC_SCAN, 0, st>>>(s->sums, nb);
        DMC_LAUNCHED("the embedding gradient's scan kernel");
        sc_add_kernel<<<(unsigned)nb, SC_SCAN, 0, st>>>(s->hist, L, s->sums);
        DMC_LAUNCHED("the embedding gradient's scan kernel");
    }
    sc_count_kernel<<<tb, SC_THREADS, 0, st>>>(*s, 1);
    DMC_LAUNCHED("the embedding gradient's place kernel");
    DMC_CUDA(cudaMemsetAsync(s->table, 0, (size_t)(s->nindex * s->cols) * (size_t)dmc_esize(s->table_dt), st));
    sc_sum_kernel<<<dim3((unsigned)NC, (unsigned)cb), SC_THREADS, 0, st>>>(*s, 0);
    DMC_LAUNCHED("the embedding gradient's sum kernel");
    sc_sum_kernel<<<dim3((unsigned)NC, (unsigned)cb), SC_THREADS, 0, st>>>(*s, 1);
    DMC_LAUNCHED("the embedding gradient's join kernel");
    return DM_OK;
}
