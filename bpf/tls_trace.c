// TLS plaintext through uprobes on OpenSSL's (and BoringSSL's) public API; appended to
// socket_trace.c, whose maps and helpers it uses. No OpenSSL struct offsets:
//
//   uprobe SSL_write(ssl, buf, num)      remember ssl and buf                  (active_ssl[tid])
//     sys_exit_write                     ciphertext: marks the connection TLS, emits nothing; the
//                                        first socket syscall inside names the call's socket
//                                        (a read of OpenSSL's own files does not: no socket)
//   uretprobe SSL_write -> n             emit n plaintext bytes from buf on that fd's connection
//
// SSL_read may return plaintext OpenSSL had already buffered, with no syscall inside: the socket
// is then the one this SSL* last used (ssl_fds). An SSL over memory BIOs (Python asyncio's
// SSLProtocol, Node.js) never makes a syscall: its socket is learnt when a read decrypts what the
// same thread read from a socket just before (last_read, socket_trace.c), or when the thread next
// writes TLS records to a socket (unplaced_ssl: a handshake's flights, which Node.js drives from
// SSL_read), and used from then on. The _ex variants return
// 1/0 and put the length in *done. Handshakes (SSL_do_handshake, SSL_connect, SSL_accept) are
// tracked only so that their ciphertext is kept out of the socket capture.

#include <uapi/linux/ptrace.h>

static __always_inline int ssl_enter(struct pt_regs *ctx, u32 op, u64 done) {
    u64 id = current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    u32 tid = id, tgid = id >> 32;
    if (!tls_procs.lookup(&tgid)) {
        u8 one = 1;
        tls_procs.update(&tgid, &one);
    }
    struct active_ssl call = {.ssl = PT_REGS_PARM1(ctx), .buf = PT_REGS_PARM2(ctx), .done = done,
                              .enter_ns = bpf_ktime_get_ns(), .fd = -1, .op = op};
    active_ssl.update(&tid, &call);
    return 0;
}

int ssl_read_enter(struct pt_regs *ctx) { return ssl_enter(ctx, SSL_OP_READ, 0); }
int ssl_read_ex_enter(struct pt_regs *ctx) { return ssl_enter(ctx, SSL_OP_READ, PT_REGS_PARM4(ctx)); }
int ssl_write_enter(struct pt_regs *ctx) { return ssl_enter(ctx, SSL_OP_WRITE, 0); }
int ssl_write_ex_enter(struct pt_regs *ctx) { return ssl_enter(ctx, SSL_OP_WRITE, PT_REGS_PARM4(ctx)); }
int ssl_handshake_enter(struct pt_regs *ctx) { return ssl_enter(ctx, SSL_OP_HANDSHAKE, 0); }

// Plaintext bytes the call moved, or 0.
static __always_inline u64 ssl_length(struct pt_regs *ctx, const struct active_ssl *call) {
    int ret = PT_REGS_RC(ctx);  // an int: the upper half of the register is not part of it
    if (!call->done)
        return ret > 0 ? ret : 0;
    u64 done = 0;  // size_t
    if (ret != 1 || bpf_probe_read_user(&done, sizeof(done), (const void *)call->done))
        return 0;
    return done;
}

int ssl_return(struct pt_regs *ctx) {
    u64 id = current_pid_tgid();
    u32 tid = id;
    struct active_ssl *found = active_ssl.lookup(&tid);
    if (!found)
        return 0;  // the inner call of a nested pair (SSL_connect -> SSL_do_handshake) ended it
    struct active_ssl call = *found;
    active_ssl.delete(&tid);

    u64 length = call.op == SSL_OP_HANDSHAKE ? 0 : ssl_length(ctx, &call);
    s32 fd = call.fd;
    u64 key;
    struct conn_info *ci = 0;
    struct ssl_socket *known = fd < 0 ? ssl_fds.lookup(&call.ssl) : 0;
    if (known) {  // no syscall inside: a memory BIO, or plaintext OpenSSL had buffered
        key = (id & 0xffffffff00000000ULL) | (u32)known->fd;
        ci = conns.lookup(&key);
        if (ci && ci->generation == known->generation) {
            fd = known->fd;
        } else {  // that connection ended, and a new SSL* was given the freed one's address
            ci = 0;
            known = 0;
        }
    }
    struct last_read *read = fd < 0 ? last_read.lookup(&tid) : 0;
    // Only a read that decrypted something read its socket just before: one that starts a
    // handshake (Node.js's new connection) follows the thread's read of another connection.
    if (read && call.op == SSL_OP_READ && length && call.enter_ns - read->ts < MEMORY_BIO_WINDOW_NS)
        fd = read->fd;
    key = (id & 0xffffffff00000000ULL) | (u32)fd;
    if (!ci && fd >= 0)
        ci = conns.lookup(&key);
    if (ci && !known) {
        struct ssl_socket socket = {.fd = fd, .generation = ci->generation};
        ssl_fds.update(&call.ssl, &socket);
    } else if (fd < 0) {  // its first records, written next, will name the socket (place_ssl, socket_trace.c)
        struct unplaced_ssl unplaced = {.ssl = call.ssl, .ts = bpf_ktime_get_ns()};
        unplaced_ssl.update(&tid, &unplaced);
    }
    if (!length)
        return 0;
    if (!ci) {  // an SSL over a memory BIO (asyncio), or a socket never seen
        count(STAT_TLS_UNATTRIBUTED, 1);
        return 0;
    }
    if (ci->ignored)
        return 0;
    ci->tls = 1;
    // Stamped like the syscalls: a write when it starts, a read when it returns.
    u32 direction = call.op == SSL_OP_WRITE ? DIR_EGRESS : DIR_INGRESS;
    u64 ts = direction == DIR_EGRESS ? call.enter_ns : bpf_ktime_get_ns();
    struct data_event *ev = copy_start((const char *)call.buf, length, &ci->http);
    if (!ev)
        return 0;
    if (!http_observe(id >> 32, &ci->role, 1, &ci->http, direction, (const u8 *)ev->data, ev->captured, length, ts)) {
        report_skipped(id, fd, ci);  // what was left out ends before this shed exchange
        return 0;
    }
    announce(id, fd, ts, ci);
    copy_rest(ev, (const char *)call.buf);
    submit_buffer(ev, ts, id, fd, ci, direction, (const char *)call.buf, DATA_TLS);
    return 0;
}
