"""Load for the demo service: N mixed requests over one keep-alive connection (``http.client``).

    python examples/http_client.py --port 8080 --requests 200

The mix is seeded, so two runs send the same requests: mostly reads of users and items, inference
calls, health checks, and a few errors (500) and unknown paths (404). Prints a count per route and
status, and exits non-zero if the service could not be reached.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import uuid
from collections import Counter

# (weight, method, route label); the label is what the summary counts by.
MIX = [
    (40, "GET", "/users/{id}"),
    (20, "GET", "/items/{uuid}"),
    (25, "POST", "/predict"),
    (5, "GET", "/health"),
    (5, "GET", "/error"),
    (5, "GET", "/missing"),
]


def _request_for(route: str, rng: random.Random) -> tuple[str, bytes | None]:
    if route == "/users/{id}":
        return f"/users/{rng.randint(1, 500)}", None
    if route == "/items/{uuid}":
        return f"/items/{uuid.UUID(int=rng.getrandbits(128), version=4)}", None
    if route == "/predict":
        inputs = [round(rng.uniform(-1, 1), 3) for _ in range(rng.randint(1, 16))]
        return "/predict", json.dumps({"inputs": inputs}).encode()
    return route, None


def run(host: str, port: int, requests: int, seed: int = 1) -> Counter[tuple[str, str, int]]:
    """Send ``requests`` requests; returns counts per (method, route, status)."""
    rng = random.Random(seed)
    weights = [w for w, _, _ in MIX]
    counts: Counter[tuple[str, str, int]] = Counter()
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        for _ in range(requests):
            _, method, route = rng.choices(MIX, weights)[0]
            path, body = _request_for(route, rng)
            headers = {"User-Agent": "demo-client/1.0", "Accept": "application/json"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                # The server may close an idle keep-alive connection: reconnect once and retry.
                conn.close()
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
            response.read()  # drain, or the next request on this connection cannot be sent
            counts[(method, route, response.status)] += 1
    finally:
        conn.close()
    return counts


def main(argv: list[str] | None = None) -> int:
    """Command line: send the requests, print the counts; 1 when the service is unreachable."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--requests", "-n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        counts = run(args.host, args.port, args.requests, args.seed)
    except OSError as exc:
        print(f"http_client: cannot talk to {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    for (method, route, status), n in sorted(counts.items()):
        print(f"{n:5d}  {method:<4} {route:<14} {status}")
    print(f"{sum(counts.values()):5d}  requests in total")
    return 0


if __name__ == "__main__":
    sys.exit(main())
