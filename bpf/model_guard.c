/* model_guard.c — opens of model files (rules from model_guard.paths), seen one of two ways:
 *  - BPF LSM on file_open (default): reported, and in enforce mode denied with -EPERM to
 *    processes outside the allow-list;
 *  - -DTRACEPOINTS (audit only, for kernels that refuse LSM programs): the open syscalls'
 *    tracepoints, the path as the caller passed it, reported with the syscall's result.
 * User space: otel_ebpf/probes/model_guard.py; docs/model-guard.md.
 *
 * The LSM program needs BPF LSM (`bpf` in /sys/kernel/security/lsm); both need BTF. Kernel
 * structs are read at offsets taken from the running kernel's BTF at load time (the -D F_* / T_*
 * constants), never from the headers BCC compiles against; bpf_d_path gets &file->f_path, which
 * the verifier checks against the kernel's own BTF.
 *
 * Cost on the common path (a file that is not a model file): three kernel reads (dentry, name
 * length and pointer), one read of the name's last 16 bytes, a hash lookup of its extension;
 * through tracepoints, a copy of the path from user memory instead of the kernel reads, and a
 * missed lookup of the thread in `pending` at syscall exit.
 * Anything that goes wrong (a read fails, the path does not resolve) allows the open: the guard
 * fails open and counts it, so it can never lock the machine out.
 */
#include <uapi/linux/ptrace.h>
#include <linux/fs.h>

#define EPERM 1
#define EXT_LEN 16        /* extension bytes after the last '.', NUL padded */
#define PATH_LEN 4096     /* PATH_MAX */
#define PREFIX_WORDS 16   /* directory prefixes up to 128 bytes */
#define MAX_RULES 16
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 256
#endif

/* settings[] */
#define SET_ENFORCE 0
#define SET_COUNT 1

/* counters[] (per CPU) */
#define C_ALLOWED 0      /* matched opens allowed (allow-listed, or audit mode) */
#define C_DENIED 1       /* matched opens denied with -EPERM */
#define C_RING_FULL 2    /* matched opens whose record was lost (ring buffer full) */
#define C_READ_FAILED 3  /* kernel read failed: allowed (fail open) */
#define C_PATH_FAILED 4  /* d_path failed where a directory rule needed it: allowed (fail open) */
#define C_COUNT 5
#define MAX_PENDING 1024 /* tracepoints: matched opens between syscall enter and exit */
#define AT_FDCWD -100

/* decision in the record */
#define D_ALLOWED 0
#define D_DENIED 1

struct ext_key {
    char ext[EXT_LEN];
};

struct prefix {
    u64 word[PREFIX_WORDS];
    u64 mask[PREFIX_WORDS]; /* all-ones over the prefix's bytes; an all-zero mask: any directory */
};

struct exe_key {
    u64 ino;
    u32 dev; /* kernel dev_t: major << 20 | minor */
    u32 pad;
};

struct open_record {
    u64 ts;          /* CLOCK_MONOTONIC ns */
    u64 cgroup;      /* cgroup v2 id */
    u64 exe_ino;
    u32 exe_dev;
    u32 pid;         /* tgid */
    u32 tid;
    u32 uid;
    u32 gid;
    u32 flags;       /* open flags (O_ACCMODE, O_CREAT, ...) */
    u32 rules;       /* bit i: rule i matched */
    s32 path_len;    /* bytes with the NUL (bpf_d_path's or the user string's), or -errno */
    s32 result;      /* tracepoints: the syscall's return, fd or -errno */
    s32 dirfd;       /* tracepoints: what a relative path is relative to (AT_FDCWD: the cwd) */
    u8 decision;
    u8 allow_listed;
    u8 pad[2];
    char comm[16];
    char path[PATH_LEN];
};

BPF_ARRAY(settings, u32, SET_COUNT);
BPF_PERCPU_ARRAY(counters, u64, C_COUNT);
BPF_HASH(extensions, struct ext_key, u32, 64);   /* extension -> rules that end in it */
BPF_ARRAY(prefixes, struct prefix, MAX_RULES);   /* rule -> its directory */
BPF_HASH(allowed_exes, struct exe_key, u8, 256);
BPF_HASH(allowed_uids, u32, u8, 256);
BPF_HASH(allowed_cgroups, u64, u8, 256);
BPF_HASH(allowed_tgids, u32, u8, 16);             /* the agent itself */
BPF_RINGBUF_OUTPUT(opens, RINGBUF_PAGES);

/* Where a record is built when the ring is full (LSM) or before it is known to match (tracepoints). */
BPF_PERCPU_ARRAY(scratch, struct open_record, 1);

static __always_inline void count(int index) {
    u64 *value = counters.lookup(&index);
    if (value)
        (*value)++;
}

static __always_inline int read_ptr(void *dst, const void *base, u32 offset) {
    return bpf_probe_read_kernel(dst, sizeof(void *), (const char *)base + offset);
}

/* The rules whose extension ends ``tail`` (the last n <= EXT_LEN + 1 bytes of a name or path);
 * 0 for (almost) every file. An "extension" holding a '/' never matches: keys have none. */
static __always_inline u32 extension_rules(const char *tail, u32 n) {
    int dot = -1;
#pragma unroll
    for (int i = 0; i < EXT_LEN + 1; i++) {
        if (i < n && tail[i] == '.')
            dot = i;
    }
    if (dot < 0)
        return 0;
    struct ext_key key = {};
#pragma unroll
    for (int i = 0; i < EXT_LEN; i++) {
        int from = dot + 1 + i;
        if (from < n && from < EXT_LEN + 1)
            key.ext[i] = tail[from];
    }
    u32 *found = extensions.lookup(&key);
    return found ? *found : 0;
}

/* The last bytes of ``len`` bytes at ``name`` (kernel memory), for extension_rules. */
static __always_inline int read_tail(char *tail, const char *name, u32 len, u32 *n) {
    *n = len < EXT_LEN + 1 ? len : EXT_LEN + 1;
    return bpf_probe_read_kernel(tail, *n & 31, name + (len - *n));
}

/* Of ``candidates``, the rules whose directory (if any) starts the path. A function of its own
 * (a BPF-to-BPF call): inlined, its unrolled compares take the LSM program past 512 bytes of stack. */
static noinline u32 directory_rules(u32 candidates, const char *path, int path_ok) {
    u32 matched = 0;
#pragma unroll
    for (int r = 0; r < MAX_RULES; r++) {
        if (!(candidates & (1u << r)))
            continue;
        int index = r;
        struct prefix *prefix = prefixes.lookup(&index);
        if (!prefix)
            continue;
        u64 differs = 0, any = 0;
#pragma unroll
        for (int w = 0; w < PREFIX_WORDS; w++) {
            u64 word = 0;
            __builtin_memcpy(&word, path + 8 * w, 8);
            differs |= (word ^ prefix->word[w]) & prefix->mask[w];
            any |= prefix->mask[w];
        }
        if (!any || (path_ok && !differs))
            matched |= 1u << r;
    }
    return matched;
}

static __always_inline int allow_listed(u32 tgid, u32 uid, u64 cgroup, struct exe_key *exe) {
    if (allowed_tgids.lookup(&tgid) || allowed_uids.lookup(&uid) || allowed_cgroups.lookup(&cgroup))
        return 1;
    void *task = (void *)bpf_get_current_task();
    void *mm = NULL, *exe_file = NULL, *inode = NULL, *sb = NULL;
    if (read_ptr(&mm, task, TASK_MM))
        return -1;
    if (!mm)
        return 1; /* a kernel thread (firmware, module loading): never ours to deny */
    if (read_ptr(&exe_file, mm, MM_EXE_FILE) || !exe_file || read_ptr(&inode, exe_file, F_INODE) || !inode ||
        bpf_probe_read_kernel(&exe->ino, sizeof(exe->ino), (char *)inode + INODE_INO) ||
        read_ptr(&sb, inode, INODE_SB) || !sb ||
        bpf_probe_read_kernel(&exe->dev, sizeof(exe->dev), (char *)sb + SB_DEV))
        return -1;
    return allowed_exes.lookup(exe) ? 1 : 0;
}

/* Fills the record's who-and-when for a matched open; 1 when it is to be denied. */
static __always_inline int decide(struct open_record *record, u32 matched, int enforce) {
    u64 id = bpf_get_current_pid_tgid();
    u64 uid_gid = bpf_get_current_uid_gid();
    u64 cgroup = bpf_get_current_cgroup_id();
    struct exe_key exe = {};
    int listed = allow_listed(id >> 32, (u32)uid_gid, cgroup, &exe);
    int deny = listed == 0 && enforce;
    if (listed < 0)
        count(C_READ_FAILED);
    record->ts = bpf_ktime_get_ns();
    record->cgroup = cgroup;
    record->exe_ino = exe.ino;
    record->exe_dev = exe.dev;
    record->pid = id >> 32;
    record->tid = (u32)id;
    record->uid = (u32)uid_gid;
    record->gid = uid_gid >> 32;
    record->rules = matched;
    record->decision = deny ? D_DENIED : D_ALLOWED;
    record->allow_listed = listed > 0;
    bpf_get_current_comm(record->comm, sizeof(record->comm));
    return deny;
}

#ifdef TRACEPOINTS
BPF_HASH(pending, u32, struct open_record, MAX_PENDING); /* thread -> its matched open in flight */

/* Syscall entry: the path as passed (absolute or relative to dirfd), in user memory. Directory
 * rules are left to user space, which alone can join a relative path with the process's cwd or
 * dirfd — and directory_rules unrolled would take these programs past the 4096 instructions a
 * kernel that does not count the loader as bpf_capable allows. */
static __always_inline int enter_open(int dirfd, const char *filename, u32 flags) {
    int zero = 0;
    struct open_record *record = scratch.lookup(&zero);
    if (!record)
        return 0;
    int len = bpf_probe_read_user_str(record->path, PATH_LEN, filename);
    if (len <= 1)
        return 0; /* unreadable (not paged in yet: missed, and not counted) or "" */
    char tail[EXT_LEN + 1] = {};
    u32 n = 0;
    if (read_tail(tail, record->path, (u32)(len - 1) & (PATH_LEN - 1), &n))
        return 0;
    u32 rules = extension_rules(tail, n);
    if (!rules)
        return 0;
    decide(record, rules, 0);
    record->path_len = len;
    record->flags = flags;
    record->dirfd = dirfd;
    u32 tid = record->tid;
    if (pending.update(&tid, record))
        count(C_RING_FULL); /* MAX_PENDING opens in flight: this one goes unreported */
    return 0;
}

/* Syscall exit: the result joins the record, which goes to user space. */
static __always_inline int exit_open(long ret) {
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct open_record *record = pending.lookup(&tid);
    if (!record)
        return 0;
    record->result = ret;
    if (opens.ringbuf_output(record, sizeof(*record), 0))
        count(C_RING_FULL);
    pending.delete(&tid);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_openat) { return enter_open(args->dfd, args->filename, args->flags); }
TRACEPOINT_PROBE(syscalls, sys_exit_openat) { return exit_open(args->ret); }
#ifdef HAVE_OPENAT2
TRACEPOINT_PROBE(syscalls, sys_enter_openat2) {
    u64 flags = 0; /* struct open_how starts with its u64 flags */
    bpf_probe_read_user(&flags, sizeof(flags), args->how);
    return enter_open(args->dfd, args->filename, (u32)flags);
}
TRACEPOINT_PROBE(syscalls, sys_exit_openat2) { return exit_open(args->ret); }
#endif
#ifdef HAVE_OPEN
TRACEPOINT_PROBE(syscalls, sys_enter_open) { return enter_open(AT_FDCWD, args->filename, args->flags); }
TRACEPOINT_PROBE(syscalls, sys_exit_open) { return exit_open(args->ret); }
#endif

#else /* BPF LSM */

LSM_PROBE(file_open, struct file *file, int ret) {
    if (ret)
        return ret; /* another LSM already said no */
    void *dentry = NULL;
    const char *name = NULL;
    u32 len = 0, n = 0;
    char tail[EXT_LEN + 1] = {};
    if (read_ptr(&dentry, file, F_PATH + PATH_DENTRY) || !dentry ||
        bpf_probe_read_kernel(&len, sizeof(len), (char *)dentry + DENTRY_NAME + QSTR_LEN) ||
        read_ptr(&name, dentry, DENTRY_NAME + QSTR_NAME) || !name || read_tail(tail, name, len, &n)) {
        count(C_READ_FAILED);
        return 0;
    }
    u32 rules = extension_rules(tail, n);
    if (!rules)
        return 0;

    /* With the ring full the open is still decided, in the per-CPU scratch record, and only its
     * report is lost (counted). */
    struct open_record *record = opens.ringbuf_reserve(sizeof(struct open_record));
    int reserved = record != NULL;
    int zero = 0;
    if (!reserved) {
        count(C_RING_FULL);
        record = scratch.lookup(&zero);
        if (!record)
            return 0;
    }
    int path_len = bpf_d_path((struct path *)((char *)file + F_PATH), record->path, PATH_LEN);
    u32 matched = directory_rules(rules, record->path, path_len > 0);
    if (!matched) {
        if (reserved)
            opens.ringbuf_discard(record, 0);
        if (path_len <= 0)
            count(C_PATH_FAILED); /* a directory rule could not be checked */
        return 0;
    }
    u32 *enforce = settings.lookup(&zero);
    int deny = decide(record, matched, enforce && *enforce);
    count(deny ? C_DENIED : C_ALLOWED);
    if (reserved) {
        bpf_probe_read_kernel(&record->flags, sizeof(record->flags), (char *)file + F_FLAGS);
        record->path_len = path_len;
        record->result = deny ? -EPERM : 0;
        record->dirfd = AT_FDCWD;
        opens.ringbuf_submit(record, 0);
    }
    return deny ? -EPERM : 0;
}
#endif
