// Bytes and packets of traced processes' TCP connections, each way, per (series, cgroup): the
// series of tcp_health.c (process, role, peer address, server port) and the socket's cgroup v2
// id. Appended after tcp_health.c when capture.tcp_flows is on (built with -DTCP_FLOWS); user
// space reads tcp_flows once per interval with tcp_series (otel_ebpf/probes/tcp_health.py).
//
// Two BPF_PROG_TYPE_CGROUP_SKB programs, attached (a BPF link each, gone with the agent) to the
// cgroup v2 root: ingress and egress, on every packet of every socket of the node, in whatever
// context the stack handles it (softirq for what is received). skb->sk is the packet's own
// socket, so on loopback the sender's egress and the receiver's ingress of one packet are
// counted once each, on their own sockets. That socket is the key of tcp_owners, as for the tcp
// tracepoints: one hash lookup that misses, and a second one in tcp_flow_pending, is what a
// packet of an untraced socket costs. No kprobe and no kernel struct read.
//
// skb->len is the packet from its IP header on; a GSO (sent) or GRO (received) packet counts
// as its gso_segs segments, each with its headers, as the wire carries them. A socket's cgroup is
// the one it was created in.
//
// Accepted connections: a server's socket is learnt at its first read or write, after the
// client's first bytes have arrived. So each accepted socket of a wanted port is remembered when
// it becomes ESTABLISHED (sock:inet_sock_set_state, in softirq: owner unknown) and its packets
// are counted there for TCP_FLOW_PENDING_NS; the first I/O moves them into its series
// (tcp_flows_owned). Past that, the entry goes at the socket's next packet (an untraced server).

#define TCP_FLOW_PENDING_NS 2000000000ULL
#define IPPROTO_HOPOPTS_ 0

struct tcp_flow_key {
    struct tcp_series_key series;
    u32 pad;     // 0: the key's bytes are all named, so none is left to chance
    u64 cgroup;  // the socket's cgroup v2 id: its directory's inode number
};

struct tcp_flow {
    u64 bytes_sent;
    u64 bytes_received;
    u64 packets_sent;
    u64 packets_received;
};

// Counts of an accepted socket before its owner's first I/O (several CPUs: atomic adds).
struct tcp_flow_pending {
    struct tcp_flow counts;
    u64 cgroup;
    u64 established_ns;
};

BPF_TABLE("percpu_hash", struct tcp_flow_key, struct tcp_flow, tcp_flows, MAX_TCP_SERIES);
BPF_TABLE("lru_hash", u64, struct tcp_flow_pending, tcp_flow_pending, MAX_CONNS);
struct tcp_flow_scratch {
    struct tcp_flow_key key;
    struct tcp_flow zero;  // never written
};
BPF_PERCPU_ARRAY(tcp_flow_scratch, struct tcp_flow_scratch, 1);

static __always_inline void tcp_flow_add(struct tcp_flow *flow, u64 bytes, u64 packets, int received) {
    if (received) {
        flow->bytes_received += bytes;
        flow->packets_received += packets;
    } else {
        flow->bytes_sent += bytes;
        flow->packets_sent += packets;
    }
}

static __always_inline struct tcp_flow *tcp_flow_of(struct tcp_series_key *series, u64 cgroup) {
    struct tcp_flow_key key = {.series = *series, .pad = 0, .cgroup = cgroup};
    struct tcp_flow zero = {};
    struct tcp_flow *flow = tcp_flows.lookup_or_try_init(&key, &zero);
    if (!flow)
        tcp_count(TCP_STAT_FLOWS_FULL);
    return flow;
}

// A traced process owns socket sk now (tcp_own): what it received and sent while accepted and
// not yet read goes into its series. A packet counted on another CPU between the owner's entry
// and this move may be lost: a window of one program run, once per connection. This runs inside
// socket_trace.c's syscall programs, whose stack is nearly full: the flow's key is built in a
// per-CPU slot, not on the stack.
static __always_inline void tcp_flows_owned(u64 sk, struct tcp_series_key *series) {
    struct tcp_flow_pending *pending = tcp_flow_pending.lookup(&sk);
    if (!pending)
        return;
    u32 slot = 0;
    struct tcp_flow_scratch *scratch = tcp_flow_scratch.lookup(&slot);
    if (!scratch)
        return;
    scratch->key.series = *series;
    scratch->key.pad = 0;
    scratch->key.cgroup = pending->cgroup;
    struct tcp_flow *flow = tcp_flows.lookup_or_try_init(&scratch->key, &scratch->zero);
    if (flow) {
        flow->bytes_sent += pending->counts.bytes_sent;
        flow->bytes_received += pending->counts.bytes_received;
        flow->packets_sent += pending->counts.packets_sent;
        flow->packets_received += pending->counts.packets_received;
    } else {
        tcp_count(TCP_STAT_FLOWS_FULL);
    }
    tcp_flow_pending.delete(&sk);
}

static __always_inline void tcp_flows_destroyed(u64 sk) {
    tcp_flow_pending.delete(&sk);
}

// A GSO (sent) or GRO (received) packet stands for segs segments, each with the headers of the
// first on the wire: they are counted once per segment, their length read from the packet. An
// IPv6 packet over 64 KiB (BIG TCP) carries a hop-by-hop jumbo option that no segment on the
// wire has: not counted. With other IPv6 extension headers the headers are counted once.
static __always_inline u64 tcp_flow_bytes(struct __sk_buff *skb, u32 segs) {
    u64 bytes = skb->len;
    if (segs < 2)
        return bytes;
    u8 ip_header[10] = {}, doff = 0;
    if (bpf_skb_load_bytes(skb, 0, ip_header, sizeof(ip_header)))
        return bytes;
    int v6 = (ip_header[0] >> 4) == 6;
    u32 ip = v6 ? 40 : (ip_header[0] & 0xf) * 4;
    u8 transport = v6 ? ip_header[6] : ip_header[9];  // next header, protocol
    u32 jumbo = 0;
    if (v6 && transport == IPPROTO_HOPOPTS_) {
        u8 hop[2] = {};  // next header, length in 8 bytes past the first 8
        if (bpf_skb_load_bytes(skb, 40, hop, 2))
            return bytes;
        transport = hop[0];
        jumbo = (hop[1] + 1) * 8;
    }
    if (transport != IPPROTO_TCP_ || bpf_skb_load_bytes(skb, ip + jumbo + 12, &doff, 1))
        return bytes;
    return bytes - jumbo + (u64)(segs - 1) * (ip + (doff >> 4) * 4);
}

static __always_inline int tcp_flow_count(struct __sk_buff *skb, int received) {
    struct bpf_sock *sock = skb->sk;
    if (!sock)
        return 1;
    u64 sk = (u64)sock;  // the address the tcp tracepoints name as skaddr
    struct tcp_owner *owner = tcp_owners.lookup(&sk);
    struct tcp_flow_pending *pending = owner ? 0 : tcp_flow_pending.lookup(&sk);
    if (!owner && !pending)
        return 1;
    u32 segs = skb->gso_segs;
    u64 packets = segs ? segs : 1;
    u64 bytes = tcp_flow_bytes(skb, segs);
    if (owner) {
        struct tcp_flow *flow = tcp_flow_of(&owner->series, bpf_skb_cgroup_id(skb));
        if (flow)
            tcp_flow_add(flow, bytes, packets, received);
        return 1;
    }
    if (bpf_ktime_get_ns() - pending->established_ns > TCP_FLOW_PENDING_NS) {
        tcp_flow_pending.delete(&sk);
        return 1;
    }
    pending->cgroup = bpf_skb_cgroup_id(skb);
    if (received) {
        __sync_fetch_and_add(&pending->counts.bytes_received, bytes);
        __sync_fetch_and_add(&pending->counts.packets_received, packets);
    } else {
        __sync_fetch_and_add(&pending->counts.bytes_sent, bytes);
        __sync_fetch_and_add(&pending->counts.packets_sent, packets);
    }
    return 1;
}

// Both return 1: the packet goes on; these programs never drop anything.
int tcp_flow_ingress(struct __sk_buff *skb) { return tcp_flow_count(skb, 1); }
int tcp_flow_egress(struct __sk_buff *skb) { return tcp_flow_count(skb, 0); }

// An accepted socket becomes ESTABLISHED (attached by user space to sock:inet_sock_set_state,
// next to socket_trace.c's program there). BCC generates the args struct for that program; one
// more parameter of that type would define it twice.
int tcp_flow_accepted(void *ctx) {
    struct tracepoint__sock__inet_sock_set_state *args = ctx;
    if (args->protocol != IPPROTO_TCP_ || args->oldstate != TCP_SYN_RECV || args->newstate != TCP_ESTABLISHED)
        return 0;
    if (!port_wanted(args->sport, args->dport))
        return 0;
    u64 sk = (u64)args->skaddr;
    struct tcp_flow_pending pending = {.established_ns = bpf_ktime_get_ns()};
    tcp_flow_pending.update(&sk, &pending);
    return 0;
}
