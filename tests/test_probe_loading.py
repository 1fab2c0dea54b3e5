"""probes/loading.py: how a probe's program is assembled (source files, headers, -D flags), and,
with BCC as root, what load_program leaves in the loaded program (settings, targets) and how
TargetTable keeps a pid map."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from otel_ebpf.probes import loading
from otel_ebpf.probes.cpu import CpuProbe
from otel_ebpf.probes.gpu import GpuProbe
from otel_ebpf.probes.socket import SocketProbe
from otel_ebpf.probes.verbs import VerbsProbe

BPF_DIR = Path(str(resources.files("otel_ebpf.bpf")))


def test_program_source_joins_the_files_in_order_with_their_headers_inlined() -> None:
    source = loading.program_source(["socket_trace.c", "tls_trace.c"])
    socket_text, tls_text = (BPF_DIR / "socket_trace.c").read_text(), (BPF_DIR / "tls_trace.c").read_text()
    assert source == loading.inline_headers(socket_text + tls_text)
    assert '#include "targets.h"' in socket_text
    assert '#include "targets.h"' not in source  # inlined: BCC rewrites map calls in the main file only
    assert "static __always_inline int traced_process(u32 tgid)" in source


def test_program_cflags_formats_defines_then_cflags_then_the_pid_namespace() -> None:
    flags = loading.program_cflags(
        {"MAX_TARGETS": 16, "NAME": "x", "FD_TRACKING": True, "INJECT": False, "MAX_TCP_SERIES": None},
        ["-DTCP_SND_UNA=1"],
    )
    assert flags == [
        "-DMAX_TARGETS=16",
        "-DNAME=x",
        "-DFD_TRACKING",
        "-DTCP_SND_UNA=1",
        "-Wno-macro-redefined",
        *loading.pid_namespace_flags(),
    ]


def test_pid_namespace_flags_name_a_namespace_other_than_the_initial_one(tmp_path: Path) -> None:
    """The flags name the namespace file's device and inode, unless it is the initial namespace."""
    ns = tmp_path / "pid"
    ns.write_text("")
    st = os.stat(ns)
    assert loading.pid_namespace_flags(str(ns)) == [f"-DPIDNS_DEV={st.st_dev}", f"-DPIDNS_INO={st.st_ino}"]


def test_ring_buffer_pages_are_a_power_of_two() -> None:
    assert [loading.ring_buffer_pages(kb) for kb in (1, 4, 8, 12, 1024, 1028)] == [1, 1, 2, 4, 256, 512]


@pytest.mark.parametrize("probe", [SocketProbe, CpuProbe, GpuProbe, VerbsProbe])
def test_the_agents_probes_have_the_probe_shape(probe: type) -> None:
    assert issubclass(probe, loading.Probe)


# ---- with BCC ------------------------------------------------------------------------------------

TINY = "int tiny(void *ctx) { return 0; }\n"


@pytest.fixture(scope="module")
def verbs_program() -> Iterator[Any]:
    """bpf/verbs_trace.c (targets.h's two settings, a targets and a post_pids map), loaded small."""
    bpf = loading.load_program(
        ["verbs_trace.c"],
        "verbs test program",
        defines={"RINGBUF_PAGES": 1, "POST_RINGBUF_PAGES": 1, "MAX_TARGETS": 16},
        verify=["enter_post_send"],
        settings={loading.SET_AGENT_TGID: 4242, loading.SET_FILTER_PIDS: 1},
        targets=[7, 9],
    )
    yield bpf
    loading.close_program(bpf)


def _pids(table: Any) -> set[int]:
    return {key.value for key in table.keys()}


@pytest.mark.bpf
def test_load_program_writes_settings_and_targets(verbs_program: Any) -> None:
    settings = verbs_program["settings"]
    assert [settings[ctypes.c_int(i)].value for i in range(2)] == [4242, 1]
    assert _pids(verbs_program["targets"]) == {7, 9}
    assert b"enter_post_send" in verbs_program.funcs  # loaded through the verifier already


@pytest.mark.bpf
def test_target_table_keeps_the_map_and_its_pids(verbs_program: Any) -> None:
    table = loading.TargetTable(verbs_program["post_pids"])
    table.update([1, 2, 3])
    assert _pids(verbs_program["post_pids"]) == table.pids == {1, 2, 3}
    table.replace({3, 4})
    assert _pids(verbs_program["post_pids"]) == table.pids == {3, 4}
    table.discard(3)
    table.discard(5)  # never there: nothing to do
    assert _pids(verbs_program["post_pids"]) == table.pids == {4}
    assert 4 in table and 3 not in table and len(table) == 1
    # the pids load_program wrote are known as present; ``in`` asks the kernel
    targets = loading.TargetTable(verbs_program["targets"], [7, 9])
    verbs_program["targets"][ctypes.c_uint32(11)] = ctypes.c_uint8(1)  # as a fork would
    assert targets.pids == {7, 9} and 11 in targets
    targets.discard(11)


@pytest.mark.bpf
def test_compile_errors_name_what_failed() -> None:
    with pytest.raises(RuntimeError, match=r"cannot load the tiny probe: .*otel-ebpf doctor"):
        loading.compile_program("int tiny(void *ctx) { return undefined_name; }\n", [], "tiny probe")


@pytest.mark.bpf
def test_verify_loads_the_named_programs_now() -> None:
    bpf = loading.compile_program(TINY, [], "tiny probe", ["tiny"])
    try:
        assert b"tiny" in bpf.funcs
    finally:
        loading.close_program(bpf)
    with pytest.raises(RuntimeError, match="cannot load the tiny probe"):
        loading.compile_program(TINY, [], "tiny probe", ["no_such_program"])
