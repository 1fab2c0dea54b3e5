"""``otel-ebpf doctor``: can this machine run the agent, and if not, what exactly to do about it.

Each check looks at one kernel or host feature the agent relies on and, when it fails, names the
command that fixes it. *Required* checks are the ones without which the agent cannot start; the
others degrade one feature (the fallback path, CPU profiling, BTF-based hooks) or are information.

The checks that matter most are the end-to-end ones: BCC compiling and loading a real tracepoint
program with a ring buffer. Headers, tracefs and privileges can all look right and that still fail,
so it runs in a subprocess (libbcc prints compiler errors straight to fd 2, and a crash there must
not take the doctor down) and the report quotes the tail of what the compiler said.

Only the standard library (and ``bcc``, which is what is being checked) is imported, so the doctor
also runs from a bare source tree: ``python3 -m otel_ebpf.doctor``.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
import re
import resource
import subprocess
import sys
from dataclasses import dataclass
from typing import TextIO

RINGBUF_KERNEL = (5, 8)  # BPF_MAP_TYPE_RINGBUF
MEMCG_ACCOUNTING_KERNEL = (5, 11)  # BPF memory charged to the cgroup, RLIMIT_MEMLOCK ignored
SOCK_LENGTH_KERNEL = (6, 3)  # sock:sock_send_length / sock:sock_recv_length

TRACEFS_ROOTS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
BTF_VMLINUX = "/sys/kernel/btf/vmlinux"
KHEADERS = "/sys/kernel/kheaders.tar.xz"  # CONFIG_IKHEADERS: BCC extracts headers from it
LSM_LIST = "/sys/kernel/security/lsm"
PERF_PARANOID = "/proc/sys/kernel/perf_event_paranoid"
UPROBE_PMU = "/sys/bus/event_source/devices/uprobe"
KPROBE_PMU = "/sys/bus/event_source/devices/kprobe"

# Capability bit numbers (linux/capability.h).
CAPS = {
    "CAP_SYS_PTRACE": 19,
    "CAP_SYS_ADMIN": 21,
    "CAP_SYS_RESOURCE": 24,
    "CAP_PERFMON": 38,
    "CAP_BPF": 39,
}

# Not needed to load BPF, but the agent is better with them: why, for the report.
HELPFUL_CAPS = {
    "CAP_SYS_PTRACE": "reads other users' /proc/<pid>/environ and maps",
    "CAP_SYS_RESOURCE": "raises memlock; matters only before Linux 5.11",
}

PROBE_TIMEOUT_S = 90
SKIPPED_FIX = "fix the 'bcc module' check first"
TAIL_LINES = 15

# Compiles a ring buffer plus a syscall tracepoint, attaches it, and proves an event arrives: the
# same machinery every otel-ebpf probe uses, in the smallest program that exercises all of it.
RINGBUF_PROBE = r'''
import os, sys
from bcc import BPF
bpf = BPF(text="""
BPF_RINGBUF_OUTPUT(events, 8);
TRACEPOINT_PROBE(syscalls, sys_enter_close) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (tgid != TARGET_TGID)
        return 0;
    events.ringbuf_output(&tgid, sizeof(tgid), 0);
    return 0;
}
""", cflags=["-DTARGET_TGID=%d" % os.getpid()])
received = []
bpf["events"].open_ring_buffer(lambda ctx, data, size: received.append(size))
for _ in range(3):
    os.close(os.open("/dev/null", os.O_RDONLY))
bpf.ring_buffer_poll(2000)
bpf.cleanup()
if not received:
    sys.exit("program loaded and attached, but no event arrived through the ring buffer")
print("%d events received" % len(received))
'''

# CPU sampling for profiles: a software perf event (cpu-clock) driving a BPF program.
PERF_SAMPLING_PROBE = r'''
import sys, time
from bcc import BPF, PerfType, PerfSWConfig
bpf = BPF(text="""
#include <uapi/linux/bpf_perf_event.h>
BPF_ARRAY(samples, u64, 1);
int on_sample(struct bpf_perf_event_data *ctx) {
    int zero = 0;
    u64 *count = samples.lookup(&zero);
    if (count)
        __sync_fetch_and_add(count, 1);
    return 0;
}
""")
bpf.attach_perf_event(ev_type=PerfType.SOFTWARE, ev_config=PerfSWConfig.CPU_CLOCK,
                      fn_name="on_sample", sample_freq=499)
deadline = time.monotonic() + 0.5
while time.monotonic() < deadline:
    pass
count = sum(v.value for v in bpf["samples"].values())
bpf.cleanup()
if not count:
    sys.exit("perf event attached, but it produced no samples in 0.5 s of busy CPU")
print("%d samples in 0.5 s" % count)
'''


@dataclass(frozen=True)
class CheckResult:
    """One line of the report. ``fix`` is a command a person can run (empty when ``ok``)."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def kernel_version(release: str | None = None) -> tuple[int, int]:
    """(major, minor) of a release string such as ``6.18.44-fc-v857``; (0, 0) when unparsable."""
    m = re.match(r"(\d+)\.(\d+)", release if release is not None else platform.release())
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def effective_caps(status: str | None = None) -> set[str]:
    """Names from :data:`CAPS` present in ``CapEff`` of ``/proc/self/status`` (or ``status``)."""
    text = status if status is not None else (_read("/proc/self/status") or "")
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", text, re.M)
    mask = int(m.group(1), 16) if m else 0
    return {name for name, bit in CAPS.items() if mask >> bit & 1}


def tracefs_root() -> str | None:
    """The mounted tracefs (either location BCC accepts), or None."""
    for root in TRACEFS_ROOTS:
        if os.path.isdir(os.path.join(root, "events")):
            return root
    return None


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ---------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------


def check_privileges() -> CheckResult:
    """Loading BPF needs CAP_BPF + CAP_PERFMON (5.8+) or CAP_SYS_ADMIN; uid 0 alone is not enough in a container."""
    caps = effective_caps()
    ok = {"CAP_BPF", "CAP_PERFMON"} <= caps or "CAP_SYS_ADMIN" in caps
    detail = f"uid {os.geteuid()}; effective: {', '.join(sorted(caps)) or 'none of ' + ', '.join(CAPS)}"
    lacking = [f"{cap} ({why})" for cap, why in HELPFUL_CAPS.items() if cap not in caps]
    if ok and lacking:
        detail += "; lacks " + ", ".join(lacking)
    return CheckResult(
        "privileges",
        ok,
        detail,
        "run as root: sudo -E .venv/bin/otel-ebpf run ...  (containers: privileged, or add CAP_BPF, "
        "CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE; see deploy/README.md)",
    )


def check_kernel_version() -> CheckResult:
    """Every probe sends its events through a BPF ring buffer (5.8+)."""
    release = platform.release()
    version = kernel_version(release)
    ok = version >= RINGBUF_KERNEL
    need = ".".join(map(str, RINGBUF_KERNEL))
    return CheckResult(
        "kernel version",
        ok,
        f"{release} ({'has' if ok else 'lacks'} BPF ring buffers, which need {need}+)",
        f"boot a Linux {need} or newer kernel",
    )


def check_btf() -> CheckResult:
    """The fast socket path (socket fields, task storage) and LSM-hook features need BTF; without
    it the socket probe tracks fds (the fallback)."""
    ok = os.path.exists(BTF_VMLINUX)
    return CheckResult(
        "BTF",
        ok,
        f"{BTF_VMLINUX} {'present' if ok else 'missing'} (the fast socket path and BTF-based features, "
        "e.g. LSM hooks, need it; without it sockets are tracked by fd)",
        "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y",
        required=False,
    )


def check_tracefs() -> CheckResult:
    """BCC resolves each tracepoint's id and format through tracefs; unmounted on fresh machines."""
    root = tracefs_root()
    return CheckResult(
        "tracefs",
        root is not None,
        f"mounted at {root}" if root else "not mounted (BCC reads tracepoint formats from it)",
        "mount -t tracefs tracefs /sys/kernel/tracing",
    )


def _tracepoint_check(name: str, events: list[str], why: str, fix: str, required: bool = True) -> CheckResult:
    root = tracefs_root()
    if root is None:
        mount = "mount -t tracefs tracefs /sys/kernel/tracing"
        return CheckResult(name, False, "tracefs not mounted", mount, required)
    missing = [e.replace("/", ":") for e in events if not os.path.isdir(os.path.join(root, "events", e))]
    detail = f"{why}: " + ("present" if not missing else "missing " + ", ".join(missing))
    return CheckResult(name, not missing, detail, fix, required)


def check_tracepoints() -> list[CheckResult]:
    """The tracepoints the socket probe attaches to (docs/architecture.md, "Sockets without kprobes")."""
    sock_length = ".".join(map(str, SOCK_LENGTH_KERNEL))
    return [
        _tracepoint_check(
            "syscall tracepoints",
            ["syscalls/sys_enter_write", "syscalls/sys_exit_write", "syscalls/sys_enter_close"],
            "socket I/O capture",
            "boot a kernel built with CONFIG_FTRACE_SYSCALLS=y",
        ),
        _tracepoint_check(
            "sock:inet_sock_set_state",
            ["sock/inet_sock_set_state"],
            "connection 4-tuples",
            "boot a Linux 4.16 or newer kernel",
        ),
        _tracepoint_check(
            "sched:sched_process_exec",
            ["sched/sched_process_exec"],
            "discovering new processes",
            "boot a kernel built with CONFIG_TRACEPOINTS=y",
        ),
        _tracepoint_check(
            "sock:sock_{send,recv}_length",
            ["sock/sock_send_length", "sock/sock_recv_length"],
            f"fast socket path (Linux {sock_length}+)",
            f"optional: boot Linux {sock_length}+; until then the agent tracks socket fds from "
            "socket/accept/connect (slower fallback)",
            required=False,
        ),
    ]


def check_kernel_headers() -> CheckResult:
    """BCC compiles against kernel headers; generic ones are fine because no struct fields are read."""
    release = platform.release()
    build = f"/lib/modules/{release}/build"
    source = f"/lib/modules/{release}/source"
    fix = (
        f"make bootstrap  (installs linux-headers-{release}, or links generic Debian headers "
        f"into /lib/modules/{release})"
    )
    override = os.environ.get("BCC_KERNEL_SOURCE")
    if override:
        # BCC then takes one merged tree for everything (the container image ships one).
        ok = os.path.exists(os.path.join(override, "include/linux/kconfig.h")) and os.path.exists(
            os.path.join(override, "include/generated/autoconf.h")
        )
        detail = f"BCC_KERNEL_SOURCE={override}" + (
            "" if ok else " lacks include/linux/kconfig.h or generated/autoconf.h"
        )
        return CheckResult("kernel headers", ok, detail, "unset BCC_KERNEL_SOURCE, or point it at a full header tree")
    usable = os.path.isdir(os.path.join(build, "include")) or os.path.exists(
        os.path.join(source, "include/linux/kconfig.h")
    )
    if not usable:
        if os.path.exists(KHEADERS):
            return CheckResult("kernel headers", True, f"exact: BCC extracts {KHEADERS}", fix)
        return CheckResult("kernel headers", False, f"no usable headers under /lib/modules/{release}", fix)
    target = os.path.realpath(build)
    name = os.path.basename(target)
    if os.path.islink(build) and name.startswith("linux-headers-") and release not in name:
        detail = f"generic: build -> {target} (safe: otel-ebpf's BPF reads no kernel struct fields)"
    else:
        detail = f"exact: build -> {target}"
    return CheckResult("kernel headers", True, detail, fix)


def check_bcc_import() -> CheckResult:
    """Debian's python3-bpfcc must be visible to this interpreter (bootstrap adds a shim to the venv)."""
    fix = "make bootstrap  (apt-get install -y python3-bpfcc, plus the bcc shim in .venv)"
    try:
        import bcc  # noqa: PLC0415 — importing bcc is the check itself
    except Exception as e:  # noqa: BLE001 — ImportError, or OSError when libbcc.so cannot load
        return CheckResult("bcc module", False, f"import bcc failed in {sys.executable}: {e}", fix)
    version = getattr(bcc, "__version__", "unknown version")
    return CheckResult("bcc module", True, f"bcc {version} from {os.path.dirname(bcc.__file__)}", fix)


def _run_probe(name: str, script: str, fix: str, required: bool) -> CheckResult:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return CheckResult(name, False, f"timed out after {PROBE_TIMEOUT_S} s", fix, required)
    if proc.returncode == 0:
        return CheckResult(name, True, proc.stdout.strip(), fix, required)
    output = _tail(proc.stderr + "\n" + proc.stdout) or f"exit status {proc.returncode}, no output"
    return CheckResult(name, False, f"failed (exit {proc.returncode}):\n{output}", fix, required)


def check_bcc_ringbuf(bcc_ok: bool) -> CheckResult:
    """The end-to-end check: compile, load, attach a tracepoint and receive through a ring buffer."""
    name = "BCC compile + ring buffer"
    fix = "make bootstrap, then fix what the compiler says above (headers, tracefs, privileges)"
    if not bcc_ok:
        return CheckResult(name, False, "skipped: bcc cannot be imported", SKIPPED_FIX)
    return _run_probe(name, RINGBUF_PROBE, fix, required=True)


def check_perf_sampling(bcc_ok: bool) -> CheckResult:
    """CPU profiling samples with a software perf event driving a BPF program."""
    name = "perf event sampling"
    fix = "CPU profiling needs it: a kernel with CONFIG_PERF_EVENTS=y, and CAP_PERFMON in containers"
    if not bcc_ok:
        return CheckResult(name, False, "skipped: bcc cannot be imported", SKIPPED_FIX, required=False)
    return _run_probe(name, PERF_SAMPLING_PROBE, fix, required=False)


def check_perf_paranoid() -> CheckResult:
    """The sysctl gates perf_event_open for unprivileged users; privileged agents bypass it."""
    value = _read(PERF_PARANOID)
    caps = effective_caps()
    privileged = bool({"CAP_PERFMON", "CAP_SYS_ADMIN"} & caps)
    if value is None:
        fix = "boot a kernel built with CONFIG_PERF_EVENTS=y"
        return CheckResult("perf_event_paranoid", False, f"{PERF_PARANOID} missing", fix, required=False)
    ok = privileged or int(value) <= 1
    detail = value + (" (no effect here: CAP_PERFMON/CAP_SYS_ADMIN bypass it)" if privileged else "")
    fix = "sysctl -w kernel.perf_event_paranoid=1"
    return CheckResult("perf_event_paranoid", ok, detail, fix, required=False)


def check_uprobes() -> CheckResult:
    """TLS plaintext and CUDA/NCCL calls are observed with uprobes; without them those features are off."""
    ok = os.path.isdir(UPROBE_PMU)
    return CheckResult(
        "uprobes",
        ok,
        f"{'available' if ok else 'missing'} (TLS and CUDA/NCCL probes use them)",
        "boot a kernel built with CONFIG_UPROBE_EVENTS=y",
        required=False,
    )


def _ssl_symbols(path: str) -> set[str]:
    from bcc import BPF  # noqa: PLC0415 — a check, not a requirement: bcc may be missing

    from .probes.tls import SYMBOL_PATTERN  # noqa: PLC0415 — the probe modules import bcc

    try:
        return {name.decode() for name, _ in BPF.get_user_functions_and_addresses(path, SYMBOL_PATTERN)}
    except Exception:  # noqa: BLE001 — not an ELF file, or unreadable
        return set()


def check_tls_libraries(bcc_ok: bool) -> list[CheckResult]:
    """HTTPS and gRPC-over-TLS plaintext come from uprobes on OpenSSL's SSL_read/SSL_write: the
    library must export those symbols. grpcio links BoringSSL into its stripped ``cygrpc`` module."""
    from .probes.tls import REQUIRED, system_libssl  # noqa: PLC0415 — the probe modules import bcc

    if not bcc_ok:
        return [CheckResult("TLS libraries", False, "not checked: bcc is unavailable", "make bootstrap", False)]
    results = []
    libraries = system_libssl()
    hookable = [path for path in libraries if set(REQUIRED) <= _ssl_symbols(path)]
    results.append(
        CheckResult(
            "TLS (OpenSSL)",
            bool(hookable),
            f"SSL_read/SSL_write found in {', '.join(hookable)}"
            if hookable
            else f"no libssl with SSL_read/SSL_write symbols ({', '.join(libraries) or 'none installed'})",
            "apt-get install -y libssl3  (HTTPS of programs using their own static TLS is not captured)",
            required=False,
        )
    )
    for module in _grpcio_modules():
        if not set(REQUIRED) <= _ssl_symbols(module):
            results.append(
                CheckResult(
                    "TLS (grpcio)",
                    False,
                    f"{module} carries BoringSSL without symbols: gRPC over TLS from grpcio is not captured "
                    "(plaintext gRPC is)",
                    "terminate TLS in a proxy using OpenSSL, or use plaintext gRPC inside the node",
                    required=False,
                )
            )
    return results


def _grpcio_modules() -> list[str]:
    """grpcio's compiled core (``grpc/_cython/cygrpc*.so``) in this interpreter's environment."""
    spec = importlib.util.find_spec("grpc")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "_cython", "cygrpc*.so")))


def check_kprobes() -> CheckResult:
    """Information only: otel-ebpf never uses kprobes (docs/architecture.md, "Stable kernel ABI only")."""
    root = tracefs_root()
    present = os.path.isdir(KPROBE_PMU) or (root is not None and os.path.exists(f"{root}/kprobe_events"))
    return CheckResult(
        "kprobes",
        True,
        f"{'available' if present else 'not available'} (information: otel-ebpf does not use them)",
        required=False,
    )


def check_gpu_devices() -> CheckResult:
    """Information only: whether NVML reports NVIDIA devices (GPU device state, docs/gpu.md)."""
    from .gpu.nvml import open_reader  # noqa: PLC0415
    from .selfmetrics import SelfMetrics  # noqa: PLC0415

    reader, why = open_reader(os.environ.get("OTEL_EBPF_GPU_NVML_LIBRARY") or None, SelfMetrics())
    if reader is not None:
        reader.close()
        return CheckResult("GPU devices", True, why, required=False)
    return CheckResult("GPU devices", True, f"none: no GPU device state will be exported ({why})", required=False)


def check_rdma_devices(root: str | None = None) -> CheckResult:
    """Information only: the RDMA devices whose port counters the agent reads (docs/rdma.md)."""
    root = root or os.environ.get("OTEL_EBPF_RDMA_SYSFS_ROOT") or "/sys/class/infiniband"
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        devices = []
    if not devices:
        return CheckResult("RDMA devices", True, f"none in {root}: no port counters will be exported", required=False)
    return CheckResult("RDMA devices", True, f"{', '.join(devices)} (port counters from {root})", required=False)


def check_memlock() -> CheckResult:
    """Before 5.11 BPF maps count against RLIMIT_MEMLOCK, and a small limit makes map creation fail."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    shown = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"
    memcg = kernel_version() >= MEMCG_ACCOUNTING_KERNEL
    if memcg:
        detail = f"ulimit -l {shown} (ignored: this kernel charges BPF memory to the cgroup)"
        return CheckResult("memlock", True, detail, required=False)
    ok = soft == resource.RLIM_INFINITY or soft >= 64 * 1024 * 1024
    return CheckResult(
        "memlock",
        ok,
        f"ulimit -l {shown}; kernels before 5.11 count BPF maps against it",
        "ulimit -l unlimited  (needs CAP_SYS_RESOURCE; systemd: LimitMEMLOCK=infinity)",
        required=True,
    )


def check_bpf_lsm() -> CheckResult:
    """Information: BPF LSM is needed only by BTF-based LSM features, never by the core agent."""
    lsms = _read(LSM_LIST)
    if lsms is None:
        return CheckResult(
            "BPF LSM",
            False,
            f"{LSM_LIST} unreadable (securityfs not mounted?)",
            "mount -t securityfs securityfs /sys/kernel/security",
            required=False,
        )
    ok = "bpf" in lsms.split(",")
    return CheckResult(
        "BPF LSM",
        ok,
        f"active: {lsms} (information: only LSM-hook features need bpf)",
        "add bpf to the kernel command line: lsm=" + (lsms + ",bpf" if lsms else "bpf"),
        required=False,
    )


LSM_LOADS = "a file_open LSM program loads (model_guard can audit and enforce)"
LSM_REFUSED = "model_guard can audit, through syscall tracepoints, but not enforce; the rest of the agent is unaffected"


def check_bpf_lsm_load(lsm_listed: bool) -> CheckResult:
    """The end-to-end LSM check: a trivial program for file_open loads (what model_guard needs)."""
    from .probes.lsm import lsm_load_error  # noqa: PLC0415 — standard library only, like this module

    name = "BPF LSM program load"
    if not lsm_listed:
        return CheckResult(name, False, "skipped: BPF LSM not active", "fix the 'BPF LSM' check first", required=False)
    error = lsm_load_error("file_open")
    return CheckResult(
        name,
        error is None,
        LSM_LOADS if error is None else f"{error} ({LSM_REFUSED})",
        "run as root or with CAP_BPF, CAP_PERFMON and CAP_MAC_ADMIN; if that is the case already, the "
        "kernel blocks BPF trampolines: use a kernel that allows fentry/LSM programs",
        required=False,
    )


def run_checks() -> list[CheckResult]:
    """Run every check, cheapest first; the BCC probes take about a second each."""
    results = [
        check_privileges(),
        check_kernel_version(),
        check_btf(),
        check_tracefs(),
        *check_tracepoints(),
        check_kernel_headers(),
    ]
    bcc = check_bcc_import()
    results += [
        bcc,
        check_bcc_ringbuf(bcc.ok),
        check_perf_paranoid(),
        check_perf_sampling(bcc.ok),
        check_uprobes(),
        *check_tls_libraries(bcc.ok),
        check_kprobes(),
        check_gpu_devices(),
        check_rdma_devices(),
        check_memlock(),
        check_bpf_lsm(),
    ]
    results.append(check_bpf_lsm_load(results[-1].ok))
    return results


def print_report(results: list[CheckResult], stream: TextIO) -> int:
    """Write one line per check (and its fix when it failed); return the process exit code:
    1 when a required check failed, else 0."""
    width = max((len(r.name) for r in results), default=0)
    failed = warned = 0
    for r in results:
        if r.ok:
            tag = " OK "
        elif r.required:
            tag, failed = "FAIL", failed + 1
        else:
            tag, warned = "WARN", warned + 1
        first, *rest = r.detail.splitlines() or [""]
        stream.write(f"[{tag}] {r.name:<{width}}  {first}\n")
        pad = " " * (width + 9)
        for line in rest:
            stream.write(f"{pad}{line}\n")
        if not r.ok and r.fix:
            stream.write(f"{pad}fix: {r.fix}\n")
    ok = len(results) - failed - warned
    verdict = "the agent cannot run here" if failed else "the agent can run here"
    stream.write(f"{ok} ok, {warned} warning(s), {failed} required failed: {verdict}\n")
    return 1 if failed else 0


def main() -> int:
    """Entry point for ``python -m otel_ebpf.doctor`` (the CLI's ``doctor`` does the same)."""
    return print_report(run_checks(), sys.stdout)


if __name__ == "__main__":
    sys.exit(main())
