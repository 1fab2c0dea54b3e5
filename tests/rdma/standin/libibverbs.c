// Stand-in libibverbs (libibverbs.so.1): the real exported names, symbol versions, signatures and
// public struct layouts (infiniband/verbs.h ABI, x86-64), over two pretend devices, mlx5_0 and
// mlx5_1. Nothing reaches hardware: objects are heap blocks, queue pair numbers count up, and
// ibv_modify_qp accepts the transitions of the IBTA state diagram (others: EINVAL), keeping
// qp->state as libibverbs does. The 1.0 compatibility entry points exist, as in the real library,
// and fail: a probe that hooked them instead of the defaults would see nothing.
//
// A provider (the data path, "Provider" below): ibv_open_device fills the context's ops table with
// its post_send, post_recv and poll_cq — file-local functions, no exported symbol, as a real
// provider's are — which verbs.h's inline ibv_post_send, ibv_post_recv and ibv_poll_cq call. A
// work request "travels" to the peer queue pair (the dest_qp_num of its RTR) at once and completes
// STANDIN_COMPLETION_DELAY_US later (environment, read at ibv_open_device): ibv_poll_cq returns
// only completions that old. A SEND, SEND_WITH_IMM or RDMA_WRITE_WITH_IMM takes the peer's oldest
// posted receive and completes it on the peer's receive CQ; with none posted it fails with
// IBV_WC_RNR_RETRY_EXC_ERR; with no peer queue pair, every work request fails with
// IBV_WC_RETRY_EXC_ERR. One thread at a time: the provider takes no locks.
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// ---- the public ABI: members in verbs.h order, only what this library or its callers touch named
struct ibv_device {
    void *_ops[2];              // struct _ibv_device_ops: two function pointers
    int node_type;              // enum ibv_node_type: 1 = IBV_NODE_CA
    int transport_type;         // enum ibv_transport_type: 0 = IBV_TRANSPORT_IB
    char name[64];              // IBV_SYSFS_NAME_MAX
    char dev_name[64];
    char dev_path[256];         // IBV_SYSFS_PATH_MAX
    char ibdev_path[256];
};

struct ibv_context {
    struct ibv_device *device;
    void *ops[32];              // struct ibv_context_ops: 32 entry points of the provider (none here)
    int cmd_fd;
    int async_fd;
    int num_comp_vectors;
    pthread_mutex_t mutex;
    void *abi_compat;
};

struct ibv_pd {
    struct ibv_context *context;
    uint32_t handle;
};

struct ibv_mr {
    struct ibv_context *context;
    struct ibv_pd *pd;
    void *addr;
    size_t length;
    uint32_t handle;
    uint32_t lkey;
    uint32_t rkey;
};

struct ibv_cq {
    struct ibv_context *context;
    void *channel;              // struct ibv_comp_channel *
    void *cq_context;
    uint32_t handle;
    int cqe;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    uint32_t comp_events_completed;
    uint32_t async_events_completed;
};

struct ibv_qp_cap {
    uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data;
};

struct ibv_qp {
    struct ibv_context *context;
    void *qp_context;
    struct ibv_pd *pd;
    struct ibv_cq *send_cq;
    struct ibv_cq *recv_cq;
    void *srq;                  // struct ibv_srq *
    uint32_t handle;
    uint32_t qp_num;
    int state;                  // enum ibv_qp_state
    int qp_type;                // enum ibv_qp_type
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    uint32_t events_completed;
};

struct ibv_sge {
    uint64_t addr;
    uint32_t length;
    uint32_t lkey;
};

struct ibv_send_wr {
    uint64_t wr_id;
    struct ibv_send_wr *next;
    struct ibv_sge *sg_list;
    int num_sge;
    int opcode;                 // enum ibv_wr_opcode
    unsigned int send_flags;
    uint32_t imm_data;          // a union with invalidate_rkey
    uint64_t wr[4];             // a union: rdma, atomic, ud (remote address, keys, address handle)
    uint32_t qp_type;           // a union: xrc.remote_srqn
    uint64_t bind_mw[6];        // a union with tso: the memory window to bind
};

struct ibv_recv_wr {
    uint64_t wr_id;
    struct ibv_recv_wr *next;
    struct ibv_sge *sg_list;
    int num_sge;
};

struct ibv_wc {
    uint64_t wr_id;
    int status;                 // enum ibv_wc_status
    int opcode;                 // enum ibv_wc_opcode
    uint32_t vendor_err;
    uint32_t byte_len;
    uint32_t imm_data;          // a union with invalidated_rkey
    uint32_t qp_num;
    uint32_t src_qp;
    unsigned int wc_flags;
    uint16_t pkey_index;
    uint16_t slid;
    uint8_t sl;
    uint8_t dlid_path_bits;
};

struct ibv_qp_init_attr {
    void *qp_context;
    struct ibv_cq *send_cq;
    struct ibv_cq *recv_cq;
    void *srq;
    struct ibv_qp_cap cap;
    int qp_type;
    int sq_sig_all;
};

union ibv_gid {
    uint8_t raw[16];
    struct {
        uint64_t subnet_prefix;
        uint64_t interface_id;
    } global;
};

struct ibv_global_route {
    union ibv_gid dgid;
    uint32_t flow_label;
    uint8_t sgid_index;
    uint8_t hop_limit;
    uint8_t traffic_class;
};

struct ibv_ah_attr {
    struct ibv_global_route grh;
    uint16_t dlid;
    uint8_t sl;
    uint8_t src_path_bits;
    uint8_t static_rate;
    uint8_t is_global;
    uint8_t port_num;
};

struct ibv_qp_attr {
    int qp_state;               // enum ibv_qp_state
    int cur_qp_state;
    int path_mtu;               // enum ibv_mtu
    int path_mig_state;         // enum ibv_mig_state
    uint32_t qkey;
    uint32_t rq_psn;
    uint32_t sq_psn;
    uint32_t dest_qp_num;
    unsigned int qp_access_flags;
    struct ibv_qp_cap cap;
    struct ibv_ah_attr ah_attr;
    struct ibv_ah_attr alt_ah_attr;
    uint16_t pkey_index;
    uint16_t alt_pkey_index;
    uint8_t en_sqd_async_notify;
    uint8_t sq_draining;
    uint8_t max_rd_atomic;
    uint8_t max_dest_rd_atomic;
    uint8_t min_rnr_timer;
    uint8_t port_num;
    uint8_t timeout;
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    uint8_t alt_port_num;
    uint8_t alt_timeout;
    uint32_t rate_limit;
};

enum { RESET, INIT, RTR, RTS, SQD, SQE, ERR };                         // enum ibv_qp_state
enum { ATTR_STATE = 1 << 0, ATTR_AV = 1 << 7, ATTR_DEST_QPN = 1 << 20 };  // enum ibv_qp_attr_mask
enum { QPT_RC = 2, QPT_UC = 3 };
enum { WR_RDMA_WRITE, WR_RDMA_WRITE_WITH_IMM, WR_SEND, WR_SEND_WITH_IMM, WR_RDMA_READ, WR_ATOMIC_CMP_AND_SWP,
       WR_ATOMIC_FETCH_AND_ADD };                                       // enum ibv_wr_opcode
enum { WC_SEND, WC_RDMA_WRITE, WC_RDMA_READ, WC_COMP_SWAP, WC_FETCH_ADD, WC_RECV = 128, WC_RECV_RDMA_WITH_IMM };
enum { WC_SUCCESS = 0, WC_RETRY_EXC_ERR = 12, WC_RNR_RETRY_EXC_ERR = 13 };  // enum ibv_wc_status
enum { SEND_SIGNALED = 1 << 1 };                                        // enum ibv_send_flags
enum { OPS_POLL_CQ = 11, OPS_POST_SEND = 25, OPS_POST_RECV = 26 };      // struct ibv_context_ops: their slots

// ---- the provider's objects: the public struct first, as a real provider's embed it
#define CQ_DEPTH 1024
#define RQ_DEPTH 64

struct standin_cq {
    struct ibv_cq cq;
    struct {
        struct ibv_wc wc;
        uint64_t ready_ns;      // CLOCK_MONOTONIC: ibv_poll_cq returns it from then on
    } entries[CQ_DEPTH];
    unsigned head, tail;        // entries[head % CQ_DEPTH] is the oldest; tail - head are queued
};

struct standin_qp {
    struct ibv_qp qp;
    uint32_t dest_qp_num;       // the peer, set at RTR
    uint64_t receives[RQ_DEPTH]; // posted receives' wr_id, oldest at receive_head
    unsigned receive_head, receive_tail;
    struct standin_qp *next_live;
};

// ---- the library
static struct ibv_device devices[2] = {
    {.node_type = 1, .name = "mlx5_0", .dev_name = "uverbs0"},
    {.node_type = 1, .name = "mlx5_1", .dev_name = "uverbs1"},
};
static uint32_t next_handle = 1;
static uint32_t next_qp_num = 0x100;

struct ibv_device **ibv_get_device_list(int *num_devices) {
    struct ibv_device **list = calloc(3, sizeof(*list));
    if (!list)
        return NULL;
    list[0] = &devices[0];
    list[1] = &devices[1];
    if (num_devices)
        *num_devices = 2;
    return list;
}

void ibv_free_device_list(struct ibv_device **list) { free(list); }
const char *ibv_get_device_name(struct ibv_device *device) { return device->name; }

static int standin_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);
static int standin_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr);
static int standin_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr);
static uint64_t completion_delay_ns;

struct ibv_context *ibv_open_device(struct ibv_device *device) {
    struct ibv_context *context = calloc(1, sizeof(*context));
    if (!context)
        return NULL;
    context->device = device;
    context->ops[OPS_POLL_CQ] = (void *)standin_poll_cq;
    context->ops[OPS_POST_SEND] = (void *)standin_post_send;
    context->ops[OPS_POST_RECV] = (void *)standin_post_recv;
    const char *delay = getenv("STANDIN_COMPLETION_DELAY_US");
    completion_delay_ns = delay ? strtoull(delay, NULL, 10) * 1000 : 0;
    return context;
}

int ibv_close_device(struct ibv_context *context) {
    free(context);
    return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *context) {
    struct ibv_pd *pd = calloc(1, sizeof(*pd));
    if (pd) {
        pd->context = context;
        pd->handle = next_handle++;
    }
    return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd) {
    free(pd);
    return 0;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, unsigned int access) {
    (void)iova;
    (void)access;
    struct ibv_mr *mr = calloc(1, sizeof(*mr));
    if (!mr)
        return NULL;
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = addr;
    mr->length = length;
    mr->handle = next_handle++;
    mr->lkey = mr->rkey = mr->handle;
    return mr;
}

// As in libibverbs: the older entry points hand over to ibv_reg_mr_iova2 (a tail call at -O2).
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access) {
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova, int access) {
    return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned int)access);
}

struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                                 int access) {
    (void)offset;
    if (fd < 0) {
        errno = EBADF;
        return NULL;
    }
    return ibv_reg_mr_iova2(pd, NULL, length, iova, (unsigned int)access);
}

int ibv_dereg_mr(struct ibv_mr *mr) {
    free(mr);
    return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context, void *channel, int comp_vector) {
    (void)comp_vector;
    if (cqe >= CQ_DEPTH)
        return NULL;
    struct standin_cq *provider = calloc(1, sizeof(*provider));
    if (!provider)
        return NULL;
    struct ibv_cq *cq = &provider->cq;
    int entries = 1;
    while (entries < cqe + 1)  // providers round up, as mlx5 does: the caller gets at least cqe
        entries <<= 1;
    cq->context = context;
    cq->channel = channel;
    cq->cq_context = cq_context;
    cq->handle = next_handle++;
    cq->cqe = entries - 1;
    return cq;
}

int ibv_destroy_cq(struct ibv_cq *cq) {
    free(cq);
    return 0;
}

static struct standin_qp *live_qps;

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init) {
    struct standin_qp *provider = calloc(1, sizeof(*provider));
    if (!provider)
        return NULL;
    provider->next_live = live_qps;
    live_qps = provider;
    struct ibv_qp *qp = &provider->qp;
    qp->context = pd->context;
    qp->qp_context = init->qp_context;
    qp->pd = pd;
    qp->send_cq = init->send_cq;
    qp->recv_cq = init->recv_cq;
    qp->handle = next_handle++;
    qp->qp_num = next_qp_num++;
    qp->state = RESET;
    qp->qp_type = init->qp_type;
    return qp;
}

static int legal(int from, int to) {
    return to == RESET || to == ERR || (from == RESET && to == INIT) || (from == INIT && (to == INIT || to == RTR)) ||
           (from == RTR && to == RTS) || (from == RTS && to == RTS);
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask) {
    if (attr_mask & ATTR_STATE) {
        if (!legal(qp->state, attr->qp_state))
            return EINVAL;
        int connected = qp->qp_type == QPT_RC || qp->qp_type == QPT_UC;
        if (attr->qp_state == RTR && connected && (attr_mask & (ATTR_AV | ATTR_DEST_QPN)) != (ATTR_AV | ATTR_DEST_QPN))
            return EINVAL;  // a connected QP needs its peer at RTR
        if (attr_mask & ATTR_DEST_QPN)
            ((struct standin_qp *)qp)->dest_qp_num = attr->dest_qp_num;
        qp->state = attr->qp_state;
    }
    return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp) {
    for (struct standin_qp **link = &live_qps; *link; link = &(*link)->next_live)
        if (&(*link)->qp == qp) {
            *link = (*link)->next_live;
            break;
        }
    free(qp);
    return 0;
}

// ---- Provider: the data path
static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static struct standin_qp *find_qp(uint32_t qp_num) {
    for (struct standin_qp *qp = live_qps; qp; qp = qp->next_live)
        if (qp->qp.qp_num == qp_num)
            return qp;
    return NULL;
}

static void complete(struct ibv_cq *cq, uint64_t wr_id, int status, int opcode, uint32_t byte_len, uint32_t qp_num) {
    struct standin_cq *provider = (struct standin_cq *)cq;
    if (provider->tail - provider->head >= CQ_DEPTH)
        abort();  // a CQ overrun: the driver polls long before
    unsigned slot = provider->tail++ % CQ_DEPTH;
    provider->entries[slot].wc = (struct ibv_wc){
        .wr_id = wr_id, .status = status, .opcode = opcode, .byte_len = byte_len, .qp_num = qp_num};
    provider->entries[slot].ready_ns = now_ns() + completion_delay_ns;
}

static uint32_t sge_bytes(const struct ibv_sge *sg_list, int num_sge) {
    uint32_t bytes = 0;
    for (int i = 0; i < num_sge; i++)
        bytes += sg_list[i].length;
    return bytes;
}

static const int WC_OPCODE[] = {
    [WR_RDMA_WRITE] = WC_RDMA_WRITE,    [WR_RDMA_WRITE_WITH_IMM] = WC_RDMA_WRITE, [WR_SEND] = WC_SEND,
    [WR_SEND_WITH_IMM] = WC_SEND,       [WR_RDMA_READ] = WC_RDMA_READ,            [WR_ATOMIC_CMP_AND_SWP] = WC_COMP_SWAP,
    [WR_ATOMIC_FETCH_AND_ADD] = WC_FETCH_ADD,
};

static int standin_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr) {
    struct standin_qp *peer = find_qp(((struct standin_qp *)qp)->dest_qp_num);
    for (; wr; wr = wr->next) {
        if (qp->state != RTS || wr->opcode < 0 || wr->opcode > WR_ATOMIC_FETCH_AND_ADD) {
            *bad_wr = wr;
            return EINVAL;
        }
        uint32_t bytes = sge_bytes(wr->sg_list, wr->num_sge);
        int status = peer ? WC_SUCCESS : WC_RETRY_EXC_ERR;
        int consumes = wr->opcode == WR_SEND || wr->opcode == WR_SEND_WITH_IMM || wr->opcode == WR_RDMA_WRITE_WITH_IMM;
        if (peer && consumes) {
            if (peer->receive_head == peer->receive_tail) {
                status = WC_RNR_RETRY_EXC_ERR;
            } else {
                uint64_t receive = peer->receives[peer->receive_head++ % RQ_DEPTH];
                int opcode = wr->opcode == WR_RDMA_WRITE_WITH_IMM ? WC_RECV_RDMA_WITH_IMM : WC_RECV;
                complete(peer->qp.recv_cq, receive, WC_SUCCESS, opcode, bytes, peer->qp.qp_num);
            }
        }
        if (status != WC_SUCCESS || wr->send_flags & SEND_SIGNALED)  // an error completes, signaled or not
            complete(qp->send_cq, wr->wr_id, status, WC_OPCODE[wr->opcode], status ? 0 : bytes, qp->qp_num);
    }
    return 0;
}

static int standin_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr) {
    struct standin_qp *provider = (struct standin_qp *)qp;
    for (; wr; wr = wr->next) {
        if (provider->receive_tail - provider->receive_head >= RQ_DEPTH) {
            *bad_wr = wr;
            return ENOMEM;
        }
        provider->receives[provider->receive_tail++ % RQ_DEPTH] = wr->wr_id;
    }
    return 0;
}

static int standin_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc) {
    struct standin_cq *provider = (struct standin_cq *)cq;
    uint64_t now = now_ns();
    int n = 0;
    while (n < num_entries && provider->head != provider->tail &&
           provider->entries[provider->head % CQ_DEPTH].ready_ns <= now)
        wc[n++] = provider->entries[provider->head++ % CQ_DEPTH].wc;
    return n;
}

// The 1.0 ABI (structs of libibverbs 1.0): present, as in the real library, and failing.
#define COMPAT_1_0(name)                                                 \
    void *name##_1_0(void) { return NULL; }                              \
    __asm__(".symver " #name "_1_0, " #name "@IBVERBS_1.0");

COMPAT_1_0(ibv_get_device_list)
COMPAT_1_0(ibv_open_device)
COMPAT_1_0(ibv_close_device)
COMPAT_1_0(ibv_alloc_pd)
COMPAT_1_0(ibv_dealloc_pd)
COMPAT_1_0(ibv_reg_mr)
COMPAT_1_0(ibv_dereg_mr)
COMPAT_1_0(ibv_create_cq)
COMPAT_1_0(ibv_destroy_cq)
COMPAT_1_0(ibv_create_qp)
COMPAT_1_0(ibv_modify_qp)
COMPAT_1_0(ibv_destroy_qp)
