"""The advisor's rules: each reads an :class:`~.evidence.Evidence` and returns its findings.

A rule is a small class with its thresholds as constructor arguments (the defaults are what the
report uses; the tests move them), deterministic and free of I/O. What each rule reads, when it
fires and why its thresholds are where they are is in ``docs/advise.md``.
"""

from __future__ import annotations

import abc
import itertools
import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import ClassVar

from otel_ebpf.gpu.bandwidth import peak_bandwidth
from otel_ebpf.gpu.views import format_stack
from otel_ebpf.profiles.model import Stack

from .evidence import Attributes, Evidence, MetricPoint, SpanEntry, process_key, process_label
from .findings import Finding, Severity
from .stacks import (
    ProcessKey,
    observed_window_s,
    parse_stacktrace,
    sample_attribute,
    totals_by_process,
    where,
)

MIB = 1 << 20
MAX_STACKS_PER_PROCESS = 3  # a rule quotes at most this many stacks of one process


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.1f} µs"


class Rule(abc.ABC):
    """One kind of problem. ``rule_id`` names it in reports and in ``--json``."""

    rule_id: ClassVar[str]

    @abc.abstractmethod
    def evaluate(self, evidence: Evidence) -> list[Finding]: ...


class SynchronizeInLoop(Rule):
    """The CPU waits for the GPU over and over from one stack: a ``synchronize`` or a synchronous
    copy (``loss.item()``) in the step. From the waits view (count and time per stack)."""

    rule_id = "sync-in-loop"
    COPY_ADVICE = (
        "a synchronous copy waits for all queued GPU work: typically loss.item(), tensor.cpu(), .tolist() or "
        "print(tensor) in every step. Keep running values on the GPU (total += loss.detach()) and read them every "
        "N steps, or copy with .to('cpu', non_blocking=True) into pinned memory and wait on a torch.cuda.Event "
        "only when the value is needed."
    )
    UPLOAD_ADVICE = (
        "the upload of each batch blocks the CPU until it is on the GPU: pin the host buffer (DataLoader("
        "pin_memory=True), or torch.empty(..., pin_memory=True) once) and copy with .to(device, non_blocking=True), "
        "so the copy overlaps the previous step's compute."
    )
    SYNC_ADVICE = (
        "take torch.cuda.synchronize() / stream.synchronize() out of the step (timing code usually put it there): "
        "time with torch.cuda.Event(enable_timing=True) pairs read after the loop, or synchronize every N steps."
    )

    def __init__(self, min_calls: int = 20, high_share: float = 0.10) -> None:
        self.min_calls = min_calls  # the same stack waiting this often is a loop, not a one-off
        self.high_share = high_share  # of the observed time spent waiting: HIGH

    def evaluate(self, evidence: Evidence) -> list[Finding]:
        calls = totals_by_process(evidence.profiles_of("waits"))
        waited = totals_by_process(evidence.profiles_of("wait_time"))
        copied = totals_by_process(evidence.profiles_of("memcpy_calls"))  # a copy's direction, by its stack
        windows = observed_window_s(evidence.profiles)
        findings = []
        for process, totals in calls.items():
            stacks = [(stack, n) for stack, n in totals.top() if n >= self.min_calls]
            waited_ns = waited.get(process)
            for stack, n in stacks[:MAX_STACKS_PER_PROCESS]:
                seconds = (waited_ns.by_stack.get(stack, 0) if waited_ns else 0) / 1e9
                function = str(totals.attributes[stack].get("cuda.function", stack[0].function if stack else "?"))
                window = windows.get(process, 0.0)
                share = seconds / window if window else 0.0
                evidence_lines = [
                    f"{n} waits in {function} from this stack; {fmt_seconds(seconds)} waited in all "
                    f"({fmt_seconds(seconds / n)} each)",
                ]
                if window:
                    evidence_lines.append(f"{share:.1%} of the {window:.1f} s the profiles cover")
                copy = "memcpy" in function.lower()
                direction = copied[process].attributes.get(stack, {}) if process in copied else {}
                upload = direction.get("cuda.memcpy.direction") == "host_to_device"
                advice = (self.UPLOAD_ADVICE if upload else self.COPY_ADVICE) if copy else self.SYNC_ADVICE
                findings.append(
                    Finding(
                        self.rule_id,
                        Severity.HIGH if share >= self.high_share else Severity.MEDIUM,
                        f"{'Synchronous copy' if copy else function} in the hot loop at {where(stack)}",
                        process_label(totals.resource),
                        tuple(evidence_lines),
                        advice,
                        stack,
                        {"waits": n, "wait_s": seconds, "window_s": window, "function": function},
                        seconds,
                    )
                )
        return findings


class PageableHostToDevice(Rule):
    """Host-to-device copies by a process that pinned no host memory: they come from pageable
    memory (staged by the driver, slower, and never truly asynchronous). From the copies view and
    the allocated/in-use views' ``cuda.memory.kind``."""

    rule_id = "pageable-h2d"
    ADVICE = (
        "copy from pinned memory: DataLoader(pin_memory=True) with batch.to(device, non_blocking=True), or a "
        "staging buffer made once with torch.empty(..., pin_memory=True) (cudaMallocHost / cudaHostRegister in C). "
        "A copy from pageable memory goes through a driver bounce buffer at a fraction of the bus bandwidth and "
        "blocks the CPU even when asked to be asynchronous."
    )

    def __init__(self, min_bytes: int = 32 * MIB) -> None:
        self.min_bytes = min_bytes  # below this the copies cannot cost much, pinned or not

    def evaluate(self, evidence: Evidence) -> list[Finding]:
        h2d = sample_attribute("cuda.memcpy.direction", "host_to_device")
        copied = totals_by_process(evidence.profiles_of("memcpy_space"), h2d)
        copies = totals_by_process(evidence.profiles_of("memcpy_calls"), h2d)
        copy_ns = totals_by_process(evidence.profiles_of("memcpy_time"), h2d)
        pinned = self._pinned_processes(evidence)
        findings = []
        for process, totals in copied.items():
            total = totals.total
            if total < self.min_bytes or process in pinned:
                continue
            stack, stack_bytes = totals.top()[0]
            n = copies[process].total if process in copies else 0
            seconds = copy_ns[process].total / 1e9 if process in copy_ns else 0.0
            findings.append(
                Finding(
                    self.rule_id,
                    Severity.MEDIUM,
                    f"Host-to-device copies from pageable memory at {where(stack)}",
                    process_label(totals.resource),
                    (
                        f"{fmt_bytes(total)} copied host→device in {n} copies"
                        + (f" ({fmt_bytes(total / n)} each)" if n else "")
                        + f", {fmt_seconds(seconds)} in the copy calls",
                        f"{fmt_bytes(stack_bytes)} of it from this stack, the largest of {len(totals.by_stack)} "
                        "that copy host→device",
                        "no pinned host memory was allocated (cudaMallocHost, cudaHostAlloc, cuMemHostAlloc) while "
                        "the agent watched; memory pinned with cudaHostRegister or before the agent attached is "
                        "not seen",
                    ),
                    self.ADVICE,
                    stack,
                    {"h2d_bytes": total, "copies": n, "copy_s": seconds},
                    float(total),
                )
            )
        return findings

    @staticmethod
    def _pinned_processes(evidence: Evidence) -> set[ProcessKey]:
        pinned_samples = sample_attribute("cuda.memory.kind", "pinned_host")
        seen = set(totals_by_process(evidence.profiles_of("alloc_space"), pinned_samples))
        seen |= set(totals_by_process(evidence.profiles_of("inuse_space"), pinned_samples))
        seen |= {
            process_key(p.resource)
            for p in evidence.points("cuda.memory.allocated")
            if p.attributes.get("cuda.memory.kind") == "pinned_host" and (p.value or 0) > 0
        }
        return seen


class TinyKernels(Rule):
    """Kernels launched so fast that each must be tiny: launch overhead, not the GPU, sets the pace,
    and a CUDA graph would replay them in one launch. From ``cuda.kernel.launches`` (the rate per
    metric interval) and the launches view (the stack)."""

    rule_id = "tiny-kernels"
    ADVICE = (
        "capture the step in a CUDA graph: torch.compile(mode='reduce-overhead'), or torch.cuda.CUDAGraph / "
        "torch.cuda.graphs for a static-shape step (vLLM and TensorRT-LLM decode through graphs: check that eager "
        "mode, e.g. vLLM's enforce_eager, is off). Fusing the elementwise kernels (torch.compile) also cuts the count."
    )

    def __init__(self, min_rate: float = 10_000.0, min_launches: int = 1_000) -> None:
        # 10,000 launches/s is one every 100 µs: the GPU cannot have spent more on each on average
        # (one stream), while a launch costs the CPU 5-20 µs through PyTorch.
        self.min_rate = min_rate
        self.min_launches = min_launches

    def evaluate(self, evidence: Evidence) -> list[Finding]:
        by_process: dict[ProcessKey, list[MetricPoint]] = defaultdict(list)
        for point in evidence.points("cuda.kernel.launches"):
            by_process[process_key(point.resource)].append(point)
        stacks = totals_by_process(evidence.profiles_of("launches"))
        findings = []
        for process, points in sorted(by_process.items()):
            total, rate, interval = _peak_rate(points)
            if total < self.min_launches or rate < self.min_rate:
                continue
            last = max(p.time_ns for p in points)
            names: dict[str, float] = defaultdict(float)
            for p in points:
                if p.time_ns == last:
                    names[str(p.attributes.get("cuda.kernel.name", "(unnamed)"))] += p.value or 0
            top_names = sorted(names.items(), key=lambda item: (-item[1], item[0]))[:3]
            launch_stacks = stacks.get(process)
            stack: Stack = launch_stacks.top()[0][0] if launch_stacks and launch_stacks.by_stack else ()
            spacing = 1 / rate
            findings.append(
                Finding(
                    self.rule_id,
                    Severity.HIGH if rate >= 5 * self.min_rate else Severity.MEDIUM,
                    f"Many tiny kernels launched one by one at {where(stack)}: a CUDA graph would do",
                    process_label(points[0].resource),
                    (
                        f"{total:.0f} kernel launches; {rate:,.0f} a second over a {interval:.1f} s interval, "
                        f"one every {fmt_seconds(spacing)}: the kernels ran {fmt_seconds(spacing)} or less each "
                        "on average (one stream)",
                        "most launched: " + "; ".join(f"{name} ×{count:.0f}" for name, count in top_names),
                    ),
                    self.ADVICE,
                    stack,
                    {"launches": total, "peak_rate_per_s": rate, "interval_s": interval},
                    rate,
                )
            )
        return findings


def _peak_rate(points: Sequence[MetricPoint]) -> tuple[float, float, float]:
    """(launches in all, the highest launches/s of an export interval, that interval in s) of one
    process's cumulative ``cuda.kernel.launches`` series (every series of an export has its time)."""
    totals: dict[int, float] = defaultdict(float)
    for p in points:
        totals[p.time_ns] += p.value or 0
    start = min(p.start_ns for p in points)
    best, best_interval, before_t, before = 0.0, 0.0, start, 0.0
    for t in sorted(totals):
        if t > before_t:
            rate = (totals[t] - before) / ((t - before_t) / 1e9)
            if rate > best:
                best, best_interval = rate, (t - before_t) / 1e9
        before_t, before = t, totals[t]
    return before, best, best_interval


class GrowingInUse(Rule):
    """A stack whose memory stays in use and keeps growing: the agent's leak reports
    (``cuda.memory.leak`` log records), else an in-use view that grew from one snapshot to the next
    at least ``min_growths`` times and never fell (memory that only accumulates)."""

    rule_id = "memory-leak"
    ADVICE = (
        "this line allocates again and again and the buffers stay alive: a cache, list or dict that keeps tensors "
        "(often losses.append(loss) without .item() or .detach(), which also keeps the autograd graph), or a tensor "
        "held by a global or a closure. Bound the cache, keep .detach()ed or .item() values, or drop the reference; "
        "torch.cuda.memory_allocated() per step confirms the fix."
    )

    def __init__(self, min_growths: int = 2) -> None:
        self.min_growths = min_growths  # one growth is an allocation made once (the weights), not a pattern

    def evaluate(self, evidence: Evidence) -> list[Finding]:
        findings = self._from_reports(evidence)
        reported = {(f.process, format_stack(f.stack)) for f in findings}
        return findings + [
            f for f in self._from_snapshots(evidence) if (f.process, format_stack(f.stack)) not in reported
        ]

    def _from_reports(self, evidence: Evidence) -> list[Finding]:
        latest: dict[tuple[ProcessKey, str], tuple[int, int]] = {}  # -> (reports, index of the latest)
        for i, log in enumerate(evidence.logs):
            if log.event_name != "cuda.memory.leak":
                continue
            key = (process_key(log.resource), str(log.attributes.get("code.stacktrace", "")))
            reports, known = latest.get(key, (0, -1))
            newer = known < 0 or log.time_ns >= evidence.logs[known].time_ns
            latest[key] = (reports + 1, i if newer else known)
        findings = []
        for (_, stacktrace), (reports, index) in sorted(latest.items()):
            log = evidence.logs[index]
            a = log.attributes
            stack = parse_stacktrace(stacktrace)
            size = int(a.get("cuda.memory.leak.size", 0))
            findings.append(
                Finding(
                    self.rule_id,
                    Severity.HIGH,
                    f"GPU memory leak: {a.get('cuda.memory.leak.allocations')} allocations kept alive by "
                    f"{where(stack)}",
                    process_label(log.resource),
                    (
                        f"{a.get('cuda.memory.leak.allocations')} allocations ({fmt_bytes(size)}, {a.get('cuda.api')} "
                        f"layer, device {a.get('cuda.device')}) older than "
                        f"{float(a.get('cuda.memory.leak.age', 0)):.1f} s while the process's in-use memory grew",
                        f"in use {fmt_bytes(int(a.get('cuda.memory.in_use', 0)))}, grown by "
                        f"{fmt_bytes(int(a.get('cuda.memory.in_use.growth', 0)))}; the agent's leak reports: {reports}",
                    ),
                    self.ADVICE,
                    stack,
                    {
                        "allocations": a.get("cuda.memory.leak.allocations"),
                        "bytes": size,
                        "reports": reports,
                        "device": a.get("cuda.device"),
                    },
                    float(size),
                )
            )
        return findings

    def _from_snapshots(self, evidence: Evidence) -> list[Finding]:
        snapshots: dict[ProcessKey, dict[int, dict[Stack, int]]] = defaultdict(lambda: defaultdict(dict))
        resources = {}
        for profile in evidence.profiles_of("inuse_space"):
            process = process_key(profile.resource)
            resources[process] = profile.resource
            at = snapshots[process][profile.end_ns]
            for key, values in profile.samples.items():
                at[key.stack] = at.get(key.stack, 0) + values[0]
        findings = []
        for process, by_time in sorted(snapshots.items()):
            times = sorted(by_time)
            for stack in sorted({s for at in by_time.values() for s in at}, key=format_stack):
                series = [by_time[t].get(stack, 0) for t in times]
                steps = list(itertools.pairwise(series))
                growths = sum(a < b for a, b in steps)
                if growths < self.min_growths or any(a > b for a, b in steps):
                    continue
                findings.append(
                    Finding(
                        self.rule_id,
                        Severity.MEDIUM,
                        f"GPU memory in use keeps growing under {where(stack)}",
                        process_label(resources[process]),
                        (
                            f"in use under this stack grew in {growths} of {len(steps)} intervals between in-use "
                            f"snapshots and never fell: {fmt_bytes(series[0])} → {fmt_bytes(series[-1])}",
                        ),
                        self.ADVICE,
                        stack,
                        {"in_use_bytes": series, "growths": growths},
                        float(series[-1] - series[0]),
                    )
                )
        return findings


class QueueingTtft(Rule):
    """Time to first token spent waiting, not in prefill. From the serving side's GenAI spans: a
    request's prefill cannot take longer than the fastest TTFT among requests with at least as many
    input tokens (prefill grows with the prompt), so TTFT minus that is a lower bound of its wait."""

    rule_id = "ttft-queueing"
    ADVICE = (
        "requests wait for a slot before their prefill starts: raise the engine's concurrency if KV-cache memory "
        "allows (vLLM --max-num-seqs / --max-num-batched-tokens, TGI --max-concurrent-requests / "
        "--max-batch-total-tokens), turn on chunked prefill so long prompts do not hold others up, or add replicas "
        "and route by queue length."
    )

    def __init__(self, min_share: float = 0.5, min_requests: int = 5) -> None:
        self.min_share = min_share  # of all TTFT seconds that is certainly waiting
        self.min_requests = min_requests

    def evaluate(self, evidence: Evidence) -> list[Finding]:
        groups: dict[tuple[ProcessKey, str], list[tuple[float, int, float | None]]] = defaultdict(list)
        resources = {}
        for span in evidence.spans:
            a = span.attributes
            ttft = a.get("gen_ai.response.time_to_first_chunk")
            tokens = a.get("gen_ai.usage.input_tokens")
            if span.kind != "SERVER" or ttft is None or tokens is None:
                continue
            key = (process_key(span.resource), str(a.get("gen_ai.request.model", "")))
            resources[key] = span.resource
            groups[key].append((float(ttft), int(tokens), a.get("otel_ebpf.gen_ai.time_per_output_token")))
        findings = []
        for key, requests in sorted(groups.items()):
            if len(requests) < self.min_requests:
                continue
            waits = [ttft - min(t for t, n, _ in requests if n >= tokens) for ttft, tokens, _ in requests]
            total_ttft = sum(t for t, _, _ in requests)
            share = sum(waits) / total_ttft if total_ttft else 0.0
            if share < self.min_share:
                continue
            ttfts = sorted(t for t, _, _ in requests)
            tpots = [float(p) for _, _, p in requests if p]
            tpot = statistics.median(tpots) if tpots else 0.0
            mean_wait = sum(waits) / len(waits)
            lines = [
                f"{len(requests)} streamed requests: TTFT median {fmt_seconds(statistics.median(ttfts))}, "
                f"max {fmt_seconds(ttfts[-1])}, fastest {fmt_seconds(ttfts[0])}",
                f"at least {share:.0%} of the time to first token was waiting: a request with as many input tokens "
                f"or more got its first token sooner; {fmt_seconds(mean_wait)} waited per request on average",
            ]
            if tpot:
                lines.append(
                    f"TPOT median {fmt_seconds(tpot)}: the wait is {mean_wait / tpot:.0f} decode steps' worth "
                    "per request"
                )
            model = key[1] or "(no model named)"
            findings.append(
                Finding(
                    self.rule_id,
                    Severity.HIGH if share >= 0.75 else Severity.MEDIUM,
                    f"Time to first token of {model} is mostly queueing",
                    process_label(resources[key]),
                    tuple(lines),
                    self.ADVICE,
                    (),
                    {"requests": len(requests), "queue_share": share, "mean_wait_s": mean_wait, "tpot_s": tpot},
                    share,
                )
            )
        return findings


class LowBandwidthUtilisation(Rule):
    """Decoding that uses little of the device's memory bandwidth (MBU far below peak). A decode
    step reads the weights and the KV cache in use once; so MBU ~ bytes the serving process holds
    on the device x decode steps per second (1 / TPOT) / the device's peak bandwidth. The bytes are
    an upper bound of what a step reads (allocator caches, activations and workspaces count too),
    so the estimate is an upper bound too: a low one is low for sure."""

    rule_id = "mbu-low"
    ADVICE = (
        "decode steps are not bound by memory bandwidth, so something else sets their pace: too few sequences per "
        "step (raise the engine's batch: vLLM --max-num-seqs, TGI --max-batch-total-tokens, and send more requests "
        "concurrently), time on the CPU between steps (sampling, detokenisation, scheduling: a CPU profile of the "
        "server shows it; vLLM's CUDA graphs, i.e. no --enforce-eager, remove launch overhead), or a quantised or "
        "sparse model whose kernels do not stream the weights at full speed."
    )

    def __init__(self, max_mbu: float = 0.3, min_requests: int = 5, peak_bytes_per_s: float | None = None) -> None:
        self.max_mbu = max_mbu  # decode that is bandwidth-bound reaches 0.5-0.8
        self.min_requests = min_requests
        self.peak_bytes_per_s = peak_bytes_per_s  # the user's figure (--peak-bandwidth), over the table's

    def evaluate(self, evidence: Evidence) -> list[Finding]:
        served = _served_models(evidence)
        if not served:
            return []
        held = _device_bytes(evidence)
        names = _device_names(evidence)
        findings = []
        for (process, model), (resource, tpots, output_tokens, window_s) in sorted(served.items()):
            if len(tpots) < self.min_requests or not held.get(process):
                continue
            peak, device = self._peak(names)
            if peak is None:
                continue
            tpot = statistics.median(tpots)
            bytes_per_step = held[process]
            mbu = bytes_per_step / tpot / peak
            if mbu > self.max_mbu:
                continue
            tokens_per_s = output_tokens / window_s if window_s > 0 else 0.0
            findings.append(
                Finding(
                    self.rule_id,
                    Severity.MEDIUM,
                    f"Decoding {model or '(no model named)'} uses at most {mbu:.0%} of the memory bandwidth",
                    process_label(resource),
                    (
                        f"{len(tpots)} streamed requests, TPOT median {fmt_seconds(tpot)}: about {1 / tpot:.0f} "
                        f"decode steps/s; {output_tokens} output tokens in {window_s:.1f} s ({tokens_per_s:.0f}/s)",
                        f"the process holds {fmt_bytes(bytes_per_step)} of device memory (weights, KV cache and "
                        f"what else it allocated): at most {fmt_bytes(bytes_per_step / tpot)}/s read by decoding",
                        f"{device}: {peak / 1e9:.0f} GB/s peak; MBU at most {mbu:.1%}",
                    ),
                    self.ADVICE,
                    (),
                    {
                        "mbu": mbu,
                        "tpot_s": tpot,
                        "device_bytes": bytes_per_step,
                        "peak_bytes_per_s": peak,
                        "output_tokens_per_s": tokens_per_s,
                        "requests": len(tpots),
                    },
                    1 - mbu,
                )
            )
        return findings

    def _peak(self, names: set[str]) -> tuple[float | None, str]:
        """The peak bandwidth and what it is of: the user's figure, else the table's for the node's
        one kind of device (a node of mixed devices cannot tell which one a process used)."""
        if self.peak_bytes_per_s is not None:
            return self.peak_bytes_per_s, "the given peak bandwidth"
        if len(names) != 1:
            return None, ""
        (name,) = names
        return peak_bandwidth(name), name


def _served_models(evidence: Evidence) -> dict[tuple[ProcessKey, str], tuple[Attributes, list[float], int, float]]:
    """Per serving process and model, from its streamed GenAI SERVER spans: the resource, the
    TPOTs, the output tokens and the seconds from the first request's start to the last's end."""
    spans: dict[tuple[ProcessKey, str], list[SpanEntry]] = defaultdict(list)
    for span in evidence.spans:
        if span.kind == "SERVER" and span.attributes.get("otel_ebpf.gen_ai.time_per_output_token"):
            spans[(process_key(span.resource), str(span.attributes.get("gen_ai.request.model", "")))].append(span)
    return {
        key: (
            group[0].resource,
            [float(s.attributes["otel_ebpf.gen_ai.time_per_output_token"]) for s in group],
            sum(int(s.attributes.get("gen_ai.usage.output_tokens", 0)) for s in group),
            (max(s.end_ns for s in group) - min(s.start_ns for s in group)) / 1e9,
        )
        for key, group in spans.items()
    }


def _latest(points: Sequence[MetricPoint]) -> dict[tuple, MetricPoint]:
    """Each series' latest point, by (process, its attributes)."""
    latest: dict[tuple, MetricPoint] = {}
    for p in points:
        series = (process_key(p.resource), tuple(sorted(p.attributes.items())))
        if series not in latest or p.time_ns >= latest[series].time_ns:
            latest[series] = p
    return latest


def _device_bytes(evidence: Evidence) -> dict[ProcessKey, float]:
    """Device memory each process holds at the end: what the CUDA hooks saw allocated and not freed
    (``cuda.memory.in_use``, kind ``device``), else what NVML says the process holds."""
    held: dict[ProcessKey, float] = defaultdict(float)
    for (process, attributes), p in _latest(evidence.points("cuda.memory.in_use")).items():
        if dict(attributes).get("cuda.memory.kind", "device") == "device":
            held[process] += p.value or 0
    for (process, _), p in _latest(evidence.points("otel_ebpf.gpu.process.memory.usage")).items():
        if process not in held:
            held[process] += p.value or 0
    return {process: n for process, n in held.items() if n > 0}


def _device_names(evidence: Evidence) -> set[str]:
    """The kinds of device the node has (NVML's ``hw.name`` on the device series)."""
    return {str(p.attributes["hw.name"]) for p in evidence.metrics if "hw.name" in p.attributes}


# In this order within a severity: a leak ends the job, a wait or a queue costs every step.
DEFAULT_RULES: tuple[Rule, ...] = (
    GrowingInUse(),
    SynchronizeInLoop(),
    QueueingTtft(),
    TinyKernels(),
    PageableHostToDevice(),
    LowBandwidthUtilisation(),
)


def rules_with(peak_bytes_per_s: float | None) -> tuple[Rule, ...]:
    """The default rules, the MBU one with the user's peak bandwidth (None: the table's)."""
    if peak_bytes_per_s is None:
        return DEFAULT_RULES
    return tuple(
        LowBandwidthUtilisation(peak_bytes_per_s=peak_bytes_per_s)
        if isinstance(rule, LowBandwidthUtilisation)
        else rule
        for rule in DEFAULT_RULES
    )


NOT_CHECKED = (
    "data-loader bound steps (CPU busy while the GPU waits): the agent does not see when the GPU is idle for a "
    "process (NVML's utilisation is per device and sampled), so this cannot be told honestly yet",
)
