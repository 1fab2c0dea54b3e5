// Stand-in NCCL (libnccl.so.2): real symbol names and signatures for one process playing every
// rank it is given. Collectives copy send to receive buffers (count x datatype size) and return.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Real CUDA/NCCL entry points begin with `push %rbp` (built with frame pointers); leaf functions
// here would not, and a first instruction uprobes cannot emulate costs an extra trap per hit.
// Using the frame address forces the same prologue.
#define REAL_PROLOGUE __asm__ __volatile__("" ::"r"(__builtin_frame_address(0)))

typedef int ncclResult_t;  // ncclSuccess = 0, ncclInvalidArgument = 4
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct ncclComm { int nranks, rank; } *ncclComm_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *cudaStream_t;

#define ncclSuccess 0
#define ncclInvalidArgument 4

static size_t type_size(ncclDataType_t t) {
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return t >= 0 && t < 12 ? sizes[t] : 0;
}

// Not NCCL's: the network transport the collectives drive, when a test sets one
// (tests/rdma/standin/collective_net.c: RDMA work requests on the stand-in libibverbs).
static void (*net)(size_t bytes);
void standinNcclSetNet(void (*transport)(size_t bytes)) { net = transport; }

static ncclResult_t copy(const void *s, void *r, size_t count, ncclDataType_t t) {
    size_t size = type_size(t);
    if (!size)
        return ncclInvalidArgument;
    if (net)
        net(count * size);
    if (s != r && count)
        memmove(r, s, count * size);
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) { memset(id, 7, sizeof(*id)); return ncclSuccess; }

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    (void)id;
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    *comm = malloc(sizeof(**comm));
    (*comm)->nranks = nranks;
    (*comm)->rank = rank;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { free(comm); return ncclSuccess; }
ncclResult_t ncclCommUserRank(ncclComm_t comm, int *rank) { *rank = comm->rank; return ncclSuccess; }
ncclResult_t ncclCommCount(ncclComm_t comm, int *count) { *count = comm->nranks; return ncclSuccess; }
ncclResult_t ncclGroupStart(void) { REAL_PROLOGUE; return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { REAL_PROLOGUE; return ncclSuccess; }

ncclResult_t ncclAllReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)op; (void)comm; (void)stream;
    return copy(s, r, count, t);
}

ncclResult_t ncclBroadcast(const void *s, void *r, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)root; (void)comm; (void)stream;
    return copy(s, r, count, t);
}

ncclResult_t ncclReduce(const void *s, void *r, size_t count, ncclDataType_t t, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
    (void)op; (void)root; (void)comm; (void)stream;
    return copy(s, r, count, t);
}

ncclResult_t ncclAllGather(const void *s, void *r, size_t sendcount, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)stream;
    size_t size = type_size(t);
    if (!size)
        return ncclInvalidArgument;
    memmove((char *)r + (size_t)comm->rank * sendcount * size, s, sendcount * size);
    return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void *s, void *r, size_t recvcount, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
    (void)op; (void)stream;
    size_t size = type_size(t);
    if (!size)
        return ncclInvalidArgument;
    memmove(r, (const char *)s + (size_t)comm->rank * recvcount * size, recvcount * size);
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *s, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) { REAL_PROLOGUE;
    (void)s; (void)count; (void)peer; (void)comm; (void)stream;
    return type_size(t) ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclRecv(void *r, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t stream) { REAL_PROLOGUE;
    (void)r; (void)count; (void)peer; (void)comm; (void)stream;
    return type_size(t) ? ncclSuccess : ncclInvalidArgument;
}
