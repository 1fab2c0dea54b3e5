"""``otel-ebpf advise DIR``: read what the agent wrote, print ranked findings (and, when asked, an
LLM's explanation of the top ones)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .advisor import advise
from .evidence import EvidenceError, read_directory
from .explain import ExplainError, explain
from .findings import report_document, to_text
from .rules import rules_with


def main(
    directory: str, as_json: bool, llm_url: str | None, llm_model: str, llm_top: int, peak_gb_s: float | None = None
) -> int:
    try:
        evidence = read_directory(Path(directory))
    except (OSError, EvidenceError) as exc:
        print(f"otel-ebpf advise: {exc}", file=sys.stderr)
        return 1
    if not evidence.sources:
        print(
            f"otel-ebpf advise: no traces.jsonl, metrics.jsonl, logs.jsonl or profiles.jsonl in {directory}: "
            "give the file exporter's output directory (--output of otel-ebpf run)",
            file=sys.stderr,
        )
        return 1
    if peak_gb_s is not None and peak_gb_s <= 0:
        print("otel-ebpf advise: --peak-bandwidth: expected a positive number of GB/s", file=sys.stderr)
        return 2
    report = advise(evidence, rules_with(peak_gb_s * 1e9 if peak_gb_s else None))
    explanation, failed = None, False
    if llm_url and report.findings:
        try:
            explanation = explain(report.findings[:llm_top], llm_url, llm_model)
        except ExplainError as exc:
            print(f"otel-ebpf advise: --llm: {exc}", file=sys.stderr)
            failed = True
    if as_json:
        document = report_document(report)
        if explanation is not None:
            document["explanation"] = explanation
        print(json.dumps(document, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(to_text(report))
        if explanation is not None:
            sys.stdout.write(f"\nExplanation of the top {min(llm_top, len(report.findings))} (from {llm_url}):\n")
            sys.stdout.write(explanation.rstrip() + "\n")
    return 1 if failed else 0
