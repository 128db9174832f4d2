/* The emulator's NCCL, from NCCL's documented semantics (the stream events
 * ops/cuda/comm.cu orders its collectives by are stream_emu.h's). Emulated
 * device memory is host memory and a collective runs when it is queued, so
 * it is an MPI collective on a communicator duplicated from MPI_COMM_WORLD,
 * run at the point of the stream where it was queued. The ranks are the processes of
 * an MPI job (mpirun), which must have started MPI before ncclCommInitRank;
 * a process outside one can make a communicator of one rank (its collectives
 * copy).
 *
 * For tests: with CK_NCCL_EMU_LOG naming a file, each collective appends one
 * line to it ("rank R allreduce N" or "rank R broadcast N root Q"), and
 * ncclCommAbort "rank R abort 0";
 * CK_NCCL_EMU_HANG=R makes rank R's collectives never complete (the events
 * recorded after one stay pending: a host that polls them waits for ever). */
#ifndef CK_NCCL_EMU_H
#define CK_NCCL_EMU_H

#include "cuda_emu.h"

/* events: stream_emu.h */

/* ---- NCCL ---- */

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;
typedef struct ck_emu_nccl *ncclComm_t;
typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef enum { ncclFloat32 = 7, ncclFloat = 7 } ncclDataType_t;

const char *ncclGetErrorString(ncclResult_t r);
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async);
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t s);

#endif
