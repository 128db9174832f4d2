/* cuBLASLt on the CPU emulator: descriptors hold what was set, the heuristic
 * offers one algorithm (claiming ck_emu_lt_ws bytes of workspace, refused when
 * the preference allows less), and cublasLtMatmul is the documented
 * D = alpha op(A) op(B) + beta C (+ bias per row of D) over a strided batch,
 * column-major, in the types the layouts name (fp32 or bf16). */
#include "cuda_emu.h"
#include "graph_emu.h"

#include <vector>

size_t ck_emu_lt_ws = 0;

struct ck_emu_lt {
    int unused;
};
struct ck_emu_lt_desc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    int32_t ta, tb;
    uint32_t epilogue;
    const void *bias;
    int32_t bias_type; /* -1: D's type, as documented for a 32F compute type */
};
struct ck_emu_lt_layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
    int32_t batch;
    int64_t stride;
};
struct ck_emu_lt_pref {
    uint64_t max_ws;
    uint32_t align[4]; /* A, B, C, D */
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = new ck_emu_lt();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale)
{
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new ck_emu_lt_desc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, -1};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    delete d;
    return CUBLAS_STATUS_SUCCESS;
}

/* the documented sizes: int32 operations and types, uint32 epilogue, a pointer */
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t bytes)
{
    if (!d || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA:
    case CUBLASLT_MATMUL_DESC_TRANSB: {
        if (bytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        int32_t v;
        memcpy(&v, buf, sizeof v);
        if (v != CUBLAS_OP_N && v != CUBLAS_OP_T) return CUBLAS_STATUS_INVALID_VALUE;
        (attr == CUBLASLT_MATMUL_DESC_TRANSA ? d->ta : d->tb) = v;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
        if (bytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->epilogue, buf, sizeof d->epilogue);
        if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        return CUBLAS_STATUS_SUCCESS;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
        if (bytes != sizeof(void *)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->bias, buf, sizeof d->bias);
        return CUBLAS_STATUS_SUCCESS;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
        if (bytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&d->bias_type, buf, sizeof d->bias_type);
        return CUBLAS_STATUS_SUCCESS;
    default: return CUBLAS_STATUS_NOT_SUPPORTED;
    }
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld)
{
    if (type != CUDA_R_32F && type != CUDA_R_16BF && type != CUDA_R_16F) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (ld < (int64_t)(rows > 1 ? rows : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    *l = new ck_emu_lt_layout{type, rows, cols, ld, 1, 0};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    delete l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr,
                                                const void *buf, size_t bytes)
{
    if (!l || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
        if (bytes != sizeof(int32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->batch, buf, sizeof l->batch);
        return l->batch >= 1 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
    }
    if (attr == CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET) {
        if (bytes != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&l->stride, buf, sizeof l->stride);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    *p = new ck_emu_lt_pref{0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    delete p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t bytes)
{
    if (!p || !buf) return CUBLAS_STATUS_INVALID_VALUE;
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (bytes != sizeof(uint64_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->max_ws, buf, sizeof p->max_ws);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (bytes != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeof(uint32_t));
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

/* op(A) is m x k, op(B) k x n, C and D m x n, batches agree (a stride of 0 broadcasts) */
static cublasStatus_t shapes(const ck_emu_lt_desc *op, const ck_emu_lt_layout *a, const ck_emu_lt_layout *b,
                             const ck_emu_lt_layout *c, const ck_emu_lt_layout *d)
{
    if (!op || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
    const uint64_t m = op->ta == CUBLAS_OP_N ? a->rows : a->cols, k = op->ta == CUBLAS_OP_N ? a->cols : a->rows;
    const uint64_t kb = op->tb == CUBLAS_OP_N ? b->rows : b->cols, n = op->tb == CUBLAS_OP_N ? b->cols : b->rows;
    if (k != kb || c->rows != m || c->cols != n || d->rows != m || d->cols != n) return CUBLAS_STATUS_INVALID_VALUE;
    if (a->batch != d->batch || b->batch != d->batch || c->batch != d->batch) return CUBLAS_STATUS_INVALID_VALUE;
    /* bf16 inputs need a 32F compute type; C and D share a type */
    if (c->type != d->type || a->type != b->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (op->epilogue == CUBLASLT_EPILOGUE_BIAS && !op->bias) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t d, cublasLtMatmulPreference_t pref,
                                              int requested, cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    if (!h || !pref || requested < 1 || !results || !returned) return CUBLAS_STATUS_INVALID_VALUE;
    const cublasStatus_t s = shapes(op, a, b, c, d);
    if (s) return s;
    *returned = 0;
    /* as documented: no algorithm fits is CUBLAS_STATUS_NOT_SUPPORTED */
    if (ck_emu_lt_ws > pref->max_ws) return CUBLAS_STATUS_NOT_SUPPORTED;
    memset(&results[0], 0, sizeof results[0]);
    results[0].algo.data[0] = 1;
    for (int i = 0; i < 4; i++) results[0].algo.data[1 + i] = pref->align[i] < 16 ? pref->align[i] : 16;
    results[0].workspaceSize = ck_emu_lt_ws;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *returned = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static float load(cudaDataType_t t, const void *p, int64_t i)
{
    return t == CUDA_R_16BF ? __bfloat162float(((const __nv_bfloat16 *)p)[i])
           : t == CUDA_R_16F ? __half2float(((const __half *)p)[i])
                             : ((const float *)p)[i];
}
static void store(cudaDataType_t t, void *p, int64_t i, float v)
{
    if (t == CUDA_R_16BF)
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16(v);
    else if (t == CUDA_R_16F)
        ((__half *)p)[i] = __float2half(v);
    else
        ((float *)p)[i] = v;
}

static void lt_compute(const ck_emu_lt_desc *op, const ck_emu_lt_layout *ad, const ck_emu_lt_layout *bd,
                       const ck_emu_lt_layout *cd, const ck_emu_lt_layout *dd, float al, float be, const void *A,
                       const void *B, const void *C, void *D);

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t ad, const void *B, cublasLtMatrixLayout_t bd, const void *beta,
                              const void *C, cublasLtMatrixLayout_t cd, void *D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t)
{
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    const cublasStatus_t s = shapes(op, ad, bd, cd, dd);
    if (s) return s;
    if (!algo || algo->data[0] != 1) return CUBLAS_STATUS_INVALID_VALUE;
    if (ws_bytes < ck_emu_lt_ws || (ck_emu_lt_ws && !ws)) return CUBLAS_STATUS_INVALID_VALUE;
    /* the workspace, when one is given, aligned to 256 bytes (cuBLAS's
     * documented requirement of a user workspace; an H200 answered a 64-byte
     * aligned one with CUBLAS_STATUS_INVALID_VALUE) */
    if (ws && ws_bytes && (uintptr_t)ws % 256) return CUBLAS_STATUS_INVALID_VALUE;
    /* each operand, and each batch entry of it, as aligned as the algorithm needs */
    const struct {
        const void *p;
        const ck_emu_lt_layout *l;
    } ops[4] = {{A, ad}, {B, bd}, {C, cd}, {D, dd}};
    for (int i = 0; i < 4; i++) {
        const uint64_t need = algo->data[1 + i] ? algo->data[1 + i] : 1;
        const uint64_t es = ops[i].l->type == CUDA_R_32F ? 4 : 2;
        if ((uintptr_t)ops[i].p % need || (ops[i].l->batch > 1 && (uint64_t)ops[i].l->stride * es % need))
            return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    /* under graph capture the product is recorded, with copies of its
     * descriptors (which ops/cuda may change or destroy after the call) and
     * scalars, and runs at each launch of the graph */
    const float al = *(const float *)alpha, be = *(const float *)beta;
    if (ck_emu_capture([=, o = *op, a = *ad, b = *bd, c = *cd, d = *dd]() mutable {
            lt_compute(&o, &a, &b, &c, &d, al, be, A, B, C, D);
        }))
        return CUBLAS_STATUS_SUCCESS;
    lt_compute(op, ad, bd, cd, dd, al, be, A, B, C, D);
    return CUBLAS_STATUS_SUCCESS;
}

static void lt_compute(const ck_emu_lt_desc *op, const ck_emu_lt_layout *ad, const ck_emu_lt_layout *bd,
                       const ck_emu_lt_layout *cd, const ck_emu_lt_layout *dd, float al, float be, const void *A,
                       const void *B, const void *C, void *D)
{
    const int64_t m = (int64_t)dd->rows, n = (int64_t)dd->cols;
    const int64_t k = (int64_t)(op->ta == CUBLAS_OP_N ? ad->cols : ad->rows);
    const cudaDataType_t bt = op->bias_type < 0 ? dd->type : (cudaDataType_t)op->bias_type;
    std::vector<float> out((size_t)(m * n));
    for (int32_t bi = 0; bi < dd->batch; bi++) {
        const int64_t oa = bi * ad->stride, ob = bi * bd->stride, oc = bi * cd->stride, od = bi * dd->stride;
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) {
                double acc = 0;
                for (int64_t l = 0; l < k; l++) {
                    const float av = load(ad->type, A, oa + (op->ta == CUBLAS_OP_N ? i + l * ad->ld : l + i * ad->ld));
                    const float bv = load(bd->type, B, ob + (op->tb == CUBLAS_OP_N ? l + j * bd->ld : j + l * bd->ld));
                    acc += (double)av * bv;
                }
                float v = al * (float)acc;
                if (be != 0.0f) v += be * load(cd->type, C, oc + i + j * cd->ld);
                if (op->epilogue == CUBLASLT_EPILOGUE_BIAS) v += load(bt, op->bias, i);
                out[(size_t)(i + j * m)] = v;
            }
        /* D may be C: written after the whole batch entry is read */
        for (int64_t j = 0; j < n; j++)
            for (int64_t i = 0; i < m; i++) store(dd->type, D, od + i + j * dd->ld, out[(size_t)(i + j * m)]);
    }
}
