// Socket capture with stable kernel ABI only: syscall tracepoints, sock tracepoints, sched
// tracepoints. No kprobes; the kernel structs read (a socket's family and protocol in the raw
// sock_*_length programs, tcp_sock's sequence numbers for the handshake's ISNs) are read at
// offsets from the running kernel's BTF (docs/architecture.md, "Stable kernel ABI only").
//
// How a syscall's bytes are tied to a TCP connection, all on one thread (COPY_IN_SOCK, the default
// mode; without it the syscall's exit copies, once sock_*_length has named the socket):
//   sys_enter_write(fd, buf)          remember fd, the user buffer and when     (the thread's active_io)
//   sock:sock_send_length(sk, ret)    the fd is a socket, sk, and ret bytes left: copy min(ret, cap)
//                                     of them to the ring buffer
//   sock:sock_recv_length(sk, ret)    a traced thread read ret bytes from a socket (no syscall
//                                     program at all): fd and buffer from the registers the task
//                                     saved at entry; copy them
// sock:inet_sock_set_state gives sk -> 4-tuple when a connection becomes ESTABLISHED.
//
// Kernels before 6.3 lack sock_{send,recv}_length; built with FD_TRACKING, a connection is instead
// an fd that accept/connect returned or that user space found in /proc at start, and its "sk" is a
// synthetic id (its tuple then comes from /proc too).
//
// Compile-time constants (BCC cflags): PAYLOAD_CAP (power of two), MAX_IOV, MAX_CONNS,
// MAX_TARGETS, RINGBUF_PAGES, WAKEUP_BYTES, NR_CPUS (possible CPUs); SKC_FAMILY, SK_PROTOCOL (BTF
// offsets) unless FD_TRACKING; INJECT: traceparent injection (inject_traceparent.c, appended).

#define H2_CHUNKS 16  // events one buffer or segment of an HTTP/2 connection may take (piece_length): a
                      // whole 64 KiB segment of gRPC C-core's reads at the default cap

#define EV_DATA 1
#define EV_OPEN 2
#define EV_CLOSE 3
#define EV_EXEC 4
#define EV_EXIT 5
#define EV_DGRAM 6  // one UDP datagram, with its peer's address
#define EV_TRACE 7  // INJECT: the ids the kernel decided for the request a data event (just before) started

#define ROLE_UNKNOWN 0
#define ROLE_CLIENT 1
#define ROLE_SERVER 2

#define DIR_EGRESS 0
#define DIR_INGRESS 1

#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define IPPROTO_MPTCP_ 262  // a multipath TCP socket (Go's listeners since 1.24): a stream, as TCP's
#define AF_UNIX 1
#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM_ 1
#define SOCK_DGRAM_ 2
#define UNIX_PATH_MAX 108  // sockaddr_un's sun_path
#define TCP_ESTABLISHED 1
#define TCP_SYN_SENT 2
#define TCP_SYN_RECV 3
#define EINPROGRESS 115

// settings[] slots, written once by user space before attaching (0 and 1: targets.h).
#define SET_FILTER_PORTS 2  // 1: only connections with a local or peer port in ports[]
#define SET_WATCH_EXEC 3    // 1: report execs so user space can match --exe globs
#define SET_READY 4         // 1 once the slots above are written: until then trace nothing
#define SET_SHED_BACKLOG 5  // shed new HTTP/1 exchanges while user space has more ring bytes to read
#define SET_KEEP_1024 6     // copy this many of 1024 new HTTP/1 exchanges (CPU budget); 1024: all
#define SET_GAVE_UP 7       // 1 once user space gave up on a connection: ignored[] is worth a lookup
#define NSETTINGS 8

// stats[] slots (per-CPU counters read by user space).
#define STAT_RINGBUF_FULL 0  // events dropped because the ring buffer was full
#define STAT_ACTIVE_FULL 1   // syscalls not tracked: no active_io slot for the thread (table full, no memory)
#define STAT_IOV_BYTES 2     // bytes in iovecs past MAX_IOV, reported as a gap, not copied
#define STAT_MMSG_CALLS 3    // sendmmsg/recvmmsg messages past MAX_MMSG in one call, not copied
#define STAT_TLS_UNATTRIBUTED 4  // TLS reads/writes whose socket was never named (memory BIOs)
#define STAT_RED_FULL 5      // HTTP/1 exchanges not counted: the http_red table was full
#define STAT_HTTP_QUEUE_FULL 6  // pipelined requests past HTTP_QUEUE, not measured
// COPY_IN_SOCK: socket reads and sends of traced threads inside no read- or write-family syscall
// (io_uring's, splice's): not copied (count_outside_syscalls)
#define STAT_OUTSIDE_SYSCALLS 7
// HTTP/1 requests unanswered when their connection closed, on a socket that moved bytes outside
// the syscalls: their responses may have gone that way, unseen (HDR_UNSEEN_IO)
#define STAT_HTTP_UNSEEN 8
#define STAT_SHED_BASE 8     // + SHED_* (1..3): HTTP/1 requests shed, by reason (http1_summary.h)
#define NSTATS 12

// Messages of one sendmmsg/recvmmsg call copied (each its own datagram event); more are counted.
// Their iovecs are gathered up to MAX_MMSG_IOV per message: the nested loops must stay within
// what the verifier explores.
#define MAX_MMSG 8
#define MAX_MMSG_IOV 8

// The UAPI layouts of iovec and user_msghdr: user-space ABI, identical on every kernel.
struct uiovec {
    const char *base;
    u64 len;
};
// sockaddr_in and sockaddr_in6 overlaid: family and port first, then the IPv4 address or
// (after 4 bytes of flowinfo) the IPv6 one.
struct usockaddr {
    u16 family;
    u16 port_be;
    u32 v4;
    u8 v6[16];
};
struct umsghdr {
    void *name;
    int namelen;
    struct uiovec *iov;
    u64 iovlen;
};
// struct mmsghdr: a msghdr (56 bytes on 64-bit) and the length the kernel moved for it.
struct ummsghdr {
    void *name;
    int namelen;
    struct uiovec *iov;
    u64 iovlen;
    void *control;
    u64 controllen;
    u32 flags;
    u32 pad;      // msghdr ends padded to 56
    u32 msg_len;
    u32 pad2;
};

#define HDR_AFTER_LOSS 1  // event_header.flags: events of this connection were lost just before
#define HDR_UNSEEN_IO 2   // a close: the socket moved bytes outside the syscalls (count_outside_syscalls)
#define HDR_TLS 4         // a close: the SSL probes named the connection's socket (its bytes are TLS they see)

struct event_header {
    u64 ts;
    u32 type;
    u32 tgid;
    u32 tid;
    s32 fd;
    u32 generation;
    u32 flags;     // HDR_*
};

#define DATA_TLS 1  // data_event.flags: plaintext of a TLS connection, from the SSL probes
#define DATA_LAST_CHUNK 2  // ... its last bytes, past those copied, end a chunked body (ends_chunked)

struct data_event {
    struct event_header h;
    u32 direction;
    u32 length;    // bytes the syscall moved (for the run of iovec segments this event covers)
    u32 captured;  // bytes copied into data[], from its start
    u32 flags;     // DATA_*
    u32 retransmissions;  // the connection's so far (TCP_HEALTH; 0 without)
    // Room for a copy starting below PAYLOAD_CAP (segments gathered) of up to 2 * PAYLOAD_CAP - 1
    // bytes (a length masked so the verifier can bound it).
    char data[PAYLOAD_CAP * 3];
};

// A UDP datagram (sockets are unconnected: every datagram names its peer). The payload of all
// its iovecs is gathered into data[], so one event is one datagram, as RTPS needs.
struct dgram_event {
    struct event_header h;
    u32 direction;
    u32 length;    // bytes of the datagram
    u32 captured;  // bytes copied into data[] (at most PAYLOAD_CAP)
    u32 flags;
    u16 family;    // the peer: 0 when the syscall named none (a connected socket)
    u16 port;
    u32 pad;
    u8 addr[16];
    // Room for a copy starting below PAYLOAD_CAP of up to 2 * PAYLOAD_CAP - 1 bytes (masked).
    char data[PAYLOAD_CAP * 3];
};

// The ids the kernel decided for a request (INJECT): a CLIENT request's trace and span, the
// ones its injected traceparent carries; a SERVER request's trace only (span 0).
struct trace_ids {
    u64 trace_hi;  // the trace id's first 16 hex digits
    u64 trace_lo;
    u64 span;
    u8 set;
    u8 sampled;
    u8 pad[6];
};

// Follows the data event (same thread) of the syscall that started the request with these ids.
struct trace_event {
    struct event_header h;
    struct trace_ids ids;
};

struct open_event {
    struct event_header h;
    u32 role;
    u16 family;  // 0 when the tuple is unknown (socket predates the agent)
    u16 lport;
    u16 rport;
    u16 protocol;  // IPPROTO_TCP or IPPROTO_UDP; 0 with AF_UNIX
    u16 path_length;  // AF_UNIX: the bytes of path[]
    u16 path_of_peer;  // AF_UNIX: 1 when path[] names the peer's socket, not this one
    u8 laddr[16];  // AF_UNIX: the kernel's socket, in the first 8 bytes
    u8 raddr[16];  // AF_UNIX: its peer's
    char comm[16];  // names a process that exits before user space can read its /proc entry
    u32 client_isn;  // the TCP handshake's initial sequence numbers (both 0: unknown)
    u32 server_isn;
    char path[128];  // AF_UNIX: the name the connection was made to (UNIX_PATH_MAX of them)
};

struct tuple {
    u16 family;
    u16 lport;
    u16 rport;
    u16 role;
    u8 laddr[16];
    u8 raddr[16];
    u32 client_isn;  // what both ends of a connection agree on, whatever NAT did to the tuple
    u32 server_isn;
};

#include "current_task.h"
#include "http1_summary.h"

#ifdef TCP_HEALTH
// Defined in tcp_health.c, appended to this program: which sockets traced processes own.
static __always_inline void tcp_health_connecting(u64 sk, struct tuple *t);
static __always_inline void tcp_health_owned(u64 sk, u32 tgid, u8 role, struct tuple *t, u64 conn);
#ifdef TCP_SRTT_US
static __always_inline void tcp_health_read(u64 sk, u64 now);
#endif
#endif

#ifdef INJECT
// Defined in inject_traceparent.c, appended to this program.
struct active_io;
static __always_inline void inject_connecting(u64 sk);
static __always_inline void inject_serving(struct active_io *iop, u64 conn, u32 generation, const char *buf,
                                           u32 len, u64 ts, int copied);
BPF_PROG_ARRAY(inject_tail, 1);  // [0]: inject_exit
#endif

struct conn_info {
    u64 sk;          // 0 until the first socket I/O names the kernel socket
    u64 synthetic;   // FD_TRACKING: stands in for sk
    u32 generation;
    u32 retransmissions;  // TCP_HEALTH: segments the socket retransmitted (tcp_health.c)
    u8 role;
    u8 ignored;      // port filter rejected it
    u8 tls;          // its bytes are TLS: the SSL probes report the plaintext, syscalls nothing
    u8 udp;          // a UDP socket: datagram events
    u8 unix_stream;  // a unix stream socket: its open event names it (unix_ends)
    u8 announced;    // its open event was sent (announce): its close is sent too
    struct http_state http;
};

// An SSL_read/SSL_write/handshake call in flight on a thread (the probes are in tls_trace.c).
// The syscalls it makes carry ciphertext: the first one names the socket, none is emitted.
#define SSL_OP_READ 0
#define SSL_OP_WRITE 1
#define SSL_OP_HANDSHAKE 2
struct active_ssl {
    u64 ssl;       // the SSL* (first argument)
    u64 buf;
    u64 done;      // size_t * where SSL_{read,write}_ex put the length; 0 for the plain calls
    u64 enter_ns;
    s32 fd;        // -1 until a syscall inside the call names the socket
    u32 op;        // SSL_OP_*
};

#define IO_DATA 0
#define IO_CONNECT 1
#define IO_ACCEPT 2
#define IO_BIND 3
#define IO_MMSG 4  // sendmmsg/recvmmsg: buf is the mmsghdr vector, iovcnt its length
#define IO_NAME 5  // getsockname: buf is where the kernel writes the local end
#define IO_READ 6  // a socket read with no syscall program: sock_recv_length copies it (COPY_IN_SOCK)
// The syscall has returned. An entry stays with its thread (deleted when the thread exits):
// marking it costs a store where deleting and re-inserting cost two hash updates per syscall.
#define IO_DONE 0xff

// active_io.tls: the thread's TLS state when its syscall began, which its exit needs too (an SSL
// call wraps the whole syscall), read once instead of at both ends.
#define IO_SSL_USER 1  // the process has made an SSL call (tls_procs)
#define IO_IN_SSL 2    // the thread is inside one now (active_ssl): its bytes are ciphertext

struct active_io {
    u64 buf;         // user buffer, the iovec array for vectored I/O, or a sockaddr
    u64 sk;
    // When the bytes moved: a write's when its syscall began, a read's when the socket handed them
    // over (sock_recv_length, at the end of the read; 0 before, or with FD_TRACKING).
    u64 ts;
    s32 fd;
    u32 iovcnt;      // 0 for plain buffers
    u32 direction;
    u32 kind;        // IO_*
    u64 name;        // sendto/recvfrom/sendmsg/recvmsg: the peer's sockaddr (filled by recv*)
    u8 udp;          // the socket is UDP: set on the exit's copy of the slot from its connection
                     // (a copy on the stack: see exit_io_body), 0 in the slot itself
    u8 tls;          // IO_SSL_USER | IO_IN_SSL
    u16 nr;          // IO_READ: the syscall the read is in (COPY_IN_SOCK)
    u16 verdicts;    // INJECT: 1 once an sk_msg verdict ran inside this syscall (inject_traceparent.c)
    u16 inject;      // INJECT: INJECT_* (what the syscall's exit has to do)
#ifdef FD_TRACKING
    struct tuple conn;  // IO_CONNECT: the destination, then the local end once established
#endif
};

BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);
// events again, put in [0] by user space at start: a map pointer bpf_ringbuf_query() accepts,
// which BCC gives no other way (it rewrites only the ringbuf_* calls on the map itself).
BPF_ARRAY_OF_MAPS(events_ref, "events", 1);

// The ring's producer position less its consumer position, which user space advances after each
// batch it reads: the kernel's own accounting, so submitting a record costs no shared counter.
static __always_inline u64 ring_backlog(void) {
    u32 zero = 0;
    void *ring = events_ref.lookup(&zero);
    return ring ? bpf_ringbuf_query(ring, BPF_RB_AVAIL_DATA) : 0;
}
// The syscall in flight of each thread of the traced processes: written at every enter, read at
// every exit, so its lookup is on every traced syscall's path twice.
#if defined(FD_TRACKING) || defined(INJECT)
// A hash keyed by thread id: kernels before 6.3 may predate task storage (5.11), and traceparent
// injection's sk_msg program (inject_traceparent.c) must read the slot, which a socket program
// cannot reach through task storage.
BPF_HASH(active_io, u32, struct active_io, 65536);

static __always_inline struct active_io *current_io(void) {
    u32 tid = current_pid_tgid();
    return active_io.lookup(&tid);
}

static __always_inline int set_current_io(struct active_io *io) {
    u32 tid = current_pid_tgid();
    return active_io.update(&tid, io);
}

static __always_inline void forget_current_io(void) {
    u32 tid = current_pid_tgid();
    active_io.delete(&tid);
}
#else
// Task storage: the slot hangs off the task itself, so reaching it costs a pointer walk where a
// hash costs hashing, a bucket lock and (on update) an element swap: about half the time of both
// programs of a syscall (bench/kernel_cost.py). It is freed with the task, and a thread outside the
// traced processes never gets one, so a miss on an exit is as cheap as it gets.
BPF_TASK_STORAGE(active_io, struct active_io);

static __always_inline struct active_io *current_io(void) {
    return active_io.task_storage_get(bpf_get_current_task_btf(), 0, 0);
}

static __always_inline int set_current_io(struct active_io *io) {
    struct active_io *slot =
        active_io.task_storage_get(bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!slot)  // no memory for a new slot (GFP_ATOMIC)
        return -1;
    *slot = *io;
    return 0;
}

static __always_inline void forget_current_io(void) {}  // the kernel frees it with the task
#endif
// Reads then have no syscall program: sock_recv_length, which runs inside every socket read once
// its bytes are in the user's buffer, takes the fd, the buffer and the rest from the registers the
// task saved when the syscall began (they stay as they were until it returns) and copies the bytes
// there. No program runs for the reads of files, pipes and the sockets of other processes, and a
// traced read costs one program where it cost an enter and an exit. Writes keep their enter, for
// when the bytes left (see exit_io_body), and are copied by sock_send_length, which runs inside
// the send once the socket took them (the user's buffer unchanged): no exit program either, so
// the writes of files and pipes cost the enter only. User space defines COPY_IN_SOCK
// (SocketProbe.start) except with fd-tracking (no sock_*_length), traceparent injection (its
// sk_msg program reads the slot, a hash, before the bytes move; its exits write what it decided)
// and on other architectures.
#ifdef COPY_IN_SOCK
#if defined(FD_TRACKING) || defined(INJECT) || !defined(__x86_64__)
#error "COPY_IN_SOCK needs sock_*_length, task storage and x86-64's registers"
#endif
#include <asm/ptrace.h>
static __always_inline struct pt_regs *syscall_regs(void) {
    return (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
}
// x86-64 syscall numbers (orig_ax: the one in flight) whose bytes a sock tracepoint copies
#define NR_READ 0
#define NR_WRITE 1
#define NR_READV 19
#define NR_WRITEV 20
#define NR_SENDTO 44
#define NR_RECVFROM 45
#define NR_SENDMSG 46
#define NR_RECVMSG 47
#define NR_SENDFILE 40
#define NR_RECVMMSG 299
#define NR_SENDMMSG 307
#define ENOSYS_ 38  // pt_regs.ax from the syscall's entry until its return value replaces it

// The syscall in flight, while ax still holds what entry put there, when it is nr_a or nr_b, ...:
// its number, else -1. io_uring completes socket I/O in task work after another syscall returned,
// or in its workers, whose registers are no such syscall's.
static __always_inline long syscall_in_flight(const struct pt_regs *regs, long a, long b, long c, long d) {
    long nr = regs->orig_ax;
    if ((long)regs->ax != -ENOSYS_ || (nr != a && nr != b && nr != c && nr != d))
        return -1;
    return nr;
}

struct counted_process {
    u32 tgid;
    char comm[16];  // the thread's name (TASK_COMM_LEN): io_uring's workers are "iou-wrk-<tid>"
};
BPF_ARRAY(outside_syscalls_process, struct counted_process, 1);  // what count_outside_syscalls last counted
// Sockets that moved bytes outside the syscalls: their connections' closes say so (io_unseen).
BPF_TABLE("lru_hash", u64, u8, unseen_io_socks, 16384);

// Counts a traced thread's socket read or send that no read- or write-family syscall is making
// (regs: the thread's, none of those in flight): io_uring's (in io_uring_enter, in task work after
// another syscall returned, in its io-wq workers, whose registers are no syscall's) or splice's.
// Its bytes are not copied; the counter, and the process user space names in its log, tell the
// user why such a process has no spans.
static __always_inline void count_outside_syscalls(const struct pt_regs *regs, const void *sk) {
    if (syscall_in_flight(regs, NR_SENDFILE, NR_SENDMMSG, NR_RECVMMSG, NR_RECVMMSG) >= 0)
        return;  // those three report at their exits
    count(STAT_OUTSIDE_SYSCALLS, 1);
    u64 key = (u64)sk;
    u8 one = 1;
    unseen_io_socks.update(&key, &one);
    u32 zero = 0;
    struct counted_process *last = outside_syscalls_process.lookup(&zero);
    if (last) {
        last->tgid = current_pid_tgid() >> 32;
        bpf_get_current_comm(last->comm, sizeof(last->comm));
    }
}
#endif

// Whether socket sk moved bytes outside the syscalls since it became a connection (unseen_io_socks;
// only sock tracepoints see such bytes). A socket's address is reused once it is freed: a new
// connection forgets what was marked at it (forget_unseen_io).
static __always_inline int io_unseen(const struct conn_info *ci) {
#ifdef COPY_IN_SOCK
    u64 key = ci->sk;
    return key && unseen_io_socks.lookup(&key);
#else
    return 0;
#endif
}

static __always_inline void forget_unseen_io(u64 sk) {
#ifdef COPY_IN_SOCK
    unseen_io_socks.delete(&sk);
#endif
}
BPF_HASH(active_ssl, u32, struct active_ssl, 16384);
// The socket each thread last read, and when: TLS over memory BIOs (Python asyncio) decrypts what
// the thread read from that socket just before, with no syscall inside SSL_read (tls_trace.c).
struct last_read {
    s32 fd;
    u32 pad;
    u64 ts;
};
BPF_TABLE("lru_hash", u32, struct last_read, last_read, 16384);
#define MEMORY_BIO_WINDOW_NS 10000000ULL  // a socket read or write this close belongs to the SSL call
// SSL* -> its socket (tls_trace.c), valid while the fd still holds that connection (generation):
// a freed SSL*'s address comes back for a later connection, often on another fd.
struct ssl_socket {
    s32 fd;
    u32 generation;
};
BPF_TABLE("lru_hash", u64, struct ssl_socket, ssl_fds, MAX_CONNS);
// Per thread, its latest SSL call that named no socket, and when it returned: the first TLS record
// the thread then writes to a socket, outside any SSL call, is that SSL's ciphertext leaving its
// memory BIO (Node.js drives a client's handshake from SSL_read and SSL_write, which never touch
// the socket, and writes their records right after).
struct unplaced_ssl {
    u64 ssl;
    u64 ts;
};
BPF_TABLE("lru_hash", u32, struct unplaced_ssl, unplaced_ssl, 16384);
// Processes that made an SSL call: only their syscalls can be inside one, and only their reads
// can feed one (last_read). The rest skip that bookkeeping.
BPF_HASH(tls_procs, u32, u8, MAX_TARGETS);
BPF_TABLE("lru_hash", u64, struct conn_info, conns, MAX_CONNS);
BPF_TABLE("lru_hash", u64, struct tuple, sk_tuples, MAX_CONNS);
BPF_HASH(ignored, u64, u32, MAX_CONNS);  // (tgid<<32|fd) -> generation user space gave up on
// Local ends of the agent's own connections (its exports). A traced process whose peer is one of
// them is a collector receiving from the agent: tracing it would feed the agent's output back in.
struct endpoint_key {
    u8 addr[16];
    u16 port;
    u16 pad;
};
BPF_TABLE("lru_hash", struct endpoint_key, u8, agent_endpoints, 1024);
#ifdef FD_TRACKING
// Local ends of accepted connections, learnt when the server side becomes ESTABLISHED (in softirq,
// whatever task is current) and claimed by the accept() that returns it, by what accept() knows:
// the peer's address and port and the listener's port.
struct accepted_key {
    u8 raddr[16];
    u16 rport;
    u16 lport;
    u32 pad;
};
BPF_TABLE("lru_hash", struct accepted_key, struct tuple, accepted, MAX_CONNS);
#endif
BPF_TABLE("lru_hash", u64, u16, listen_ports, MAX_TARGETS);  // FD_TRACKING: (tgid<<32|fd) -> bound port
#define TARGETS_FOLLOW_FORKS
#include "targets.h"
// Local ends that bind() set or getsockname() reported, by (tgid<<32|fd): the sock tracepoints
// give no UDP addresses, and a short-lived process may be gone before /proc can be read.
struct local_end {
    u16 family;
    u16 port;
    u32 pad;
    u8 addr[16];
};
BPF_TABLE("lru_hash", u64, struct local_end, bound_ends, MAX_CONNS);
BPF_HASH(ports, u16, u8, 64);
// --exe names (globs without wildcards, as short as a comm), for sched_process_exec to match
struct comm_name {
    char name[16];  // TASK_COMM_LEN
};
BPF_HASH(exec_names, struct comm_name, u8, 64);
BPF_PERCPU_ARRAY(generation_seq, u32, 1);
BPF_PERCPU_ARRAY(stats, u64, NSTATS);
// One slot per CPU, indexed by CPU id: a per-CPU map would cap the value at 32 KiB, below the
// largest payload cap. Syscall tracepoint programs do not migrate between CPUs mid-run.
BPF_ARRAY(data_scratch, struct data_event, NR_CPUS);
BPF_ARRAY(dgram_scratch, struct dgram_event, NR_CPUS);

static __always_inline void count(u32 slot, u64 n) {
    u64 *v = stats.lookup(&slot);
    if (v)
        *v += n;
}

static __always_inline int is_target(u32 tgid) {
    // BCC attaches each program as it loads it, before user space has written the filters.
    // tgid 0: a task outside the agent's PID namespace (current_task.h)
    if (!tgid || !setting(SET_READY) || tgid == setting(SET_AGENT_TGID))
        return 0;
    if (!setting(SET_FILTER_PIDS))
        return 1;
    return targets.lookup(&tgid) != 0;
}

// Wake the agent only when the bytes it has to read cross another multiple of WAKEUP_BYTES (a
// share of the ring, well below SET_SHED_BACKLOG): a wakeup is a self-interrupt, which in a VM
// costs more than several events (bench/kernel_profile.py: a quarter of the programs' time when
// every 64th event woke it). The agent also polls on a timer, so nothing waits longer than its
// poll interval.
#define BPF_RB_NO_WAKEUP_ 1
#define BPF_RB_FORCE_WAKEUP_ 2

static __always_inline u64 wakeup_flag(u32 size) {
    u64 before = ring_backlog();
    u64 after = before + size + 8;  // the record's header
    return before / WAKEUP_BYTES != after / WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP_ : BPF_RB_NO_WAKEUP_;
}

// ts: when it happened. Callers that have a stamp pass it: in a VM the clock is a TSC read that
// took about half of a syscall enter program's time (bench/kernel_profile.py), and this is on
// every event's path.
static __always_inline void fill_header(struct event_header *h, u32 type, u64 ts, u64 pid_tgid, s32 fd,
                                        u32 generation) {
    h->ts = ts;
    h->type = type;
    h->tgid = pid_tgid >> 32;
    h->tid = (u32)pid_tgid;
    h->fd = fd;
    h->generation = generation;
    h->flags = 0;
}

// Every record goes through here, or through emit_open: one that does not fit is counted.
static __always_inline int submit(void *data, u32 size) {
    if (events.ringbuf_output(data, size, wakeup_flag(size))) {
        count(STAT_RINGBUF_FULL, 1);
        return -1;
    }
    return 0;
}

static __always_inline int emit_simple(void *ctx, u32 type, u64 pid_tgid, s32 fd, u32 generation) {
    struct event_header h = {};
    fill_header(&h, type, bpf_ktime_get_ns(), pid_tgid, fd, generation);
    return submit(&h, sizeof(h));
}

static __always_inline void report_skipped(u64 id, s32 fd, struct conn_info *ci);

// A connection's close or replacement; user space is told when it lost events of it since its
// last delivered one, after the bytes it was not sent (report_skipped), whether its socket moved
// bytes it never saw (io_unseen), and whether the SSL probes knew it (a TLS connection that closed
// after its handshake, a health check's, sent them no plaintext: not a library left unhooked).
static __always_inline void emit_close(void *ctx, u64 id, s32 fd, struct conn_info *ci) {
    if (!ci->announced)
        return;
    report_skipped(id, fd, ci);
    struct event_header h = {};
    fill_header(&h, EV_CLOSE, bpf_ktime_get_ns(), id, fd, ci->generation);
    h.flags = (ci->http.lost ? HDR_AFTER_LOSS : 0) | (io_unseen(ci) ? HDR_UNSEEN_IO : 0) | (ci->tls ? HDR_TLS : 0);
    submit(&h, sizeof(h));
}

// ---- connection lifecycle ------------------------------------------------------------------

static __always_inline int same_addr(const u8 *a, const u8 *b) {
    u64 a0, a1, b0, b1;
    __builtin_memcpy(&a0, a, 8);
    __builtin_memcpy(&a1, a + 8, 8);
    __builtin_memcpy(&b0, b, 8);
    __builtin_memcpy(&b1, b + 8, 8);
    return a0 == b0 && a1 == b1;
}

TRACEPOINT_PROBE(sock, inet_sock_set_state) {
#if defined(TCP_HEALTH) || defined(INJECT)
    int connecting = args->newstate == TCP_SYN_SENT;  // inside connect(): the owner is current
#else
    int connecting = 0;
#endif
    if (args->protocol != IPPROTO_TCP_ || (args->newstate != TCP_ESTABLISHED && !connecting))
        return 0;
    u64 sk = (u64)args->skaddr;
    struct tuple t = {};
    t.family = args->family;
    t.lport = args->sport;
    t.rport = args->dport;
    t.role = args->oldstate == TCP_SYN_SENT ? ROLE_CLIENT
           : args->oldstate == TCP_SYN_RECV ? ROLE_SERVER : ROLE_UNKNOWN;
    if (args->family == AF_INET) {
        __builtin_memcpy(t.laddr, args->saddr, 4);
        __builtin_memcpy(t.raddr, args->daddr, 4);
    } else {
        __builtin_memcpy(t.laddr, args->saddr_v6, 16);
        __builtin_memcpy(t.raddr, args->daddr_v6, 16);
    }
    if (connecting) {
#ifdef TCP_HEALTH
        tcp_health_connecting(sk, &t);
#endif
#ifdef INJECT
        inject_connecting(sk);
#endif
        return 0;
    }
#ifdef TCP_SND_UNA
    // The handshake is over and no data has moved yet: the first byte not acknowledged and the
    // next one expected are one past the two SYNs' sequence numbers. The offsets come from the
    // running kernel's BTF (probes/btf.py), not from the headers BCC compiles against.
    u32 snd_una = 0, rcv_nxt = 0;
    if (!bpf_probe_read_kernel(&snd_una, 4, (void *)sk + TCP_SND_UNA) &&
        !bpf_probe_read_kernel(&rcv_nxt, 4, (void *)sk + TCP_RCV_NXT) && t.role != ROLE_UNKNOWN) {
        t.client_isn = (t.role == ROLE_CLIENT ? snd_una : rcv_nxt) - 1;
        t.server_isn = (t.role == ROLE_CLIENT ? rcv_nxt : snd_una) - 1;
    }
#endif
    sk_tuples.update(&sk, &t);
#ifdef FD_TRACKING
    if (t.role == ROLE_SERVER) {
        struct accepted_key k = {.rport = t.rport, .lport = t.lport};
        __builtin_memcpy(k.raddr, t.raddr, 16);
        accepted.update(&k, &t);
    } else if (t.role == ROLE_CLIENT) {
        // A loopback handshake completes inside connect(), in the connecting thread's context.
        // The destination must match: another connection's handshake may complete in softirq
        // while this thread happens to be in connect().
        struct active_io *io = current_io();
        if (io && io->kind == IO_CONNECT && !io->conn.lport && io->conn.rport == t.rport &&
            same_addr(io->conn.raddr, t.raddr))
            io->conn = t;
    }
#endif
    return 0;
}

#ifdef FD_TRACKING
#define PEER_KNOWN 0
#define PEER_UNKNOWN 1  // no sockaddr given (accept(fd, NULL, NULL)) or unreadable
#define NOT_INET 2
// The address family, port and address of a user sockaddr into t's peer half.
static __always_inline int read_peer(const struct usockaddr *uaddr, struct tuple *t) {
    struct usockaddr sa = {};
    if (!uaddr || bpf_probe_read_user(&sa, 8, uaddr))  // family, port, IPv4 address
        return PEER_UNKNOWN;
    if (sa.family != AF_INET && sa.family != AF_INET6)
        return NOT_INET;
    t->family = sa.family;
    t->rport = __builtin_bswap16(sa.port_be);
    if (sa.family == AF_INET)
        __builtin_memcpy(t->raddr, &sa.v4, 4);
    else if (bpf_probe_read_user(t->raddr, 16, uaddr->v6))
        return PEER_UNKNOWN;
    return PEER_KNOWN;
}
#endif

// accept/connect tell the role and the peer address. The connection is announced at its first
// I/O, when its sk (so its tuple) is known; with FD_TRACKING the tuple is keyed by the synthetic
// sk instead: the peer from accept/connect's sockaddr, the local end from the handshake seen by
// inet_sock_set_state (connected: the connecting thread's; accepted: the table of accepted ends),
// else from the listener's bound port. An fd that is not an inet socket is skipped.
static __always_inline void remember_conn(u64 pid_tgid, s32 fd, u8 role, struct active_io *io) {
    u64 key = (pid_tgid & 0xffffffff00000000ULL) | (u32)fd;
    // Odd, small and rising: never a kernel pointer, never repeated for one fd.
    struct conn_info ci = {.role = role, .synthetic = bpf_ktime_get_ns() | 1};
#ifdef FD_TRACKING
    struct tuple t = {.role = role};
    int peer = read_peer((const struct usockaddr *)io->buf, &t);
    if (peer == NOT_INET)
        return;
    if (peer == PEER_UNKNOWN) {  // user space reads the tuple from /proc
        conns.update(&key, &ci);
        return;
    }
    if (role == ROLE_CLIENT && io->conn.lport) {
        t.lport = io->conn.lport;
        t.client_isn = io->conn.client_isn;
        t.server_isn = io->conn.server_isn;
        __builtin_memcpy(t.laddr, io->conn.laddr, 16);
    } else if (role == ROLE_SERVER) {
        u64 listen_key = (pid_tgid & 0xffffffff00000000ULL) | (u32)io->fd;
        u16 *lport = listen_ports.lookup(&listen_key);
        if (lport) {
            t.lport = *lport;
            struct accepted_key k = {.rport = t.rport, .lport = t.lport};
            __builtin_memcpy(k.raddr, t.raddr, 16);
            struct tuple *established = accepted.lookup(&k);
            if (established) {
                t.client_isn = established->client_isn;
                t.server_isn = established->server_isn;
                __builtin_memcpy(t.laddr, established->laddr, 16);
                accepted.delete(&k);
            }
        }
    }
    sk_tuples.update(&ci.synthetic, &t);
#endif
    conns.update(&key, &ci);
}

static __always_inline void enter_conn_call(s32 fd, const void *uaddr, u32 kind) {
    u64 id = current_pid_tgid();
    if (!is_target(id >> 32))
        return;
    struct active_io io = {.buf = (u64)uaddr, .fd = fd, .kind = kind};
#ifdef FD_TRACKING
    if (kind == IO_CONNECT)  // the destination, which the handshake's tuple must match
        read_peer((const struct usockaddr *)uaddr, &io.conn);
#endif
    if (set_current_io(&io))
        count(STAT_ACTIVE_FULL, 1);
}

// The address bind() gave or getsockname() returned, when it names a port (bind to port 0 does not:
// the getsockname that usually follows does).
static __always_inline void remember_local_end(u64 id, struct active_io *io) {
    struct usockaddr sa = {};
    if (bpf_probe_read_user(&sa, 8, (const void *)io->buf) || (sa.family != AF_INET && sa.family != AF_INET6) ||
        !sa.port_be)
        return;
    struct local_end end = {.family = sa.family, .port = __builtin_bswap16(sa.port_be)};
    if (sa.family == AF_INET)
        __builtin_memcpy(end.addr, &sa.v4, 4);
    else if (bpf_probe_read_user(end.addr, 16, ((const struct usockaddr *)io->buf)->v6))
        return;
    u64 key = (id & 0xffffffff00000000ULL) | (u32)io->fd;
    bound_ends.update(&key, &end);
}

// ret: the new fd for accept, 0 / -EINPROGRESS for a connect that goes ahead.
static __always_inline void exit_conn_call(long ret, u32 kind) {
    u64 id = current_pid_tgid();
    struct active_io *io = current_io();
#ifdef FD_TRACKING
    // An accept that was in flight when the agent attached (a server's acceptor blocked in it):
    // its enter was not seen, and without it the connection would never be tracked. Its peer is
    // read from /proc, as for accept(fd, NULL, NULL).
    if (kind == IO_ACCEPT && ret >= 0 && !(io && io->kind == IO_ACCEPT) && is_target(id >> 32)) {
        struct active_io unseen = {};
        remember_conn(id, ret, ROLE_SERVER, &unseen);
        return;
    }
#endif
    if (!io)
        return;
    if (io->kind == kind && kind == IO_ACCEPT && ret >= 0)
        remember_conn(id, ret, ROLE_SERVER, io);
    if (io->kind == kind && kind == IO_CONNECT && (ret == 0 || ret == -EINPROGRESS))
        remember_conn(id, io->fd, ROLE_CLIENT, io);
    if (io->kind == kind && (kind == IO_BIND || kind == IO_NAME) && ret == 0)
        remember_local_end(id, io);
#ifdef FD_TRACKING
    if (io->kind == kind && kind == IO_BIND && ret == 0) {
        struct usockaddr sa = {};
        u64 key = (id & 0xffffffff00000000ULL) | (u32)io->fd;
        if (!bpf_probe_read_user(&sa, 4, (const void *)io->buf) && (sa.family == AF_INET || sa.family == AF_INET6)) {
            u16 port = __builtin_bswap16(sa.port_be);
            listen_ports.update(&key, &port);
        }
    }
#endif
    io->kind = IO_DONE;
}

TRACEPOINT_PROBE(syscalls, sys_enter_accept) { enter_conn_call(args->fd, args->upeer_sockaddr, IO_ACCEPT); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_accept) { exit_conn_call(args->ret, IO_ACCEPT); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_accept4) { enter_conn_call(args->fd, args->upeer_sockaddr, IO_ACCEPT); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { exit_conn_call(args->ret, IO_ACCEPT); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_connect) { enter_conn_call(args->fd, args->uservaddr, IO_CONNECT); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_connect) { exit_conn_call(args->ret, IO_CONNECT); return 0; }
// bind and getsockname: the local end of UDP sockets; tracking fds, also the port a server binds,
// the local port of the connections it accepts (user space seeds the listeners that predate the
// agent from /proc).
TRACEPOINT_PROBE(syscalls, sys_enter_bind) { enter_conn_call(args->fd, args->umyaddr, IO_BIND); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_bind) { exit_conn_call(args->ret, IO_BIND); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_getsockname) { enter_conn_call(args->fd, args->usockaddr, IO_NAME); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_getsockname) { exit_conn_call(args->ret, IO_NAME); return 0; }

TRACEPOINT_PROBE(syscalls, sys_enter_close) {
    u64 id = current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    u64 key = (id & 0xffffffff00000000ULL) | (u32)args->fd;
    bound_ends.delete(&key);
    struct conn_info *ci = conns.lookup(&key);
    if (!ci)
        return 0;
    int unseen = io_unseen(ci);
    if (unseen && ci->http.state == HTTP_YES) {  // not unanswered: perhaps answered where no syscall shows
        count(STAT_HTTP_UNSEEN, ci->http.queued);
        ci->http.queued = 0;
    }
    http_unanswered(id >> 32, ci->role, ci->tls, &ci->http, bpf_ktime_get_ns());
    emit_close(args, id, args->fd, ci);
    if (unseen)
        forget_unseen_io(ci->sk);
    conns.delete(&key);
    ignored.delete(&key);
    return 0;
}

// ---- processes -------------------------------------------------------------------------------

TRACEPOINT_PROBE(sched, sched_process_exec) {
    u64 id = current_pid_tgid();
    if (!id || !setting(SET_WATCH_EXEC))  // 0: outside the agent's PID namespace
        return 0;
    // A new image named as an --exe name (its comm: the executed file's name) is a target from
    // here, not from when user space reads the event: a quick curl has made and closed its
    // connections by then. User space matches the other globs, and checks these the same way.
    struct comm_name comm = {};
    bpf_get_current_comm(comm.name, sizeof(comm.name));
    if (exec_names.lookup(&comm)) {
        u32 tgid = id >> 32;
        u8 one = 1;
        targets.update(&tgid, &one);
    }
    emit_simple(args, EV_EXEC, id, -1, 0);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = current_pid_tgid();
    u32 tgid = id >> 32, tid = id;
    forget_current_io();
    if (tid != tgid) {  // a thread, not the process: sched_process_fork entered its id too
        targets.delete(&tid);
        return 0;
    }
    if (!is_target(tgid))
        return 0;
    emit_simple(args, EV_EXIT, id, -1, 0);
    targets.delete(&tgid);
    tls_procs.delete(&tgid);
    return 0;
}

// ---- data ------------------------------------------------------------------------------------

// The thread's TLS state as its syscall begins (active_io.tls).
static __always_inline u8 tls_state(u64 id) {
    u32 tid = id, tgid = id >> 32;
    u8 tls = tls_procs.lookup(&tgid) ? IO_SSL_USER : 0;
    if (tls && active_ssl.lookup(&tid))
        tls |= IO_IN_SSL;  // the call's socket is named at the exit, once the fd is known to be one
    return tls;
}

// Reads whose bytes are not the stream's next ones in the buffer: not copied. MSG_PEEK's come again
// (nginx peeks one byte to tell TLS from HTTP); MSG_OOB reads TCP's urgent byte, kept out of the
// stream; with MSG_TRUNC a TCP socket discards them (nothing is written to the buffer) and a UDP
// socket returns the datagram's whole length, which may be past what the buffer holds (such a UDP
// read is not copied either); MSG_ERRQUEUE reads the error queue (transmit timestamps), not data.
#define MSG_OOB_ 1
#define MSG_PEEK_ 2
#define MSG_TRUNC_ 0x20
#define MSG_ERRQUEUE_ 0x2000
#define READ_NOT_COPIED (MSG_OOB_ | MSG_PEEK_ | MSG_TRUNC_ | MSG_ERRQUEUE_)

static __always_inline void enter_io(s32 fd, const void *buf, u32 iovcnt, u32 direction, const void *name,
                                     u32 kind) {
    u64 id = current_pid_tgid();
    if (!is_target(id >> 32))
        return;
    struct active_io io = {.buf = (u64)buf, .fd = fd, .iovcnt = iovcnt, .direction = direction,
                           .name = (u64)name, .kind = kind, .tls = tls_state(id)};
    if (direction == DIR_EGRESS)
        io.ts = bpf_ktime_get_ns();
    if (set_current_io(&io))
        count(STAT_ACTIVE_FULL, 1);
}

static __always_inline void enter_msg(s32 fd, const struct umsghdr *msg, u32 direction, u32 flags) {
    struct umsghdr m = {};
    if ((flags & READ_NOT_COPIED) || bpf_probe_read_user(&m, sizeof(m), msg) || m.iovlen == 0)
        return;
    enter_io(fd, m.iov, m.iovlen > 0xffff ? 0xffff : m.iovlen, direction, m.name, IO_DATA);
}

#ifndef FD_TRACKING
// The kernel socket a sock tracepoint named: its protocol (IPPROTO_*) when it is an inet TCP or
// multipath TCP stream (Go's listeners use MPTCP since 1.24) or a UDP datagram socket, 0 for a
// unix stream socket (UNIX_ENDS: HTTP between a proxy and its app, gRPC to a local daemon), else
// -1: unix datagrams, netlink, ping sockets' ICMP, SCTP, and raw sockets whatever their protocol
// (a raw TCP socket's packets are no stream). Read from the socket at offsets from the running
// kernel's BTF (SKC_FAMILY, SK_TYPE, SK_PROTOCOL), once per connection (upsert_conn): the sock
// programs are raw tracepoints, whose arguments arrive as they are where a classic tracepoint
// first fills its record, family and protocol included, for every socket send and receive of
// every process on the node.
static __always_inline int traced_protocol(const void *sk) {
    u16 family = 0, type = 0, protocol = 0;
    if (bpf_probe_read_kernel(&family, sizeof(family), sk + SKC_FAMILY) ||
        bpf_probe_read_kernel(&type, sizeof(type), sk + SK_TYPE))
        return -1;
#ifdef UNIX_ENDS
    if (family == AF_UNIX)
        return type == SOCK_STREAM_ ? 0 : -1;
#endif
    if ((family != AF_INET && family != AF_INET6) ||
        bpf_probe_read_kernel(&protocol, sizeof(protocol), sk + SK_PROTOCOL))
        return -1;
    if (type == SOCK_STREAM_ && (protocol == IPPROTO_TCP_ || protocol == IPPROTO_MPTCP_))
        return protocol;
    return type == SOCK_DGRAM_ && protocol == IPPROTO_UDP_ ? protocol : -1;
}

#ifdef UNIX_ENDS
// A unix stream connection's ends in its open event: its socket and its peer's (kernel addresses,
// which user space hashes), which the other end's open names the other way round, so that trace
// assembly pairs the two as it pairs an inet connection's addresses (not by inodes: an accepted
// socket has none until accept() returns, and its client may have sent by then); and the path the
// connection was made to: an accepted socket shares its listener's name, a client's socket is
// unnamed and its peer is the accepted one.
static __always_inline void unix_ends(struct open_event *ev, const void *sk) {
    const void *peer = 0, *name = 0;
    bpf_probe_read_kernel(&peer, sizeof(peer), sk + UNIX_PEER);
    __builtin_memcpy(ev->laddr, &sk, sizeof(sk));
    __builtin_memcpy(ev->raddr, &peer, sizeof(peer));
    bpf_probe_read_kernel(&name, sizeof(name), sk + UNIX_ADDR);
    if (!name && peer) {
        bpf_probe_read_kernel(&name, sizeof(name), peer + UNIX_ADDR);
        ev->path_of_peer = 1;
    }
    int len = 0;  // of the sockaddr_un: its family's two bytes, then the path
    if (!name || bpf_probe_read_kernel(&len, sizeof(len), name + UNIX_ADDRESS_LEN) || len <= 2)
        return;
    u32 n = len - 2 < UNIX_PATH_MAX ? len - 2 : UNIX_PATH_MAX;
    asm volatile("" : "+r"(n));  // a bound the verifier can see: n < sizeof(path)
    n &= sizeof(ev->path) - 1;
    if (!bpf_probe_read_kernel(ev->path, n, name + UNIX_ADDRESS_NAME + 2))
        ev->path_length = n;  // an abstract name starts with a NUL byte
}
#endif

// The agent's own socket I/O: its local end joins agent_endpoints, which its connections are left
// out by (sk_tuples holds inet sockets only).
static __always_inline void agent_sock_io(const void *sk) {
    u64 skaddr = (u64)sk;
    struct tuple *t = sk_tuples.lookup(&skaddr);
    if (t) {
        struct endpoint_key own = {.port = t->lport};
        __builtin_memcpy(own.addr, t->laddr, 16);
        u8 one = 1;
        agent_endpoints.update(&own, &one);
    }
}

// Socket I/O of the thread in flight on kernel socket sk: its syscall's slot, named the socket, or
// 0 (not a traced thread's, or the agent's own). Any socket: its exit leaves out all but inet
// ones when it first meets the connection (upsert_conn).
static __always_inline struct active_io *on_sock_io(const void *sk) {
    if (current_pid_tgid() >> 32 == setting(SET_AGENT_TGID)) {
        agent_sock_io(sk);
        return 0;
    }
    struct active_io *io = current_io();
    if (io)
        io->sk = (u64)sk;
    return io;
}

#ifdef COPY_IN_SOCK
// A read that names its sender (recvfrom's or recvmsg's address buffer, a UDP server's): its exit
// copies it, as the kernel writes the sender's address to that buffer after sock_recv_length.
static __always_inline int read_at_exit(const struct active_io *io) {
    return io->name != 0;
}

// A read by a traced thread: the slot of a syscall with an enter program (recvmmsg), or one made
// here (IO_READ) from the read's arguments, which the task saved in its registers at entry; 0 when
// the thread is not traced, or the read is inside another syscall (io_uring_enter, splice).
static __always_inline struct active_io *read_slot(const void *sk, int flags) {
    struct active_io *io = on_sock_io(sk);
    // The only read with an enter program here; any other slot is a past syscall's (a write's
    // stays IO_DATA when no socket took its bytes: a file's, a pipe's).
    if (io && io->kind == IO_MMSG)
        return io;
    u64 id = current_pid_tgid();
    if ((flags & READ_NOT_COPIED) || !is_target(id >> 32))
        return 0;  // is_target leaves out the agent, whose reads on_sock_io took
    struct pt_regs *regs = syscall_regs();
    long nr = syscall_in_flight(regs, NR_READ, NR_READV, NR_RECVFROM, NR_RECVMSG);
    if (nr < 0) {
        count_outside_syscalls(regs, sk);
        return 0;
    }
    if (!io)
        io = active_io.task_storage_get(bpf_get_current_task_btf(), 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!io) {
        count(STAT_ACTIVE_FULL, 1);
        return 0;
    }
    // Field by field into the slot: the copy that follows needs all of this program's stack.
    io->sk = (u64)sk;
    io->direction = DIR_INGRESS;
    io->kind = IO_READ;
    io->tls = tls_state(id);
    io->nr = nr;
    io->fd = regs->di;
    io->buf = regs->si;
    io->iovcnt = 0;
    io->name = nr == NR_RECVFROM ? regs->r8 : 0;
    if (nr == NR_READV) {
        u64 n = regs->dx;
        io->iovcnt = n > 0xffff ? 0xffff : n;
    } else if (nr == NR_RECVMSG) {
        struct umsghdr *msg = (struct umsghdr *)io->buf;
        u64 n = 0;
        if (bpf_probe_read_user(&io->name, sizeof(io->name), &msg->name)) {
            io->kind = IO_DONE;
            return 0;
        }
        if (io->name)
            return io;  // read_at_exit: the exit reads the msghdr
        if (bpf_probe_read_user(&io->buf, sizeof(io->buf), &msg->iov) ||
            bpf_probe_read_user(&n, sizeof(n), &msg->iovlen) || n == 0) {
            io->kind = IO_DONE;
            return 0;
        }
        io->iovcnt = n > 0xffff ? 0xffff : n;
    }
    return io;
}
#endif

#endif  // !FD_TRACKING

static __always_inline int port_wanted(u16 lport, u16 rport) {
    if (!setting(SET_FILTER_PORTS))
        return 1;
    return ports.lookup(&lport) || ports.lookup(&rport);
}

// The open event of connection ci (fd of id), stamped ts: its ends from the socket's tuple t, or,
// for a UDP socket the kernel gave no tuple for, its local end (either may be 0), or those of unix
// stream socket unix_sk. Built in the ring itself: connections open on the syscall exit's path,
// whose stack has no room for it. Returns whether it was sent.
static __always_inline int emit_open(u64 id, s32 fd, u64 ts, const struct conn_info *ci, const struct tuple *t,
                                     const struct local_end *end, u32 udp, const void *unix_sk) {
    struct open_event *ev = events.ringbuf_reserve(sizeof(struct open_event));
    if (!ev) {
        count(STAT_RINGBUF_FULL, 1);
        return 0;
    }
    __builtin_memset(ev, 0, sizeof(*ev));
    fill_header(&ev->h, EV_OPEN, ts, id, fd, ci->generation);
    if (t) {
        ev->family = t->family;
        ev->lport = t->lport;
        ev->rport = t->rport;
        ev->client_isn = t->client_isn;
        ev->server_isn = t->server_isn;
        __builtin_memcpy(ev->laddr, t->laddr, 16);
        __builtin_memcpy(ev->raddr, t->raddr, 16);
    } else if (end) {
        ev->family = end->family;
        ev->lport = end->port;
        __builtin_memcpy(ev->laddr, end->addr, 16);
    }
#ifdef UNIX_ENDS
    if (unix_sk) {
        ev->family = AF_UNIX;
        unix_ends(ev, unix_sk);
    }
#endif
    ev->role = ci->role;
    ev->protocol = unix_sk ? 0 : udp ? IPPROTO_UDP_ : IPPROTO_TCP_;
    bpf_get_current_comm(ev->comm, sizeof(ev->comm));
    // A local end the kernel did not give (fd tracking, or a socket older than the agent) is
    // read from /proc by user space, which must do so before the socket closes: wake it now.
    u64 lo, hi;
    __builtin_memcpy(&lo, ev->laddr, 8);
    __builtin_memcpy(&hi, ev->laddr + 8, 8);
    u64 flags = lo | hi || (udp && ev->lport) ? wakeup_flag(sizeof(*ev)) : BPF_RB_FORCE_WAKEUP_;
    events.ringbuf_submit(ev, flags);
    return 1;
}

// A stream connection is announced (EV_OPEN) with its first bytes that are copied, not when it is
// first seen, and its close only if it was: a connection whose exchanges are all shed (under load,
// a client or proxy that opens one per request) then costs user space nothing at all. The open
// carries the stamp of those bytes, so that it sorts before them, and the role the first message
// may have taught (a socket older than the agent, a unix socket).
static __always_inline void announce(u64 id, s32 fd, u64 ts, struct conn_info *ci) {
    if (ci->announced)
        return;
    u64 sk = ci->sk;
    const struct tuple *t = ci->unix_stream ? 0 : sk_tuples.lookup(&sk);
    ci->announced = emit_open(id, fd, ts, ci, t, 0, 0, ci->unix_stream ? (const void *)sk : 0);
}

// The connection for (tgid, fd) on socket sk, made when first seen or when the fd now names
// another socket (closed and reused while we were not looking: the old one's close is sent).
static __always_inline struct conn_info *upsert_conn(void *ctx, u64 id, s32 fd, u64 sk, u64 ts, u32 udp) {
    u64 key = (id & 0xffffffff00000000ULL) | (u32)fd;
    struct conn_info *ci = conns.lookup(&key);
    if (ci && ci->sk == sk)
        return ci;
    if (ci)
        emit_close(ctx, id, fd, ci);
    forget_unseen_io(sk);

    // Generations only need to differ between successive connections on one fd: a per-CPU
    // sequence tagged with the CPU id is unique without atomics.
    u32 zero = 0;
    u32 *seq = generation_seq.lookup(&zero);
    if (!seq)
        return 0;
    *seq += 1;
    struct conn_info fresh = {.sk = sk, .synthetic = sk, .http = {.resp_minor = 1}};
    fresh.generation = (bpf_get_smp_processor_id() << 24) | (*seq & 0xffffff);
    fresh.role = ci && !ci->sk ? ci->role : ROLE_UNKNOWN;
#ifndef FD_TRACKING
    // A socket new to this fd: its family, type and protocol, read once. Any but a TCP, MPTCP,
    // UDP or unix stream socket is kept as ignored, so that its next I/O costs this lookup and no
    // more.
    int protocol = traced_protocol((const void *)sk);
    if (protocol < 0) {
        fresh.ignored = 1;
        conns.update(&key, &fresh);
        return conns.lookup(&key);
    }
    udp = protocol == IPPROTO_UDP_;
    fresh.unix_stream = protocol == 0;
#endif
    fresh.udp = udp;

    struct tuple *t = sk_tuples.lookup(&sk);
    struct local_end *end = 0;
    if (t) {
        if (fresh.role == ROLE_UNKNOWN)
            fresh.role = t->role;
        fresh.http.family = t->family;
        fresh.http.local_port = t->lport;
        fresh.http.peer_port = t->rport;
        __builtin_memcpy(fresh.http.peer_addr, t->raddr, 16);
        struct endpoint_key peer = {.port = t->rport};
        __builtin_memcpy(peer.addr, t->raddr, 16);
        fresh.ignored = !port_wanted(t->lport, t->rport) || agent_endpoints.lookup(&peer);
    } else if (udp) {
        end = bound_ends.lookup(&key);
    }
    // Datagrams are never shed: a UDP socket is announced now, with the local end it was bound
    // to when the kernel gave no tuple. Unknown tuple with a port filter: user space resolves it
    // from /proc and marks the connection in ignored[] if it does not match.
    if (udp && !fresh.ignored)
        fresh.announced = emit_open(id, fd, ts, &fresh, t, end, udp, 0);
    conns.update(&key, &fresh);
#if defined(TCP_HEALTH) && !defined(FD_TRACKING)
    if (protocol == IPPROTO_TCP_ && !fresh.ignored)  // MPTCP's socket is no tcp_sock
        tcp_health_owned(sk, id >> 32, fresh.role, t, key);
#endif
    return conns.lookup(&key);
}

// One data event of connection ci; one that is lost sheds the rest of its HTTP/1 exchange.
// Sends the per-CPU data event whose data[] holds `captured` bytes of the `length` the syscall moved.
static __always_inline int submit_data(struct data_event *ev, u64 ts, u64 id, s32 fd, struct conn_info *ci,
                                       u32 direction, u32 length, u32 captured, u32 flags) {
    fill_header(&ev->h, EV_DATA, ts, id, fd, ci->generation);
    ev->h.flags = ci->http.lost ? HDR_AFTER_LOSS : 0;
    ev->direction = direction;
    ev->length = length;
    ev->flags = flags;
    ev->retransmissions = ci->retransmissions;
    // The mask gives the verifier a bound it can see (captured <= 2 * PAYLOAD_CAP - 1 fits data[]).
    asm volatile("" : "+r"(captured));
    captured &= (PAYLOAD_CAP << 1) - 1;
    ev->captured = captured;
    if (submit(ev, offsetof(struct data_event, data) + captured)) {
        http_lost(&ci->http);
        return -1;
    }
    ci->http.lost = 0;
    return 0;
}

// The bytes skipped_instead left out, if any, as one data event that moved them and copied none, stamped
// with the last call's: user space skips them as it skips any bytes past the cap, so a
// Content-Length body keeps its size and its end. Reserved in the ring, not built in the CPU's
// data event, which holds the call being sent.
static __always_inline void report_skipped(u64 id, s32 fd, struct conn_info *ci) {
    struct http_state *h = &ci->http;
    if (!h->skipped)
        return;
    u32 size = offsetof(struct data_event, data);
    struct data_event *ev = events.ringbuf_reserve(size);  // its fields only: no data[]
    u32 bytes = h->skipped;
    h->skipped = 0;
    if (!ev) {
        count(STAT_RINGBUF_FULL, 1);
        http_lost(h);
        return;
    }
    fill_header(&ev->h, EV_DATA, h->skipped_end, id, fd, ci->generation);
    ev->h.flags = h->lost ? HDR_AFTER_LOSS : 0;
    ev->direction = h->skipped_dir;
    ev->length = bytes;
    ev->captured = 0;
    ev->flags = ci->tls ? DATA_TLS : 0;  // plaintext from the SSL probes, as the calls were
    ev->retransmissions = ci->retransmissions;
    h->lost = 0;
    events.ringbuf_submit(ev, wakeup_flag(size));
}

// Whether a call of len bytes is left out of the ring, only counted: a body going on while user
// space is behind (http_observe), unless its last bytes end a chunked body (ends: the end is
// reported), bytes the other way are still to be reported, or the count would overflow. Calls
// of a large transfer come faster than user space drains even events that copy nothing; left
// out, they cannot fill the ring. Anything else the connection sends first reports what was
// left out.
static __always_inline int skipped_instead(struct conn_info *ci, u64 id, s32 fd, u32 direction, u32 len, u64 ts,
                                           u32 ends) {
    struct http_state *h = &ci->http;
    if (h->state == HTTP_YES && h->behind && !ends && (!h->skipped || h->skipped_dir == direction) &&
        len <= 0xffffffffU - h->skipped) {
        h->skipped += len;
        h->skipped_dir = direction;
        h->skipped_end = ts;
        return 1;
    }
    report_skipped(id, fd, ci);
    return 0;
}

// Copies the first of len bytes at base into ev's data[], at most cap of them; an unreadable
// buffer, or none (sendfile: bytes moved from a file, never through a user buffer), copies nothing.
static __always_inline void copy_head(struct data_event *ev, const char *base, u32 len, u32 cap) {
    u32 n = len < cap ? len : cap;
    // Barrier and mask: a bound the verifier can see (n <= 2 * PAYLOAD_CAP - 1 fits data[]).
    asm volatile("" : "+r"(n));
    n &= (PAYLOAD_CAP << 1) - 1;
    if (!base || bpf_probe_read_user(ev->data, n, base))
        n = 0;
    ev->captured = n;
    ev->length = len;
}

// A write outside any SSL call that starts with a TLS record header (content type 20-23, version
// 3.x) right after the thread's SSL call that named no socket: that SSL's socket is fd. Returns 1
// when so (the bytes are ciphertext). Plaintext never starts so: a connection is not taken for TLS
// by mistake.
static __always_inline int place_ssl(u32 tid, s32 fd, u32 generation, u64 ts, const char *base, u32 len) {
    struct unplaced_ssl *unplaced = unplaced_ssl.lookup(&tid);
    u8 record[3] = {};
    if (!unplaced || ts - unplaced->ts >= MEMORY_BIO_WINDOW_NS || len < 3 ||
        bpf_probe_read_user(record, sizeof(record), base))
        return 0;
    if (record[0] < 20 || record[0] > 23 || record[1] != 3 || record[2] > 4)
        return 0;
    u64 ssl = unplaced->ssl;
    struct ssl_socket socket = {.fd = fd, .generation = generation};
    ssl_fds.update(&ssl, &socket);
    unplaced_ssl.delete(&tid);
    return 1;
}

// The first bytes a syscall or SSL call moved (len of them at base: its buffer, or its first
// iovec segment), copied into the CPU's data event, which then holds them as the run that
// emit_segments goes on gathering. http_observe classifies them there, so the bytes are read from
// user memory once, not once to classify and again to copy. While the connection's exchange is
// shed only what classifying needs is copied; copy_rest completes it if the next one is kept.
static __always_inline struct data_event *copy_start(const char *base, u32 len, const struct http_state *h) {
    u32 cpu = bpf_get_smp_processor_id();
    struct data_event *ev = data_scratch.lookup(&cpu);
    if (ev)
        copy_head(ev, base, len, h->shed && h->state < HTTP_NO ? CLASSIFY_BYTES : PAYLOAD_CAP);
    return ev;
}

// copy_start's bytes after all, when it copied only what classifying needs.
static __always_inline void copy_rest(struct data_event *ev, const char *base) {
    if (ev->captured == CLASSIFY_BYTES && ev->length > CLASSIFY_BYTES)
        copy_head(ev, base, ev->length, PAYLOAD_CAP);
}

// How many of the rest bytes of a buffer or iovec segment (done of it already in events) the next
// event stands for. On HTTP/2 one read holds frames of many streams (a busy multiplexed connection
// coalesces them), and bytes past the cap would cost every stream whose frames lie there, not one
// body's tail: there a buffer goes a cap at a time, up to H2_CHUNKS events, the last also standing
// for what is left (moved, not copied, so the parser skips it). Elsewhere: all of it.
static __always_inline u32 piece_length(const struct conn_info *ci, u32 rest, u32 done) {
    return ci->http.h2 && !ci->http.behind && rest > PAYLOAD_CAP && done < (H2_CHUNKS - 1) * PAYLOAD_CAP
               ? PAYLOAD_CAP
               : rest;
}

// Whether the hidden bytes of an HTTP/1 call (not copied, before end) end with a chunked body's
// end: CRLF, then the last chunk "0" CRLF CRLF. A reader of a large download gets many chunks a
// read; with their size lines hidden user space can tell where the body ends only so
// (DATA_LAST_CHUNK). The bytes are read into ev's data[] past anything a copy fills (< 2 caps).
static __always_inline u32 ends_chunked(struct data_event *ev, const struct conn_info *ci, const char *end,
                                        u32 hidden) {
    char *last = ev->data + 2 * PAYLOAD_CAP;
    if (ci->http.state != HTTP_YES || hidden < 7 || bpf_probe_read_user(last, 8, end - 8))
        return 0;
    u64 w;
    __builtin_memcpy(&w, last, 8);
    return (w >> 8) == 0x0a0d0a0d300a0dULL ? DATA_LAST_CHUNK : 0;  // "\r\n0\r\n\r\n", little-endian
}

// ends_chunked for a vectored call (io), whose end is its last segment's: it ends with the last
// chunk, or is the last chunk alone, "0" CRLF CRLF. Read only while the call may be left out.
static __always_inline u32 vectored_ends_chunked(struct data_event *ev, const struct conn_info *ci,
                                                 const struct active_io *io) {
    struct uiovec last = {};
    const struct uiovec *iov = (const struct uiovec *)io->buf;
    if (!io->iovcnt || bpf_probe_read_user(&last, sizeof(last), &iov[io->iovcnt - 1]) || !last.base)
        return 0;
    if (last.len == 5) {
        u64 w = 0;
        if (bpf_probe_read_user(&w, 5, last.base))
            return 0;
        return w == 0x0a0d0a0d30ULL ? DATA_LAST_CHUNK : 0;  // "0\r\n\r\n", little-endian
    }
    return ends_chunked(ev, ci, last.base + last.len, last.len);
}

// Submits the event copy_start made of one buffer (ev->length bytes at base), in pieces
// (piece_length).
static __always_inline void submit_buffer(struct data_event *ev, u64 ts, u64 id, s32 fd, struct conn_info *ci,
                                          u32 direction, const char *base, u32 flags) {
    u32 len = ev->length;
    if (ci->http.state == HTTP_YES && ci->http.behind && ev->captured > CLASSIFY_BYTES)
        ev->captured = CLASSIFY_BYTES;  // an HTTP/1 body while user space is behind (http_observe)
    if (base)
        flags |= ends_chunked(ev, ci, base + len, len - ev->captured);
    if (skipped_instead(ci, id, fd, direction, len, ts, flags & DATA_LAST_CHUNK))
        return;
    if (!base) {  // sendfile: nothing to copy
        submit_data(ev, ts, id, fd, ci, direction, len, ev->captured, flags);
        return;
    }
    u32 off = 0;
    for (int i = 0; i < H2_CHUNKS; i++) {
        u32 moved = piece_length(ci, len - off, off);
        if (i)
            copy_head(ev, base + off, moved, PAYLOAD_CAP);
        if (submit_data(ev, ts, id, fd, ci, direction, moved, ev->captured, flags))
            return;
        off += moved;
        if (off >= len)
            return;
    }
}

// Where a vectored call's gathering stands: the bytes of the call not yet in an event, the segment,
// and how many of its bytes are already in events (more than none only for a segment taken in
// pieces, piece_length). It lives in a map value (segments_left), which the verifier does not
// track: the paths through one iteration (a whole segment or a piece of it, a cap or less) then
// meet again at the next one instead of multiplying over the iterations.
struct segment_at {
    u64 left;
    u32 seg;
    u32 done;
};

// The rest of a syscall's bytes after copy_start's run (the segments of a vectored write or read
// on a stream), and then the run gathered: as few events as the cap allows, each a run of
// consecutive bytes (grpcio writes one small segment per HPACK field and frame header: an event
// each would cost user space a record apiece). An event's captured bytes are a prefix of its
// length: a piece that does not fit what is gathered starts the next event, and one past the cap
// (or unreadable) ends its event with its uncopied rest. head: the first two segments, read with
// the first (0: read every segment from user memory); at: where to start, then where it stopped.
// Returns the bytes that no event covered (past max_pieces pieces, or unreadable), or -1 when an
// event was lost.
static __always_inline long emit_segments(struct data_event *ev, u64 ts, u64 id, struct active_io *io,
                                          struct conn_info *ci, const struct uiovec *head,
                                          struct segment_at *at, const u32 max_pieces) {
    struct uiovec *iov = (struct uiovec *)io->buf;
    u32 last_chunk = 0;  // the call's last piece hides the end of a chunked body (ends_chunked)
    // What is gathered lives in the event (captured, length), and where it stands in *at, not in
    // locals (read anew each iteration): the verifier then knows them only as bounded, and the
    // loop has one send.
// a bounded loop (Linux 5.3+): unrolling its iterations would multiply the program and its compile memory
    for (int k = 0; k < max_pieces; k++) {
        u64 left = *(volatile u64 *)&at->left;
        u32 i = *(volatile u32 *)&at->seg, done = *(volatile u32 *)&at->done;
        if (i >= io->iovcnt || left == 0)
            break;
        struct uiovec seg = {};
        if (head && i < 2)
            seg = i ? head[1] : head[0];
        else if (bpf_probe_read_user(&seg, sizeof(seg), &iov[i]))
            break;
        u64 rest = seg.len > done ? seg.len - done : 0;
        u32 len = piece_length(ci, rest < left ? rest : left, done);  // left <= ret, a syscall's count: fits u32
        u32 off = ev->captured;
        if (ev->length && (ev->length != off || off + len > PAYLOAD_CAP)) {  // ended, or full
            if (submit_data(ev, ts, id, io->fd, ci, io->direction, ev->length, off, 0))
                return -1;
            off = 0;
        }
        u32 to = off, n = len < PAYLOAD_CAP ? len : PAYLOAD_CAP;
        // Masks the verifier can see: to < PAYLOAD_CAP, n < 2 * PAYLOAD_CAP, inside data[].
        asm volatile("" : "+r"(to));
        asm volatile("" : "+r"(n));
        to &= PAYLOAD_CAP - 1;
        n &= (PAYLOAD_CAP << 1) - 1;
        if (n && bpf_probe_read_user(ev->data + to, n, seg.base + done))
            n = 0;  // unreadable: moved, not copied
        ev->captured = to + n;
        ev->length = to + len;
        if (left == len)
            last_chunk = ends_chunked(ev, ci, seg.base + done + len, len - n);
        at->left = left - len;
        if (done + len >= seg.len || left == len) {
            at->seg = i + 1;
            at->done = 0;
        } else {
            at->done = done + len;
        }
    }
    if (ev->length && submit_data(ev, ts, id, io->fd, ci, io->direction, ev->length, ev->captured, last_chunk))
        return -1;
    return at->left;
}

// A vectored call with more segments than its exit gathers (MAX_IOV: Node.js's http2 writes 4 a
// stream, 32 streams at once; C-core gRPC up to 260 in one sendmsg when many calls are in
// flight): where the exit stopped, for segments_more, a program of its own that the exit
// tail-calls, which goes on for MORE_IOV pieces more and may call itself again: SEGMENT_PASSES
// in all, MAX_IOV + SEGMENT_PASSES * MORE_IOV pieces a call (320; a piece is a segment, or a cap
// of a larger one on HTTP/2). A longer loop in one program
// would cost every start-up its verification, and 128 segments in segments_more (whose loop
// starts at a segment the verifier does not know) is past the verifier's limit.
#define SEGMENT_PASSES 4
#define MORE_IOV 64
struct segments_left {
    struct active_io io;
    u64 ts;
    u64 id;
    struct segment_at at;  // where to go on from
    u32 passes;
};
BPF_PERCPU_ARRAY(segments_left, struct segments_left, 1);
BPF_PROG_ARRAY(segments_tail, 1);  // [0]: segments_more
#ifdef COPY_IN_SOCK
// A tail call stays within one program type: the reads and writes the sock tracepoints (raw
// tracepoints) copy go on in programs loaded as raw tracepoints too.
#define SOCK_TAIL_SEGMENTS 0  // segments_more_sock: segments_more, for them
#define SOCK_TAIL_IOV 1       // sock_iov: a vectored read or write
BPF_PROG_ARRAY(sock_tail, 2);
#endif

static __always_inline void segments_call(void *ctx, const int raw_tp) {
#ifdef COPY_IN_SOCK
    if (raw_tp) {
        sock_tail.call(ctx, SOCK_TAIL_SEGMENTS);
        return;
    }
#endif
    segments_tail.call(ctx, 0);
}

// Hands the rest of a vectored call (rest->at: where its exit stopped) to segments_more; returns
// only when that could not be done (the rest is then a gap).
static __always_inline void more_segments(void *ctx, struct segments_left *rest, u64 ts, u64 id,
                                          const struct active_io *io, const int raw_tp) {
    rest->io = *io;
    rest->ts = ts;
    rest->id = id;
    rest->passes = 1;
    segments_call(ctx, raw_tp);
}

// Segments no event covered: reported as moved but not copied, so parsers skip them.
static __always_inline void segments_gap(struct data_event *ev, u64 ts, u64 id, const struct active_io *io,
                                         struct conn_info *ci, u64 left) {
    submit_data(ev, ts, id, io->fd, ci, io->direction, left, 0, 0);
    count(STAT_IOV_BYTES, left);
}

// One datagram: its peer from the sockaddr at name (sendto/sendmsg's destination, or where
// recvfrom/recvmsg wrote the source), its payload gathered from buf (iovcnt 0) or from the iovec
// array, up to PAYLOAD_CAP bytes; len bytes in all.
static __always_inline void emit_dgram(u64 ts, u64 id, s32 fd, u32 generation, u32 direction, u64 buf,
                                       u32 iovcnt, u64 name, u64 len, const int max_iov) {
    u32 cpu = bpf_get_smp_processor_id();
    struct dgram_event *ev = dgram_scratch.lookup(&cpu);
    if (!ev)
        return;
    fill_header(&ev->h, EV_DGRAM, ts, id, fd, generation);
    ev->direction = direction;
    ev->length = len;
    ev->flags = 0;
    ev->family = 0;
    ev->port = 0;
    struct usockaddr sa = {};
    if (name && !bpf_probe_read_user(&sa, 8, (const void *)name) &&
        (sa.family == AF_INET || sa.family == AF_INET6)) {
        ev->family = sa.family;
        ev->port = __builtin_bswap16(sa.port_be);
        if (sa.family == AF_INET) {
            __builtin_memset(ev->addr, 0, 16);
            __builtin_memcpy(ev->addr, &sa.v4, 4);
        } else if (bpf_probe_read_user(ev->addr, 16, ((const struct usockaddr *)name)->v6)) {
            ev->family = 0;
        }
    }
    u32 off = 0;
    if (!iovcnt) {
        u32 n = len < PAYLOAD_CAP ? len : PAYLOAD_CAP;
        asm volatile("" : "+r"(n));
        n &= (PAYLOAD_CAP << 1) - 1;
        if (buf && !bpf_probe_read_user(ev->data, n, (const void *)buf))
            off = n;
    } else {
        u64 left = len;
        struct uiovec *iov = (struct uiovec *)buf;
        for (int i = 0; i < max_iov; i++) {
            if (i >= iovcnt || left == 0 || off >= PAYLOAD_CAP)
                break;
            struct uiovec seg = {};
            if (bpf_probe_read_user(&seg, sizeof(seg), &iov[i]))
                break;
            u64 seglen = seg.len < left ? seg.len : left;
            left -= seglen;
            u32 room = PAYLOAD_CAP - off;
            u32 n = seglen < room ? seglen : room;
            u32 at = off;
            // Masks the verifier can see: at < PAYLOAD_CAP, n < 2 * PAYLOAD_CAP, inside data[].
            asm volatile("" : "+r"(n));
            asm volatile("" : "+r"(at));
            n &= (PAYLOAD_CAP << 1) - 1;
            at &= PAYLOAD_CAP - 1;
            if (n && bpf_probe_read_user(ev->data + at, n, seg.base))
                break;
            off = at + n;
        }
    }
    u32 size = off;
    asm volatile("" : "+r"(size));
    size &= (PAYLOAD_CAP << 1) - 1;
    ev->captured = size;
    submit(ev, offsetof(struct dgram_event, data) + size);
}

// The datagrams of a UDP syscall: one, or each message of a sendmmsg/recvmmsg (ret messages, each
// with its own peer and length), up to MAX_MMSG of them; the rest are counted.
static __always_inline void exit_dgram(u64 ts, u64 id, struct active_io *io, u32 generation, long ret,
                                       const int mmsg, const u32 max_iov) {
    if (!mmsg) {
        emit_dgram(ts, id, io->fd, generation, io->direction, io->buf, io->iovcnt, io->name, ret, max_iov);
        return;
    }
    struct ummsghdr *vec = (struct ummsghdr *)io->buf;
    for (int i = 0; i < MAX_MMSG; i++) {
        if (i >= ret)
            return;
        struct ummsghdr m = {};
        if (bpf_probe_read_user(&m, sizeof(m), &vec[i]))
            return;
        emit_dgram(ts, id, io->fd, generation, io->direction, (u64)m.iov,
                   m.iovlen > 0xffff ? 0xffff : m.iovlen, (u64)m.name, m.msg_len, MAX_MMSG_IOV);
    }
    if (ret > MAX_MMSG)
        count(STAT_MMSG_CALLS, ret - MAX_MMSG);
}

// mmsg and max_iov: compile-time constants, so that each program carries only the loops its
// syscall needs: mmsg is 1 only in the sendmmsg/recvmmsg programs (the batch loop), max_iov (the
// iovec segments copied) MAX_IOV only in those of the vectored syscalls, 1 in the others.
// A syscall's exit, with the thread's slot (iop).
static __always_inline void exit_io_body(void *ctx, struct active_io *iop, long ret, const int mmsg, const int raw_tp,
                                         const u32 max_iov) {
    u64 id = current_pid_tgid();
    u32 tid = id;
    struct active_io io = *iop;
    iop->kind = IO_DONE;
    if (ret <= 0 || io.kind != (mmsg ? IO_MMSG : IO_DATA))
        return;
#ifdef FD_TRACKING
    u64 fd_key = (id & 0xffffffff00000000ULL) | (u32)io.fd;
    struct conn_info *tracked = conns.lookup(&fd_key);
    if (tracked)
        io.sk = tracked->sk ? tracked->sk : tracked->synthetic;
#endif
    if (!io.sk)
        return;

    // Bytes leave a sender when its syscall starts and reach a receiver when its syscall ends;
    // stamping them so keeps a client's span around the server's even on loopback, where the
    // reader can return before the writer's syscall does.
    u64 ts = io.ts ? io.ts : bpf_ktime_get_ns();
    struct conn_info *ci = upsert_conn(ctx, id, io.fd, io.sk, ts, io.udp);
    if (!ci || ci->ignored)
        return;
    io.udp = ci->udp;  // on the stack: branching on the map value later costs the verifier more states
    if ((io.tls & IO_SSL_USER) && io.direction == DIR_INGRESS) {
        struct last_read read = {.fd = io.fd, .ts = ts};
        last_read.update(&tid, &read);
    }
    if (ci->tls || (io.tls & IO_IN_SSL)) {  // ciphertext: the SSL probes report the plaintext
        ci->tls = 1;
        struct active_ssl *ssl = (io.tls & IO_IN_SSL) ? active_ssl.lookup(&tid) : 0;
        if (ssl && ssl->fd < 0)
            ssl->fd = io.fd;
        return;
    }
    u64 key = (id & 0xffffffff00000000ULL) | (u32)io.fd;
    u32 *gave_up = setting(SET_GAVE_UP) ? ignored.lookup(&key) : 0;
    if (gave_up && *gave_up == ci->generation)
        return;
    u32 generation = ci->generation;

    if (io.udp) {
        exit_dgram(ts, id, &io, generation, ret, mmsg, max_iov);
        return;
    }
    if (mmsg) {  // batched on a stream socket: counted, not copied
        count(STAT_MMSG_CALLS, 1);
        return;
    }
    // HTTP/1 is counted here, and its bytes copied only when its exchange is not shed; what
    // starts a message is in the buffer, or in the first iovec segment.
    // The first two iovec segments in one read (a server's head and body, as nginx writes them).
    struct uiovec head[2] = {{.base = (const char *)io.buf, .len = ret}};
    if (io.iovcnt && bpf_probe_read_user(head, io.iovcnt > 1 ? sizeof(head) : sizeof(head[0]), (void *)io.buf)) {
        head[0].base = 0;  // moved, not copied: one event
        head[0].len = ret;
        io.iovcnt = 0;
    }
    struct uiovec first = head[0];
    u32 first_len = first.len < ret ? first.len : ret;
    if ((io.tls & IO_SSL_USER) && io.direction == DIR_EGRESS &&
        place_ssl(tid, io.fd, generation, ts, first.base, first_len)) {
        ci->tls = 1;
        return;
    }
    struct data_event *ev = copy_start(first.base, first_len, &ci->http);
    if (!ev)
        return;
    int copy = http_observe(id >> 32, &ci->role, 0, &ci->http, io.direction, (const u8 *)ev->data, ev->captured, ret, ts);
#ifdef INJECT
    // A server's read that started a request (last_req_ts: http_observe), or its response.
    if (ci->role == ROLE_SERVER && (io.direction == DIR_EGRESS || ci->http.last_req_ts == ts))
        inject_serving(iop, key, generation, first.base, first_len, ts, copy);
#endif
    if (!copy) {
        report_skipped(id, io.fd, ci);  // what was left out ends before this shed exchange
        return;
    }
    announce(id, io.fd, ts, ci);
    copy_rest(ev, first.base);
    if (max_iov == 1 || !io.iovcnt || first_len == ret) {  // one buffer, or all in the first segment
        submit_buffer(ev, ts, id, io.fd, ci, io.direction, first.base, 0);
        return;
    }
    if (skipped_instead(ci, id, io.fd, io.direction, ret, ts, ci->http.behind ? vectored_ends_chunked(ev, ci, &io) : 0))
        return;
    u32 zero = 0;
    struct segments_left *rest = segments_left.lookup(&zero);
    if (!rest)
        return;  // never: a per-CPU array's one element
    rest->at.left = ret - first_len;
    rest->at.seg = 1;
    rest->at.done = 0;
    if (ev->captured == PAYLOAD_CAP && piece_length(ci, first_len, 0) < first_len) {  // its first piece
        ev->length = PAYLOAD_CAP;
        rest->at.left = ret - PAYLOAD_CAP;
        rest->at.seg = 0;
        rest->at.done = PAYLOAD_CAP;
    }
    long left = emit_segments(ev, ts, id, &io, ci, head, &rest->at, max_iov);
    if (left > 0 && rest->at.seg < io.iovcnt)
        more_segments(ctx, rest, ts, id, &io, raw_tp);
    if (left > 0)
        segments_gap(ev, ts, id, &io, ci, left);
}

// The segments of a vectored call past those its exit gathered (more_segments).
static __always_inline int segments_go_on(void *ctx, const int raw_tp) {
    u32 zero = 0, cpu = bpf_get_smp_processor_id();
    struct segments_left *rest = segments_left.lookup(&zero);
    struct data_event *ev = data_scratch.lookup(&cpu);
    u64 key = rest ? (rest->id & 0xffffffff00000000ULL) | (u32)rest->io.fd : 0;
    struct conn_info *ci = rest ? conns.lookup(&key) : 0;
    if (rest && ev && ci) {
        ev->length = ev->captured = 0;  // a new run: the exit sent what it had gathered
        long left = emit_segments(ev, rest->ts, rest->id, &rest->io, ci, 0, &rest->at, MORE_IOV);
        if (left > 0 && rest->at.seg < rest->io.iovcnt && rest->passes < SEGMENT_PASSES) {
            rest->passes += 1;
            segments_call(ctx, raw_tp);
        }
        if (left > 0)
            segments_gap(ev, rest->ts, rest->id, &rest->io, ci, left);
    }
#ifdef INJECT
    inject_tail.call(ctx, 0);  // what the syscall's exit would have done after its data events
#endif
    return 0;
}

int segments_more(void *ctx) { return segments_go_on(ctx, 0); }
#ifdef COPY_IN_SOCK
int segments_more_sock(void *ctx) { return segments_go_on(ctx, 1); }
#endif

static __always_inline void exit_io_(void *ctx, long ret, const int mmsg, const u32 max_iov) {
    struct active_io *iop = current_io();
    if (iop)
        exit_io_body(ctx, iop, ret, mmsg, 0, max_iov);
#ifdef INJECT
    // After the data event, what the syscall decided goes to user space: inject_exit, a program of
    // its own (a tail call costs this one no stack, and it has none to spare).
    inject_tail.call(ctx, 0);
#endif
}

static __always_inline void exit_io(void *ctx, long ret) { exit_io_(ctx, ret, 0, 1); }
static __always_inline void exit_iov(void *ctx, long ret) { exit_io_(ctx, ret, 0, MAX_IOV); }

TRACEPOINT_PROBE(syscalls, sys_enter_write) { enter_io(args->fd, args->buf, 0, DIR_EGRESS, 0, IO_DATA); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_sendto) { enter_io(args->fd, args->buff, 0, DIR_EGRESS, args->addr, IO_DATA); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_writev) { enter_io(args->fd, args->vec, args->vlen, DIR_EGRESS, 0, IO_DATA); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg) { enter_msg(args->fd, (const struct umsghdr *)args->msg, DIR_EGRESS, 0); return 0; }
#ifndef COPY_IN_SOCK  // else sock_send_length copies
TRACEPOINT_PROBE(syscalls, sys_exit_write) { exit_io(args, args->ret); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_sendto) { exit_io(args, args->ret); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_writev) { exit_iov(args, args->ret); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_sendmsg) { exit_iov(args, args->ret); return 0; }
#endif

#ifndef FD_TRACKING
#ifdef COPY_IN_SOCK
// The bytes of the syscall in the slot, from a sock tracepoint: a plain buffer's here, a vectored
// call's in sock_iov (with a plain buffer's path beside the iovec loops, one program is past the
// verifier's million instructions).
static __always_inline void copy_in_sock(void *ctx, struct active_io *io, int ret) {
    io->kind = IO_DATA;
    if (io->iovcnt) {
        sock_tail.call(ctx, SOCK_TAIL_IOV);
        io->kind = IO_DONE;  // not loaded yet
        return;
    }
    exit_io_body(ctx, io, ret, 0, 1, 1);
}

// A write whose enter made the slot (io) and whose bytes the socket took: a write, writev, sendto
// or sendmsg (sendfile's and sendmmsg's exits report theirs) of the slot's fd, still in flight.
// A send outside those (count_outside_syscalls) is counted: io, the thread's slot, tells that the
// thread is traced without a lookup, which every untraced send on the node would pay.
static __always_inline int write_in_flight(const struct active_io *io, const void *sk) {
    struct pt_regs *regs = syscall_regs();
    if (syscall_in_flight(regs, NR_WRITE, NR_WRITEV, NR_SENDTO, NR_SENDMSG) < 0) {
        count_outside_syscalls(regs, sk);
        return 0;
    }
    return io->kind == IO_DATA && io->direction == DIR_EGRESS && (s32)regs->di == io->fd;
}
#endif

// sock_send_length(sk, ret, flags) runs once the socket took a send's bytes, still in the user's
// buffer: with COPY_IN_SOCK they are copied here, stamped when the syscall began (its enter).
RAW_TRACEPOINT_PROBE(sock_send_length) {
    struct active_io *io = on_sock_io((const void *)ctx->args[0]);
#ifdef COPY_IN_SOCK
    int ret = ctx->args[1];
    if (io && ret > 0 && write_in_flight(io, (const void *)ctx->args[0]))
        copy_in_sock(ctx, io, ret);
#endif
    return 0;
}

// A read's bytes are in the user's buffer when sock_recv_length(sk, ret, flags) runs: with
// COPY_IN_SOCK its read is copied here (read_slot), with no program on the syscall.
RAW_TRACEPOINT_PROBE(sock_recv_length) {
    const void *sk = (const void *)ctx->args[0];
    int ret = ctx->args[1];
    // Nothing read (EAGAIN: half the reads of an event-driven server and of its clients, on every
    // process of the node): no lookup at all. A slot's socket is set by the reads that move bytes.
    if (ret <= 0)
        return 0;
#ifdef COPY_IN_SOCK
    struct active_io *io = read_slot(sk, ctx->args[2]);
#else
    struct active_io *io = on_sock_io(sk);
#endif
    if (!io)
        return 0;
    // The read's stamp: when the socket handed its bytes over, just before the syscall returns.
    io->ts = bpf_ktime_get_ns();
#if defined(TCP_HEALTH) && defined(TCP_SRTT_US)
    tcp_health_read((u64)sk, io->ts);  // a traced process received data: its RTT now (TCP's only)
#endif
#ifdef COPY_IN_SOCK
    if (io->kind == IO_READ && !read_at_exit(io))
        copy_in_sock(ctx, io, ret);
#endif
    return 0;
}

#ifdef COPY_IN_SOCK
// A vectored read or write (readv, recvmsg, writev, sendmsg) that copy_in_sock hands on.
int sock_iov(struct bpf_raw_tracepoint_args *ctx) {
    struct active_io *io = current_io();
    if (io && io->kind == IO_DATA)
        exit_io_body(ctx, io, (int)ctx->args[1], 0, 1, MAX_IOV);
    return 0;
}
#endif
#endif

#ifdef COPY_IN_SOCK
// The exit of a recvfrom or recvmsg that names its sender (read_at_exit): the slot sock_recv_length
// made inside this very syscall, now with the sender's address in the user's buffer. Other reads
// find their slot done and return.
static __always_inline void exit_named_read(void *ctx, long ret, const int msg) {
    struct active_io *iop = current_io();
    if (!iop || iop->kind != IO_READ)
        return;
    iop->kind = IO_DONE;
    if (iop->nr != (msg ? NR_RECVMSG : NR_RECVFROM) || ret <= 0)
        return;
    if (!msg) {
        iop->name = syscall_regs()->r8;
    } else {
        struct umsghdr m = {};
        if (bpf_probe_read_user(&m, sizeof(m), (void *)iop->buf) || m.iovlen == 0)
            return;
        iop->buf = (u64)m.iov;
        iop->iovcnt = m.iovlen > 0xffff ? 0xffff : m.iovlen;
        iop->name = (u64)m.name;
    }
    iop->kind = IO_DATA;
    exit_io_body(ctx, iop, ret, 0, 0, msg ? MAX_IOV : 1);
}

TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { exit_named_read(args, args->ret, 0); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { exit_named_read(args, args->ret, 1); return 0; }
#else
TRACEPOINT_PROBE(syscalls, sys_enter_read) { enter_io(args->fd, args->buf, 0, DIR_INGRESS, 0, IO_DATA); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_read) { exit_io(args, args->ret); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom) {
    if (!(args->flags & READ_NOT_COPIED))
        enter_io(args->fd, args->ubuf, 0, DIR_INGRESS, args->addr, IO_DATA);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { exit_io(args, args->ret); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_readv) { enter_io(args->fd, args->vec, args->vlen, DIR_INGRESS, 0, IO_DATA); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_readv) { exit_iov(args, args->ret); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg) { enter_msg(args->fd, (const struct umsghdr *)args->msg, DIR_INGRESS, args->flags); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { exit_iov(args, args->ret); return 0; }
#endif

// sendfile moves bytes the process never holds: reported as moved, none captured, so parsers
// can skip over them (a body) instead of losing their place.
TRACEPOINT_PROBE(syscalls, sys_enter_sendfile64) { enter_io(args->out_fd, 0, 0, DIR_EGRESS, 0, IO_DATA); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_sendfile64) { exit_io(args, args->ret); return 0; }

// sendmmsg/recvmmsg batch several datagrams per call (UDP: one event each, up to MAX_MMSG; the
// rest counted). On a TCP socket the batch is not copied: user space's parsers resynchronise.
TRACEPOINT_PROBE(syscalls, sys_enter_sendmmsg) { enter_io(args->fd, args->mmsg, args->vlen, DIR_EGRESS, 0, IO_MMSG); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_sendmmsg) { exit_io_(args, args->ret, 1, 1); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_recvmmsg) {
    if (!(args->flags & READ_NOT_COPIED))
        enter_io(args->fd, args->mmsg, args->vlen, DIR_INGRESS, 0, IO_MMSG);
    return 0;
}
TRACEPOINT_PROBE(syscalls, sys_exit_recvmmsg) { exit_io_(args, args->ret, 1, 1); return 0; }
