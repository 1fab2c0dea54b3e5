"""Live BPF: the CPU profiler on a program whose profile is known (examples/cpu_heavy.py: two thirds
pure Python, one third zlib), on several CPython builds, exported to a file, a real OTLP receiver
and a local Pyroscope stand-in; cross-checked with py-spy; span links on an HTTP server.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from email import policy
from email.parser import BytesParser
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from otel_ebpf.profiles import flamegraph, otlp, pprof
from otel_ebpf.profiles.model import Frame, FrameKind, Profile
from otel_ebpf.profiles.render import load_profiles
from tests.conftest import AGENT, REPO
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf

WORKLOAD = REPO / "examples" / "cpu_heavy.py"
PYENV = Path("/root/.pyenv/versions")
PYENV_311 = PYENV / "3.11.7" / "bin" / "python3"
DEBIAN = Path("/usr/bin/python3")
HZ = 99
SAMPLE_S = 5.0
PYTHON_SHARE = 2 / 3


def _line_of(marker: str) -> int:
    for number, line in enumerate(WORKLOAD.read_text().splitlines(), 1):
        if marker in line:
            return number
    raise AssertionError(marker)


HOT_PYTHON_LINE = _line_of("# HOT-PYTHON-LINE")
HOT_NATIVE_LINE = _line_of("# HOT-NATIVE-LINE")


class PyroscopeStandIn:
    """Records Pyroscope ``/ingest`` requests: query parameters and the pprof body."""

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                url = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(url.query))
                profile = b""
                if url.path == "/ingest":
                    message = BytesParser(policy=policy.HTTP).parsebytes(
                        b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + body
                    )
                    for part in message.iter_parts():
                        if part.get_param("name", header="content-disposition") == "profile":
                            profile = part.get_content()
                stand_in.requests.append((query, profile))
                self.send_response(200 if url.path == "/ingest" else 404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> PyroscopeStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return
        if proc.poll() is not None:
            raise AssertionError(f"agent exited early ({proc.returncode}): {proc.stderr.read()}")
        time.sleep(0.05)
    raise AssertionError(f"{path} did not appear within {timeout}s")


@contextmanager
def agent(tmp: Path, pid: int, *extra: str) -> Iterator[subprocess.Popen]:
    """The agent profiling ``pid`` (file exporter into ``tmp/out``) from attach until the block ends."""
    ready = tmp / "ready"
    proc = subprocess.Popen(
        [
            *AGENT,
            "run",
            "--pid",
            str(pid),
            "--profile",
            "--profile-frequency",
            str(HZ),
            "--exporter",
            "file",
            "--output",
            str(tmp / "out"),
            "--ready-file",
            str(ready),
            *extra,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OTEL_EBPF_PROFILING_INTERVAL": "2"},
    )
    try:
        _wait_for(ready, proc)
        yield proc
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextmanager
def workload(python: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([str(python), str(WORKLOAD), *args], env={**os.environ, **(env or {})})
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _process_profiles(profiles: list[Profile], pid: int) -> list[Profile]:
    return [p for p in profiles if p.resource.get("process.pid") == pid]


def _python_functions(stack: Iterable[Frame]) -> list[str]:
    return [f.function for f in stack if f.kind is FrameKind.PYTHON]


def check_known_profile(profiles: list[Profile]) -> dict[str, float]:
    """The assertions of the issue on one process's profiles; returns the measured shares."""
    samples: Counter = Counter()
    lines: dict[str, Counter] = {"hot_python": Counter(), "hot_native": Counter()}
    native_under_hot_native = 0
    for profile in profiles:
        for key, values in profile.samples.items():
            count = values[0]
            samples["total"] += count
            functions = _python_functions(key.stack)
            # leaf first: the mix() -> hot_*() order must hold in every sample
            if "mix" in functions:
                for hot in ("hot_python", "hot_native"):
                    if hot in functions:
                        assert functions.index(hot) < functions.index("mix"), functions
            for hot in ("hot_python", "hot_native"):
                if hot in functions:
                    samples[hot] += count
                    frame = next(f for f in key.stack if f.function == hot)
                    assert frame.file.endswith("cpu_heavy.py"), frame
                    lines[hot][frame.line] += count
            if "hot_native" in functions:
                leafward = key.stack[: next(i for i, f in enumerate(key.stack) if f.function == "hot_native")]
                if any("libz" in f.module for f in leafward if f.kind is FrameKind.NATIVE):
                    native_under_hot_native += count
    total = samples["total"]
    assert total >= 0.6 * HZ * SAMPLE_S * 0.5, f"too few samples: {total}"
    shares = {hot: samples[hot] / total for hot in ("hot_python", "hot_native")}
    assert abs(shares["hot_python"] - PYTHON_SHARE) <= 0.10, shares
    assert abs(shares["hot_native"] - (1 - PYTHON_SHARE)) <= 0.10, shares
    # file and line: the loop body (or its `for` header) and the zlib call
    assert lines["hot_python"].most_common(1)[0][0] == HOT_PYTHON_LINE, lines["hot_python"]
    assert set(lines["hot_python"]) <= set(range(HOT_PYTHON_LINE - 4, HOT_PYTHON_LINE + 2)), lines["hot_python"]
    assert lines["hot_native"].most_common(1)[0][0] == HOT_NATIVE_LINE, lines["hot_native"]
    # hot_native -> ... -> libz: zlib's frames sit leafward of hot_native in most of its samples
    assert native_under_hot_native >= 0.6 * samples["hot_native"], (native_under_hot_native, samples["hot_native"])
    return shares


def _pyspy_top(path: Path) -> list[str]:
    """Python functions by own samples (leaf-most Python frame) in py-spy's raw (folded) output."""
    own: Counter = Counter()
    for line, count in flamegraph.parse_folded(path.read_text()).items():
        python_frames = [f for f in line.split(";") if ".py" in f]
        if python_frames:
            own[python_frames[-1].split(" ")[0]] += count
    return [name for name, _ in own.most_common(2)]


def _our_top(profiles: list[Profile]) -> list[str]:
    own: Counter = Counter()
    for profile in profiles:
        for key, values in profile.samples.items():
            python = _python_functions(key.stack)
            if python:
                own[python[0]] += values[0]
    return [name for name, _ in own.most_common(2)]


@pytest.mark.parametrize("python", [PYENV_311, DEBIAN], ids=["pyenv-3.11", "debian"])
def test_known_profile_to_file_otlp_pyroscope_and_pyspy(python: Path, tmp_path: Path) -> None:
    if not python.exists():
        pytest.fail(f"{python} is missing: run scripts/bootstrap.sh")
    pyspy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    with OTLPReceiver() as rx, PyroscopeStandIn() as pyroscope, workload(python, "run") as target:
        with agent(
            tmp_path,
            target.pid,
            "--exporter",
            "otlp",
            "--otlp-endpoint",
            rx.grpc_endpoint,
            "--pyroscope-url",
            pyroscope.url,
        ):
            spy = subprocess.Popen(
                [
                    pyspy,
                    "record",
                    "--pid",
                    str(target.pid),
                    "--rate",
                    str(HZ),
                    "--duration",
                    str(int(SAMPLE_S)),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    str(tmp_path / "pyspy.txt"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(SAMPLE_S)
            assert spy.wait(timeout=60) == 0, spy.stderr.read()
        assert rx.wait_for(lambda r: r.requests("profiles"), timeout=10)

    # the file exporter: profiles.jsonl, folded stacks and the SVG
    out = tmp_path / "out"
    profiles = _process_profiles(load_profiles(out / "profiles.jsonl"), target.pid)
    assert profiles
    check_known_profile(profiles)
    service = profiles[0].service_name
    svg = (out / "profiles" / f"{service}.svg").read_text()
    assert "hot_python" in svg and "hot_native" in svg and svg.startswith("<?xml")
    folded = flamegraph.parse_folded((out / "profiles" / f"{service}.folded").read_text())
    assert sum(folded.values()) == sum(p.total() for p in profiles)

    # the OTLP receiver got the same profiles, well formed
    requests = rx.requests("profiles")
    for request in requests:
        assert otlp.validate(request) == []
    received = _process_profiles([p for r in requests for p in otlp.decode(r)], target.pid)
    assert flamegraph.merge_folded(flamegraph.folded(p) for p in received) == flamegraph.merge_folded(
        flamegraph.folded(p) for p in profiles
    )
    for profile in received:
        assert profile.sample_types[0].type == "samples" and profile.period_type.type == "cpu"
        assert profile.period == 1_000_000_000 // HZ

    # Pyroscope: one ingest per interval, named after the service, pprof holding the same stacks
    ingests = [(q, body) for q, body in pyroscope.requests if q.get("name", "").startswith(f"{service}.cpu{{")]
    assert ingests, pyroscope.requests
    assert all(q["format"] == "pprof" and f"service_name={service}" in q["name"] for q, _ in ingests)
    from_pyroscope = [pprof.decode(body) for _, body in ingests]
    assert sum(p.total() for p in from_pyroscope) >= sum(p.total() for p in profiles)  # every pid of the service
    assert any(f.function == "hot_python" for p in from_pyroscope for k in p.samples for f in k.stack)

    # py-spy, on the same run, finds the same top Python functions
    assert set(_pyspy_top(tmp_path / "pyspy.txt")) == set(_our_top(profiles)) == {"hot_python", "hot_native"}


@pytest.mark.parametrize("version", ["3.10.13", "3.12.1", "3.13.0"])
def test_other_cpython_versions(version: str, tmp_path: Path) -> None:
    python = PYENV / version / "bin" / "python3"
    if not python.exists():
        pytest.skip(f"pyenv {version} is not installed")
    with workload(python, "run") as target:
        with agent(tmp_path, target.pid):
            time.sleep(SAMPLE_S)
    profiles = _process_profiles(load_profiles(tmp_path / "out" / "profiles.jsonl"), target.pid)
    check_known_profile(profiles)


def test_samples_during_a_request_link_to_its_span(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    with (
        OTLPReceiver() as rx,
        workload(
            PYENV_311, "serve", str(port_file), "--work-ms", "3000", env={"OTEL_SERVICE_NAME": "cpu-heavy-svc"}
        ) as server,
    ):
        deadline = time.monotonic() + 30
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        port = int(port_file.read_text())
        with agent(tmp_path, server.pid, "--exporter", "otlp", "--otlp-endpoint", rx.grpc_endpoint):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/work", timeout=60) as response:
                assert response.read() == b"done\n"
            time.sleep(2.5)  # past the reorder window: the request's end reaches trace assembly
        assert rx.wait_for(lambda r: r.spans() and r.requests("profiles"), timeout=10)
    servers = [s for s in rx.spans() if s["kind"] == "SERVER" and s["attributes"].get("url.path") == "/work"]
    assert len(servers) == 1, rx.spans()
    span = servers[0]
    profiles = [p for r in rx.requests("profiles") for p in otlp.decode(r)]
    assert {p.service_name for p in profiles} == {"cpu-heavy-svc"}
    linked = Counter()
    unlinked_in_handler = 0
    for profile in profiles:
        for key, values in profile.samples.items():
            functions = _python_functions(key.stack)  # qualnames
            in_handler = any(name.endswith("do_GET") for name in functions)
            if key.link is not None:
                # the span opens when the request is read, so parse_request runs inside it too
                assert any(name.endswith("handle_one_request") for name in functions), key.stack
                linked[(f"{key.link[0]:032x}", f"{key.link[1]:016x}")] += values[0]
            elif in_handler:
                unlinked_in_handler += values[0]
    assert set(linked) == {(span["trace_id"], span["span_id"])}
    # 3 s of work at 99 Hz: nearly every sample of the handler carries the link
    assert sum(linked.values()) >= 0.8 * (sum(linked.values()) + unlinked_in_handler), (linked, unlinked_in_handler)
