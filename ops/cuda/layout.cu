/* Data movement on the GPU: concat, slice, reshape, permute and nearest 2x
 * upsampling (with its backward). Concat and slice are 2-D copies by the
 * runtime; permute gathers, or transposes through shared-memory tiles when the
 * input's contiguous dim is not the output's. All but the upsample backward
 * are exact copies. */
#include "common.cuh"

#define THREADS 256
#define TILE 32

static int norm_dim(int64_t d, int ndim) { return (int)(d < 0 ? d + ndim : d); }

static int64_t prod(const int64_t *s, int from, int to)
{
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= s[d];
    return n;
}

/* height rows of width elements of es bytes, between pitches (in elements) */
static int copy_rows(ck_cuda_ctx *c, const char *op, void *dst, int64_t dpitch, const void *src, int64_t spitch,
                     int64_t width, int64_t height, size_t es)
{
    if (width == 0 || height == 0) return 1;
    if (height == 1 || (width == dpitch && width == spitch))
        return CK_CU(op, cudaMemcpyAsync(dst, src, es * (size_t)(width * height), cudaMemcpyDeviceToDevice, c->stream));
    return CK_CU(op, cudaMemcpy2DAsync(dst, es * (size_t)dpitch, src, es * (size_t)spitch, es * (size_t)width,
                                       (size_t)height, cudaMemcpyDeviceToDevice, c->stream));
}

/* Concat, slice and reshape move elements of es bytes: fp32 (4), or bf16 and
 * fp16 alike (2). */

// a is (P,A,Q), b is (P,B,Q) around dim i0; out is (P,A+B,Q).
static void concat(const ck_op_params *p, ck_view *out, const ck_view *in, size_t es)
{
    ck_cuda_ctx *c = ck_cuda_begin("concat");
    if (!c) return;
    const int d = norm_dim(p->i[0], out[0].ndim);
    const int64_t P = prod(out[0].shape, 0, d), Q = prod(out[0].shape, d + 1, out[0].ndim);
    const int64_t AQ = in[0].shape[d] * Q, BQ = in[1].shape[d] * Q;
    char *y = (char *)out[0].data;
    if (copy_rows(c, "concat", y, AQ + BQ, in[0].data, AQ, AQ, P, es))
        copy_rows(c, "concat", y + es * (size_t)AQ, AQ + BQ, in[1].data, BQ, BQ, P, es);
    ck_cuda_end(c, "concat");
}

// x is (P,X,Q) around dim i0; out is (P,i2,Q), entries i1 .. i1+i2-1 of that dim.
static void slice(const ck_op_params *p, ck_view *out, const ck_view *in, size_t es)
{
    ck_cuda_ctx *c = ck_cuda_begin("slice");
    if (!c) return;
    const int d = norm_dim(p->i[0], in[0].ndim);
    const int64_t P = prod(in[0].shape, 0, d), Q = prod(in[0].shape, d + 1, in[0].ndim);
    const int64_t XQ = in[0].shape[d] * Q, LQ = p->i[2] * Q, off = p->i[1] * Q;
    copy_rows(c, "slice", out[0].data, LQ, (const char *)in[0].data + es * (size_t)off, XQ, LQ, P, es);
    ck_cuda_end(c, "slice");
}

// x is any shape; out has the same number of elements (possibly the same buffer).
static void reshape(ck_view *out, const ck_view *in, size_t es)
{
    ck_cuda_ctx *c = ck_cuda_begin("reshape");
    if (!c) return;
    if (out[0].data != in[0].data) copy_rows(c, "reshape", out[0].data, 0, in[0].data, 0, ck_view_numel(&in[0]), 1, es);
    ck_cuda_end(c, "reshape");
}

extern "C" CK_CUDA_KERNEL(ck_cuda_concat)
{
    (void)ctx, (void)nout, (void)nin;
    concat(p, out, in, sizeof(float));
}

extern "C" CK_CUDA_KERNEL(ck_cuda_slice)
{
    (void)ctx, (void)nout, (void)nin;
    slice(p, out, in, sizeof(float));
}

extern "C" CK_CUDA_KERNEL(ck_cuda_reshape)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    reshape(out, in, sizeof(float));
}

extern "C" CK_CUDA_KERNEL(ck_cuda_concat_bf16)
{
    (void)ctx, (void)nout, (void)nin;
    concat(p, out, in, 2);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_concat_f16)
{
    (void)ctx, (void)nout, (void)nin;
    concat(p, out, in, 2);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_slice_bf16)
{
    (void)ctx, (void)nout, (void)nin;
    slice(p, out, in, 2);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_slice_f16)
{
    (void)ctx, (void)nout, (void)nin;
    slice(p, out, in, 2);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_reshape_bf16)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    reshape(out, in, 2);
}

extern "C" CK_CUDA_KERNEL(ck_cuda_reshape_f16)
{
    (void)ctx, (void)p, (void)nout, (void)nin;
    reshape(out, in, 2);
}

/* Permute and the upsample move elements of storage type T (float or
 * __nv_bfloat16 or __half) as they are; the upsample backward sums in fp32 (ck_ld) and
 * rounds once (ck_st). */

/* Output dims (merged, size-1 dropped) with their input strides. */
struct perm {
    int m;
    int64_t sz[CK_MAX_DIMS], st[CK_MAX_DIMS];
};

// out[i] = in[offset of i's index over p.sz, at strides p.st]
template <typename T, typename I>
__global__ void __launch_bounds__(THREADS) permute_gather(T *y, const T *x, perm pm, I n)
{
    I sz[CK_MAX_DIMS], st[CK_MAX_DIMS];
    for (int d = 0; d < pm.m; d++) sz[d] = (I)pm.sz[d], st[d] = (I)pm.st[d];
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (I)(gridDim.x * blockDim.x)) {
        I rem = i, off = 0;
        for (int d = pm.m - 1; d >= 0; d--) {
            off += rem % sz[d] * st[d];
            rem /= sz[d];
        }
        y[i] = x[off];
    }
}

/* Output dim k is the input's contiguous dim and the output's last dim L is
 * not: TILE x TILE blocks of (k, last) go through shared memory, read along k
 * and written along L, both coalesced. Block (TILE, 8); blockIdx.x walks
 * (rest, tile of k, tile of L), rest over the other dims. */
template <typename T>
__global__ void __launch_bounds__(TILE * 8) permute_tiled(T *y, const T *x, perm pm, int k, perm ost, int64_t tk,
                                                          int64_t tl)
{
    __shared__ T tile[TILE][TILE + 1];
    const int last = pm.m - 1;
    const int64_t K = pm.sz[k], L = pm.sz[last], sl = pm.st[last], ok = ost.st[k];
    int64_t u = blockIdx.x;
    const int64_t bl = u % tl * TILE;
    u /= tl;
    const int64_t bk = u % tk * TILE;
    u /= tk;
    int64_t io = 0, oo = 0;
    for (int j = last - 1; j >= 0; j--) {
        if (j == k) continue;
        const int64_t idx = u % pm.sz[j];
        u /= pm.sz[j];
        io += idx * pm.st[j];
        oo += idx * ost.st[j];
    }
    // read: threadIdx.x runs along k (input stride 1)
    for (int r = threadIdx.y; r < TILE; r += 8) {
        const int64_t a = bk + threadIdx.x, b = bl + r;
        if (a < K && b < L) tile[r][threadIdx.x] = x[io + a + b * sl];
    }
    __syncthreads();
    // write: threadIdx.x runs along L (output stride 1)
    for (int r = threadIdx.y; r < TILE; r += 8) {
        const int64_t a = bk + r, b = bl + threadIdx.x;
        if (a < K && b < L) y[oo + a * ok + b] = tile[threadIdx.x][r];
    }
}

// x is (d0..dn-1); out is (d_i0 .. d_i(n-1)): out dim j is input dim p->i[j].
template <typename T>
static void permute_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const ck_view *x = &in[0];
    const int nd = x->ndim;
    const int64_t n = ck_view_numel(x);
    if (n == 0) return;
    int64_t istride[CK_MAX_DIMS], s = 1;
    for (int d = nd - 1; d >= 0; d--) istride[d] = s, s *= x->shape[d];
    perm pm;
    pm.m = 0;
    for (int j = 0; j < nd; j++) {
        const int64_t e = x->shape[p->i[j]], t = istride[p->i[j]];
        if (e == 1) continue;
        if (pm.m > 0 && pm.st[pm.m - 1] == t * e) {
            pm.sz[pm.m - 1] *= e, pm.st[pm.m - 1] = t;
        } else {
            pm.sz[pm.m] = e, pm.st[pm.m] = t, pm.m++;
        }
    }
    T *y = (T *)out[0].data;
    const T *xs = (const T *)x->data;
    if (pm.m <= 1) {
        copy_rows(c, name, y, 0, xs, 0, n, 1, sizeof(T));
        ck_cuda_end(c, name);
        return;
    }
    const int last = pm.m - 1;
    int k = 0;
    while (k < last && pm.st[k] != 1) k++;
    if (pm.st[last] != 1 && k < last) {
        perm ost = pm;
        s = 1;
        for (int j = last; j >= 0; j--) ost.st[j] = s, s *= pm.sz[j];
        const int64_t tk = (pm.sz[k] + TILE - 1) / TILE, tl = (pm.sz[last] + TILE - 1) / TILE;
        const int64_t units = n / (pm.sz[k] * pm.sz[last]) * tk * tl;
        if (units < 0x7fffffffLL) {
            ck_launch(permute_tiled<T>, dim3((unsigned)units), dim3(TILE, 8), c->stream, y, xs, pm, k, ost, tk, tl);
            ck_cuda_end(c, name);
            return;
        }
    }
    if (n < ((int64_t)1 << 31))
        ck_launch(permute_gather<T, uint32_t>, ck_grid(n, THREADS), THREADS, c->stream, y, xs, pm, (uint32_t)n);
    else
        ck_launch(permute_gather<T, int64_t>, ck_grid(n, THREADS), THREADS, c->stream, y, xs, pm, n);
    ck_cuda_end(c, name);
}

// x is (R, W) rows of N*C*H; y is (R, 2, 2W): each pixel repeated over a 2x2 block
template <typename T>
__global__ void __launch_bounds__(THREADS) upsample_kernel(T *y, const T *x, int64_t W, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t ow = i % (2 * W), r = i / (4 * W);
        y[i] = x[r * W + ow / 2];
    }
}

// dy is (R, 2, 2W); dx is (R, W), the sum of each 2x2 block in the CPU's order
template <typename T>
__global__ void __launch_bounds__(THREADS) upsample_bwd_kernel(T *dx, const T *dy, int64_t W, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / W, w = i % W;
        const T *d0 = dy + r * 4 * W, *d1 = d0 + 2 * W;
        ck_st(dx + i, (ck_ld(d0 + 2 * w) + ck_ld(d0 + 2 * w + 1)) + (ck_ld(d1 + 2 * w) + ck_ld(d1 + 2 * w + 1)));
    }
}

// x is (N,C,H,W); out is (N,C,2H,2W)
template <typename T>
static void upsample_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&out[0]);
    if (n == 0) return;
    ck_launch(upsample_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, (T *)out[0].data, (const T *)in[0].data,
              in[0].shape[3], n);
    ck_cuda_end(c, name);
}

// dy is (N,C,2H,2W); out dx is (N,C,H,W)
template <typename T>
static void upsample_bwd_op(const char *name, const ck_op_params *p, ck_view *out, const ck_view *in)
{
    (void)p;
    ck_cuda_ctx *c = ck_cuda_begin(name);
    if (!c) return;
    const int64_t n = ck_view_numel(&out[0]);
    if (n == 0) return;
    ck_launch(upsample_bwd_kernel<T>, ck_grid(n, THREADS), THREADS, c->stream, (T *)out[0].data, (const T *)in[0].data,
              out[0].shape[3], n);
    ck_cuda_end(c, name);
}


CK_CUDA_ENTRIES(permute, permute_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(upsample2x, upsample_op<T>(name, p, out, in))
CK_CUDA_ENTRIES(upsample2x_bwd, upsample_bwd_op<T>(name, p, out, in))
