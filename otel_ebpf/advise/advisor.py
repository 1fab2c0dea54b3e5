"""The rules run over the evidence, and what the agent said it lost: one :class:`~.findings.Report`."""

from __future__ import annotations

from collections.abc import Sequence

from .evidence import Evidence
from .findings import Report, ranked
from .rules import DEFAULT_RULES, NOT_CHECKED, Rule

# Self-metric series whose loss makes the views undercount (docs/gpu.md, "Bounds and drops").
GAP_SERIES = {
    ("otel_ebpf.kernel.drops", "gpu_ringbuf_full"): "GPU calls lost: the GPU probe's ring buffer was full",
    ("otel_ebpf.kernel.drops", "gpu_entries_without_return"): "GPU calls whose return was never seen",
    ("otel_ebpf.kernel.drops", "gpu_returns_unpaired"): "GPU call returns without their entry",
    ("otel_ebpf.gpu.stacks.dropped", None): "GPU samples lost to the gpu.max_stacks cap",
    ("otel_ebpf.gpu.allocations.untracked", "evicted"): "allocations evicted from the table (gpu.max_allocations)",
    ("otel_ebpf.gpu.leaks.unreported", None): "leak reports not sent (over 100 in one check)",
    ("otel_ebpf.profiles.samples.dropped", None): "CPU samples lost",
}


def gaps(evidence: Evidence) -> list[str]:
    """The losses the agent counted, from the last value of each self-metric series."""
    last: dict[tuple[str, str | None, tuple], tuple[int, float]] = {}
    for point in evidence.metrics:
        reason = point.attributes.get("reason")
        key = (point.name, reason) if (point.name, reason) in GAP_SERIES else (point.name, None)
        if key not in GAP_SERIES:
            continue
        series = (*key, tuple(sorted(point.attributes.items())))
        if series not in last or point.time_ns >= last[series][0]:
            last[series] = (point.time_ns, point.value or 0)
    totals: dict[tuple[str, str | None], float] = {}
    for (name, reason, _), (_, value) in last.items():
        totals[(name, reason)] = totals.get((name, reason), 0) + value
    return [f"{GAP_SERIES[key]}: {value:.0f}" for key, value in sorted(totals.items(), key=str) if value > 0]


def advise(evidence: Evidence, rules: Sequence[Rule] = DEFAULT_RULES) -> Report:
    findings = [finding for rule in rules for finding in rule.evaluate(evidence)]
    return Report(
        ranked(findings, [rule.rule_id for rule in rules]),
        NOT_CHECKED,
        tuple(gaps(evidence)),
        tuple(evidence.sources),
    )
