/* gpu_trace.c — CUDA runtime/driver, NCCL and PyTorch allocator calls, with the caller's stacks.
 *
 * Every hooked function gets an entry program (uprobe) and a return program (uretprobe), both
 * generated per operation by the CALL() macro below, so each knows its operation id at compile
 * time. Nothing about the call is interpreted here — user space (otel_ebpf/gpu/) decodes the raw
 * arguments by operation:
 *
 *   entry   filter the process; skip calls made inside another probed call of the same thread
 *           (cudaMalloc -> cuMemAlloc_v2 must count once); send an entry record with the raw
 *           register arguments, the native user stack and the CPython stack (python_stack.h),
 *           only as many frames as there are; keep (entry time, stack pointer, first argument)
 *           in calls[tid, op]
 *   return  send a small return record: the entry time (user space pairs the two on
 *           (tid, op, entry time)), the return code, the duration and, for functions that
 *           return through an out-pointer (cudaMalloc(void **p, ...), ncclCommInitRank(ncclComm_t
 *           *c, ...)), the value it points to; for functions that name a kernel
 *           (cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)), also the name
 *
 * Two records rather than one kept in a map until the return: the stacks (up to ~2 KB) are
 * copied once, straight from the per-CPU scratch into the ring buffer, instead of three times.
 *
 * PyTorch's allocator probes (USDT pytorch:malloc / pytorch:free) have no return: they emit at
 * once. Where USDT arguments live ("8@%rax", "-4@-20(%rbp)") depends on the build, so user space
 * reads each library's notes and fills usdt_specs[slot]; each slot has its own programs.
 *
 * Only user memory is read, never a kernel struct field; loops are bounded.
 * Compile-time sizes: RINGBUF_PAGES, MAX_TARGETS, MAX_CALLS, USER_FRAMES, PY_MAX_FRAMES.
 */
#include <uapi/linux/ptrace.h>
#include "current_task.h"

#ifdef PYTHON_STACKS
#include "python_stack.h"
#define PY_FRAME_SIZE sizeof(struct py_frame)
#else
/* Built without Python stacks (python_stack.h did not load here): the same record, no frames. */
#define PY_STATUS_NOT_PYTHON 0
#define PY_STATUS_TRUNCATED 3
#define PY_MAX_FRAMES 0
struct py_stack {
    u32 depth;
    u32 status;
};
static __always_inline int py_read_stack(u32 tgid, u32 tid, struct py_stack *out) { return 0; }
#define PY_FRAME_SIZE 0
#endif

#ifndef USER_FRAMES
#define USER_FRAMES 32
#endif
#ifndef MAX_TARGETS
#define MAX_TARGETS 1024
#endif
#ifndef MAX_CALLS
#define MAX_CALLS 4096
#endif
#ifndef PY_NATIVE_FRAMES
#define PY_NATIVE_FRAMES 12
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 256
#endif
#ifndef KERNEL_NAME_LEN
#define KERNEL_NAME_LEN 1024  /* mangled kernel names: templates run to hundreds of bytes */
#endif

/* settings[] (0 and 1: targets.h) */
#define SET_STACKS 2      /* bit 0: native user stacks, bit 1: Python stacks */
#define NSETTINGS 3

/* stats[] (per CPU), mirrored by STAT_NAMES in otel_ebpf/probes/gpu.py */
#define STAT_RINGBUF_FULL 0  /* calls lost: ring buffer full */
#define STAT_NESTED 1        /* calls made inside another probed call (counted once, by the outer) */
#define STAT_NO_ENTRY 2      /* returns whose entry was not kept (attached mid-call, table full) */
#define STAT_PY_TRUNCATED 3  /* Python stacks deeper than PY_MAX_FRAMES (root frames missing) */
#define STAT_COUNT 4

/* event.flags */
#define FLAG_USDT 1          /* no return: duration and ret are not meaningful */
#define FLAG_ENTRY 2         /* a call's entry: its return record follows */
#define FLAG_RETURN 4        /* struct gpu_return */
#define FLAG_NAME 8          /* struct gpu_named_return: a gpu_return and a kernel's name */

/* CALL()'s return modes */
#define RET_PLAIN 0
#define RET_OUT 1            /* read the out-pointer args[0] after a successful call */
#define RET_OUT_NAME 2       /* that, and the string args[2] points to */
#define RET_OUT_2ND 3        /* read the out-pointer args[1] (cudaStreamEndCapture(stream, &graph)) */

/* layers: a call inside a runtime/driver call is the library's own business (skipped); a CUDA
 * call inside an NCCL call is NCCL launching work (kept). */
#define LAYER_CUDA 1
#define LAYER_NCCL 2

struct gpu_event {
    u64 ts;           /* entry, CLOCK_MONOTONIC ns */
    u64 duration_ns;  /* entry to return */
    u32 pid;
    u32 tid;
    u32 op;           /* OP_* of otel_ebpf/gpu/calls.py */
    s32 ret;          /* cudaError_t / CUresult / ncclResult_t */
    u32 flags;
    s32 user_len;     /* bytes of user[] filled, or a negative errno */
    u64 args[7];      /* raw: the six register arguments and the first stack argument */
    u64 out;          /* *(u64 *)args[0] after a successful out-pointer call */
    u64 user[USER_FRAMES];
    struct py_stack py;
};

/* The return of a call whose entry record was sent; the header is gpu_event's. */
struct gpu_return {
    u64 ts;           /* the entry's */
    u64 duration_ns;
    u32 pid;
    u32 tid;
    u32 op;
    s32 ret;
    u32 flags;        /* FLAG_RETURN */
    s32 _pad;
    u64 out;
};

/* The return of a call that names a kernel: the name is read at the return, where the caller's
 * string is still alive; sent only when the call succeeded (the handle is good). */
struct gpu_named_return {
    struct gpu_return r;
    char name[KERNEL_NAME_LEN];  /* NUL-terminated; a longer name is cut */
};

struct inflight {
    u64 ts;
    u64 sp;     /* at entry: recognises the outer call at its return */
    u64 outp;   /* the out-pointer: the first argument (allocations), or the second (RET_OUT_2ND) */
    u64 name;   /* the third argument: the kernel name of RET_OUT_NAME calls */
};

struct outer_call {
    u64 sp;     /* stack pointer at entry: deeper calls on this thread are nested in it */
    u32 layer;
    u32 _pad;
};

struct usdt_arg {
    u8 kind;    /* 0 none, 1 register, 2 memory at register + offset, 3 constant */
    u8 reg;     /* REG_* below */
    u8 _pad[6];
    s64 value;  /* offset (memory) or the constant */
};

struct usdt_spec {
    struct usdt_arg args[4];
};

BPF_RINGBUF_OUTPUT(gpu_events, RINGBUF_PAGES);
#define TARGETS_FOLLOW_FORKS
#include "targets.h"
BPF_PERCPU_ARRAY(stats, u64, STAT_COUNT);
BPF_PERCPU_ARRAY(scratch, struct gpu_event, 1);
/* calls and outer keep one entry per thread (and op) once made, rewritten in place: a call marks
 * its return by zeroing ts / sp rather than deleting, so the hot path makes no hash insert or
 * delete (an LRU insert + delete pair is several times the cost of a lookup). Stale entries of
 * gone threads age out of the LRU. */
BPF_TABLE("lru_hash", u64, struct inflight, calls, MAX_CALLS);  /* (tid << 8 | op) -> call in flight; ts 0: none */
BPF_TABLE("lru_hash", u32, struct outer_call, outer, MAX_CALLS);  /* tid -> outermost call; sp 0: none */
BPF_TABLE("lru_hash", u64, u8, nested, MAX_CALLS);                 /* nested calls in flight: 1 */
BPF_ARRAY(usdt_specs, struct usdt_spec, 16);                       /* slot * 2 + (0 malloc, 1 free) */

static __always_inline void count(u32 slot) {
    u64 *n = stats.lookup(&slot);
    if (n)
        (*n)++;
}

/* Stacks and identity into *e (the per-CPU scratch or a ring-buffer record). */
static __always_inline void fill_caller(struct pt_regs *ctx, struct gpu_event *e, u64 id, u32 op) {
    u32 stacks = setting(SET_STACKS);
    e->ts = bpf_ktime_get_ns();
    e->duration_ns = 0;
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->op = op;
    e->ret = 0;
    e->flags = 0;
    e->out = 0;
    e->py.depth = 0;
    e->py.status = PY_STATUS_NOT_PYTHON;
    if ((stacks & 2) && py_read_stack(e->pid, e->tid, &e->py) == PY_STATUS_TRUNCATED)
        count(STAT_PY_TRUNCATED);
    /* Under a Python stack only the native frames between the interpreter and the CUDA call
     * matter (libffi, an extension module): unwinding further costs per frame and, through an
     * interpreter built without frame pointers, yields garbage the merge drops anyway. */
    u32 size = e->py.depth ? PY_NATIVE_FRAMES * 8 : sizeof(e->user);
    e->user_len = (stacks & 1) ? bpf_get_stack(ctx, e->user, size, BPF_F_USER_STACK) : 0;
}

/* What args[6] holds: the 7th argument (on the stack), a later one, or a field the first or
 * third argument points to. */
#define ARG6_NONE 0
#define ARG6_STACK 1           /* the 7th argument */
#define ARG6_PROP_LOCATION 2   /* cuMemCreate: prop->location {type, id}, the device of the memory */
#define ARG6_STACK_8TH 3       /* cudaLaunchKernel's stream: each dim3 takes two registers */
#define ARG6_STACK_9TH 4       /* cuLaunchKernel's hStream */
#define ARG6_CONFIG_STREAM 5   /* cuLaunchKernelEx: config->hStream */
#define PROP_LOCATION_OFFSET 8  /* cuda.h: {type, requestedHandleTypes, location {type, id}, ...} */
#define CONFIG_STREAM_OFFSET 32 /* cuda.h: CUlaunchConfig {7 unsigned ints, CUstream hStream, ...} */

/* Where args[6] is read from at entry (sp: the stack pointer, pointing at the return address). */
static __always_inline u64 arg6_address(int arg6, u64 sp, struct gpu_event *e) {
    if (arg6 == ARG6_STACK)
        return sp + 8;
    if (arg6 == ARG6_STACK_8TH)
        return sp + 16;
    if (arg6 == ARG6_STACK_9TH)
        return sp + 24;
    if (arg6 == ARG6_PROP_LOCATION)
        return e->args[2] + PROP_LOCATION_OFFSET;
    if (arg6 == ARG6_CONFIG_STREAM)
        return e->args[0] + CONFIG_STREAM_OFFSET;
    return 0;
}

static __always_inline int call_enter(struct pt_regs *ctx, u32 op, u32 layer, int arg6, int ret_mode) {
    u64 id = current_pid_tgid();
    if (!traced_process(id >> 32))
        return 0;
    u32 tid = (u32)id;
    u64 sp = PT_REGS_SP(ctx);
    struct outer_call *o = outer.lookup(&tid);
    u64 key = ((u64)tid << 8) | op;
    /* Inside a probed call still running on this thread: deeper on the stack, or at the same
     * depth when the outer function tail-called this one (cudaMalloc -> jmp cuMemAlloc_v2). */
    if (o && o->sp >= sp) {
        if (o->layer != LAYER_NCCL) {
            count(STAT_NESTED);
            u8 *mark = nested.lookup(&key);  /* so that its return is not taken for a lost entry */
            if (mark) {
                *mark = 1;
            } else {
                u8 one = 1;
                nested.update(&key, &one);
            }
            return 0;
        }
    } else if (o) {  /* the outermost call: none running (sp 0), or an older one returned unseen */
        o->sp = sp;
        o->layer = layer;
    } else {
        struct outer_call mine = {.sp = sp, .layer = layer};
        outer.update(&tid, &mine);
    }
    u32 zero = 0;
    struct gpu_event *e = scratch.lookup(&zero);
    if (!e)
        return 0;
    fill_caller(ctx, e, id, op);
    e->args[0] = PT_REGS_PARM1(ctx);
    e->args[1] = PT_REGS_PARM2(ctx);
    e->args[2] = PT_REGS_PARM3(ctx);
    e->args[3] = PT_REGS_PARM4(ctx);
    e->args[4] = PT_REGS_PARM5(ctx);
    e->args[5] = PT_REGS_PARM6(ctx);
    e->args[6] = 0;
    u64 at = arg6_address(arg6, sp, e);
    if (at)
        bpf_probe_read_user(&e->args[6], sizeof(u64), (void *)at);
    e->flags = FLAG_ENTRY;
    /* Only the Python frames there are: the record is the scratch, cut after them. */
    u32 depth = e->py.depth;
    if (depth > PY_MAX_FRAMES)
        depth = PY_MAX_FRAMES;
    u64 size = sizeof(*e) - (PY_MAX_FRAMES - depth) * PY_FRAME_SIZE;
    __asm__ __volatile__("" : "+r"(size));  /* keep the bound below a runtime check the verifier sees */
    if (size > sizeof(*e))
        size = sizeof(*e);
    if (gpu_events.ringbuf_output(e, size, BPF_RB_NO_WAKEUP) != 0) {
        count(STAT_RINGBUF_FULL);
        /* No entry, no return record either, and so no return to release the thread's outer
         * mark: release it here, or every later call at this depth would look nested in it. */
        struct outer_call *mine = outer.lookup(&tid);
        if (mine && mine->sp == sp)
            mine->sp = 0;
        return 0;
    }
    u64 outp = ret_mode == RET_OUT_2ND ? e->args[1] : e->args[0];
    struct inflight *slot = calls.lookup(&key);
    if (slot) {
        slot->ts = e->ts;
        slot->sp = sp;
        slot->outp = outp;
        slot->name = e->args[2];
    } else {
        struct inflight call = {.ts = e->ts, .sp = sp, .outp = outp, .name = e->args[2]};
        calls.update(&key, &call);
    }
    return 0;
}

/* r with the kernel name at namep, as one record. */
static __always_inline void send_named(struct gpu_return *r, u64 namep) {
    struct gpu_named_return *n = gpu_events.ringbuf_reserve(sizeof(*n));
    if (!n) {
        count(STAT_RINGBUF_FULL);
        return;
    }
    n->r = *r;
    n->r.flags |= FLAG_NAME;
    if (bpf_probe_read_user_str(n->name, sizeof(n->name), (void *)namep) < 0)
        n->name[0] = 0;
    gpu_events.ringbuf_submit(n, 0);
}

static __always_inline int call_return(struct pt_regs *ctx, u32 op, int ret_mode) {
    u64 id = current_pid_tgid();
    u32 tid = (u32)id;
    u64 key = ((u64)tid << 8) | op;
    struct inflight *call = calls.lookup(&key);
    if (!call || !call->ts) {
        u8 *mark = nested.lookup(&key);
        if (mark && *mark)
            *mark = 0;  /* in place, as calls and outer */
        else if (traced_process(id >> 32))
            count(STAT_NO_ENTRY);
        return 0;
    }
    struct outer_call *o = outer.lookup(&tid);
    if (o && o->sp == call->sp)
        o->sp = 0;  /* no outer call running on this thread (see outer) */
    struct gpu_return r = {.ts = call->ts, .pid = id >> 32, .tid = tid, .op = op, .flags = FLAG_RETURN};
    r.duration_ns = bpf_ktime_get_ns() - call->ts;
    r.ret = (s32)PT_REGS_RC(ctx);  /* the error enums are ints: the upper half is not theirs */
    if (ret_mode != RET_PLAIN && r.ret == 0)
        bpf_probe_read_user(&r.out, sizeof(u64), (void *)call->outp);
    call->ts = 0;  /* returned (see calls) */
    if (ret_mode == RET_OUT_NAME && r.ret == 0)
        send_named(&r, call->name);
    else if (gpu_events.ringbuf_output(&r, sizeof(r), 0) != 0)
        count(STAT_RINGBUF_FULL);
    return 0;
}

/* CALL(name, op, layer, what args[6] holds (ARG6_*; 1: the 7th argument), what the return reads
 * (RET_*; 0: nothing, 1: the out-pointer args[0])) */
#define CALL(name, op, layer, arg6, ret_mode)                                                       \
    int enter_##name(struct pt_regs *ctx) { return call_enter(ctx, op, layer, arg6, ret_mode); }  \
    int return_##name(struct pt_regs *ctx) { return call_return(ctx, op, ret_mode); }

/* Operation ids: keep in step with otel_ebpf/gpu/calls.py */
CALL(cudaMalloc, 1, LAYER_CUDA, 0, 1)
CALL(cudaFree, 2, LAYER_CUDA, 0, 0)
CALL(cudaMallocAsync, 3, LAYER_CUDA, 0, 1)
CALL(cudaFreeAsync, 4, LAYER_CUDA, 0, 0)
CALL(cuMemAlloc_v2, 5, LAYER_CUDA, 0, 1)
CALL(cuMemFree_v2, 6, LAYER_CUDA, 0, 0)
CALL(cuMemAllocAsync, 7, LAYER_CUDA, 0, 1)
CALL(cuMemFreeAsync, 8, LAYER_CUDA, 0, 0)
CALL(cuMemCreate, 11, LAYER_CUDA, ARG6_PROP_LOCATION, 1)
CALL(cuMemRelease, 12, LAYER_CUDA, 0, 0)
CALL(cuMemAddressReserve, 13, LAYER_CUDA, 0, 1)
CALL(cuMemAddressFree, 14, LAYER_CUDA, 0, 0)
CALL(cuMemMap, 15, LAYER_CUDA, 0, 0)
CALL(cuMemUnmap, 16, LAYER_CUDA, 0, 0)
CALL(cudaMallocManaged, 80, LAYER_CUDA, 0, 1)
CALL(cudaMallocHost, 81, LAYER_CUDA, 0, 1)
CALL(cudaHostAlloc, 82, LAYER_CUDA, 0, 1)
CALL(cudaFreeHost, 83, LAYER_CUDA, 0, 0)
CALL(cuMemAllocManaged, 84, LAYER_CUDA, 0, 1)
CALL(cuMemAllocHost_v2, 85, LAYER_CUDA, 0, 1)
CALL(cuMemHostAlloc, 86, LAYER_CUDA, 0, 1)
CALL(cuMemFreeHost, 87, LAYER_CUDA, 0, 0)
CALL(cudaMallocFromPoolAsync, 88, LAYER_CUDA, 0, 1)
CALL(cuMemAllocFromPoolAsync, 89, LAYER_CUDA, 0, 1)
CALL(cudaMemcpy, 20, LAYER_CUDA, 0, 0)
CALL(cudaMemcpyAsync, 21, LAYER_CUDA, 0, 0)
CALL(cuMemcpyHtoD_v2, 22, LAYER_CUDA, 0, 0)
CALL(cuMemcpyDtoH_v2, 23, LAYER_CUDA, 0, 0)
CALL(cuMemcpyDtoD_v2, 24, LAYER_CUDA, 0, 0)
CALL(cuMemcpyHtoDAsync_v2, 25, LAYER_CUDA, 0, 0)
CALL(cuMemcpyDtoHAsync_v2, 26, LAYER_CUDA, 0, 0)
CALL(cuMemcpy, 27, LAYER_CUDA, 0, 0)
CALL(cuMemcpyAsync, 28, LAYER_CUDA, 0, 0)
CALL(cudaDeviceSynchronize, 30, LAYER_CUDA, 0, 0)
CALL(cudaStreamSynchronize, 31, LAYER_CUDA, 0, 0)
CALL(cuCtxSynchronize, 32, LAYER_CUDA, 0, 0)
CALL(cuStreamSynchronize, 33, LAYER_CUDA, 0, 0)
CALL(cudaLaunchKernel, 40, LAYER_CUDA, ARG6_STACK_8TH, 0)
CALL(cuLaunchKernel, 41, LAYER_CUDA, ARG6_STACK_9TH, 0)
CALL(cuLaunchKernelEx, 42, LAYER_CUDA, ARG6_CONFIG_STREAM, 0)
CALL(cuModuleGetFunction, 43, LAYER_CUDA, 0, RET_OUT_NAME)
CALL(cuLibraryGetKernel, 44, LAYER_CUDA, 0, RET_OUT_NAME)
CALL(cuKernelGetFunction, 45, LAYER_CUDA, 0, RET_OUT)
CALL(cudaGraphCreate, 90, LAYER_CUDA, 0, RET_OUT)
CALL(cuGraphCreate, 91, LAYER_CUDA, 0, RET_OUT)
CALL(cudaGraphAddKernelNode, 92, LAYER_CUDA, 0, 0)
CALL(cuGraphAddKernelNode, 93, LAYER_CUDA, 0, 0)
CALL(cuGraphAddKernelNode_v2, 94, LAYER_CUDA, 0, 0)
CALL(cudaGraphAddChildGraphNode, 95, LAYER_CUDA, 0, 0)
CALL(cuGraphAddChildGraphNode, 96, LAYER_CUDA, 0, 0)
CALL(cudaGraphAddNode, 97, LAYER_CUDA, 0, 0)
CALL(cuGraphAddNode, 98, LAYER_CUDA, 0, 0)
CALL(cuGraphAddNode_v2, 99, LAYER_CUDA, 0, 0)
CALL(cudaGraphAddNode_v2, 117, LAYER_CUDA, 0, 0)
CALL(cudaGraphInstantiate, 100, LAYER_CUDA, 0, RET_OUT)
CALL(cudaGraphInstantiateWithFlags, 101, LAYER_CUDA, 0, RET_OUT)
CALL(cudaGraphInstantiateWithParams, 102, LAYER_CUDA, 0, RET_OUT)
CALL(cuGraphInstantiateWithFlags, 103, LAYER_CUDA, 0, RET_OUT)
CALL(cuGraphInstantiate_v2, 104, LAYER_CUDA, 0, RET_OUT)
CALL(cuGraphInstantiateWithParams, 105, LAYER_CUDA, 0, RET_OUT)
CALL(cudaGraphLaunch, 106, LAYER_CUDA, 0, 0)
CALL(cuGraphLaunch, 107, LAYER_CUDA, 0, 0)
CALL(cudaGraphDestroy, 108, LAYER_CUDA, 0, 0)
CALL(cuGraphDestroy, 109, LAYER_CUDA, 0, 0)
CALL(cudaGraphExecDestroy, 110, LAYER_CUDA, 0, 0)
CALL(cuGraphExecDestroy, 111, LAYER_CUDA, 0, 0)
CALL(cudaStreamBeginCapture, 112, LAYER_CUDA, 0, 0)
CALL(cuStreamBeginCapture, 113, LAYER_CUDA, 0, 0)
CALL(cuStreamBeginCapture_v2, 114, LAYER_CUDA, 0, 0)
CALL(cudaStreamEndCapture, 115, LAYER_CUDA, 0, RET_OUT_2ND)
CALL(cuStreamEndCapture, 116, LAYER_CUDA, 0, RET_OUT_2ND)
CALL(cudaSetDevice, 50, LAYER_CUDA, 0, 0)
CALL(ncclAllReduce, 60, LAYER_NCCL, 0, 0)
CALL(ncclBroadcast, 61, LAYER_NCCL, 0, 0)
CALL(ncclReduce, 62, LAYER_NCCL, 1, 0)
CALL(ncclAllGather, 63, LAYER_NCCL, 0, 0)
CALL(ncclReduceScatter, 64, LAYER_NCCL, 0, 0)
CALL(ncclSend, 65, LAYER_NCCL, 0, 0)
CALL(ncclRecv, 66, LAYER_NCCL, 0, 0)
CALL(ncclGroupStart, 67, LAYER_NCCL, 0, 0)
CALL(ncclGroupEnd, 68, LAYER_NCCL, 0, 0)
CALL(ncclCommInitRank, 69, LAYER_NCCL, 0, 1)
CALL(ncclCommInitRankConfig, 70, LAYER_NCCL, 0, 1)
CALL(ncclCommDestroy, 71, LAYER_NCCL, 0, 0)

/* ---- USDT ------------------------------------------------------------------------------------ */

/* x86-64 registers as numbered by otel_ebpf/probes/gpu.py (USDT_REGISTERS) */
static __always_inline u64 reg_value(struct pt_regs *ctx, u8 reg) {
    /* Fixed-offset reads of the context only (the verifier refuses a computed offset), then an
     * index into a stack copy. */
    u64 regs[17] = {ctx->ax, ctx->bx, ctx->cx, ctx->dx, ctx->si, ctx->di, ctx->bp, ctx->sp, ctx->r8,
                    ctx->r9, ctx->r10, ctx->r11, ctx->r12, ctx->r13, ctx->r14, ctx->r15, ctx->ip};
    return reg < 17 ? regs[reg] : 0;
}

/* The raw 8 bytes of one USDT argument; user space applies its size and sign. */
static __always_inline u64 usdt_arg(struct pt_regs *ctx, struct usdt_arg *a) {
    u64 v = 0;
    if (a->kind == 1)
        return reg_value(ctx, a->reg);
    if (a->kind == 2)
        bpf_probe_read_user(&v, sizeof(v), (void *)(reg_value(ctx, a->reg) + a->value));
    else if (a->kind == 3)
        v = a->value;
    return v;
}

static __always_inline int usdt_event(struct pt_regs *ctx, u32 op, u32 spec_key) {
    u64 id = current_pid_tgid();
    if (!traced_process(id >> 32))
        return 0;
    struct usdt_spec *spec = usdt_specs.lookup(&spec_key);
    if (!spec)
        return 0;
    struct gpu_event *e = gpu_events.ringbuf_reserve(sizeof(struct gpu_event));
    if (!e) {
        count(STAT_RINGBUF_FULL);
        return 0;
    }
    fill_caller(ctx, e, id, op);
    e->flags = FLAG_USDT;
    e->args[0] = usdt_arg(ctx, &spec->args[0]);
    e->args[1] = usdt_arg(ctx, &spec->args[1]);
    e->args[2] = usdt_arg(ctx, &spec->args[2]);
    e->args[3] = usdt_arg(ctx, &spec->args[3]);
    e->args[4] = 0;
    e->args[5] = 0;
    e->args[6] = 0;
    gpu_events.ringbuf_submit(e, 0);
    return 0;
}

#define USDT_SLOT(n)                                                                   \
    int usdt_torch_malloc_##n(struct pt_regs *ctx) { return usdt_event(ctx, 9, n * 2); }  \
    int usdt_torch_free_##n(struct pt_regs *ctx) { return usdt_event(ctx, 10, n * 2 + 1); }

USDT_SLOT(0)
USDT_SLOT(1)
USDT_SLOT(2)
USDT_SLOT(3)
USDT_SLOT(4)
USDT_SLOT(5)
USDT_SLOT(6)
USDT_SLOT(7)

/* ---- processes ------------------------------------------------------------------------------- */

/* A new image may map GPU libraries: user space rescans its maps at once (op 0, no stacks). A
 * process exiting takes its device memory with it (op 255). Execs of every process are reported
 * (they are rare, and one may be a new target by its executable's name); exits only of targets. */
static __always_inline void process_event(u32 op, int any) {
    u64 id = current_pid_tgid();
    if (!id || (!traced_process(id >> 32) && !any))  /* 0: outside the agent's PID namespace */
        return;
    struct gpu_event *e = gpu_events.ringbuf_reserve(sizeof(struct gpu_event));
    if (!e) {
        count(STAT_RINGBUF_FULL);
        return;
    }
    __builtin_memset(e, 0, 104);  /* the header and arguments; stacks stay unread */
    e->ts = bpf_ktime_get_ns();
    e->pid = id >> 32;
    e->tid = (u32)id;
    e->op = op;
    e->user_len = 0;
    e->py.depth = 0;
    gpu_events.ringbuf_submit(e, 0);
}

TRACEPOINT_PROBE(sched, sched_process_exec) {
    process_event(0, 1);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = current_pid_tgid();
    u32 tgid = id >> 32, tid = id;
    if (tid != tgid) {  /* a thread, not the process: sched_process_fork entered its id (targets.h) */
        targets.delete(&tid);
        return 0;
    }
    process_event(255, 0);
    return 0;
}
