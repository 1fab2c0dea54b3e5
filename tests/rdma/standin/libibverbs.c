// Stand-in libibverbs (libibverbs.so.1): the real exported names, symbol versions, signatures and
// public struct layouts (infiniband/verbs.h ABI, x86-64), over two pretend devices, mlx5_0 and
// mlx5_1. Nothing reaches hardware: objects are heap blocks, queue pair numbers count up, and
// ibv_modify_qp accepts the transitions of the IBTA state diagram (others: EINVAL), keeping
// qp->state as libibverbs does. The 1.0 compatibility entry points exist, as in the real library,
// and fail: a probe that hooked them instead of the defaults would see nothing.
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

struct ibv_context *ibv_open_device(struct ibv_device *device) {
    struct ibv_context *context = calloc(1, sizeof(*context));
    if (context)
        context->device = device;
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
    struct ibv_cq *cq = calloc(1, sizeof(*cq));
    if (!cq)
        return NULL;
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

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init) {
    struct ibv_qp *qp = calloc(1, sizeof(*qp));
    if (!qp)
        return NULL;
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
        qp->state = attr->qp_state;
    }
    return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp) {
    free(qp);
    return 0;
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
