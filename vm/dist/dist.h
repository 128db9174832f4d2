/* ckrun's communicator: the ranks of one job launched by mpirun (or srun
 * through MPI), and the collectives they run on float32 buffers in host
 * memory. ckrun opens no sockets of its own: everything here goes through
 * MPI. A build without MPI (CK_HAVE_MPI undefined) is one process: world size
 * 1, rank 0, and every collective is an identity.
 *
 * One communicator per process (MPI_COMM_WORLD), shared by every VM the
 * process opens; only one thread calls into it at a time (MPI_THREAD_FUNNELED:
 * the thread that initialized it).
 *
 * Every wait polls (MPI_Test with short sleeps) and has a timeout: a rank
 * that waits longer than ck_dist_timeout() seconds for the others prints
 * "ckrun: rank R: no reply from rank H (not arrived) in collective C for S s
 * (step K)", H the ranks that have not entered the collective it waits in,
 * or "rank H (arrived, not waiting: busy or stopped)" for one that entered it
 * but neither waits in it nor progresses it (each rank announces to the
 * others its arrival at each collective and its waiting in one), and ends
 * the whole job (MPI_Abort), so a rank that dies or hangs never leaves the
 * others hanging silently, and the line names it. */
#ifndef CK_DIST_H
#define CK_DIST_H

#include <stddef.h>
#include <stdint.h>

/* Starts MPI when a launcher started this process (OMPI_COMM_WORLD_SIZE,
 * PMIX_RANK, PMI_RANK or SLURM_PROCID in the environment), once per process;
 * later calls return the first call's result. Registers MPI_Finalize at exit.
 * Call it before any thread of ours starts and before the script runs (the
 * CLI does; the Lua bindings call it on first use). 0, or -1 with a message
 * in err: MPI did not start, or a launcher asked for several ranks of a build
 * without MPI (which would run the job several times over, unaware). */
int ck_dist_init(char *err, size_t errlen);
/* 1 when MPI runs this process (ck_dist_init started it), else 0 */
int ck_dist_active(void);
/* This process's rank in the job, the job's number of ranks, and its rank and
 * number of ranks on this machine (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED));
 * 0, 1, 0, 1 outside MPI. A CUDA run takes device ck_dist_local_rank(). */
int ck_dist_rank(void);
int ck_dist_size(void);
int ck_dist_local_rank(void);
int ck_dist_local_size(void);

/* Seconds a rank waits in one collective before it ends the job: 300, or
 * CK_DIST_TIMEOUT from the environment (read by ck_dist_init), or what
 * ck_dist_set_timeout set last (> 0). */
double ck_dist_timeout(void);
void ck_dist_set_timeout(double seconds);
/* The step the timeout line names (a counter the script sets; 0 at start) */
void ck_dist_set_step(long long step);
long long ck_dist_step(void);
/* Seconds spent waiting in collectives since the last reset (reset: 1
 * starts the count again from zero) */
double ck_dist_comm_time(int reset);

/* Called between polls of a wait; nonzero stops the wait (an interrupt). */
typedef int (*ck_dist_poll_fn)(void *ud);

/* What the collectives return: 0 when done; CK_DIST_STOPPED when poll asked
 * to stop: the collective is left unfinished on this rank, which must then
 * end the job (ck_dist_abort), as the other ranks cannot finish it either;
 * CK_DIST_EINVAL for a count MPI cannot carry (over INT_MAX values), with
 * nothing sent. An MPI failure ends the job (MPI's default error handler),
 * and a wait past the timeout ends it too. poll may be NULL. */
#define CK_DIST_STOPPED 1
#define CK_DIST_EINVAL (-1)

/* x[0..n) becomes the elementwise sum of every rank's x (in place) */
int ck_dist_allreduce(float *x, int64_t n, ck_dist_poll_fn poll, void *ud);
/* x[0..n) becomes root's x on every rank */
int ck_dist_broadcast(float *x, int64_t n, int root, ck_dist_poll_fn poll, void *ud);
/* out[r*n .. (r+1)*n) becomes rank r's x[0..n), for every rank r; out holds
 * n * ck_dist_size() values and does not overlap x */
int ck_dist_allgather(const float *x, float *out, int64_t n, ck_dist_poll_fn poll, void *ud);
/* The same for int64 values (counts, sizes: what ranks compare before a
 * collective) */
int ck_dist_allgather_i64(const int64_t *x, int64_t *out, int64_t n, ck_dist_poll_fn poll, void *ud);
/* out[0..n) becomes the sum over ranks of their x[rank*n .. (rank+1)*n): x
 * holds n * ck_dist_size() values, and out does not overlap it */
int ck_dist_reduce_scatter(const float *x, float *out, int64_t n, ck_dist_poll_fn poll, void *ud);
/* returns when every rank has called it */
int ck_dist_barrier(ck_dist_poll_fn poll, void *ud);
/* Point to point: x[0..n) to rank dest, and into x[0..n) from rank src. The
 * messages one rank sends another arrive in the order sent, each matching the
 * receiver's next ck_dist_recv from that rank, which must ask for n values
 * as sent. CK_DIST_EINVAL for a rank outside the job or this rank itself. */
int ck_dist_send(const float *x, int64_t n, int dest, ck_dist_poll_fn poll, void *ud);
int ck_dist_recv(float *x, int64_t n, int src, ck_dist_poll_fn poll, void *ud);

/* A non-blocking allreduce (sum, in place) that a caller starts, then
 * progresses with ck_dist_test between other work, and finishes with
 * ck_dist_wait. x must stay untouched until it is done. */
typedef struct ck_dist_req {
    int active;       /* started and not yet waited for */
    int done;         /* finished (ck_dist_test saw it) */
    uint64_t mpi[2];  /* the MPI_Request, opaque here */
    double started;   /* when it started (seconds, monotonic) */
    int64_t k;        /* its number among the collectives this rank entered */
} ck_dist_req;

/* Starts the sum of x[0..n) over ranks into x. 0, or CK_DIST_EINVAL (n over
 * INT_MAX). With one rank it is done at once. */
int ck_dist_iallreduce(float *x, int64_t n, ck_dist_req *req);
/* 1 when the request is done (progressing MPI meanwhile), else 0; never
 * blocks. A request not active counts as done. */
int ck_dist_test(ck_dist_req *req);
/* Waits for the request (polling, with the timeout); its wait time counts in
 * ck_dist_comm_time. 0 or CK_DIST_STOPPED as above; the request is inactive
 * after a 0. */
int ck_dist_wait(ck_dist_req *req, ck_dist_poll_fn poll, void *ud);

/* Ends the whole job with exit status code (MPI_Abort), after flushing
 * stdout and stderr; outside MPI, exit(code). Never returns. */
void ck_dist_abort(int code) __attribute__((noreturn));
/* Finalizes MPI when this process started it (safe to call more than once).
 * ck_dist_init also registers an exit handler: after exit(0) it finalizes;
 * after a non-zero exit of one rank of several it prints "ckrun: rank R:
 * exiting with status S ..." and ends the whole job (MPI_Abort), so that a
 * host that exits on an error never leaves the other ranks waiting. */
void ck_dist_finalize(void);

/* Monotonic seconds (the clock the timeout and the comm time use) */
double ck_dist_now(void);

#endif
