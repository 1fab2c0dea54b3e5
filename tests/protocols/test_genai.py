"""The GenAI layer on recorded LLM traffic: every split point, re-chunked bodies, hostile bytes.

``tests/data/genai_events.jsonl`` was recorded with ``otel-ebpf record --pid SERVER --pid CLIENTS``
while ``examples/llm_clients.py`` called ``examples/llm_server.py`` (first token after 300 ms, then
one every 40 ms, 25 tokens): httpx and openai SSE streams, a non-streamed chat completion,
embeddings, Ollama NDJSON and TGI SSE, each seen by the server and by the caller.
"""

from __future__ import annotations

import json
import struct
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_ebpf.pipeline.events import ConnData, ConnOpen
from otel_ebpf.protocol import ConnectionInfo, Direction, Endpoint, Role, StatusCode
from otel_ebpf.protocol_testing import Chunk, capped, every_split, mutate, replay
from otel_ebpf.protocols.genai import Api, GenAICall, RequestBody, ResponseBody, Route, genai_option
from otel_ebpf.protocols.genai.framing import MAX_EVENT, NDJSONDecoder, SSEDecoder
from otel_ebpf.protocols.genai.routes import GRPC_APIS
from otel_ebpf.protocols.http1 import HTTP1, HTTP1Exchange
from otel_ebpf.protocols.http2 import HTTP2, HTTP2Exchange
from otel_ebpf.recording import read_recording

RECORDING = Path(__file__).parents[1] / "data" / "genai_events.jsonl"
TOKENS = 25
SERVER = ConnectionInfo(Role.SERVER, Endpoint("127.0.0.1", 8000), Endpoint("127.0.0.1", 50000))
CLIENT = ConnectionInfo(Role.CLIENT, Endpoint("127.0.0.1", 50000), Endpoint("127.0.0.1", 8000))


def _connections() -> list[tuple[Role, list[Chunk]]]:
    """The recording's connections, in the order they opened: (role, chunks)."""
    with RECORDING.open() as stream:
        _, events = read_recording(stream)
        roles: dict[tuple, Role] = {}
        chunks: dict[tuple, list[Chunk]] = defaultdict(list)
        for event in events:
            if isinstance(event, ConnOpen):
                roles[event.key] = event.role
            elif isinstance(event, ConnData):
                chunks[event.key].append(
                    Chunk(event.direction, event.timestamp_ns, event.data, event.length - len(event.data))
                )
    return [(roles[key], chunks[key]) for key in sorted(chunks, key=lambda k: chunks[k][0].t_ns)]


CONNECTIONS = _connections()


def _exchange(role: Role, chunks: list[Chunk], protocol: HTTP1 | None = None) -> HTTP1Exchange:
    exchanges = replay(chunks, role, protocol or HTTP1()).exchanges
    assert len(exchanges) == 1
    return exchanges[0]  # type: ignore[return-value]


def _span(role: Role, chunks: list[Chunk], protocol: HTTP1 | None = None) -> dict[str, Any]:
    span = _exchange(role, chunks, protocol).span(SERVER if role is Role.SERVER else CLIENT)
    return {"name": span.name, "status": span.status, **span.attributes}


def _connection(name: str, role: Role) -> list[Chunk]:
    """The first connection of ``role`` whose span is named ``name``."""
    for found_role, chunks in CONNECTIONS:
        if found_role is role and _span(role, chunks)["name"] == name:
            return chunks
    raise LookupError(name)


def test_recording_holds_every_call_from_both_sides() -> None:
    names = [(role, _span(role, chunks)["name"]) for role, chunks in CONNECTIONS]
    for role in Role:
        assert [name for r, name in names if r is role] == [
            "chat llama-3-8b",
            "chat gpt-oss-20b",
            "chat gpt-oss-20b",
            "embeddings bge-small",
            "text_completion llama3.2",
            "text_completion",
        ]


@pytest.mark.parametrize("role", list(Role))
def test_recorded_streams_give_the_figures_the_server_produced(role: Role) -> None:
    for chunks in (_connection("chat llama-3-8b", role), _connection("text_completion llama3.2", role)):
        span = _span(role, chunks)
        assert span["gen_ai.usage.output_tokens"] == TOKENS
        assert span["otel_ebpf.gen_ai.output_chunks"] == TOKENS
        assert span["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.30, abs=0.03)
        assert span["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(0.040, abs=0.010)
        assert span["status"] is StatusCode.UNSET


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


@pytest.mark.parametrize("name", ["chat llama-3-8b", "text_completion llama3.2", "text_completion"])
def test_split_at_every_point_gives_the_same_figures(name: str) -> None:
    chunks = _connection(name, Role.CLIENT)
    expected = _figures(_span(Role.CLIENT, chunks))
    # every syscall of the response split in two at every byte: a split piece keeps its
    # syscall's timestamp, so every figure, times included, stays the same
    for split in every_split(chunks, longest=400):
        assert _figures(_span(Role.CLIENT, split)) == expected


def _sse_body(chunks: list[Chunk]) -> bytes:
    """The content of a recorded chunked SSE response: what its events are made of."""
    raw = b"".join(c.data for c in chunks if c.direction is Direction.INGRESS)
    head, _, body = raw.partition(b"\r\n\r\n")
    content = bytearray()
    while body:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        content += body[:size]
        body = body[size + 2 :]
    return bytes(content)


def _chunked_response(content: bytes, cuts: list[int]) -> bytes:
    """``content`` as an HTTP/1.1 chunked SSE response whose chunks end at ``cuts``."""
    pieces, last = [], 0
    for at in sorted({c for c in cuts if 0 < c < len(content)}) + [len(content)]:
        pieces.append(b"%x\r\n%s\r\n" % (at - last, content[last:at]))
        last = at
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"".join(pieces) + b"0\r\n\r\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), crlf=st.booleans())
def test_chunk_boundaries_anywhere_across_sse_events(data: st.DataObject, crlf: bool) -> None:
    """HTTP/1.1 chunks and syscalls cut SSE events anywhere; `\\r\\n\\r\\n` separators as well."""
    chunks = _connection("chat llama-3-8b", Role.CLIENT)
    request = [c for c in chunks if c.direction is Direction.EGRESS]
    content = _sse_body(chunks)
    if crlf:
        content = content.replace(b"\n\n", b"\r\n\r\n")
    response = _chunked_response(content, data.draw(st.lists(st.integers(0, len(content)), max_size=40)))
    start = request[-1].t_ns
    syscalls = [
        Chunk(Direction.INGRESS, start + 300_000_000 + i * 40_000_000, piece)
        for i, piece in enumerate(_cut(response, data.draw(st.lists(st.integers(0, len(response)), max_size=30))))
    ]
    span = _span(Role.CLIENT, request + syscalls)
    assert span["gen_ai.usage.output_tokens"] == TOKENS
    assert span["otel_ebpf.gen_ai.output_chunks"] == TOKENS
    assert span["gen_ai.response.model"] == "llama-3-8b-served"
    assert span["status"] is StatusCode.UNSET


def _cut(data: bytes, offsets: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(o for o in offsets if 0 < o < len(data))})
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), index=st.integers(0, len(CONNECTIONS) - 1))
def test_mutated_recordings_never_raise(data: st.DataObject, index: int) -> None:
    role, chunks = CONNECTIONS[index]
    tokens = (b"data: [DONE]\n\n", b"data: {\n\n", b'{"done": true}\n', b"\r\n\r\n", b"0\r\n\r\n", b"data:\n\n")
    mutated = mutate(data.draw, list(chunks), tokens)
    for exchange in replay(mutated, role, HTTP1()).exchanges:
        exchange.span(SERVER if role is Role.SERVER else CLIENT)
        exchange.metric_points(SERVER if role is Role.SERVER else CLIENT)


@settings(max_examples=300, deadline=None)
@given(
    body=st.binary(max_size=2000),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
    content_type=st.sampled_from(["text/event-stream", "application/x-ndjson", "application/json"]),
    api=st.sampled_from([api for api in Api if api not in GRPC_APIS]),  # gRPC's: test_genai_triton.py
)
def test_random_bodies_never_raise(body: bytes, cuts: list[int], content_type: str, api: Api) -> None:
    route = Route(api, "test")
    response = ResponseBody(route, [("content-type", content_type)], capture_content=True, max_content_chars=100)
    request = RequestBody(route)
    for i, piece in enumerate(_cut(body, cuts)):
        response.feed(piece, i)
        request.feed(piece, i)
        if i == 2:
            response.gap(10)
    call = GenAICall(request.finish() or _REQUEST, response.finish(), 0, 10)
    call.describe(_exchange(Role.SERVER, _connection("chat llama-3-8b", Role.SERVER)).span(SERVER), 50)
    call.metric_points(CLIENT, ("x", 1), None)


_REQUEST = RequestBody(Route(Api.OPENAI_CHAT, "openai"))
_REQUEST.feed(b'{"model": "m", "messages": []}', 0)
_REQUEST = _REQUEST.finish()  # type: ignore[assignment]


def test_stream_cut_off_midway_still_gives_a_span_with_what_was_seen() -> None:
    chunks = _connection("chat gpt-oss-20b", Role.CLIENT)
    responses = [i for i, c in enumerate(chunks) if c.direction is Direction.INGRESS]
    cut_after = responses[0] + 11  # the head, the role chunk and 10 content chunks
    exchange = _exchange(Role.CLIENT, chunks[: cut_after + 1])
    span = exchange.span(CLIENT)
    assert span.attributes["error.type"] == "connection_closed"
    assert span.status is StatusCode.ERROR
    assert span.attributes["otel_ebpf.gen_ai.output_chunks"] == 10
    assert span.attributes["gen_ai.usage.output_tokens"] == 10  # counted, and said so
    assert span.attributes["otel_ebpf.gen_ai.usage.approximate"] == ("output_tokens", "input_tokens")
    points = {p.instrument: p for p in exchange.metric_points(CLIENT)}
    assert points["gen_ai.client.operation.duration"].attributes["error.type"] == "connection_closed"


def test_a_gap_in_a_chunked_stream_counts_no_tokens_from_the_events_seen() -> None:
    """The kernel left out a chunked SSE response's syscalls from the 5th content event on (user
    space behind), its bytes reported as one event that copied none. The chunk framing is lost
    there, and the usage report with it; counted from the 4 events seen, the output tokens were 4
    of 25 (a review: 111-146 of 800), and the time per output token six times too long."""
    chunks = _connection("chat llama-3-8b", Role.CLIENT)
    whole = _span(Role.CLIENT, chunks)
    responses = [i for i, c in enumerate(chunks) if c.direction is Direction.INGRESS]
    first, last = responses[6], responses[-2]  # after the head, the role chunk and 4 content events
    hidden = chunks[first : last + 1]
    left_out = Chunk(Direction.INGRESS, hidden[-1].t_ns, b"", sum(len(c.data) + c.gap for c in hidden))
    exchange = _exchange(Role.CLIENT, [*chunks[:first], left_out, *chunks[last + 1 :]])
    span = exchange.span(CLIENT).attributes
    assert span["otel_ebpf.capture.gap"] is True
    assert span["otel_ebpf.gen_ai.output_chunks"] == 4
    assert "gen_ai.usage.output_tokens" not in span
    assert "otel_ebpf.gen_ai.time_per_output_token" not in span
    assert "output_tokens" not in span.get("otel_ebpf.gen_ai.usage.approximate", ())
    assert span["gen_ai.response.time_to_first_chunk"] == whole["gen_ai.response.time_to_first_chunk"]
    chunk_times = [p for p in exchange.metric_points(CLIENT) if p.instrument.endswith("time_per_output_chunk")]
    assert len(chunk_times) == 3


def _h2_stream_with_gap(hidden: range) -> HTTP2Exchange:
    """An HTTP/2 stream of 10 content events and a usage report, seen from its client, whose
    DATA frames carrying the events ``hidden`` were copied only as deep as their frame headers."""
    events = [b'data: {"model":"served","choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(10)]
    events.append(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":10}}\n\ndata: [DONE]\n\n')
    flip = {Direction.INGRESS: Direction.EGRESS, Direction.EGRESS: Direction.INGRESS}
    chunks = [replace(c, direction=flip[c.direction]) for c in _h2_exchange(events)]  # the client's view
    for event in hidden:
        at = 2 + event  # after the request and the response's HEADERS
        chunks[at] = Chunk(chunks[at].direction, chunks[at].t_ns, chunks[at].data[:9], len(chunks[at].data) - 9)
    (exchange,) = replay(chunks, Role.CLIENT, HTTP2()).exchanges
    return exchange  # type: ignore[return-value]


def test_a_gap_in_an_http2_stream_keeps_the_usage_report_but_times_no_chunk_across_it() -> None:
    exchange = _h2_stream_with_gap(range(4, 6))
    span = exchange.span(CLIENT).attributes
    assert span["otel_ebpf.gen_ai.output_chunks"] == 7  # the event after the gap too: it may be a broken one's end
    assert span["gen_ai.usage.output_tokens"] == 10  # the usage report's, seen after the gap
    assert "otel_ebpf.gen_ai.usage.approximate" not in span
    assert span["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.1 - 1e-6)
    assert span["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(0.010)
    chunk_times = [p.value for p in exchange.metric_points(CLIENT) if p.instrument.endswith("time_per_output_chunk")]
    assert chunk_times == pytest.approx([0.010] * 5)  # 0-3 and 7-9: none from 3 to 7


def test_a_gap_before_the_first_content_event_leaves_no_time_to_first_chunk() -> None:
    span = _h2_stream_with_gap(range(0, 2)).span(CLIENT).attributes
    assert span["otel_ebpf.gen_ai.output_chunks"] == 7
    assert span["gen_ai.usage.output_tokens"] == 10
    assert "gen_ai.response.time_to_first_chunk" not in span
    assert "otel_ebpf.gen_ai.time_per_output_token" not in span


def test_a_client_that_closes_after_the_streams_last_event_cut_nothing_short() -> None:
    # The openai SDK stops at [DONE] and closes the connection; when the server's last chunk
    # ("0\r\n\r\n") comes in a later segment, the client never reads it.
    chunks = _connection("chat gpt-oss-20b", Role.CLIENT)
    last = chunks[-1]
    assert last.data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    chunks = [*chunks[:-1], Chunk(last.direction, last.t_ns, last.data[: -len(b"0\r\n\r\n")])]
    exchange = _exchange(Role.CLIENT, chunks)
    span = exchange.span(CLIENT)
    assert span.status is StatusCode.UNSET and "error.type" not in span.attributes
    assert span.attributes["gen_ai.usage.output_tokens"] == TOKENS
    assert all("error.type" not in p.attributes for p in exchange.metric_points(CLIENT))
    # cut one event earlier (before [DONE]), the connection's end did cut the call short
    chunks[-1] = Chunk(last.direction, last.t_ns, last.data[: last.data.index(b"e\r\ndata: [DONE]")])
    assert _exchange(Role.CLIENT, chunks).span(CLIENT).attributes["error.type"] == "connection_closed"


def test_an_error_event_then_the_connections_end_is_the_events_error() -> None:
    events = [b'data: {"model":"m","choices":[{"delta":{"content":"t"}}]}\n\n']
    events.append(b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n')
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)  # no last chunk: the client left
    request = b'{"model": "m", "messages": [], "stream": true}'
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: llm\r\nContent-Length: %d\r\n\r\n" % len(request)
    response = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = [Chunk(Direction.EGRESS, 1_000, head + request), Chunk(Direction.INGRESS, 2_000, response + body)]
    span = _exchange(Role.CLIENT, chunks).span(CLIENT)
    assert span.status is StatusCode.ERROR and span.attributes["error.type"] == "overloaded_error"


def test_payload_cap_cuts_a_large_prompt_and_the_prefix_still_names_the_model() -> None:
    prompt = [{"role": "user", "content": "x" * 20000}]
    body = json.dumps({"model": "big-model", "stream": True, "max_tokens": 7, "messages": prompt}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(body)
    response = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 63\r\n\r\n"
        b'data: {"choices":[{"delta":{"content":"hi"}}],"model":"b"}\n\ndata: [DONE]\n\n'
    )
    chunks = capped([Chunk(Direction.INGRESS, 1, head + body), Chunk(Direction.EGRESS, 5, response)], 4096)
    span = _span(Role.SERVER, chunks)
    assert span["name"] == "chat big-model"
    assert span["gen_ai.request.max_tokens"] == 7
    assert span["otel_ebpf.gen_ai.stream"] is True
    assert "gen_ai.usage.input_tokens" not in span  # neither reported nor countable from a prefix


@pytest.mark.parametrize("body", [b"not json", b'{"model": "m"}', b"[1, 2]", b""])
def test_a_body_that_is_not_an_llm_request_stays_plain_http(body: bytes) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(body)
    chunks = [
        Chunk(Direction.INGRESS, 1, head + body),
        Chunk(Direction.EGRESS, 2, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"),
    ]
    span = _span(Role.SERVER, chunks)
    assert span["name"] == "POST /v1/chat/completions"
    assert not any(key.startswith("gen_ai.") for key in span)


def test_a_gateway_route_from_the_options_and_content_capture_with_redaction() -> None:
    protocol = HTTP1(
        {
            "genai": {
                "routes": {"/llm/invoke": {"api": "openai_chat", "provider": "my-gateway"}},
                "capture_content": True,
                "max_content_chars": 60,
            }
        }
    )
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "my api_key=hunter2 please"}]})
    head = b"POST /llm/invoke HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % len(body)
    answer = json.dumps(
        {
            "model": "m",
            "choices": [{"message": {"content": "ok " * 50}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 50},
        }
    ).encode()
    chunks = [
        Chunk(Direction.INGRESS, 1, head + body.encode()),
        Chunk(
            Direction.EGRESS,
            2,
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(answer), answer),
        ),
    ]
    span = _span(Role.SERVER, chunks, protocol)
    assert span["gen_ai.provider.name"] == "my-gateway"
    assert span["gen_ai.usage.output_tokens"] == 50
    assert "hunter2" not in span["gen_ai.input.messages"] and "REDACTED" in span["gen_ai.input.messages"]
    assert len(span["gen_ai.output.messages"]) == 60


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"genai": {"routes": {"llm": "openai_chat"}}}, "genai.routes: route 'llm' must be a path"),
        ({"genai": {"routes": {"/llm": "gpt"}}}, "genai.routes./llm: API style must be one of"),
        ({"genai": {"capture_content": "yes"}}, "genai.capture_content: expected true or false"),
        ({"genai": {"colour": 1}}, "genai.colour: unknown option"),
        ({"genai": {"max_content_chars": -1}}, "genai.max_content_chars: expected a non-negative integer"),
    ],
)
def test_bad_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        HTTP1(options)


def test_disabled_leaves_every_exchange_plain_http() -> None:
    assert genai_option(False) is None
    span = _span(Role.SERVER, _connection("chat llama-3-8b", Role.SERVER), HTTP1({"genai": {"enabled": False}}))
    assert span["name"] == "POST /v1/chat/completions"


def test_sse_decoder_bounds_an_event_and_resumes_after_it() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: " + b"x" * (MAX_EVENT + 10), 1) == []
    assert decoder.errors == 1
    assert decoder.feed(b" tail of the huge event\n\ndata: {}\n\n", 2) == [(2, b"{}")]
    assert decoder.feed(b": keep-alive comment\n\nevent: ping\ndata: a\ndata: b\r\n\r\n", 3) == [(3, b"a\nb")]


def test_ndjson_decoder_after_a_gap_skips_the_broken_line() -> None:
    decoder = NDJSONDecoder()
    assert decoder.feed(b'{"a": 1}\n{"b"', 1) == [(1, b'{"a": 1}')]
    decoder.gap()
    assert decoder.feed(b'2}\n{"c": 3}\n', 2) == [(2, b'{"c": 3}')]
    assert decoder.errors == 1


def _h2_exchange(sse: list[bytes], path: str = "/v1/chat/completions", request: dict | None = None) -> list[Chunk]:
    """A real h2 client and server (the ``h2`` library) exchanging one streamed call (a chat
    completion unless ``path`` and ``request`` say otherwise)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    request = request or {"model": "h2-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    body = json.dumps(request).encode()
    client.send_headers(
        1,
        [
            (":method", "POST"),
            (":path", path),
            (":scheme", "http"),
            (":authority", "llm"),
            ("content-type", "application/json"),
        ],
    )
    client.send_data(1, body, end_stream=True)
    chunks = [Chunk(Direction.INGRESS, 1_000, client.data_to_send())]
    server.receive_data(chunks[0].data)
    server.send_headers(1, [(":status", "200"), ("content-type", "text/event-stream")])
    chunks.append(Chunk(Direction.EGRESS, 2_000, server.data_to_send()))
    for i, event in enumerate(sse):
        server.send_data(1, event, end_stream=i == len(sse) - 1)
        chunks.append(Chunk(Direction.EGRESS, 100_000_000 + i * 10_000_000, server.data_to_send()))
    return chunks


def test_http2_streams_are_read_too() -> None:
    events = [b'data: {"model":"served","choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(5)]
    events.append(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5}}\n\ndata: [DONE]\n\n')
    exchanges = replay(_h2_exchange(events), Role.SERVER, HTTP2()).exchanges
    assert len(exchanges) == 1
    span = exchanges[0].span(SERVER)
    assert span.name == "chat h2-model"
    assert span.attributes["gen_ai.usage.output_tokens"] == 5
    assert span.attributes["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.1 - 1e-6)
    assert span.attributes["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(0.010)
    points = [p.instrument for p in exchanges[0].metric_points(SERVER)]
    assert points.count("gen_ai.server.time_per_output_token") == 1


def test_http2_a_client_that_cancels_after_done_cut_nothing_short() -> None:
    events = [b'data: {"model":"served","choices":[{"delta":{"content":"t%d"}}]}\n\n' % i for i in range(3)]
    for last, error in ((b"data: [DONE]\n\n", None), (b": keep-alive\n\n", "CANCEL")):
        chunks = _h2_exchange([*events, last, b""])[:-1]  # the server's last, empty DATA never went out
        cancel = struct.pack(">I", 4)[1:] + bytes((0x3, 0)) + struct.pack(">II", 1, 0x8)  # RST_STREAM CANCEL
        chunks.append(Chunk(Direction.INGRESS, 200_000_000, cancel))
        span = replay(chunks, Role.SERVER, HTTP2()).exchanges[0].span(SERVER)
        assert span.attributes.get("error.type") == error
        assert span.status is (StatusCode.ERROR if error else StatusCode.UNSET)


def test_http2_carries_the_named_event_dialects_too() -> None:
    def event(kind: str, **data: Any) -> bytes:
        return b"event: %s\ndata: %s\n\n" % (kind.encode(), json.dumps({"type": kind, **data}).encode())

    message = {"id": "msg_h2", "model": "claude-served", "usage": {"input_tokens": 4, "output_tokens": 1}}
    events = [event("message_start", message=message)]
    events += [event("content_block_delta", index=0, delta={"type": "text_delta", "text": f"t{i}"}) for i in range(4)]
    events.append(event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 4}))
    events.append(event("message_stop"))
    request = {"model": "claude", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    exchanges = replay(_h2_exchange(events, "/v1/messages", request), Role.SERVER, HTTP2()).exchanges
    span = exchanges[0].span(SERVER)
    assert span.name == "chat claude" and span.attributes["gen_ai.provider.name"] == "anthropic"
    assert span.attributes["gen_ai.usage.input_tokens"] == 4 and span.attributes["gen_ai.usage.output_tokens"] == 4
    assert span.attributes["gen_ai.response.finish_reasons"] == ("end_turn",)
    # the first delta is the second DATA frame: 10 ms after message_start, 100 ms after the request
    assert span.attributes["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.11 - 1e-6)
    assert span.attributes["otel_ebpf.gen_ai.time_per_output_token"] == pytest.approx(0.010)
