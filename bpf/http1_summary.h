// HTTP/1 in the kernel: exact RED counts at any load, and whole exchanges shed before the ring
// buffer overflows. Included by socket_trace.c; used on the syscall path and the TLS plaintext path.
//
// A syscall whose bytes *start* with a request line (requests' direction) or a status line
// (responses' direction) starts a message; nothing else is parsed. Per connection the kernel keeps
// the start of each request still waiting for its response (a FIFO, for pipelining) and the
// response in flight. When a response starts, its request is counted under (pid, role, method,
// status, server port, ...) in http_red, with count, sum and a histogram bucket; while it goes on
// its duration follows its last byte (http_measure). A response is over when the connection next
// moves bytes the other way (a server reads again, a client writes its next request) or closes.
// User space reads http_red once per interval: no per-request work there.
//
// Shedding is decided when a connection is idle, for the exchange that starts then (and any
// pipelined behind it), never in the middle of one: when user space is far behind (ring backlog)
// or over its CPU budget (keep ratio). A shed exchange is counted, still measured in http_red,
// and none of its bytes are copied. An event lost to a full ring sheds the rest of its exchange;
// the next event of the connection carries HDR_AFTER_LOSS so user space drops what it holds
// (on a connection of any protocol: a lost event leaves a hole in its bytes).
//
// A request whose response never started is counted when its connection is closed (status 0).
//
// Limits: requests pipelined into one syscall are counted by their responses, with the first
// one's method and start (responses written together count once); a connection is judged
// not HTTP/1 after HTTP_MAX_MISSES syscalls that start no message; a request whose response
// never starts and whose connection is never closed by a close() the kernel sees (the process
// exits, the connection leaves the LRU table) is not counted.
// Map calls here work because the probe pastes this header in (loading.inline_headers).

#define HTTP_UNKNOWN 0
#define HTTP_YES 1
#define HTTP_NO 2        // from here on, not HTTP/1 (any longer)
#define HTTP_SWITCHED 3  // after a 101: HTTP/2 when the client's next bytes are its preface
#define HTTP_MAX_MISSES 8
#define HTTP_QUEUE 4  // power of two: requests awaiting their responses

// Why an exchange was shed (http_state.shed); each has a stats[] slot, counted per request.
#define SHED_NONE 0
#define SHED_BACKLOG 1   // user space had more than SET_SHED_BACKLOG bytes of ring buffer to read
#define SHED_BUDGET 2    // user space over its CPU budget: kept only SET_KEEP_1024 / 1024
#define SHED_RING_FULL 3 // an event of the exchange was lost: the rest of it is not copied

#define METHOD_OTHER 0
#define METHOD_CONNECT 8  // known_method()
#define HTTP_NBUCKETS 15  // http.*.request.duration buckets (semantic conventions) and +Inf

struct http_state {
    u64 req_ts[HTTP_QUEUE];
    u8 req_method[HTTP_QUEUE];
    u8 head;         // oldest waiting request
    u8 queued;       // requests waiting
    u8 state;        // HTTP_*
    u8 misses;       // syscalls that started no message while HTTP_UNKNOWN
    u8 shed;         // SHED_*: the exchanges in flight are not copied
    u8 lost;         // an event was lost: the next one delivered says so
    u8 h2;           // HTTP/2 (its client preface was seen): calls are copied past the cap
    u8 behind;       // user space was behind at this syscall, which goes on with a message (http_observe)
    u8 resp_method;
    u8 resp_minor;   // HTTP/1.x of the response
    u8 last_method;  // of the latest syscall that started a request
    u8 resp_bucket;  // where the response in flight is counted now
    u64 last_req_ts;
    u16 resp_status; // 0: no response in flight
    u16 family;      // the ends, from the tuple when the kernel saw the handshake
    u16 local_port;
    u16 peer_port;
    u64 resp_start;  // start of the request being answered (0: unknown, not measured)
    u64 resp_end;    // the response's last byte so far
    u8 peer_addr[16];
    // A body's calls while user space is behind, not sent (skipped_instead in socket_trace.c):
    u64 skipped_end; // the last one's stamp
    u32 skipped;     // their bytes, sent as one event before the connection's next one
    u8 skipped_dir;  // their direction
    // Body bytes sent while behind anyway, within the connection's share (past_share):
    u32 share_window; // since this stamp >> SHARE_WINDOW_SHIFT
    u32 share_bytes;
};

struct red_key {
    u32 tgid;
    u16 server_port;
    u16 status;
    u8 method;       // METHOD_* (see METHOD_CODES in otel_ebpf/probes/http_red.py)
    u8 role;         // ROLE_*
    u8 minor;
    u8 tls;
    u16 family;      // of server_addr; 0 for the server role
    u16 pad;
    u8 server_addr[16];  // zero for the server role
};

struct red_value {
    u64 count;
    u64 sum_ns;
    u64 min_ns;  // since start; 0 until the first
    u64 max_ns;
    u64 buckets[HTTP_NBUCKETS];
};

BPF_TABLE("percpu_hash", struct red_key, struct red_value, http_red, MAX_RED_SERIES);
// A new series' first value, never written: all zeros, kept off the callers' stacks (the syscall
// exit's is nearly full).
BPF_ARRAY(red_zero, struct red_value, 1);

static __always_inline void count(u32 slot, u64 n);
static __always_inline u32 setting(u32 slot);

// Bytes in the ring buffer that user space has not read yet (socket_trace.c).
static __always_inline u64 ring_backlog(void);

// The bucket a duration falls in: boundaries are upper-inclusive, as in OTLP.
static __always_inline u32 duration_bucket(u64 d) {
    return (d > 5000000ULL) + (d > 10000000ULL) + (d > 25000000ULL) + (d > 50000000ULL) +
           (d > 75000000ULL) + (d > 100000000ULL) + (d > 250000000ULL) + (d > 500000000ULL) +
           (d > 750000000ULL) + (d > 1000000000ULL) + (d > 2500000000ULL) + (d > 5000000000ULL) +
           (d > 7500000000ULL) + (d > 10000000000ULL);
}

// The series of the response in flight (created on first use).
static __always_inline struct red_value *http_series(u32 tgid, u8 role, u8 tls, struct http_state *h) {
    struct red_key key = {.tgid = tgid, .status = h->resp_status, .method = h->resp_method, .role = role,
                          .minor = h->resp_minor, .tls = tls};
    key.server_port = role == ROLE_CLIENT ? h->peer_port : h->local_port;
    if (role == ROLE_CLIENT) {
        key.family = h->family;
        __builtin_memcpy(key.server_addr, h->peer_addr, 16);
    }
    u32 slot = 0;
    struct red_value *zero = red_zero.lookup(&slot);
    return zero ? http_red.lookup_or_try_init(&key, zero) : 0;
}

// The response in flight started (resp_end == 0) or moved more bytes at ts. A request is counted
// when its response starts, with the duration so far; the duration then follows the response's
// last byte, moving between buckets as it grows. Counts are exact at any moment, durations once
// the response is over. Per-CPU values may wrap below zero when a bucket is left on another CPU
// than the one it was entered on: user space sums them modulo 2^64.
static __always_inline void http_measure(u32 tgid, u8 role, u8 tls, struct http_state *h, u64 ts) {
    if (!h->resp_start || ts < h->resp_start)
        return;  // the request was never seen (the capture began mid-exchange)
    struct red_value *v = http_series(tgid, role, tls, h);
    if (!v) {
        if (!h->resp_end)
            count(STAT_RED_FULL, 1);
        return;
    }
    u64 d = ts - h->resp_start;
    u32 b = duration_bucket(d);
    u32 old = h->resp_bucket;
    if (!h->resp_end) {
        v->count += 1;
        v->sum_ns += d;
        if (!v->min_ns || d < v->min_ns)
            v->min_ns = d;
        if (b < HTTP_NBUCKETS)
            v->buckets[b] += 1;
    } else {
        v->sum_ns += ts - h->resp_end;
        if (b != old && b < HTTP_NBUCKETS && old < HTTP_NBUCKETS) {
            v->buckets[old] -= 1;
            v->buckets[b] += 1;
        }
    }
    if (d > v->max_ns)
        v->max_ns = d;
    h->resp_end = ts;
    h->resp_bucket = b;
}

// ---- recognising the start of a message -------------------------------------------------------

#define MSG_NONE 0
#define MSG_REQUEST 1
#define MSG_RESPONSE 2
#define MSG_HTTP2 3  // the HTTP/2 client preface: the connection is not HTTP/1
#define CLASSIFY_BYTES 16  // what classify reads: a status line's "HTTP/1.x NNN ", a method and a target's first byte

struct msg_start {
    u8 kind;
    u8 method;
    u8 minor;
    u16 status;
};

static __always_inline int is_upper(u8 c) { return c >= 'A' && c <= 'Z'; }
static __always_inline int is_digit(u8 c) { return c >= '0' && c <= '9'; }

// Known methods by their first 8 bytes, masked to the method and its space.
static __always_inline u8 known_method(u64 w) {
    if ((w & 0xffffffff) == 0x20544547) return 1;                // "GET "
    if ((w & 0xffffffffff) == 0x2054534f50) return 2;            // "POST "
    if ((w & 0xffffffff) == 0x20545550) return 3;                // "PUT "
    if ((w & 0xffffffffffffff) == 0x2045544554454c44) return 4;  // "DELETE "
    if ((w & 0xffffffffff) == 0x2044414548) return 5;            // "HEAD "
    if (w == 0x20534e4f4954504f) return 6;                       // "OPTIONS "
    if ((w & 0xffffffffffff) == 0x204843544150) return 7;        // "PATCH "
    if (w == 0x205443454e4e4f43) return METHOD_CONNECT;          // "CONNECT "
    if ((w & 0xffffffffffff) == 0x204543415254) return 9;        // "TRACE "
    return METHOD_OTHER;
}

// What the first bytes of b start, if anything: b is the caller's copy of them (kernel memory, at
// least CLASSIFY_BYTES readable), of which len are data.
static __always_inline struct msg_start classify(const u8 *b, u32 len) {
    struct msg_start m = {};
    if (len < 14)
        return m;
    // "HTTP/1.x NNN" then a space or the end of the line
    u64 w;
    __builtin_memcpy(&w, b, 8);
    if ((w & 0xffffffffffffff) == 0x2e312f50545448ULL && (b[7] == '0' || b[7] == '1') && b[8] == ' ' &&
        is_digit(b[9]) && is_digit(b[10]) && is_digit(b[11]) && (b[12] == ' ' || b[12] == '\r')) {
        m.kind = MSG_RESPONSE;
        m.minor = b[7] - '0';
        m.status = (b[9] - '0') * 100 + (b[10] - '0') * 10 + (b[11] - '0');
        return m;
    }
    // "PRI * HTTP/2.0\r\n" opens HTTP/2 (h2c with prior knowledge, h2 over TLS). It would pass for
    // a request line below; taken for one, its connection would stay in the shed decision of that
    // moment for good, as no HTTP/1 message ever follows to make another.
    u64 w1;
    __builtin_memcpy(&w1, b + 8, 8);
    if (w == 0x5448202a20495250ULL && w1 == 0x0a0d302e322f5054ULL) {
        m.kind = MSG_HTTP2;
        return m;
    }
    // A method (3 to 10 capitals), one space, and a visible character starting the target.
    u32 sp = 0;
#pragma unroll
    for (int i = 0; i <= 10; i++) {
        if (b[i] == ' ') {
            sp = i;
            break;
        }
        if (!is_upper(b[i]))
            return m;
    }
    if (sp < 3)
        return m;
    // The target's first byte, at sp + 1 (4..11): shifted out of the words, as the verifier
    // takes no variable index into a stack array.
    u32 at = sp + 1;
    u8 t = at < 8 ? w >> (at * 8) : w1 >> ((at - 8) * 8);
    if (t < 0x21 || t > 0x7e)
        return m;
    m.kind = MSG_REQUEST;
    m.method = known_method(w);
    return m;
}

// ---- per connection ----------------------------------------------------------------------------

// Whether the exchange starting now on an idle connection is shed, and why.
static __always_inline u8 shed_decision(void) {
    if (ring_backlog() > setting(SET_SHED_BACKLOG))
        return SHED_BACKLOG;
    u32 keep = setting(SET_KEEP_1024);
    if (keep < 1024 && (bpf_get_prandom_u32() & 1023) >= keep)
        return SHED_BUDGET;
    return SHED_NONE;
}

static __always_inline void http_request(u32 tgid, u8 role, u8 tls, struct http_state *h, u8 method, u64 ts) {
    h->resp_status = 0;  // the response in flight is over
    if (!h->queued)  // idle: a new exchange, and a new decision
        h->shed = shed_decision();
    if (h->shed)
        count(STAT_SHED_BASE + h->shed, 1);
    if (h->queued >= HTTP_QUEUE) {
        count(STAT_HTTP_QUEUE_FULL, 1);
        return;
    }
    h->last_req_ts = ts;
    h->last_method = method;
    u32 tail = (h->head + h->queued) & (HTTP_QUEUE - 1);
    h->req_ts[tail] = ts;
    h->req_method[tail] = method;
    h->queued += 1;
}

static __always_inline void http_response(u32 tgid, u8 role, u8 tls, struct http_state *h, struct msg_start m,
                                          u64 ts) {
    if (m.status >= 100 && m.status < 200 && m.status != 101)
        return;  // informational: the final response is still to come
    // No request waiting: the syscall that started the last one carried more (pipelined): this
    // response answers one of those, which started with it.
    h->resp_start = h->last_req_ts;
    h->resp_method = h->last_method;
    if (h->queued) {
        u32 at = h->head & (HTTP_QUEUE - 1);
        h->resp_start = h->req_ts[at];
        h->resp_method = h->req_method[at];
        h->head = (h->head + 1) & (HTTP_QUEUE - 1);
        h->queued -= 1;
    }
    h->resp_status = m.status;
    h->resp_minor = m.minor;
    h->resp_end = 0;
    http_measure(tgid, role, tls, h, ts);
    // 101, or a 2xx to CONNECT (a tunnel): the connection now speaks another protocol, whose
    // bytes may look like HTTP/1 (a CONNECT to port 80) and must not be counted as requests.
    if (m.status == 101 || (h->resp_method == METHOD_CONNECT && m.status >= 200 && m.status < 300)) {
        h->resp_status = 0;
        h->state = m.status == 101 ? HTTP_SWITCHED : HTTP_NO;
    }
}

// While user space is behind, each connection still sends up to SHARE_BYTES of body per window of
// 2^SHARE_WINDOW_SHIFT ns (16 KiB per 67 ms, 240 KB/s): "behind" is the whole ring's backlog, which
// one large transfer makes, and a small stream meanwhile (an LLM's tokens as server-sent events)
// must keep its bytes. The three quarters of the ring above where calls are left out absorb what
// the shares add.
#define SHARE_BYTES 16384
#define SHARE_WINDOW_SHIFT 26

// Whether a body call of moved bytes goes past its connection's share; if not, it is counted in it.
static __always_inline int past_share(struct http_state *h, u32 moved, u64 ts) {
    u32 window = ts >> SHARE_WINDOW_SHIFT;
    if (window != h->share_window) {
        h->share_window = window;
        h->share_bytes = 0;
    }
    if (moved > SHARE_BYTES - h->share_bytes)
        return 1;
    h->share_bytes += moved;
    return 0;
}

// Bytes of one syscall (or SSL call) on a connection, moved of them, whose start (len bytes) the
// caller copied to start: returns 1 when they are to be copied. *role is the connection's role,
// learnt here when the kernel did not know it.
static __always_inline int http_observe(u32 tgid, u8 *role, u8 tls, struct http_state *h, u32 direction,
                                        const u8 *start, u32 len, u32 moved, u64 ts) {
    if (h->state == HTTP_NO) {
        // HTTP/2 has no exchange the kernel could shed whole; while user space is far behind, its
        // calls are copied up to the cap only, the rest moved, not copied: a gap user space skips
        // (a frame header it hides costs HPACK state) instead of events lost to a full ring.
        if (h->h2)
            h->behind = ring_backlog() > setting(SET_SHED_BACKLOG);
        return 1;
    }
    h->behind = 0;
    struct msg_start m = classify(start, len);
    if (*role == ROLE_UNKNOWN && m.kind != MSG_NONE)  // clients send all but responses
        *role = (m.kind != MSG_RESPONSE) == (direction == DIR_INGRESS) ? ROLE_SERVER : ROLE_CLIENT;
    if (m.kind == MSG_HTTP2) {
        h->state = HTTP_NO;
        h->h2 = 1;
        return 1;
    }
    u32 requests = *role == ROLE_SERVER ? DIR_INGRESS : DIR_EGRESS;
    if (h->state == HTTP_SWITCHED) {  // an h2c client sends its preface right after the 101 (RFC 7540, 3.2)
        if (direction == requests)
            h->state = HTTP_NO;  // anything else: a WebSocket, another protocol
        return 1;
    }
    if (m.kind == MSG_REQUEST && direction == requests) {
        h->state = HTTP_YES;
        http_request(tgid, *role, tls, h, m.method, ts);
    } else if (m.kind == MSG_RESPONSE && direction != requests) {
        h->state = HTTP_YES;
        http_response(tgid, *role, tls, h, m, ts);
    } else if (h->state == HTTP_UNKNOWN) {
        if (++h->misses >= HTTP_MAX_MISSES)
            h->state = HTTP_NO;
        return 1;
    } else {
        if (direction == requests)
            h->resp_status = 0;  // a request body, or the next read: the response is over
        else if (h->resp_status)
            http_measure(tgid, *role, tls, h, ts);
        // A body going on while user space is behind, past the connection's share: not sent,
        // only counted, its bytes then one event moved, not copied (skipped_instead in
        // socket_trace.c), so that one large transfer cannot fill the ring and lose its own
        // exchange (a Content-Length body keeps its size and its end; a message that follows the
        // body's end in the same syscall is hidden). Behind here is half the backlog at which
        // new exchanges are shed: a large transfer, whose copied calls come as fast as user space
        // drains them, holds the backlog about there, below where other connections' requests
        // would be shed.
        h->behind = !h->shed && ring_backlog() > setting(SET_SHED_BACKLOG) / 2 && past_share(h, moved, ts);
    }
    return !h->shed;
}

// The connection is being closed: the requests still waiting for a response never got one. Each
// is counted now, with status 0 (user space names it error.type=response_missing) and the time
// from its start to the close, as its span would say; the response's HTTP/1.x is the last
// response's on the connection, 1.1 when none came (upsert_conn).
static __always_inline void http_unanswered(u32 tgid, u8 role, u8 tls, struct http_state *h, u64 ts) {
    if (h->state != HTTP_YES)
        return;
    h->resp_status = 0;
#pragma unroll
    for (int i = 0; i < HTTP_QUEUE; i++) {
        if (i >= h->queued)
            break;
        u32 at = (h->head + i) & (HTTP_QUEUE - 1);
        h->resp_start = h->req_ts[at];
        h->resp_method = h->req_method[at];
        h->resp_end = 0;
        http_measure(tgid, role, tls, h, ts);
    }
    h->queued = 0;
}

// An event of the connection could not be delivered: the next one says so. On HTTP/1 the
// exchanges in flight are incomplete for user space, so the rest of them is not copied either,
// and they are counted as shed; other protocols have no exchange the kernel could shed.
static __always_inline void http_lost(struct http_state *h) {
    h->lost = 1;
    if (h->state != HTTP_YES || h->shed)
        return;
    h->shed = SHED_RING_FULL;
    count(STAT_SHED_BASE + SHED_RING_FULL, h->queued + (h->resp_status != 0));
}
