"""Re-record ``data/rtps/cyclone_scenarios.jsonl`` from real Cyclone DDS traffic (root, BPF).

Runs the live RTPS test (chatter, a 200 KB fragmented sample, a three-node chain, a service) with
its event recording kept, then drops the datagrams nobody could receive: Cyclone announces its
participant (SPDP) to the unicast ports of every possible participant index, and on a quiet node
almost none of them is bound. What stays is every datagram a traced socket sent to a traced
socket, or received.

    sudo .venv/bin/python tests/protocols/record_rtps.py
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "data" / "rtps" / "cyclone_scenarios.jsonl"
REPO = HERE.parent.parent


def _spdp_only(data: bytes) -> bool:
    from otel_ebpf.protocols.rtps.discovery import SPDP_WRITER
    from otel_ebpf.protocols.rtps.wire import Data, parse_message

    msg = parse_message(data)
    return (
        msg is not None
        and bool(msg.submessages)
        and all(isinstance(s, Data) and s.writer_guid[12:] == SPDP_WRITER for s in msg.submessages)
    )


def filter_recording(src: Path, dst: Path) -> tuple[int, int]:
    lines = src.read_text().splitlines()
    events = [json.loads(line) for line in lines[1:]]
    bound = {e["local"][1] for e in events if e["type"] == "ConnOpen" and e.get("local")}
    kept = [lines[0]]
    for line, event in zip(lines[1:], events):
        if (
            event["type"] == "ConnData"
            and event["direction"] == 0
            and event.get("peer")
            and event["peer"][1] not in bound
            and _spdp_only(base64.b64decode(event["data"]))
        ):
            continue
        kept.append(line)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text("\n".join(kept) + "\n")
    return len(lines) - 1, len(kept) - 1


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "events.jsonl"
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/live/test_rtps_live.py"],
            cwd=REPO,
            check=True,
            env={**os.environ, "OTEL_EBPF_KEEP_RTPS_RECORDING": str(raw)},
        )
        total, kept = filter_recording(raw, OUT)
    print(f"{OUT}: {kept} of {total} events")


if __name__ == "__main__":
    main()
