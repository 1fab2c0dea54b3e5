/* cpu_profile.c — on-CPU sampling: one ring-buffer record per perf-event sample of a target thread,
 * with its kernel and user stacks (frame-pointer unwinding by the kernel) and its CPython frames
 * (python_stack.h). Aggregation, symbolization and the merge happen in user space
 * (otel_ebpf/probes/cpu.py, otel_ebpf/profiles/).
 *
 * Stacks go into the record itself (bpf_get_stack) rather than a BPF_STACK_TRACE map: a stack id
 * can be overwritten before user space reads it, a record cannot.
 */
#include <uapi/linux/ptrace.h>
#include <uapi/linux/bpf_perf_event.h>
#include <linux/sched.h>

#include "current_task.h"
#include "python_stack.h"

#ifndef USER_FRAMES
#define USER_FRAMES 64
#endif
#ifndef KERNEL_FRAMES
#define KERNEL_FRAMES 32
#endif
#ifndef MAX_TARGETS
#define MAX_TARGETS 1024
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 64
#endif

#define NSETTINGS 2 /* settings[]: targets.h's two */

/* drops[] (per CPU) */
#define DROP_RINGBUF 0  /* ring buffer full: the sample is lost */
#define DROP_PY_TRUNC 1 /* Python stack deeper than PY_MAX_FRAMES */
#define DROP_COUNT 2

struct sample {
    u64 ts;        /* CLOCK_MONOTONIC ns */
    u32 pid;       /* tgid */
    u32 tid;
    u32 cpu;
    s32 user_len;  /* bytes of user[] filled, or a negative errno */
    s32 kern_len;  /* bytes of kern[] filled, or a negative errno */
    u32 _pad;
    char comm[16];
    u64 user[USER_FRAMES];
    u64 kern[KERNEL_FRAMES];
    struct py_stack py;
};

BPF_RINGBUF_OUTPUT(samples, RINGBUF_PAGES);
#include "targets.h"
BPF_PERCPU_ARRAY(drops, u64, DROP_COUNT);

static __always_inline void count_drop(int reason) {
    u64 *n = drops.lookup(&reason);
    if (n)
        (*n)++;
}

int on_sample(struct bpf_perf_event_data *ctx) {
    u64 id = current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!traced_process(tgid)) /* idle (0), the agent itself, or not a target */
        return 0;
    struct sample *s = samples.ringbuf_reserve(sizeof(struct sample));
    if (!s) {
        count_drop(DROP_RINGBUF);
        return 0;
    }
    s->ts = bpf_ktime_get_ns();
    s->pid = tgid;
    s->tid = tid;
    s->cpu = bpf_get_smp_processor_id();
    s->_pad = 0;
    bpf_get_current_comm(&s->comm, sizeof(s->comm));
    s->kern_len = bpf_get_stack(ctx, s->kern, sizeof(s->kern), 0);
    s->user_len = bpf_get_stack(ctx, s->user, sizeof(s->user), BPF_F_USER_STACK);
    if (py_read_stack(tgid, tid, &s->py) == PY_STATUS_TRUNCATED)
        count_drop(DROP_PY_TRUNC);
    samples.ringbuf_submit(s, 0);
    return 0;
}
