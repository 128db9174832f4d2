/* Specification of the backend's data-parallel hooks (ops/backend.h:
 * comm_id, comm_init, allreduce_start, allreduce_wait, broadcast) as the
 * executor drives them, without MPI or a GPU: a fake device (CPU kernels,
 * host = 0) whose hooks record their calls, in a world of one made data
 * parallel by CK_COMM_FORCE=1.
 *   1. a device backend without the hooks refuses data parallel in one line
 *      naming the device and NCCL;
 *   2. with them: the communicator is opened once per process, rank 0's id
 *      reaching comm_init, with vm/dist's timeout; each step starts every
 *      bucket once, over exactly the buckets' bytes, and waits for each after
 *      its start; nothing reaches vm/dist's requests; the weights are those
 *      of the plain program, bitwise (a sum over one rank, times 1);
 *   3. a failing hook fails the step, naming the entry, its scope and the
 *      device. */
#include "backend.h"
#include "cpu/cpu.h"
#include "dist/dist.h"
#include "run/program.h"

#include <stdlib.h>
#include <string.h>
#include "named_check.h"

static struct {
    int ids, inits, starts, waits, fail, inject;
    int init_rank, init_nranks;
    double init_timeout;
    unsigned char id[CK_COMM_ID_BYTES], got[CK_COMM_ID_BYTES];
    int order_ok;       /* every wait came after its bucket's start */
    int started[64];    /* per bucket: starts not yet waited for */
    int64_t values;     /* values summed over all starts */
} hk;

static const char *dev_error(void) { return hk.fail ? "allreduce: injected failure" : ""; }
static void dev_clear(void) { hk.fail = 0; }

static int h_comm_id(void *id)
{
    hk.ids++;
    for (int i = 0; i < CK_COMM_ID_BYTES; i++) hk.id[i] = (unsigned char)(i * 7 + 3);
    memcpy(id, hk.id, CK_COMM_ID_BYTES);
    return 0;
}

static int h_comm_init(const void *id, int rank, int nranks, const ck_comm_host *host)
{
    hk.inits++;
    memcpy(hk.got, id, CK_COMM_ID_BYTES);
    hk.init_rank = rank;
    hk.init_nranks = nranks;
    hk.init_timeout = host->timeout();
    return 0;
}

static int h_start(float *x, int64_t n, int b)
{
    (void)x;
    if (hk.inject) return hk.fail = 1, -1;
    hk.starts++;
    hk.values += n;
    if (b >= 0 && b < 64) hk.started[b]++;
    return 0;
}

static int h_wait(int b)
{
    hk.waits++;
    if (b < 0 || b >= 64 || hk.started[b] != 1) hk.order_ok = 0;
    else hk.started[b]--;
    return 0;
}

static int h_broadcast(float *x, int64_t n, int root)
{
    (void)x, (void)n, (void)root;
    return 0;
}

static ck_backend plain_be, comm_be;

static void make_backends(void)
{
    plain_be = *ck_backend_cpu();
    plain_be.name = "fakedev";
    plain_be.host = 0;
    comm_be = plain_be;
    comm_be.name = "commdev";
    comm_be.error = dev_error;
    comm_be.clear_error = dev_clear;
    comm_be.comm_id = h_comm_id;
    comm_be.comm_init = h_comm_init;
    comm_be.allreduce_start = h_start;
    comm_be.allreduce_wait = h_wait;
    comm_be.broadcast = h_broadcast;
}

typedef struct model {
    ck_graph *g;
    int x, t, w, b, loss;
} model;

static int build_model(model *m)
{
    memset(m, 0, sizeof *m);
    ck_graph *g = m->g = ck_graph_new();
    if (!g) return -1;
    ck_shape sx = {2, {4, 3}}, st = {2, {4, 2}}, sw = {2, {2, 3}}, sb = {1, {2}};
    m->x = ck_graph_leaf(g, CK_KIND_INPUT, "x", &sx, "model.lua:3");
    m->t = ck_graph_leaf(g, CK_KIND_INPUT, "t", &st, "model.lua:4");
    ck_graph_set_scope(g, "head");
    m->w = ck_graph_leaf(g, CK_KIND_PARAM, "head.weight", &sw, "model.lua:5");
    m->b = ck_graph_leaf(g, CK_KIND_PARAM, "head.bias", &sb, "model.lua:6");
    if (m->x < 0 || m->t < 0 || m->w < 0 || m->b < 0) return -1;
    g->t[m->w].init = CK_INIT_NORMAL;
    g->t[m->w].init_b = 0.5f;
    g->t[m->b].init = CK_INIT_ZEROS;
    ck_op_params np = {{0}, {0}};
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT], in[3] = {m->x, m->w, m->b};
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    if (ck_graph_node(g, CK_OP_LINEAR, in, 3, &np, outs, NULL, ids, "model.lua:12") < 0) return -1;
    ck_graph_set_scope(g, "");
    int in2[2] = {ids[0], m->t};
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    if (ck_graph_node(g, CK_OP_MSE_LOSS, in2, 2, &np, outs, NULL, ids, "model.lua:13") < 0) return -1;
    m->loss = ids[0];
    return 0;
}

static ck_program *compile_on(const model *m, const ck_backend *be, int world, char *err, size_t errlen)
{
    ck_compile_opts o;
    memset(&o, 0, sizeof o);
    o.loss = m->loss;
    o.optim = CK_OPTIM_ADAMW;
    o.lr = 1e-2f;
    o.beta1 = 0.9f;
    o.beta2 = 0.999f;
    o.eps = 1e-8f;
    o.weight_decay = 1e-2f;
    o.seed = 7;
    o.world = world;
    o.bucket_bytes = 64; /* each parameter's sum a bucket of its own */
    o.be = be;
    return ck_compile(m->g, &o, err, errlen);
}

static const float X[12] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f, -2.0f, 0.125f, 1.0f, 3.0f, -0.5f, 0.0625f};
static const float T[8] = {1.0f, -1.0f, 0.5f, 2.0f, -0.25f, 0.75f, 1.25f, -1.5f};

static int set_tensor(ck_program *p, int id, const float *v, int n)
{
    float *h = ck_program_write_begin(p, id, 0);
    if (!h) return -1;
    memcpy(h, v, sizeof(float) * (size_t)n);
    return ck_program_write_end(p, id);
}

static int train(ck_program *p, const model *m, int steps)
{
    for (int s = 0; s < steps; s++)
        if (set_tensor(p, m->x, X, 12) || set_tensor(p, m->t, T, 8) || ck_program_step(p)) return -1;
    return 0;
}

static int same_tensor(ck_program *a, ck_program *b, int id)
{
    const size_t bytes = ck_tensor_bytes(&a->g->t[id]);
    float *x = malloc(bytes);
    const float *ra = ck_program_read(a, id);
    if (!x || !ra) {
        free(x);
        return 0;
    }
    memcpy(x, ra, bytes);
    const float *rb = ck_program_read(b, id);
    const int same = rb && memcmp(x, rb, bytes) == 0;
    free(x);
    return same;
}

int main(void)
{
    char err[512] = "";
    model m;
    make_backends();
    if (build_model(&m)) {
        printf("FAIL build the model\n");
        return 1;
    }

    /* 1. */
    unsetenv("CK_COMM_FORCE");
    ck_program *p = compile_on(&m, &plain_be, 2, err, sizeof err);
    check(!p && strstr(err, "fakedev") && strstr(err, "needs NCCL") && !strchr(err, '\n'),
          "a device without collectives refuses data parallel in one line naming NCCL", "%s", p ? "compiled" : err);
    ck_program_free(p);

    /* 2. */
    setenv("CK_COMM_FORCE", "1", 1);
    hk.order_ok = 1;
    ck_program *dp = compile_on(&m, &comm_be, 1, err, sizeof err);
    check(dp != NULL, "compile a world of one as data parallel on the device", "%s", err);
    unsetenv("CK_COMM_FORCE");
    ck_program *plain = compile_on(&m, &comm_be, 1, err, sizeof err);
    check(plain != NULL && plain->nbuckets == 0, "without CK_COMM_FORCE a world of one has no buckets", "%s",
          plain ? "buckets" : err);
    if (!dp || !plain) goto out;
    check(hk.ids == 0 && hk.inits == 0, "compiling opens no communicator (the first step does)", "%d ids, %d inits",
          hk.ids, hk.inits);
    check(dp->nbuckets == 2, "a bucket per parameter", "%d buckets", dp->nbuckets);
    const int steps = 3;
    int rc = train(dp, &m, steps);
    check(rc == 0, "data-parallel steps run", "%s", dp->err);
    check(hk.ids == 1 && hk.inits == 1, "the communicator is opened once: rank 0 makes the id, every rank joins",
          "%d ids, %d inits", hk.ids, hk.inits);
    check(!memcmp(hk.id, hk.got, CK_COMM_ID_BYTES) && hk.init_rank == 0 && hk.init_nranks == 1,
          "comm_init gets rank 0's id, this rank and the job's size", "rank %d of %d", hk.init_rank,
          hk.init_nranks);
    check(hk.init_timeout == ck_dist_timeout(), "the communicator waits with vm/dist's timeout", "%g",
          hk.init_timeout);
    rc = train(plain, &m, steps);
    check(rc == 0, "plain steps run", "%s", plain->err);
    check(hk.starts == 2 * steps && hk.waits == 2 * steps && hk.order_ok,
          "each step starts every bucket once and waits for each after its start", "%d starts, %d waits%s",
          hk.starts, hk.waits, hk.order_ok ? "" : ", out of order");
    check(hk.values == (int64_t)steps * (6 + 2), "the starts cover the buckets' values",
          "%lld values", (long long)hk.values);
    int idle = 1;
    for (int b = 0; b < dp->nbuckets; b++) idle &= !dp->reqs[b].active;
    check(idle, "no sum went through vm/dist", "a request is active");
    check(same_tensor(dp, plain, m.w) && same_tensor(dp, plain, m.b),
          "the weights are the plain program's, bitwise", "differ");
    {
        ck_program *again = (setenv("CK_COMM_FORCE", "1", 1), compile_on(&m, &comm_be, 1, err, sizeof err));
        unsetenv("CK_COMM_FORCE");
        check(again && hk.inits == 1, "a second program shares the communicator", "%d inits: %s", hk.inits,
              again ? "" : err);

        /* 3. */
        hk.inject = 1;
        rc = again ? train(again, &m, 1) : -1;
        check(rc != 0 && again && strstr(again->err, "allreduce_start in data_parallel on commdev") &&
                  strstr(again->err, "injected failure"),
              "a failing collective fails the step, naming the entry and the device", "%s",
              again ? again->err : "no program");
        ck_program_free(again);
    }
out:
    ck_program_free(dp);
    ck_program_free(plain);
    ck_graph_free(m.g);
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
