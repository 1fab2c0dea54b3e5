"""UDP plumbing under the RTPS plugin: /proc's UDP tables, datagram events in recordings, and the
per-datagram peer in the connection tracker."""

from __future__ import annotations

import io
import os
import socket
from pathlib import Path

import rtps_bytes as rb

from otel_ebpf import procfs
from otel_ebpf.pipeline.connections import ConnectionTracker
from otel_ebpf.pipeline.events import ConnData, ConnOpen
from otel_ebpf.protocol import Direction, Endpoint, Transport, load_protocols
from otel_ebpf.recording import RecordingHeader, RecordingWriter, decode_event, encode_event, read_recording
from otel_ebpf.selfmetrics import SelfMetrics

UDP_TABLE = """\
   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
 1: 0100007F:1CF3 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0 0
 2: 00000000:1CF4 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4243 2 0 0
"""


def _fake_proc(tmp: Path) -> Path:
    proc = tmp / "proc"
    (proc / "7" / "fd").mkdir(parents=True)
    (proc / "7" / "net").mkdir()
    (proc / "7" / "ns").mkdir()
    (proc / "7" / "net" / "udp").write_text(UDP_TABLE)
    (proc / "7" / "net" / "udp6").write_text(UDP_TABLE.splitlines()[0] + "\n")
    os.symlink("net:[4026531840]", proc / "7" / "ns" / "net")
    os.symlink("socket:[4242]", proc / "7" / "fd" / "5")
    os.symlink("socket:[4243]", proc / "7" / "fd" / "6")
    os.symlink("socket:[9999]", proc / "7" / "fd" / "7")  # not UDP
    os.symlink("/dev/null", proc / "7" / "fd" / "8")
    return proc


def test_udp_local_endpoints_from_proc(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path)
    found = procfs.udp_local_endpoints({7: [5, 6, 7, 8, 9]}, proc=str(proc))
    assert found == {(7, 5): Endpoint("127.0.0.1", 7411), (7, 6): Endpoint("0.0.0.0", 7412)}


def test_udp_local_endpoints_of_a_real_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        found = procfs.udp_local_endpoints({os.getpid(): [s.fileno()]})
        assert found == {(os.getpid(), s.fileno()): Endpoint("127.0.0.1", s.getsockname()[1])}


def test_datagram_events_round_trip_and_old_recordings_read() -> None:
    event = ConnData(5, 7, 8, 3, 1, Direction.INGRESS, 40, b"RTPS\x02", peer=Endpoint("127.0.0.1", 7410))
    opened = ConnOpen(4, 7, 3, 1, None, Endpoint("0.0.0.0", 7411), None, Transport.UDP)
    out = io.StringIO()
    RecordingWriter(out, RecordingHeader("node")).write([opened, event])
    _, events = read_recording(io.StringIO(out.getvalue()))
    assert list(events) == [opened, event]
    old = encode_event(event).replace(',"peer":["127.0.0.1",7410]', "")
    assert "peer" not in old and decode_event(old).peer is None  # recordings from before UDP


def test_each_datagram_names_its_own_peer() -> None:
    selfmetrics = SelfMetrics()
    tracker = ConnectionTracker(load_protocols(["rtps"]), selfmetrics)
    tracker.open(ConnOpen(1, 7, 3, 1, None, Endpoint("0.0.0.0", 7411), None, Transport.UDP))
    seen = []
    for port in (7410, 7412):
        raw = rb.header(bytes(12)) + rb.data(bytes(4), bytes.fromhex("00000103"), port, b"\x00\x01\x00\x00")
        for conn, item, _ in tracker.data(
            ConnData(port, 7, 8, 3, 1, Direction.EGRESS, len(raw), raw, peer=Endpoint("127.0.0.1", port))
        ):
            if hasattr(item, "span"):
                seen.append(item.span(conn.info()).attributes["network.peer.port"])
    assert seen == [7410, 7412]
