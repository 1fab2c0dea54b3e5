// RoCEv2 on the wire: a TC (clsact) classifier on the interfaces the user names, ingress and egress,
// that counts InfiniBand transport headers inside UDP/4791 and lets every packet pass unchanged.
//
// Per (interface, direction, source, destination, destination QP) the kernel keeps: packets and
// bytes by BTH opcode (roce_ops), and PSN gaps and duplicates, ACKs and NAKs by AETH syndrome,
// ECN-CE marks and a histogram of request -> ACK latency (roce_qps). User space reads both tables once per metrics interval
// (otel_ebpf/probes/roce.py); nothing goes through a ring buffer.
//
// Cost: a packet that is not UDP/4791 leaves after reading skb->protocol, the IP header's protocol
// and the UDP destination port, all in the linear head the stack has already pulled in.
//
// Limits: IPv4 without options and IPv6 without extension headers; a VLAN tag must have been
// taken off by the driver (the usual offload), not left in the frame; the BTH and AETH are read
// with bpf_skb_load_bytes, so they may sit outside the linear head.

#include <uapi/linux/bpf.h>
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/udp.h>

#define ROCE_PORT 4791
#define ECN_CE 3

// BTH opcode: transport in the top 3 bits, operation in the low 5 (IBTA vol. 1, 9.2)
#define TRANSPORT(op) ((op) >> 5)
#define OPERATION(op) ((op) & 0x1f)
#define TRANSPORT_RC 0
#define TRANSPORT_UC 1
#define TRANSPORT_XRC 5
#define OP_READ_REQUEST 0x0c
#define OP_READ_RESPONSE_FIRST 0x0d
#define OP_READ_RESPONSE_LAST 0x0f
#define OP_READ_RESPONSE_ONLY 0x10
#define OP_ACK 0x11
#define OP_ATOMIC_ACK 0x12

// roce_qps.psn_state
#define PSN_UNKNOWN 0     // no request seen yet: the next one sets next_psn
#define PSN_TRACKING 1
#define PSN_AFTER_READ 2  // a READ request takes one PSN per response packet: the next request's
                          // PSN depends on the path MTU, not known here; it resyncs without a gap

// roce_drops[] slots, counted when a table is full (the packet still passes)
#define DROP_OPS_FULL 0
#define DROP_QPS_FULL 1
#define NDROPS 2

#define NSYNDROMES 8  // roce_qps.aeth[]: syndrome_class()
#define LATENCY_BUCKETS 22  // roce_qps.ack_latency[i]: up to 1024 ns << i, the last one above

struct roce_qp_key {
    u8 saddr[16];  // IPv4 as ::ffff:a.b.c.d
    u8 daddr[16];
    u32 ifindex;
    u32 dest_qp;
    u32 egress;    // 0: received, 1: sent
};

struct roce_op_key {
    struct roce_qp_key qp;
    u32 opcode;
};

struct roce_op_counts {
    u64 packets;
    u64 bytes;
};

struct roce_qp_stats {
    u64 packets;         // keeps a flow that has only packets to count from ageing out of the table
    u64 psn_gaps;        // a request PSN past the next expected one (packets lost on the way)
    u64 psn_duplicates;  // a request PSN before it: retransmissions
    u64 ecn_ce;          // packets the network marked Congestion Experienced
    u64 aeth[NSYNDROMES];
    u64 ack_latency[LATENCY_BUCKETS];  // of the ACKs of this flow that answered a timed request
    u64 ack_latency_sum_ns;
    u64 ack_latency_min_ns;  // 0: none yet
    u64 ack_latency_max_ns;
    u32 next_psn;
    u32 psn_state;
};

struct bth {
    u8 opcode;
    u8 flags;
    __be16 pkey;
    __be32 dest_qp;  // 8 reserved bits, then the QP
    __be32 psn;      // ack-request bit and 7 reserved bits, then the PSN
};

// A request that asks for an acknowledgement (the BTH's AckReq bit) or a READ request, by the PSN
// its ACK or first READ response will carry, keyed from the requester's side. ACKs may coalesce:
// a request never answered by its own PSN stays until the LRU evicts it.
struct roce_pending_key {
    u8 requester[16];
    u8 responder[16];
    u32 ifindex;
    u32 psn;
};

BPF_PERCPU_HASH(roce_ops, struct roce_op_key, struct roce_op_counts, MAX_OPS);
BPF_HASH(roce_qps, struct roce_qp_key, struct roce_qp_stats, MAX_QPS);
BPF_TABLE("lru_hash", struct roce_pending_key, u64, roce_pending, MAX_PENDING);
BPF_ARRAY(roce_zero, struct roce_qp_stats, 1);  // a new flow's first value: too large for the stack
BPF_PERCPU_ARRAY(roce_drops, u64, NDROPS);

static __always_inline void count_drop(u32 slot) {
    u64 *drops = roce_drops.lookup(&slot);
    if (drops)
        (*drops)++;
}

static __always_inline int has_aeth(u8 opcode) {
    u8 op = OPERATION(opcode);
    if (TRANSPORT(opcode) != TRANSPORT_RC && TRANSPORT(opcode) != TRANSPORT_XRC)
        return 0;
    return op == OP_ACK || op == OP_ATOMIC_ACK || op == OP_READ_RESPONSE_FIRST || op == OP_READ_RESPONSE_LAST
           || op == OP_READ_RESPONSE_ONLY;
}

// Requests carry the sender's PSN sequence; responses and ACKs echo the requests' PSNs (ACKs
// coalesce), CNPs and UD carry none worth following.
static __always_inline int is_request(u8 opcode) {
    u8 transport = TRANSPORT(opcode), op = OPERATION(opcode);
    if (transport != TRANSPORT_RC && transport != TRANSPORT_UC && transport != TRANSPORT_XRC)
        return 0;
    return op < OP_READ_RESPONSE_FIRST || op > OP_ATOMIC_ACK;
}

// AETH syndrome bits 6-5: 00 ACK, 01 RNR NAK, 11 NAK with its code in bits 4-0 (IBTA 9.7.5.1.1).
// Class: 0 ACK, 1 RNR NAK, 2..6 NAK codes 0..4, 7 anything else (reserved).
static __always_inline u32 syndrome_class(u8 syndrome) {
    u8 kind = (syndrome >> 5) & 3, code = syndrome & 0x1f;
    if (kind == 0)
        return 0;
    if (kind == 1)
        return 1;
    if (kind == 3 && code <= 4)
        return 2 + code;
    return 7;
}

// A retransmitted request is not timed, and untimes the original (Karn's rule): which of the two
// an ACK answers, the wire does not say.
static __always_inline void time_request(struct roce_qp_key *key, u32 psn, int retransmitted) {
    struct roce_pending_key pending = {.ifindex = key->ifindex, .psn = psn};
    __builtin_memcpy(pending.requester, key->saddr, 16);
    __builtin_memcpy(pending.responder, key->daddr, 16);
    if (retransmitted) {
        roce_pending.delete(&pending);
        return;
    }
    u64 now = bpf_ktime_get_ns();
    roce_pending.update(&pending, &now);
}

// An ACK (or first READ response) from the responder: its PSN is the request's.
static __always_inline void time_ack(struct roce_qp_stats *stats, struct roce_qp_key *key, u32 psn) {
    struct roce_pending_key pending = {.ifindex = key->ifindex, .psn = psn};
    __builtin_memcpy(pending.requester, key->daddr, 16);
    __builtin_memcpy(pending.responder, key->saddr, 16);
    u64 *sent = roce_pending.lookup(&pending);
    if (!sent)
        return;
    u64 ns = bpf_ktime_get_ns() - *sent;
    roce_pending.delete(&pending);
    u64 bucket = 0;  // 64 bits: a 32-bit index is widened again after the check, unbounded to the verifier
    if (ns > 1024)
        bucket = bpf_log2l(ns - 1) - 10;  // bpf_log2l(v) is floor(log2(v)) + 1
    if (bucket > LATENCY_BUCKETS - 1)
        bucket = LATENCY_BUCKETS - 1;
    __sync_fetch_and_add(&stats->ack_latency[bucket], 1);
    __sync_fetch_and_add(&stats->ack_latency_sum_ns, ns);
    if (!stats->ack_latency_min_ns || ns < stats->ack_latency_min_ns)
        stats->ack_latency_min_ns = ns;
    if (ns > stats->ack_latency_max_ns)
        stats->ack_latency_max_ns = ns;
}

// Whether the request is a retransmission (its PSN was seen).
static __always_inline int follow_psn(struct roce_qp_stats *stats, u8 opcode, u32 psn) {
    if (stats->psn_state != PSN_UNKNOWN) {
        u32 ahead = (psn - stats->next_psn) & 0xffffff;  // PSNs are 24 bits and wrap
        if (ahead >= 0x800000) {                         // behind: half the space, as the IBTA's window
            __sync_fetch_and_add(&stats->psn_duplicates, 1);
            return 1;  // a retransmission does not move the sequence on
        }
        if (ahead && stats->psn_state == PSN_TRACKING)
            __sync_fetch_and_add(&stats->psn_gaps, 1);
    }
    stats->next_psn = (psn + 1) & 0xffffff;
    stats->psn_state = OPERATION(opcode) == OP_READ_REQUEST ? PSN_AFTER_READ : PSN_TRACKING;
    return 0;
}

static __always_inline void count_roce(struct __sk_buff *skb, struct roce_qp_key *key, u32 offset, u8 ecn) {
    struct bth hdr;
    if (bpf_skb_load_bytes(skb, offset, &hdr, sizeof(hdr)))
        return;
    key->dest_qp = bpf_ntohl(hdr.dest_qp) & 0xffffff;
    u32 psn = bpf_ntohl(hdr.psn) & 0xffffff;

    struct roce_op_key op_key = {.qp = *key, .opcode = hdr.opcode};
    struct roce_op_counts zero_counts = {};
    struct roce_op_counts *counts = roce_ops.lookup_or_try_init(&op_key, &zero_counts);
    if (counts) {
        counts->packets++;
        counts->bytes += skb->len;
    } else {
        count_drop(DROP_OPS_FULL);
    }

    u32 first = 0;
    struct roce_qp_stats *zero_stats = roce_zero.lookup(&first);
    if (!zero_stats)
        return;
    struct roce_qp_stats *stats = roce_qps.lookup_or_try_init(key, zero_stats);
    if (!stats) {
        count_drop(DROP_QPS_FULL);
        return;
    }
    stats->packets++;  // not atomic: a lost increment only delays the flow's ageing
    if (ecn == ECN_CE)
        __sync_fetch_and_add(&stats->ecn_ce, 1);
    __be32 aeth;  // syndrome, then the MSN
    if (has_aeth(hdr.opcode) && !bpf_skb_load_bytes(skb, offset + sizeof(hdr), &aeth, sizeof(aeth))) {
        u32 class = syndrome_class(bpf_ntohl(aeth) >> 24);
        if (class < NSYNDROMES)  // for the verifier
            __sync_fetch_and_add(&stats->aeth[class], 1);
        if (class == 0 && OPERATION(hdr.opcode) != OP_READ_RESPONSE_LAST)  // its PSN is not the request's
            time_ack(stats, key, psn);
    }
    if (is_request(hdr.opcode)) {
        int retransmitted = follow_psn(stats, hdr.opcode, psn);
        if ((bpf_ntohl(hdr.psn) >> 31) || OPERATION(hdr.opcode) == OP_READ_REQUEST)  // AckReq
            time_request(key, psn, retransmitted);
    }
}

static __always_inline void classify(struct __sk_buff *skb, u32 egress) {
    void *data = (void *)(long)skb->data;
    void *data_end = (void *)(long)skb->data_end;
    struct roce_qp_key key = {.ifindex = skb->ifindex, .egress = egress};
    struct udphdr *udp;
    u8 ecn;

    if (skb->protocol == bpf_htons(ETH_P_IP)) {
        struct iphdr *ip = data + sizeof(struct ethhdr);
        udp = (void *)(ip + 1);
        if ((void *)(udp + 1) > data_end || ip->protocol != IPPROTO_UDP || udp->dest != bpf_htons(ROCE_PORT)
            || ip->ihl != 5)
            return;
        ecn = ip->tos & 3;
        key.saddr[10] = key.saddr[11] = key.daddr[10] = key.daddr[11] = 0xff;
        __builtin_memcpy(&key.saddr[12], &ip->saddr, 4);
        __builtin_memcpy(&key.daddr[12], &ip->daddr, 4);
    } else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
        struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
        udp = (void *)(ip6 + 1);
        if ((void *)(udp + 1) > data_end || ip6->nexthdr != IPPROTO_UDP || udp->dest != bpf_htons(ROCE_PORT))
            return;
        ecn = (ip6->flow_lbl[0] >> 4) & 3;  // traffic class straddles the first two bytes
        __builtin_memcpy(key.saddr, &ip6->saddr, 16);
        __builtin_memcpy(key.daddr, &ip6->daddr, 16);
    } else {
        return;
    }
    count_roce(skb, &key, (void *)(udp + 1) - data, ecn);
}

int roce_ingress(struct __sk_buff *skb) {
    classify(skb, 0);
    return TC_ACT_OK;
}

int roce_egress(struct __sk_buff *skb) {
    classify(skb, 1);
    return TC_ACT_OK;
}
