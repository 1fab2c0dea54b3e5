// The current task's ids as the agent sees them: (tgid << 32 | pid), like bpf_get_current_pid_tgid.
//
// An agent in a pod's PID namespace (sidecar mode: shareProcessNamespace, no hostPID) knows its
// processes by that namespace's pids, in its /proc and on its command line; the kernel's helpers
// give host pids. Built with PIDNS_DEV and PIDNS_INO (the namespace's nsfs device and inode), the
// programs see the namespace's pids instead, and a task of any other namespace (another pod, the
// node) reads as 0, which no program traces: the namespace is the target, chosen in the kernel.
#ifdef PIDNS_INO
static __always_inline u64 current_pid_tgid(void) {
    struct bpf_pidns_info ns = {};
    if (bpf_get_ns_current_pid_tgid(PIDNS_DEV, PIDNS_INO, &ns, sizeof(ns)))
        return 0;
    return (u64)ns.tgid << 32 | ns.pid;
}
#else
static __always_inline u64 current_pid_tgid(void) { return bpf_get_current_pid_tgid(); }
#endif
