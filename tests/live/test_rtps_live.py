"""Live BPF: ROS 2-shaped DDS peers on Cyclone DDS (PyPI ``cyclonedds``), the agent attached by pid.

Each peer is its own process (``examples/ros2_peers.py``) and creates its participant only after
the agent is attached, so discovery is observed. One agent run covers four scenarios in turn —
chatter at 20 Hz for 3 s, one 200 KB fragmented sample, a camera → perception → planner chain,
and a ROS 2 service — and the assertions compare what a real OTLP receiver got with what the
peers say they did.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.conftest import AGENT, REPO
from tests.live.test_http_live import _latest_points
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf
PEERS = [sys.executable, str(REPO / "examples" / "ros2_peers.py")]
UDP_PEER = [sys.executable, str(Path(__file__).with_name("rtps_udp_peer.py"))]
CHATTER = 60  # 20 Hz for 3 s
BIG = 200_000
FRAMES = 10
CALLS = 5


def _cyclonedds_available() -> bool:
    try:
        import cyclonedds  # noqa: F401
    except ImportError:
        return False
    return True


class Peer:
    def __init__(self, name: str, *args: str, script: list[str] = PEERS) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [*script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO
        )
        line = self.proc.stdout.readline()
        assert line.startswith('{"ready"'), f"{name}: {line!r} {self.proc.stderr.read()}"
        self.records: list[dict] = []

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def wait(self, timeout: float = 90) -> list[dict]:
        out, err = self.proc.communicate(timeout=timeout)
        assert self.proc.returncode == 0, f"{self.name} failed: {err}"
        self.records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return self.records

    def done(self) -> int:
        return next(r["done"] for r in self.records if "done" in r)


def _scenarios() -> dict[str, list[Peer]]:
    """Every peer, started now (they wait for "go" before touching DDS)."""
    return {
        "chatter": [
            Peer("listener", "sub", "--topic", "rt/chatter", "--count", str(CHATTER)),
            Peer("talker", "pub", "--topic", "rt/chatter", "--rate", "20", "--count", str(CHATTER)),
        ],
        "big": [
            Peer("big-sub", "sub", "--topic", "rt/big", "--count", "1"),
            Peer("big-pub", "pub", "--topic", "rt/big", "--count", "1", "--size", str(BIG)),
        ],
        "chain": [
            Peer("planner", "sub", "--topic", "rt/detections", "--count", str(FRAMES)),
            Peer("perception", "relay", "--topic", "rt/camera", "--out-topic", "rt/detections", "--count", str(FRAMES)),
            Peer("camera", "pub", "--topic", "rt/camera", "--rate", "10", "--count", str(FRAMES)),
        ],
        "service": [Peer("server", "server", "--count", str(CALLS)), Peer("client", "client", "--count", str(CALLS))],
        "syscalls": [Peer("udp", script=UDP_PEER)],
    }


@pytest.fixture(scope="module")
def rtps_run(tmp_path_factory: pytest.TempPathFactory):
    if not _cyclonedds_available():
        pytest.skip("the cyclonedds package is missing (pip install -e '.[test]')")
    tmp = tmp_path_factory.mktemp("live-rtps")
    scenarios = _scenarios()
    peers = [p for group in scenarios.values() for p in group]
    pids = [str(a) for p in peers for a in ("--pid", p.proc.pid)]
    with OTLPReceiver() as receiver:
        ready = tmp / "ready"
        agent = subprocess.Popen(
            [
                *AGENT,
                "run",
                *pids,
                "--exporter",
                "otlp",
                "--otlp-endpoint",
                receiver.grpc_endpoint,
                "--record",
                str(tmp / "events.jsonl"),
                "--ready-file",
                str(ready),
            ],
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120
            while not ready.exists():
                assert agent.poll() is None, agent.stderr.read()
                assert time.monotonic() < deadline, "agent not ready"
                time.sleep(0.1)
            # One scenario at a time: discovery of the next is not mixed into the previous.
            for group in scenarios.values():
                for peer in group:
                    peer.go()
                for peer in group:
                    peer.wait()
        finally:
            for p in peers:
                if p.proc.poll() is None:
                    p.proc.kill()
            agent.send_signal(signal.SIGINT)
            stderr = agent.communicate(timeout=60)[1]
        assert agent.returncode == 0, stderr
        keep = os.environ.get("OTEL_EBPF_KEEP_RTPS_RECORDING")  # tests/protocols/record_rtps.py
        if keep:
            shutil.copyfile(tmp / "events.jsonl", keep)
        receiver.wait_for(lambda r: len(r.spans()) >= 2 * CHATTER + 2 + 4 * FRAMES + 2 * CALLS, timeout=30)
        yield scenarios, receiver.spans(), receiver.metrics(), tmp


def _of(spans: list[dict], peer: Peer, kind: str | None = None) -> list[dict]:
    return [s for s in spans if s["resource"]["process.pid"] == peer.proc.pid and (kind is None or s["kind"] == kind)]


def test_chatter_exact_spans_topic_and_parents(rtps_run: tuple) -> None:
    scenarios, spans, _, _ = rtps_run
    listener, talker = scenarios["chatter"]
    assert talker.done() == CHATTER and listener.done() == CHATTER
    produced, consumed = _of(spans, talker, "PRODUCER"), _of(spans, listener, "CONSUMER")
    assert len(produced) == CHATTER and len(_of(spans, talker)) == CHATTER
    assert len(consumed) == CHATTER and len(_of(spans, listener)) == CHATTER
    for span in produced + consumed:
        a = span["attributes"]
        assert a["messaging.system"] == "dds"
        assert a["messaging.destination.name"] == "/chatter"
        assert a["dds.topic.name"] == "rt/chatter"
        assert a["dds.type.name"] == "std_msgs::msg::dds_::String_"
        assert a["ros2.type"] == "std_msgs/msg/String"
    assert {s["name"] for s in produced} == {"send /chatter"}
    assert {s["name"] for s in consumed} == {"receive /chatter"}
    assert sorted(s["attributes"]["dds.sequence_number"] for s in produced) == list(range(1, CHATTER + 1))
    by_id = {s["attributes"]["messaging.message.id"]: s for s in produced}
    for span in consumed:
        producer = by_id[span["attributes"]["messaging.message.id"]]
        assert span["parent_span_id"] == producer["span_id"]
        assert span["trace_id"] == producer["trace_id"]
        assert span["start_ns"] >= producer["start_ns"]


def test_chatter_metrics(rtps_run: tuple) -> None:
    scenarios, _, metrics, _ = rtps_run
    listener, talker = scenarios["chatter"]

    def total(name: str, pid: int) -> float:
        return sum(
            p.get("value", p.get("count", 0))
            for p in _latest_points(metrics.get(name, []))
            if p["resource"]["process.pid"] == pid and p["attributes"].get("messaging.destination.name") == "/chatter"
        )

    assert total("messaging.client.sent.messages", talker.proc.pid) == CHATTER
    assert total("messaging.client.consumed.messages", listener.proc.pid) == CHATTER
    assert total("dds.sample.latency", listener.proc.pid) == CHATTER  # histogram count
    sent_bytes = total("dds.sample.size", talker.proc.pid)
    assert sent_bytes == total("dds.sample.size", listener.proc.pid) > 0
    participants = {
        p["attributes"]["dds.participant.guid"]
        for p in metrics["messaging.client.sent.messages"]
        if p["resource"]["process.pid"] == talker.proc.pid
    }
    assert len(participants) == 1


def test_fragmented_sample_is_one_span_with_its_size(rtps_run: tuple) -> None:
    scenarios, spans, metrics, _ = rtps_run
    sub, pub = scenarios["big"]
    assert sub.done() == 1
    produced, consumed = _of(spans, pub, "PRODUCER"), _of(spans, sub, "CONSUMER")
    assert len(produced) == 1 and len(consumed) == 1
    # CDR: encapsulation (4) + string length (4) + "0:" + 200000 characters + NUL, padded to 4
    # bytes (Cyclone leaves the padding out of the encapsulation options, so it counts)
    size = (4 + 4 + len("0:") + BIG + 1 + 3) // 4 * 4
    for span in produced + consumed:
        a = span["attributes"]
        assert a["messaging.destination.name"] == "/big"
        assert a["messaging.message.body.size"] == size
        assert a["dds.fragment.count"] > 1
    assert consumed[0]["parent_span_id"] == produced[0]["span_id"]
    assert produced[0]["end_ns"] > produced[0]["start_ns"]  # first fragment to last


def test_chain_is_one_trace_per_frame(rtps_run: tuple) -> None:
    scenarios, spans, _, _ = rtps_run
    planner, perception, camera = scenarios["chain"]
    assert planner.done() == FRAMES
    chain_pids = {p.proc.pid for p in (planner, perception, camera)}
    traces: dict[str, list[dict]] = defaultdict(list)
    for span in spans:
        if span["resource"]["process.pid"] in chain_pids:
            traces[span["trace_id"]].append(span)
    assert len(traces) == FRAMES
    for trace in traces.values():
        shape = Counter((s["resource"]["process.pid"], s["kind"], s["name"]) for s in trace)
        assert shape == Counter(
            {
                (camera.proc.pid, "PRODUCER", "send /camera"): 1,
                (perception.proc.pid, "CONSUMER", "receive /camera"): 1,
                (perception.proc.pid, "PRODUCER", "send /detections"): 1,
                (planner.proc.pid, "CONSUMER", "receive /detections"): 1,
            }
        )
        ids = {s["span_id"]: s for s in trace}
        roots = [s for s in trace if s["parent_span_id"] is None]
        assert len(roots) == 1 and roots[0]["kind"] == "PRODUCER"
        assert all(s["parent_span_id"] in ids for s in trace if s is not roots[0])


def test_service_calls_pair_client_and_server(rtps_run: tuple) -> None:
    scenarios, spans, metrics, _ = rtps_run
    server, client = scenarios["service"]
    assert client.done() == CALLS and server.done() == CALLS
    clients, servers = _of(spans, client, "CLIENT"), _of(spans, server, "SERVER")
    assert len(clients) == CALLS and len(servers) == CALLS
    assert not _of(spans, client, "PRODUCER") and not _of(spans, server, "CONSUMER")
    by_seq = {s["attributes"]["dds.request.sequence_number"]: s for s in clients}
    assert sorted(by_seq) == list(range(1, CALLS + 1))
    for span in servers:
        a = span["attributes"]
        assert span["name"] == "/add_two_ints" and a["rpc.system"] == "ros2"
        assert a["dds.request.topic.name"] == "rq/add_two_intsRequest"
        assert a["dds.reply.topic.name"] == "rr/add_two_intsReply"
        caller = by_seq[a["dds.request.sequence_number"]]
        assert span["parent_span_id"] == caller["span_id"] and span["trace_id"] == caller["trace_id"]
        assert caller["start_ns"] <= span["start_ns"] <= span["end_ns"] <= caller["end_ns"]
    assert (
        sum(
            p["count"]
            for p in _latest_points(metrics["rpc.client.duration"])
            if p["resource"]["process.pid"] == client.proc.pid
        )
        == CALLS
    )


def test_no_parse_errors_or_unknown_writers(rtps_run: tuple) -> None:
    _, _, metrics, _ = rtps_run
    errors = [
        p
        for p in _latest_points(metrics.get("otel_ebpf.parse.errors", []))
        if p["attributes"].get("protocol") == "rtps"
    ]
    assert sum(p["value"] for p in errors) == 0
    unknown = [
        p
        for p in _latest_points(metrics.get("otel_ebpf.protocol.drops", []))
        if p["attributes"] == {"protocol": "rtps", "reason": "unknown_writer"}
    ]
    assert sum(p["value"] for p in unknown) == 0


def test_every_datagram_syscall_is_captured_with_its_peer(rtps_run: tuple) -> None:
    """sendto/recvfrom, sendmsg/recvmsg with iovecs, sendmmsg/recvmmsg: one event per datagram,
    its iovecs gathered, the peer of each, the bound local end of each socket."""
    from otel_ebpf.pipeline.events import ConnData, ConnOpen
    from otel_ebpf.protocol import Direction, Endpoint, Transport
    from otel_ebpf.recording import read_recording

    scenarios, _, _, tmp = rtps_run
    (peer,) = scenarios["syscalls"]
    report = peer.records[-1]
    receiver, sender = Endpoint("127.0.0.1", report["receiver"]), Endpoint("127.0.0.1", report["sender"])
    with (tmp / "events.jsonl").open() as stream:
        events = [e for e in read_recording(stream)[1] if getattr(e, "pid", None) == peer.proc.pid]
    opens = {e.fd: e for e in events if isinstance(e, ConnOpen)}
    assert {(e.local, e.transport) for e in opens.values()} == {(receiver, Transport.UDP), (sender, Transport.UDP)}
    data = [e for e in events if isinstance(e, ConnData)]
    sent = [e for e in data if e.direction is Direction.EGRESS]
    received = [e for e in data if e.direction is Direction.INGRESS]
    expected = [bytes.fromhex(d) for d in report["datagrams"]]
    assert [e.data for e in sent] == expected and [e.length for e in sent] == [len(d) for d in expected]
    assert [e.data for e in received] == expected
    assert {e.peer for e in sent} == {receiver} and {e.peer for e in received} == {sender}
    assert {opens[e.fd].local for e in sent} == {sender} and {opens[e.fd].local for e in received} == {receiver}
