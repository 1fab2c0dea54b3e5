"""Discovery, USDT notes and record decoding of the GPU probe (otel_ebpf/probes/usdt.py,
gpu_discovery.py, gpu_records.py), without root."""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from otel_ebpf.gpu.calls import BY_SYMBOL, FUNCTION_SYMBOLS, Library
from otel_ebpf.probes import gpu_discovery, gpu_records, usdt
from otel_ebpf.profiles import cpython
from tests.gpu.standin.build import build

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def standin() -> Path:
    return build()


def _dynamic_functions(path: Path) -> set[str]:
    with open(path, "rb") as f:
        table = ELFFile(f).get_section_by_name(".dynsym")
        return {
            s.name for s in table.iter_symbols() if s["st_shndx"] != "SHN_UNDEF" and s["st_info"]["type"] == "STT_FUNC"
        }


def test_standins_define_the_real_symbol_names(standin: Path) -> None:
    expected = {
        "libcudart.so.12": {s for s in FUNCTION_SYMBOLS if BY_SYMBOL[s].library is Library.RUNTIME},
        "libcuda.so.1": {s for s in FUNCTION_SYMBOLS if BY_SYMBOL[s].library is Library.DRIVER}
        - {"cuMemcpy", "cuMemcpyAsync"},
        "libnccl.so.2": {s for s in FUNCTION_SYMBOLS if BY_SYMBOL[s].library is Library.NCCL}
        - {"ncclCommInitRankConfig"},
    }
    for name, symbols in expected.items():
        assert symbols <= _dynamic_functions(standin / name), name


def test_the_real_wheels_define_what_we_hook() -> None:
    import nvidia.cuda_runtime

    root = Path(nvidia.cuda_runtime.__path__[0]).parent
    runtime = {s for s in FUNCTION_SYMBOLS if BY_SYMBOL[s].library is Library.RUNTIME}
    assert runtime <= _dynamic_functions(root / "cuda_runtime" / "lib" / "libcudart.so.12")
    nccl = {s for s in FUNCTION_SYMBOLS if BY_SYMBOL[s].library is Library.NCCL}
    with open(root / "nccl" / "lib" / "libnccl.so.2", "rb") as f:  # NCCL exports them as weak symbols
        table = ELFFile(f).get_section_by_name(".dynsym")
        defined = {s.name for s in table.iter_symbols() if s["st_shndx"] != "SHN_UNDEF"}
    assert nccl <= defined


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8@%rax", [usdt.UsdtArg(8, 1, 0)]),
        ("-4@%r12d 8@%rbx", [usdt.UsdtArg(-4, 1, 12), usdt.UsdtArg(8, 1, 1)]),
        (
            "8@-24(%rbp) 4@(%rsp) -8@$5",
            [usdt.UsdtArg(8, 2, 6, -24), usdt.UsdtArg(4, 2, 7, 0), usdt.UsdtArg(-8, 3, 0, 5)],
        ),
        ("8@16(%r13)", [usdt.UsdtArg(8, 2, 13, 16)]),
    ],
)
def test_usdt_argument_locations(text: str, expected: list) -> None:
    assert list(usdt.parse_usdt_args(text)) == expected


@pytest.mark.parametrize("text", ["8@%fs:8", "8@(%rax,%rbx,8)", "8@%xmm0", "eight"])
def test_unsupported_usdt_arguments_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        usdt.parse_usdt_args(text)


def test_pytorch_allocator_probes_and_semaphores_are_read_from_the_notes(standin: Path) -> None:
    path = standin / "libc10_cuda.so"
    probes = {p.name: p for p in usdt.read_usdt_probes(str(path))}
    assert set(probes) == {"malloc", "free"} and {p.provider for p in probes.values()} == {"pytorch"}
    assert len(probes["malloc"].args) == 4 and probes["malloc"].args[1].size == -4  # int device
    assert len(probes["free"].args) == 1
    with open(path, "rb") as f:
        elf = ELFFile(f)
        symbols = {s.name: s["st_value"] for s in elf.get_section_by_name(".symtab").iter_symbols()}
        segments = [
            (s["p_vaddr"], s["p_memsz"], s["p_offset"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"
        ]
        data = path.read_bytes()

    def offset(vaddr: int) -> int:
        return next(vaddr - start + off for start, size, off in segments if start <= vaddr < start + size)

    assert probes["malloc"].semaphore_offset == offset(symbols["pytorch_malloc_semaphore"])
    assert probes["free"].semaphore_offset == offset(symbols["pytorch_free_semaphore"])
    # the probe site is the nop the macro emits, inside c10_cuda_alloc / c10_cuda_free
    assert data[probes["malloc"].offset] == 0x90 and data[probes["free"].offset] == 0x90
    assert usdt.read_usdt_probes(str(standin / "libcudart.so.12")) == []
    assert usdt.read_usdt_probes("/nonexistent") == []


def test_python_frames_are_decoded_as_python_stack_h_writes_them() -> None:
    assert gpu_records._PY_FRAME.size == ctypes.sizeof(cpython.PyFrame)  # noqa: SLF001
    stack = cpython.py_stack_type(gpu_records.PY_MAX_FRAMES)
    assert gpu_records.event_size(gpu_records.PY_MAX_FRAMES) - gpu_records.event_size(0) == ctypes.sizeof(stack) - 8


def _record(op: int, *, flags: int = 0, user: tuple = (), python: tuple = (), py_frames: int = 4) -> bytes:
    head = struct.pack("<QQIIIiIi", 1_000, 250, 10, 11, op, 2, flags, 8 * len(user))
    args = struct.pack("<7QQ", 1, 2, 3, 4, 5, 6, 7, 0xABC)
    stack = struct.pack(f"<{gpu_records.USER_FRAMES}Q", *user, *[0] * (gpu_records.USER_FRAMES - len(user)))
    py = struct.pack("<II", len(python), 1) + b"".join(struct.pack("<QQQ", *f) for f in python)
    py += b"\0" * (24 * (py_frames - len(python)))
    return head + args + stack + py


def test_records_decode_into_calls_and_process_events() -> None:
    raw = _record(1, flags=2, user=(0x10, 0x20), python=((0xC0DE, 0xC0DE + 40, 0),))
    call = gpu_records.decode(raw, 5_000, 4)
    assert (call.ts_ns, call.pid, call.tid, call.op) == (6_000, 10, 11, 1)
    assert call.args == (1, 2, 3, 4, 5, 6, 7)
    assert call.user_stack == (0x10, 0x20) and call.python_stack == ((0xC0DE, 0xC0DE + 40, 0),)
    # an entry record is cut after the Python frames it has
    cut = raw[: gpu_records.event_size(1)]
    assert gpu_records.decode(cut, 5_000, 4).python_stack == call.python_stack
    from_usdt = gpu_records.decode(_record(9, flags=1), 0, 4)
    assert from_usdt.duration_ns == 0  # a USDT probe has no return
    assert gpu_records.decode(_record(255), 0, 4) == gpu_records.ProcessEvent(1_000, 10, True)
    assert gpu_records.decode(_record(0), 0, 4) == gpu_records.ProcessEvent(1_000, 10, False)
    assert gpu_records.decode(raw[:50], 0, 4) is None
    ret = struct.pack("<QQIIIiIiQ", 1_000, 250, 10, 11, 1, 0, 4, 0, 0xABC)
    assert gpu_records.decode(ret, 5_000, 4) == gpu_records.CallReturn(6_000, 10, 11, 1, 0, 250, 0xABC)


def test_entries_and_returns_pair_on_thread_operation_and_time() -> None:
    pairing = gpu_records.CallPairing(capacity=2)
    entry = gpu_records.decode(_record(1, flags=2), 0, 4)
    pairing.entry(entry)
    done = pairing.complete(gpu_records.CallReturn(entry.ts_ns, 10, 11, 1, 2, 999, 0xF00))
    assert (done.ret, done.duration_ns, done.out, done.args) == (2, 999, 0xF00, entry.args)
    assert pairing.complete(gpu_records.CallReturn(entry.ts_ns, 10, 11, 1, 0, 1, 0)) is None  # already paired
    for ts in (1, 2, 3):  # the oldest of three waiting entries goes: its return never came
        pairing.entry(gpu_records.decode(_record(5, flags=2), ts - 1_000, 4))
    assert (pairing.entries_unpaired, pairing.returns_unpaired) == (1, 1)


def test_attacher_hooks_each_file_once_and_names_the_processes_that_map_it(standin: Path) -> None:
    program = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import ctypes, sys; "
            f"ctypes.CDLL({str(standin / 'libcudart.so.12')!r}); print('up', flush=True); "
            "sys.stdin.readline()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert program.stdout.readline() == "up\n"
        attached: list[tuple[str, str]] = []
        failing = str(standin / "libcuda.so.1")

        def attach(path: str, symbol: str) -> None:
            if path == failing:
                raise Exception("Failed to attach BPF to uprobe")  # what BCC raises
            attached.append((path, symbol))

        attacher = gpu_discovery.GpuAttacher(
            lambda path: gpu_discovery.gpu_symbols(path) if "standin" in path else set(),
            usdt.read_usdt_probes,
            attach,
            lambda path, p: None,
        )
        pids = attacher.scan([program.pid, os.getpid()])
        assert pids == {program.pid}
        cudart = str(standin / "libcudart.so.12")
        assert {s for p, s in attached if p == cudart} == {
            s for s in FUNCTION_SYMBOLS if BY_SYMBOL[s].library is Library.RUNTIME
        }
        assert failing in attacher.libraries.failed and failing not in attacher.libraries.hooked
        assert attacher.libraries.by_library() == {"runtime": 1}
        before = len(attached)
        assert attacher.scan([program.pid]) == {program.pid}  # known files are not looked at again
        assert len(attached) == before
        assert gpu_discovery.maps_gpu_library(program.pid) and not gpu_discovery.maps_gpu_library(os.getpid())
    finally:
        program.communicate("\n", timeout=10)
