"""Triton / KServe v2 inference over gRPC: the taps for ``inference.GRPCInferenceService``.

``ModelInfer`` (unary) and ``ModelStreamInfer`` (Triton's bidirectional streaming extension, the
way decoupled LLM backends stream tokens) carry protobuf messages, not JSON: the taps split the
DATA bytes into gRPC messages (:class:`.framing.GrpcMessageDecoder`) and read the few fields they
need straight off the wire (:func:`otel_ebpf.protowire.fields`), field numbers from Triton's
``grpc_service.proto``:

* ``ModelInferRequest``: ``model_name`` 1, ``model_version`` 2, ``inputs`` 5 (each ``name`` 1,
  ``datatype`` 2, ``shape`` 3, ``contents`` 5), ``raw_input_contents`` 7 (one per input, in order).
* ``ModelInferResponse``: ``model_name`` 1, ``model_version`` 2, ``id`` 3, ``parameters`` 4,
  ``outputs`` 5, ``raw_output_contents`` 6.
* ``ModelStreamInferResponse``: ``error_message`` 1, ``infer_response`` 2.

Tensors are told by name, those of Triton's vLLM and TensorRT-LLM backends; a call is an LLM call
only when its request has a ``text_input`` or ``input_ids`` input (a ``ModelInfer`` of an image
classifier stays a plain gRPC call). What each name gives is in ``docs/genai.md``.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

from otel_ebpf.protowire import LEN, VARINT, fields, packed_varints

from .body import RequestBody, ResponseBody
from .framing import GrpcMessageDecoder
from .routes import Api, Route
from .types import GenAIRequest

TEXT_INPUT, INPUT_IDS = "text_input", "input_ids"
MAX_TOKENS_INPUTS = ("max_tokens", "request_output_len")  # TensorRT-LLM (ensemble, raw model)
SAMPLING_PARAMETERS = "sampling_parameters"  # vLLM backend: JSON, ``max_tokens`` among them
TEXT_OUTPUT, OUTPUT_IDS = "text_output", "output_ids"
NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS, FINISH_REASON = "num_input_tokens", "num_output_tokens", "finish_reason"
FINAL_RESPONSE = "triton_final_response"  # a response parameter: the request's last response
STREAM_ERROR = "inference_error"  # error.type of a stream response with an error_message
MAX_ERROR_MESSAGE = 256
_INT_FORMATS = {
    "INT8": "b",
    "INT16": "h",
    "INT32": "i",
    "INT64": "q",
    "UINT8": "B",
    "UINT16": "H",
    "UINT32": "I",
    "UINT64": "Q",
}
_INT_CONTENTS = frozenset((2, 3, 4, 5))  # InferTensorContents int, int64, uint, uint64
_BYTES_CONTENTS = 8
_REQUEST_RAW, _RESPONSE_RAW = 7, 6


@dataclass(slots=True)
class _Tensor:
    name: str = ""
    datatype: str = ""
    shape: tuple[int, ...] = ()
    contents: bytes = b""  # its InferTensorContents message
    raw: bytes | None = None  # its raw_*_contents entry, when the message used those

    def elements(self) -> int | None:
        """Elements by its shape; ``None`` for a shape with a negative (unknown) dimension."""
        return math.prod(self.shape) if all(dim >= 0 for dim in self.shape) else None

    def ints(self) -> list[int]:
        """An integer tensor's values (raw: little-endian by datatype; else the contents' varints)."""
        if self.raw is not None:
            fmt = _INT_FORMATS.get(self.datatype)
            if fmt is None:
                return []
            count = len(self.raw) // struct.calcsize(fmt)
            return list(struct.unpack_from(f"<{count}{fmt}", self.raw))
        values: list[int] = []
        for number, wire_type, value in fields(self.contents):
            if number in _INT_CONTENTS:
                if wire_type == LEN:
                    values += packed_varints(value)  # type: ignore[arg-type]
                elif wire_type == VARINT:
                    values.append(value)  # type: ignore[arg-type]
        return values

    def strings(self) -> list[str]:
        """A BYTES tensor's elements (raw: each a 4-byte little-endian length and its bytes)."""
        if self.raw is None:
            return [
                value.decode("utf-8", "replace")  # type: ignore[union-attr]
                for number, wire_type, value in fields(self.contents)
                if number == _BYTES_CONTENTS and wire_type == LEN
            ]
        raw, pos, out = self.raw, 0, []
        while pos + 4 <= len(raw):
            size = int.from_bytes(raw[pos : pos + 4], "little")
            out.append(raw[pos + 4 : pos + 4 + size].decode("utf-8", "replace"))
            pos += 4 + size
        return out


@dataclass(slots=True)
class _Infer:
    """The fields read of a ``ModelInferRequest`` or ``ModelInferResponse``."""

    model: str | None = None
    version: str | None = None
    id: str | None = None
    final: bool = False
    tensors: dict[str, _Tensor] = field(default_factory=dict)
    malformed: bool = False  # a whole message that did not parse to its end


def _text(value: Any) -> str | None:
    return value.decode("utf-8", "replace") or None if isinstance(value, bytes) else None


def _tensor(payload: bytes) -> _Tensor:
    tensor = _Tensor()
    shape: list[int] = []
    for number, _, value in fields(payload):
        if number == 1:
            tensor.name = _text(value) or ""
        elif number == 2:
            tensor.datatype = _text(value) or ""
        elif number == 3:  # repeated int64: packed, or one value per field
            values = packed_varints(value) if isinstance(value, bytes) else [value]
            shape += (v - (1 << 64) if v >= 1 << 63 else v for v in values)
        elif number == 5 and isinstance(value, bytes):
            tensor.contents = value
    tensor.shape = tuple(shape)
    return tensor


def _is_final(entry: bytes) -> bool:
    """A ``parameters`` map entry (key 1, InferParameter value 2) that is triton_final_response=true."""
    key = value = None
    for number, _, found in fields(entry):
        if number == 1:
            key = found
        elif number == 2:
            value = found
    if key != FINAL_RESPONSE.encode() or not isinstance(value, bytes):
        return False
    return any(number == 1 and found == 1 for number, _, found in fields(value))  # bool_param


def _read_infer(payload: bytes, whole: bool, raw_field: int) -> _Infer:
    """The request's or response's fields; a message the capture cut gives the fields before the
    cut (their raw contents come last and are then missing)."""
    infer = _Infer()
    tensors: list[_Tensor] = []
    raws: list[bytes] = []
    try:
        for number, wire_type, value in fields(payload):
            if wire_type != LEN:
                continue
            if number == 1:
                infer.model = _text(value)
            elif number == 2:
                infer.version = _text(value)
            elif number == 3:
                infer.id = _text(value)
            elif number == 4:
                infer.final = infer.final or _is_final(value)  # type: ignore[arg-type]
            elif number == 5:
                tensors.append(_tensor(value))  # type: ignore[arg-type]
            elif number == raw_field:
                raws.append(value)  # type: ignore[arg-type]
    except ValueError:
        infer.malformed = whole
    for index, tensor in enumerate(tensors):
        tensor.raw = raws[index] if index < len(raws) else None
        infer.tensors.setdefault(tensor.name, tensor)
    return infer


def _max_tokens(tensors: dict[str, _Tensor]) -> int | None:
    for name in MAX_TOKENS_INPUTS:
        if name in tensors:
            values = tensors[name].ints()
            return values[0] if values and values[0] >= 0 else None
    if SAMPLING_PARAMETERS in tensors:
        texts = tensors[SAMPLING_PARAMETERS].strings()
        try:
            parameters = json.loads(texts[0]) if texts else None
        except ValueError:
            return None
        value = parameters.get("max_tokens") if isinstance(parameters, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
    return None


class TritonRequestBody(RequestBody):
    """A ``ModelInfer`` / ``ModelStreamInfer`` request: its first message says what the call is.

    A stream may carry several requests (``tritonclient``'s ``start_stream`` keeps one open for
    every ``async_stream_infer``); the call is read from the first and the rest only counted.
    ``errors`` (framing lost, a whole message that does not parse) is known after :meth:`finish`.
    """

    def __init__(self, route: Route, capture_content: bool = False) -> None:
        super().__init__(route, capture_content)
        self.requests = 0
        self._messages = GrpcMessageDecoder()
        self._first: tuple[int, bytes, bool] | None = None

    def feed(self, data: bytes, timestamp_ns: int) -> None:
        self._take(self._messages.feed(data, timestamp_ns))

    def gap(self, length: int | None) -> None:
        self._take(self._messages.gap(length))

    def _take(self, messages: list[tuple[int, bytes, bool]]) -> None:
        if messages and self._first is None:
            self._first = messages[0]
        self.requests += len(messages)

    def finish(self) -> GenAIRequest | None:
        """The call as an LLM call, or ``None`` when its first request has no text or token input."""
        self.errors = self._messages.errors
        if self._first is None:
            return None
        sent_ns, payload, whole = self._first
        try:
            infer = _read_infer(payload, whole, _REQUEST_RAW)
            tensors = infer.tensors
            if TEXT_INPUT not in tensors and INPUT_IDS not in tensors:
                return None
            prompt = "".join(tensors[TEXT_INPUT].strings()) if TEXT_INPUT in tensors else None
            max_tokens = _max_tokens(tensors)
        except ValueError:  # a tensor's contents that do not parse
            self.errors += whole
            return None
        self.errors += infer.malformed
        ids = tensors.get(INPUT_IDS)
        return GenAIRequest(
            route=self.route,
            model=infer.model,
            stream=self.route.api is Api.TRITON_STREAM,
            max_tokens=max_tokens,
            include_usage=False,
            input_chars=len(prompt) if prompt is not None and whole else None,
            truncated=not whole,
            input_text=json.dumps(prompt, ensure_ascii=False) if self._capture and prompt is not None else None,
            model_version=infer.version,
            input_tokens=ids.elements() if ids is not None else None,
            sent_ns=sent_ns,
        )


class TritonResponseBody(ResponseBody):
    """A ``ModelInfer`` response, or the stream of ``ModelStreamInfer`` responses, read message by
    message: a response with output (``text_output`` text or ``output_ids``) is a content event."""

    def __init__(self, route: Route, headers: Any, capture_content: bool = False, max_content_chars: int = 0) -> None:
        super().__init__(route, headers, capture_content, max_content_chars)
        self._streamed = route.api is Api.TRITON_STREAM
        self._messages = GrpcMessageDecoder()

    @property
    def errors(self) -> int:
        return self.decode_errors + self._messages.errors

    def feed(self, data: bytes, timestamp_ns: int) -> None:
        for ts, payload, whole in self._messages.feed(data, timestamp_ns):
            self._message(payload, ts, whole)

    def gap(self, length: int | None) -> None:
        for ts, payload, whole in self._messages.gap(length):
            self._message(payload, ts, whole)

    def _message(self, payload: bytes, ts: int, whole: bool) -> None:
        self.events += 1
        try:
            if self._streamed:
                payload = self._stream_response(payload)
                if not payload:
                    return
            self._infer_response(_read_infer(payload, whole, _RESPONSE_RAW), ts)
        except ValueError:
            self.decode_errors += whole

    def _stream_response(self, payload: bytes) -> bytes:
        """A ``ModelStreamInferResponse``: notes its error; its ``infer_response``."""
        inner = b""
        for number, wire_type, value in fields(payload):
            if wire_type != LEN:
                continue
            if number == 1 and value:
                self.error_type = STREAM_ERROR
                self.error_message = value.decode("utf-8", "replace")[:MAX_ERROR_MESSAGE]  # type: ignore[union-attr]
            elif number == 2:
                inner = value  # type: ignore[assignment]
        return inner

    def _infer_response(self, infer: _Infer, ts: int) -> None:
        self.decode_errors += infer.malformed
        self._take_model(infer.model)
        self.model_version = infer.version or self.model_version
        self.response_id = infer.id or self.response_id
        self.finished = self.finished or infer.final
        tensors = infer.tensors
        if NUM_OUTPUT_TOKENS in tensors:  # per response: the tokens it adds
            self.output_tokens = (self.output_tokens or 0) + sum(tensors[NUM_OUTPUT_TOKENS].ints())
        if NUM_INPUT_TOKENS in tensors:
            counts = tensors[NUM_INPUT_TOKENS].ints()
            self.input_tokens = counts[0] if counts else self.input_tokens
        if FINISH_REASON in tensors:
            self.finish_reasons += [reason for reason in tensors[FINISH_REASON].strings() if reason]
        text = "".join(tensors[TEXT_OUTPUT].strings()) if TEXT_OUTPUT in tensors else None
        ids = tensors.get(OUTPUT_IDS)
        if text or (ids is not None and ids.elements() != 0) or (text is not None and not self._streamed):
            self._content(text or "", ts)
