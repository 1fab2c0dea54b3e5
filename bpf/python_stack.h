/* python_stack.h — walk the CPython frame stack of the current thread from any BPF program.
 *
 * Include it from a BCC program (perf event, uprobe, tracepoint) and call
 *
 *     int status = py_read_stack(tgid, tid, &out);   // struct py_stack *out (per-CPU or ring buffer)
 *
 * It fills out->frames[0..out->depth) leaf first, each with the raw words of one interpreter frame
 * (code object, instruction pointer or index, flag bytes), and returns a PY_STATUS_* value. User
 * space (otel_ebpf/profiles/cpython.py, CodeResolver.frames) decodes them into function, file and
 * line by reading the process's memory, and fills the two maps below:
 *
 *   py_procs    tgid -> struct py_proc: where _PyRuntime is and the layout offsets of that
 *               interpreter's version, found at attach time from its ELF (no debug symbols).
 *   py_threads  tid -> PyThreadState*: a cache the walker fills itself (3.11+ match
 *               native_thread_id); for 3.10, whose thread states hold only pthread_t, user space
 *               fills it (PY_STATUS_NO_THREAD tells it a thread is missing).
 *
 * BCC rewrites map calls only in the main file: hand the program to BPF(text=...) through
 * otel_ebpf.profiles.cpython.inline_headers(), which pastes this header in place of its #include.
 *
 * Only user memory is read (bpf_probe_read_user), never a kernel struct field. Loops are bounded
 * (PY_MAX_FRAMES, PY_MAX_THREADS) so the verifier accepts them on any kernel with bounded loops
 * (5.3+). Override the sizes with -D before including.
 *
 * Each frame costs ONE bpf_probe_read_user: of the window [lowest field offset, highest + 8) of the
 * version's frame struct (72 bytes on 3.12/3.13, 40 on 3.11, 104 on 3.10), into a per-CPU buffer
 * (py_window) from which the four words are picked. Each helper call has a fixed cost of the order
 * of 70 ns; the copy itself is nearly free, so one window beats four 8-byte reads.
 */
#ifndef OTEL_EBPF_PYTHON_STACK_H
#define OTEL_EBPF_PYTHON_STACK_H

#ifndef PY_MAX_FRAMES
#define PY_MAX_FRAMES 64
#endif
#ifndef PY_MAX_THREADS
#define PY_MAX_THREADS 32
#endif
#ifndef PY_MAX_PROCS
#define PY_MAX_PROCS 1024
#endif
#ifndef PY_MAX_THREAD_CACHE
#define PY_MAX_THREAD_CACHE 8192
#endif

/* Bytes of a frame struct read at once: the span of the four fields the walker picks out of it
 * (cpython.py's layouts need at most 104, 3.10's f_back@24..f_lasti@96+8 plus its flags word @0). */
#ifndef PY_FRAME_WINDOW
#define PY_FRAME_WINDOW 128
#endif

#define PY_NO_OFFSET 0xffff

#define PY_STATUS_NOT_PYTHON 0 /* the process is not a known CPython */
#define PY_STATUS_OK 1
#define PY_STATUS_NO_THREAD 2 /* no thread state for this tid (not a Python thread, or 3.10 cache miss) */
#define PY_STATUS_TRUNCATED 3 /* more than PY_MAX_FRAMES frames: the root-most are missing */

/* Mirrored by otel_ebpf/profiles/cpython.py (PyProc). Offsets are bytes; PY_NO_OFFSET = absent. */
struct py_proc {
    u64 runtime;               /* absolute address of _PyRuntime in this process */
    u32 version;               /* 310, 311, 312, 313: for user space; the walk is the same */
    u16 runtime_interp_head;   /* _PyRuntime.interpreters.head */
    u16 interp_threads_head;   /* PyInterpreterState.threads.head (3.10: tstate_head) */
    u16 tstate_next;
    u16 tstate_native_tid;     /* native_thread_id; PY_NO_OFFSET on 3.10 */
    u16 tstate_frame;          /* 3.10 frame, 3.11/3.12 cframe, 3.13 current_frame */
    u16 cframe_current_frame;  /* PY_NO_OFFSET when tstate_frame points at the frame itself */
    u16 frame_code;            /* f_code / f_executable */
    u16 frame_previous;        /* f_back / previous */
    u16 frame_instr;           /* 3.10 f_lasti (int); 3.11+ prev_instr / instr_ptr (pointer) */
    u16 frame_flags;           /* an 8-byte window holding is_entry (3.11) / owner (3.12+) */
    u16 _pad[3];
};

/* Raw words: user space (cpython.py) knows the version and decodes them. Keeping the per-version
 * logic out of the loop keeps the verifier's work linear in PY_MAX_FRAMES. */
struct py_frame {
    u64 code;  /* PyCodeObject* (3.13: f_executable) */
    u64 instr; /* 3.11+: instruction pointer; 3.10: f_lasti in the low 32 bits */
    u64 flags; /* the frame_flags window: entry/owner bytes */
};

struct py_stack {
    u32 depth;
    u32 status;
    struct py_frame frames[PY_MAX_FRAMES];
};

BPF_HASH(py_procs, u32, struct py_proc, PY_MAX_PROCS);
BPF_TABLE("lru_hash", u32, u64, py_threads, PY_MAX_THREAD_CACHE);

/* Scratch for one frame's window. A map value rather than the BPF stack: the fields are picked at
 * offsets known only at run time (per process), and the verifier refuses variable-offset stack
 * reads that it cannot prove 8-byte aligned (3.13's offsets come from the process itself). */
struct py_window {
    u8 bytes[PY_FRAME_WINDOW];
};
BPF_PERCPU_ARRAY(py_window, struct py_window, 1);

static __always_inline u64 py_read_ptr(u64 addr) {
    u64 value = 0;
    if (bpf_probe_read_user(&value, sizeof(value), (void *)addr) != 0)
        return 0;
    return value;
}

/* The thread state of `tid`: the cached one if it still names tid, else a bounded walk of the
 * main interpreter's thread list (3.11+). */
static __always_inline u64 py_find_tstate(struct py_proc *proc, u32 tid) {
    u64 *cached = py_threads.lookup(&tid);
    if (proc->tstate_native_tid == PY_NO_OFFSET)
        return cached ? *cached : 0; /* 3.10: user space maps tid -> tstate */
    if (cached && *cached) {
        u64 native = py_read_ptr(*cached + proc->tstate_native_tid);
        if ((u32)native == tid)
            return *cached;
    }
    u64 interp = py_read_ptr(proc->runtime + proc->runtime_interp_head);
    if (!interp)
        return 0;
    u64 tstate = py_read_ptr(interp + proc->interp_threads_head);
    for (int i = 0; i < PY_MAX_THREADS && tstate; i++) {
        u64 native = py_read_ptr(tstate + proc->tstate_native_tid);
        if ((u32)native == tid) {
            py_threads.update(&tid, &tstate);
            return tstate;
        }
        tstate = py_read_ptr(tstate + proc->tstate_next);
    }
    return 0;
}

static __always_inline int py_read_stack(u32 tgid, u32 tid, struct py_stack *out) {
    out->depth = 0;
    out->status = PY_STATUS_NOT_PYTHON;
    struct py_proc *proc = py_procs.lookup(&tgid);
    if (!proc)
        return PY_STATUS_NOT_PYTHON;
    out->status = PY_STATUS_NO_THREAD;
    u64 tstate = py_find_tstate(proc, tid);
    if (!tstate)
        return PY_STATUS_NO_THREAD;
    u64 frame = py_read_ptr(tstate + proc->tstate_frame);
    if (frame && proc->cframe_current_frame != PY_NO_OFFSET)
        frame = py_read_ptr(frame + proc->cframe_current_frame);
    /* The window: [lo, lo + span) of each frame, with each field's place in it. */
    u32 code_off = proc->frame_code, prev_off = proc->frame_previous;
    u32 instr_off = proc->frame_instr, flags_off = proc->frame_flags;
    u32 lo = code_off < prev_off ? code_off : prev_off;
    u32 hi = code_off > prev_off ? code_off : prev_off;
    lo = instr_off < lo ? instr_off : lo;
    hi = instr_off > hi ? instr_off : hi;
    lo = flags_off < lo ? flags_off : lo;
    hi = flags_off > hi ? flags_off : hi;
    u32 span = hi + 8 - lo;
    u64 code_at = code_off - lo, prev_at = prev_off - lo;
    u64 instr_at = instr_off - lo, flags_at = flags_off - lo;
    /* A layout whose fields do not fit one window is not one we know (all of cpython.py's do).
     * Each pick offset is bounded on its own register, as the verifier tracks them: it must see
     * every pick as 8 bytes inside the buffer (the bounds survive the spills across iterations).
     * The barriers keep clang from folding the checks into one the verifier cannot follow. The
     * read's length is bounded again in the loop: clang passes a copy the check did not cover. */
    __asm__ __volatile__("" : "+r"(span), "+r"(code_at), "+r"(prev_at), "+r"(instr_at));
    __asm__ __volatile__("" : "+r"(flags_at));
    if (span > PY_FRAME_WINDOW || code_at > PY_FRAME_WINDOW - 8 || prev_at > PY_FRAME_WINDOW - 8 ||
        instr_at > PY_FRAME_WINDOW - 8 || flags_at > PY_FRAME_WINDOW - 8) {
        out->status = PY_STATUS_NOT_PYTHON;
        return PY_STATUS_NOT_PYTHON;
    }
    u32 zero = 0;
    struct py_window *w = py_window.lookup(&zero);
    if (!w) {
        out->status = PY_STATUS_NOT_PYTHON;
        return PY_STATUS_NOT_PYTHON;
    }
    u32 depth = 0;
    out->status = PY_STATUS_OK;
    for (int i = 0; i < PY_MAX_FRAMES; i++) {
        if (!frame)
            break;
        struct py_frame *slot = &out->frames[i];
        /* On a fault the helper zeroes the whole buffer: the slot is then all zeros and the walk
         * ends, as when each of the four separate reads failed (a frame is readable as a whole
         * or not at all: the window lies inside the one struct). */
        u64 len = span;
        __asm__ __volatile__("" : "+r"(len));  /* re-bound here, on the register passed */
        if (len > PY_FRAME_WINDOW)
            len = PY_FRAME_WINDOW;
        bpf_probe_read_user(w->bytes, len, (void *)(frame + lo));
        slot->code = *(u64 *)(w->bytes + code_at);
        slot->instr = *(u64 *)(w->bytes + instr_at);
        slot->flags = *(u64 *)(w->bytes + flags_at);
        frame = *(u64 *)(w->bytes + prev_at);
        depth = i + 1;
    }
    if (frame)
        out->status = PY_STATUS_TRUNCATED;
    out->depth = depth;
    return out->status;
}

#endif /* OTEL_EBPF_PYTHON_STACK_H */
