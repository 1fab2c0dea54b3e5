"""Cost of the RDMA verbs probe per hooked call, on the stand-in libibverbs, with and without the agent.

A small C driver (compiled here against the system's infiniband/verbs.h, linked to a private build
of the stand-in) makes one kind of control-path call in a loop, in bursts of ``--burst``
iterations, timing each burst. Per row, in one run: bursts without the agent, then with
``otel-ebpf run --pid <driver>`` and ``rdma.verbs: true`` attached (file exporter, a pause after
each burst for the agent to drain the ring buffer), then without again. Reported: the fastest
burst of each kind (on a shared machine other programs only ever add time), the time added per
call (``traced - untraced``), the calls the agent decoded over those made while attached, and the
kernel's drops (must be 0).

Rows:
- ``empty uprobe+uretprobe``: the kernel's mechanism alone (empty BPF programs on
  ``ibv_alloc_pd`` and ``ibv_dealloc_pd``), for reference.
- ``ibv_alloc_pd+ibv_dealloc_pd``: two hooked calls; each reads the device's name through
  the object's context (two or three user-memory reads), entry and return.
- ``ibv_reg_mr+ibv_dereg_mr``: ``ibv_reg_mr`` jumps to ``ibv_reg_mr_iova2`` (both hooked: the
  inner one only counts its depth), as the real library does.
- ``queue pair lifecycle``: ``ibv_create_qp``, three ``ibv_modify_qp`` (RESET -> INIT -> RTR ->
  RTS, the RTR one with the peer's address), ``ibv_destroy_qp``: five calls, a log record each.

These are set-up calls (a job makes them at start and teardown, not per message); there is no
target for them but "negligible next to what a real provider does in the kernel" (a real
``ibv_reg_mr`` pins pages: tens of microseconds and more).

The data path (the stand-in's provider, completions at once), per work request:
- ``post_send 1 WR + poll_cq``: one signaled RDMA_WRITE posted through verbs.h's inline
  ``ibv_post_send``, then ``ibv_poll_cq`` until its completion came (one poll, in practice):
  the cost of one work request and its completion, unbatched.
- ``post_send 16 WRs + poll_cq``: a list of 16, polled 16 at a time: the cost per work request
  and per completion when an application batches (as NCCL and most RDMA programs do).
- ``empty poll_cq``: a poll that finds nothing, per call (a busy-polling loop's cost).
- ``post_send 1 WR + poll_cq, per WR, NCCL process``: the first data-path row in a process that
  maps the stand-in ``libnccl.so.2`` (preloaded): each post call also sends its 32-byte record
  for the collectives' spans (docs/rdma.md, "NCCL collectives and their queue pairs").
Target: at most 2 µs added per work request and per polled completion.

Usage: ``python bench/verbs_probe_cost.py``
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.gpu.standin.build import build as build_gpu  # noqa: E402
from tests.otlp_receiver import load_file_metrics  # noqa: E402
from tests.rdma.standin import build  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))  # bench/ is no package
from harness import kernel_drops, print_columns, timed_bursts  # noqa: E402
from results import write_result  # noqa: E402

AGENT = [sys.executable, "-m", "otel_ebpf.cli"]
CALLS_PER_ITERATION = {"pd": 2, "mr": 2, "qp": 5, "send1": 1, "send16": 16, "poll0": 1}
DATA_PATH = frozenset({"send1", "send16", "poll0"})

DRIVER_C = r"""
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static long long now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec;
}
static char buffer[1 << 16];
static struct ibv_wc wc[16];
// a queue pair connected to itself: the stand-in's provider completes its RDMA writes at once
static struct ibv_qp *loopback(struct ibv_pd *pd, struct ibv_cq *cq) {
    struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC};
    struct ibv_qp *qp = ibv_create_qp(pd, &init);
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
    ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT);
    struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTR, .dest_qp_num = qp->qp_num, .ah_attr = {.port_num = 1}};
    ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_DEST_QPN);
    struct ibv_qp_attr s = {.qp_state = IBV_QPS_RTS};
    ibv_modify_qp(qp, &s, IBV_QP_STATE);
    return qp;
}
// post `n` signaled RDMA writes as one list, then poll until their completions came; failures
static long write_and_poll(struct ibv_qp *qp, struct ibv_cq *cq, int n) {
    struct ibv_sge sge = {.addr = (uintptr_t)buffer, .length = 4096, .lkey = 1};
    struct ibv_send_wr wrs[16], *bad = NULL;
    for (int i = 0; i < n; i++)
        wrs[i] = (struct ibv_send_wr){.wr_id = i, .next = i + 1 < n ? &wrs[i + 1] : NULL, .sg_list = &sge,
                                      .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED};
    if (ibv_post_send(qp, wrs, &bad))
        return 1;
    long failed = 0;
    for (int seen = 0; seen < n;) {
        int got = ibv_poll_cq(cq, 16, wc);
        for (int i = 0; i < got; i++)
            failed += wc[i].status != IBV_WC_SUCCESS;
        seen += got;
    }
    return failed;
}
int main(int argc, char **argv) {
    int n = 0;
    struct ibv_device **devices = ibv_get_device_list(&n);
    struct ibv_context *context = ibv_open_device(devices[0]);
    struct ibv_pd *pd = ibv_alloc_pd(context);
    struct ibv_cq *cq = ibv_create_cq(context, 64, NULL, NULL, 0);
    struct ibv_qp *qp = loopback(pd, cq);
    const char *what = argv[1];
    int data_path = !strcmp(what, "send1") || !strcmp(what, "send16") || !strcmp(what, "poll0");
    char line[64];
    printf("ready\n"); fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        long count = atol(line), errors = 0;
        if (count <= 0) break;
        // a call with the context: an agent attached since start learns the provider's functions from it
        if (data_path)
            errors += ibv_dealloc_pd(ibv_alloc_pd(context)) != 0;
        long long t0 = now();
        for (long i = 0; i < count; i++) {
            if (!strcmp(what, "send1")) {
                errors += write_and_poll(qp, cq, 1);
            } else if (!strcmp(what, "send16")) {
                errors += write_and_poll(qp, cq, 16);
            } else if (!strcmp(what, "poll0")) {
                errors += ibv_poll_cq(cq, 16, wc) != 0;
            } else if (!strcmp(what, "pd")) {
                errors += ibv_dealloc_pd(ibv_alloc_pd(context)) != 0;
            } else if (!strcmp(what, "mr")) {
                errors += ibv_dereg_mr(ibv_reg_mr(pd, buffer, sizeof buffer, IBV_ACCESS_LOCAL_WRITE)) != 0;
            } else {
                struct ibv_qp_init_attr init = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC};
                struct ibv_qp *qp = ibv_create_qp(pd, &init);
                struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1};
                errors += ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT) != 0;
                struct ibv_qp_attr r = {.qp_state = IBV_QPS_RTR, .dest_qp_num = 7,
                                        .ah_attr = {.is_global = 1, .port_num = 1}};
                errors += ibv_modify_qp(qp, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_DEST_QPN) != 0;
                struct ibv_qp_attr s = {.qp_state = IBV_QPS_RTS};
                errors += ibv_modify_qp(qp, &s, IBV_QP_STATE) != 0;
                errors += ibv_destroy_qp(qp) != 0;
            }
        }
        printf("%lld %ld\n", now() - t0, errors); fflush(stdout);
    }
    return 0;
}
"""


def _start_agent(pid: int, out: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    ready = out / "ready"
    agent = subprocess.Popen(
        [*AGENT, "run", "--pid", str(pid), "--exporter", "file", "--output", str(out), "--ready-file", str(ready)],
        cwd=REPO,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OTEL_EBPF_RDMA_VERBS": "true", "OTEL_EBPF_GPU": "false", **(env or {})},
    )
    deadline = time.monotonic() + 90
    while not ready.exists():
        if agent.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the agent did not start (root? `otel-ebpf doctor`)")
        time.sleep(0.1)
    return agent


def _row(name: str, what: str, driver: Path, tmp: Path, burst: int, bursts: int, nccl: Path | None = None) -> list[str]:
    """``nccl``: a libnccl to preload into the driver, with the GPU probe on (NCCL spans are made:
    the verbs probe sends each post call of an NCCL process)."""
    per = CALLS_PER_ITERATION[what]
    preload = {"LD_PRELOAD": str(nccl)} if nccl else {}
    proc = subprocess.Popen(
        [str(driver), what], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **preload}
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        timed_bursts(proc, burst, 2, 0)  # warm up
        bare = timed_bursts(proc, burst * 20, bursts, 0.05)
        out = Path(tempfile.mkdtemp(dir=tmp))
        if what in DATA_PATH:  # a burst's context call names the provider's functions: measured once hooked
            gpu = {"OTEL_EBPF_GPU": "true"} if nccl else {}
            agent = _start_agent(proc.pid, out, {"OTEL_METRIC_EXPORT_INTERVAL": "500", **gpu})
            _until_hooked(proc, out / "metrics.jsonl")
        else:
            agent = _start_agent(proc.pid, out)
        traced = timed_bursts(proc, burst, bursts, 1.0)
        agent.send_signal(signal.SIGINT)
        agent.wait(timeout=60)
        bare += timed_bursts(proc, burst * 20, bursts, 0.05)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    metrics = load_file_metrics(out / "metrics.jsonl")
    drops = kernel_drops(metrics, "verbs_")
    per_call_bare, per_call_traced = min(bare) / per, min(traced) / per
    if what in DATA_PATH:  # work requests counted / posted in the measured bursts (and the warm-ups hooked)
        posted = bursts * burst * per if what != "poll0" else 0
        counted = sum(_latest(metrics, "rdma.work_requests").values())
        hooked = max((p["value"] for p in metrics.get("otel_ebpf.rdma.provider_functions", [])), default=0)
        decoded = f"{counted}/{posted} ({hooked} hooked)"
    else:
        made = bursts * burst * per
        decoded = f"{max((p['value'] for p in metrics.get('otel_ebpf.rdma.calls', [])), default=0)}/{made}"
    return [
        name,
        f"{per_call_bare / 1000:.2f}",
        f"{per_call_traced / 1000:.2f}",
        f"{(per_call_traced - per_call_bare) / 1000:.2f}",
        decoded,
        str(drops.get("verbs_posts_ringbuf_full" if nccl else "verbs_ringbuf_full", "?")),
    ]


def _until_hooked(proc: subprocess.Popen, metrics_file: Path, timeout_s: float = 60) -> None:
    """One-iteration bursts until the agent says it hooked the provider's three functions."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        timed_bursts(proc, 1, 1, 0.5)
        metrics = load_file_metrics(metrics_file) if metrics_file.exists() else {}
        if max((p["value"] for p in metrics.get("otel_ebpf.rdma.provider_functions", [])), default=0) == 3:
            return
    raise SystemExit("the agent did not hook the stand-in provider's functions")


def _latest(metrics: dict, name: str) -> dict[tuple, float]:
    """The last value of each series of a cumulative metric."""
    latest: dict[tuple, float] = {}
    for point in metrics.get(name, []):
        latest[tuple(sorted(point["attributes"].items()))] = point["value"]
    return latest


def _floor_row(driver: Path, library: Path, burst: int, bursts: int) -> list[str]:
    """The mechanism alone: empty BPF programs at the entry and return of both functions."""
    from bcc import BPF

    from otel_ebpf.probes.verbs import default_symbols

    proc = subprocess.Popen([str(driver), "pd"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        bare = min(timed_bursts(proc, burst * 20, bursts, 0.05)) / 2
        bpf = BPF(text="int enter(void *ctx) { return 0; } int leave(void *ctx) { return 0; }")
        for address in default_symbols(str(library), ("ibv_alloc_pd", "ibv_dealloc_pd")).values():
            bpf.attach_uprobe(name=str(library).encode(), addr=address, fn_name=b"enter")
            bpf.attach_uretprobe(name=str(library).encode(), addr=address, fn_name=b"leave")
        traced = min(timed_bursts(proc, burst, bursts, 0.05)) / 2
        bpf.cleanup()
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    return [
        "empty uprobe+uretprobe (the floor)",
        f"{bare / 1000:.2f}",
        f"{traced / 1000:.2f}",
        f"{(traced - bare) / 1000:.2f}",
        "-",
        "-",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=200, help="iterations per burst (fits the ring buffer)")
    parser.add_argument("--bursts", type=int, default=7)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/verbs_probe_cost.py needs root (it attaches the agent)")
    rows = [["calls", "untraced us/call", "traced us/call", "added us/call", "decoded/made", "ringbuf drops"]]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        # A private build: uprobes belong to files, so another agent hooking the shared stand-in
        # (a test run) would fire in the "untraced" runs too.
        libdir = build.build(tmp / "standin")
        source = tmp / "driver.c"
        source.write_text(DRIVER_C)
        driver = tmp / "driver"
        subprocess.run(
            ["gcc", "-O2", "-o", str(driver), str(source), f"-L{libdir}", "-l:libibverbs.so.1", f"-Wl,-rpath,{libdir}"],
            check=True,
        )
        rows.append(_floor_row(driver, libdir / build.LIBRARY, args.burst, args.bursts))
        rows.append(_row("ibv_alloc_pd+ibv_dealloc_pd", "pd", driver, tmp, args.burst, args.bursts))
        rows.append(_row("ibv_reg_mr+ibv_dereg_mr (nested iova2)", "mr", driver, tmp, args.burst, args.bursts))
        rows.append(_row("queue pair lifecycle (5 calls)", "qp", driver, tmp, args.burst // 2, args.bursts))
        rows.append(_row("post_send 1 WR + poll_cq, per WR", "send1", driver, tmp, args.burst * 10, args.bursts))
        rows.append(_row("post_send 16 WRs + poll_cq, per WR", "send16", driver, tmp, args.burst, args.bursts))
        rows.append(_row("empty poll_cq, per poll", "poll0", driver, tmp, args.burst * 10, args.bursts))
        nccl = build_gpu(tmp / "gpu-standin") / "libnccl.so.2"
        name = "post_send 1 WR + poll_cq, per WR, NCCL process"
        rows.append(_row(name, "send1", driver, tmp, args.burst * 10, args.bursts, nccl))
    print_columns(rows)
    write_result(
        "verbs_probe_cost",
        None,
        {
            "parameters": {"burst": args.burst, "bursts": args.bursts},
            "calls": [dict(zip(rows[0], row, strict=True)) for row in rows[1:]],
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
