"""A small FastAPI service on uvicorn, with no OpenTelemetry in it: the workload of
``bench/fastapi_load.py``, run as is, under ``opentelemetry-instrument``, or with the agent attached.

    python examples/fastapi_service.py --port 8000
    opentelemetry-instrument python examples/fastapi_service.py --port 8000

Routes:

    GET /items/{item_id}   200 {"id": ..., "name": ..., "price": ..., "tags": [...]} (422 when not an int)
    GET /health            200 {"status": "ok"}

One uvicorn worker (asyncio, h11 unless httptools is installed), access log off. Prints
``listening on http://HOST:PORT`` once the socket accepts connections (``--port 0`` picks a free port).
"""

from __future__ import annotations

import argparse
import socket

import uvicorn
from fastapi import FastAPI

app = FastAPI(title="items")


@app.get("/items/{item_id}")
async def read_item(item_id: int) -> dict:
    return {"id": item_id, "name": f"item-{item_id}", "price": round(item_id * 1.25, 2), "tags": ["bench", "small"]}


@app.get("/health")
async def health() -> dict:
    return {"status": "ok"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets that say so (proto 0 would
    # leave Nagle on, and each response would wait ~40 ms for the client's delayed ACK).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(1024)  # accepting (into the backlog) from here on
    host, port = sock.getsockname()[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
