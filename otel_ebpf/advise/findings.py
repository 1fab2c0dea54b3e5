"""Findings, their order, and the two ways a report is printed (text for people, JSON for tools)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_ebpf.profiles.model import Stack

from .stacks import program_frames, top_frames


class Severity(enum.IntEnum):
    LOW = 1
    MEDIUM = 2
    HIGH = 3


@dataclass(frozen=True)
class Finding:
    """One problem, with what shows it and what to try.

    ``evidence`` are sentences with the numbers; ``figures`` the same numbers for tools;
    ``stack`` the call's stack (leaf first); ``weight`` orders findings of one rule and severity
    (larger first: the rule says what it measures, e.g. seconds waited)."""

    rule: str
    severity: Severity
    title: str
    process: str
    evidence: tuple[str, ...]
    suggestion: str
    stack: Stack = ()
    figures: Mapping[str, Any] = field(default_factory=dict)
    weight: float = 0.0


@dataclass(frozen=True)
class Report:
    findings: tuple[Finding, ...]
    not_checked: tuple[str, ...]  # what the advisor cannot tell (yet), said every time
    gaps: tuple[str, ...]  # losses the agent counted: the numbers are lower bounds
    sources: tuple[str, ...]  # the files read


def ranked(findings: Sequence[Finding], rule_order: Sequence[str]) -> tuple[Finding, ...]:
    """Most severe first; within a severity, in the rules' order, then by weight, then by text
    (the same evidence always gives the same report)."""
    position = {rule: i for i, rule in enumerate(rule_order)}
    return tuple(
        sorted(
            findings,
            key=lambda f: (-f.severity, position.get(f.rule, len(position)), -f.weight, f.process, f.title),
        )
    )


def finding_document(finding: Finding, rank: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "rule": finding.rule,
        "severity": finding.severity.name.lower(),
        "title": finding.title,
        "process": finding.process,
        "evidence": list(finding.evidence),
        "figures": dict(finding.figures),
        "stack": list(top_frames(finding.stack)),
        "code": [{"file": f.file, "line": f.line, "function": f.function} for f in program_frames(finding.stack)],
        "suggestion": finding.suggestion,
    }


def report_document(report: Report) -> dict[str, Any]:
    """The report as ``--json`` prints it."""
    return {
        "findings": [finding_document(f, rank) for rank, f in enumerate(report.findings, 1)],
        "not_checked": list(report.not_checked),
        "gaps": list(report.gaps),
        "sources": list(report.sources),
    }


def to_text(report: Report) -> str:
    lines: list[str] = []
    if not report.findings:
        lines.append("No findings: no rule saw a problem in this evidence.")
    for rank, f in enumerate(report.findings, 1):
        lines.append(f"{rank}. [{f.severity.name}] {f.title}")
        lines.append(f"   process: {f.process}    rule: {f.rule}")
        lines.extend(f"   - {sentence}" for sentence in f.evidence)
        frames = top_frames(f.stack)
        if frames:
            lines.append("   stack (leaf first):")
            lines.extend(f"     {label}" for label in frames)
            if len(f.stack) > len(frames):
                lines.append(f"     … {len(f.stack) - len(frames)} more")
        lines.append(f"   try: {f.suggestion}")
        lines.append("")
    if report.gaps:
        lines.append("Gaps in the evidence (counts above are lower bounds):")
        lines.extend(f"  - {gap}" for gap in report.gaps)
    lines.append("Not checked:")
    lines.extend(f"  - {note}" for note in report.not_checked)
    lines.append(f"Read: {', '.join(report.sources) or 'no files'}")
    return "\n".join(lines) + "\n"
