"""The generic model and every output: OTLP profiles (validated, to a real receiver over gRPC and
HTTP), profiles.jsonl, pprof, Pyroscope ingest, folded stacks, SVG and the flamegraph command."""

from __future__ import annotations

import gzip
import threading
import urllib.parse
from email import policy
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb

from otel_ebpf.cli import main as cli_main
from otel_ebpf.config import load_config
from otel_ebpf.profiles import flamegraph, otlp, pprof
from otel_ebpf.profiles.exporter import (
    FileProfiles,
    OTLPProfiles,
    ProfileDestination,
    ProfileSink,
    PyroscopeProfiles,
    build_profile_sink,
)
from otel_ebpf.profiles.model import CPU_NANOSECONDS, SAMPLES_COUNT, Frame, FrameKind, ProfileBuilder, ValueType
from otel_ebpf.profiles.render import load_profiles
from otel_ebpf.selfmetrics import SelfMetrics
from tests.otlp_receiver import OTLPReceiver

RESOURCE = {"service.name": "svc", "process.pid": 42, "host.name": "node-1"}
KERNEL = Frame("do_syscall_64", module="[kernel.kallsyms]", kind=FrameKind.KERNEL)
DEFLATE = Frame(
    "libz.so.1+0x5e03",
    module="/usr/lib/libz.so.1",
    kind=FrameKind.NATIVE,
    address=0x5E03,
    build_id="abcd",
    resolved=False,
)
HOT = Frame("hot_native", file="app.py", line=10, kind=FrameKind.PYTHON)
MAIN = Frame("main", file="app.py", line=20, kind=FrameKind.PYTHON)
PYLOOP = Frame("hot_python", file="app.py", line=5, kind=FrameKind.PYTHON)
LINK = (0x0123456789ABCDEF0123456789ABCDEF, 0x1122334455667788)


def build(max_stacks: int = 100) -> ProfileBuilder:
    builder = ProfileBuilder((SAMPLES_COUNT,), CPU_NANOSECONDS, 20_408_163, max_stacks)
    builder.add(RESOURCE, (DEFLATE, HOT, MAIN), (3,), timestamp_ns=1_000)
    builder.add(RESOURCE, (PYLOOP, MAIN), (5,), link=LINK, attributes={"thread.id": 7})
    builder.add(RESOURCE, (PYLOOP, MAIN), (2,), link=LINK, attributes={"thread.id": 7})
    builder.add({**RESOURCE, "process.pid": 43}, (KERNEL, DEFLATE, HOT, MAIN), (1,))
    return builder


def test_builder_aggregates_per_resource_and_caps_stacks() -> None:
    builder = build(max_stacks=2)
    assert builder.dropped == 1  # the third distinct stack (pid 43)
    profiles = builder.take(end_ns=5_000)
    assert len(profiles) == 1 and profiles[0].total() == 10 and profiles[0].start_ns == 1_000
    assert builder.take(6_000) == []
    with pytest.raises(ValueError):
        builder.add(RESOURCE, (MAIN,), (1, 2))


def test_otlp_encoding_follows_the_dictionary_rules_and_round_trips() -> None:
    profiles = build().take(5_000)
    request = otlp.encode(profiles)
    assert otlp.validate(request) == []
    d = request.dictionary
    assert d.string_table[0] == "" and d.stack_table[0] == pb.Stack() and d.location_table[0] == pb.Location()
    assert len(request.resource_profiles) == 2
    profile = request.resource_profiles[0].scope_profiles[0].profiles[0]
    assert d.string_table[profile.sample_type.type_strindex] == "samples"
    assert d.string_table[profile.period_type.type_strindex] == "cpu"
    # leaf first: the first location of the zlib sample is the native frame
    sample = profile.samples[0]
    first = d.location_table[d.stack_table[sample.stack_index].location_indices[0]]
    assert d.string_table[d.function_table[first.lines[0].function_index].name_strindex] == "libz.so.1+0x5e03"
    assert d.string_table[d.mapping_table[first.mapping_index].filename_strindex] == "/usr/lib/libz.so.1"
    linked = [s for s in profile.samples if s.link_index]
    assert len(linked) == 1 and linked[0].values == [7]
    assert d.link_table[linked[0].link_index].span_id == LINK[1].to_bytes(8, "big")
    decoded = otlp.decode(request)
    assert [flamegraph.folded(p) for p in decoded] == [flamegraph.folded(p) for p in profiles]
    assert {k.link for p in decoded for k in p.samples} == {None, LINK}


def test_validate_reports_broken_requests() -> None:
    request = otlp.encode(build().take(5_000))
    request.dictionary.string_table[0] = "x"
    request.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].stack_index = 999
    problems = otlp.validate(request)
    assert "string_table[0] is not the zero value" in problems
    assert any("sample stack index 999" in p for p in problems)


def test_pprof_round_trip_with_span_labels() -> None:
    profile = build().take(5_000)[0]
    data = pprof.encode(profile)
    back = pprof.decode(gzip.compress(data), dict(profile.resource))
    assert flamegraph.folded(back) == flamegraph.folded(profile)
    assert back.period == profile.period and back.period_type == CPU_NANOSECONDS
    assert {k.link for k in back.samples} == {None, LINK}


def test_folded_and_svg() -> None:
    profile = build().take(5_000)[0]
    stacks = flamegraph.folded(profile)
    assert stacks["main (app.py:20);hot_python (app.py:5)"] == 7
    assert flamegraph.parse_folded(flamegraph.format_folded(stacks)) == stacks
    svg = flamegraph.render_svg(stacks, "t <&>")
    assert svg.startswith("<?xml") and "t &lt;&amp;&gt;" in svg and "hot_python (app.py:5)" in svg
    assert flamegraph.shares(stacks, ["hot_python", "hot_native"]) == {"hot_python": 0.7, "hot_native": 0.3}


def test_sink_sends_to_a_real_otlp_receiver_over_grpc_and_http() -> None:
    profiles = build().take(5_000)
    metrics = SelfMetrics()
    with OTLPReceiver() as rx:
        sink = ProfileSink(
            [
                OTLPProfiles(rx.grpc_endpoint, "grpc", {"x-tenant": "a"}, 5),
                OTLPProfiles(rx.http_endpoint + "/v1development/profiles", "http/protobuf", {}, 5, compression="gzip"),
            ],
            metrics,
        )
        sink.export(profiles)
        sink.shutdown()
        assert rx.wait_for(lambda r: len(r.requests("profiles")) == 2, timeout=10)
        assert {r.transport for r in rx.received("profiles")} == {"grpc", "http"}
        assert rx.received("profiles", "grpc")[0].headers["x-tenant"] == "a"
        for request in rx.requests("profiles"):
            assert otlp.validate(request) == []
    assert metrics.total("otel_ebpf.profiles.export.failed") == 0


def test_profiles_endpoint_from_the_configuration() -> None:
    http = load_config(
        {}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}
    )
    assert http.otlp.signal_endpoint("profiles") == "http://c:4318/v1development/profiles"
    grpc = load_config({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"})
    assert grpc.otlp.signal_endpoint("profiles") == "http://c:4317"


def test_failures_and_a_full_queue_are_counted() -> None:
    class Failing(ProfileDestination):
        name = "failing"

        def __init__(self) -> None:
            self.release = threading.Event()

        def export(self, profiles) -> None:
            self.release.wait(5)
            raise OSError("backend down")

    metrics = SelfMetrics()
    failing = Failing()
    sink = ProfileSink([failing], metrics)
    profiles = build().take(5_000)
    for _ in range(20):
        sink.export(profiles)
    failing.release.set()
    sink.shutdown()
    failed = metrics._observe("otel_ebpf.profiles.export.failed")
    by_exporter = {o.attributes["exporter"]: o.value for o in failed}
    assert by_exporter["queue"] >= 1 and by_exporter["failing"] >= 1
    assert by_exporter["queue"] + by_exporter["failing"] == 20


class _Ingest(BaseHTTPRequestHandler):
    received: list = []

    def log_message(self, *args: object) -> None:
        return

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        message = BytesParser(policy=policy.HTTP).parsebytes(
            b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + body
        )
        parts = {p.get_param("name", header="content-disposition"): p.get_content() for p in message.iter_parts()}
        _Ingest.received.append((urllib.parse.urlsplit(self.path), parts))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_pyroscope_ingest_request() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ingest)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        profile = build().take(5_000)[0]
        profile.start_ns, profile.end_ns = 1_700_000_000_000_000_000, 1_700_000_010_000_000_000
        PyroscopeProfiles(f"http://127.0.0.1:{server.server_address[1]}/").export([profile])
    finally:
        server.shutdown()
        server.server_close()
    url, parts = _Ingest.received[-1]
    query = dict(urllib.parse.parse_qsl(url.query))
    assert url.path == "/ingest"
    assert query["name"] == "svc.cpu{service_name=svc,host_name=node-1}"
    assert (query["from"], query["until"], query["format"], query["sampleRate"]) == (
        "1700000000",
        "1700000010",
        "pprof",
        "49",
    )
    assert flamegraph.folded(pprof.decode(parts["profile"])) == flamegraph.folded(profile)


def test_file_destination_and_the_flamegraph_command(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    files = FileProfiles(tmp_path)
    profiles = build().take(5_000)
    files.export(profiles)
    files.export(profiles)
    files.close()
    lines = (tmp_path / "profiles.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"traceId":"0123456789abcdef0123456789abcdef"' in lines[0]
    folded = flamegraph.parse_folded((tmp_path / "profiles" / "svc.folded").read_text())
    assert sum(folded.values()) == 2 * 11  # cumulative over both intervals, both pids
    assert "hot_native" in (tmp_path / "profiles" / "svc.svg").read_text()
    assert len(load_profiles(tmp_path / "profiles.jsonl")) == 4

    assert (
        cli_main(
            [
                "flamegraph",
                str(tmp_path / "profiles.jsonl"),
                "-o",
                str(tmp_path / "a.svg"),
                "--folded",
                str(tmp_path / "a.folded"),
                "--service",
                "svc",
            ]
        )
        == 0
    )
    assert flamegraph.parse_folded((tmp_path / "a.folded").read_text()) == folded
    (tmp_path / "p.pb.gz").write_bytes(gzip.compress(pprof.encode(profiles[0])))
    assert cli_main(["flamegraph", str(tmp_path / "p.pb.gz")]) == 0
    assert "hot_python" in (tmp_path / "p.pb.svg").read_text()
    assert cli_main(["flamegraph", str(tmp_path / "a.folded"), "-o", str(tmp_path / "b.svg")]) == 0
    assert cli_main(["flamegraph", str(tmp_path / "profiles.jsonl"), "--service", "nope"]) == 1
    assert "no profile of service 'nope'" in capsys.readouterr().err


def test_sink_from_the_configuration(tmp_path: Path) -> None:
    config = load_config({"output": str(tmp_path), "exporter": ["file", "otlp"], "pyroscope_url": "http://p:4040"}, {})
    sink = build_profile_sink(config, SelfMetrics())
    try:
        assert [d.name for d in sink.destinations] == ["file", "otlp", "pyroscope"]
    finally:
        sink.shutdown(1)
    disabled = load_config({"output": str(tmp_path)}, {"OTEL_SDK_DISABLED": "true"})
    assert build_profile_sink(disabled, SelfMetrics()).destinations == []


def test_profiles_with_several_sample_types_become_one_otlp_profile_each() -> None:
    builder = ProfileBuilder(
        (ValueType("launches", "count"), ValueType("bytes", "bytes")), ValueType("launches", "count"), 1
    )
    builder.add(RESOURCE, (HOT, MAIN), (1, 4096))
    builder.add(RESOURCE, (HOT, MAIN), (1, 1024))
    request = otlp.encode(builder.take(10))
    profiles = request.resource_profiles[0].scope_profiles[0].profiles
    assert [list(p.samples[0].values) for p in profiles] == [[2], [5120]]
    assert otlp.validate(request) == []
