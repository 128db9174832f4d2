/* The emulator's NCCL over MPI, and its stream events (nccl_emu.h). */
#include "nccl_emu.h"

/* MPI's C API only: its C++ bindings would need a library of their own */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* A collective that never completes (CK_NCCL_EMU_HANG): from then on every
 * event recorded stays pending, as behind a peer that never joins
 * (stream_emu.cpp's ck_emu_events_hang). */
static int &hung = ck_emu_events_hang;

/* ---- NCCL */

struct ck_emu_nccl {
    MPI_Comm comm;
    int rank, nranks;
};

static const char MAGIC[] = "ck-emu-nccl";

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

static int mpi_running(void)
{
    int on = 0, off = 0;
    MPI_Initialized(&on);
    MPI_Finalized(&off);
    return on && !off;
}

/* a new id: what the real one is to its users, bytes that only its maker's
 * communicator will accept; here the maker's pid and clock */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (!id) return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    long long v[3] = {(long long)getpid(), (long long)t.tv_sec, (long long)t.tv_nsec};
    memcpy(id->internal, MAGIC, sizeof MAGIC);
    memcpy(id->internal + 16, v, sizeof v);
    return ncclSuccess;
}

static uint64_t id_hash(const ncclUniqueId *id)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) h = (h ^ (unsigned char)id->internal[i]) * 1099511628211ull;
    return h;
}

/* Collective over the ranks of the MPI job: each passes its rank and the
 * same id (made by one of them); NCCL's rank r is the communicator's rank r. */
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
    *comm = NULL;
    if (memcmp(id.internal, MAGIC, sizeof MAGIC)) return ncclInvalidArgument; /* not an id ncclGetUniqueId made */
    if (!mpi_running()) {
        /* a process outside an MPI job: a world of one, whose collectives copy */
        if (nranks != 1) return ncclSystemError;
        *comm = new ck_emu_nccl{MPI_COMM_NULL, 0, 1};
        return ncclSuccess;
    }
    int world = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (world != nranks) return ncclInvalidUsage; /* the emulator's communicators span the whole job */
    /* every rank must hold the same id, and each rank be taken once */
    const uint64_t h = id_hash(&id);
    uint64_t lo = 0, hi = 0;
    MPI_Allreduce(&h, &lo, 1, MPI_UINT64_T, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &hi, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    long long bit = 1ll << (rank % 62), seen = 0;
    MPI_Allreduce(&bit, &seen, 1, MPI_LONG_LONG, MPI_BOR, MPI_COMM_WORLD);
    if (lo != hi) return ncclInvalidArgument;
    if (nranks <= 62 && seen != (1ll << nranks) - 1) return ncclInvalidUsage;
    ck_emu_nccl *c = new ck_emu_nccl{MPI_COMM_NULL, rank, nranks};
    if (MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &c->comm) != MPI_SUCCESS) {
        delete c;
        return ncclSystemError;
    }
    *comm = c;
    return ncclSuccess;
}

static void log_call(const ncclComm_t comm, const char *what, size_t count, int root)
{
    const char *path = getenv("CK_NCCL_EMU_LOG");
    if (!path || !*path) return;
    char line[128];
    int n = root < 0 ? snprintf(line, sizeof line, "rank %d %s %zu\n", comm->rank, what, count)
                     : snprintf(line, sizeof line, "rank %d %s %zu root %d\n", comm->rank, what, count, root);
    const int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    if (write(fd, line, (size_t)n) != n) perror(path);
    close(fd);
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm) return ncclInvalidArgument;
    if (comm->comm != MPI_COMM_NULL && mpi_running()) MPI_Comm_free(&comm->comm);
    delete comm;
    return ncclSuccess;
}

/* nothing of ours is ever left in flight here: the same as destroy */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    log_call(comm, "abort", 0, -1);
    return ncclCommDestroy(comm);
}

/* a failed MPI call ends the job (MPI's default handler): none is pending */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async)
{
    if (!comm || !async) return ncclInvalidArgument;
    *async = ncclSuccess;
    return ncclSuccess;
}

/* CK_NCCL_EMU_HANG=R: rank R's collectives are queued and never run (its
 * peers never join, as far as it can tell); a stream's wait on one returns,
 * since queued ops run at once here, and a host that polls the events sees
 * them pending for ever */
static int hangs_here(const ncclComm_t comm)
{
    const char *h = getenv("CK_NCCL_EMU_HANG");
    if (h && *h && atoi(h) == comm->rank) hung = 1;
    return hung;
}

/* MPI counts are ints: long buffers go in pieces */
static const size_t PIECE = (size_t)1 << 30;

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t)
{
    if (!comm || !recv || (count && !send)) return ncclInvalidArgument;
    if (type != ncclFloat32 || op != ncclSum) return ncclInvalidArgument; /* all ckrun asks for */
    log_call(comm, "allreduce", count, -1);
    if (hangs_here(comm)) return ncclSuccess;
    if (comm->comm == MPI_COMM_NULL) {
        if (send != recv) memmove(recv, send, count * sizeof(float));
        return ncclSuccess;
    }
    for (size_t at = 0; at < count; at += PIECE) {
        const int n = (int)(count - at < PIECE ? count - at : PIECE);
        float *r = (float *)recv + at;
        const float *s = (const float *)send + at;
        if (MPI_Allreduce(s == r ? MPI_IN_PLACE : s, r, n, MPI_FLOAT, MPI_SUM, comm->comm) != MPI_SUCCESS)
            return ncclSystemError;
    }
    return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root,
                           ncclComm_t comm, cudaStream_t)
{
    if (!comm || !recv || root < 0 || root >= comm->nranks) return ncclInvalidArgument;
    if (type != ncclFloat32) return ncclInvalidArgument;
    if (comm->rank == root && send != recv) memmove(recv, send, count * sizeof(float));
    log_call(comm, "broadcast", count, root);
    if (hangs_here(comm)) return ncclSuccess;
    if (comm->comm == MPI_COMM_NULL) return ncclSuccess;
    for (size_t at = 0; at < count; at += PIECE) {
        const int n = (int)(count - at < PIECE ? count - at : PIECE);
        if (MPI_Bcast((float *)recv + at, n, MPI_FLOAT, root, comm->comm) != MPI_SUCCESS) return ncclSystemError;
    }
    return ncclSuccess;
}
