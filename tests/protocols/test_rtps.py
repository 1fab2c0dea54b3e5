"""The RTPS plugin on real Cyclone DDS traffic (``data/rtps/cyclone_scenarios.jsonl``, recorded by
``record_rtps.py``), on its big-endian re-encoding, on crafted datagrams, and fuzzed."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

import rtps_bytes as rb
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan

from otel_ebpf.pipeline import Pipeline
from otel_ebpf.pipeline.connections import ConnectionTracker
from otel_ebpf.pipeline.events import ConnData, ConnOpen, Event, ProcessInfo
from otel_ebpf.pipeline.reorder import EventReorderer
from otel_ebpf.pipeline.telemetry import Telemetry
from otel_ebpf.protocol import Direction, Endpoint, Transport, load_protocols
from otel_ebpf.protocols.rtps import RTPS, Call, Control, FragmentStitcher, Sample
from otel_ebpf.protocols.rtps.discovery import DiscoveryTable, ros_names
from otel_ebpf.protocols.rtps.session import Fragment, RTPSSession, RTPSState
from otel_ebpf.protocols.rtps.wire import Data, parse_message
from otel_ebpf.selfmetrics import SelfMetrics

CHATTER, BIG_SIZE, FRAMES, CALLS = 60, 200012, 10, 5
PREFIX_A, PREFIX_B = bytes.fromhex("0110aaaa0000000000000001"), bytes.fromhex("0110bbbb0000000000000002")
WRITER = bytes.fromhex("00000103")
T0 = 1_800_000_000_000_000_000


def replay(events: list[Event]) -> tuple[list, dict, SelfMetrics]:
    protocols = load_protocols()
    selfmetrics = SelfMetrics()
    telemetry = Telemetry(protocols, "node-1", {}, selfmetrics)
    pipeline = Pipeline(
        ConnectionTracker(protocols, selfmetrics), telemetry, selfmetrics, reorderer=EventReorderer(selfmetrics)
    )
    pipeline.handle(events)
    pipeline.flush()
    pids = {e.pid: e.command_line for e in events if isinstance(e, ProcessInfo)}
    return telemetry.take_spans(), pids, selfmetrics


def _role_pids(pids: dict[int, str]) -> dict[str, int]:
    """Peer role (as ``tests/live/test_rtps_live.py`` starts them) -> pid."""
    roles = {}
    for pid, command in pids.items():
        args = command.split("ros2_peers.py ", 1)[-1]
        role, _, rest = args.partition(" ")
        topic = rest.split("--topic ", 1)[1].split(" ", 1)[0] if "--topic" in rest else ""
        roles[f"{role} {topic}".strip()] = pid
    return roles


def _spans(spans: list, pid: int, kind: str) -> list:
    return [s for s in spans if s.resource.attributes["process.pid"] == pid and s.kind.name == kind]


RECORDED = rb.recorded_events()


def _check_scenarios(spans: list, pids: dict[int, str]) -> None:
    roles = _role_pids(pids)
    talker, listener = roles["pub rt/chatter"], roles["sub rt/chatter"]
    produced, consumed = _spans(spans, talker, "PRODUCER"), _spans(spans, listener, "CONSUMER")
    assert len(produced) == CHATTER and len(consumed) == CHATTER
    by_id = {s.attributes["messaging.message.id"]: s for s in produced}
    for span in consumed:
        parent = by_id[span.attributes["messaging.message.id"]]
        assert span.parent.span_id == parent.context.span_id
        assert span.context.trace_id == parent.context.trace_id
        assert span.attributes["messaging.destination.name"] == "/chatter"
        assert span.attributes["dds.topic.name"] == "rt/chatter"
    (big,) = _spans(spans, roles["pub rt/big"], "PRODUCER")
    (big_in,) = _spans(spans, roles["sub rt/big"], "CONSUMER")
    for span in (big, big_in):
        assert span.attributes["messaging.message.body.size"] == BIG_SIZE
        assert span.attributes["dds.fragment.count"] == -(-BIG_SIZE // 1344)
    assert big_in.parent.span_id == big.context.span_id
    chain = {roles["pub rt/camera"], roles["relay rt/camera"], roles["sub rt/detections"]}
    traces = defaultdict(list)
    for span in spans:
        if span.resource.attributes["process.pid"] in chain:
            traces[span.context.trace_id].append(span)
    assert len(traces) == FRAMES
    assert {len(t) for t in traces.values()} == {4}
    clients, servers = _spans(spans, roles["client"], "CLIENT"), _spans(spans, roles["server"], "SERVER")
    assert len(clients) == CALLS and len(servers) == CALLS
    by_seq = {s.attributes["dds.request.sequence_number"]: s for s in clients}
    for span in servers:
        assert span.name == "/add_two_ints"
        assert span.parent.span_id == by_seq[span.attributes["dds.request.sequence_number"]].context.span_id


def test_recorded_cyclone_traffic_replays_to_every_scenario() -> None:
    spans, pids, selfmetrics = replay(RECORDED)
    _check_scenarios(spans, pids)
    snapshot = selfmetrics.snapshot()
    assert snapshot["otel_ebpf.parse.errors"] == 0
    assert snapshot["otel_ebpf.messages.partial"] == 0  # every writer was discovered


def _big_endian(events: list[Event]) -> list[Event]:
    return [
        dataclasses.replace(e, data=rb.to_big_endian(e.data, service_payloads=True))
        if isinstance(e, ConnData) and e.data[:4] == b"RTPS"
        else e
        for e in events
    ]


def test_big_endian_traffic_gives_the_same_telemetry() -> None:
    little, pids, _ = replay(RECORDED)
    big, _, selfmetrics = replay(_big_endian(RECORDED))
    assert selfmetrics.snapshot()["otel_ebpf.parse.errors"] == 0
    _check_scenarios(big, pids)

    def view(span: ReadableSpan) -> tuple:
        attributes = dict(span.attributes)
        return (
            span.name,
            span.kind.name,
            span.context.span_id,
            span.parent and span.parent.span_id,
            span.start_time,
            span.end_time,
            tuple(sorted(attributes.items())),
        )

    assert sorted(map(view, big)) == sorted(map(view, little))


def _project(sub: object) -> tuple:
    if isinstance(sub, Data):
        return (
            "DATA",
            sub.writer_guid,
            sub.reader_id,
            sub.sn,
            sub.sample_size,
            sub.payload_size,
            sub.fragment_start,
            sub.fragments,
            sub.fragment_size,
            sub.key_only,
            tuple(sorted(sub.inline_qos)),
        )
    return (type(sub).__name__, *dataclasses.astuple(sub))


def test_every_recorded_datagram_parses_alike_in_both_byte_orders() -> None:
    datagrams = [e for e in RECORDED if isinstance(e, ConnData) and e.data[:4] == b"RTPS"]
    assert len(datagrams) > 500
    kinds: Counter = Counter()
    for event in datagrams:
        little = parse_message(event.data, event.length)
        big = parse_message(rb.to_big_endian(event.data), event.length)
        assert little.malformed == 0 and big.malformed == 0
        assert little.truncated == (event.length > len(event.data))
        assert [_project(s) for s in big.submessages] == [_project(s) for s in little.submessages]
        assert (big.timestamp_ns, big.dest_prefix, big.kinds) == (little.timestamp_ns, little.dest_prefix, little.kinds)
        kinds.update(little.kinds)
    # What Cyclone sent in these scenarios (every kind its reliable protocol uses)
    assert {0x06, 0x07, 0x09, 0x0E, 0x15, 0x16} <= set(kinds)


def test_discovery_learns_ros2_names_across_processes() -> None:
    state = RTPSState()
    sessions: dict[int, RTPSSession] = {}
    for event in RECORDED:
        if isinstance(event, ConnData) and event.data[:4] == b"RTPS":
            session = sessions.setdefault(event.key, RTPSSession(state, event.pid))
            session.feed(event.direction, event.data, event.timestamp_ns)
    topics = {
        (e.topic, e.type_name, e.writer): (e.ros_name, e.ros_kind, e.ros_type)
        for e in state.discovery.endpoints.values()
    }
    assert topics[("rt/chatter", "std_msgs::msg::dds_::String_", True)] == ("/chatter", "topic", "std_msgs/msg/String")
    assert topics[("rq/add_two_intsRequest", "example_interfaces::srv::dds_::AddTwoInts_Request_", True)] == (
        "/add_two_ints",
        "request",
        "example_interfaces/srv/AddTwoInts",
    )
    assert topics[("rr/add_two_intsReply", "example_interfaces::srv::dds_::AddTwoInts_Response_", False)][:2] == (
        "/add_two_ints",
        "reply",
    )
    assert len(state.discovery.participants) == 9  # one per peer process
    assert state.discovery.unknown_writers == 0


def test_ros2_names() -> None:
    assert ros_names("rt/robot/cmd_vel", "geometry_msgs::msg::dds_::Twist_") == (
        "/robot/cmd_vel",
        "topic",
        "geometry_msgs/msg/Twist",
    )
    assert ros_names("rr/set_modeReply", "pkg::srv::dds_::SetMode_Response_") == (
        "/set_mode",
        "reply",
        "pkg/srv/SetMode",
    )
    assert ros_names("ChatterDDS", "Foo") == (None, None, None)


def _udp_events(datagrams: list[tuple[int, Direction, bytes]]) -> list[Event]:
    """One process's one UDP socket sending/receiving ``datagrams`` (ms offset, direction, bytes)."""
    events: list[Event] = [
        ProcessInfo(T0, 7, "/usr/bin/node", "node", {}),
        ConnOpen(T0, 7, 5, 1, None, Endpoint("127.0.0.1", 7411), None, Transport.UDP),
    ]
    for ms, direction, raw in datagrams:
        events.append(
            ConnData(T0 + ms * 10**6, 7, 8, 5, 1, direction, len(raw), raw, peer=Endpoint("127.0.0.1", 7400 + ms))
        )
    return events


def test_crafted_big_endian_discovery_then_sample() -> None:
    for little in (True, False):
        announce = rb.header(PREFIX_A) + rb.sedp_publication(
            PREFIX_A, WRITER, "rt/scan", "sensor_msgs::msg::dds_::LaserScan_", little
        )
        payload = (b"\x00\x01" if little else b"\x00\x00") + b"\x00\x00" + bytes(40)
        sample = rb.header(PREFIX_A) + rb.data(bytes(4), WRITER, 7, payload, little)
        spans, _, selfmetrics = replay(_udp_events([(1, Direction.INGRESS, announce), (2, Direction.EGRESS, sample)]))
        (span,) = spans
        assert span.name == "send /scan" and span.kind.name == "PRODUCER"
        assert span.attributes["ros2.type"] == "sensor_msgs/msg/LaserScan"
        assert span.attributes["dds.sequence_number"] == 7
        assert span.attributes["messaging.message.body.size"] == 44
        assert span.attributes["network.peer.port"] == 7402
        assert span.attributes["network.transport"] == "udp"


def test_unknown_writer_is_reported_and_counted() -> None:
    sample = rb.header(PREFIX_B) + rb.data(bytes(4), WRITER, 1, b"\x00\x01\x00\x00" + bytes(8))
    spans, _, selfmetrics = replay(_udp_events([(1, Direction.INGRESS, sample)]))
    (span,) = spans
    assert span.name == "receive (unknown)" and span.kind.name == "CONSUMER"
    assert selfmetrics.snapshot()["otel_ebpf.messages.partial"] == 1
    assert selfmetrics.snapshot()["otel_ebpf.protocol.drops"] == 1  # reason unknown_writer


def test_discovery_table_is_bounded_and_counts_evictions() -> None:
    table = DiscoveryTable(max_participants=1, max_endpoints=2)
    for i in range(5):
        raw = rb.sedp_publication(PREFIX_A, bytes([0, 0, i, 3]), f"rt/t{i}", "a::msg::dds_::B_")
        parsed = parse_message(rb.header(PREFIX_A) + raw)
        (data,) = parsed.submessages
        table.learn(data.writer_guid[12:], PREFIX_A, data.payload, data.inline_qos)
    assert len(table.endpoints) == 2 and table.evicted == 3
    assert [e.topic for e in table.endpoints.values()] == ["rt/t3", "rt/t4"]


def test_retransmissions_requested_and_lost_samples() -> None:
    state = RTPSState()
    writer_side, reader_side = RTPSSession(state, 1), RTPSSession(state, 2)
    guid = PREFIX_A + WRITER
    payload = b"\x00\x01\x00\x00" + bytes(8)
    for seq in (1, 2, 3):
        writer_side.feed(Direction.EGRESS, rb.header(PREFIX_A) + rb.data(bytes(4), WRITER, seq, payload), T0 + seq)
    # the reader asks for 2 (bitmap base 2, one bit) — sent to the writer's participant (INFO_DST)
    acknack = rb.submessage(rb.INFO_DST, PREFIX_A) + rb.submessage(
        rb.ACKNACK,
        bytes.fromhex("00000104")
        + WRITER
        + rb.sn(2)
        + (1).to_bytes(4, "little")
        + (0x80000000).to_bytes(4, "little")
        + (1).to_bytes(4, "little"),
    )
    out = writer_side.feed(Direction.INGRESS, rb.header(PREFIX_B) + acknack, T0 + 10)
    assert [(c.requested, c.retransmissions) for c in out if isinstance(c, Control)] == [(1, 0)]
    resend = writer_side.feed(Direction.EGRESS, rb.header(PREFIX_A) + rb.data(bytes(4), WRITER, 2, payload), T0 + 11)
    assert [(c.retransmissions, c.endpoint) for c in resend] == [(1, None)]  # no second PRODUCER span
    copy = writer_side.feed(Direction.EGRESS, rb.header(PREFIX_A) + rb.data(bytes(4), WRITER, 3, payload), T0 + 12)
    assert copy == []  # the same sample for another reader: nothing new
    gap = rb.submessage(rb.GAP, bytes(4) + WRITER + rb.sn(4) + rb.sn(6) + (0).to_bytes(4, "little"))
    lost = reader_side.feed(Direction.INGRESS, rb.header(PREFIX_A) + gap, T0 + 13)
    assert [c.lost for c in lost] == [2]
    points = [(p.instrument, p.value) for c in out + resend + lost for p in c.metric_points(None)]
    assert sorted(points) == [("dds.acknack.requested", 1), ("dds.retransmissions", 1), ("dds.samples.lost", 2)]
    # the reader got sequence numbers 1..3 once each, whatever copies arrive
    received = [
        o
        for seq in (1, 2, 2, 3)
        for o in reader_side.feed(
            Direction.INGRESS, rb.header(PREFIX_A) + rb.data(bytes(4), WRITER, seq, payload), T0 + 20 + seq
        )
        if isinstance(o, Sample)
    ]
    assert [s.sn for s in received] == [1, 2, 3]
    assert all(s.latency_ns == 20 for s in received)
    assert state.discovery.unknown_writers == 6  # three sent, three received: no discovery here
    del guid


def test_fragments_reassemble_and_incomplete_ones_flush() -> None:
    state = RTPSState()
    session, stitcher = RTPSSession(state, 1), FragmentStitcher()

    def frag(seq: int, start: int, count: int, size: int = 2500) -> bytes:
        body = (
            b"\x00\x00\x1c\x00"
            + bytes(4)
            + WRITER
            + rb.sn(seq)
            + start.to_bytes(4, "little")
            + count.to_bytes(2, "little")
            + (1000).to_bytes(2, "little")
            + size.to_bytes(4, "little")
            + bytes(1000 * count)
        )
        return rb.header(PREFIX_A) + rb.submessage(rb.DATA_FRAG, body)

    done = []
    for i, raw in enumerate((frag(1, 1, 2), frag(1, 1, 2), frag(1, 3, 1), frag(2, 1, 1))):
        for output in session.feed(Direction.EGRESS, raw, T0 + i):
            if isinstance(output, Fragment):
                done += stitcher.add(output)
    (whole,) = done
    assert (whole.sn, whole.sample_size, whole.fragments, whole.start_ns, whole.end_ns) == (1, 2500, 3, T0, T0 + 2)
    (partial,) = stitcher.flush(T0 + 5)
    assert (partial.sn, partial.fragments) == (2, 3)


def test_service_reply_for_another_client_is_ignored() -> None:
    state = RTPSState()
    req_writer, rep_writer = bytes.fromhex("00000203"), bytes.fromhex("00000303")
    table = state.discovery
    for entity, topic in ((req_writer, "rq/xRequest"), (rep_writer, "rr/xReply")):
        announce = rb.header(PREFIX_A) + rb.sedp_publication(PREFIX_A, entity, topic, "p::srv::dds_::X_Request_")
        (data,) = parse_message(announce).submessages
        table.learn(data.writer_guid[12:], PREFIX_A, data.payload, data.inline_qos)
    body = b"\x00\x01\x00\x00" + (42).to_bytes(8, "little") + (1).to_bytes(8, "little")
    client, other = RTPSSession(state, 10), RTPSSession(state, 11)
    out = client.feed(Direction.EGRESS, rb.header(PREFIX_A) + rb.data(bytes(4), req_writer, 1, body), T0)
    assert [o.message_id for o in out] == [("call", 42, 1)]
    reply = rb.header(PREFIX_A) + rb.data(bytes(4), rep_writer, 1, body)
    assert other.feed(Direction.INGRESS, reply, T0 + 5) == []
    (call,) = client.feed(Direction.INGRESS, reply, T0 + 6)
    assert isinstance(call, Call) and (call.start_ns, call.end_ns, call.service) == (T0, T0 + 6, "/x")


# ---- never raises ------------------------------------------------------------------------------

_SEEDS = [e.data for e in RECORDED if isinstance(e, ConnData) and e.data[:4] == b"RTPS"][::25]


def _feed_everything(raw: bytes) -> None:
    protocol = RTPS()
    session, stitcher = protocol.new_process_session(None, 1), protocol.new_stitcher(None)
    for direction in Direction:
        for output in session.feed(direction, raw, T0):
            if not hasattr(output, "message_id"):
                for exchange in stitcher.add(output):
                    exchange.span(_INFO)
                    list(exchange.metric_points(_INFO))
    session.feed_gap(Direction.INGRESS, 100, T0)
    stitcher.flush(T0)
    protocol.sniff(Direction.INGRESS, raw)
    protocol.drops()


from otel_ebpf.protocol import ConnectionInfo, Role  # noqa: E402

_INFO = ConnectionInfo(Role.SERVER, transport=Transport.UDP)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def test_random_datagrams_never_raise(raw: bytes) -> None:
    _feed_everything(b"RTPS\x02\x05\x01\x10" + bytes(12) + raw)
    _feed_everything(raw)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(_SEEDS),
    st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), max_size=8),
    st.integers(20, 4096),
)
def test_mutated_recorded_datagrams_never_raise(seed: bytes, flips: list, cut: int) -> None:
    raw = bytearray(seed[:cut])
    for at, value in flips:
        if at < len(raw):
            raw[at] = value
    _feed_everything(bytes(raw))
    _feed_everything(rb.to_big_endian(bytes(raw)))


def test_a_call_made_while_processing_a_sample_continues_its_trace() -> None:
    """Thread causality for messages reaches other protocols: an HTTP call the subscriber makes on
    the thread that received the sample is the CONSUMER span's child — within the window."""
    from otel_ebpf.pipeline.assembly import TraceAssembler
    from otel_ebpf.protocol import RequestStart

    assembler = TraceAssembler(SelfMetrics())
    udp = ConnectionInfo(Role.SERVER, Endpoint("0.0.0.0", 7411), None, Transport.UDP)
    http = ConnectionInfo(Role.CLIENT, Endpoint("10.0.0.1", 40000), Endpoint("10.0.0.2", 80))
    message = ("sample", PREFIX_A + WRITER, 1)
    assembler.start((7, 4, 1), udp, RequestStart(Direction.INGRESS, T0, message_id=message), tid=70)
    consumer = assembler.finish((7, 4, 1), udp, T0, 70, (Direction.INGRESS, message))
    assembler.start((7, 9, 1), http, RequestStart(Direction.EGRESS, T0 + 10**6), tid=70)
    call = assembler.finish((7, 9, 1), http, T0 + 10**6, 70)
    assert call.parent.span_id == consumer.span_id and call.trace_id == consumer.trace_id
    other_thread = assembler.finish((7, 10, 1), http, T0 + 2 * 10**6, 71)
    assert other_thread.parent is None
    late = assembler.finish((7, 11, 1), http, T0 + assembler.consume_window_ns + 1, 70)
    assert late.parent is None
