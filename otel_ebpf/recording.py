"""Recordings of the decoded event stream, for replay and bug reports.

A recording is JSON Lines: a header object, then one object per event (``{"type": "ConnData",
...fields}``) with bytes in base64. Replaying one through the pipeline produces the same spans and
metrics as the live run did, because the pipeline depends on nothing but these events.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterator
from typing import IO, Any

from . import __version__
from .pipeline.events import (
    ConnClose,
    ConnData,
    ConnOpen,
    Event,
    HttpRequestCounts,
    KernelLoss,
    KernelTrace,
    ProcessExit,
    ProcessInfo,
    TcpFlow,
    TcpHealthCounts,
)
from .protocol import Direction, Endpoint, Role, Transport

FORMAT = "otel-ebpf-events"
VERSION = 1
_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        ProcessInfo,
        ConnOpen,
        ConnData,
        KernelTrace,
        ConnClose,
        ProcessExit,
        KernelLoss,
        HttpRequestCounts,
        TcpHealthCounts,
    )
}


class RecordingError(ValueError):
    """The file is not a recording this version can read; the message says where and why."""


@dataclasses.dataclass(frozen=True)
class RecordingHeader:
    host_name: str
    agent_version: str = __version__
    # the kernel counted HTTP/1 requests (HttpRequestCounts events): exchanges add no durations
    kernel_http_metrics: bool = False


def _encode_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, (Direction, Role, Transport)):
        return value.value
    if isinstance(value, Endpoint):
        return [value.address, value.port, value.socket_id] if value.socket_id else [value.address, value.port]
    return value


def encode_event(event: Event) -> str:
    fields = {f.name: _encode_value(getattr(event, f.name)) for f in dataclasses.fields(event)}
    return json.dumps({"type": type(event).__name__, **fields}, separators=(",", ":"))


def _decode_fields(cls: type, obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in obj and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING):
            continue  # a field added since the recording was made: its default
        value = obj[f.name]
        if f.name in ("data", "tail"):
            value = base64.b64decode(value)
        elif f.name == "direction":
            value = Direction(value)
        elif f.name == "role":
            value = None if value is None else Role(value)
        elif f.name == "transport":
            value = Transport(value)
        elif f.name in ("local", "peer"):
            value = None if value is None else Endpoint(value[0], *map(int, value[1:]))
        elif f.name in ("buckets", "rtt_buckets"):
            value = tuple(int(n) for n in value)
        elif f.name == "drops":
            value = tuple((str(reason), int(n)) for reason, n in value)
        elif f.name == "flows":
            value = tuple(TcpFlow(str(cgroup), *(int(n) for n in counts)) for cgroup, *counts in value)
        out[f.name] = value
    return out


def decode_event(line: str) -> Event:
    obj = json.loads(line)
    cls = _TYPES.get(obj.get("type"))
    if cls is None:
        raise RecordingError(f"unknown event type {obj.get('type')!r}")
    return cls(**_decode_fields(cls, obj))


class RecordingWriter:
    def __init__(self, stream: IO[str], header: RecordingHeader) -> None:
        self._stream = stream
        stream.write(json.dumps({"format": FORMAT, "version": VERSION, **dataclasses.asdict(header)}) + "\n")

    def write(self, events: list[Event]) -> None:
        if events:
            self._stream.write("".join(encode_event(e) + "\n" for e in events))
            self._stream.flush()


def read_recording(stream: IO[str]) -> tuple[RecordingHeader, Iterator[Event]]:
    """Header and a lazy iterator of events; raises RecordingError naming the bad line."""
    first = stream.readline()
    try:
        header = json.loads(first)
    except json.JSONDecodeError as exc:
        raise RecordingError(f"line 1: not a recording header ({exc})") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordingError(f"line 1: not an {FORMAT} recording")
    if header.get("version") != VERSION:
        raise RecordingError(f"line 1: recording version {header.get('version')} (this agent reads {VERSION})")

    def events() -> Iterator[Event]:
        for number, line in enumerate(stream, start=2):
            if not line.strip():
                continue
            try:
                yield decode_event(line)
            except (ValueError, KeyError, TypeError) as exc:
                raise RecordingError(f"line {number}: {exc}") from exc

    return RecordingHeader(
        header.get("host_name", ""), header.get("agent_version", ""), bool(header.get("kernel_http_metrics", False))
    ), events()
