"""Training-loop stand-ins, each with one problem ``otel-ebpf advise`` should name (and one without).

They drive the stand-in CUDA libraries (``tests/gpu/standin``) through
``examples/gpu_training_standin.py``'s :class:`Gpu`. Each prints ``ready``, waits for a line on
stdin (so an agent can attach first), runs, prints ``done`` and keeps its memory until a second
line (so the agent sees leaked buffers alive).

    python -m tests.advise.workloads SCENARIO
"""

from __future__ import annotations

import ctypes
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from gpu_training_standin import MIB, Dim3, Gpu

from tests.gpu.standin.build import build

HOST_TO_DEVICE, DEVICE_TO_HOST = 1, 2
_kept: list[int] = []


def launch(gpu: Gpu) -> None:
    stub, _ = gpu.stubs[0]
    assert gpu.rt.cudaLaunchKernel(stub, Dim3(128, 1, 1), Dim3(256, 1, 1), None, 0, None) == 0


def sync_step(gpu: Gpu, loss: int, host: ctypes.Array) -> None:
    """``loss.item()`` and a timing ``torch.cuda.synchronize()`` in every step."""
    launch(gpu)
    launch(gpu)
    assert gpu.rt.cudaMemcpy(ctypes.addressof(host), loss, 4, DEVICE_TO_HOST) == 0
    assert gpu.rt.cudaDeviceSynchronize() == 0


def pageable_step(gpu: Gpu, batch: int, host: ctypes.Array) -> None:
    """``batch.to("cuda", non_blocking=True)`` from a tensor that was never pinned."""
    assert gpu.rt.cudaMemcpyAsync(batch, ctypes.addressof(host), len(host), HOST_TO_DEVICE, None) == 0
    launch(gpu)


def decode_step(gpu: Gpu) -> None:
    """An eager decode step: many small kernels, launched one by one."""
    for _ in range(50):
        launch(gpu)


def leaky_cache(gpu: Gpu) -> None:
    """A per-step cache of device buffers nobody trims."""
    ptr = ctypes.c_void_p()
    assert gpu.rt.cudaMalloc(ctypes.byref(ptr), 1 * MIB) == 0
    _kept.append(ptr.value)


def clean_step(gpu: Gpu, batch: int, pinned: int) -> None:
    """Pinned staging buffer, asynchronous copy, a few kernels, no synchronisation."""
    assert gpu.rt.cudaMemcpyAsync(batch, pinned, 2 * MIB, HOST_TO_DEVICE, None) == 0
    for _ in range(3):
        launch(gpu)


def run(scenario: str, gpu: Gpu) -> None:
    if scenario == "sync":
        loss, host = gpu.malloc(4), (ctypes.c_char * 4)()
        for _ in range(300):
            sync_step(gpu, loss, host)
            time.sleep(0.002)
    elif scenario == "pageable":
        batch, host = gpu.malloc(2 * MIB), (ctypes.c_char * (2 * MIB))()
        for _ in range(100):
            pageable_step(gpu, batch, host)
            time.sleep(0.005)
    elif scenario == "tiny_kernels":
        for _ in range(600):
            decode_step(gpu)
    elif scenario == "leak":  # over several in-use snapshots (gpu.interval_s 1 s when recorded)
        for _ in range(80):
            leaky_cache(gpu)
            time.sleep(0.05)
    elif scenario == "clean":
        batch = gpu.malloc(2 * MIB)
        pinned = ctypes.c_void_p()
        assert gpu.rt.cudaMallocHost(ctypes.byref(pinned), 2 * MIB) == 0
        for _ in range(50):
            clean_step(gpu, batch, pinned.value)
            time.sleep(0.005)
        assert gpu.rt.cudaStreamSynchronize(None) == 0
        assert gpu.rt.cudaFreeHost(pinned) == 0
        gpu.free(batch, 2 * MIB, 0)
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


def main() -> int:
    gpu = Gpu(build())
    print("ready", flush=True)
    sys.stdin.readline()
    run(sys.argv[1], gpu)
    print("done", flush=True)
    sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main())
