"""Live BPF: sidecar mode. An agent in a pod's PID namespace traces that pod's processes, by the pids
its own /proc shows, and nothing outside it (issue 15, item 2).

The pod is stood for by ``unshare --pid --fork --mount-proc``: inside it a server, a client and the
agent (no ``--pid``: the whole namespace is the target). An identical server and client run outside
at the same time. Every request inside must be one SERVER and one CLIENT span whose resource names
the process by its pid inside the namespace; nothing of the pair outside may appear.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import AGENT, REPO
from tests.otlp_receiver import load_file_spans

pytestmark = pytest.mark.bpf

CALLS = 5
PEERS = [sys.executable, "-m", "tests.live.keepalive_peers"]
# The pod: server and agent; once the agent is ready and the test says go, the client; then the
# agent is stopped. Prints {"server": pid, "client": pid, "agent": pid} as its namespace numbers them.
POD = r"""
import json, os, signal, subprocess, sys, time
out, calls, peers, agent_cmd = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
server = subprocess.Popen(peers + ["serve", "127.0.0.1"], stdout=subprocess.PIPE, text=True)
server_pid, port = server.stdout.readline().split()
ready = os.path.join(out, "ready")
agent = subprocess.Popen(agent_cmd + ["run", "--exporter", "file", "--output", out, "--ready-file", ready])
deadline = time.monotonic() + 120
while not (os.path.exists(ready) and open(ready).read().strip()):
    assert agent.poll() is None and time.monotonic() < deadline, "agent did not get ready"
    time.sleep(0.05)
print("ready", flush=True)
sys.stdin.readline()
inside = peers + ["client", "127.0.0.1", port, "/inside", calls]
client = subprocess.run(inside, capture_output=True, text=True, check=True)
time.sleep(1.5)  # the agent's next poll and export
agent.send_signal(signal.SIGINT)
assert agent.wait(60) == 0
server.kill()
print(json.dumps({"server": int(server_pid), "client": int(client.stdout.split()[0]), "agent": agent.pid}), flush=True)
"""


def test_an_agent_in_a_pid_namespace_traces_that_namespace_only(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    pod = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", POD, str(out), str(CALLS)]
        + [json.dumps(PEERS), json.dumps(AGENT)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    outside_server = subprocess.Popen([*PEERS, "serve", "127.0.0.1"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert pod.stdout.readline() == "ready\n", "the pod's agent did not start"
        _, outside_port = outside_server.stdout.readline().split()
        pod.stdin.write("go\n")
        pod.stdin.flush()
        subprocess.run([*PEERS, "client", "127.0.0.1", outside_port, "/outside", str(CALLS)], cwd=REPO, check=True)
        pids = json.loads(pod.stdout.readline())
        assert pod.wait(60) == 0
    finally:
        for process in (pod, outside_server):
            process.kill()
            process.wait()

    spans = load_file_spans(out / "traces.jsonl")
    paths = {s["attributes"].get("url.path") or s["attributes"]["url.full"].rsplit("/", 1)[-1] for s in spans}
    assert "/outside" not in paths and "outside" not in paths, "a process outside the pod was traced"
    by_kind = {
        kind: sorted(s["resource"]["process.pid"] for s in spans if s["kind"] == kind) for kind in ("SERVER", "CLIENT")
    }
    # every request inside, from both sides, each named by its pid inside the namespace
    assert by_kind == {"SERVER": [pids["server"]] * CALLS, "CLIENT": [pids["client"]] * CALLS}, (by_kind, pids)
    assert pids["server"] < 10 and pids["agent"] < 10  # namespace pids, not the host's
