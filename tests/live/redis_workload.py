"""The redis-py side of the Redis live test: waits for "go" on stdin (so the agent can attach to
this process first), then runs single commands, a pipeline, an error and SELECT, and prints "done"."""

from __future__ import annotations

import sys

import redis


def main(port: int) -> None:
    print("ready", flush=True)
    assert sys.stdin.readline() == "go\n"
    r = redis.Redis(port=port, protocol=3, single_connection_client=True)
    r.set("user:1", "alice")
    assert r.get("user:1") == b"alice"
    r.incr("visits")
    pipe = redis.Redis(port=port, protocol=3).pipeline(transaction=False)  # a connection of its own
    pipe.set("k1", "v1").get("k1").incr("n").hset("h", "f", "v").delete("k1")
    assert pipe.execute() == [True, b"v1", 1, 1, 1]
    try:
        r.lpush("user:1", "x")
    except redis.ResponseError as exc:
        assert str(exc).startswith("WRONGTYPE")
    else:
        raise AssertionError("LPUSH on a string succeeded")
    r.execute_command("SELECT", 1)
    r.set("db1-key", "v")
    print("done", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
