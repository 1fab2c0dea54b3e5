"""Live BPF: a native program's C++ frames reach the OTLP receiver demangled.

The workload is C built by the test with gcc (so no C++ compiler is needed): its hot functions
are *named* with Itanium-mangled names, which is all a C++ compiler would have put in the symbol
table. The CPU profile must name them as C++ does. Built with -O0 and frame pointers, so the leaf
sets up a frame too and its caller is not skipped by frame-pointer unwinding.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.live.test_tls_live import _start_agent, _stop
from tests.otlp_receiver import OTLPReceiver

pytestmark = pytest.mark.bpf

SOURCE = r"""
#include <stdio.h>
#include <unistd.h>
volatile unsigned long sink;
/* otl::model::forward(int) and its caller otl::Server::serve(otl::Request const&) */
__attribute__((noinline)) void _ZN3otl5model7forwardEi(int n) {
    for (unsigned long i = 0; i < 2000000UL * n; i++) sink += i * i;
}
__attribute__((noinline)) void _ZN3otl6Server5serveERKNS_7RequestE(const void *request) {
    (void)request;
    _ZN3otl5model7forwardEi(1);
    sink++;
}
int main(void) {
    printf("ready\n");
    fflush(stdout);
    for (;;) _ZN3otl6Server5serveERKNS_7RequestE(0);
}
"""


def test_cxx_frames_are_demangled_in_otlp_profiles(tmp_path: Path) -> None:
    (tmp_path / "model.c").write_text(SOURCE)
    binary = tmp_path / "model"
    subprocess.run(["gcc", "-O0", "-fno-omit-frame-pointer", "-o", str(binary), str(tmp_path / "model.c")], check=True)
    workload = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
    agent: subprocess.Popen | None = None
    try:
        assert workload.stdout.readline() == "ready\n"
        with OTLPReceiver() as receiver:
            agent = _start_agent(
                tmp_path,
                receiver,
                "auto",
                *("--pid", str(workload.pid), "--profile"),
                env={"OTEL_EBPF_PROFILING_INTERVAL": "2"},
                timeout=180,  # two BPF programs to compile on a busy machine
            )
            time.sleep(3)
            _stop(agent)
            assert receiver.wait_for(lambda r: bool(r.requests("profiles")), 10)
            strings = {s for request in receiver.requests("profiles") for s in request.dictionary.string_table}
    finally:
        for process in (workload, agent):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    ours = sorted(s for s in strings if "otl" in s or "main" in s)
    assert "otl::model::forward(int)" in strings, ours
    assert "otl::Server::serve(otl::Request const&)" in strings, ours
    assert not any(s.startswith("_ZN3otl") for s in strings)
