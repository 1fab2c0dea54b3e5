"""RTPS (DDS, ROS 2) pipeline cost: samples/s in replay, agent CPU per 1,000 samples live.

``replay``
    The discovery traffic recorded from real Cyclone DDS peers
    (``tests/protocols/data/rtps/cyclone_scenarios.jsonl``), then ``--samples`` samples on
    ``rt/chatter`` as Cyclone sends them — one datagram with INFO_TS + DATA from the talker's
    transmit socket, and the same datagram received 50 µs later by the listener, a HEARTBEAT from
    the writer and an ACKNACK from the reader every 16 samples — through the real user-space
    pipeline (``ConnectionTracker`` + ``Pipeline`` + ``Telemetry``, as ``bench/pipeline_replay.py``
    wires them). Prints samples/s (each sample makes a PRODUCER and a CONSUMER span).
``live`` (root, BPF)
    ``examples/ros2_peers.py`` publisher at ``--rate`` Hz (default 1 kHz) for ``--seconds`` and a
    subscriber, the agent attached to both by pid; reads the agent's CPU time (``/proc/PID/stat``)
    over the publishing window and over an idle window of the same length before it, and prints
    the agent CPU per 1,000 samples with and without the idle baseline.

Usage: ``python bench/rtps_load.py [replay|live|both] [--quick] [--samples N] [--rate HZ] [--seconds S]``
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is no package
from harness import REPO, cpu_seconds
from results import write_result

RECORDING = REPO / "tests" / "protocols" / "data" / "rtps" / "cyclone_scenarios.jsonl"
TALKER, LISTENER = 1001, 1002
START_NS = 1_764_000_000_000_000_000


def _chatter_writer() -> tuple[bytes, bytes]:
    """(writer GUID, listener participant prefix) of rt/chatter in the recording."""
    from otel_ebpf.protocols.rtps.discovery import SEDP_PUBLICATIONS_WRITER, parameter_list_payload
    from otel_ebpf.protocols.rtps.wire import Data, parse_message

    for line in RECORDING.read_text().splitlines()[1:]:
        event = json.loads(line)
        if event["type"] != "ConnData":
            continue
        msg = parse_message(base64.b64decode(event["data"]))
        for sub in msg.submessages if msg else ():
            if isinstance(sub, Data) and sub.writer_guid[12:] == SEDP_PUBLICATIONS_WRITER:
                params, _ = parameter_list_payload(sub.payload)
                if b"rt/chatter" in params.get(0x0005, b""):
                    return params[0x005A], msg.guid_prefix
    raise SystemExit("no rt/chatter writer in the recording")


def _user_data(datagram: bytes) -> bool:
    from otel_ebpf.protocols.rtps.discovery import is_builtin
    from otel_ebpf.protocols.rtps.wire import Data, parse_message

    msg = parse_message(datagram)
    return msg is not None and any(isinstance(s, Data) and not is_builtin(s.writer_guid[12:]) for s in msg.submessages)


def build_events(samples: int) -> list:
    from otel_ebpf.pipeline.events import ConnData, ConnOpen, ProcessInfo
    from otel_ebpf.protocol import Direction, Endpoint, Transport
    from otel_ebpf.recording import read_recording

    guid, _ = _chatter_writer()
    prefix, writer = guid[:12], guid[12:]
    with RECORDING.open() as stream:
        _, recorded = read_recording(stream)
        # discovery only: the recording's own user samples would be duplicates of ours
        discovery = [e for e in recorded if not isinstance(e, ConnData) or not _user_data(e.data)]
    offset = START_NS - discovery[0].timestamp_ns
    events: list = [
        type(e)(**{**{f: getattr(e, f) for f in e.__dataclass_fields__}, "timestamp_ns": e.timestamp_ns + offset})
        for e in discovery
    ]
    t = events[-1].timestamp_ns + 10**6
    events += [
        ProcessInfo(t, TALKER, "/usr/bin/talker", "talker", {}),
        ProcessInfo(t, LISTENER, "/usr/bin/listener", "listener", {}),
        ConnOpen(t, TALKER, 5, 1, None, Endpoint("127.0.0.1", 41000), None, Transport.UDP),
        ConnOpen(t, LISTENER, 4, 1, None, Endpoint("0.0.0.0", 7413), None, Transport.UDP),
    ]
    header = b"RTPS\x02\x05\x01\x10" + prefix
    payload = b"\x00\x01\x00\x00" + struct.pack("<I", 15) + b"Hello World: 0\x00" + b"\x00"
    for i in range(1, samples + 1):
        t += 1_000_000  # 1 kHz
        info_ts = struct.pack("<BBHiI", 0x09, 1, 8, t // 10**9, 0)
        body = struct.pack("<HH", 0, 16) + bytes(4) + writer + struct.pack("<iI", 0, i) + payload
        datagram = header + info_ts + struct.pack("<BBH", 0x15, 0x05, len(body)) + body
        if i % 16 == 0:
            hb = bytes(4) + writer + struct.pack("<iIiII", 0, i - 15, 0, i, i // 16)
            datagram += struct.pack("<BBH", 0x07, 0x01, len(hb)) + hb
        events.append(
            ConnData(
                t, TALKER, TALKER, 5, 1, Direction.EGRESS, len(datagram), datagram, peer=Endpoint("127.0.0.1", 7413)
            )
        )
        events.append(
            ConnData(
                t + 50_000,
                LISTENER,
                LISTENER + 1,
                4,
                1,
                Direction.INGRESS,
                len(datagram),
                datagram,
                peer=Endpoint("127.0.0.1", 41000),
            )
        )
    return events


def replay(samples: int, reps: int) -> dict:
    from pipeline_replay import run_pipeline

    events = build_events(samples)
    gc.collect()
    gc.freeze()
    run_pipeline(events[: len(events) // 4])  # warm-up
    results = []
    for _ in range(reps):
        seconds, spans = run_pipeline(events)
        results.append((seconds, spans))
    seconds = sorted(r[0] for r in results)[len(results) // 2]
    spans = results[0][1]
    print(
        f"replay: {samples} samples (publisher and subscriber on the node, {len(events)} events), "
        f"{spans} spans, median of {reps}: {seconds:.3f} s -> {samples / seconds:,.0f} samples/s, "
        f"{seconds / samples * 1e6:.1f} µs per sample (both ends)"
    )
    return {
        "samples": samples,
        "events": len(events),
        "spans": spans,
        "reps": reps,
        "seconds": round(seconds, 3),
        "samples_per_s": round(samples / seconds),
        "us_per_sample": round(seconds / samples * 1e6, 1),
    }


def live(rate: float, seconds: float) -> dict:
    peers = [sys.executable, str(REPO / "examples" / "ros2_peers.py")]
    count = int(rate * seconds)
    sub = subprocess.Popen(
        [*peers, "sub", "--count", str(count), "--timeout", str(seconds * 4 + 30)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    pub = subprocess.Popen(
        [*peers, "pub", "--rate", str(rate), "--count", str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    for p in (sub, pub):
        p.stdout.readline()
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready"
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "otel_ebpf.cli",
                "run",
                "--pid",
                str(sub.pid),
                "--pid",
                str(pub.pid),
                "--exporter",
                "file",
                "--output",
                tmp,
                "--ready-file",
                str(ready),
            ],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        while not ready.exists():
            if agent.poll() is not None:
                raise SystemExit(agent.stderr.read())
            time.sleep(0.1)
        time.sleep(1.0)  # start-up work done
        idle_start = cpu_seconds(agent.pid)
        time.sleep(seconds)
        idle = cpu_seconds(agent.pid) - idle_start
        busy_start, wall = cpu_seconds(agent.pid), time.monotonic()
        for p in (sub, pub):
            p.stdin.write("go\n")
            p.stdin.flush()
        pub_out = pub.communicate(timeout=seconds * 4 + 60)[0]
        sub_out = sub.communicate(timeout=60)[0]
        time.sleep(0.5)  # the agent's poll and reorder window catch up
        busy, wall = cpu_seconds(agent.pid) - busy_start, time.monotonic() - wall
        agent.send_signal(signal.SIGINT)
        agent.communicate(timeout=60)
        spans = (
            sum(
                1
                for line in (Path(tmp) / "traces.jsonl").read_text().splitlines()
                for _ in range(line.count('"spanId"'))
            )
            if (Path(tmp) / "traces.jsonl").exists()
            else 0
        )
    received = json.loads(sub_out.splitlines()[-1])["done"]
    published = json.loads(pub_out.splitlines()[-1])["done"]
    baseline = idle * wall / seconds
    print(
        f"live: {published} samples published at {rate:g} Hz ({received} received), window {wall:.1f} s, "
        f"{spans} spans exported"
    )
    print(
        f"live: agent CPU {busy:.2f} s over the window ({busy / wall * 100:.1f} % of a core); "
        f"{busy / published * 1000 * 1000:.0f} ms per 1,000 samples, "
        f"{(busy - baseline) / published * 1000 * 1000:.0f} ms above the idle baseline "
        f"({idle / seconds * 100:.1f} % of a core idle)"
    )
    return {
        "rate_hz": rate,
        "published": published,
        "received": received,
        "window_s": round(wall, 1),
        "spans": spans,
        "agent_cpu_s": round(busy, 2),
        "agent_core_share": round(busy / wall, 3),
        "agent_cpu_ms_per_1k_samples": round(busy / published * 1e6),
        "agent_cpu_ms_per_1k_samples_above_idle": round((busy - baseline) / published * 1e6),
        "agent_core_share_idle": round(idle / seconds, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="both", choices=("replay", "live", "both"))
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="short run: 5,000 samples, 3 reps, 2 s live")
    args = parser.parse_args()
    if args.quick:
        args.samples, args.reps, args.seconds = 5000, 3, 2.0
    figures = {}
    if args.mode in ("replay", "both"):
        figures["replay"] = replay(args.samples, args.reps)
    if args.mode in ("live", "both"):
        if os.geteuid() != 0:
            print("live: skipped (needs root for BPF)")
        else:
            figures["live"] = live(args.rate, args.seconds)
    write_result("rtps_load", None, figures)


if __name__ == "__main__":
    main()
