/* The cost model: a list's step time predicted from each entry's FLOPs and
 * bytes on a device's throughput, and each transfer's bytes on its host
 * link, by a simulation of the compute stream and the copy stream with the
 * waits between them. The devices' figures are their data sheets' peaks
 * times fixed efficiencies (what dense products, memory-bound kernels and
 * pinned copies reach in practice), stated here so that a prediction can be
 * checked against a measured step and the table corrected. */
#include "plan/offload.h"

#include "util/memory.h"

#include <ctype.h>
#include <string.h>

/* the shares of the data sheet's peaks the model assumes reached */
#define EFF_FLOPS 0.6
#define EFF_MEM 0.7
#define EFF_LINK 0.8

#define T 1e12
#define G 1e9

/* name, dense fp32 (non-tensor) FLOP/s, dense 16-bit tensor FLOP/s with
 * fp32 accumulation, memory bytes/s, host link bytes/s (one direction:
 * PCIe 3 x16 16 GB/s, 4 x16 32 GB/s, 5 x16 64 GB/s), seconds per entry.
 * Longer names first where one contains another. */
static const ck_device_speed table[] = {
    {"H200", 67 * T, 989 * T, 4800 * G, 64 * G, 4e-6},
    {"H100 PCIe", 51 * T, 756 * T, 2000 * G, 64 * G, 4e-6},
    {"H100", 67 * T, 989 * T, 3350 * G, 64 * G, 4e-6},
    {"A100 40GB", 19.5 * T, 312 * T, 1555 * G, 32 * G, 4e-6},
    {"A100", 19.5 * T, 312 * T, 2039 * G, 32 * G, 4e-6},
    {"L40S", 91.6 * T, 362 * T, 864 * G, 32 * G, 4e-6},
    {"A6000", 38.7 * T, 154.8 * T, 768 * G, 32 * G, 4e-6},
    {"4090", 82.6 * T, 165.2 * T, 1008 * G, 32 * G, 4e-6},
    {"4080", 48.7 * T, 97.5 * T, 717 * G, 32 * G, 4e-6},
    {"4070", 29.1 * T, 58.3 * T, 504 * G, 32 * G, 4e-6},
    {"4060", 15.1 * T, 30.2 * T, 272 * G, 16 * G, 4e-6}, /* PCIe 4 x8 */
    {"3090", 35.6 * T, 71 * T, 936 * G, 32 * G, 4e-6},
    {"3080", 29.8 * T, 59.5 * T, 760 * G, 32 * G, 4e-6},
    {"3070", 20.3 * T, 40.6 * T, 448 * G, 32 * G, 4e-6},
    {"3060", 12.7 * T, 25.6 * T, 360 * G, 32 * G, 4e-6},
    {"V100", 15.7 * T, 125 * T, 900 * G, 16 * G, 5e-6},
    {"T4", 8.1 * T, 65 * T, 320 * G, 16 * G, 5e-6},
    /* this project's 2-core CI machine (OpenBLAS sgemm on 2 threads, memcpy):
     * a fixed figure, the same for every CPU run; the link is a memcpy */
    {"cpu", 40 * G, 40 * G, 8 * G, 6 * G, 2e-6},
    {NULL, 0, 0, 0, 0, 0},
};

const ck_device_speed *ck_cost_device_table(void) { return table; }

static int contains(const char *hay, const char *needle)
{
    const size_t n = strlen(needle);
    for (; *hay; hay++) {
        size_t k = 0;
        while (k < n && hay[k] && tolower((unsigned char)hay[k]) == tolower((unsigned char)needle[k])) k++;
        if (k == n) return 1;
    }
    return 0;
}

const ck_device_speed *ck_cost_device_find(const char *name)
{
    if (!name || !*name) return NULL;
    for (const ck_device_speed *d = table; d->name; d++)
        if (contains(name, d->name)) return d;
    return NULL;
}

const ck_device_speed *ck_cost_backend_speed(const ck_backend *be)
{
    return be && be->host ? ck_cost_device_find("cpu") : NULL;
}

/* products, convolutions and attention run on tensor cores in 16-bit storage */
static int tensor_op(enum ck_op op) { return ck_op_autocast(op) || op == CK_OP_ATTENTION || op == CK_OP_ATTENTION_BWD; }

/* the time of a kernel of op doing flops over bytes (16-bit operands: half) */
static double seconds(enum ck_op op, double flops, double bytes, int half, const ck_device_speed *dev)
{
    if (op == CK_OP_RESHAPE) return 0; /* a view: no kernel work */
    const double rate = (tensor_op(op) && half ? dev->flops_16 : dev->flops_f32) * EFF_FLOPS;
    const double tf = flops / rate, tm = bytes / (dev->mem_bw * EFF_MEM);
    return (tf > tm ? tf : tm) + dev->launch;
}

/* one entry's time on the compute stream */
static double entry_time(const ck_plan *pl, const ck_graph *g, int i, const ck_device_speed *dev)
{
    const ck_op_ref *r = &pl->ops[i];
    double bytes = 0;
    int half = 0;
    for (int j = 0; j < r->nin + r->nout; j++) {
        const int t = j < r->nin ? r->in[j] : r->out[j - r->nin];
        if (t < 0) continue;
        bytes += (double)ck_plan_tensor_bytes(pl, g, t);
        const ck_dtype dt = g->t[pl->origin[t]].dtype;
        half |= dt == CK_BF16 || dt == CK_F16;
    }
    return seconds(g->n[r->node].op, ck_plan_op_flops(pl, g, i), bytes, half, dev);
}

double ck_cost_node_seconds(const ck_graph *g, int v, double flops, const ck_device_speed *dev)
{
    const ck_node *nd = &g->n[v];
    double bytes = 0;
    int half = 0;
    for (int j = 0; j < nd->nin + nd->nout; j++) {
        const int t = j < nd->nin ? nd->in[j] : nd->out[j - nd->nin];
        if (t < 0) continue;
        bytes += (double)ck_tensor_bytes(&g->t[t]);
        half |= g->t[t].dtype == CK_BF16 || g->t[t].dtype == CK_F16;
    }
    return seconds(nd->op, flops, bytes, half, dev);
}

double ck_cost_copy_seconds(size_t bytes, const ck_device_speed *dev)
{
    return (double)bytes / (dev->link_bw * EFF_LINK);
}

void ck_plan_step_time(const ck_plan *pl, const ck_graph *g, const ck_device_speed *dev, ck_step_time *out)
{
    memset(out, 0, sizeof *out);
    if (!dev) return;
    double tc = 0, tx = 0;
    double done[256], *slot_done = done;
    double *heap = NULL;
    if (pl->nslots > (int)(sizeof done / sizeof *done)) {
        heap = ck_big_zalloc(sizeof *heap * (size_t)pl->nslots);
        if (!heap) return;
        slot_done = heap;
    }
    for (int i = 0; i < pl->n; i++) {
        const ck_op_ref *r = &pl->ops[i];
        if (r->xfer == CK_XFER_OUT || r->xfer == CK_XFER_IN) {
            const double d = ck_cost_copy_seconds(ck_plan_tensor_bytes(pl, g, r->in[0]), dev);
            tx = (tx > tc ? tx : tc) + d;
            slot_done[r->slot] = tx;
            out->copies += d;
        } else if (r->xfer) {
            if (slot_done[r->slot] > tc) {
                out->stalled += slot_done[r->slot] - tc;
                tc = slot_done[r->slot];
            }
        } else {
            const double d = entry_time(pl, g, i, dev);
            tc += d;
            out->compute += d;
            if (r->phase == CK_PHASE_RECOMPUTE) out->recompute += d;
        }
    }
    out->step = tc > tx ? tc : tx; /* the list ends joined */
    ck_big_free(heap);
}
