// Which processes a program traces, decided the same way by every program that includes this
// (socket_trace.c, gpu_trace.c, cpu_profile.c, verbs_trace.c): never the agent itself; with
// settings[SET_FILTER_PIDS] only the tgids in targets[], else every process. User space writes the
// two slots below before anything can match (otel_ebpf/probes/loading.py numbers them the same)
// and fills targets[].
//
// Define before including: MAX_TARGETS; NSETTINGS, the size of settings[] (a program numbers its
// own slots from SET_OWN); TARGETS_FOLLOW_FORKS where a target's children are targets too. Include
// after current_task.h.

#define SET_AGENT_TGID 0
#define SET_FILTER_PIDS 1  // 1: only tgids in targets[]; 0: every process but the agent
#define SET_OWN 2          // a program's own slots start here

BPF_HASH(targets, u32, u8, MAX_TARGETS);
BPF_ARRAY(settings, u32, NSETTINGS);

static __always_inline u32 setting(u32 slot) {
    u32 *v = settings.lookup(&slot);
    return v ? *v : 0;
}

// tgid 0: a task outside the agent's PID namespace (current_task.h), which no program traces.
static __always_inline int traced_process(u32 tgid) {
    if (!tgid || tgid == setting(SET_AGENT_TGID))
        return 0;
    return !setting(SET_FILTER_PIDS) || targets.lookup(&tgid) != 0;
}

#ifdef TARGETS_FOLLOW_FORKS
// The forking task's process (any of its threads may fork) passes its membership on: a traced
// launcher's workers are traced too. The tracepoint fires for new threads as well, which it cannot
// tell from processes: their ids enter targets[] too, unused, so the program's sched_process_exit
// deletes a thread's id when the thread exits.
TRACEPOINT_PROBE(sched, sched_process_fork) {
#ifdef PIDNS_INO
    return 0;  // child_pid is a host pid: in a PID namespace the targets are the whole namespace
#endif
    if (!setting(SET_FILTER_PIDS))
        return 0;
    u32 parent = current_pid_tgid() >> 32, child = args->child_pid;
    u8 one = 1;
    if (targets.lookup(&parent))
        targets.update(&child, &one);
    return 0;
}
#endif
