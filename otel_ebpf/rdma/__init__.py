"""RDMA: the verbs control path (devices, protection domains, memory registrations, completion
queues, queue pairs and their pairs) and the ports' own counters (docs/rdma.md).

Pure logic, no BPF: :mod:`.calls` (what is hooked and how a call decodes), :mod:`.views` (metrics
and queue-pair log records), :mod:`.ports` (sysfs port counters and local addresses). The probe
that feeds them is :mod:`otel_ebpf.probes.verbs`.
"""
