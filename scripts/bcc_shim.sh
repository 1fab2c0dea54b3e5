#!/usr/bin/env bash
# Make Debian's `bcc` module (python3-bpfcc; BCC is not on PyPI) importable in a virtualenv, and
# nothing else of Debian's dist-packages, which would shadow the venv's own pins: VENV/bcc-shim
# holds only a `bcc` symlink, and a .pth file in the venv's site-packages puts that folder on
# sys.path. One implementation for scripts/bootstrap.sh, scripts/wheel_check.sh and
# deploy/Dockerfile. Idempotent.
#
#   scripts/bcc_shim.sh VENV     prints the bcc directory it linked; exits 1 if bcc cannot be imported
set -euo pipefail

venv="${1:?usage: $0 VENV}"
vpy="$venv/bin/python"
shim="$venv/bcc-shim"
die() {
    printf '[bcc-shim] ERROR: %s\n' "$*" >&2
    exit 1
}

[ -x "$vpy" ] || die "$vpy not found: $venv is not a virtualenv"
bcc_dir="$(dpkg -L python3-bpfcc 2>/dev/null | grep -m1 '/bcc/__init__.py$' || true)"
bcc_dir="${bcc_dir%/__init__.py}"
if [ -z "$bcc_dir" ] || [ ! -d "$bcc_dir" ]; then
    die "python3-bpfcc's bcc module not found (apt-get install python3-bpfcc)"
fi
mkdir -p "$shim"
[ "$(readlink "$shim/bcc" 2>/dev/null)" = "$bcc_dir" ] || ln -sfn "$bcc_dir" "$shim/bcc"
pth="$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/otel_ebpf_bcc_shim.pth"
[ "$(cat "$pth" 2>/dev/null)" = "$shim" ] || echo "$shim" >"$pth"
"$vpy" -c 'import bcc' || die "'import bcc' fails in $venv (shim: $shim -> $bcc_dir)"
echo "$bcc_dir"
