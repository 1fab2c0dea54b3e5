"""procfs helpers against this machine's real /proc, with real sockets and processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from otel_ebpf import procfs
from otel_ebpf.protocol import Endpoint, Role


def test_socket_tuples_of_a_connected_pair() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            with accepted:
                client_port = client.getsockname()[1]
                pid = os.getpid()
                got = procfs.socket_tuples({pid: [client.fileno(), accepted.fileno(), 10**6]})
                got_client, got_server = got[(pid, client.fileno())], got[(pid, accepted.fileno())]
                assert len(got) == 2
    client_end, server_end = Endpoint("127.0.0.1", client_port), Endpoint("127.0.0.1", port)
    assert got_client == procfs.SocketTuple(client_end, server_end, Role.CLIENT)
    assert got_server == procfs.SocketTuple(server_end, client_end, Role.SERVER)


def test_socket_tuples_ipv6_and_non_sockets() -> None:
    with socket.create_server(("::1", 0), family=socket.AF_INET6) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("::1", port)) as client:
            got = procfs.socket_tuples({os.getpid(): [client.fileno()]}).get((os.getpid(), client.fileno()))
    assert got is not None and got.peer == Endpoint("::1", port)
    r, w = os.pipe()
    try:
        assert procfs.socket_tuples({os.getpid(): [r]}) == {}
    finally:
        os.close(r)
        os.close(w)
    assert procfs.socket_tuples({2**22: [3]}) == {}  # no such process


def test_process_identity_reads_only_resource_variables() -> None:
    env = {
        "PATH": os.environ["PATH"],
        "OTEL_SERVICE_NAME": "checkout",
        "SECRET_TOKEN": "x",
        "OTEL_RESOURCE_ATTRIBUTES": "team=ml,deployment.environment=prod",
    }
    child = subprocess.Popen(
        [sys.executable, "-c", "print(flush=True); import time; time.sleep(30)"], env=env, stdout=subprocess.PIPE
    )
    try:
        child.stdout.readline()  # exec has completed
        ident = procfs.process_identity(child.pid)
        assert ident is not None
        assert ident.environment == {
            "OTEL_SERVICE_NAME": "checkout",
            "OTEL_RESOURCE_ATTRIBUTES": "team=ml,deployment.environment=prod",
        }
        assert ident.executable == os.path.realpath(sys.executable)
        assert ident.command_line == f"{sys.executable} -c print(flush=True); import time; time.sleep(30)"
        assert procfs.executable_matches(child.pid, ["python3*"])
        assert not procfs.executable_matches(child.pid, ["nginx"])
    finally:
        child.kill()
        child.wait()
    assert procfs.process_identity(child.pid) is None


def test_a_process_is_matched_by_its_name_too(tmp_path: Path) -> None:
    """A script run by its ``#!`` line: the executable is the interpreter, the name is the script's."""
    script = tmp_path / "model-server"
    script.write_text(f"#!{sys.executable}\nprint(flush=True)\nimport time\ntime.sleep(30)\n")
    script.chmod(0o755)
    child = subprocess.Popen([str(script)], stdout=subprocess.PIPE)
    try:
        child.stdout.readline()
        assert procfs.executable_matches(child.pid, ["model-server"])
        assert procfs.executable_matches(child.pid, ["model-*"])
        assert not procfs.executable_matches(child.pid, ["model"])
        assert procfs.process_name(child.pid) == "model-server"
    finally:
        child.kill()
        child.wait()
    assert procfs.process_name(child.pid) is None  # reaped: gone


def test_selected_pids_take_in_the_living_descendants() -> None:
    """A master that started its workers (and they theirs) before the agent: all are selected."""
    tree = (
        "import subprocess, sys, time\n"
        'code = \'import subprocess, sys, time; print(subprocess.Popen([sys.executable, "-c", '
        '"import time; time.sleep(30)"]).pid, flush=True); time.sleep(30)\'\n'
        "child = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE)\n"
        "print(child.pid, child.stdout.readline().decode().strip(), flush=True)\n"
        "time.sleep(30)\n"
    )
    master = subprocess.Popen([sys.executable, "-c", tree], stdout=subprocess.PIPE, start_new_session=True)
    try:
        worker, grandchild = map(int, master.stdout.readline().split())
        assert procfs.selected_pids([master.pid], []) == {master.pid, worker, grandchild}
        assert procfs.selected_pids([worker], []) == {worker, grandchild}
        assert procfs.selected_pids([2**22], []) == set()  # gone (or never was): nothing
        assert procfs.parent_pid(grandchild) == worker
    finally:
        os.killpg(master.pid, signal.SIGKILL)
        master.wait()


def test_selected_pids_without_children_files_go_by_every_process_parent(tmp_path: Path) -> None:
    """Kernels without CONFIG_PROC_CHILDREN: the tree is rebuilt from each process's stat."""
    for pid, parent in ((10, 1), (11, 10), (12, 11), (13, 1)):
        (tmp_path / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (a (b) c) S {parent} {pid} {pid} 0 -1\n")
    assert procfs.selected_pids([10], [], proc=str(tmp_path)) == {10, 11, 12}
    assert procfs.selected_pids([12, 13], [], proc=str(tmp_path)) == {12, 13}


def test_exact_names_are_the_globs_a_comm_can_equal() -> None:
    globs = ["curl", "vllm*", "/usr/bin/node", "python3.1[01]", "a-name-of-16-chr", "model-server", "é"]
    assert procfs.exact_names(globs) == ["curl", "model-server", "é"]


def test_exited_but_unreaped_process_has_no_identity() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):  # wait until it is a zombie, without reaping it
            with open(f"/proc/{child.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.01)
        assert procfs.process_identity(child.pid) is None
    finally:
        child.wait()


def test_tcp_sockets_lists_connected_and_listening_fds() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            sockets = procfs.tcp_sockets(os.getpid())
            assert client.fileno() in sockets.connected
            assert sockets.listening[listener.fileno()] == port
