// A verbs program with a known ledger, built against the system's infiniband/verbs.h (libibverbs-dev)
// and run on the stand-in libibverbs.so.1 (or, with "list", on the real one).
//
//   driver ledger   prints "ready", waits for a line on stdin, then opens both devices, allocates
//                   protection domains, registers memory (through each registration entry point),
//                   creates completion queues and queue pairs, takes two RC queue pairs, connected
//                   to each other across the two devices, and a UD one through RESET -> INIT -> RTR
//                   -> RTS, makes one illegal transition, destroys some of it all, and prints the
//                   ledger of what it did as one JSON line; then waits for a line before exiting.
//   driver list N   prints "ready", waits for a line, calls ibv_get_device_list N times (no device:
//                   an empty list or NULL), prints {"pid": ..., "calls": N, "devices": n}, waits.
//   driver data     the data path (run with STANDIN_COMPLETION_DELAY_US): prints "ready", waits for a
//                   line, connects two RC queue pairs across the devices (and a third to a queue
//                   pair that does not exist), prints {"connected": true}, waits for a line, then
//                   posts receives and work requests of each opcode through verbs.h's inline
//                   ibv_post_recv / ibv_post_send, polls every completion with ibv_poll_cq, and
//                   prints the ledger of what it posted and what the polls returned; waits.
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct {
    char key[96];
    long long value;
} ledger[128];
static int entries;

// ledger["<key>"] += value
static void add(long long value, const char *fmt, const char *a, const char *b) {
    char key[96];
    snprintf(key, sizeof(key), fmt, a, b);
    for (int i = 0; i < entries; i++)
        if (!strcmp(ledger[i].key, key)) {
            ledger[i].value += value;
            return;
        }
    if (entries < 128) {
        snprintf(ledger[entries].key, sizeof(ledger[entries].key), "%s", key);
        ledger[entries++].value = value;
    }
}

static void called(const char *function, const char *device) { add(1, "calls %s %s", function, device); }

static void wait_line(void) {
    char line[64];
    if (!fgets(line, sizeof(line), stdin))
        exit(1);
}

static const char *name_of(struct ibv_context *context) { return ibv_get_device_name(context->device); }

static struct ibv_mr *must(struct ibv_mr *mr) {
    if (!mr)
        exit(2);
    return mr;
}

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_cq *cq, enum ibv_qp_type type) {
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = type};
    init.cap.max_send_wr = init.cap.max_recv_wr = 16;
    init.cap.max_send_sge = init.cap.max_recv_sge = 1;
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    if (!qp)
        exit(3);
    called("ibv_create_qp", name_of(pd->context));
    add(1, "objects %s %s", name_of(pd->context), "qp");
    return qp;
}

static const char *STATES[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};

// ibv_modify_qp to `to`; expect its result; a success moves the ledger's transition count
static void modify(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask, int expected) {
    enum ibv_qp_state from = qp->state;
    int ret = ibv_modify_qp(qp, attr, mask);
    if (ret != expected)
        exit(4);
    const char *device = name_of(qp->context);
    if (ret) {
        add(1, "calls ibv_modify_qp %s EINVAL%s", device, "");
        return;
    }
    called("ibv_modify_qp", device);
    char transition[64];
    snprintf(transition, sizeof(transition), "%s %s->%s", qp->qp_type == IBV_QPT_RC ? "RC" : "UD", STATES[from],
             STATES[attr->qp_state]);
    add(1, "transition %s %s", device, transition);
}

static void to_init(struct ibv_qp *qp, uint8_t port) {
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_INIT, .port_num = port, .pkey_index = 0};
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    if (qp->qp_type == IBV_QPT_UD) {
        attr.qkey = 0x11111111;
        mask |= IBV_QP_QKEY;
    } else {
        attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        mask |= IBV_QP_ACCESS_FLAGS;
    }
    modify(qp, &attr, mask, 0);
}

// RC: to RTR with the peer's QP number and GID (RoCEv2: an IPv4-mapped GID), then to RTS
static void connect_rc(struct ibv_qp *qp, uint32_t remote_qpn, const uint8_t remote_gid[16], uint8_t sgid_index) {
    struct ibv_qp_attr attr = {
        .qp_state = IBV_QPS_RTR,
        .path_mtu = IBV_MTU_1024,
        .dest_qp_num = remote_qpn,
        .rq_psn = 0,
        .max_dest_rd_atomic = 1,
        .min_rnr_timer = 12,
        .ah_attr = {.is_global = 1, .port_num = 1, .grh = {.sgid_index = sgid_index, .hop_limit = 64}},
    };
    memcpy(attr.ah_attr.grh.dgid.raw, remote_gid, 16);
    modify(qp, &attr,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
               IBV_QP_MIN_RNR_TIMER,
           0);
    struct ibv_qp_attr rts = {
        .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1};
    modify(qp, &rts,
           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC,
           0);
}

static void print_ledger(const char *extra) {
    printf("{\"pid\": %d%s, \"ledger\": {", (int)getpid(), extra);
    for (int i = 0; i < entries; i++)
        printf("%s\"%s\": %lld", i ? ", " : "", ledger[i].key, ledger[i].value);
    printf("}}\n");
    fflush(stdout);
}

static int run_ledger(void) {
    static char buffers[4][1 << 20];
    int n = 0;
    struct ibv_device **devices = ibv_get_device_list(&n);
    if (!devices || n != 2)
        return 5;
    called("ibv_get_device_list", "");
    struct ibv_context *c0 = ibv_open_device(devices[0]), *c1 = ibv_open_device(devices[1]);
    ibv_free_device_list(devices);
    if (!c0 || !c1)
        return 6;
    const char *d0 = name_of(c0), *d1 = name_of(c1);
    called("ibv_open_device", d0);
    called("ibv_open_device", d1);
    add(1, "objects %s %s", d0, "context");
    add(1, "objects %s %s", d1, "context");

    struct ibv_pd *pd0 = ibv_alloc_pd(c0), *spare = ibv_alloc_pd(c0), *pd1 = ibv_alloc_pd(c1);
    called("ibv_alloc_pd", d0);
    called("ibv_alloc_pd", d0);
    called("ibv_alloc_pd", d1);
    add(2, "objects %s %s", d0, "pd");
    add(1, "objects %s %s", d1, "pd");

    // ibv_reg_mr with constant access flags calls ibv_reg_mr (which hands over to ibv_reg_mr_iova2);
    // with the relaxed-ordering flag verbs.h calls ibv_reg_mr_iova2 itself
    struct ibv_mr *small = must(ibv_reg_mr(pd0, buffers[0], 4096, IBV_ACCESS_LOCAL_WRITE));
    struct ibv_mr *large = must(ibv_reg_mr(pd0, buffers[1], 1 << 20, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING));
    struct ibv_mr *offset = must(ibv_reg_mr_iova(pd1, buffers[2], 65536, 0x10000, IBV_ACCESS_LOCAL_WRITE));
    struct ibv_mr *dmabuf = ibv_reg_dmabuf_mr(pd1, 0, 8192, 0, -1, IBV_ACCESS_LOCAL_WRITE);  // no dma-buf fd
    if (dmabuf)
        return 7;
    called("ibv_reg_mr", d0);
    called("ibv_reg_mr_iova2", d0);
    called("ibv_reg_mr_iova", d1);
    add(1, "calls ibv_reg_dmabuf_mr %s null%s", d1, "");
    add(small->length + large->length, "registered %s%s", d0, "");
    add(offset->length, "registered %s%s", d1, "");
    add(2, "objects %s %s", d0, "mr");
    add(1, "objects %s %s", d1, "mr");
    add(-1, "objects %s %s", d0, "mr");

    struct ibv_cq *cq0 = ibv_create_cq(c0, 100, NULL, NULL, 0), *cq1 = ibv_create_cq(c1, 16, NULL, NULL, 0);
    if (!cq0 || !cq1)
        return 8;
    called("ibv_create_cq", d0);
    called("ibv_create_cq", d1);
    add(1, "objects %s %s", d0, "cq");
    add(1, "objects %s %s", d1, "cq");

    struct ibv_qp *rc0 = create_qp(pd0, cq0, IBV_QPT_RC), *rc1 = create_qp(pd1, cq1, IBV_QPT_RC);
    struct ibv_qp *ud = create_qp(pd0, cq0, IBV_QPT_UD);
    // the two RC queue pairs are each other's peer: mlx5_0 port 1 GID 3 is ::ffff:10.0.0.1 and
    // mlx5_1's ::ffff:10.0.0.2 (the test's sysfs tree says so)
    static const uint8_t gid0[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};
    static const uint8_t gid1[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2};
    to_init(rc0, 1);
    to_init(rc1, 1);
    connect_rc(rc0, rc1->qp_num, gid1, 3);
    connect_rc(rc1, rc0->qp_num, gid0, 3);
    to_init(ud, 1);
    struct ibv_qp_attr rtr = {.qp_state = IBV_QPS_RTR}, rts = {.qp_state = IBV_QPS_RTS, .sq_psn = 0};
    modify(ud, &rtr, IBV_QP_STATE, 0);
    modify(ud, &rts, IBV_QP_STATE | IBV_QP_SQ_PSN, 0);
    modify(ud, &rtr, IBV_QP_STATE, EINVAL);  // RTS -> RTR: not a legal transition
    add(rc0->qp_num, "qpn rc0%s%s", "", "");
    add(rc1->qp_num, "qpn rc1%s%s", "", "");
    add(ud->qp_num, "qpn ud%s%s", "", "");

    // tear down part of it: rc0, the spare PD, cq0 and the large MR stay
    if (ibv_destroy_qp(ud) || ibv_destroy_qp(rc1) || ibv_destroy_cq(cq1) || ibv_dereg_mr(small) ||
        ibv_dereg_mr(offset) || ibv_dealloc_pd(pd1) || ibv_close_device(c1))
        return 9;
    called("ibv_destroy_qp", d0);
    called("ibv_destroy_qp", d1);
    add(-1, "objects %s %s", d0, "qp");
    add(-1, "objects %s %s", d1, "qp");
    called("ibv_destroy_cq", d1);
    add(-1, "objects %s %s", d1, "cq");
    called("ibv_dereg_mr", d0);
    called("ibv_dereg_mr", d1);
    add(4096, "deregistered %s%s", d0, "");
    add(65536, "deregistered %s%s", d1, "");
    add(-1, "objects %s %s", d1, "mr");
    called("ibv_dealloc_pd", d1);
    add(-1, "objects %s %s", d1, "pd");
    called("ibv_close_device", "mlx5_1");  // d1 is gone with its context
    add(-1, "objects %s %s", "mlx5_1", "context");
    (void)spare;
    print_ledger("");
    return 0;
}

static const char *WR_OPCODES[] = {"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM", "RDMA_READ",
                                   "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"};

static const char *wc_opcode_name(enum ibv_wc_opcode opcode) {
    switch (opcode) {
    case IBV_WC_SEND: return "SEND";
    case IBV_WC_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WC_RDMA_READ: return "RDMA_READ";
    case IBV_WC_COMP_SWAP: return "COMP_SWAP";
    case IBV_WC_FETCH_ADD: return "FETCH_ADD";
    case IBV_WC_RECV: return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM: return "RECV_RDMA_WITH_IMM";
    default: return "?";
    }
}

static const char *wc_status_name(enum ibv_wc_status status) {
    switch (status) {
    case IBV_WC_SUCCESS: return "SUCCESS";
    case IBV_WC_RETRY_EXC_ERR: return "RETRY_EXC_ERR";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR_RETRY_EXC_ERR";
    default: return "?";
    }
}

static char qpn_text[3][16];

// one list of work requests, one of each opcode, on qp; `sges` elements each but the atomics' one
static void post_each_opcode(struct ibv_qp *qp, int round, const char *qpn) {
    static char buffer[1 << 16];
    struct ibv_sge sges[7][3];
    struct ibv_send_wr wrs[7];
    memset(wrs, 0, sizeof(wrs));
    for (int op = 0; op < 7; op++) {
        int atomic = op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
        int count = atomic ? 1 : 1 + (op + round) % 3;
        uint32_t bytes = 0;
        for (int i = 0; i < count; i++) {
            sges[op][i] = (struct ibv_sge){.addr = (uintptr_t)buffer, .length = atomic ? 8 : 1000 * (op + 1) + i, .lkey = 1};
            bytes += sges[op][i].length;
        }
        wrs[op] = (struct ibv_send_wr){.wr_id = (uint64_t)round << 8 | op, .next = op < 6 ? &wrs[op + 1] : NULL,
                                       .sg_list = sges[op], .num_sge = count, .opcode = op,
                                       .send_flags = IBV_SEND_SIGNALED};
        add(1, "posted %s %s", qpn, WR_OPCODES[op]);
        add(bytes, "posted_bytes %s %s", qpn, WR_OPCODES[op]);
    }
    struct ibv_send_wr *bad = NULL;
    if (ibv_post_send(qp, wrs, &bad))
        exit(10);
}

// poll cq in batches of 4 until `expected` completions came; each into the ledger
static void poll_all(struct ibv_cq *cq, int expected) {
    struct ibv_wc wc[4];
    for (int seen = 0, spins = 0; seen < expected; spins++) {
        if (spins > 2000000)
            exit(11);
        int n = ibv_poll_cq(cq, 4, wc);
        if (n < 0)
            exit(12);
        if (!n)
            usleep(200);
        for (int i = 0; i < n; i++, seen++) {
            char what[96], qpn[16];
            snprintf(qpn, sizeof(qpn), "%u", wc[i].qp_num);
            if (wc[i].status == IBV_WC_SUCCESS) {
                snprintf(what, sizeof(what), "%s %s", wc_opcode_name(wc[i].opcode), "SUCCESS");
                add(wc[i].byte_len, "completed_bytes %s %s", qpn, what);
            } else {
                snprintf(what, sizeof(what), "- %s", wc_status_name(wc[i].status));
            }
            add(1, "completed %s %s", qpn, what);
        }
    }
}

static int run_data(void) {
    int n = 0;
    struct ibv_device **devices = ibv_get_device_list(&n);
    if (!devices || n != 2)
        return 5;
    struct ibv_context *c0 = ibv_open_device(devices[0]), *c1 = ibv_open_device(devices[1]);
    ibv_free_device_list(devices);
    struct ibv_pd *pd0 = ibv_alloc_pd(c0), *pd1 = ibv_alloc_pd(c1);
    struct ibv_cq *cq0 = ibv_create_cq(c0, 64, NULL, NULL, 0), *cq1 = ibv_create_cq(c1, 64, NULL, NULL, 0);
    if (!pd0 || !pd1 || !cq0 || !cq1)
        return 6;
    struct ibv_qp *rc0 = create_qp(pd0, cq0, IBV_QPT_RC), *rc1 = create_qp(pd1, cq1, IBV_QPT_RC);
    struct ibv_qp *lost = create_qp(pd0, cq0, IBV_QPT_RC);
    static const uint8_t gid0[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};
    static const uint8_t gid1[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2};
    to_init(rc0, 1);
    to_init(rc1, 1);
    to_init(lost, 1);
    connect_rc(rc0, rc1->qp_num, gid1, 3);
    connect_rc(rc1, rc0->qp_num, gid0, 3);
    connect_rc(lost, 0xdead, gid1, 3);  // nobody there: its work requests exhaust their retries
    printf("{\"connected\": true}\n");
    wait_line();

    entries = 0;  // the ledger: the data path only
    snprintf(qpn_text[0], 16, "%u", rc0->qp_num);
    snprintf(qpn_text[1], 16, "%u", rc1->qp_num);
    snprintf(qpn_text[2], 16, "%u", lost->qp_num);
    // six receives: three rounds of (SEND, SEND_WITH_IMM, RDMA_WRITE_WITH_IMM) need nine, the
    // last round's three find none and fail (RNR)
    struct ibv_sge rsge = {.addr = 0, .length = 1 << 16, .lkey = 1};
    struct ibv_recv_wr receives[6];
    for (int i = 0; i < 6; i++) {
        receives[i] = (struct ibv_recv_wr){.wr_id = 0x100 + i, .next = i < 5 ? &receives[i + 1] : NULL,
                                           .sg_list = &rsge, .num_sge = 1};
        add(1, "posted %s %s", qpn_text[1], "RECV");
        add(rsge.length, "posted_bytes %s %s", qpn_text[1], "RECV");
    }
    struct ibv_recv_wr *bad_recv = NULL;
    if (ibv_post_recv(rc1, receives, &bad_recv))
        return 13;
    for (int round = 0; round < 3; round++)
        post_each_opcode(rc0, round, qpn_text[0]);
    for (int i = 0; i < 2; i++) {
        struct ibv_sge sge = {.length = 512, .lkey = 1};
        struct ibv_send_wr wr = {.wr_id = 0x200 + i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
                                 .send_flags = IBV_SEND_SIGNALED}, *bad = NULL;
        if (ibv_post_send(lost, &wr, &bad))
            return 14;
        add(1, "posted %s %s", qpn_text[2], "SEND");
        add(512, "posted_bytes %s %s", qpn_text[2], "SEND");
    }
    poll_all(cq0, 3 * 7 + 2);  // rc0's 21 (3 of them RNR errors) and lost's 2
    poll_all(cq1, 6);          // rc1's receives
    char extra[64];
    snprintf(extra, sizeof(extra), ", \"rc0\": %u, \"rc1\": %u, \"lost\": %u", rc0->qp_num, rc1->qp_num,
             lost->qp_num);
    print_ledger(extra);
    return 0;
}

static int run_list(int times) {
    int n = -1;
    for (int i = 0; i < times; i++) {
        struct ibv_device **devices = ibv_get_device_list(&n);
        if (devices)
            ibv_free_device_list(devices);
        else
            n = 0;
    }
    char extra[64];
    snprintf(extra, sizeof(extra), ", \"calls\": %d, \"devices\": %d", times, n);
    print_ledger(extra);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("ready\n");
    wait_line();
    int status = argc == 3 && !strcmp(argv[1], "list") ? run_list(atoi(argv[2]))
                 : argc == 2 && !strcmp(argv[1], "data")  ? run_data()
                                                          : run_ledger();
    if (status)
        return status;
    wait_line();
    return 0;
}
