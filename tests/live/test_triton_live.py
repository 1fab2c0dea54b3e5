"""Live BPF: Triton / KServe v2 LLM calls over gRPC, measured from the wire on both sides.

``examples/triton_server.py`` (a grpcio server with ``tritonclient``'s generated servicer) streams
its first token 300 ms after a request, then one every 40 ms, 25 in all; ``examples/triton_clients.py``
calls it with the real ``tritonclient.grpc.InferenceServerClient``: unary ``infer`` asking for the
vLLM backend's token counts and finish reason, ``start_stream`` / ``async_stream_infer`` with the
same and an empty final response, a stream without counts, and a stream the server ends with an
``error_message`` after three tokens. Both processes are traced by pid; what a real OTLP receiver
got is held against what the client itself saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.conftest import REPO
from tests.live.test_genai_live import _histogram_count, _llm_spans
from tests.live.test_http_live import _wait_for_file
from tests.live.test_tls_live import _start_agent, _stop
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf
SERVER = [sys.executable, str(REPO / "examples" / "triton_server.py")]
CLIENTS = [sys.executable, str(REPO / "examples" / "triton_clients.py")]
TOKENS = 25
CALLS = ("triton_infer", "triton_stream", "triton_stream_plain", "triton_stream_fails")
STREAMS = CALLS[1:]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every call once, traced (after an untraced warm-up round); the client's records, the
    spans and the metrics."""
    tmp = tmp_path_factory.mktemp("triton")
    server = subprocess.Popen(
        [*SERVER, str(tmp / "port"), "--first-token-ms", "300", "--token-ms", "40", "--tokens", str(TOKENS)],
        stdout=subprocess.DEVNULL,
    )
    try:
        port = _wait_for_file(tmp / "port", server)
        clients = subprocess.Popen(
            [*CLIENTS, port, "--wait", "--warm-up", "--tokens", str(TOKENS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert clients.stdout.readline() == "ready\n"
        with OTLPReceiver() as receiver:
            agent = _start_agent(tmp, receiver, "tracepoints", "--pid", str(server.pid), "--pid", str(clients.pid))
            try:
                out, _ = clients.communicate("go\n", timeout=120)
            finally:
                stderr = _stop(agent)
            assert clients.returncode == 0
            receiver.wait_for(lambda r: len(_llm_spans({"spans": r.spans()}, "CLIENT")) >= len(CALLS), timeout=10)
            spans, metrics = receiver.spans(), receiver.metrics()
    finally:
        server.kill()
        server.wait()
    records = {record["call"]: record for record in map(json.loads, out.splitlines())}
    return {"calls": records, "spans": spans, "metrics": metrics, "stderr": stderr}


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_every_call_is_one_genai_span_on_its_grpc_span(run: dict[str, Any], kind: str) -> None:
    spans = _llm_spans(run, kind)
    seen = run["calls"]
    assert [s["name"] for s in spans] == [f"text_completion {seen[call]['model']}" for call in CALLS]
    for span, call in zip(spans, CALLS, strict=True):
        a = span["attributes"]
        assert a["gen_ai.provider.name"] == "triton" and a["gen_ai.operation.name"] == "text_completion"
        assert a["gen_ai.response.model"] == seen[call]["model"], call
        assert a["otel_ebpf.gen_ai.response.model_version"] == seen[call]["version"] == "3", call
        assert a["gen_ai.request.max_tokens"] == TOKENS, call
        assert a["rpc.system"] == "grpc" and a["rpc.grpc.status_code"] == 0, call
        assert a["rpc.method"] == ("ModelInfer" if call == "triton_infer" else "ModelStreamInfer"), call
    assert spans[0]["attributes"]["gen_ai.response.id"] == seen["triton_infer"]["id"] == "req-unary"


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_reported_token_counts_are_the_ones_the_client_read(run: dict[str, Any], kind: str) -> None:
    spans = dict(zip(CALLS, _llm_spans(run, kind), strict=True))
    for call in ("triton_infer", "triton_stream"):
        a, seen = spans[call]["attributes"], run["calls"][call]
        assert a["gen_ai.usage.input_tokens"] == seen["usage"]["input_tokens"], call
        assert a["gen_ai.usage.output_tokens"] == seen["usage"]["output_tokens"] == TOKENS, call
        assert "otel_ebpf.gen_ai.usage.approximate" not in a, call
        assert a["gen_ai.response.finish_reasons"] == [seen["finish_reason"]] == ["length"], call
    unary = spans["triton_infer"]
    assert unary["attributes"]["otel_ebpf.gen_ai.stream"] is False
    assert "gen_ai.response.time_to_first_chunk" not in unary["attributes"]
    assert (unary["end_ns"] - unary["start_ns"]) / 1e9 == pytest.approx(0.30 + 24 * 0.040, abs=0.15)


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_streams_give_ttft_tpot_and_chunks(run: dict[str, Any], kind: str) -> None:
    spans = dict(zip(CALLS, _llm_spans(run, kind), strict=True))
    for call in STREAMS:
        a, seen = spans[call]["attributes"], run["calls"][call]
        assert a["otel_ebpf.gen_ai.stream"] is True, call
        assert a["otel_ebpf.gen_ai.output_chunks"] == seen["chunks"], call
        assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.30, abs=0.03), call
        assert a["gen_ai.response.time_to_first_chunk"] <= seen["first_token_s"], call
        if call != "triton_stream_fails":
            assert a["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(0.040, abs=0.010), call
    plain = spans["triton_stream_plain"]["attributes"]
    assert plain["gen_ai.usage.output_tokens"] == TOKENS == run["calls"]["triton_stream_plain"]["chunks"]
    assert plain["otel_ebpf.gen_ai.usage.approximate"] == ["output_tokens", "input_tokens"]


@pytest.mark.parametrize("kind", ["SERVER", "CLIENT"])
def test_an_error_message_in_the_stream_is_the_calls_error(run: dict[str, Any], kind: str) -> None:
    span = _llm_spans(run, kind)[3]
    seen = run["calls"]["triton_stream_fails"]
    assert span["status_code"] == "ERROR" and span["attributes"]["error.type"] == "inference_error"
    assert span["status_message"] == seen["error"] == "model crashed: out of KV cache blocks"
    assert span["attributes"]["otel_ebpf.gen_ai.output_chunks"] == seen["chunks"] == 3


def test_metrics(run: dict[str, Any]) -> None:
    assert _histogram_count(run, "gen_ai.server.request.duration") == len(CALLS)
    assert _histogram_count(run, "gen_ai.client.operation.duration") == len(CALLS)
    assert _histogram_count(run, "gen_ai.server.request.duration", **{"error.type": "inference_error"}) == 1
    # the serving side times successful streams; the calling side every stream
    assert _histogram_count(run, "gen_ai.server.time_to_first_token") == 2
    assert _histogram_count(run, "gen_ai.server.time_per_output_token") == 2
    assert _histogram_count(run, "gen_ai.client.operation.time_to_first_chunk") == 3
    gaps = 2 * (TOKENS - 1) + (3 - 1)
    assert _histogram_count(run, "gen_ai.client.operation.time_per_output_chunk") == gaps
    assert _histogram_count(run, "gen_ai.client.token.usage", **{"gen_ai.token.type": "output"}) == len(CALLS)
    assert _histogram_count(run, "rpc.server.duration", **{"rpc.service": "inference.GRPCInferenceService"}) >= 4
    for span in run["spans"]:
        assert not {"gen_ai.input.messages", "gen_ai.output.messages"} & set(span["attributes"])
