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
 * The data path (below the control path): verbs.h's ibv_post_send, ibv_post_recv and ibv_poll_cq
 * are inline and call the provider's functions through ctx->ops; the records above carry those
 * addresses and user space hooks them (otel_ebpf/probes/verbs.py). Work requests and completions
 * are many: they are counted here, in per-CPU tables user space reads each metrics interval, and
 * never sent one by one — except in the processes user space names in post_pids (those that map
 * NCCL): there each post call also sends one small record (its queue pair, time, work requests
 * and bytes), so that user space can tell which queue pairs a collective's window used
 * (otel_ebpf/rdma/collectives.py).
 * Compile-time sizes: RINGBUF_PAGES, POST_RINGBUF_PAGES, MAX_TARGETS, MAX_CALLS, MAX_SERIES, MAX_PENDING.
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
#define CTX_POLL_CQ 96          /* struct ibv_context: ops (struct ibv_context_ops at 8): poll_cq */
#define CTX_POST_SEND 208       /*   ops.post_send, followed by ops.post_recv */

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
#define READ_NEW_CONTEXT 6      /* return: the new context's provider functions */

#define NSETTINGS 2             /* settings[]: targets.h's two */

#define STAT_RINGBUF_FULL 0     /* stats[], mirrored by STAT_NAMES in otel_ebpf/probes/verbs.py */
#define STAT_NO_ENTRY 1         /* returns whose entry was not kept (attached mid-call, table full) */
#define STAT_DATA_TABLE_FULL 2  /* work requests or completions not counted: no room for their series */
#define STAT_PENDING_FULL 3     /* work requests whose completion latency is not measured: pending full */
#define STAT_UNMATCHED 4        /* completions of no pending work request (posted before attach, unsignaled) */
#define STAT_WR_LIST_CUT 5      /* work requests past MAX_WRS in one post: not seen */
#define STAT_SGE_LIST_CUT 6     /* work requests with more than MAX_SGES elements: bytes counted in part */
#define STAT_WC_ARRAY_CUT 7     /* completions past MAX_WCS in one poll: not seen */
#define STAT_POSTS_RINGBUF_FULL 8 /* post records (processes in post_pids) lost: the posts ring was full */
#define STAT_COUNT 9

struct verbs_call {
    u64 ts;             /* entry, CLOCK_MONOTONIC ns */
    u64 duration_ns;
    u64 sp;             /* at entry: an older entry above it on the stack is not an outer call */
    u64 ret;            /* the return value: a pointer, or an int in the low 32 bits */
    u64 object;         /* the first argument: the device, context, pd, mr, cq or qp */
    u64 length;         /* bytes registered / deregistered */
    u64 poll_cq;        /* the context's provider functions (ibv_context.ops), where it has a context */
    u64 post_send;
    u64 post_recv;
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
#include "targets.h"
BPF_PERCPU_ARRAY(stats, u64, STAT_COUNT);
BPF_PERCPU_ARRAY(scratch, struct verbs_call, 1);
BPF_TABLE("lru_hash", u64, struct verbs_call, calls, MAX_CALLS);  /* (tid << 8 | family) -> the call in flight */

static __always_inline void count(u32 slot) {
    u64 *n = stats.lookup(&slot);
    if (n)
        (*n)++;
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

static __always_inline void read_ops(struct verbs_call *c, u64 context) {
    if (!context)
        return;
    bpf_probe_read_user(&c->poll_cq, sizeof(c->poll_cq), (void *)(context + CTX_POLL_CQ));
    bpf_probe_read_user(&c->post_send, 2 * sizeof(u64), (void *)(context + CTX_POST_SEND));
}

static __always_inline int verb_enter(struct pt_regs *ctx, u16 op, u16 family, int arg, int what) {
    u64 id = current_pid_tgid();
    if (!traced_process(id >> 32))
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
    u64 context = 0, device = 0;
    if (arg == ARG_DEVICE)
        device = c->object;
    else if (arg == ARG_CONTEXT)
        context = c->object;
    else if (arg == ARG_CHILD)
        context = read_pointer(c->object + OBJECT_CONTEXT);
    if (context) {  /* its provider functions too: a context opened before the agent attached */
        device = read_pointer(context + OBJECT_CONTEXT);
        read_ops(c, context);
    }
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
    if (!traced_process(id >> 32))
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
    else if (what == READ_NEW_CONTEXT)
        read_ops(c, c->ret);
    if (verbs_events.ringbuf_output(c, sizeof(*c), 0))
        count(STAT_RINGBUF_FULL);
    return 0;
}

/* VERB(symbol, op, family, what the first argument is, what else to read) */
#define VERB(name, op, family, arg, what)                                                           \
    int enter_##name(struct pt_regs *ctx) { return verb_enter(ctx, op, family, arg, what); }       \
    int return_##name(struct pt_regs *ctx) { return verb_return(ctx, family, what); }

VERB(ibv_get_device_list, 0, 0, ARG_NONE, READ_NONE)
VERB(ibv_open_device, 1, 1, ARG_DEVICE, READ_NEW_CONTEXT)
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

/* ---- the data path: the provider's post_send, post_recv (entry) and poll_cq (entry and return) */
#ifndef MAX_SERIES
#define MAX_SERIES 4096
#endif
#ifndef MAX_PENDING
#define MAX_PENDING 16384
#endif
#ifndef POST_RINGBUF_PAGES
#define POST_RINGBUF_PAGES 64
#endif
#define MAX_WRS 32              /* work requests read per post (a list: wr->next) */
#define MAX_SGES 8              /* scatter/gather elements read per work request */
#define MAX_WCS 32              /* completions read per poll */
#define LATENCY_SLOTS 25        /* slot i: up to 1024 ns << i; the last, the rest (otel_ebpf/rdma/datapath.py) */
#define SGE_LENGTH 8            /* struct ibv_sge: addr, length, lkey (16 bytes) */
#define SGE_SIZE 16
#define SEND_WR_HEAD 36         /* struct ibv_send_wr: wr_id, next, sg_list, num_sge, opcode, send_flags */
#define RECV_WR_HEAD 28         /* struct ibv_recv_wr: wr_id, next, sg_list, num_sge */
#define WC_SIZE 48              /* struct ibv_wc: wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, ... */
#define SEND_SIGNALED 2         /* IBV_SEND_SIGNALED: the send queue completes this one */
#define OPCODE_RECV 128         /* IBV_WC_RECV; the posted-receive series */
#define OPCODE_NONE 0xffff      /* an error completion's opcode is not defined (verbs.h) */

struct wr_head {
    u64 wr_id;
    u64 next;
    u64 sg_list;
    s32 num_sge;
    u32 opcode;
    u32 send_flags;
};

struct wc_head {
    u64 wr_id;
    u32 status;
    u32 opcode;
    u32 vendor_err;
    u32 byte_len;
    u32 imm_data;
    u32 qp_num;
};

struct data_key {
    u32 pid;
    u32 qp_num;
    u32 opcode;         /* enum ibv_wr_opcode (posted), OPCODE_RECV; enum ibv_wc_opcode (completed) */
    u32 status;         /* enum ibv_wc_status (completed); 0 (posted) */
};

struct data_counts {
    u64 count;
    u64 bytes;
};

struct pending_key {
    u32 pid;
    u32 qp_num;
    u64 wr_id;
    u32 receive;        /* a receive queue's wr_id is the application's too: the queues are apart */
    u32 _pad;
};

struct qp_key {
    u32 pid;
    u32 qp_num;
};

/* one post call of a process in post_pids: mirrored by POST in otel_ebpf/rdma/collectives.py */
struct post_record {
    u64 ts;             /* entry, CLOCK_MONOTONIC ns */
    u64 bytes;          /* the send queue's work requests' scatter/gather lengths; 0 for receives */
    u32 pid;
    u32 tid;
    u32 qp_num;
    u16 work_requests;  /* read of the list (at most MAX_WRS) */
    u16 receive;
};

struct latency {
    u64 sum_ns;
    u64 min_ns;
    u64 max_ns;
    u64 slots[LATENCY_SLOTS];
};

BPF_PERCPU_HASH(posted, struct data_key, struct data_counts, MAX_SERIES);
BPF_PERCPU_HASH(completed, struct data_key, struct data_counts, MAX_SERIES);
BPF_PERCPU_HASH(latencies, struct qp_key, struct latency, MAX_SERIES);
BPF_HASH(pending, struct pending_key, u64, MAX_PENDING);  /* -> when posted; user space empties an exited process's */
BPF_HASH(polls, u32, u64, MAX_CALLS);                      /* tid -> the ibv_wc array of its poll in flight */
BPF_HASH(post_pids, u32, u8, MAX_TARGETS);                 /* processes whose post calls are also sent */
BPF_RINGBUF_OUTPUT(verbs_posts, POST_RINGBUF_PAGES);

static __always_inline void add(struct data_counts *counts, u64 bytes) {
    if (!counts) {
        count(STAT_DATA_TABLE_FULL);
        return;
    }
    counts->count++;
    counts->bytes += bytes;
}

static __always_inline u64 sge_bytes(u64 sg_list, s32 num_sge) {
    u64 bytes = 0;
    for (int i = 0; i < MAX_SGES; i++) {
        if (i >= num_sge)
            break;
        u32 length = 0;
        bpf_probe_read_user(&length, sizeof(length), (void *)(sg_list + i * SGE_SIZE + SGE_LENGTH));
        bytes += length;
    }
    if (num_sge > MAX_SGES)
        count(STAT_SGE_LIST_CUT);
    return bytes;
}

/* ibv_post_send(qp, wr, bad_wr) / ibv_post_recv(qp, wr, bad_wr): count each work request of the
 * list and remember when it was posted. Counted at entry: a post the provider refuses is counted. */
static __always_inline int post(struct pt_regs *ctx, u32 receive) {
    u64 id = current_pid_tgid();
    if (!traced_process(id >> 32))
        return 0;
    struct data_key key = {.pid = id >> 32, .opcode = OPCODE_RECV};
    bpf_probe_read_user(&key.qp_num, sizeof(key.qp_num), (void *)(PT_REGS_PARM1(ctx) + QP_NUM));
    struct pending_key pend = {.pid = key.pid, .qp_num = key.qp_num, .receive = receive};
    u64 now = bpf_ktime_get_ns();
    u64 wr = PT_REGS_PARM2(ctx);
    u64 sent = 0;
    u16 listed = 0;
    for (int i = 0; i < MAX_WRS && wr; i++) {
        struct wr_head head = {};
        if (receive)
            bpf_probe_read_user(&head, RECV_WR_HEAD, (void *)wr);
        else
            bpf_probe_read_user(&head, SEND_WR_HEAD, (void *)wr);
        if (!receive)
            key.opcode = head.opcode;
        struct data_counts zero_counts = {};
        u64 bytes = sge_bytes(head.sg_list, head.num_sge);
        add(posted.lookup_or_try_init(&key, &zero_counts), bytes);
        listed++;
        if (!receive)
            sent += bytes;
        /* an unsignaled send has no completion of its own (unless the QP signals all: then its
         * completion finds nothing pending, and is counted unmatched) */
        if (receive || head.send_flags & SEND_SIGNALED) {
            pend.wr_id = head.wr_id;
            if (pending.update(&pend, &now))
                count(STAT_PENDING_FULL);
        }
        wr = head.next;
    }
    if (wr)
        count(STAT_WR_LIST_CUT);
    if (!post_pids.lookup(&key.pid))
        return 0;
    struct post_record *r = verbs_posts.ringbuf_reserve(sizeof(*r));
    if (!r) {
        count(STAT_POSTS_RINGBUF_FULL);
        return 0;
    }
    r->ts = now;
    r->bytes = sent;
    r->pid = key.pid;
    r->tid = id;
    r->qp_num = key.qp_num;
    r->work_requests = listed;
    r->receive = receive;
    verbs_posts.ringbuf_submit(r, 0);
    return 0;
}

int enter_post_send(struct pt_regs *ctx) { return post(ctx, 0); }
int enter_post_recv(struct pt_regs *ctx) { return post(ctx, 1); }

/* ibv_poll_cq(cq, num_entries, wc) */
int enter_poll_cq(struct pt_regs *ctx) {
    u64 id = current_pid_tgid();
    if (!traced_process(id >> 32))
        return 0;
    u32 tid = id;
    u64 wc = PT_REGS_PARM3(ctx);
    polls.update(&tid, &wc);
    return 0;
}

static __always_inline void time_completion(struct pending_key *pend, u64 now) {
    u64 *posted_at = pending.lookup(pend);
    if (!posted_at) {
        count(STAT_UNMATCHED);
        return;
    }
    u64 ns = now - *posted_at;
    pending.delete(pend);
    struct qp_key key = {.pid = pend->pid, .qp_num = pend->qp_num};
    struct latency zero_latency = {};
    struct latency *l = latencies.lookup_or_try_init(&key, &zero_latency);
    if (!l) {
        count(STAT_DATA_TABLE_FULL);
        return;
    }
    u64 slot = 0;  /* 64 bits: a 32-bit index is widened again after the check, unbounded to the verifier */
    if (ns > 1024)
        slot = bpf_log2l(ns - 1) - 10;  /* bpf_log2l(v) is floor(log2(v)) + 1 */
    if (slot > LATENCY_SLOTS - 1)
        slot = LATENCY_SLOTS - 1;
    l->slots[slot]++;
    l->sum_ns += ns;
    if (!l->min_ns || ns < l->min_ns)
        l->min_ns = ns;
    if (ns > l->max_ns)
        l->max_ns = ns;
}

int return_poll_cq(struct pt_regs *ctx) {
    u64 id = current_pid_tgid();
    if (!traced_process(id >> 32))
        return 0;
    u32 tid = id;
    u64 *array = polls.lookup(&tid);
    if (!array) {
        count(STAT_NO_ENTRY);
        return 0;
    }
    u64 wc = *array;
    polls.delete(&tid);
    int n = PT_REGS_RC(ctx);  /* completions written; negative: an error */
    if (n <= 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct pending_key pend = {.pid = id >> 32};
    for (int i = 0; i < MAX_WCS; i++) {
        if (i >= n)
            break;
        struct wc_head head = {};
        bpf_probe_read_user(&head, sizeof(head), (void *)(wc + i * WC_SIZE));
        struct data_key key = {.pid = pend.pid, .qp_num = head.qp_num, .opcode = head.opcode, .status = head.status};
        pend.qp_num = head.qp_num;
        pend.wr_id = head.wr_id;
        if (head.status) {  /* failed: only wr_id, status, qp_num and vendor_err are defined */
            key.opcode = OPCODE_NONE;
            pend.receive = 0;
            if (!pending.lookup(&pend))
                pend.receive = 1;
        } else {
            pend.receive = (head.opcode & OPCODE_RECV) != 0;
        }
        struct data_counts zero_counts = {};
        add(completed.lookup_or_try_init(&key, &zero_counts), head.status ? 0 : head.byte_len);
        time_completion(&pend, now);
    }
    if (n > MAX_WCS)
        count(STAT_WC_ARRAY_CUT);
    return 0;
}
