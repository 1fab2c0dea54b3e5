#!/usr/bin/env bash
# mypy on the package as it installs: otel_ebpf/, with protocols/ as otel_ebpf.protocols
# (pyproject.toml's [tool.setuptools] package-dir). mypy knows no such mapping, and the editable
# install's import hook is invisible to it, so it checks a tree of symlinks that has that layout
# (build/typecheck/otel_ebpf); its messages name the files of the checkout. Settings: [tool.mypy].
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
tree="$root/build/typecheck"
rm -rf "$tree"
mkdir -p "$tree/otel_ebpf"
for entry in otel_ebpf/*; do
    # a worktree may carry otel_ebpf/protocols as a symlink of its own: the one linked below counts
    [ "$entry" = otel_ebpf/protocols ] && continue
    ln -s "$root/$entry" "$tree/otel_ebpf/"
done
ln -s "$root/protocols" "$tree/otel_ebpf/protocols"
cd "$tree"
"$root/.venv/bin/python" -m mypy --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache" \
    -p otel_ebpf "$@" | sed -e 's#^otel_ebpf/protocols/#protocols/#'
