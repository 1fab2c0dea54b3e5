"""The README's cost tables, written from the benchmarks' results files, never by hand.

Each table sits in README.md between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->``,
where NAME is a file in ``bench/results/``; everything between the two markers is what
:data:`TABLES` renders from that file's figures, followed by a line naming the command, the date
and the revision that produced them. ``make bench`` rewrites the tables after its runs;
``tests/test_readme_tables.py`` fails when a table differs from its file, so a figure in a table
cannot drift from the run it came from.

Usage: ``python bench/readme_tables.py [--check] [--readme PATH]``
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from results import REPO, results_dir

Figures = dict[str, Any]


def _offered(load: str) -> str:
    """A load as the tables name it: "max" is "as fast as possible", rates get thousands separators."""
    if load == "max":
        return "as fast as possible"
    rate = load.removesuffix("/s").replace(",", "")
    return f"{float(rate):,.0f}/s" if rate.replace(".", "", 1).isdigit() else load


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [_row(header), "|" + "---|" * len(header), *(_row(r) for r in rows)]


def _side_by_side(load: Figures) -> list[str]:
    """The cells every load table starts with: offered load, untraced and traced rates, ratio."""
    return [
        _offered(load["offered"]),
        f"{load['untraced_rps']:,}/s",
        f"{load['traced_rps']:,}/s",
        f"{load['ratio']:.3f}",
    ]


def nginx_load(figures: Figures) -> list[str]:
    header = [
        "offered load",
        "untraced",
        "traced",
        "ratio",
        "spans / request (server, client)",
        "shed / request",
        "(spans + shed) / (2 × requests)",
        "duration histogram count / request",
        "events lost",
        "false ERROR spans",
        "ERROR spans of requests wrk abandoned at exit",
        "agent exit after SIGINT",
    ]
    rows = [
        [
            *_side_by_side(load),
            f"{load['server_spans_per_request']:.3f}, {load['client_spans_per_request']:.3f}",
            f"{load['shed_per_request']:.3f}",
            f"{load['spans_plus_shed_per_request']:.4f}",
            f"{load['duration_count_per_request']:.4f}",
            f"{load['events_lost']:,}",
            f"{load['false_error_spans']:,}",
            f"{load['client_spans_abandoned_at_exit']:,}",
            f"{load['agent_exit_s']:.1f} s",
        ]
        for load in figures["loads"]
    ]
    return _table(header, rows)


def http_load(figures: Figures) -> list[str]:
    header = [
        "offered load",
        "untraced",
        "traced",
        "throughput ratio",
        "server spans / request",
        "agent CPU / request",
        "agent RSS (steady)",
    ]
    rows = [
        [
            *_side_by_side(load),
            f"{load['server_spans_per_request']:.4f}",
            f"{load['agent_cpu_us_per_request']:,} µs",
            f"{load['agent_rss_steady_mb']:,} MB",
        ]
        for load in figures["loads"]
    ]
    return _table(header, rows)


def kernel_cost(figures: Figures) -> list[str]:
    header = [
        "offered load",
        "requests/s",
        "shed / request",
        "program runs / request",
        "kernel time / request",
        "per traced side",
        "costliest programs (ns / request)",
    ]
    rows = []
    for load in figures["loads"]:
        by_cost = sorted(load["programs"].items(), key=lambda item: -item[1]["ns_per_request"])
        top = ", ".join(f"{name.split('__')[-1]} {p['ns_per_request']:,.0f}" for name, p in by_cost[:3])
        rows.append(
            [
                load["load"],
                f"{load['requests_per_s']:,}",
                f"{load['shed_per_request']:.3f}",
                f"{load['runs_per_request']:.2f}",
                f"{load['ns_per_request'] / 1000:.2f} µs",
                f"{load['ns_per_request_per_side'] / 1000:.2f} µs",
                top,
            ]
        )
    return _table(header, rows)


def protocol_load(figures: Figures) -> list[str]:
    header = [
        "workload",
        "offered",
        "untraced",
        "traced",
        "ratio",
        "spans / call",
        "agent CPU / call",
        "agent cores (settled)",
        "events lost",
        "p50 untraced → traced",
    ]
    rows = [
        [
            load["workload"],
            *_side_by_side(load),
            f"{load['spans_per_call']:.4f}",
            f"{load['agent_cpu_us_per_call']:,} µs",
            f"{load['agent_cores_settled']:.2f}",
            f"{load['events_lost']:,}",
            "{:.2f} → {:.2f} ms".format(*load["p50_ms"]),
        ]
        for load in figures["loads"]
    ]
    return _table(header, rows)


def fastapi_load(figures: Figures) -> list[str]:
    header = [
        "variant",
        "requests/s",
        "ratio to plain",
        "p50 / p99",
        "server CPU / request",
        "server spans / request",
        "agent CPU / request",
        "agent RSS",
    ]
    rows = [
        [
            variant["variant"],
            f"{variant['rps']:,}/s",
            f"{variant['ratio_to_plain']:.3f}",
            f"{variant['p50_ms']:.2f} / {variant['p99_ms']:.2f} ms",
            f"{variant['server_cpu_us_per_request']:,} µs",
            "" if variant["server_spans_per_request"] is None else f"{variant['server_spans_per_request']:.4f}",
            f"{variant['agent_cpu_us_per_request']:,} µs" if "agent_cpu_us_per_request" in variant else "",
            f"{variant['agent_rss_load_mb']:,} MB" if "agent_rss_load_mb" in variant else "",
        ]
        for variant in figures["variants"]
    ]
    return _table(header, rows)


def pipeline_replay(figures: Figures) -> list[str]:
    header = ["stage (per HTTP/1.1 keep-alive exchange, or as named)", "CPU", "wall", "Python calls"]
    cpu, wall, calls = (figures[key] for key in ("cpu_us_per_exchange", "us_per_exchange", "python_calls_per_exchange"))
    rows = [
        [
            stage if stage in ("pipeline total", "plugin share") else f"– {stage}",
            f"{cpu[stage]:.1f} µs",
            f"{wall[stage]:.1f} µs",
            f"{calls[stage]:.0f}",
        ]
        for stage in cpu
    ]
    grpc = figures.get("grpc")
    if grpc:  # results written before the gRPC stream was added lack it
        spans = grpc["spans_per_call"]
        rows.append(
            [
                f"gRPC unary, pipeline total per span ({spans} per call: client and server)",
                f"{grpc['cpu_us_per_call'] / spans:.1f} µs",
                f"{grpc['us_per_call'] / spans:.1f} µs",
                f"{grpc['python_calls_per_call'] / spans:.0f}",
            ]
        )
    churn = figures.get("churn")
    if churn:  # results written before the churn stream was added lack it
        rows.append(
            [
                "HTTP/1.1, a connection per exchange (open, request, response, close), pipeline total",
                f"{churn['cpu_us_per_exchange']:.1f} µs",
                f"{churn['us_per_exchange']:.1f} µs",
                f"{churn['python_calls_per_exchange']:.0f}",
            ]
        )
    return _table(header, rows)


def trace_assembly(figures: Figures) -> list[str]:
    header = ["measure (three-hop requests, 5 exchanges each)", "µs / exchange", "of the pipeline", "complete traces"]
    rows = [
        [
            f"replayed: {m['measure']}",
            f"{m['us_per_exchange']:.1f}",
            f"{m['of_pipeline']:.1%}",
            m["complete_traces"] or "",
        ]
        for m in figures["replayed"]["measures"]
    ]
    live = figures["live"]
    rows.append(
        [
            f"live: agent on all three services (throughput ratio {live['ratio']:.3f})",
            f"{live['agent_cpu_ms_per_1k_requests'] / 5:.1f} (agent CPU)",
            "",
            f"{live['complete_traces']} ({live['spans_shed']:,} exchanges shed, counted)",
        ]
    )
    return _table(header, rows)


TABLES: dict[str, Callable[[Figures], list[str]]] = {
    "nginx_load": nginx_load,
    "nginx_load_idle_cpu": nginx_load,
    "http_load": http_load,
    "kernel_cost": kernel_cost,
    "protocol_load": protocol_load,
    "fastapi_load": fastapi_load,
    "pipeline_replay": pipeline_replay,
    "trace_assembly": trace_assembly,
}

BLOCK = re.compile(r"(<!-- results:(?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)


def _provenance(document: dict[str, Any]) -> str:
    """Where a table's figures come from: the command as one would type it, the date, the revision."""
    command = re.sub(r"^\S*python3?(\.\d+)?\s", "python ", document["command"])
    revision = document.get("revision") or {}
    commit = (revision.get("commit") or "unknown")[:7] + (" with local changes" if revision.get("dirty") else "")
    speed = (document.get("machine") or {}).get("reference_loop_cpu_s")
    return (
        f"<sub>`{command}` on {document['date'][:10]}, revision {commit} "
        f"(`bench/results/{document['name']}.json`)"
        + (f"; machine speed: a 2M-step Python loop in {speed:.2f} s of CPU" if speed else "")
        + "</sub>"
    )


def render(name: str) -> str:
    """The block's body for results file ``name``."""
    path = results_dir() / f"{name}.json"
    document = json.loads(path.read_text())
    return "\n".join([*TABLES[name](document["figures"]), "", _provenance(document)]) + "\n"


def rewrite(text: str) -> str:
    """``text`` with every results block written from its file; an unknown name is an error."""

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in TABLES:
            raise SystemExit(f"README block results:{name}: no table renders it (bench/readme_tables.py)")
        return match.group(1) + render(name) + match.group(4)

    return BLOCK.sub(block, text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a table differs")
    parser.add_argument("--readme", type=Path, default=REPO / "README.md")
    args = parser.parse_args(argv)
    text = args.readme.read_text()
    written = rewrite(text)
    if written == text:
        print(f"[readme_tables] {args.readme.name}: every table matches its results file")
        return 0
    if args.check:
        print(
            f"[readme_tables] {args.readme.name}: tables differ from bench/results/; run python bench/readme_tables.py"
        )
        return 1
    args.readme.write_text(written)
    print(f"[readme_tables] rewrote the tables of {args.readme.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
