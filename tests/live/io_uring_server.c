/* An HTTP/1.1 server whose socket reads and sends are io_uring's (IORING_OP_RECV, IORING_OP_SEND),
 * with raw syscalls (no liburing). Prints its port, waits for a line on stdin, accepts one
 * connection and answers each request on it with "ok" until the client closes; after each
 * response it writes a log line to /dev/null with write(2). Exits 0 after a clean close. */
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <fcntl.h>

static struct io_uring_params p;
static unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
static struct io_uring_sqe *sqes;
static struct io_uring_cqe *cqes;
static int ring;

static void fail(const char *what) {
    perror(what);
    exit(1);
}

/* One operation, submitted and waited for: its result (bytes, or -errno). */
static int run(int op, int fd, void *buf, unsigned len) {
    unsigned tail = *sq_tail, index = tail & *sq_mask;
    struct io_uring_sqe *sqe = &sqes[index];
    memset(sqe, 0, sizeof(*sqe));
    sqe->opcode = op;
    sqe->fd = fd;
    sqe->addr = (unsigned long)buf;
    sqe->len = len;
    sq_array[index] = index;
    __atomic_store_n(sq_tail, tail + 1, __ATOMIC_RELEASE);
    if (syscall(__NR_io_uring_enter, ring, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0)
        fail("io_uring_enter");
    unsigned head = *cq_head;
    if (head == __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE))
        fail("no completion");
    int res = cqes[head & *cq_mask].res;
    __atomic_store_n(cq_head, head + 1, __ATOMIC_RELEASE);
    return res;
}

int main(void) {
    ring = syscall(__NR_io_uring_setup, 4, &p);
    if (ring < 0)
        fail("io_uring_setup");
    size_t sq_size = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_size = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    char *sq = mmap(0, sq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_SQ_RING);
    char *cq = mmap(0, cq_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring, IORING_OFF_CQ_RING);
    sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                ring, IORING_OFF_SQES);
    if (sq == MAP_FAILED || cq == MAP_FAILED || sqes == MAP_FAILED)
        fail("mmap");
    sq_tail = (unsigned *)(sq + p.sq_off.tail);
    sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    sq_array = (unsigned *)(sq + p.sq_off.array);
    cq_head = (unsigned *)(cq + p.cq_off.head);
    cq_tail = (unsigned *)(cq + p.cq_off.tail);
    cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);

    int listener = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t addr_len = sizeof(addr);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof(addr)) || listen(listener, 1) ||
        getsockname(listener, (struct sockaddr *)&addr, &addr_len))
        fail("listen");
    printf("%d\n", ntohs(addr.sin_port));
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof(line), stdin))
        fail("stdin");
    int conn = accept(listener, NULL, NULL), log = open("/dev/null", O_WRONLY);
    if (conn < 0 || log < 0)
        fail("accept");
    static const char response[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    char request[4096];
    int n;
    while ((n = run(IORING_OP_RECV, conn, request, sizeof(request))) > 0) {
        if (run(IORING_OP_SEND, conn, (void *)response, sizeof(response) - 1) != sizeof(response) - 1)
            fail("send");
        if (write(log, "served one\n", 11) != 11)
            fail("write");
    }
    if (n < 0)
        fail("recv");
    return 0;
}
