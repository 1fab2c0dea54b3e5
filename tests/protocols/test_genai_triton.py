"""Triton / KServe v2 LLM calls over gRPC: real protobuf bytes (``tritonclient``'s generated
``service_pb2``) in real HTTP/2 framing (the ``h2`` library), split anywhere, cut by gaps and caps.
"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2
from tritonclient.utils import serialize_byte_tensor

from otel_ebpf.protocol import ConnectionInfo, Direction, Endpoint, Exchange, Role, StatusCode
from otel_ebpf.protocol_testing import Chunk, as_role, capped, cut, mutate, rechunked, replay
from otel_ebpf.protocols.genai import Api, Route, genai_option
from otel_ebpf.protocols.genai.framing import MAX_EVENT, GrpcMessageDecoder
from otel_ebpf.protocols.http2 import HTTP2
from otel_ebpf.protowire import LEN, VARINT, fields

SERVER = ConnectionInfo(Role.SERVER, Endpoint("127.0.0.1", 8001), Endpoint("127.0.0.1", 50000))
CLIENT = ConnectionInfo(Role.CLIENT, Endpoint("127.0.0.1", 50000), Endpoint("127.0.0.1", 8001))
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
PROMPT = "Say something about eBPF, one word at a time."
FIRST_NS, EVERY_NS = 100_000_000, 10_000_000  # first response 100 ms after the request, then every 10 ms


def _bytes_tensor(*values: bytes) -> bytes:
    return serialize_byte_tensor(np.array(values, dtype=np.object_)).item()


def infer_request(model: str = "llama", prompt: str = PROMPT, **extra: Any) -> bytes:
    """A ModelInferRequest as tritonclient builds one: tensors in raw contents, one per input."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=extra.pop("version", ""), id="req-1")
    tensors: dict[str, tuple[str, bytes]] = {"text_input": ("BYTES", _bytes_tensor(prompt.encode()))}
    if "max_tokens" in extra:
        tensors["max_tokens"] = ("INT32", np.array([extra.pop("max_tokens")], "<i4").tobytes())
    for flag in extra.pop("flags", ()):
        tensors[flag] = ("BOOL", b"\x01")
    tensors.update(extra.pop("tensors", {}))
    for name, (datatype, raw) in tensors.items():
        request.inputs.add(name=name, datatype=datatype, shape=[1])
        request.raw_input_contents.append(raw)
    return request.SerializeToString()


def infer_response(text: str | None, model: str = "llama", **counts: Any) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name=model, model_version="7", id="req-1")
    if text is not None:
        response.outputs.add(name="text_output", datatype="BYTES", shape=[1])
        response.raw_output_contents.append(_bytes_tensor(text.encode()))
    for name in ("num_input_tokens", "num_output_tokens"):
        if name in counts:
            response.outputs.add(name=name, datatype="UINT32", shape=[1])
            response.raw_output_contents.append(np.array([counts[name]], "<u4").tobytes())
    if "finish_reason" in counts:
        response.outputs.add(name="finish_reason", datatype="BYTES", shape=[1])
        response.raw_output_contents.append(_bytes_tensor(counts["finish_reason"].encode()))
    if counts.get("final"):
        response.parameters["triton_final_response"].bool_param = True
    return response


def stream_response(text: str | None = None, error: str = "", **counts: Any) -> bytes:
    if error:
        return service_pb2.ModelStreamInferResponse(error_message=error).SerializeToString()
    inner = infer_response(text, **counts)
    return service_pb2.ModelStreamInferResponse(infer_response=inner).SerializeToString()


def framed(message: bytes, compressed: bool = False) -> bytes:
    return bytes((compressed,)) + len(message).to_bytes(4, "big") + message


def grpc_exchange(path: str, requests: list[bytes], responses: list[bytes], frame_cuts: Any = None) -> list[Chunk]:
    """A real h2 client and server carrying one gRPC call: the requests in the client's first
    write, one response message per later write (``FIRST_NS`` after the request, then every
    ``EVERY_NS``), each cut into DATA frames where ``frame_cuts(i, message)`` says, then the
    ``grpc-status: 0`` trailers. As the server saw it."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    head = [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "triton:8001")]
    client.send_headers(1, [*head, ("content-type", "application/grpc"), ("te", "trailers")])
    body = b"".join(map(framed, requests))
    for at in range(0, len(body), 16384):  # the peer's largest frame
        client.send_data(1, body[at : at + 16384], end_stream=at + 16384 >= len(body))
    chunks = [Chunk(Direction.INGRESS, 1_000, client.data_to_send())]
    server.receive_data(chunks[0].data)
    server.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
    chunks.append(Chunk(Direction.EGRESS, 2_000, server.data_to_send()))
    for i, message in enumerate(responses):
        data = framed(message)
        for piece in cut(data, frame_cuts(i, data) if frame_cuts else ()):
            server.send_data(1, piece)
        chunks.append(Chunk(Direction.EGRESS, 1_000 + FIRST_NS + i * EVERY_NS, server.data_to_send()))
    server.send_headers(1, [("grpc-status", "0")], end_stream=True)
    chunks.append(Chunk(Direction.EGRESS, 1_000 + FIRST_NS + len(responses) * EVERY_NS, server.data_to_send()))
    return chunks


def _exchange(chunks: list[Chunk], role: Role = Role.SERVER, protocol: HTTP2 | None = None) -> Exchange:
    exchanges = replay(as_role(chunks, role), role, protocol or HTTP2()).exchanges
    assert len(exchanges) == 1
    return exchanges[0]


def _span(chunks: list[Chunk], role: Role = Role.SERVER, protocol: HTTP2 | None = None) -> dict[str, Any]:
    span = _exchange(chunks, role, protocol).span(SERVER if role is Role.SERVER else CLIENT)
    return {"name": span.name, "status": span.status, "description": span.status_description, **span.attributes}


def _tokens(n: int, **last: Any) -> list[bytes]:
    return [stream_response(f"t{i} ", **(last if i == n - 1 else {})) for i in range(n)]


@pytest.mark.parametrize("role", list(Role))
def test_unary_model_infer_is_a_genai_span_on_the_grpc_one(role: Role) -> None:
    request = infer_request("llama-3-8b", max_tokens=6, version="2", flags=["return_num_output_tokens"])
    answer = infer_response("t0 t1 t2 t3 t4 t5", "llama-3-8b", num_input_tokens=11, num_output_tokens=6)
    answer.outputs.add(name="finish_reason", datatype="BYTES", shape=[1])
    answer.raw_output_contents.append(_bytes_tensor(b"length"))
    exchange = _exchange(grpc_exchange(INFER, [request], [answer.SerializeToString()]), role)
    conn = SERVER if role is Role.SERVER else CLIENT
    described = exchange.span(conn)
    span = {"name": described.name, "status": described.status, **described.attributes}
    assert span["name"] == "text_completion llama-3-8b"
    assert span["gen_ai.operation.name"] == "text_completion" and span["gen_ai.provider.name"] == "triton"
    assert span["gen_ai.request.model"] == span["gen_ai.response.model"] == "llama-3-8b"
    assert span["otel_ebpf.gen_ai.request.model_version"] == "2"
    assert span["otel_ebpf.gen_ai.response.model_version"] == "7"
    assert span["gen_ai.response.id"] == "req-1"
    assert span["gen_ai.request.max_tokens"] == 6
    assert (span["gen_ai.usage.input_tokens"], span["gen_ai.usage.output_tokens"]) == (11, 6)
    assert "otel_ebpf.gen_ai.usage.approximate" not in span
    assert span["gen_ai.response.finish_reasons"] == ("length",)
    assert span["otel_ebpf.gen_ai.stream"] is False and "gen_ai.response.time_to_first_chunk" not in span
    # the gRPC conventions still describe the call
    assert span["rpc.system"] == "grpc" and span["rpc.method"] == "ModelInfer" and span["rpc.grpc.status_code"] == 0
    assert span["status"] is StatusCode.UNSET
    points = {p.instrument: p for p in exchange.metric_points(conn)}
    side = "server" if role is Role.SERVER else "client"
    assert f"rpc.{side}.duration" in points
    if role is Role.SERVER:
        assert points["gen_ai.server.request.duration"].attributes["gen_ai.request.model"] == "llama-3-8b"
    else:
        duration = points["gen_ai.client.operation.duration"]
        assert (duration.attributes["server.address"], duration.attributes["server.port"]) == ("triton", 8001)


def test_streamed_responses_give_ttft_tpot_and_counted_tokens() -> None:
    span = _span(grpc_exchange(STREAM, [infer_request("mistral")], _tokens(6)))
    assert span["name"] == "text_completion mistral" and span["otel_ebpf.gen_ai.stream"] is True
    assert span["otel_ebpf.gen_ai.output_chunks"] == 6
    # no counts in the responses: one token per response with text, and said so; input from the prompt
    assert span["gen_ai.usage.output_tokens"] == 6
    assert span["gen_ai.usage.input_tokens"] == -(-len(PROMPT) // 4)
    assert span["otel_ebpf.gen_ai.usage.approximate"] == ("output_tokens", "input_tokens")
    assert span["gen_ai.response.time_to_first_chunk"] == pytest.approx(FIRST_NS / 1e9)
    assert span["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(EVERY_NS / 1e9)


def test_counts_the_responses_carry_are_exact_and_an_empty_final_response_is_no_token() -> None:
    responses = [stream_response(f"t{i} ", num_output_tokens=2, num_input_tokens=12) for i in range(4)]
    responses[-1] = stream_response("t3 ", num_output_tokens=2, num_input_tokens=12, finish_reason="length")
    responses.append(stream_response(None, final=True))
    exchange = _exchange(grpc_exchange(STREAM, [infer_request()], responses))
    span = exchange.span(SERVER).attributes
    assert (span["gen_ai.usage.input_tokens"], span["gen_ai.usage.output_tokens"]) == (12, 8)
    assert span["otel_ebpf.gen_ai.output_chunks"] == 4 and "otel_ebpf.gen_ai.usage.approximate" not in span
    assert span["gen_ai.response.finish_reasons"] == ("length",)
    # TPOT over the reported tokens: 3 gaps of 10 ms for 7 tokens after the first
    assert span["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(3 * EVERY_NS / 1e9 / 7)


def test_a_stream_response_with_an_error_message_is_the_calls_error() -> None:
    responses = [*_tokens(3), stream_response(error="model crashed: out of KV cache blocks")]
    exchange = _exchange(grpc_exchange(STREAM, [infer_request("llama-fails")], responses))
    described = exchange.span(SERVER)
    span = {"status": described.status, "description": described.status_description, **described.attributes}
    assert span["status"] is StatusCode.ERROR and span["error.type"] == "inference_error"
    assert span["description"] == "model crashed: out of KV cache blocks"
    assert span["rpc.grpc.status_code"] == 0  # the stream itself ended well: the error is in-band
    assert span["otel_ebpf.gen_ai.output_chunks"] == 3
    points = exchange.metric_points(SERVER)
    genai = [p for p in points if p.instrument.startswith("gen_ai.")]
    assert [p.instrument for p in genai] == ["gen_ai.server.request.duration"]  # no TTFT/TPOT for a failure
    assert genai[0].attributes["error.type"] == "inference_error"


def test_ttft_starts_at_the_first_request_message_not_the_streams_opening() -> None:
    chunks = grpc_exchange(STREAM, [infer_request()], _tokens(3))
    # the client opened the stream (HEADERS) 5 s before it sent its request (DATA)
    headers_end = chunks[0].data.index(framed(infer_request())) - 9  # the DATA frame's header
    early = Chunk(Direction.INGRESS, 1_000 - 5_000_000_000, chunks[0].data[:headers_end])
    late = Chunk(Direction.INGRESS, 1_000, chunks[0].data[headers_end:])
    span = _span([early, late, *chunks[1:]])
    assert span["gen_ai.response.time_to_first_chunk"] == pytest.approx(FIRST_NS / 1e9)


def test_a_model_infer_without_text_or_token_input_stays_plain_grpc() -> None:
    image = service_pb2.ModelInferRequest(model_name="resnet50")
    image.inputs.add(name="INPUT__0", datatype="FP32", shape=[1, 3, 4, 4])
    image.raw_input_contents.append(bytes(4 * 48))
    answer = service_pb2.ModelInferResponse(model_name="resnet50")
    answer.outputs.add(name="OUTPUT__0", datatype="FP32", shape=[1, 10])
    span = _span(grpc_exchange(INFER, [image.SerializeToString()], [answer.SerializeToString()]))
    assert span["name"] == "inference.GRPCInferenceService/ModelInfer"
    assert not any(key.startswith("gen_ai.") for key in span)


def test_token_id_inputs_and_outputs_of_a_tensorrt_llm_model() -> None:
    request = service_pb2.ModelInferRequest(model_name="tensorrt_llm")
    request.inputs.add(name="input_ids", datatype="INT32", shape=[1, 9])
    request.inputs.add(name="request_output_len", datatype="INT32", shape=[1, 1])
    request.raw_input_contents.extend([np.arange(9, dtype="<i4").tobytes(), np.array([4], "<i4").tobytes()])
    responses = []
    for i in range(4):
        response = service_pb2.ModelInferResponse(model_name="tensorrt_llm")
        response.outputs.add(name="output_ids", datatype="INT32", shape=[1, 1, 1])
        response.raw_output_contents.append(np.array([100 + i], "<i4").tobytes())
        responses.append(service_pb2.ModelStreamInferResponse(infer_response=response).SerializeToString())
    span = _span(grpc_exchange(STREAM, [request.SerializeToString()], responses))
    assert span["gen_ai.request.max_tokens"] == 4
    assert span["gen_ai.usage.input_tokens"] == 9  # the token ids sent: exact
    assert span["otel_ebpf.gen_ai.output_chunks"] == 4
    assert span["otel_ebpf.gen_ai.usage.approximate"] == ("output_tokens",)


def test_vllm_sampling_parameters_give_max_tokens() -> None:
    sampling = ("BYTES", _bytes_tensor(b'{"max_tokens": 33, "temperature": 0}'))
    request = infer_request(tensors={"sampling_parameters": sampling})
    assert _span(grpc_exchange(STREAM, [request], _tokens(2)))["gen_ai.request.max_tokens"] == 33


def test_a_stream_that_carries_two_requests_is_one_call_read_from_the_first() -> None:
    chunks = grpc_exchange(STREAM, [infer_request("first"), infer_request("second")], _tokens(3) + _tokens(2))
    span = _span(chunks)
    assert span["name"] == "text_completion first"
    assert span["otel_ebpf.rpc.request.message_count"] == 2
    assert span["otel_ebpf.gen_ai.output_chunks"] == 5


def test_every_gap_in_the_responses_keeps_the_call_and_what_came_before_it() -> None:
    chunks = grpc_exchange(STREAM, [infer_request()], STREAMED)
    for index in range(2, len(chunks) - 1):  # each response's write, cut at every byte
        chunk = chunks[index]
        before = index - 2  # the responses written before it
        for at in range(len(chunk.data)):
            lost = Chunk(chunk.direction, chunk.t_ns, chunk.data[:at], len(chunk.data) - at)
            span = _span([*chunks[:index], lost, *chunks[index + 1 :]])
            assert span["name"] == "text_completion llama", (index, at)
            # a gap that hides a DATA frame's header hides where the messages after it start
            assert before <= span["otel_ebpf.gen_ai.output_chunks"] <= 5, (index, at)
            if at >= 9 + 5:  # the frame's and the message's prefixes came: only this message is lost
                assert span["otel_ebpf.gen_ai.output_chunks"] == 4, (index, at)  # its text comes last


def _figures(span: dict[str, Any]) -> tuple:
    keys = (
        "name",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "otel_ebpf.gen_ai.output_chunks",
        "gen_ai.response.model",
        "gen_ai.response.finish_reasons",
        "gen_ai.response.time_to_first_chunk",
        "otel_ebpf.gen_ai.time_per_output_token",
        "error.type",
    )
    return tuple(span.get(key) for key in keys)


STREAMED = [stream_response(f"t{i} ", num_output_tokens=1, finish_reason="length" if i == 4 else "") for i in range(5)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), role=st.sampled_from(list(Role)))
def test_messages_cut_into_data_frames_and_syscalls_anywhere(data: st.DataObject, role: Role) -> None:
    """Each message in DATA frames cut anywhere (its 5-byte prefix too), each syscall cut anywhere:
    a piece keeps its syscall's timestamp, so every figure stays the same."""
    expected = _figures(_span(grpc_exchange(STREAM, [infer_request()], STREAMED), role))
    assert expected[3] == 5 and expected[2] == 5
    frame_cuts = lambda i, message: data.draw(st.sets(st.integers(1, len(message) - 1), max_size=4))  # noqa: E731
    chunks = grpc_exchange(STREAM, [infer_request()], STREAMED, frame_cuts)
    assert _figures(_span(rechunked(data, chunks, max_cuts=8), role)) == expected


def test_a_large_prompt_cut_by_the_payload_cap_still_names_the_model() -> None:
    chunks = grpc_exchange(STREAM, [infer_request("big-model", "x" * 20_000, max_tokens=5)], _tokens(3))
    span = _span(capped(chunks, 4096))
    assert span["name"] == "text_completion big-model"
    assert "gen_ai.request.max_tokens" not in span  # in the raw contents, after the cut
    assert "gen_ai.usage.input_tokens" not in span  # neither reported nor countable from a prefix
    assert span["otel_ebpf.gen_ai.output_chunks"] == 3


def test_content_capture_of_the_prompt_and_the_output_text() -> None:
    protocol = HTTP2({"genai": {"capture_content": True, "max_content_chars": 12}})
    span = _span(
        grpc_exchange(STREAM, [infer_request(prompt="my api_key=hunter2 please")], _tokens(5)), protocol=protocol
    )
    assert "hunter2" not in span["gen_ai.input.messages"]
    assert span["gen_ai.output.messages"] == "t0 t1 t2 t3 "


def test_a_route_from_the_options_names_another_provider() -> None:
    routes = {INFER: {"api": "triton_infer", "provider": "kserve"}}
    answer = infer_response("ok").SerializeToString()
    span = _span(grpc_exchange(INFER, [infer_request()], [answer]), protocol=HTTP2({"genai": {"routes": routes}}))
    assert span["gen_ai.provider.name"] == "kserve"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_calls_never_raise(data: st.DataObject) -> None:
    chunks = grpc_exchange(STREAM, [infer_request()], [*STREAMED, stream_response(error="boom")])
    role = data.draw(st.sampled_from(list(Role)))
    tokens = (framed(b""), framed(b"\xff" * 8), b"\x01\x00\x00\x00\x03abc", b"\x00\xff\xff\xff\xff")
    for exchange in replay(mutate(data.draw, as_role(chunks, role), tokens), role, HTTP2()).exchanges:
        conn = SERVER if role is Role.SERVER else CLIENT
        exchange.span(conn)
        exchange.metric_points(conn)


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(st.binary(max_size=300), max_size=4),
    cuts=st.lists(st.integers(0, 1300), max_size=8),
    api=st.sampled_from([Api.TRITON_INFER, Api.TRITON_STREAM]),
    gap=st.sampled_from([None, 0, 3, 100]),
)
def test_random_messages_never_raise(messages: list[bytes], cuts: list[int], api: Api, gap: int | None) -> None:
    options = genai_option({"capture_content": True})
    assert options is not None
    route = Route(api, "triton")
    request, response = options.request_body("POST", INFER), options.response_body(route, ())
    assert request is not None
    for i, piece in enumerate(cut(b"".join(map(framed, messages)), cuts)):
        request.feed(piece, i)
        response.feed(piece, i)
        if i == 1:
            request.gap(gap)
            response.gap(gap)
    request.finish()
    response.finish()


# -- the decoders ------------------------------------------------------------------------------------


def test_grpc_decoder_across_prefixes_gaps_and_compression() -> None:
    decoder = GrpcMessageDecoder()
    data = framed(b"one") + framed(b"two", compressed=True) + framed(b"") + framed(b"four")
    assert decoder.feed(data[:2], 1) == []  # a prefix cut short
    assert decoder.feed(data[2:], 2) == [(2, b"one", True), (2, b"", True), (2, b"four", True)]
    assert decoder.compressed == 1
    # a gap of known length inside a message: the rest of the framing holds
    assert decoder.feed(framed(b"abcdef")[:7], 3) == []
    assert decoder.gap(3) == []
    assert decoder.feed(b"f" + framed(b"next"), 4) == [(4, b"ab", False), (4, b"next", True)]
    # a gap that ends a message gives it at once, with the last timestamp seen
    decoder.feed(framed(b"xyz")[:6], 5)
    assert decoder.gap(2) == [(5, b"x", False)]
    assert decoder.errors == 0
    # a gap of unknown length, or past a message's end: no more message boundaries
    decoder.feed(framed(b"abc")[:6], 6)
    assert decoder.gap(None) == [(6, b"a", False)] and decoder.errors == 1
    assert decoder.feed(framed(b"lost"), 7) == []


def test_grpc_decoder_bounds_a_message() -> None:
    decoder = GrpcMessageDecoder()
    big = b"x" * (MAX_EVENT + 10)
    out = decoder.feed(framed(big) + framed(b"after"), 1)
    assert [(len(payload), whole) for _, payload, whole in out] == [(MAX_EVENT, False), (5, True)]


def test_protowire_fields_read_what_protobuf_wrote() -> None:
    payload = infer_response("hi", num_output_tokens=3).SerializeToString()
    found = [(number, wire_type) for number, wire_type, _ in fields(payload)]
    assert found[:3] == [(1, LEN), (2, LEN), (3, LEN)] and (6, LEN) in found
    tensor = service_pb2.ModelInferRequest.InferInputTensor(shape=[1, 300])
    assert [(n, w) for n, w, _ in fields(tensor.SerializeToString())] == [(3, LEN)]
    assert list(fields(service_pb2.InferParameter(int64_param=-1).SerializeToString())) == [(2, VARINT, 2**64 - 1)]
    with pytest.raises(ValueError):
        list(fields(payload[:-1]))
