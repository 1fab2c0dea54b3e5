// TCP health of traced connections: retransmissions, resets sent and received, smoothed RTT.
// Appended to socket_trace.c when capture.tcp_health is on (built with -DTCP_HEALTH), so that it
// shares that program's targets, port filter and stats; user space reads tcp_series once per
// interval (otel_ebpf/probes/tcp_health.py): no per-packet work there.
//
// The tcp tracepoints fire in softirq or timer context, where the current task is whoever the
// CPU interrupted, not the socket's owner. So ownership is learnt where the owner *is* current,
// and keyed by the kernel socket (skaddr), the one thing every tcp tracepoint names:
//   connect():  sock:inet_sock_set_state CLOSE -> SYN_SENT runs in the connecting syscall,
//               so a refused connect's reset is counted too (tcp_health_connecting);
//   first I/O:  socket_trace.c's upsert_conn, when a traced process's read or write first names
//               the socket (accepted connections, and those older than the agent).
// A socket's owner entry is its series key itself, so each tcp tracepoint costs one hash lookup
// that misses, and returns, for every untraced socket. Keying by tuple instead would mean
// parsing three different address layouts per packet before that first check.
// tcp:tcp_destroy_sock forgets the socket: not its move to CLOSE, which comes before the reset
// of an aborted connection (tcp_disconnect sets CLOSE, then sends the RST).
//
// Limits: with FD_TRACKING (kernels before 6.3) only connect()ed sockets are learnt; a server's
// retransmissions before its first read or write (SYN-ACK) are not counted; a socket whose
// handshake the kernel never showed (older than the agent) has no peer in its key.
//
// Compile-time constants: MAX_CONNS, MAX_TCP_SERIES; TCP_DROPS and SKB_SK (below); TCP_FLOWS
// (bytes and packets, tcp_flows.c).

#define TCP_RTT_NBUCKETS 21  // otel_ebpf/tcp_metrics.py RTT_BOUNDARIES_S (20 boundaries) and +Inf

struct tcp_series_key {
    u32 tgid;
    u16 server_port;  // the peer's for a client, the local one for a server
    u8 role;          // ROLE_*
    u8 pad;
    u16 family;       // of peer_addr; 0: unknown
    u16 pad2;
    u8 peer_addr[16];
};

struct tcp_series {
    u64 retransmissions;
    u64 resets_sent;
    u64 resets_received;
    u64 rtt_count;
    u64 rtt_sum_us;
    u64 rtt_min_us;  // 0 until the first sample on this CPU
    u64 rtt_max_us;
    u64 rtt_buckets[TCP_RTT_NBUCKETS];
};

// tcp_stats[] slots (per-CPU), kernel.drops reasons in tcp_health.py
#define TCP_STAT_SERIES_FULL 0  // events not counted: tcp_series was full
#define TCP_STAT_OWNERS_FULL 1  // traced sockets not learnt: tcp_owners was full
#define TCP_STAT_DROPS_FULL 2   // dropped packets not counted: tcp_drops was full
#define TCP_STAT_FLOWS_FULL 3   // packets not counted: tcp_flows was full (tcp_flows.c)
#define TCP_NSTATS 4

// A traced socket's owner: its series, and the traced connection (tgid << 32 | fd in conns) whose
// own retransmission count its data events carry, for its exchanges' spans (0 until its first I/O).
struct tcp_owner {
    struct tcp_series_key series;
    u64 conn;
};

BPF_HASH(tcp_owners, u64, struct tcp_owner, MAX_CONNS);
BPF_TABLE("percpu_hash", struct tcp_series_key, struct tcp_series, tcp_series, MAX_TCP_SERIES);
BPF_PERCPU_ARRAY(tcp_stats, u64, TCP_NSTATS);

static __always_inline void tcp_count(u32 slot) {
    u64 *v = tcp_stats.lookup(&slot);
    if (v)
        *v += 1;
}

#ifdef TCP_FLOWS
// Defined in tcp_flows.c, appended after this file.
static __always_inline void tcp_flows_owned(u64 sk, struct tcp_series_key *series);
#endif

static __always_inline void tcp_own(u64 sk, struct tcp_series_key *key, u64 conn) {
    struct tcp_owner owner = {.series = *key, .conn = conn};
    if (tcp_owners.update(&sk, &owner)) {
        tcp_count(TCP_STAT_OWNERS_FULL);
        return;
    }
#ifdef TCP_FLOWS
    tcp_flows_owned(sk, key);
#endif
}

// A traced process connects (sock:inet_sock_set_state CLOSE -> SYN_SENT, in connect()); t: its
// destination (the local port may not be chosen yet).
static __always_inline void tcp_health_connecting(u64 sk, struct tuple *t) {
    u32 tgid = current_pid_tgid() >> 32;  // as targets[] numbers it (current_task.h)
    if (!is_target(tgid) || !port_wanted(t->lport, t->rport))
        return;
    struct tcp_series_key key = {.tgid = tgid, .server_port = t->rport, .role = ROLE_CLIENT, .family = t->family};
    __builtin_memcpy(key.peer_addr, t->raddr, 16);
    tcp_own(sk, &key, 0);
}

// A traced process's read or write names its TCP socket for the first time (upsert_conn); t is
// the handshake's tuple when the kernel showed it; conn its key in conns.
static __always_inline void tcp_health_owned(u64 sk, u32 tgid, u8 role, struct tuple *t, u64 conn) {
    struct tcp_series_key key = {.tgid = tgid, .role = role};
    if (t) {
        key.family = t->family;
        // Unknown role (no handshake seen): the lower port is taken for the server's.
        if (role == ROLE_UNKNOWN)
            key.role = t->lport < t->rport ? ROLE_SERVER : ROLE_CLIENT;
        key.server_port = key.role == ROLE_CLIENT ? t->rport : t->lport;
        __builtin_memcpy(key.peer_addr, t->raddr, 16);
    }
    tcp_own(sk, &key, conn);
}

// A new series' first value, never written: all zeros (224 bytes), kept off the callers' stacks.
BPF_ARRAY(tcp_series_zero, struct tcp_series, 1);

static __always_inline struct tcp_series *tcp_series_for(struct tcp_owner *owner) {
    u32 slot = 0;
    struct tcp_series *zero = tcp_series_zero.lookup(&slot);
    if (!zero)
        return 0;
    struct tcp_series *series = tcp_series.lookup_or_try_init(&owner->series, zero);
    if (!series)
        tcp_count(TCP_STAT_SERIES_FULL);
    return series;
}

// The series of a traced socket, or 0 (the first, cheap, exit for every other socket).
static __always_inline struct tcp_series *tcp_series_of(const void *skaddr) {
    u64 sk = (u64)skaddr;
    struct tcp_owner *owner = tcp_owners.lookup(&sk);
    return owner ? tcp_series_for(owner) : 0;
}

// Counted twice: in the series, and on the connection, whose data events carry its running
// count so that user space tells which exchanges were in flight (the rare path pays the second
// lookup, not every data event). An fd reused since names another socket: not counted there.
TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
#ifdef TCP_RETRANSMIT_ERR
    if (args->err)  // a failed attempt (newer kernels report those too): nothing was resent
        return 0;
#endif
    u64 sk = (u64)args->skaddr;
    struct tcp_owner *owner = tcp_owners.lookup(&sk);
    if (!owner)
        return 0;
    struct tcp_series *s = tcp_series_for(owner);
    if (s)
        s->retransmissions += 1;
    u64 conn = owner->conn;
    struct conn_info *ci = conn ? conns.lookup(&conn) : 0;
    if (ci && ci->sk == sk)
        __sync_fetch_and_add(&ci->retransmissions, 1);
    return 0;
}

// Linux 6.10+ names the reset's reason with this enum (include/net/rstreason.h), which BCC's
// generated args struct uses but no header it includes defines: an int-sized stand-in.
enum sk_rst_reason { TCP_HEALTH_RST_REASON_UNUSED };

// skaddr is 0 for a reset answering a segment no socket wanted (a refused SYN): nobody's.
TRACEPOINT_PROBE(tcp, tcp_send_reset) {
    struct tcp_series *s = tcp_series_of(args->skaddr);
    if (s)
        s->resets_sent += 1;
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_receive_reset) {
    struct tcp_series *s = tcp_series_of(args->skaddr);
    if (s)
        s->resets_received += 1;
    return 0;
}

// The RTT bucket of srtt_us: boundaries 2^4 .. 2^23 us, upper-inclusive as in OTLP.
static __always_inline u32 rtt_bucket(u32 us) {
    u32 b = 0;
#pragma unroll
    for (int i = 4; i < 4 + TCP_RTT_NBUCKETS - 1; i++)
        b += us > (1U << i);
    return b;
}

static __always_inline void rtt_add(struct tcp_series *s, u32 srtt) {
    s->rtt_count += 1;
    s->rtt_sum_us += srtt;
    if (!s->rtt_min_us || srtt < s->rtt_min_us)
        s->rtt_min_us = srtt;
    if (srtt > s->rtt_max_us)
        s->rtt_max_us = srtt;
    u32 b = rtt_bucket(srtt);
    if (b < TCP_RTT_NBUCKETS)
        s->rtt_buckets[b] += 1;
}

#ifdef TCP_SRTT_US
// The smoothed RTT as it stands when a traced process reads data from its socket (sock_recv_length
// in socket_trace.c), at most once per RTT_SAMPLE_NS per socket; 0 (no sample yet) left out. Not
// at tcp:tcp_probe: that tracepoint fires for every segment any socket of the node receives,
// traced or not, and the kernel fills its record each time (200-700 ns per run with the program,
// bench/kernel_cost.py). TCP_SRTT_US: tcp_sock.srtt_us's offset in the running kernel (its BTF),
// which holds the RTT in microseconds << 3.
//
// When each socket was last sampled is kept in a small table indexed by a hash of its address: an
// array slot costs a few ns where a hash lookup costs ~100, and most reads stop there. Two sockets
// in one slot only sample more often. One table for all CPUs, so that tcp_destroy_sock can clear
// a socket's slot: the kernel reuses a freed socket's address for the next one at once, and a
// connection that reads once (a request, a response) would otherwise find itself "sampled lately"
// as its predecessor. CPUs racing on a slot (it is written only when a sample is taken) can only
// make one sample too many or too few.
#define RTT_SAMPLE_NS 100000000ULL
#define RTT_SLOTS 256

struct rtt_sampled {
    u64 sk;
    u64 ts;
};

BPF_ARRAY(rtt_sampled, struct rtt_sampled, RTT_SLOTS);

static __always_inline struct rtt_sampled *rtt_slot(u64 sk) {
    u32 slot = (sk * 0x9E3779B97F4A7C15ULL) >> 56;  // Fibonacci hashing: the top 8 bits
    return rtt_sampled.lookup(&slot);
}

// now: when the read began (its enter program's clock reading, so this one needs none).
static __always_inline void tcp_health_read(u64 sk, u64 now) {
    struct rtt_sampled *last = rtt_slot(sk);
    if (!last || (last->sk == sk && now - last->ts < RTT_SAMPLE_NS))
        return;
    // Not owned (yet: a server's socket is learnt at the exit of its first read) or no RTT
    // measured yet: the next read tries again.
    struct tcp_owner *owner = tcp_owners.lookup(&sk);
    u32 srtt = 0;
    if (!owner || bpf_probe_read_kernel(&srtt, 4, (void *)sk + TCP_SRTT_US) || !(srtt >>= 3))
        return;
    last->sk = sk;
    last->ts = now;
    struct tcp_series *s = tcp_series_for(owner);
    if (s)
        rtt_add(s, srtt);
}
#else
// Kernels whose reads name no socket (FD_TRACKING) or without BTF: the RTT as it stood at each
// segment a traced socket received.
TRACEPOINT_PROBE(tcp, tcp_probe) {
    struct tcp_series *s = tcp_series_of(args->skaddr);
    u32 srtt = args->srtt;  // microseconds (the kernel's srtt_us >> 3)
    if (s && srtt)
        rtt_add(s, srtt);
    return 0;
}
#endif

#ifdef TCP_DROPS
// Packets of traced sockets the kernel dropped, by the kernel's own reason (enum skb_drop_reason,
// whose names user space reads from this tracepoint's format). skb:kfree_skb runs only for drops
// (consume_skb frees the rest), on every socket of the node, so the first check is again one
// lookup in tcp_owners. A received packet names its socket in rx_sk (Linux 6.8+: set once the
// packet was matched to a socket, so drops before that, e.g. at TC ingress, are nobody's); a
// packet being sent belongs to skb->sk (at SKB_SK, from the kernel's BTF).
struct tcp_drop_key {
    struct tcp_series_key series;
    u32 reason;
    u32 pad;
};

BPF_TABLE("percpu_hash", struct tcp_drop_key, u64, tcp_drops, MAX_TCP_SERIES);

// As for sk_rst_reason: the args struct names an enum no included header defines.
enum skb_drop_reason { TCP_HEALTH_DROP_REASON_UNUSED };

TRACEPOINT_PROBE(skb, kfree_skb) {
    u64 sk = (u64)args->rx_sk;
    if (!sk)
        bpf_probe_read_kernel(&sk, sizeof(sk), (u8 *)args->skbaddr + SKB_SK);
    struct tcp_owner *owner = tcp_owners.lookup(&sk);
    if (!owner)
        return 0;
    struct tcp_drop_key key = {.series = owner->series, .reason = args->reason};
    u64 zero = 0;
    u64 *n = tcp_drops.lookup_or_try_init(&key, &zero);
    if (n)
        *n += 1;
    else
        tcp_count(TCP_STAT_DROPS_FULL);
    return 0;
}
#endif

#ifdef TCP_FLOWS
// Defined in tcp_flows.c: forgets an accepted socket's counts kept for its owner's first I/O.
static __always_inline void tcp_flows_destroyed(u64 sk);
#endif

TRACEPOINT_PROBE(tcp, tcp_destroy_sock) {
    u64 sk = (u64)args->skaddr;
    tcp_owners.delete(&sk);
#ifdef TCP_SRTT_US
    struct rtt_sampled *last = rtt_slot(sk);
    if (last && last->sk == sk)
        last->sk = 0;  // the next socket at this address is sampled at its first read
#endif
#ifdef TCP_FLOWS
    tcp_flows_destroyed(sk);
#endif
    return 0;
}
