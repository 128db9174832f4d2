/* Specification of the executor's backend seam (ops/backend.h, vm/run/exec.c,
 * vm/run/program.c) without a GPU. A "fake device" backend runs the CPU kernels on
 * an arena the program may only reach through upload/download (host = 0), so
 * every host read and write goes through the stage; its copies are counted.
 *   1. a small linear + mse_loss model trained 3 AdamW steps on the CPU and on
 *      the fake device: losses, parameters and gradients bitwise equal, and
 *      the fake device's copies were used (reads never hand out the arena);
 *   2. a partial write (keep = 1) downloads first and keeps the other values;
 *   3. the measured peak equals the planned one, on both backends;
 *   4. the non-finite guard skips the update and names the entry;
 *   5. a kernel failure recorded in the backend is reported as
 *      "<where>: <op> in <scope> on <backend>: <error>" and then cleared;
 *   6. a kernel missing from a backend's table fails the step, naming it.
 * Everything is freed: the test also runs under ASan/LSan. */
#include "backend.h"
#include "cpu/cpu.h"
#include "run/program.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "named_check.h"

/* ---- the fake device ---------------------------------------------------- */

static struct {
    long allocs, releases, uploads, downloads, copies, enters;
} fake;

static void fake_enter(void) { fake.enters++; }

static void *fake_alloc(size_t bytes)
{
    /* 64-byte aligned, rounded up, with a line of slack past the end */
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    if (p) fake.allocs++;
    return p;
}

static void fake_release(void *p)
{
    if (p) fake.releases++;
    free(p);
}

static int fake_upload(void *dst, const void *src_host, size_t bytes)
{
    fake.uploads++;
    if (bytes) memcpy(dst, src_host, bytes);
    return 0;
}

static int fake_download(void *dst_host, const void *src, size_t bytes)
{
    fake.downloads++;
    if (bytes) memcpy(dst_host, src, bytes);
    return 0;
}

static int fake_copy(void *dst, const void *src, size_t bytes)
{
    fake.copies++;
    if (bytes) memmove(dst, src, bytes);
    return 0;
}

static ck_backend fake_be;

static const ck_backend *fake_backend(void)
{
    if (!fake_be.name) {
        fake_be = *ck_backend_cpu();
        fake_be.name = "fakedev";
        fake_be.host = 0;
        fake_be.enter = fake_enter;
        fake_be.alloc = fake_alloc;
        fake_be.release = fake_release;
        fake_be.upload = fake_upload;
        fake_be.download = fake_download;
        fake_be.copy = fake_copy;
    }
    return &fake_be;
}

/* ---- a device whose linear kernel fails --------------------------------- */

static const char *fail_msg = "";
static long fail_calls;

static const char *fail_error(void) { return fail_msg; }
static void fail_clear_error(void) { fail_msg = ""; }

static CK_CPU_KERNEL(fail_linear)
{
    (void)ctx, (void)p, (void)out, (void)nout, (void)in, (void)nin;
    fail_calls++;
    if (!fail_msg[0]) fail_msg = "linear_kernel: injected failure";
}

static ck_kernel_fn fail_kernels[CK_OP_COUNT];
static ck_backend fail_be;

static const ck_backend *fail_backend(void)
{
    if (!fail_be.name) {
        memcpy(fail_kernels, ck_cpu_kernels, sizeof fail_kernels);
        fail_kernels[CK_OP_LINEAR] = fail_linear;
        fail_be = *fake_backend();
        fail_be.name = "faildev";
        fail_be.kernels = fail_kernels;
        fail_be.error = fail_error;
        fail_be.clear_error = fail_clear_error;
    }
    return &fail_be;
}

/* ---- a device without an mse_loss kernel -------------------------------- */

static ck_kernel_fn gap_kernels[CK_OP_COUNT];
static ck_backend gap_be;

static const ck_backend *gap_backend(void)
{
    if (!gap_be.name) {
        memcpy(gap_kernels, ck_cpu_kernels, sizeof gap_kernels);
        gap_kernels[CK_OP_MSE_LOSS] = NULL;
        gap_be = *fake_backend();
        gap_be.name = "gapdev";
        gap_be.kernels = gap_kernels;
    }
    return &gap_be;
}

/* ---- the model ---------------------------------------------------------- */

#define WHERE_LINEAR "model.lua:12"
#define WHERE_LOSS "model.lua:13"

typedef struct model {
    ck_graph *g;
    int x, t, w, b, y, loss;
    int linear_node, loss_node;
} model;

static ck_shape shape2(int64_t a, int64_t b)
{
    ck_shape s = {2, {a, b}};
    return s;
}

static int build_model(model *m)
{
    memset(m, 0, sizeof *m);
    ck_graph *g = m->g = ck_graph_new();
    if (!g) return -1;
    ck_shape sx = shape2(4, 3), st = shape2(4, 2), sw = shape2(2, 3), sb = {1, {2}};
    m->x = ck_graph_leaf(g, CK_KIND_INPUT, "x", &sx, "model.lua:3");
    m->t = ck_graph_leaf(g, CK_KIND_INPUT, "t", &st, "model.lua:4");
    ck_graph_set_scope(g, "head");
    m->w = ck_graph_leaf(g, CK_KIND_PARAM, "head.weight", &sw, "model.lua:5");
    m->b = ck_graph_leaf(g, CK_KIND_PARAM, "head.bias", &sb, "model.lua:6");
    if (m->x < 0 || m->t < 0 || m->w < 0 || m->b < 0) return -1;
    g->t[m->w].init = CK_INIT_NORMAL;
    g->t[m->w].init_a = 0.0f;
    g->t[m->w].init_b = 0.5f;
    g->t[m->b].init = CK_INIT_ZEROS;

    ck_op_params np = {{0}, {0}};
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT];
    int in[3] = {m->x, m->w, m->b};
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    m->linear_node = ck_graph_node(g, CK_OP_LINEAR, in, 3, &np, outs, NULL, ids, WHERE_LINEAR);
    if (m->linear_node < 0) return -1;
    m->y = ids[0];

    ck_graph_set_scope(g, "");
    int in2[2] = {m->y, m->t};
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    m->loss_node = ck_graph_node(g, CK_OP_MSE_LOSS, in2, 2, &np, outs, NULL, ids, WHERE_LOSS);
    if (m->loss_node < 0) return -1;
    m->loss = ids[0];
    return 0;
}

static ck_program *compile_on(const model *m, const ck_backend *be, char *err, size_t errlen)
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
    o.keep_grads = 1;
    o.be = be;
    return ck_compile(m->g, &o, err, errlen);
}

static const float X[12] = {0.5f, -1.0f, 2.0f, 0.25f, 1.5f, -0.75f, -2.0f, 0.125f, 1.0f, 3.0f, -0.5f, 0.0625f};
static const float T[8] = {1.0f, -1.0f, 0.5f, 2.0f, -0.25f, 0.75f, 1.25f, -1.5f};

/* writes n values into tensor id through write_begin/write_end (keep = 0) */
static int set_tensor(ck_program *p, int id, const float *v, int n)
{
    float *h = ck_program_write_begin(p, id, 0);
    if (!h) return -1;
    memcpy(h, v, sizeof(float) * (size_t)n);
    return ck_program_write_end(p, id);
}

/* a malloc'd copy of tensor id as the host reads it (NULL if unreadable) */
static float *read_copy(ck_program *p, int id)
{
    const float *r = ck_program_read(p, id);
    if (!r) return NULL;
    size_t bytes = ck_tensor_bytes(&p->g->t[id]);
    float *c = malloc(bytes ? bytes : 1);
    if (c) memcpy(c, r, bytes);
    return c;
}

static int same_tensor(ck_program *a, ck_program *b, int id)
{
    float *x = read_copy(a, id), *y = read_copy(b, id);
    int ok = x && y && memcmp(x, y, ck_tensor_bytes(&a->g->t[id])) == 0;
    free(x);
    free(y);
    return ok;
}

static int inside_arena(const ck_program *p, const void *q)
{
    const unsigned char *c = q;
    return c >= p->grp->arena && c < p->grp->arena + p->arena_bytes;
}

/* the persistent tensors the update touches: parameters and AdamW moments */
static int state_ids(const ck_program *p, const model *m, int *ids)
{
    int n = 0;
    ids[n++] = m->w;
    ids[n++] = m->b;
    const char *names[] = {"exp_avg.head.weight", "exp_avg_sq.head.weight", "exp_avg.head.bias",
                           "exp_avg_sq.head.bias"};
    for (int k = 0; k < 4; k++) {
        int id = ck_graph_find(p->g, names[k]);
        if (id >= 0) ids[n++] = id;
    }
    return n;
}

/* ---- 1. CPU and fake device agree bitwise ------------------------------- */

static void test_equivalence(const model *m)
{
    char err[512] = "";
    ck_program *cpu = compile_on(m, NULL, err, sizeof err);
    check(cpu != NULL, "compile on cpu", "%s", err);
    long allocs0 = fake.allocs;
    ck_program *dev = compile_on(m, fake_backend(), err, sizeof err);
    check(dev != NULL, "compile on fakedev", "%s", err);
    if (!cpu || !dev) goto out;
    check(cpu->be == ck_backend_cpu(), "be = NULL compiles for the cpu backend", "be is %s", cpu->be->name);
    check(dev->be == &fake_be, "the program runs on the backend it was given", "be is %s", dev->be->name);
    check(fake.allocs == allocs0 + 1, "the arena is one allocation of the backend", "%ld allocs",
          fake.allocs - allocs0);
    check(cpu->train.peak == dev->train.peak && cpu->persistent == dev->persistent,
          "same plan on both backends", "peak %zu vs %zu", cpu->train.peak, dev->train.peak);

    /* initialization went through the stage on the device */
    check(fake.uploads > 0, "initial values uploaded on fakedev", "uploads %ld", fake.uploads);
    check(same_tensor(cpu, dev, m->w), "initial weight equal on cpu and fakedev", "differs");

    long up0 = fake.uploads, down0 = fake.downloads;
    int rc = set_tensor(cpu, m->x, X, 12) | set_tensor(cpu, m->t, T, 8);
    check(rc == 0, "write x and t on cpu", "%s", cpu->err);
    rc = set_tensor(dev, m->x, X, 12) | set_tensor(dev, m->t, T, 8);
    check(rc == 0, "write x and t on fakedev", "%s", dev->err);
    check(fake.uploads == up0 + 2 && fake.downloads == down0, "a full write uploads once and downloads nothing",
          "uploads +%ld downloads +%ld", fake.uploads - up0, fake.downloads - down0);

    float lc[3] = {0}, ld[3] = {0};
    int ok_steps = 1;
    for (int s = 0; s < 3; s++) {
        if (ck_program_step(cpu)) {
            check(0, "step on cpu", "%s", cpu->err);
            ok_steps = 0;
            break;
        }
        if (ck_program_step(dev)) {
            check(0, "step on fakedev", "%s", dev->err);
            ok_steps = 0;
            break;
        }
        const float *a = ck_program_read(cpu, m->loss);
        if (a) lc[s] = *a;
        long d0 = fake.downloads;
        const float *b = ck_program_read(dev, m->loss);
        if (b) ld[s] = *b;
        check(a && b && memcmp(&lc[s], &ld[s], sizeof(float)) == 0, "loss equal bitwise after a step",
              "step %d: cpu %.9g fakedev %.9g", s + 1, lc[s], ld[s]);
        check(b && !inside_arena(dev, b) && fake.downloads == d0 + 1,
              "a read on fakedev downloads into the stage", "pointer %s the arena, downloads +%ld",
              b && inside_arena(dev, b) ? "inside" : "outside", fake.downloads - d0);
    }
    if (ok_steps) check(1, "3 steps on cpu and fakedev", "");
    check(cpu->grp->step == 3 && dev->grp->step == 3, "both programs took 3 steps", "cpu %lld fakedev %lld",
          (long long)cpu->grp->step, (long long)dev->grp->step);
    check(isfinite(lc[0]) && lc[2] < lc[0], "the loss goes down", "%g %g %g", lc[0], lc[1], lc[2]);

    int ids[8];
    int n = state_ids(cpu, m, ids);
    check(n == 6, "AdamW state found", "%d tensors", n);
    for (int k = 0; k < n; k++) {
        char name[160];
        snprintf(name, sizeof name, "%s equal bitwise after 3 steps", cpu->g->t[ids[k]].name);
        check(same_tensor(cpu, dev, ids[k]), name, "differs");
    }
    int grads[2] = {cpu->g->t[m->w].grad, cpu->g->t[m->b].grad};
    for (int k = 0; k < 2; k++) {
        check(grads[k] >= 0 && ck_program_read(cpu, grads[k]) != NULL, "gradient readable (keep_grads)", "%s",
              cpu->err);
        if (grads[k] < 0) continue;
        check(same_tensor(cpu, dev, grads[k]), k ? "grad of head.bias equal bitwise" : "grad of head.weight equal bitwise",
              "differs");
    }
    /* the weight moved: the equality above is not between two untouched copies */
    {
        float *w = read_copy(dev, m->w);
        ck_program *fresh = compile_on(m, NULL, err, sizeof err);
        float *w0 = fresh ? read_copy(fresh, m->w) : NULL;
        check(w && w0 && memcmp(w, w0, 6 * sizeof(float)) != 0, "the weight was updated", "unchanged");
        free(w);
        free(w0);
        ck_program_free(fresh);
    }

    /* the forward-only pass agrees as well */
    check(ck_program_forward(cpu) == 0 && ck_program_forward(dev) == 0, "forward on both", "%s / %s", cpu->err,
          dev->err);
    check(same_tensor(cpu, dev, m->loss), "forward loss equal bitwise", "differs");

    check(fake.uploads > 0 && fake.downloads > 0, "fakedev staged through upload and download",
          "uploads %ld downloads %ld", fake.uploads, fake.downloads);
    check(fake.enters > 0, "the backend was entered", "enters %ld", fake.enters);
out:
    ck_program_free(cpu);
    ck_program_free(dev);
}

/* ---- 2. partial write with keep = 1 -------------------------------------- */

static void test_partial_write(const model *m)
{
    char err[512] = "";
    ck_program *dev = compile_on(m, fake_backend(), err, sizeof err);
    check(dev != NULL, "compile on fakedev (partial write)", "%s", err);
    if (!dev) return;
    check(set_tensor(dev, m->t, T, 8) == 0, "write t", "%s", dev->err);

    long d0 = fake.downloads, u0 = fake.uploads;
    float *h = ck_program_write_begin(dev, m->t, 1);
    check(h != NULL, "write_begin keep=1", "%s", dev->err);
    if (!h) goto out;
    check(fake.downloads == d0 + 1, "keep=1 downloads the current values", "downloads +%ld", fake.downloads - d0);
    check(!inside_arena(dev, h), "keep=1 hands out the stage, not the arena", "inside the arena");
    check(memcmp(h, T, sizeof T) == 0, "the stage starts with the current values", "h[1] %g", h[1]);
    h[0] = 42.0f;
    check(ck_program_write_end(dev, m->t) == 0, "write_end", "%s", dev->err);
    check(fake.uploads == u0 + 1, "write_end uploads once", "uploads +%ld", fake.uploads - u0);

    /* scribble on the stage so that the read-back must come from the device */
    if (dev->stage) memset(dev->stage, 0xff, dev->stage_bytes);
    const float *r = ck_program_read(dev, m->t);
    check(r != NULL, "read t back", "%s", dev->err);
    if (r) {
        check(r[0] == 42.0f, "element 0 changed", "t[0] = %g", r[0]);
        check(memcmp(r + 1, T + 1, sizeof T - sizeof T[0]) == 0, "the other elements unchanged", "t[1] = %g", r[1]);
    }
out:
    ck_program_free(dev);
}

/* ---- 3. measured peak ----------------------------------------------------- */

static void measured_peak_on(const model *m, const ck_backend *be, const char *label)
{
    char err[512] = "", name[128];
    ck_program *p = compile_on(m, be, err, sizeof err);
    snprintf(name, sizeof name, "compile on %s (measure)", label);
    check(p != NULL, name, "%s", err);
    if (!p) return;
    set_tensor(p, m->x, X, 12);
    set_tensor(p, m->t, T, 8);
    ck_run_opts o = {0, 0, 1};
    ck_run_info r;
    int rc = ck_program_run(p, &o, &r);
    snprintf(name, sizeof name, "measured run on %s", label);
    check(rc == 0, name, "%s", p->err);
    snprintf(name, sizeof name, "measured high water == planned peak on %s", label);
    check(rc == 0 && r.high_water == p->train.peak, name, "high water %zu, peak %zu (persistent %zu)",
          r.high_water, p->train.peak, p->persistent);
    check(r.plan == &p->train && r.nonfinite == 0, "the training list ran, finite", "nonfinite %d", r.nonfinite);
    ck_program_free(p);
}

/* ---- 4. the guard --------------------------------------------------------- */

static void test_guard(const model *m)
{
    char err[512] = "";
    ck_program *dev = compile_on(m, fake_backend(), err, sizeof err);
    check(dev != NULL, "compile on fakedev (guard)", "%s", err);
    if (!dev) return;
    set_tensor(dev, m->x, X, 12);
    set_tensor(dev, m->t, T, 8);
    check(ck_program_step(dev) == 0, "a finite step first", "%s", dev->err);

    int ids[8], n = state_ids(dev, m, ids);
    float *before[8] = {0};
    for (int k = 0; k < n; k++) before[k] = read_copy(dev, ids[k]);

    float *h = ck_program_write_begin(dev, m->x, 1);
    if (h) {
        h[4] = NAN;
        ck_program_write_end(dev, m->x);
    }
    ck_run_opts o = {0, 1, 0};
    ck_run_info r;
    int rc = ck_program_run(dev, &o, &r);
    check(rc == 0, "guarded run returns 0", "%s", dev->err);
    check(r.nonfinite == 1, "guard: nonfinite", "nonfinite %d", r.nonfinite);
    check(r.loss_nonfinite == 1, "guard: the loss was non-finite", "loss_nonfinite %d", r.loss_nonfinite);
    check(r.bad_entry >= 0, "guard: names an entry", "bad_entry %d", r.bad_entry);
    if (r.bad_entry >= 0 && r.plan) {
        int node = r.plan->ops[r.bad_entry].node;
        check(node == m->linear_node, "guard: the first bad entry is the linear", "node %d (%s)", node,
              ck_op_name(dev->g->n[node].op));
    }
    check(r.bad_input == m->x, "guard: the bad input is x", "bad_input %d", r.bad_input);
    for (int k = 0; k < n; k++) {
        char name[160];
        snprintf(name, sizeof name, "guard: %s unchanged", dev->g->t[ids[k]].name);
        float *after = read_copy(dev, ids[k]);
        check(before[k] && after && memcmp(before[k], after, ck_tensor_bytes(&dev->g->t[ids[k]])) == 0, name,
              "changed");
        free(after);
        free(before[k]);
    }
    ck_program_free(dev);
}

/* ---- 5. a kernel failure is named ---------------------------------------- */

static void test_failure_naming(const model *m)
{
    char err[512] = "";
    ck_program *p = compile_on(m, fail_backend(), err, sizeof err);
    check(p != NULL, "compile on faildev", "%s", err);
    if (!p) return;
    set_tensor(p, m->x, X, 12);
    set_tensor(p, m->t, T, 8);
    int ids[8], n = state_ids(p, m, ids);
    float *before[8] = {0};
    for (int k = 0; k < n; k++) before[k] = read_copy(p, ids[k]);

    long calls0 = fail_calls;
    int rc = ck_program_step(p);
    check(rc == -1, "step on faildev fails", "rc %d", rc);
    check(fail_calls == calls0 + 1, "the failing kernel ran once", "%ld calls", fail_calls - calls0);
    printf("     p->err: %s\n", p->err);
    const char *want[] = {WHERE_LINEAR, "linear", "in head", "faildev", "injected failure"};
    for (int k = 0; k < 5; k++) {
        char name[128];
        snprintf(name, sizeof name, "error names '%s'", want[k]);
        check(strstr(p->err, want[k]) != NULL, name, "'%s'", p->err);
    }
    check(strstr(p->err, WHERE_LINEAR ": linear in head on faildev: linear_kernel: injected failure") == p->err,
          "error reads '<where>: <op> in <scope> on <backend>: <error>'", "'%s'", p->err);
    check(fail_be.error()[0] == 0, "the backend error is cleared after the report", "'%s'", fail_be.error());
    check(p->grp->step == 0, "a failed step is not counted", "step %lld", (long long)p->grp->step);
    for (int k = 0; k < n; k++) {
        char name[160];
        snprintf(name, sizeof name, "failed step: %s unchanged", p->g->t[ids[k]].name);
        float *after = read_copy(p, ids[k]);
        check(before[k] && after && memcmp(before[k], after, ck_tensor_bytes(&p->g->t[ids[k]])) == 0, name,
              "changed");
        free(after);
        free(before[k]);
    }
    /* a second step fails the same way: nothing stale is left behind */
    rc = ck_program_step(p);
    check(rc == -1 && strstr(p->err, "injected failure") && fail_be.error()[0] == 0, "the failure repeats and clears",
          "rc %d '%s'", rc, p->err);
    ck_program_free(p);
}

/* ---- 6. a kernel missing from the table ---------------------------------- */

static void test_missing_kernel(const model *m)
{
    char err[512] = "";
    ck_program *p = compile_on(m, gap_backend(), err, sizeof err);
    check(p != NULL, "compile succeeds without an mse_loss kernel", "%s", err);
    if (!p) return;
    set_tensor(p, m->x, X, 12);
    set_tensor(p, m->t, T, 8);
    int rc = ck_program_step(p);
    check(rc == -1, "step without an mse_loss kernel fails", "rc %d", rc);
    printf("     p->err: %s\n", p->err);
    check(strstr(p->err, "mse_loss") != NULL, "error names 'mse_loss'", "'%s'", p->err);
    check(strstr(p->err, "no gapdev kernel") != NULL, "error says 'no gapdev kernel'", "'%s'", p->err);
    check(strstr(p->err, WHERE_LOSS) == p->err, "error starts with the node's line", "'%s'", p->err);
    check(p->grp->step == 0, "the failed step is not counted", "step %lld", (long long)p->grp->step);
    rc = ck_program_forward(p);
    check(rc == -1 && strstr(p->err, "no gapdev kernel"), "forward fails too", "rc %d '%s'", rc, p->err);
    ck_program_free(p);
}

int main(void)
{
    model m;
    if (build_model(&m)) {
        printf("FAIL building the graph: %s\n", m.g ? m.g->err : "out of memory");
        ck_graph_free(m.g);
        return 1;
    }
    test_equivalence(&m);
    test_partial_write(&m);
    measured_peak_on(&m, NULL, "cpu");
    measured_peak_on(&m, fake_backend(), "fakedev");
    test_guard(&m);
    test_failure_naming(&m);
    test_missing_kernel(&m);
    check(fake.allocs == fake.releases, "every arena the device backends allocated was released",
          "%ld allocs, %ld releases", fake.allocs, fake.releases);
    ck_graph_free(m.g);
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
