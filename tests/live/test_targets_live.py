"""Live BPF: processes chosen by ``--pid`` and ``--exe``, as a user names them.

- A server's master process (``--pid``): the workers it started before the agent serve its
  requests, and they are traced too.
- A server started by its ``#!`` line (``uvicorn``, ``gunicorn``): its executable is the
  interpreter, but its name (comm) is the script's, and ``--exe`` matches that name.
- A client that lives for one request (``curl``): the kernel makes it a target at its exec, so its
  connection is traced before user space has even read the exec event.
- A process no glob names is not traced, though it talks to a traced one.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent
from tests.live.test_http_live import _wait_for_file
from tests.live.test_prometheus_live import _free_port
from tests.otlp_receiver import load_file_spans

pytestmark = pytest.mark.bpf
WORKLOAD = Path(__file__).with_name("http_workload.py")
SERVER_NAME = "inference-api"  # a comm: at most 15 characters
CURLS = 3
NGINX_CONF = """worker_processes 2;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/px; fastcgi_temp_path {tmp}/fc;
  uwsgi_temp_path {tmp}/uw; scgi_temp_path {tmp}/sc;
  server {{ listen 127.0.0.1:{port}; location / {{ return 200 "ok\\n"; }} }}
}}
"""


def test_pid_of_a_master_traces_the_workers_it_started_before_the_agent(tmp_path: Path) -> None:
    port = _free_port()
    (tmp_path / "nginx.conf").write_text(NGINX_CONF.format(tmp=tmp_path, port=port))
    master = subprocess.Popen(
        ["nginx", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "error.log")]
        + ["-g", f"daemon off; pid {tmp_path}/nginx.pid;"],
    )
    agent = None
    try:
        workers: list[int] = []
        for _ in range(200):  # both workers forked: before the agent, as on any running node
            children = Path(f"/proc/{master.pid}/task/{master.pid}/children").read_text().split()
            if len(children) == 2:
                workers = [int(child) for child in children]
                break
            time.sleep(0.05)
        assert len(workers) == 2
        agent = start_file_agent(tmp_path, master.pid, "{}\n")
        for i in range(10):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/r/{i}", timeout=30) as response:
                assert response.status == 200
        stderr = stop_file_agent(agent)
    finally:
        if master.poll() is None:
            master.send_signal(signal.SIGQUIT)  # graceful: the workers end too
            master.wait(timeout=30)
        kill_all(agent)
    assert "kernel drop counters: {'ringbuf_full': 0" in stderr
    spans = [s for s in load_file_spans(tmp_path / "out") if s["kind"] == "SERVER"]
    assert sorted(s["attributes"]["url.path"] for s in spans) == sorted(f"/r/{i}" for i in range(10))
    assert {s["resource"]["process.pid"] for s in spans} <= set(workers)


@pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
def test_exe_names_a_script_by_its_name_and_catches_a_quick_client(tmp_path: Path, socket_mode: str) -> None:
    script = tmp_path / SERVER_NAME
    script.write_text(
        f"#!{sys.executable}\nimport runpy, sys\nsys.argv = [{str(WORKLOAD)!r}, 'serve', sys.argv[1]]\n"
        f"runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    script.chmod(0o755)
    server = subprocess.Popen([str(script), str(tmp_path / "port")])
    agent = None
    try:
        port = _wait_for_file(tmp_path / "port", server)
        assert Path(f"/proc/{server.pid}/comm").read_text().strip() == SERVER_NAME
        agent = start_file_agent(
            tmp_path, (), f"capture:\n  socket_mode: {socket_mode}\n", args=["--exe", SERVER_NAME, "--exe", "curl"]
        )
        curl_pids = []
        for i in range(CURLS):
            curl = subprocess.run(
                ["sh", "-c", f"curl -s -o /dev/null http://127.0.0.1:{port}/items/{i} & echo $!; wait"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            )
            curl_pids.append(int(curl.stdout))
        untraced = subprocess.run(  # python3, named by no glob: its CLIENT span must not appear
            [sys.executable, "-c", f"import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/missing')"],
            capture_output=True,
            timeout=30,
        )
        assert b"404" in untraced.stderr
        stderr = stop_file_agent(agent)
    finally:
        kill_all(server, agent)
    assert "kernel drop counters: {'ringbuf_full': 0" in stderr

    spans = load_file_spans(tmp_path / "out")
    served = Counter(s["attributes"]["url.path"] for s in spans if s["kind"] == "SERVER")
    assert served == Counter([*(f"/items/{i}" for i in range(CURLS)), "/missing"])
    assert {s["resource"]["process.pid"] for s in spans if s["kind"] == "SERVER"} == {server.pid}
    clients = {s["resource"]["process.pid"]: s for s in spans if s["kind"] == "CLIENT"}
    assert sorted(clients) == sorted(curl_pids)  # each curl, and not the python3 client
    for span in clients.values():
        assert span["attributes"]["http.response.status_code"] == 200
        assert span["resource"]["process.executable.name"] == "curl"
