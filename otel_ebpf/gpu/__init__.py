"""GPU views: CUDA memory, copies, launches and NCCL collectives, tied to the stacks that made them.

Pure logic, no BPF: :mod:`.calls` (what is hooked and how a call decodes), :mod:`.memory`
(allocation pairing, in-use bytes, leaks), :mod:`.views` (metrics, profiles, leak log records).
The probe that feeds them is :mod:`otel_ebpf.probes.gpu`.
"""
