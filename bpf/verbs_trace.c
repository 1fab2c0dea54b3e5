/* verbs_trace.c — the RDMA verbs control path: libibverbs calls that open devices, allocate
 * protection domains, register memory, create completion queues and drive queue pairs.
 *
 * Each hooked function of libibverbs' stable API gets an entry program (uprobe) and a return
 * program (uretprobe), generated per operation by VERB() below. The entry reads what the call is
 * about while it is still valid (a queue pair's number before ibv_destroy_qp frees it, the state
 * an ibv_modify_qp asks for) into calls[tid, family]; the return adds what the call made (the
 * new queue pair's number) and sends one record. Calls are rare — set-up and tear-down, not the
 * data path — so one hash insert per call costs nothing that matters.
 *
 * Every struct read here is public ABI (infiniband/verbs.h, unchanged since libibverbs 1.1);
 * the offsets are below, checked against the installed verbs.h by tests/rdma/test_layouts.py.
 * Only user memory is read.
 *
 * Nesting: libibverbs' ibv_reg_mr jumps to ibv_reg_mr_iova2, both hooked. Calls of one family
 * on one thread nest: the outermost one reports (its name, its return), the inner ones only
 * count their depth. An inner call enters microseconds after the outer one, at the same stack
 * depth or deeper; an entry older than NEST_WINDOW_NS is not taken for an outer call (its return
 * was never seen), so a lost return cannot swallow the thread's later calls.
 * Compile-time sizes: RINGBUF_PAGES, MAX_TARGETS, MAX_CALLS.
 */
#include <uapi/linux/ptrace.h>
#include "current_task.h"

#ifndef MAX_TARGETS
#define MAX_TARGETS 1024
#endif
#ifndef MAX_CALLS
#define MAX_CALLS 1024
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 64
#endif
#define NEST_WINDOW_NS 100000000ULL  /* 100 ms: far more than a preempted jump from one entry to the next */

/* infiniband/verbs.h, x86-64 */
#define DEVICE_NAME 24          /* struct ibv_device: _ops (2 pointers), node_type, transport_type, name[64] */
#define NAME_MAX_LEN 64         /* IBV_SYSFS_NAME_MAX */
#define OBJECT_CONTEXT 0        /* ibv_context.device, ibv_pd/ibv_mr/ibv_cq/ibv_qp.context: the first member */
#define MR_LENGTH 24            /* struct ibv_mr: context, pd, addr, length */
#define QP_NUM 52               /* struct ibv_qp: context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num */
#define QP_STATE 56             /*   ..., state (libibverbs keeps it: ibv_modify_qp sets it on success) */
#define QP_TYPE 60              /*   ..., qp_type */
#define ATTR_QP_STATE 0         /* struct ibv_qp_attr */
#define ATTR_DEST_QP_NUM 28
#define ATTR_AH_DGID 56         /*   ah_attr (struct ibv_ah_attr at 56): grh.dgid */
#define ATTR_AH_SGID_INDEX 76   /*   ah_attr.grh.sgid_index */
#define ATTR_AH_DLID 80         /*   ah_attr.dlid */
#define ATTR_AH_IS_GLOBAL 85    /*   ah_attr.is_global */
#define ATTR_AH_PORT_NUM 86     /*   ah_attr.port_num */
#define ATTR_PORT_NUM 129       /* port_num */

/* What the first argument is, for the device name: */
#define ARG_NONE 0              /* nothing with a device (ibv_get_device_list) */
#define ARG_DEVICE 1            /* struct ibv_device * */
#define ARG_CONTEXT 2           /* struct ibv_context * */
#define ARG_CHILD 3             /* an object whose first member is its context (pd, mr, cq, qp) */

/* What else to read: */
#define READ_NONE 0
#define READ_LENGTH_ARG 1       /* entry: the third argument (ibv_reg_mr*: length) */
#define READ_MR_LENGTH 2        /* entry: mr->length */
#define READ_NEW_QP 3           /* return: qp->qp_num, qp_type, state */
#define READ_QP 4               /* entry: qp->qp_num, qp_type, state */
#define READ_QP_ATTR 5          /* entry: the qp, and the attributes ibv_modify_qp sets */

#define SET_FILTER_PIDS 0       /* settings[]: 1: only tgids in targets[] */
#define SET_AGENT_TGID 1
#define SET_COUNT 2

#define STAT_RINGBUF_FULL 0     /* stats[], mirrored by STAT_NAMES in otel_ebpf/probes/verbs.py */
#define STAT_NO_ENTRY 1         /* returns whose entry was not kept (attached mid-call, table full) */
#define STAT_COUNT 2

struct verbs_call {
    u64 ts;             /* entry, CLOCK_MONOTONIC ns */
    u64 duration_ns;
    u64 sp;             /* at entry: an older entry above it on the stack is not an outer call */
    u64 ret;            /* the return value: a pointer, or an int in the low 32 bits */
    u64 object;         /* the first argument: the device, context, pd, mr, cq or qp */
    u64 length;         /* bytes registered / deregistered */
    u32 pid;
    u32 tid;
    u16 op;             /* OPS of otel_ebpf/rdma/calls.py */
    u16 depth;          /* calls of this family in flight on the thread, this one included */
    u32 qp_num;
    u32 qp_type;
    u32 qp_state;       /* the queue pair's state when the call began (ibv_modify_qp: the one it leaves) */
    u32 attr_mask;
    u32 attr_qp_state;  /* the state ibv_modify_qp asks for (IBV_QP_STATE) */
    u32 dest_qp_num;    /* IBV_QP_DEST_QPN */
    u16 dlid;           /* IBV_QP_AV: ah_attr.dlid, is_global, port_num, grh.sgid_index, grh.dgid */
    u8 is_global;
    u8 ah_port_num;
    u8 sgid_index;
    u8 port_num;        /* IBV_QP_PORT */
    u8 _pad[2];
    u8 dgid[16];
    char device[NAME_MAX_LEN];
};

BPF_RINGBUF_OUTPUT(verbs_events, RINGBUF_PAGES);
BPF_HASH(targets, u32, u8, MAX_TARGETS);
BPF_ARRAY(settings, u32, SET_COUNT);
BPF_PERCPU_ARRAY(stats, u64, STAT_COUNT);
BPF_PERCPU_ARRAY(scratch, struct verbs_call, 1);
BPF_TABLE("lru_hash", u64, struct verbs_call, calls, MAX_CALLS);  /* (tid << 8 | family) -> the call in flight */

static __always_inline void count(u32 slot) {
    u64 *n = stats.lookup(&slot);
    if (n)
        (*n)++;
}

static __always_inline int is_target(u32 tgid) {
    u32 key = SET_AGENT_TGID;
    u32 *agent = settings.lookup(&key);
    if (!tgid || (agent && tgid == *agent))  /* 0: outside the agent's PID namespace */
        return 0;
    key = SET_FILTER_PIDS;
    u32 *filter = settings.lookup(&key);
    return !(filter && *filter) || targets.lookup(&tgid) != 0;
}

static __always_inline u64 read_pointer(u64 address) {
    u64 value = 0;
    bpf_probe_read_user(&value, sizeof(value), (void *)address);
    return value;
}

static __always_inline void read_qp(struct verbs_call *c, u64 qp) {
    bpf_probe_read_user(&c->qp_num, sizeof(c->qp_num), (void *)(qp + QP_NUM));
    bpf_probe_read_user(&c->qp_state, sizeof(c->qp_state), (void *)(qp + QP_STATE));
    bpf_probe_read_user(&c->qp_type, sizeof(c->qp_type), (void *)(qp + QP_TYPE));
}

static __always_inline void read_attr(struct verbs_call *c, u64 attr) {
    bpf_probe_read_user(&c->attr_qp_state, sizeof(u32), (void *)(attr + ATTR_QP_STATE));
    bpf_probe_read_user(&c->dest_qp_num, sizeof(u32), (void *)(attr + ATTR_DEST_QP_NUM));
    bpf_probe_read_user(c->dgid, sizeof(c->dgid), (void *)(attr + ATTR_AH_DGID));
    bpf_probe_read_user(&c->sgid_index, 1, (void *)(attr + ATTR_AH_SGID_INDEX));
    bpf_probe_read_user(&c->dlid, sizeof(u16), (void *)(attr + ATTR_AH_DLID));
    bpf_probe_read_user(&c->is_global, 1, (void *)(attr + ATTR_AH_IS_GLOBAL));
    bpf_probe_read_user(&c->ah_port_num, 1, (void *)(attr + ATTR_AH_PORT_NUM));
    bpf_probe_read_user(&c->port_num, 1, (void *)(attr + ATTR_PORT_NUM));
}

static __always_inline int verb_enter(struct pt_regs *ctx, u16 op, u16 family, int arg, int what) {
    u64 id = current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    u64 key = (id & 0xffffffff) << 8 | family;
    u64 sp = PT_REGS_SP(ctx);
    u64 now = bpf_ktime_get_ns();
    struct verbs_call *outer = calls.lookup(&key);
    /* inside a call of the family: deeper, or tail-called at the same depth */
    if (outer && outer->depth && outer->sp >= sp && now - outer->ts < NEST_WINDOW_NS) {
        outer->depth++;
        return 0;
    }
    u32 zero = 0;
    struct verbs_call *c = scratch.lookup(&zero);
    if (!c)
        return 0;
    __builtin_memset(c, 0, sizeof(*c));
    c->ts = now;
    c->sp = sp;
    c->pid = id >> 32;
    c->tid = (u32)id;
    c->op = op;
    c->depth = 1;
    c->object = PT_REGS_PARM1(ctx);
    u64 device = 0;
    if (arg == ARG_DEVICE)
        device = c->object;
    else if (arg == ARG_CONTEXT)
        device = read_pointer(c->object + OBJECT_CONTEXT);
    else if (arg == ARG_CHILD)
        device = read_pointer(read_pointer(c->object + OBJECT_CONTEXT) + OBJECT_CONTEXT);
    if (device)
        bpf_probe_read_user_str(c->device, sizeof(c->device), (void *)(device + DEVICE_NAME));
    if (what == READ_LENGTH_ARG)
        c->length = PT_REGS_PARM3(ctx);
    else if (what == READ_MR_LENGTH)
        bpf_probe_read_user(&c->length, sizeof(c->length), (void *)(c->object + MR_LENGTH));
    else if (what == READ_QP || what == READ_QP_ATTR)
        read_qp(c, c->object);
    if (what == READ_QP_ATTR) {
        c->attr_mask = PT_REGS_PARM3(ctx);
        read_attr(c, PT_REGS_PARM2(ctx));
    }
    calls.update(&key, c);
    return 0;
}

static __always_inline int verb_return(struct pt_regs *ctx, u16 family, int what) {
    u64 id = current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    u64 key = (id & 0xffffffff) << 8 | family;
    struct verbs_call *c = calls.lookup(&key);
    if (!c || !c->depth) {
        count(STAT_NO_ENTRY);
        return 0;
    }
    if (--c->depth)  /* an inner call of the family returned: the outer one reports */
        return 0;
    c->duration_ns = bpf_ktime_get_ns() - c->ts;
    c->ret = PT_REGS_RC(ctx);
    if (c->ret && what == READ_NEW_QP)
        read_qp(c, c->ret);
    if (verbs_events.ringbuf_output(c, sizeof(*c), 0))
        count(STAT_RINGBUF_FULL);
    return 0;
}

/* VERB(symbol, op, family, what the first argument is, what else to read) */
#define VERB(name, op, family, arg, what)                                                           \
    int enter_##name(struct pt_regs *ctx) { return verb_enter(ctx, op, family, arg, what); }       \
    int return_##name(struct pt_regs *ctx) { return verb_return(ctx, family, what); }

VERB(ibv_get_device_list, 0, 0, ARG_NONE, READ_NONE)
VERB(ibv_open_device, 1, 1, ARG_DEVICE, READ_NONE)
VERB(ibv_close_device, 2, 2, ARG_CONTEXT, READ_NONE)
VERB(ibv_alloc_pd, 3, 3, ARG_CONTEXT, READ_NONE)
VERB(ibv_dealloc_pd, 4, 4, ARG_CHILD, READ_NONE)
VERB(ibv_reg_mr, 5, 5, ARG_CHILD, READ_LENGTH_ARG)
VERB(ibv_reg_mr_iova, 6, 5, ARG_CHILD, READ_LENGTH_ARG)
VERB(ibv_reg_mr_iova2, 7, 5, ARG_CHILD, READ_LENGTH_ARG)
VERB(ibv_reg_dmabuf_mr, 8, 5, ARG_CHILD, READ_LENGTH_ARG)
VERB(ibv_dereg_mr, 9, 9, ARG_CHILD, READ_MR_LENGTH)
VERB(ibv_create_cq, 10, 10, ARG_CONTEXT, READ_NONE)
VERB(ibv_destroy_cq, 11, 11, ARG_CHILD, READ_NONE)
VERB(ibv_create_qp, 12, 12, ARG_CHILD, READ_NEW_QP)
VERB(ibv_modify_qp, 13, 13, ARG_CHILD, READ_QP_ATTR)
VERB(ibv_destroy_qp, 14, 14, ARG_CHILD, READ_QP)
