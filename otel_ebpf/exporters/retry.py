"""What an OTLP answer means for the batch that got it, and how long to wait before trying again.

Sans-I/O: the transports (:mod:`.transport`) turn an HTTP status and headers, a gRPC status code
and trailing metadata, or a connection error into a :class:`SendResult` with the functions here;
:class:`Backoff` turns a run of retryable failures into delays. Nothing here touches a socket, so
all of it is tested with plain values.

Which failures are retryable follows the OTLP specification ("Failures", "Throttling"): HTTP 429,
502, 503 and 504 and connection errors; gRPC ``CANCELLED``, ``DEADLINE_EXCEEDED``, ``ABORTED``,
``OUT_OF_RANGE``, ``UNAVAILABLE``, ``DATA_LOSS``, and ``RESOURCE_EXHAUSTED`` when the server says it
will recover (a ``RetryInfo`` detail, as the Collector's exporter decides too). Everything else
(HTTP 400, gRPC ``INVALID_ARGUMENT``, ...) will fail the same way again and is not retried.
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from google.rpc import error_details_pb2, status_pb2

RETRYABLE_HTTP = frozenset({429, 502, 503, 504})
RETRYABLE_GRPC = frozenset({"CANCELLED", "DEADLINE_EXCEEDED", "ABORTED", "OUT_OF_RANGE", "UNAVAILABLE", "DATA_LOSS"})
_GRPC_STATUS_DETAILS = "grpc-status-details-bin"


@dataclass(frozen=True)
class SendResult:
    """One attempt's outcome. ``reason`` names a failure for logs and self-metrics (``http_503``,
    ``grpc_unavailable``, ``connection_error``); ``retry_after_s`` is the server's own delay."""

    ok: bool
    retryable: bool = False
    reason: str = "ok"
    retry_after_s: float | None = None


SENT = SendResult(ok=True)


def retryable(reason: str, retry_after_s: float | None = None) -> SendResult:
    return SendResult(ok=False, retryable=True, reason=reason, retry_after_s=retry_after_s)


def permanent(reason: str) -> SendResult:
    return SendResult(ok=False, retryable=False, reason=reason)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP-date (RFC 9110 §10.2.3);
    None when absent or unreadable (then the backoff decides)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None or when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def classify_http(status: int, headers: Mapping[str, str], now: float | None = None) -> SendResult:
    """The outcome of an HTTP/protobuf export that got ``status``; ``headers`` keys lower-case."""
    if 200 <= status < 300:
        return SENT
    if status in RETRYABLE_HTTP:
        return retryable(f"http_{status}", parse_retry_after(headers.get("retry-after"), now))
    return permanent(f"http_{status}")


def _retry_info_delay(trailing: Sequence[tuple[str, str | bytes]]) -> float | None:
    for key, value in trailing:
        if key != _GRPC_STATUS_DETAILS or not isinstance(value, bytes):
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except Exception:  # noqa: BLE001 -- a garbled detail means "no RetryInfo", not a crash
            return None
        for detail in status.details:
            info = error_details_pb2.RetryInfo()
            if detail.Unpack(info):
                return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


def classify_grpc(code_name: str, trailing: Sequence[tuple[str, str | bytes]] = ()) -> SendResult:
    """The outcome of a gRPC export that ended with status ``code_name`` (``grpc.StatusCode.name``)
    and ``trailing`` metadata (where a ``RetryInfo`` detail travels)."""
    if code_name == "OK":
        return SENT
    delay = _retry_info_delay(trailing)
    reason = f"grpc_{code_name.lower()}"
    if code_name in RETRYABLE_GRPC or (code_name == "RESOURCE_EXHAUSTED" and delay is not None):
        return retryable(reason, delay)
    return permanent(reason)


class Backoff:
    """Exponential backoff with jitter: attempt ``n`` (from 0) waits a random time in
    ``[d/2, d]`` with ``d = min(max_s, initial_s * 2**n)``, so agents that lost the same backend do
    not all come back at once. A server's own delay (``Retry-After``, ``RetryInfo``) is honoured,
    but never beyond ``max_s``: a hostile or confused server cannot park the queue for an hour."""

    def __init__(self, initial_s: float, max_s: float, rng: Callable[[], float] = random.random) -> None:
        if not 0 < initial_s <= max_s:
            raise ValueError(f"need 0 < initial_s <= max_s, got {initial_s} and {max_s}")
        self.initial_s = initial_s
        self.max_s = max_s
        self._rng = rng

    def delay(self, attempt: int, server_delay_s: float | None = None) -> float:
        if server_delay_s is not None:
            return min(max(0.0, server_delay_s), self.max_s)
        ceiling = min(self.max_s, self.initial_s * 2 ** min(attempt, 62))
        return ceiling * (0.5 + 0.5 * self._rng())
