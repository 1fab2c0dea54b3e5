"""Record real Redis byte streams for the plugin's tests (a one-off script, not a test).

A real redis-server (Debian's) on loopback and real clients (redis-py over RESP2 and RESP3, a raw
socket for inline commands), with the plugin kit's tee proxy (``otel_ebpf.protocol_testing``)
between them. Each scenario is one client connection, saved as ``data/<name>.json`` (directions
seen from the server). Re-record with::

    python tests/record_redis.py [scenario ...]

then check ``EXPECTED`` in ``test_redis_recordings.py`` (chunk indices) against the new files.
"""

from __future__ import annotations

import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from otel_ebpf.protocol_testing import TeeProxy, save_recording

sys.path.insert(0, str(Path(__file__).parent))
from redis_server import RedisServer

DATA = Path(__file__).parent / "data"
BIG = bytes(range(256)) * 80  # 20480 bytes: past the default 4 KiB capture cap


def _client(port: int, protocol: int) -> redis.Redis:
    """A client whose pool reuses one connection (the proxy relays one), closed by ``connection_pool.disconnect()``."""
    return redis.Redis(port=port, protocol=protocol, max_connections=1)


def _commands(port: int) -> None:
    r = _client(port, 2)
    r.set("user:1", "alice")
    r.get("user:1")
    r.get("missing")
    r.incr("visits")
    try:
        r.lpush("user:1", "x")  # WRONGTYPE
    except redis.ResponseError:
        pass
    r.execute_command("SELECT", 1)
    r.set("db1-key", "v")
    r.delete("db1-key")
    r.connection_pool.disconnect()


def _pipeline(port: int) -> None:
    r = _client(port, 2)
    pipe = r.pipeline(transaction=False)
    pipe.set("k1", "v1").set("big", BIG).get("k1").incr("n").get("big").hset("h", mapping={"a": 1, "b": 2})
    pipe.execute()
    try:
        r.incr("k1")  # ERR value is not an integer
    except redis.ResponseError:
        pass
    r.connection_pool.disconnect()


def _resp3(port: int) -> None:
    r = _client(port, 3)
    r.hset("h3", mapping={"a": "1", "b": "2"})
    r.hgetall("h3")  # map
    r.sadd("s3", "x", "y")
    r.smembers("s3")  # set
    r.zadd("z3", {"m": 1.5})
    r.zscore("z3", "m")  # double
    r.get("missing")  # null
    r.execute_command("EVAL", "return true", 0)  # boolean
    r.execute_command("CLIENT", "INFO")  # verbatim string
    r.connection_pool.disconnect()


def _pubsub(protocol: int) -> Callable[[int], None]:
    def run(port: int) -> None:
        r = _client(port, protocol)
        p = r.pubsub()
        p.subscribe("news", "sport")
        while p.get_message(timeout=1) is not None:
            pass
        publisher = redis.Redis(port=SERVER_PORT[0], protocol=2)
        publisher.publish("news", "hello")
        publisher.publish("sport", "goal")
        publisher.close()
        for _ in range(2):
            p.get_message(timeout=5)
        p.ping()
        p.get_message(timeout=5)
        p.unsubscribe()
        while p.get_message(timeout=1) is not None:
            pass
        p.close()
        r.connection_pool.disconnect()

    return run


def _inline(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port)) as s:
        for line in (b"PING\r\n", b"SET greeting hello\r\n", b"GET greeting\r\n"):
            s.sendall(line)
            s.recv(100)
            time.sleep(0.01)


SCENARIOS: dict[str, tuple[str, Callable[[int], None]]] = {
    "commands": (
        "redis-py RESP2: SET, GET, a miss, INCR, a WRONGTYPE error, SELECT 1 and two commands in db 1",
        _commands,
    ),
    "pipeline": ("redis-py RESP2: a 6-command pipeline with a 20 KiB value set and read back, then an ERR", _pipeline),
    "resp3": ("redis-py RESP3: HELLO 3, a map, a set, a double, a null, a boolean, a verbatim string", _resp3),
    "pubsub_resp2": ("redis-py RESP2: SUBSCRIBE to two channels, two messages, PING, UNSUBSCRIBE", _pubsub(2)),
    "pubsub_resp3": ("redis-py RESP3: SUBSCRIBE to two channels, two push messages, PING, UNSUBSCRIBE", _pubsub(3)),
    "inline": ("a raw socket: inline PING, SET and GET", _inline),
}
SERVER_PORT = [0]


def main(names: list[str]) -> None:
    DATA.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp)) as server:
        SERVER_PORT[0] = server.port
        for name in names or list(SCENARIOS):
            description, client = SCENARIOS[name]
            proxy = TeeProxy(("127.0.0.1", server.port))
            client(proxy.port)
            save_recording(DATA / f"{name}.json", name, description, proxy.wait())


if __name__ == "__main__":
    main(sys.argv[1:])
