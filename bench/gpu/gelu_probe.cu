/* gelu_probe.cu: is the FFN's exact-GELU pass on the GPU bound by memory or by the erf?
 * Times, on 96 x 128 x 4096 bf16 elements (the FFN of the b=96 j=128 benchmark), a
 * plain copy, GELU forward and GELU backward, each with the cdf as normcdff (what the
 * row kernels use: accurate for x << 0) and as (1 + erff(x / sqrt 2)) / 2 (PyTorch's
 * form), 16-byte loads and stores, a grid-stride loop. Prints medians of 21 runs and the
 * bandwidth each reaches. Build: nvcc -O3 -arch=sm_90 -o gelu_probe gelu_probe.cu
 * (bench/gpu/pack.sh builds it into .dev/bin when nvcc is there). */
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "gelu_probe: %s: %s\n", #x, cudaGetErrorString(e_));           \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

enum { COPY, FWD_CDF, FWD_ERF, BWD_CDF, BWD_ERF, BOTH_CDF, BOTH_ERF, NKIND };
static const char *names[NKIND] = {"copy (read 1, write 1)", "gelu fwd, normcdff", "gelu fwd, erff",
                                   "gelu bwd, normcdff (read 2, write 1)", "gelu bwd, erff",
                                   "gelu and gelu', normcdff (read 1, write 2)", "gelu and gelu', erff"};

__device__ __forceinline__ float cdf_of(float x, bool erf_form) {
    return erf_form ? 0.5f * (1.0f + erff(x * 0.70710678f)) : normcdff(x);
}

template <int K>
__global__ void __launch_bounds__(256) probe(const uint4 *x, const uint4 *dy, uint4 *y, uint4 *y2, long long n8) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n8; i += (long long)gridDim.x * blockDim.x) {
        uint4 a = x[i], d = make_uint4(0, 0, 0, 0);
        if (K == BWD_CDF || K == BWD_ERF) d = dy[i];
        __nv_bfloat162 *pa = (__nv_bfloat162 *)&a, *pd = (__nv_bfloat162 *)&d;
        uint4 o, o2;
        __nv_bfloat162 *po = (__nv_bfloat162 *)&o, *po2 = (__nv_bfloat162 *)&o2;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float2 v = __bfloat1622float2(pa[e]), g = __bfloat1622float2(pd[e]), r;
            float vv[2] = {v.x, v.y}, gg[2] = {g.x, g.y}, rr[2], dd[2] = {0, 0};
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float t = vv[h];
                if (K == COPY) rr[h] = t;
                else {
                    const float c = cdf_of(t, K == FWD_ERF || K == BWD_ERF || K == BOTH_ERF);
                    if (K == FWD_CDF || K == FWD_ERF) rr[h] = t * c;
                    else if (K == BOTH_CDF || K == BOTH_ERF) {
                        rr[h] = t * c;
                        dd[h] = fmaf(t * __expf(-0.5f * t * t), 0.3989422804f, c);
                    }
                    else rr[h] = gg[h] * fmaf(t * __expf(-0.5f * t * t), 0.3989422804f, c);
                }
            }
            r.x = rr[0];
            r.y = rr[1];
            po[e] = __float22bfloat162_rn(r);
            po2[e] = __float22bfloat162_rn(make_float2(dd[0], dd[1]));
        }
        y[i] = o;
        if (K == BOTH_CDF || K == BOTH_ERF) y2[i] = o2;
    }
}

/* x and dy: values spread over about [-4, 4] (a hash of the index), as real activations */
__global__ void fill(__nv_bfloat16 *p, long long n, unsigned salt) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ salt;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        p[i] = __float2bfloat16(((float)(h & 0xffff) / 65535.0f - 0.5f) * 8.0f);
    }
}

static int cmpf(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(void) {
    const long long n = 96LL * 128 * 4096, n8 = n / 8;
    uint4 *x, *dy, *y, *y2;
    CK(cudaMalloc(&x, n * 2));
    CK(cudaMalloc(&dy, n * 2));
    CK(cudaMalloc(&y, n * 2));
    CK(cudaMalloc(&y2, n * 2));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    fill<<<sms * 8, 256>>>((__nv_bfloat16 *)x, n, 1u);
    fill<<<sms * 8, 256>>>((__nv_bfloat16 *)dy, n, 2u);
    CK(cudaGetLastError());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    void (*const kernels[NKIND])(const uint4 *, const uint4 *, uint4 *, uint4 *, long long) = {
        probe<COPY>, probe<FWD_CDF>, probe<FWD_ERF>, probe<BWD_CDF>, probe<BWD_ERF>, probe<BOTH_CDF>, probe<BOTH_ERF>};
    printf("GELU probe: %lld bf16 elements (96 x 128 x 4096), %d SMs, blocks of 256\n", n, sms);
    for (int k = 0; k < NKIND; k++) {
        float t[21];
        for (int r = -3; r < 21; r++) {
            CK(cudaEventRecord(e0));
            kernels[k]<<<sms * 8, 256>>>(x, dy, y, y2, n8);
            CK(cudaGetLastError());
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            if (r >= 0) CK(cudaEventElapsedTime(&t[r], e0, e1));
        }
        qsort(t, 21, sizeof t[0], cmpf);
        const double bytes = (double)n * 2 * (k >= BWD_CDF ? 3 : 2); /* BOTH: 1 read, 2 writes */
        printf("  %-38s %.4f ms  %6.0f GB/s\n", names[k], t[10], bytes / (t[10] * 1e-3) / 1e9);
    }
    return 0;
}
