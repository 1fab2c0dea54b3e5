
// ---- traceparent injection (INJECT) ---------------------------------------------------------
//
// W3C traceparent injection into the HTTP/1 requests of traced processes (docs/kubernetes.md,
// "traceparent injection"). Appended to socket_trace.c, whose maps and helpers it uses.
//
//   sock:inet_sock_set_state, SYN_SENT: inside connect(), so the current task owns the socket:
//     a traced process's socket is noted in inject_pending (inject_connecting).
//   sockops on the cgroup v2 root, ACTIVE_ESTABLISHED: runs in softirq, where the current task says
//     nothing of the owner; a socket noted above joins inject_socks (inject_sockops).
//   sk_msg verdict on inject_socks: sees each send's bytes before TCP does. At the start of a
//     syscall's bytes that begin an HTTP/1 request head with no traceparent, it inserts
//     "traceparent: 00-<trace>-<span>-<flags>\r\n" right after the request line (inject_msg).
//   The ids are left for the thread (inject_ids); the syscall's exit emits them (EV_TRACE) after
//   its data event, and user space gives the CLIENT span those very ids (a shed request has
//   neither: the ids are on the wire all the same).
//   A traced server thread's read that starts a request sets the thread's trace: the request's own
//   valid traceparent, else a new random trace id (inject_serving notes the read, inject_exit reads
//   it: tail-called, for stack). Its requests made meanwhile continue that trace; the thread's
//   first write on that connection (the response) ends it.
//
// What the kernel does around the verdict (net/ipv4/tcp_bpf.c, net/core/filter.c):
// - It runs in the sending task's context, inside the syscall, once per chunk of the user's bytes
//   it copies (a large write may take several): only the syscall's first verdict sees the start of
//   its bytes (active_io.verdicts says whether one ran).
// - msg->data..data_end covers only the first scatterlist element, which may hold fewer bytes than
//   were written: bpf_msg_pull_data(start, end) makes that range contiguous (copying it if need
//   be) and points data at start.
// - bpf_msg_push_data(start, len) inserts len *uninitialised* bytes and invalidates data/data_end:
//   they are pulled again and written before the verdict returns, or popped if that fails. The
//   insertion splits the message's scatterlist, and TCP sends each element as it comes: the whole
//   message is pulled into one (see inject_msg: Nagle).
// - The syscall still returns the number of bytes it took from the user's buffer, not counting the
//   inserted ones: the application sees no difference, and the data event (copied from the user's
//   buffer at the syscall's exit) never contains the line, so the HTTP/1 parser is not confused.

#define INJ_INJECTED 0
#define INJ_PRESENT 1        // the head already carries a traceparent: untouched
#define INJ_TLS 2            // plaintext of a TLS connection (kTLS), or a write inside an SSL call
#define INJ_REQUEST_LINE 3   // starts like a request, but the first line is no "... HTTP/1.x\r\n"
#define INJ_HEAD_SPLIT 4     // the write ends before the head does: the rest may hold a traceparent
#define INJ_HEAD_TOO_LONG 5  // the head does not end within HEAD_SCAN bytes
#define INJ_KERNEL 6         // bpf_msg_pull_data/push_data failed (memory)
#define INJ_NOT_WATCHED 7    // a traced connection not added to inject_socks (full)
#define INJ_NSTATS 8

#define HEAD_SCAN 1024       // bytes of a request head searched for its end and a traceparent
#define SERVER_SCAN (HEAD_SCAN < PAYLOAD_CAP ? HEAD_SCAN : PAYLOAD_CAP)
#define TRACEPARENT_LINE 70  // "traceparent: 00-" + 32 + "-" + 16 + "-" + 2 + "\r\n"
#define TRACEPARENT_VALUE 55 // "00-" + 32 + "-" + 16 + "-" + 2

BPF_PERCPU_ARRAY(inject_stats, u64, INJ_NSTATS);
BPF_SOCKHASH(inject_socks, u64, MAX_CONNS);  // by sk: the sockets whose sends inject_msg sees
BPF_TABLE("lru_hash", u64, u8, inject_pending, MAX_CONNS);  // sk of a traced connect() in progress
// The request a server thread is serving, by thread id: its trace continues in the thread's calls.
struct serving {
    u64 trace_hi;
    u64 trace_lo;
    u64 conn;  // (tgid << 32 | fd) the request came on
    u64 sampled;
};
BPF_TABLE("lru_hash", u32, struct serving, inject_threads, 65536);
BPF_TABLE("lru_hash", u32, struct trace_ids, inject_ids, 65536);  // decided by inject_msg, for the exit

// active_io.inject: what the syscall's exit does.
#define INJECT_IDS 1          // inject_msg decided ids (inject_ids): emit them
#define INJECT_SERVER_READ 2  // a server's read started a request (inject_scratch.read): tail-call

static __always_inline void inject_count(u32 slot) {
    u64 *v = inject_stats.lookup(&slot);
    if (v)
        *v += 1;
}

static __always_inline u64 random_id(void) {
    u64 v = (u64)bpf_get_prandom_u32() << 32 | bpf_get_prandom_u32();
    return v ? v : 1;
}

// ---- reading a request head ------------------------------------------------------------------

// Bytes as they sit in a u64 shifted left one byte per step: the newest is the lowest.
#define W2(a, b) ((u64)(a) << 8 | (u64)(b))
#define W4(a, b, c, d) (W2(a, b) << 16 | W2(c, d))
#define W8(a, b, c, d, e, f, g, h) (W4(a, b, c, d) << 32 | W4(e, f, g, h))

struct head_scan {
    u64 w0, w1;         // the last 16 bytes seen, letters lower-cased; w0 holds the newest 8
    u64 line_end;       // offset past the request line's "\r\n" (0: not seen)
    u64 head_end;       // offset past the blank line that ends the head (0: not seen)
    u64 traceparent;    // offset past "traceparent:" at the start of a field line (0: none)
    u64 http1;          // the request line ends in " HTTP/1.0\r\n" or " HTTP/1.1\r\n"
};

// 1 when a == b, else 0, without a branch. The verifier walks every byte of a scan loop and keeps
// each branch it cannot decide for later: branches in the loop body multiply its work past its
// limit, so the body is arithmetic, written in assembly because clang turns (x | -x) >> 63 back
// into a comparison, and so into a jump.
static __always_inline u64 same(u64 a, u64 b) {
    u64 x = a ^ b, t;
    asm volatile("%[t] = %[x]\n\t%[t] = -%[t]\n\t%[t] |= %[x]\n\t%[t] >>= 63\n\t%[t] ^= 1"
                 : [t] "=&r"(t)
                 : [x] "r"(x));
    return t;
}

// Byte c at offset i of a head. Field names are case-insensitive and take no space before the
// colon (RFC 9112), so "\ntraceparent:" before the blank line is the field. Nothing changes
// once the head has ended.
static __always_inline void scan_byte(struct head_scan *s, u8 c, u64 i) {
    u64 x = c;
    u64 upper = ((x + 0x3f) ^ (x + 0x25)) & ~x & 0x80;  // 0x80 for 'A'..'Z', else 0
    s->w1 = s->w1 << 8 | s->w0 >> 56;
    s->w0 = s->w0 << 8 | x | upper >> 2;
    u64 in_head = same(s->head_end, 0);
    u64 line_seen = same(s->line_end, 0) ^ 1;
    u64 newline = same(x, '\n') & in_head;
    // "tp/1.?\r\n" in w0, " ht" below it in w1
    u64 minor = s->w0 >> 16 & 0xff;
    u64 http1 = same(s->w0 & ~0xff0000ULL, W8('t', 'p', '/', '1', '.', 0, '\r', '\n')) &
                (same(minor, '0') | same(minor, '1')) & same(s->w1 & 0xffffff, W4(0, ' ', 'h', 't'));
    u64 first = newline & (line_seen ^ 1);
    s->line_end |= (i + 1) & -first;
    s->http1 |= http1 & first;
    u64 blank = newline & line_seen & same(s->w0 & 0xffffffff, W4('\r', '\n', '\r', '\n'));
    s->head_end |= (i + 1) & -blank;
    u64 field = in_head & line_seen & same(s->traceparent, 0) & same(s->w0, W8('e', 'p', 'a', 'r', 'e', 'n', 't', ':')) &
                same(s->w1 & 0xffffffffffULL, W4('\n', 't', 'r', 'a') << 8 | 'c');
    s->traceparent |= (i + 1) & -field;
}

// What a server's read leaves for inject_exit, and that program's working space. Tracepoint
// programs are not preempted and a tail call stays on its CPU: one slot per CPU is theirs.
struct server_read {
    u64 buf;
    u64 conn;        // tgid << 32 | fd
    u64 ts;          // of its data event
    u32 len;
    u32 generation;
    u32 copied;      // its bytes were copied: not shed (a shed request has no span to give ids to)
};
struct inject_work {
    struct head_scan scan;
    struct server_read read;
    struct serving serving;
    struct trace_ids ids;
    u64 fields[5];   // a traceparent's version, trace id (two halves), parent id and flags
};
BPF_PERCPU_ARRAY(inject_scratch, struct inject_work, 1);

static __always_inline int hex_value(u8 c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')  // lower case only (W3C Trace Context)
        return c - 'a' + 10;
    return -1;
}

// The trace context of a server's request, from its head (the first len bytes at buf, user
// memory): 1 when it carries a valid traceparent, as propagation.py reads one.
static __always_inline int read_traceparent(const char *buf, u32 len, struct trace_ids *ids,
                                            struct inject_work *w) {
    struct head_scan *s = &w->scan;
    u32 cpu = bpf_get_smp_processor_id();
    struct data_event *scratch = data_scratch.lookup(&cpu);  // free: the data event is out already
    if (!scratch)
        return 0;
    u32 n = len < SERVER_SCAN ? len : SERVER_SCAN;
    asm volatile("" : "+r"(n));
    n &= (PAYLOAD_CAP << 1) - 1;
    if (bpf_probe_read_user(scratch->data, n, buf))
        return 0;
    __builtin_memset(s, 0, sizeof(*s));
    for (u32 i = 0; i < SERVER_SCAN; i++) {
        if (i >= n)
            break;
        scan_byte(s, scratch->data[i], i);
    }
    if (!s->traceparent)
        return 0;
    u32 v = s->traceparent;
#pragma unroll
    for (int k = 0; k < 4; k++) {  // optional whitespace before the value
        u8 c = scratch->data[v & ((PAYLOAD_CAP << 1) - 1)];
        if (c == ' ' || c == '\t')
            v++;
    }
    if (v + TRACEPARENT_VALUE >= n)
        return 0;
    // "vv-" 32 hex "-" 16 hex "-ff" into fields[f]: version, trace id's halves, parent id, flags.
    __builtin_memset(w->fields, 0, sizeof(w->fields));
    u32 f = 0;
#pragma clang loop unroll(disable)
    for (u32 j = 0; j < TRACEPARENT_VALUE; j++) {
        u8 c = scratch->data[(v + j) & ((PAYLOAD_CAP << 1) - 1)];
        if (j == 2 || j == 35 || j == 52) {
            if (c != '-')
                return 0;
            f += 1;
            continue;
        }
        if (j == 19)  // the trace id's second half
            f = 2;
        int x = hex_value(c);
        if (x < 0 || f > 4)
            return 0;
        w->fields[f] = w->fields[f] << 4 | x;
    }
    // Version 00 ends there; a later version may add fields after a dash.
    u8 after = scratch->data[(v + TRACEPARENT_VALUE) & ((PAYLOAD_CAP << 1) - 1)];
    int ends = after == '\r' || after == ' ' || after == '\t';
    u64 version = w->fields[0];
    if (version == 0xff || !(w->fields[1] | w->fields[2]) || !w->fields[3] || !(ends || (version && after == '-')))
        return 0;
    ids->trace_hi = w->fields[1];
    ids->trace_lo = w->fields[2];
    ids->sampled = w->fields[4] & 1;
    return 1;
}

// ---- the socket probe's side -----------------------------------------------------------------

static __always_inline void inject_connecting(u64 sk) {
    if (!is_target(current_pid_tgid() >> 32))
        return;
    u8 one = 1;
    inject_pending.update(&sk, &one);
}

// The ids of the request whose data event (of connection fd, generation) is stamped ts.
static __always_inline void emit_ids(u64 id, s32 fd, u32 generation, u64 ts, struct trace_ids *ids) {
    u32 cpu = bpf_get_smp_processor_id();
    struct trace_event *ev = (struct trace_event *)data_scratch.lookup(&cpu);  // done with, or not yet used
    if (!ev)
        return;
    fill_header(&ev->h, EV_TRACE, ts, id, fd, generation);
    ev->ids = *ids;
    submit(ev, sizeof(*ev));
}

// A syscall of a server connection (conn: tgid << 32 | fd), from the syscall exit: a read that
// started a request is left for inject_exit; the thread's write (its response) ends the request's
// hold on the thread.
static __always_inline void inject_serving(struct active_io *iop, u64 conn, u32 generation, const char *buf,
                                           u32 len, u64 ts, int copied) {
    u32 tid = current_pid_tgid();
    if (iop->direction == DIR_EGRESS) {
        struct serving *was = inject_threads.lookup(&tid);
        if (was && was->conn == conn)
            inject_threads.delete(&tid);
        return;
    }
    u32 zero = 0;
    struct inject_work *w = inject_scratch.lookup(&zero);
    if (!w || !buf)
        return;
    w->read.buf = (u64)buf;
    w->read.conn = conn;
    w->read.ts = ts;
    w->read.len = len;
    w->read.generation = generation;
    w->read.copied = copied;
    iop->inject = INJECT_SERVER_READ;
}

// A traced server's read started a request: the thread's trace is the request's traceparent, when
// it carries a valid one, else a new one; user space gets it for the SERVER span.
static __always_inline void server_read(u64 id) {
    u32 tid = id, zero = 0;
    struct inject_work *w = inject_scratch.lookup(&zero);
    if (!w)
        return;
    __builtin_memset(&w->ids, 0, sizeof(w->ids));
    w->ids.set = 1;
    w->ids.sampled = 1;
    if (!read_traceparent((const char *)w->read.buf, w->read.len, &w->ids, w)) {
        w->ids.trace_hi = random_id();
        w->ids.trace_lo = random_id();
    }
    w->serving.trace_hi = w->ids.trace_hi;
    w->serving.trace_lo = w->ids.trace_lo;
    w->serving.conn = w->read.conn;
    w->serving.sampled = w->ids.sampled;
    inject_threads.update(&tid, &w->serving);
    if (w->read.copied)
        emit_ids(id, (s32)w->read.conn, w->read.generation, w->read.ts, &w->ids);
}

// Tail-called at every data syscall's exit, after its data event: the ids decided during the
// syscall go to user space (a server's read has its traceparent read first).
int inject_exit(void *ctx) {
    u64 id = current_pid_tgid();
    u32 tid = id;
    struct active_io *io = current_io();
    if (!io || !io->inject)
        return 0;
    u32 what = io->inject;
    io->inject = 0;
    if (what == INJECT_SERVER_READ) {
        server_read(id);
        return 0;
    }
    struct trace_ids *ids = inject_ids.lookup(&tid);
    u64 key = (id & 0xffffffff00000000ULL) | (u32)io->fd;
    struct conn_info *ci = conns.lookup(&key);
    if (ids && ci && !ci->http.shed)  // a shed request has no span to give them to
        emit_ids(id, io->fd, ci->generation, io->ts, ids);  // a write's data is stamped at its start
    return 0;
}

// ---- sockops: which sockets are watched -----------------------------------------------------

int inject_sockops(struct bpf_sock_ops *skops) {
    if (skops->op != BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB)
        return 1;
    struct bpf_sock *sk = skops->sk;
    if (!sk)
        return 1;
    u64 key = (u64)sk;  // the pointer inet_sock_set_state named
    if (!inject_pending.lookup(&key))
        return 1;
    inject_pending.delete(&key);
    long failed = inject_socks.sock_hash_update(skops, &key, BPF_ANY);  // BCC rewrites whole statements only
    if (failed)
        inject_count(INJ_NOT_WATCHED);
    return 1;  // a socket leaves inject_socks by itself when it closes
}

// ---- sk_msg: the injection ----------------------------------------------------------------------

static __always_inline u8 hex_digit(u64 v) {
    v &= 0xf;
    return v < 10 ? '0' + v : 'a' + v - 10;
}

// The 70 bytes of the line at p.
static __always_inline void write_traceparent(u8 *p, const struct trace_ids *ids) {
    __builtin_memcpy(p, "traceparent: 00-", 16);
#pragma unroll
    for (int k = 0; k < 16; k++) {
        p[16 + k] = hex_digit(ids->trace_hi >> (60 - 4 * k));
        p[32 + k] = hex_digit(ids->trace_lo >> (60 - 4 * k));
        p[49 + k] = hex_digit(ids->span >> (60 - 4 * k));
    }
    p[48] = '-';
    p[65] = '-';
    p[66] = '0';
    p[67] = ids->sampled ? '1' : '0';
    p[68] = '\r';
    p[69] = '\n';
}

int inject_msg(struct sk_msg_md *msg) {
    u64 id = current_pid_tgid();
    u32 tid = id, tgid = id >> 32;
    struct active_io *io = active_io.lookup(&tid);
    // A traced thread's write from its own buffer, and the syscall's first verdict: its bytes start here.
    if (!io || io->kind != IO_DATA || io->direction != DIR_EGRESS || !io->buf || io->verdicts)
        return SK_PASS;
    io->verdicts = 1;
    u32 size = msg->size;
    if (size < 16 || bpf_msg_pull_data(msg, 0, 16, 0))
        return SK_PASS;
    u8 *data = (void *)(long)msg->data, *end = (void *)(long)msg->data_end;
    if (data + 16 > end)
        return SK_PASS;
    // A method (3 to 10 capitals) and a space: anything else costs no more than this.
    u32 sp = 0;
#pragma unroll
    for (int i = 0; i <= 10; i++) {
        u8 c = data[i];
        if (c == ' ') {
            sp = i;
            break;
        }
        if (c < 'A' || c > 'Z')
            return SK_PASS;
    }
    if (sp < 3)
        return SK_PASS;
    u64 key = (id & 0xffffffff00000000ULL) | (u32)io->fd;
    struct conn_info *ci = conns.lookup(&key);
    if ((ci && ci->tls) || (tls_procs.lookup(&tgid) && active_ssl.lookup(&tid))) {
        inject_count(INJ_TLS);
        return SK_PASS;
    }
    if (ci && ci->http.state >= HTTP_NO)
        return SK_PASS;  // no longer HTTP/1 (a tunnel, an upgraded connection)

    u32 n = size < HEAD_SCAN ? size : HEAD_SCAN;
    if (bpf_msg_pull_data(msg, 0, n, 0)) {
        inject_count(INJ_KERNEL);
        return SK_PASS;
    }
    data = (void *)(long)msg->data;
    end = (void *)(long)msg->data_end;
    struct head_scan s = {};
    for (u32 i = 0; i < HEAD_SCAN; i++) {
        u8 *p = data + i;
        if (p + 1 > end)
            break;
        scan_byte(&s, *p, i);
    }
    u32 outcome = s.traceparent   ? INJ_PRESENT
                  : !s.line_end   ? (n < HEAD_SCAN ? INJ_HEAD_SPLIT : INJ_HEAD_TOO_LONG)
                  : !s.http1      ? INJ_REQUEST_LINE
                  : !s.head_end   ? (n < HEAD_SCAN ? INJ_HEAD_SPLIT : INJ_HEAD_TOO_LONG)
                                  : INJ_INJECTED;
    if (outcome != INJ_INJECTED) {
        inject_count(outcome);
        return SK_PASS;
    }

    // The ids: the trace of the request the thread is serving, else a new one; a new span.
    struct trace_ids ids = {.set = 1, .sampled = 1};
    struct serving *serving = inject_threads.lookup(&tid);
    if (serving) {
        ids.trace_hi = serving->trace_hi;
        ids.trace_lo = serving->trace_lo;
        ids.sampled = serving->sampled;
    } else {
        ids.trace_hi = random_id();
        ids.trace_lo = random_id();
    }
    ids.span = random_id();

    u32 at = s.line_end;
    if (bpf_msg_push_data(msg, at, TRACEPARENT_LINE, 0)) {
        inject_count(INJ_KERNEL);
        return SK_PASS;
    }
    // The whole message made one contiguous piece again. TCP sends each scatterlist element on its
    // own, and a small segment behind another unacknowledged small one waits for its ACK (Nagle):
    // left as [head][line][rest], a request stalled 40 ms (delayed ACK) here on every call.
    if (bpf_msg_pull_data(msg, 0, msg->size, 0))
        goto undo;
    data = (void *)(long)msg->data;
    end = (void *)(long)msg->data_end;
    at &= (HEAD_SCAN << 1) - 1;  // at <= HEAD_SCAN: a bound the verifier can see
    u8 *line = data + at;
    if (line + TRACEPARENT_LINE > end)
        goto undo;
    write_traceparent(line, &ids);
    inject_ids.update(&tid, &ids);
    io->inject = INJECT_IDS;
    inject_count(INJ_INJECTED);
    return SK_PASS;
undo:
    inject_count(INJ_KERNEL);
    // Uninitialised bytes must never leave: take them out, or fail the write (EACCES) if even that fails.
    return bpf_msg_pop_data(msg, at, TRACEPARENT_LINE, 0) ? SK_DROP : SK_PASS;
}
