"""Large HTTP/1 downloads, both sides traced: does every transfer become a server span and a client
span of its exact size, and what does the agent cost the transfer?

nginx (1 worker) serves files of ``--sizes`` MiB from a temp dir, read into its buffers and
written, 32 KiB a write (as an application server writes a body; ``--sendfile``: ``sendfile on``,
a few calls a transfer, as distributions configure nginx for static files); per size,
``--count`` downloads, each a ``curl -o /dev/null`` process of its own (one connection, one
request), one after the other. Per round, an untraced block of every size's downloads and a traced
one (the agent as in ``bench/nginx_load.py``: ``otel-ebpf run --port PORT --exporter file``, so
nginx's SERVER side and curl's CLIENT side, stopped with SIGINT after the block), in alternating
order.

A loopback download moves a GiB in a fraction of a second, in tens of thousands of reads and
writes: more syscalls a second than user space drains, however little each event carries. This is
what an exchange in flight while user space is behind costs the ring (``bpf/http1_summary.h``).

Per size: downloads; SERVER spans (nginx's processes) and CLIENT spans (curl's) whose
``http.response.body.size`` is the file's size (exact) or anything else (inexact); the traced
block's ``otel_ebpf.spans.shed`` by reason and ``otel_ebpf.events.lost`` (for the whole block);
median seconds per download, untraced and traced, and their ratio (throughput traced/untraced).

Usage: ``python bench/large_transfer.py [--quick] [--sizes 50,200,1024] [--count 5] [--rounds R]
[--sendfile]``
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import (
    SPAN_KIND,
    Agent,
    file_spans,
    load_metrics,
    metric_total,
    parse_live_args,
    print_columns,
    self_counter,
)
from nginx_load import Nginx
from results import write_result

MIB = 1 << 20


def progress(message: str) -> None:
    print(f"[large_transfer] {message}", file=sys.stderr, flush=True)


def download(url: str) -> float:
    """Seconds ``curl`` took to fetch ``url`` into /dev/null (it must succeed)."""
    start = time.monotonic()
    subprocess.run(["curl", "-sSf", "-o", "/dev/null", url], check=True, timeout=600)
    return time.monotonic() - start


def block(nginx: Nginx, sizes: list[int], count: int) -> dict[int, list[float]]:
    """Every size's downloads, ``count`` each: seconds per download, by size."""
    return {size: [download(f"{nginx.url}f{size}") for _ in range(count)] for size in sizes}


def spans_by_size(traces: Path, nginx_pids: set[int]) -> Counter[tuple[str, int | None]]:
    """Spans by (side, ``http.response.body.size``): side "server" for nginx's processes,
    "client" for any other's."""
    counts: Counter[tuple[str, int | None]] = Counter()
    for pid, span in file_spans(traces):
        kind = span.get("kind", 0)
        if kind not in (SPAN_KIND["SERVER"], SPAN_KIND["CLIENT"]):
            continue
        size = next(
            (int(a["value"]["intValue"]) for a in span.get("attributes", []) if a["key"] == "http.response.body.size"),
            None,
        )
        counts[("server" if pid in nginx_pids and kind == SPAN_KIND["SERVER"] else "client", size)] += 1
    return counts


def shed_by_reason(metrics: dict) -> dict[str, int]:
    """``otel_ebpf.spans.shed`` totals by reason, those above 0."""
    points = metrics.get("otel_ebpf.spans.shed", [])
    reasons = {p["attributes"].get("reason", "") for p in points}
    totals = {r: int(metric_total(points, lambda p, r=r: p["attributes"].get("reason", "") == r)) for r in reasons}
    return {reason: n for reason, n in sorted(totals.items()) if n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="50,200,1024", help="file sizes in MiB, comma-separated")
    parser.add_argument("--count", type=int, default=5, help="downloads per size and block")
    parser.add_argument("--sendfile", action="store_true", help="nginx sends files with sendfile")
    args = parse_live_args(parser, duration=0, rounds=1, quick=(0, 1), tools=("nginx", "curl"))
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.quick:
        sizes, args.count = [s for s in sizes if s <= 200], min(args.count, 3)
    untraced: dict[int, list[float]] = {size: [] for size in sizes}
    traced: dict[int, list[float]] = {size: [] for size in sizes}
    spans: Counter[tuple[str, int | None]] = Counter()
    shed: Counter[str] = Counter()
    lost = 0
    with tempfile.TemporaryDirectory(prefix="large-transfer-") as tmp_name:
        tmp = Path(tmp_name)
        tmp.chmod(0o755)  # nginx's worker (nobody, under a root master) reads the files
        files = tmp / "files"
        files.mkdir()
        for size in sizes:
            with (files / f"f{size}").open("wb") as f:
                f.truncate(size * MIB)  # sparse: served from the page cache, no disk
            (files / f"f{size}").chmod(0o644)
        sendfile = "on" if args.sendfile else "off"
        nginx = Nginx(tmp, location=f"root {files};", settings=f"sendfile {sendfile};")
        try:
            block(nginx, sizes, 1)  # warm-up: the files in the page cache
            for round_ in range(args.rounds):
                for traced_block in (False, True) if round_ % 2 == 0 else (True, False):
                    progress(f"round {round_ + 1}: {'traced' if traced_block else 'untraced'} block")
                    if not traced_block:
                        for size, seconds in block(nginx, sizes, args.count).items():
                            untraced[size] += seconds
                        continue
                    out = tmp / f"out{round_}"
                    nginx_pids = nginx.pids
                    with Agent(["--port", str(nginx.port)], out) as agent:
                        for size, seconds in block(nginx, sizes, args.count).items():
                            traced[size] += seconds
                        agent.stop()
                    spans += spans_by_size(out / "traces.jsonl", nginx_pids)
                    metrics = load_metrics(out)
                    shed.update(shed_by_reason(metrics))
                    lost += self_counter(metrics, "otel_ebpf.events.lost")
        finally:
            nginx.close()

    downloads = args.count * args.rounds
    rows = []
    for size in sizes:
        exact = size * MIB
        u, t = statistics.median(untraced[size]), statistics.median(traced[size])
        rows.append(
            {
                "size_mib": size,
                "downloads": downloads,
                "server_spans_exact": spans[("server", exact)],
                "client_spans_exact": spans[("client", exact)],
                "untraced_s": round(u, 3),
                "traced_s": round(t, 3),
                "ratio": round(u / t, 3),
            }
        )
    exact_sizes = {size * MIB for size in sizes}
    inexact = {f"{side} {size}": n for (side, size), n in spans.items() if size not in exact_sizes}
    table = [["MiB", "downloads", "server spans exact", "client spans exact", "untraced s", "traced s", "ratio"]]
    table += [
        [
            str(r["size_mib"]),
            str(r["downloads"]),
            str(r["server_spans_exact"]),
            str(r["client_spans_exact"]),
            f"{r['untraced_s']:.3f}",
            f"{r['traced_s']:.3f}",
            f"{r['ratio']:.3f}",
        ]
        for r in rows
    ]
    print_columns(table)
    print(f"spans of another size (side, size: count): {inexact or 'none'}")
    print(f"shed, all traced blocks: {dict(shed) or 'none'}; events lost: {lost}")
    write_result(
        "large_transfer_sendfile" if args.sendfile else "large_transfer",
        None,
        {"sizes": rows, "spans_of_another_size": inexact, "shed": dict(shed), "events_lost": lost},
    )


if __name__ == "__main__":
    main()
