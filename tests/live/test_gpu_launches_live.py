"""Live BPF: driver launches by kernel name and graph launches by kernel count, on the stand-in
CUDA libraries, from a native C++ program with a known ledger (tests/gpu/standin/launch_ledger.cpp).

What a real OTLP receiver gets must equal the ledger exactly: launches per demangled kernel name
(named through cuModuleGetFunction, cuLibraryGetKernel and cuKernelGetFunction, launched by
cuLaunchKernel and cuLaunchKernelEx), launches captured into a graph (on the capturing stream, not
on another), graph launches per API and kernel-node count (built node by node or captured; unknown
for a graph with a child graph), and the program's own C++ frames demangled in the launch stacks.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.gpu.standin.build import build
from tests.live.test_gpu_live import _final, _functions, _traced_run

pytestmark = pytest.mark.bpf
KERNELS = {  # the ledger's key -> the name the kernel was given, demangled
    "flash": "flash::flash_fwd_kernel(float const*, float const*, float*)",
    "gemm": "void cutlass::Kernel<cutlass::gemm::kernel::Gemm<float> >(cutlass::gemm::kernel::Gemm<float>::Params)",
    "triton": "triton_poi_fused_add_0",
}
CAPTURED_KERNEL = "ledger::captured_kernel(int)"  # a runtime launch: named by its host stub's symbol


def test_driver_launches_are_named_and_graph_launches_counted_exactly(tmp_path: Path) -> None:
    program = subprocess.Popen(
        [str(build() / "launch_ledger")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert program.stdout.readline() == "ready\n"
    run = _traced_run(tmp_path, program)
    ledger, metrics = run.summary, run.metrics
    pid = ledger["pid"]
    assert ledger["failures"] == 0 and ledger["not_found"] == 500

    series = {
        tuple(sorted(p["attributes"].items()))
        for p in metrics["cuda.kernel.launches"]
        if p["resource"].get("process.pid") == pid
    }
    launched = {attributes: _final(metrics, "cuda.kernel.launches", pid, **dict(attributes)) for attributes in series}
    expected: dict[tuple, int] = {(("cuda.api", "driver"),): ledger["driver"]["unnamed"]}
    for key, name in KERNELS.items():
        expected[(("cuda.api", "driver"), ("cuda.kernel.name", name))] = ledger["driver"][key]
        if ledger["captured"].get(key):
            captured = (("cuda.api", "driver"), ("cuda.kernel.name", name), ("cuda.launch.kind", "captured"))
            expected[captured] = ledger["captured"][key]
    captured = (("cuda.api", "runtime"), ("cuda.kernel.name", CAPTURED_KERNEL), ("cuda.launch.kind", "captured"))
    expected[captured] = ledger["captured"]["stub"]
    assert launched == expected
    graphs = {
        tuple(sorted(p["attributes"].items())): p["value"]
        for p in metrics["cuda.graph.launches"]
        if p["resource"].get("process.pid") == pid
    }
    expected = {}
    for api, nodes, times in ledger["graphs"]:
        known = {"cuda.graph.kernel_nodes": nodes} if nodes is not None else {}
        expected[tuple(sorted({"cuda.api": api, **known}.items()))] = times
    assert graphs == expected
    drops = {p["attributes"]["reason"]: p["value"] for p in metrics["otel_ebpf.kernel.drops"]}
    assert drops["gpu_ringbuf_full"] == 0 and drops["gpu_returns_without_entry"] == 0
    assert drops["gpu_nested_calls"] > 0  # cudaGraphLaunch -> cuGraphLaunch, counted once

    # the launches profile: each kernel under the program's own (demangled) C++ frames
    launches: dict[tuple[str, str | None], int] = {}
    for profile in run.profiles:
        if profile.resource.get("process.pid") != pid or profile.period_type.type != "cuda_launch":
            continue
        for key, values in profile.samples.items():
            attributes = dict(key.attributes)
            label = attributes.get("cuda.kernel.name") or attributes.get("cuda.launch.kind")
            where = next(f for f in _functions(key.stack) if f.startswith("ledger::") or f == "main")
            launches[(where, label)] = launches.get((where, label), 0) + values[0]
    launch, launch_ex = "ledger::launch(void*, int, int*, void*)", "ledger::launch_ex(void*, int, int*, void*)"
    graph = "ledger::launch_graph(void*, int, bool, int*)"
    assert launches == {
        (launch, KERNELS["flash"]): 7,
        (launch_ex, KERNELS["flash"]): 3 + ledger["captured"]["flash"],
        (launch, KERNELS["gemm"]): 4,
        (launch_ex, KERNELS["gemm"]): 5,
        (launch, KERNELS["triton"]): ledger["driver"]["triton"] + ledger["captured"]["triton"],
        (launch, None): 2,
        ("main", CAPTURED_KERNEL): 2,
        (graph, "graph"): sum(times for _, _, times in ledger["graphs"]),
    }
