/* Offload as entries of the op list (vm/plan/offload.c), on random
 * differentiated graphs (linear layers, activations, sums, products,
 * reshapes that alias, norms) under random decisions that keep, recompute or
 * offload each saved activation:
 *  - offload_moves_every_later_read_to_a_copy: no entry after the forward
 *    part reads an offloaded buffer; each copy back is waited for right
 *    before its first reader, each copy out waited for before the forward
 *    part ends, each slot used by one copy;
 *  - host_ids_live_in_the_host_region: host ids have no arena offset, and
 *    two host ids live at one position never share host bytes;
 *  - offloaded_training_is_bitwise_kept_training: on the CPU backend, three
 *    steps of a program that offloads leave every parameter bitwise where
 *    the same decision without offload leaves it, and the measured
 *    high-water mark of the arena is the planned peak;
 *  - the cost model: a list's predicted step is its compute, plus what it
 *    waits for copies; the copies take their bytes over the link;
 *  - the_joint_search_judges_a_decision_as_its_list: ck_offload_judge's live
 *    peak and predicted step, found without building the list, are those of
 *    the list ck_schedule and ck_offload_schedule build;
 *  - auto_is_never_beaten_by_a_fixed_choice: a budget with offload allowed
 *    (the joint search) plans within the budget, and no fixed choice (none,
 *    sqrt_n, every_n:1-3, selective, the recompute-only budget search, each
 *    as it is and with all it keeps offloaded) that fits the budget has a
 *    shorter predicted step; a budget nothing fits is refused in one line
 *    naming the smallest peak with offload and without, and a budget of the
 *    one named with offload plans. */
#include "plan/evaluate.h"
#include "plan/offload.h"
#include "plan/policy.h"
#include "run/program.h"

#include "check.h"
#include "program_tensors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int node(ck_graph *g, enum ck_op op, const int *in, int nin, const ck_op_params *p, const ck_shape *want,
                int *out)
{
    ck_shape outs[CK_MAX_OUT];
    int ids[CK_MAX_OUT];
    for (int k = 0; k < CK_MAX_OUT; k++) outs[k].ndim = -1;
    if (want) outs[0] = *want;
    const int v = ck_graph_node(g, op, in, nin, p, outs, NULL, ids, "model.lua:1");
    if (v >= 0 && out) *out = ids[0];
    return v;
}

/* a random model of width 8 on b rows: each op draws its inputs from the
 * activations made so far; the loss is the MSE of the last against a target */
static ck_graph *random_model(int b, int depth, int *loss)
{
    ck_graph *g = ck_graph_new();
    ck_shape sx = {2, {b, 8}}, sw = {2, {8, 8}}, sbias = {1, {8}};
    int pool[128], np = 0;
    pool[np++] = ck_graph_leaf(g, CK_KIND_INPUT, "x", &sx, "model.lua:1");
    const int target = ck_graph_leaf(g, CK_KIND_INPUT, "target", &sx, "model.lua:1");
    const int gamma = ck_graph_leaf(g, CK_KIND_FROZEN, "norm.weight", &sbias, "model.lua:1");
    const int beta = ck_graph_leaf(g, CK_KIND_FROZEN, "norm.bias", &sbias, "model.lua:1");
    for (int d = 0; d < depth && np < 120; d++) {
        const int a = pool[np - 1 - (int)(next() % (uint64_t)(np < 4 ? np : 4))];
        const int c = pool[next() % (uint64_t)np];
        ck_op_params p = {{0}, {0}};
        char name[32];
        int out = -1;
        switch (next() % 7) {
        case 0:
        case 1: {
            snprintf(name, sizeof name, "l%d.weight", d);
            const int w = ck_graph_leaf(g, next() % 3 ? CK_KIND_PARAM : CK_KIND_FROZEN, name, &sw, "model.lua:2");
            snprintf(name, sizeof name, "l%d.bias", d);
            const int bias = ck_graph_leaf(g, CK_KIND_PARAM, name, &sbias, "model.lua:2");
            const int in[3] = {a, w, bias};
            node(g, CK_OP_LINEAR, in, 3, &p, NULL, &out);
            break;
        }
        case 2: node(g, CK_OP_SILU, &a, 1, &p, NULL, &out); break;
        case 3: {
            const int in[2] = {a, c};
            node(g, CK_OP_MUL, in, 2, &p, NULL, &out);
            break;
        }
        case 4: { /* through another shape and back: both views share a buffer */
            ck_shape s2 = {2, {2 * b, 4}};
            int mid = -1;
            node(g, CK_OP_RESHAPE, &a, 1, &p, &s2, &mid);
            node(g, CK_OP_GELU, &mid, 1, &p, NULL, &mid);
            node(g, CK_OP_RESHAPE, &mid, 1, &p, &sx, &out);
            break;
        }
        case 5: {
            const int in[3] = {a, gamma, beta};
            p.f[0] = 1e-5f;
            node(g, CK_OP_LAYER_NORM, in, 3, &p, NULL, &out);
            break;
        }
        default: {
            const int in[2] = {a, c};
            node(g, CK_OP_ADD, in, 2, &p, NULL, &out);
            break;
        }
        }
        if (out >= 0) pool[np++] = out;
    }
    const int in[2] = {pool[np - 1], target};
    ck_op_params p = {{0}, {0}};
    node(g, CK_OP_MSE_LOSS, in, 2, &p, NULL, loss);
    return g;
}

/* a decision the test gives compile: per candidate 0 keep, 1 recompute,
 * CK_OFFLOAD, from the seed; with no_offload, offload reads as keep */
typedef struct decision {
    uint64_t seed;
    int no_offload;
} decision;

static int decide(void *ud, const ck_decide_ctx *c, unsigned char *mark, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    const decision *d = ud;
    uint64_t s = d->seed;
    for (int k = 0; k < c->ncand; k++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int v = (int)(s >> 33) % 3;
        mark[c->cand[k]] = (unsigned char)(v == 2 ? (d->no_offload ? 0 : CK_OFFLOAD) : v);
    }
    return 0;
}

static int turn_of(const ck_plan *pl)
{
    int turn = 0;
    while (turn < pl->n && pl->ops[turn].phase == CK_PHASE_FORWARD) turn++;
    return turn;
}

/* the list's transfers checked against the rules ck_offload_schedule states */
static int transfers_sound(const ck_plan *pl, const ck_graph *g)
{
    const int turn = turn_of(pl);
    int ok = 1;
    unsigned char *seen = calloc((size_t)pl->nslots + 1, 1), *gone = calloc((size_t)g->nt, 1);
    for (int i = 0; i < pl->n && ok; i++) {
        const ck_op_ref *r = &pl->ops[i];
        if (r->xfer == CK_XFER_OUT || r->xfer == CK_XFER_IN) {
            ok &= (int)r->slot < pl->nslots && !seen[r->slot];
            seen[r->slot] = 1;
            ok &= pl->loc[r->xfer == CK_XFER_OUT ? r->out[0] : r->in[0]] == CK_LOC_HOST;
            if (r->xfer == CK_XFER_OUT) {
                ok &= i < turn;
                gone[r->in[0]] = 1;
                /* its wait follows before the turn */
                int w = i + 1;
                while (w < turn && !(pl->ops[w].xfer == CK_XFER_OUT_WAIT && pl->ops[w].slot == r->slot)) w++;
                ok &= w < turn;
            } else {
                ok &= i >= turn && pl->loc[r->out[0]] == CK_LOC_BACK;
                /* its wait comes before any other entry touches the copy */
                int w = i + 1;
                while (w < pl->n && !(pl->ops[w].xfer == CK_XFER_IN_WAIT && pl->ops[w].slot == r->slot)) {
                    for (int j = 0; j < pl->ops[w].nin; j++) ok &= pl->ops[w].in[j] != r->out[0];
                    w++;
                }
                ok &= w < pl->n;
            }
        }
    }
    /* after the turn nothing reads a buffer that went out (its aliases included: through their root) */
    for (int i = turn; i < pl->n && ok; i++) {
        const ck_op_ref *r = &pl->ops[i];
        if (r->xfer) continue;
        for (int j = 0; j < r->nin; j++) {
            int t = r->in[j];
            while (t < g->nt && g->t[t].node >= 0 && g->n[g->t[t].node].op == CK_OP_RESHAPE) t = g->n[g->t[t].node].in[0];
            ok &= !(t < g->nt && gone[t]);
        }
    }
    free(seen);
    free(gone);
    return ok;
}

/* no two host ids live at one position share host bytes; none has an arena offset */
static int host_placed(const ck_plan *pl, const ck_graph *g)
{
    const int nt = pl->ntensors;
    int *first = malloc(sizeof(int) * (size_t)nt), *last = malloc(sizeof(int) * (size_t)nt);
    for (int t = 0; t < nt; t++) first[t] = last[t] = -1;
    for (int i = 0; i < pl->n; i++)
        for (int j = 0; j < pl->ops[i].nin + pl->ops[i].nout; j++) {
            const int t = j < pl->ops[i].nin ? pl->ops[i].in[j] : pl->ops[i].out[j - pl->ops[i].nin];
            if (t < 0) continue;
            if (first[t] < 0) first[t] = i;
            last[t] = i;
        }
    int ok = 1;
    for (int a = 0; a < nt && ok; a++) {
        if (pl->loc[a] != CK_LOC_HOST || first[a] < 0) continue;
        const int64_t ea = pl->off[a] + (int64_t)ck_plan_tensor_bytes(pl, g, a);
        ok &= pl->off[a] >= 0 && (size_t)ea <= pl->host_peak;
        for (int b = a + 1; b < nt && ok; b++) {
            if (pl->loc[b] != CK_LOC_HOST || first[b] < 0 || last[a] < first[b] || last[b] < first[a]) continue;
            const int64_t eb = pl->off[b] + (int64_t)ck_plan_tensor_bytes(pl, g, b);
            ok &= ea <= pl->off[b] || eb <= pl->off[a];
        }
    }
    free(first);
    free(last);
    return ok;
}

static ck_program *compile(const ck_graph *g, int loss, decision *d, int offload, char *err)
{
    ck_compile_opts o = {0};
    o.loss = loss;
    o.optim = CK_OPTIM_ADAMW;
    o.lr = 1e-2f, o.beta1 = 0.9f, o.beta2 = 0.999f, o.eps = 1e-8f;
    o.seed = 7;
    o.storage = o.frozen = CK_F32;
    o.decide = decide;
    o.decide_ud = d;
    o.offload = offload;
    o.prefetch = 1 + (int)(d->seed % 4);
    return ck_compile(g, &o, err, 512);
}

/* decision mark's list (its recompute, then its transfers at prefetch)
 * placed: its peak and its predicted step on dev; 0, or -1 */
static int exact_of(const ck_decide_ctx *c, const unsigned char *mark, size_t *peak, double *time)
{
    const ck_graph *g = c->g;
    unsigned char *R = malloc((size_t)g->nt);
    for (int t = 0; t < g->nt; t++) R[t] = mark[t] == 1;
    ck_plan pl;
    int rc = -1;
    if (!ck_schedule(&pl, g, c->nodes, c->n, R)) {
        if (ck_offload_schedule(&pl, g, mark, c->retain, c->prefetch) >= 0 &&
            !ck_plan_memory(&pl, g, c->poff, c->persistent, c->retain, c->be)) {
            ck_step_time st;
            ck_plan_step_time(&pl, g, c->speed, &st);
            *peak = pl.peak, *time = st.step;
            rc = 0;
        }
        ck_plan_free(&pl);
    }
    free(R);
    return rc;
}

int main(void)
{
    int graphs = 0, offloaded = 0, sound = 1, placed = 1, bitwise = 1, measured = 1, built = 1;
    char err[512], name[768];
    for (int round = 0; round < 24; round++) {
        int loss = -1;
        ck_graph *g = random_model(1 + (int)(next() % 3), 6 + (int)(next() % 24), &loss);
        if (loss < 0) {
            built = 0;
            ck_graph_free(g);
            continue;
        }
        decision with = {next(), 0}, without = {with.seed, 1};
        ck_program *pa = compile(g, loss, &with, CK_OFFLOAD_NONE, err), *pb = pa ? compile(g, loss, &without, 0, err) : NULL;
        if (!pa || !pb) {
            snprintf(name, sizeof name, "round %d compiles: %.150s", round, err);
            check(name, 0, 0);
            built = 0;
            ck_program_free(pa);
            ck_graph_free(g);
            continue;
        }
        graphs++;
        offloaded += pa->train.nslots > 0;
        if (pa->train.loc) {
            sound &= transfers_sound(&pa->train, pa->g);
            placed &= host_placed(&pa->train, pa->g) && pa->host_bytes == pa->train.host_peak;
        }
        for (int s = 0; s < 3; s++) {
            size_t hw = 0;
            if (ck_program_step_measured(pa, &hw) || ck_program_step(pb)) {
                snprintf(name, sizeof name, "round %d step %d: %.80s%.80s", round, s, pa->err, pb->err);
                check(name, 0, 0);
                bitwise = 0;
                break;
            }
            if (hw != pa->train.peak && measured) {
                snprintf(name, sizeof name, "round %d step %d: high-water %zu, plan %zu", round, s, hw, pa->train.peak);
                check(name, 0, 0);
                measured = 0;
            }
        }
        size_t na, nb;
        unsigned char *a = tensors_of(pa, CK_KIND_PARAM, &na), *b = tensors_of(pb, CK_KIND_PARAM, &nb);
        if (na != nb || memcmp(a, b, na)) {
            if (bitwise) {
                snprintf(name, sizeof name, "round %d: parameters differ after offloaded steps", round);
                check(name, 0, 0);
            }
            bitwise = 0;
        }
        free(a);
        free(b);
        ck_program_free(pa);
        ck_program_free(pb);
        ck_graph_free(g);
    }
    check("every random model built and compiled", built, 0);
    snprintf(name, sizeof name, "offload_moves_every_later_read_to_a_copy (%d of %d graphs offload)", offloaded, graphs);
    check(name, sound && offloaded >= graphs / 2, 0);
    check("host_ids_live_in_the_host_region: apart while live at once, none in the arena", placed, 0);
    check("offloaded_training_is_bitwise_kept_training: 3 AdamW steps", bitwise, 0);
    check("the measured high-water mark of an offloading program is its planned peak", measured, 0);

    /* the cost model on one list: copies over the link, waits only for what is not done */
    {
        int loss = -1;
        ck_graph *g = random_model(2, 24, &loss);
        decision d = {42, 0};
        ck_program *p = compile(g, loss, &d, CK_OFFLOAD_ACTIVATIONS, err); /* all that is kept goes out */
        const ck_device_speed *cpu = ck_cost_device_find("cpu"), *h100 = ck_cost_device_find("NVIDIA H100 80GB HBM3");
        ck_step_time st;
        ck_plan_step_time(&p->train, p->g, cpu, &st);
        const double link = 2.0 * (double)p->train.offload_bytes / (cpu->link_bw * 0.8);
        check("the table finds a device by a substring of its full name (H100 in NVIDIA H100 80GB HBM3)",
              h100 && !strcmp(h100->name, "H100") && !ck_cost_device_find("no such card"), 0);
        check("a step is its compute plus its stalls, and its copies take their bytes over the link",
              p->train.nslots > 0 && st.step >= st.compute && st.step <= st.compute + st.stalled + st.copies + 1e-12 &&
                  st.copies > 0.999 * link && st.copies < 1.001 * link,
              st.step);
        ck_program_free(p);
        ck_graph_free(g);
    }
    /* the joint search's judgement against the list itself */
    {
        int judged = 0, live_ok = 1, time_ok = 1;
        for (int round = 0; round < 16; round++) {
            int loss = -1;
            ck_graph *g = random_model(1 + (int)(next() % 3), 8 + (int)(next() % 30), &loss);
            if (loss < 0 || ck_autodiff(g, loss, -1)) {
                ck_graph_free(g);
                continue;
            }
            int *nodes = malloc(sizeof(int) * (size_t)g->nn), *cand = malloc(sizeof(int) * (size_t)g->nt);
            int64_t *poff = malloc(sizeof(int64_t) * (size_t)g->nt);
            int *retain = calloc((size_t)g->nt, sizeof(int));
            unsigned char *mark = calloc((size_t)g->nt, 1), *rmark = calloc((size_t)g->nt, 1);
            for (int i = 0; i < g->nn; i++) nodes[i] = i;
            size_t persistent = 0;
            for (int t = 0; t < g->nt; t++) {
                poff[t] = -1;
                if (ck_plan_is_persistent(g->t[t].kind)) {
                    poff[t] = (int64_t)persistent;
                    persistent += (ck_tensor_bytes(&g->t[t]) + 63) / 64 * 64;
                }
                retain[t] = next() % 16 == 0;
            }
            const int ncand = ck_plan_saved_activations(g, cand);
            ck_decide_ctx c = {g, nodes, g->nn, cand, ncand, poff, persistent, retain, ck_backend_cpu(), NULL,
                               1, 1 + (int)(next() % 5), ck_cost_device_find(round % 2 ? "4090" : "cpu"), NULL, 0, NULL, 0};
            ck_evaluator *ev = ck_evaluator_new(&c);
            for (int trial = 0; ev && trial < 6; trial++) {
                for (int k = 0; k < ncand; k++) {
                    const int v = (int)(next() % 3);
                    mark[cand[k]] = (unsigned char)(v == 2 ? CK_OFFLOAD : v);
                    rmark[cand[k]] = v == 1;
                }
                size_t live;
                double time;
                ck_plan pl;
                if (ck_offload_judge(&c, ev, mark, &live, &time) || ck_schedule(&pl, g, nodes, g->nn, rmark)) break;
                ck_step_time st;
                if (ck_offload_schedule(&pl, g, mark, retain, c.prefetch) >= 0 &&
                    !ck_plan_memory(&pl, g, poff, persistent, retain, c.be)) {
                    ck_plan_step_time(&pl, g, c.speed, &st);
                    if (live != pl.live_peak && live_ok) {
                        snprintf(name, sizeof name, "round %d trial %d: judged live peak %zu, the list's %zu", round,
                                 trial, live, pl.live_peak);
                        check(name, 0, 0);
                        live_ok = 0;
                    }
                    if (fabs(time - st.step) > 1e-9 * st.step && time_ok) {
                        snprintf(name, sizeof name, "round %d trial %d: judged step %.9g s, the list's %.9g s", round,
                                 trial, time, st.step);
                        check(name, 0, 0);
                        time_ok = 0;
                    }
                    judged += pl.nslots > 0;
                }
                ck_plan_free(&pl);
            }
            ck_evaluator_free(ev);
            free(nodes), free(cand), free(poff), free(retain), free(mark), free(rmark);
            ck_graph_free(g);
        }
        snprintf(name, sizeof name, "the_joint_search_judges_a_decision_as_its_list: live peak and step (%d lists that offload)", judged);
        check(name, live_ok && time_ok && judged > 20, 0);
    }
    /* auto (a budget with offload) against every fixed choice at the budget */
    {
        int rounds = 0, beaten = 0, over = 0, missed = 0, chose_offload = 0, said = 1, refused = 1, floor_plans = 1;
        for (int round = 0; round < 12; round++) {
            int loss = -1;
            ck_graph *g = random_model(1 + (int)(next() % 3), 12 + (int)(next() % 28), &loss);
            if (loss < 0 || ck_autodiff(g, loss, -1)) {
                ck_graph_free(g);
                continue;
            }
            int *nodes = malloc(sizeof(int) * (size_t)g->nn), *cand = malloc(sizeof(int) * (size_t)g->nt);
            int64_t *poff = malloc(sizeof(int64_t) * (size_t)g->nt);
            int *retain = calloc((size_t)g->nt, sizeof(int));
            unsigned char *mark = calloc((size_t)g->nt, 1), *fixed = calloc((size_t)g->nt, 1);
            for (int i = 0; i < g->nn; i++) nodes[i] = i;
            size_t persistent = 0;
            for (int t = 0; t < g->nt; t++) {
                poff[t] = -1;
                if (ck_plan_is_persistent(g->t[t].kind)) {
                    poff[t] = (int64_t)persistent;
                    persistent += (ck_tensor_bytes(&g->t[t]) + 63) / 64 * 64;
                }
            }
            char why[256] = "";
            const int ncand = ck_plan_saved_activations(g, cand);
            ck_decide_ctx c = {g, nodes, g->nn, cand, ncand, poff, persistent, retain, ck_backend_cpu(), NULL,
                               1, 1 + (int)(next() % 4), ck_cost_device_find(round % 2 ? "4090" : "H100"), why,
                               sizeof why, NULL, 0};
            size_t none_peak, with = 0, without = 0;
            double none_time;
            if (exact_of(&c, mark, &none_peak, &none_time)) goto next_round;
            /* a budget nothing fits: one line naming the smallest peaks, which plan */
            {
                ck_policy tiny = {.kind = CK_POLICY_BUDGET, .budget = 64};
                const char *at = NULL;
                const int r2 = ck_policy_decide(&tiny, &c, mark, err, sizeof err);
                if (r2 == 0 || strchr(err, '\n') || !(at = strstr(err, "smallest peak")) ||
                    sscanf(at, "smallest peak ckrun can plan is %*f MiB (%zu bytes) with offload, %*f MiB (%zu bytes) "
                           "without", &with, &without) != 2 ||
                    with > without || !with) {
                    if (refused) {
                        snprintf(name, sizeof name, "round %d: refusal: %.150s", round, err);
                        check(name, 0, 0);
                    }
                    refused = 0;
                } else {
                    ck_policy at_floor = {.kind = CK_POLICY_BUDGET, .budget = (double)with};
                    size_t fp2;
                    double ft2;
                    if (ck_policy_decide(&at_floor, &c, mark, err, sizeof err) || exact_of(&c, mark, &fp2, &ft2) ||
                        fp2 > with) {
                        if (floor_plans) {
                            snprintf(name, sizeof name, "round %d: a budget of the named %zu bytes: %.150s", round,
                                     with, err);
                            check(name, 0, 0);
                        }
                        floor_plans = 0;
                    }
                }
            }
            if (!with) goto next_round;
            /* a budget between the smallest peak and none's */
            const size_t budget = with + (size_t)((double)(next() % 1000) / 1000.0 * (double)(none_peak - with));
            ck_policy auto_pol = {.kind = CK_POLICY_BUDGET, .budget = (double)budget};
            size_t peak = 0;
            double time = 0;
            const int rc = ck_policy_decide(&auto_pol, &c, mark, err, sizeof err);
            if (rc == 0) {
                if (exact_of(&c, mark, &peak, &time)) goto next_round;
                over += peak > budget;
                said &= why[0] != 0;
                for (int k = 0; k < ncand; k++) chose_offload += mark[cand[k]] == CK_OFFLOAD;
            }
            rounds++;
            /* the fixed choices, each as it is and with all it keeps offloaded */
            const ck_policy fixed_pols[] = {
                {.kind = CK_POLICY_NONE},       {.kind = CK_POLICY_SQRT_N},     {.kind = CK_POLICY_EVERY_N, .n = 1},
                {.kind = CK_POLICY_EVERY_N, .n = 2}, {.kind = CK_POLICY_EVERY_N, .n = 3}, {.kind = CK_POLICY_SELECTIVE},
                {.kind = CK_POLICY_BUDGET, .budget = (double)budget},
            };
            ck_decide_ctx plain = c;
            plain.offload = 0, plain.why = NULL;
            for (size_t f = 0; f < sizeof fixed_pols / sizeof *fixed_pols; f++) {
                ck_policy pol = fixed_pols[f];
                if (pol.kind == CK_POLICY_SELECTIVE) ck_policy_selective_default(pol.ops);
                memset(fixed, 0, (size_t)g->nt);
                char ignore[512];
                if (ck_policy_decide(&pol, &plain, fixed, ignore, sizeof ignore)) continue;
                for (int v = 0; v < 2; v++) {
                    for (int k = 0; v && k < ncand; k++)
                        if (!fixed[cand[k]]) fixed[cand[k]] = CK_OFFLOAD;
                    size_t fp;
                    double ft;
                    if (exact_of(&c, fixed, &fp, &ft) || fp > budget) continue;
                    if (rc) {
                        if (!missed) {
                            snprintf(name, sizeof name, "round %d: fixed choice %zu/%d fits %zu in %zu, auto: %.120s",
                                     round, f, v, fp, budget, err);
                            check(name, 0, 0);
                        }
                        missed++;
                    } else if (ft < time * (1 - 1e-9)) {
                        if (!beaten) {
                            snprintf(name, sizeof name, "round %d: fixed choice %zu/%d %.6g s (peak %zu) beats auto's "
                                     "%.6g s (peak %zu) in %zu", round, f, v, ft, fp, time, peak, budget);
                            check(name, 0, 0);
                        }
                        beaten++;
                    }
                }
            }
        next_round:
            free(nodes), free(cand), free(poff), free(retain), free(mark), free(fixed);
            ck_graph_free(g);
        }
        snprintf(name, sizeof name, "auto_is_never_beaten_by_a_fixed_choice at its budget (%d graphs, %d offloaded "
                 "tensors chosen)", rounds, chose_offload);
        check(name, rounds >= 8 && !beaten && !missed && chose_offload > 0, 0);
        check("auto's plan fits its budget, placed, and says what it chose", !over && said, 0);
        check("a budget nothing fits is refused in one line naming the smallest peak with offload and without",
              refused, 0);
        check("a budget of the smallest peak named with offload plans within it", floor_plans, 0);
    }
    return checks_done();
}
