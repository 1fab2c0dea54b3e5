"""Record the Responses and Messages dialects for the GenAI replay tests (a one-off script, not a test).

Runs ``examples/llm_server.py`` (first token after 300 ms, then one every 40 ms, 8 tokens) and each
Responses and Messages call of ``examples/llm_clients.py`` (the real ``openai`` and ``anthropic``
clients) through the plugin kit's tee proxy (``otel_ebpf.protocol_testing.TeeProxy``), one
connection per call, into ``data/genai/<call>.json``. Re-record with::

    .venv/bin/python -m tests.protocols.record_genai_dialects [call ...]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from otel_ebpf.protocol_testing import TeeProxy, save_recording
from tests.live.test_genai_live import DIALECTS

REPO = Path(__file__).parents[2]
DATA = Path(__file__).parent / "data" / "genai"
TOKENS = 8
CALLS = DIALECTS  # the calls the live test makes of each dialect


def main(names: list[str]) -> None:
    unknown = sorted(set(names) - set(CALLS))
    if unknown:
        raise SystemExit(f"no such call: {', '.join(unknown)} (calls: {', '.join(CALLS)})")
    DATA.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        server = subprocess.Popen(
            [sys.executable, str(REPO / "examples" / "llm_server.py"), str(port_file), "--tokens", str(TOKENS)],
            stdout=subprocess.DEVNULL,
        )
        try:
            while not port_file.exists() or not port_file.read_text().strip():
                time.sleep(0.05)
            port = int(port_file.read_text())
            for name in names or CALLS:
                proxy = TeeProxy(("127.0.0.1", port))
                client = [sys.executable, str(REPO / "examples" / "llm_clients.py"), str(proxy.port)]
                out = subprocess.run(
                    [*client, "--only", name, "--tokens", str(TOKENS)], check=True, capture_output=True
                )
                save_recording(DATA / f"{name}.json", name, out.stdout.decode().strip(), proxy.wait())
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main(sys.argv[1:])
