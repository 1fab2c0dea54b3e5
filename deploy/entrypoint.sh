#!/bin/sh
# Container entry point: choose kernel headers for BCC, make sure tracefs is there, run otel-ebpf.
set -eu

release="$(uname -r)"
modules="/lib/modules/$release"   # the host's, mounted read-only by the DaemonSet

# The host's own headers are exact: prefer them. Otherwise use the generic Debian tree baked into
# the image (BCC_KERNEL_SOURCE takes one merged tree). Generic headers are safe here because
# otel-ebpf's BPF programs read no kernel struct fields (tracepoints and uprobes only).
if [ -z "${BCC_KERNEL_SOURCE:-}" ] && [ ! -d "$modules/build/include" ] &&
    [ ! -e "$modules/source/include/linux/kconfig.h" ]; then
    export BCC_KERNEL_SOURCE=/opt/otel-ebpf/kernel-headers
    echo "otel-ebpf: no kernel headers for $release on the host; using the image's generic" \
        "$(cat /opt/otel-ebpf/kernel-headers/.otel-ebpf-headers) (safe: no kernel struct fields are read)" >&2
fi

# BCC reads tracepoint formats from tracefs. A host that never mounted it gives an empty hostPath;
# a privileged container can mount it in its own mount namespace.
if [ ! -d /sys/kernel/tracing/events ] && [ ! -d /sys/kernel/debug/tracing/events ]; then
    mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null ||
        echo "otel-ebpf: tracefs is not mounted and cannot be mounted here; 'otel-ebpf doctor' explains" >&2
fi

exec /opt/otel-ebpf/venv/bin/otel-ebpf "$@"
