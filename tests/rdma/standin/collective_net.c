// A pretend NCCL network transport on the stand-in libibverbs (libstandin_net.so), built against the
// system's infiniband/verbs.h: the stand-in NCCL's collectives call net_transport (through
// standinNcclSetNet) as the real NCCL's proxy drives its IB transport.
//
//   net_connect(qpns)    opens both devices and connects three RC queue pairs of mlx5_0 ("ring",
//                        "tree", "spare") each to one of mlx5_1; qpns: the six numbers, local then
//                        peer for each. Starts the proxy thread.
//   net_transport(bytes) a collective's traffic: the calling thread writes `bytes` on ring; the
//                        proxy thread (as NCCL's, which posts the work requests, not the caller)
//                        writes `bytes` on tree and posts a receive on tree's peer. Returns when both
//                        are posted.
//   net_idle(bytes)      writes `bytes` on spare: traffic outside any collective.
// The writes are unsignaled RDMA writes (no completion to poll); the receives are never consumed.
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

enum { RING, TREE, SPARE, PAIRS };

static struct ibv_qp *local[PAIRS], *peer[PAIRS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
static size_t proxy_bytes;  // > 0: work for the proxy thread; back to 0 once posted
static char buffer[1 << 20];

static int connect_to(struct ibv_qp *qp, uint32_t remote_qpn, uint8_t remote_host) {
    struct ibv_qp_attr init = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                               .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ};
    if (ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
        return -1;
    struct ibv_qp_attr rtr = {
        .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = remote_qpn, .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12, .ah_attr = {.is_global = 1, .port_num = 1, .grh = {.sgid_index = 3, .hop_limit = 64}}};
    static const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 0};
    memcpy(rtr.ah_attr.grh.dgid.raw, gid, 16);
    rtr.ah_attr.grh.dgid.raw[15] = remote_host;  // 10.0.0.<remote_host>: mlx5_0 is .1, mlx5_1 is .2
    if (ibv_modify_qp(qp, &rtr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
        return -1;
    struct ibv_qp_attr rts = {.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .max_rd_atomic = 1};
    return ibv_modify_qp(qp, &rts, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void write_on(struct ibv_qp *qp, size_t bytes) {
    struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = (uint32_t)bytes, .lkey = 1};
    struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE}, *bad = NULL;
    ibv_post_send(qp, &wr, &bad);
}

static void *proxy(void *unused) {
    (void)unused;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (!proxy_bytes)
            pthread_cond_wait(&changed, &lock);
        write_on(local[TREE], proxy_bytes);
        struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = sizeof(buffer), .lkey = 1};
        struct ibv_recv_wr wr = {.sg_list = &sge, .num_sge = 1}, *bad = NULL;
        ibv_post_recv(peer[TREE], &wr, &bad);
        proxy_bytes = 0;
        pthread_cond_broadcast(&changed);
    }
    return NULL;
}

int net_connect(uint32_t qpns[2 * PAIRS]) {
    int n = 0;
    struct ibv_device **devices = ibv_get_device_list(&n);
    if (!devices || n != 2)
        return -1;
    struct ibv_context *c0 = ibv_open_device(devices[0]), *c1 = ibv_open_device(devices[1]);
    ibv_free_device_list(devices);
    struct ibv_pd *pd0 = ibv_alloc_pd(c0), *pd1 = ibv_alloc_pd(c1);
    struct ibv_cq *cq0 = ibv_create_cq(c0, 64, NULL, NULL, 0), *cq1 = ibv_create_cq(c1, 64, NULL, NULL, 0);
    if (!pd0 || !pd1 || !cq0 || !cq1)
        return -1;
    for (int i = 0; i < PAIRS; i++) {
        struct ibv_qp_init_attr attr = {.qp_type = IBV_QPT_RC, .cap = {16, 64, 1, 1, 0}};
        attr.send_cq = attr.recv_cq = cq0;
        local[i] = ibv_create_qp(pd0, &attr);
        attr.send_cq = attr.recv_cq = cq1;
        peer[i] = ibv_create_qp(pd1, &attr);
        if (!local[i] || !peer[i])
            return -1;
    }
    for (int i = 0; i < PAIRS; i++) {
        if (connect_to(local[i], peer[i]->qp_num, 2) || connect_to(peer[i], local[i]->qp_num, 1))
            return -1;
        qpns[2 * i] = local[i]->qp_num;
        qpns[2 * i + 1] = peer[i]->qp_num;
    }
    pthread_t thread;
    return pthread_create(&thread, NULL, proxy, NULL);
}

void net_transport(size_t bytes) {
    write_on(local[RING], bytes);
    pthread_mutex_lock(&lock);
    proxy_bytes = bytes;
    pthread_cond_broadcast(&changed);
    while (proxy_bytes)
        pthread_cond_wait(&changed, &lock);
    pthread_mutex_unlock(&lock);
}

void net_idle(size_t bytes) { write_on(local[SPARE], bytes); }
