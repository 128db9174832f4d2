/* ckrun's communicator over MPI (vm/dist/dist.h). Every collective is the
 * non-blocking MPI call (MPI_Iallreduce, MPI_Ibcast, ...) followed by a wait
 * that polls MPI_Test, yielding and then sleeping between polls, so that a
 * wait can be timed, interrupted and given up past its timeout, and so that
 * ranks oversubscribing a few cores leave them to each other rather than
 * spinning. Without MPI (CK_HAVE_MPI undefined) it is one process.
 *
 * Each rank numbers the collectives it enters (the ranks call them in one
 * order, so number k is the same collective everywhere) and announces its
 * arrival at each with one 8-byte non-blocking message to every other rank,
 * on a communicator of their own, and once more when it has waited in one
 * for a while; every 64th announcement it takes in the others' (they wait in
 * MPI's queue meanwhile). A wait that passes the timeout takes in the rest
 * and names the ranks that hold it up, not the one that waited: those whose
 * arrival at its collective it has not seen (they hang before it, or have
 * left), then those that arrived but do not wait in it (busy elsewhere, or
 * stopped, while the collective needs them). */
#define _GNU_SOURCE
#include "dist/dist.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef CK_HAVE_MPI
#include <mpi.h>
#endif

static struct {
    int active;          /* MPI started by ck_dist_init */
    int finalized;
    int rank, size, local_rank, local_size;
    double timeout;      /* seconds */
    long long step;
    double comm_time;    /* seconds waited since the last reset */
    int init_rc;
    char init_err[256];
    int64_t ncoll;       /* collectives entered */
#ifdef CK_HAVE_MPI
    MPI_Comm comm;       /* our duplicate of MPI_COMM_WORLD */
    MPI_Comm local;      /* the ranks on this machine */
    MPI_Comm arrive;     /* the arrival announcements */
    int64_t *seen;       /* per rank: the last collective it announced arriving at */
    int64_t *waiting;    /* per rank: the last collective it announced waiting in */
    struct sent { MPI_Request r; int64_t v; } *sent; /* announcements in flight */
    int nsent, capsent;
    unsigned nannounced;
#endif
} D = {.size = 1, .local_size = 1, .timeout = 300.0};

static pthread_once_t init_once = PTHREAD_ONCE_INIT;

double ck_dist_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* the integer value of environment variable name, or -1 when unset or not a
 * non-negative integer */
static long env_int(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return errno || *end || v < 0 ? -1 : v;
}

/* the number of ranks a launcher announced in the environment, 0 if none */
static long launcher_size(void)
{
    static const char *const sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        long v = env_int(sizes[i]);
        if (v > 0) return v;
    }
    return 0;
}

/* whether a launcher (mpirun, srun, a PMI server) started this process */
static int launched(void)
{
    static const char *const marks[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"};
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++)
        if (getenv(marks[i])) return 1;
    return 0;
}

#ifdef CK_HAVE_MPI
/* at exit (on_exit sees the status): finalize after a clean exit; after a
 * failing one (a script error in a host that exits 1, os.exit(false)), end
 * the whole job, as the other ranks would otherwise wait for this one in
 * their next collective until the timeout */
static void at_exit(int status, void *arg)
{
    (void)arg;
    if (status != 0 && ck_dist_active() && D.size > 1) {
        fflush(stdout);
        fprintf(stderr, "ckrun: rank %d: exiting with status %d while the job runs: ending the job\n", D.rank,
                status);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, status);
        _exit(status); /* not exit: this runs inside exit */
    }
    ck_dist_finalize();
}

/* Keeps the object this code is in mapped until the process ends: a stock
 * lua5.4 unloads ck.so when it closes its state, before exit runs at_exit. */
static void pin_self(void)
{
    Dl_info info;
    if (dladdr((void *)at_exit, &info) && info.dli_fname)
        dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}
#endif

static void init_fail(const char *fmt, const char *arg)
{
    D.init_rc = -1;
    snprintf(D.init_err, sizeof D.init_err, fmt, arg);
}

static void do_init(void)
{
    const char *t = getenv("CK_DIST_TIMEOUT");
    if (t && *t) {
        char *end;
        double v = strtod(t, &end);
        if (end == t || *end || !(v > 0) || v > 1e9) {
            init_fail("CK_DIST_TIMEOUT wants seconds (a number > 0), got '%s'", t);
            return;
        }
        D.timeout = v;
    }
    if (!launched()) return;
#ifdef CK_HAVE_MPI
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        init_fail("MPI_Init failed%s", "");
        return;
    }
    D.active = 1;
    pin_self();
    on_exit(at_exit, NULL);
    MPI_Comm_dup(MPI_COMM_WORLD, &D.comm);
    MPI_Comm_rank(D.comm, &D.rank);
    MPI_Comm_size(D.comm, &D.size);
    MPI_Comm_dup(MPI_COMM_WORLD, &D.arrive);
    D.seen = calloc((size_t)D.size, sizeof *D.seen);
    D.waiting = calloc((size_t)D.size, sizeof *D.waiting);
    if (!D.seen || !D.waiting) {
        init_fail("out of memory%s", "");
        return;
    }
    MPI_Comm_split_type(D.comm, MPI_COMM_TYPE_SHARED, D.rank, MPI_INFO_NULL, &D.local);
    MPI_Comm_rank(D.local, &D.local_rank);
    MPI_Comm_size(D.local, &D.local_size);
    /* a launcher of another MPI starts each process alone: refuse to run
     * the job once per process */
    const long n = launcher_size();
    if (n > 1 && D.size == 1) {
        char num[32];
        snprintf(num, sizeof num, "%ld", n);
        init_fail("launched as one of %s ranks, but MPI started this process alone "
                  "(is mpirun from the MPI ckrun was built with?)", num);
    }
#else
    long n = launcher_size();
    if (n > 1) {
        char num[32];
        snprintf(num, sizeof num, "%ld", n);
        init_fail("launched as one of %s ranks, but this ckrun was built without MPI "
                  "(install libopenmpi-dev and build again)", num);
    }
#endif
}

int ck_dist_init(char *err, size_t errlen)
{
    pthread_once(&init_once, do_init);
    if (D.init_rc && err && errlen) snprintf(err, errlen, "%s", D.init_err);
    return D.init_rc;
}

int ck_dist_active(void) { return D.active && !D.finalized; }
int ck_dist_rank(void) { return D.rank; }
int ck_dist_size(void) { return D.size; }
int ck_dist_local_rank(void) { return D.local_rank; }
int ck_dist_local_size(void) { return D.local_size; }

double ck_dist_timeout(void) { return D.timeout; }

void ck_dist_set_timeout(double seconds)
{
    if (seconds > 0) D.timeout = seconds;
}

void ck_dist_set_step(long long step) { D.step = step; }
long long ck_dist_step(void) { return D.step; }

double ck_dist_comm_time(int reset)
{
    double t = D.comm_time;
    if (reset) D.comm_time = 0;
    return t;
}

void ck_dist_abort(int code)
{
    fflush(stdout);
    fflush(stderr);
#ifdef CK_HAVE_MPI
    if (ck_dist_active()) MPI_Abort(MPI_COMM_WORLD, code);
#endif
    exit(code);
}

void ck_dist_finalize(void)
{
#ifdef CK_HAVE_MPI
    if (!D.active || D.finalized) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (fin) return;
    D.finalized = 1;
    fflush(stdout);
    fflush(stderr);
    for (int i = 0; i < D.nsent; i++) MPI_Request_free(&D.sent[i].r);
    D.nsent = D.capsent = 0;
    free(D.sent);
    D.sent = NULL;
    free(D.seen);
    free(D.waiting);
    D.seen = D.waiting = NULL;
    MPI_Comm_free(&D.arrive);
    MPI_Comm_free(&D.local);
    MPI_Comm_free(&D.comm);
    MPI_Finalize();
#endif
}

#ifdef CK_HAVE_MPI
_Static_assert(sizeof(MPI_Request) <= sizeof(((ck_dist_req *)0)->mpi), "an MPI_Request fits ck_dist_req");

/* the seconds of a wait's pause after k polls that found it unfinished: none
 * at first (a yield), then 20 us doubling up to 1 ms */
static void pause_after(int k)
{
    if (k < 64) {
        sched_yield();
        return;
    }
    int sh = (k - 64) / 8;
    long ns = 20000L << (sh > 6 ? 6 : sh);
    if (ns > 1000000L) ns = 1000000L;
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* takes in the announcements that have come: 2k for an arrival at
 * collective k, 2k + 1 for a wait in it */
static void take_arrivals(void)
{
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, 0, D.arrive, &flag, &st);
        if (!flag) return;
        int64_t v = 0;
        MPI_Recv(&v, 1, MPI_INT64_T, st.MPI_SOURCE, 0, D.arrive, MPI_STATUS_IGNORE);
        int64_t *seen = v & 1 ? D.waiting : D.seen;
        if (v >> 1 > seen[st.MPI_SOURCE]) seen[st.MPI_SOURCE] = v >> 1;
    }
}

/* Sends v to every other rank; every 64th time also forgets the
 * announcements that have left and takes in the others' (which wait in MPI's
 * queue meanwhile: a few bytes each). */
static void announce(int64_t v)
{
    if (D.nsent + D.size > D.capsent || (++D.nannounced & 63) == 0) {
        int keep = 0;
        for (int i = 0; i < D.nsent; i++) {
            int flag = 0;
            MPI_Test(&D.sent[i].r, &flag, MPI_STATUS_IGNORE);
            if (!flag) D.sent[keep++] = D.sent[i];
        }
        D.nsent = keep;
        take_arrivals();
    }
    if (D.nsent + D.size > D.capsent) {
        /* a send's buffer must stay put until it leaves: the pool grows by
         * copies only while none of its own are in flight */
        const int cap = 2 * (D.nsent + D.size);
        struct sent *ns = malloc(sizeof *ns * (size_t)cap);
        if (!ns) return; /* unannounced: a waiter that times out names this rank */
        for (int i = 0; i < D.nsent; i++) MPI_Wait(&D.sent[i].r, MPI_STATUS_IGNORE); /* 8 bytes: they leave at once */
        D.nsent = 0;
        free(D.sent);
        D.sent = ns;
        D.capsent = cap;
    }
    for (int r = 0; r < D.size; r++) {
        if (r == D.rank) continue;
        struct sent *e = &D.sent[D.nsent++];
        e->v = v;
        MPI_Isend(&e->v, 1, MPI_INT64_T, r, 0, D.arrive, &e->r);
    }
}

/* Enters the next collective, announcing it; its number */
static int64_t arrive(void)
{
    const int64_t k = ++D.ncoll;
    announce(2 * k);
    return k;
}

/* The timeout line: the ranks whose arrival at collective k this rank has
 * not seen, and those that arrived but neither wait in it nor have gone on
 * to wait in a later one (busy elsewhere, or stopped), after a moment to
 * take in announcements still on their way; or peer, the rank of a transfer */
static void timeout_line(int64_t k, int peer)
{
    char who[240];
    int n = 0, len = 0;
    if (peer >= 0) {
        fflush(stdout);
        fprintf(stderr, "ckrun: rank %d: no reply from rank %d in a transfer for %g s (step %lld)\n", D.rank, peer,
                D.timeout, D.step);
        return;
    }
    for (int i = 0; i < 50; i++) { /* 50 ms */
        take_arrivals();
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    who[0] = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < D.size; r++) {
            if (r == D.rank) continue;
            const int missing = D.seen[r] < k, busy = !missing && D.waiting[r] < k;
            if (!(pass == 0 ? missing : busy)) continue;
            if (len < (int)sizeof who - 48)
                len += snprintf(who + len, sizeof who - (size_t)len, "%srank %d (%s)", n ? ", " : "", r,
                                missing ? "not arrived" : "arrived, not waiting: busy or stopped");
            else if (len < (int)sizeof who - 5)
                len += snprintf(who + len, sizeof who - (size_t)len, ", ...");
            n++;
        }
    fflush(stdout);
    if (n)
        fprintf(stderr, "ckrun: rank %d: no reply from %s in collective %lld for %g s (step %lld)\n", D.rank, who,
                (long long)k, D.timeout, D.step);
    else
        fprintf(stderr, "ckrun: rank %d: no reply from the other ranks in collective %lld (every rank waits in it) "
                "for %g s (step %lld)\n", D.rank, (long long)k, D.timeout, D.step);
}

/* Waits for r, collective number k (or the transfer with peer): 0 when done,
 * CK_DIST_STOPPED when poll asks; past the timeout, the one line and
 * MPI_Abort. The time waited counts in comm_time. */
static int wait_request(MPI_Request *r, int64_t k, int peer, ck_dist_poll_fn poll, void *ud)
{
    const double t0 = ck_dist_now();
    int rc = 0, told = 0;
    for (int i = 0;; i++) {
        int flag = 0;
        MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (flag) break;
        if (poll && poll(ud)) {
            rc = CK_DIST_STOPPED;
            break;
        }
        const double now = ck_dist_now();
        /* a wait that lasts: the others learn it is here, not busy elsewhere
         * (a short one, the common case, sends nothing) */
        if (!told && peer < 0 && now - t0 > (D.timeout < 0.02 ? D.timeout / 2 : 0.01)) {
            announce(2 * k + 1);
            told = 1;
        }
        if (now - t0 > D.timeout) {
            timeout_line(k, peer);
            ck_dist_abort(1);
        }
        pause_after(i < INT_MAX - 1 ? i : INT_MAX - 1);
    }
    D.comm_time += ck_dist_now() - t0;
    return rc;
}
#endif

int ck_dist_allreduce(float *x, int64_t n, ck_dist_poll_fn poll, void *ud)
{
    if (n < 0 || n > INT_MAX) return CK_DIST_EINVAL;
#ifdef CK_HAVE_MPI
    if (ck_dist_active() && D.size > 1) {
        MPI_Request r;
        const int64_t k = arrive();
        MPI_Iallreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, D.comm, &r);
        return wait_request(&r, k, -1, poll, ud);
    }
#endif
    (void)x, (void)poll, (void)ud;
    return 0;
}

int ck_dist_broadcast(float *x, int64_t n, int root, ck_dist_poll_fn poll, void *ud)
{
    if (n < 0 || n > INT_MAX || root < 0 || root >= D.size) return CK_DIST_EINVAL;
#ifdef CK_HAVE_MPI
    if (ck_dist_active() && D.size > 1) {
        MPI_Request r;
        const int64_t k = arrive();
        MPI_Ibcast(x, (int)n, MPI_FLOAT, root, D.comm, &r);
        return wait_request(&r, k, -1, poll, ud);
    }
#endif
    (void)x, (void)poll, (void)ud;
    return 0;
}

/* the allgather of n values of each elem bytes (dt: their MPI type) */
static int allgather_bytes(const void *x, void *out, int64_t n, size_t elem, int is_i64, ck_dist_poll_fn poll,
                           void *ud)
{
    if (n < 0 || n > INT_MAX) return CK_DIST_EINVAL;
#ifdef CK_HAVE_MPI
    if (ck_dist_active() && D.size > 1) {
        MPI_Request r;
        const MPI_Datatype dt = is_i64 ? MPI_INT64_T : MPI_FLOAT;
        const int64_t k = arrive();
        MPI_Iallgather(x, (int)n, dt, out, (int)n, dt, D.comm, &r);
        return wait_request(&r, k, -1, poll, ud);
    }
#endif
    (void)is_i64, (void)poll, (void)ud;
    if (n) memmove(out, x, (size_t)n * elem);
    return 0;
}

int ck_dist_allgather(const float *x, float *out, int64_t n, ck_dist_poll_fn poll, void *ud)
{
    return allgather_bytes(x, out, n, sizeof(float), 0, poll, ud);
}

int ck_dist_allgather_i64(const int64_t *x, int64_t *out, int64_t n, ck_dist_poll_fn poll, void *ud)
{
    return allgather_bytes(x, out, n, sizeof(int64_t), 1, poll, ud);
}

int ck_dist_reduce_scatter(const float *x, float *out, int64_t n, ck_dist_poll_fn poll, void *ud)
{
    if (n < 0 || n > INT_MAX) return CK_DIST_EINVAL;
#ifdef CK_HAVE_MPI
    if (ck_dist_active() && D.size > 1) {
        MPI_Request r;
        const int64_t k = arrive();
        MPI_Ireduce_scatter_block(x, out, (int)n, MPI_FLOAT, MPI_SUM, D.comm, &r);
        return wait_request(&r, k, -1, poll, ud);
    }
#endif
    (void)poll, (void)ud;
    if (n) memmove(out, x, (size_t)n * sizeof(float));
    return 0;
}

int ck_dist_barrier(ck_dist_poll_fn poll, void *ud)
{
#ifdef CK_HAVE_MPI
    if (ck_dist_active() && D.size > 1) {
        MPI_Request r;
        const int64_t k = arrive();
        MPI_Ibarrier(D.comm, &r);
        return wait_request(&r, k, -1, poll, ud);
    }
#endif
    (void)poll, (void)ud;
    return 0;
}

/* the tag of ck_dist_send's messages: the collectives use none */
#define TAG_DATA 1

int ck_dist_send(const float *x, int64_t n, int dest, ck_dist_poll_fn poll, void *ud)
{
    if (n < 0 || n > INT_MAX || dest < 0 || dest >= D.size || dest == D.rank) return CK_DIST_EINVAL;
#ifdef CK_HAVE_MPI
    if (ck_dist_active()) {
        MPI_Request r;
        MPI_Isend(x, (int)n, MPI_FLOAT, dest, TAG_DATA, D.comm, &r);
        return wait_request(&r, 0, dest, poll, ud);
    }
#endif
    (void)x, (void)poll, (void)ud;
    return CK_DIST_EINVAL;
}

int ck_dist_recv(float *x, int64_t n, int src, ck_dist_poll_fn poll, void *ud)
{
    if (n < 0 || n > INT_MAX || src < 0 || src >= D.size || src == D.rank) return CK_DIST_EINVAL;
#ifdef CK_HAVE_MPI
    if (ck_dist_active()) {
        MPI_Request r;
        MPI_Irecv(x, (int)n, MPI_FLOAT, src, TAG_DATA, D.comm, &r);
        return wait_request(&r, 0, src, poll, ud);
    }
#endif
    (void)x, (void)poll, (void)ud;
    return CK_DIST_EINVAL;
}

int ck_dist_iallreduce(float *x, int64_t n, ck_dist_req *req)
{
    memset(req, 0, sizeof *req);
    if (n < 0 || n > INT_MAX) return CK_DIST_EINVAL;
    req->started = ck_dist_now();
    req->active = 1;
#ifdef CK_HAVE_MPI
    if (ck_dist_active() && D.size > 1) {
        MPI_Request *r = (MPI_Request *)(void *)req->mpi;
        req->k = arrive();
        MPI_Iallreduce(MPI_IN_PLACE, x, (int)n, MPI_FLOAT, MPI_SUM, D.comm, r);
        return 0;
    }
#endif
    (void)x;
    req->done = 1;
    return 0;
}

int ck_dist_test(ck_dist_req *req)
{
    if (!req->active || req->done) return 1;
#ifdef CK_HAVE_MPI
    int flag = 0;
    MPI_Test((MPI_Request *)(void *)req->mpi, &flag, MPI_STATUS_IGNORE);
    req->done = flag != 0;
#endif
    return req->done;
}

int ck_dist_wait(ck_dist_req *req, ck_dist_poll_fn poll, void *ud)
{
    if (!req->active) return 0;
    int rc = 0;
#ifdef CK_HAVE_MPI
    if (!req->done) rc = wait_request((MPI_Request *)(void *)req->mpi, req->k, -1, poll, ud);
#else
    (void)poll, (void)ud;
#endif
    if (rc == 0) {
        req->active = 0;
        req->done = 1;
    }
    return rc;
}
