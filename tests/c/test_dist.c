/* vm/dist's C interface: alone (ctest) the one-process communicator, whose
 * collectives are identities; under `mpirun -np N` (tests/sh/test_mpi.sh) the
 * values every collective must give across ranks, non-blocking allreduces
 * progressed by ck_dist_test while other work runs and waited for out of
 * order, the wait time, point-to-point messages, and a wait stopped by its
 * poll. With TEST_DIST_BUSY set, the last rank starts an allreduce and then
 * works for a minute without progressing it, while the others wait. Every rank prints
 * "rank R: N passed, M failed"; under MPI the last check ends the job with
 * status 3 from rank 0 (a stopped wait must end the job). */
#include "dist/dist.h"

#include "named_check.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int R, W;

static double sum_ranks(void) { return (double)W * (W - 1) / 2; }

static int stop_after_quarter_second(void *ud)
{
    return ck_dist_now() - *(double *)ud > 0.25;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

int main(void)
{
    char err[300];
    check(ck_dist_init(err, sizeof err) == 0, "ck_dist_init", "%s", err);
    check(ck_dist_init(err, sizeof err) == 0, "ck_dist_init a second time", "%s", err);
    R = ck_dist_rank();
    W = ck_dist_size();
    printf("rank %d of %d (local %d of %d), MPI %s\n", R, W, ck_dist_local_rank(), ck_dist_local_size(),
           ck_dist_active() ? "on" : "off");
    check(W >= 1 && R >= 0 && R < W, "rank within the world", "rank %d of %d", R, W);
    check(ck_dist_active() || W == 1, "without MPI, one rank", "%d", W);
    check(ck_dist_local_rank() < ck_dist_local_size() && ck_dist_local_size() <= W, "local rank", "%d of %d",
          ck_dist_local_rank(), ck_dist_local_size());

    if (getenv("TEST_DIST_BUSY") && W > 1) {
        /* the last rank starts an allreduce, then works past the others'
         * timeout without progressing it: the line rank 0 prints names it
         * as arrived and busy (tests/sh/test_mpi.sh) */
        float v[4096] = {0};
        ck_dist_req req;
        ck_dist_iallreduce(v, 4096, &req);
        ck_dist_set_step(5);
        for (const double t0 = ck_dist_now(); R == W - 1 && ck_dist_now() - t0 < 60;) sleep_s(0.1);
        ck_dist_wait(&req, NULL, NULL);
        return 1; /* not reached: the wait times out */
    }

    const char *env = getenv("CK_DIST_TIMEOUT");
    const double t_want = env ? atof(env) : 300;
    check(ck_dist_timeout() == t_want, "the timeout: CK_DIST_TIMEOUT or 300 s", "%g", ck_dist_timeout());
    ck_dist_set_timeout(30);
    ck_dist_set_timeout(-1);
    check(ck_dist_timeout() == 30, "set_timeout keeps the last positive value", "%g", ck_dist_timeout());
    ck_dist_set_step(9);
    check(ck_dist_step() == 9, "the step", "%lld", ck_dist_step());

    /* blocking collectives */
    enum { N = 1000 };
    float *x = malloc(sizeof(float) * N * (size_t)W), *y = malloc(sizeof(float) * N * (size_t)W);
    for (int i = 0; i < N; i++) x[i] = (float)(R + 1) * (float)i;
    int rc = ck_dist_allreduce(x, N, NULL, NULL), bad = 0;
    for (int i = 0; i < N; i++) bad += x[i] != (float)(W * (W + 1) / 2) * (float)i;
    check(rc == 0 && !bad, "allreduce", "rc %d, %d wrong", rc, bad);

    for (int i = 0; i < N; i++) x[i] = (float)(R * N + i);
    rc = ck_dist_broadcast(x, N, W - 1, NULL, NULL);
    bad = 0;
    for (int i = 0; i < N; i++) bad += x[i] != (float)((W - 1) * N + i);
    check(rc == 0 && !bad, "broadcast from the last rank", "rc %d, %d wrong", rc, bad);
    check(ck_dist_broadcast(x, N, W, NULL, NULL) == CK_DIST_EINVAL, "broadcast from a rank that is not", "");

    for (int i = 0; i < N; i++) x[i] = (float)(R * N + i);
    rc = ck_dist_allgather(x, y, N, NULL, NULL);
    bad = 0;
    for (int i = 0; i < N * W; i++) bad += y[i] != (float)i;
    check(rc == 0 && !bad, "allgather in rank order", "rc %d, %d wrong", rc, bad);

    int64_t mine[2] = {R, -(int64_t)R * 3000000000LL}, all[2 * 64];
    if (W <= 64) {
        rc = ck_dist_allgather_i64(mine, all, 2, NULL, NULL);
        bad = 0;
        for (int r = 0; r < W; r++) bad += all[2 * r] != r || all[2 * r + 1] != -(int64_t)r * 3000000000LL;
        check(rc == 0 && !bad, "allgather of int64 past 32 bits", "rc %d, %d wrong", rc, bad);
    }

    for (int i = 0; i < N * W; i++) x[i] = (float)(R + i);
    rc = ck_dist_reduce_scatter(x, y, N, NULL, NULL);
    bad = 0;
    for (int i = 0; i < N; i++) bad += y[i] != (float)(sum_ranks() + (double)W * (R * N + i));
    check(rc == 0 && !bad, "reduce_scatter: this rank's block of the sum", "rc %d, %d wrong", rc, bad);
    check(ck_dist_barrier(NULL, NULL) == 0, "barrier", "");
    check(ck_dist_allreduce(NULL, (int64_t)INT_MAX + 1, NULL, NULL) == CK_DIST_EINVAL &&
              ck_dist_allgather(NULL, NULL, -1, NULL, NULL) == CK_DIST_EINVAL,
          "counts MPI cannot carry are refused before anything is sent", "");

    /* two non-blocking allreduces in flight (two buckets), progressed while
     * other work runs, waited for in the other order */
    enum { M = 1 << 18 };
    float *a = malloc(sizeof(float) * M), *b = malloc(sizeof(float) * M);
    for (int i = 0; i < M; i++) {
        a[i] = (float)(R + 1);
        b[i] = (float)(i % 7) * (float)(R + 1);
    }
    ck_dist_req ra, rb;
    check(ck_dist_iallreduce(a, M, &ra) == 0 && ck_dist_iallreduce(b, M, &rb) == 0, "two iallreduces start", "");
    int polls = 0;
    volatile double work = 0;
    while (!ck_dist_test(&rb) && polls < 1000000) {
        for (int k = 0; k < 1000; k++) work += k; /* the ops between which a run progresses it */
        polls++;
    }
    (void)ck_dist_comm_time(1);
    rc = ck_dist_wait(&rb, NULL, NULL) | ck_dist_wait(&ra, NULL, NULL);
    bad = 0;
    for (int i = 0; i < M; i++)
        bad += a[i] != (float)(W * (W + 1) / 2) || b[i] != (float)(i % 7) * (float)(W * (W + 1) / 2);
    check(rc == 0 && !bad, "iallreduce: both sums, tested while working and waited out of order", "rc %d, %d wrong",
          rc, bad);
    check(!ra.active && !rb.active && ck_dist_test(&ra) && ck_dist_wait(&ra, NULL, NULL) == 0,
          "a finished request is inactive, and testing or waiting it again is done at once", "");
    check(ck_dist_iallreduce(NULL, -5, &ra) == CK_DIST_EINVAL && !ra.active, "iallreduce of a bad count", "");

    /* the wait time: rank 0 waits for the last rank, which comes 0.3 s late */
    (void)ck_dist_comm_time(1);
    if (W > 1 && R == W - 1) sleep_s(0.3);
    const double t0 = ck_dist_now();
    ck_dist_barrier(NULL, NULL);
    const double waited = ck_dist_now() - t0, ct = ck_dist_comm_time(1);
    if (W > 1 && R == 0)
        check(waited >= 0.25 && ct >= 0.25 && ct <= waited + 0.01, "comm_time counts the barrier's wait",
              "waited %.3f s, comm_time %.3f s", waited, ct);
    check(ck_dist_comm_time(0) == 0, "comm_time starts again from zero after a reset", "%g", ck_dist_comm_time(0));

    /* point to point: every other rank sends rank 0 two messages, which
     * arrive in the order sent; a rank cannot send itself anything */
    float msg[3];
    check(ck_dist_send(msg, 3, R, NULL, NULL) == CK_DIST_EINVAL && ck_dist_recv(msg, 3, R, NULL, NULL) == CK_DIST_EINVAL
              && ck_dist_send(msg, 3, W, NULL, NULL) == CK_DIST_EINVAL,
          "send and recv refuse this rank and ranks outside the job", "");
    if (R > 0) {
        for (int m = 0; m < 2; m++) {
            for (int i = 0; i < 3; i++) msg[i] = (float)(100 * R + 10 * m + i);
            rc = ck_dist_send(msg, 3, 0, NULL, NULL);
            check(rc == 0, "send to rank 0", "rc %d", rc);
        }
    } else {
        bad = 0;
        for (int r = W - 1; r >= 1; r--) /* the ranks in another order than they send */
            for (int m = 0; m < 2; m++) {
                rc = ck_dist_recv(msg, 3, r, NULL, NULL);
                for (int i = 0; i < 3; i++) bad += rc != 0 || msg[i] != (float)(100 * r + 10 * m + i);
            }
        check(bad == 0, "recv: each rank's messages, in the order sent", "%d wrong", bad);
    }

    free(x), free(y), free(a), free(b);
    if (W == 1) {
        printf("rank %d: %d passed, %d failed\n", R, npass, nfail);
        return nfail != 0;
    }
    /* a wait its poll stops: rank 0 gives up on the barrier after 0.25 s
     * while the others are 5 s late, then ends the job (status 3) */
    if (R == 0) {
        const double start = ck_dist_now();
        rc = ck_dist_barrier(stop_after_quarter_second, (void *)&start);
        const double took = ck_dist_now() - start;
        check(rc == CK_DIST_STOPPED && took < 2, "a poll stops a wait", "rc %d after %.3f s", rc, took);
        printf("rank %d: %d passed, %d failed\n", R, npass, nfail);
        ck_dist_abort(nfail ? 1 : 3);
    }
    printf("rank %d: %d passed, %d failed\n", R, npass, nfail);
    fflush(stdout);
    sleep_s(5);
    ck_dist_barrier(NULL, NULL);
    return 1; /* not reached: rank 0 ends the job first */
}
