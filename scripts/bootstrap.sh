#!/usr/bin/env bash
# Prepare a machine to build, test and run otel-ebpf. Idempotent: a second run only checks.
#
#   1. Debian packages: BCC (bpfcc-tools, python3-bpfcc), curl, wrk, nginx, gcc, kernel headers.
#      Headers: the exact linux-headers-$(uname -r) when apt has it; otherwise the newest generic
#      Debian headers, symlinked as /lib/modules/$(uname -r)/{build,source}.
#   2. tracefs / debugfs / securityfs mounted (BCC reads tracepoint formats from tracefs).
#   3. .venv/ with `pip install -e '.[test,bench,lint]'` and Debian's `bcc` module made importable through a
#      shim folder that holds only a `bcc` symlink (not all of Debian's dist-packages).
#
# Root is needed only when something system-wide is missing, so a non-root developer can still run
# it (and the unit tests) on a machine that root has prepared once.
#
# Environment: PYTHON (interpreter for the venv, default python3), VENV (default <repo>/.venv).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
venv="${VENV:-$repo/.venv}"
release="$(uname -r)"
moddir="/lib/modules/$release"
export DEBIAN_FRONTEND=noninteractive
[ -f "$repo/pyproject.toml" ] || { echo "[bootstrap] ERROR: no pyproject.toml in $repo" >&2; exit 1; }

log() { printf '[bootstrap] %s\n' "$*"; }
# Each argument is printed as its own line, so long warnings stay readable.
warn() {
    printf '[bootstrap] WARNING: %s\n' "$1" >&2
    shift
    [ "$#" -eq 0 ] || printf '[bootstrap]          %s\n' "$@" >&2
}
die() {
    printf '[bootstrap] ERROR: %s\n' "$*" >&2
    exit 1
}
is_root() { [ "$(id -u)" -eq 0 ]; }
need_root() { is_root || die "$1 needs root: run 'sudo make bootstrap' (or sudo $0) once"; }

# ---------------------------------------------------------------------------------------------
# Debian packages
# ---------------------------------------------------------------------------------------------
# python3: Debian's own interpreter, which the CPU profiler's live tests also profile
# gcc, libc6-dev: the GPU tests build their stand-in CUDA/NCCL libraries from C
# nginx: bench/nginx_load.py runs its own nginx (own config, prefix and port), never the system one
# redis-server, prometheus: live tests start their own on loopback (the Redis example plugin, the
# Prometheus exporter scraped by a real Prometheus); the packages' system services are not used
# iproute2: the RoCEv2 live tests build a network namespace and a veth pair with `ip` and check `tc`
# libibverbs1, libibverbs-dev: the RDMA verbs tests hook the real library and build their stand-in's
# driver against its infiniband/verbs.h (no RDMA device is needed)
# linux-perf: bench/kernel_profile.py profiles the BPF programs with `perf record`
# nodejs: a live TLS test's client is Node.js (OpenSSL over memory BIOs)
# gnutls-bin: a live TLS test's server is gnutls-serv (TLS through a library the agent does not hook)
base_packages=(bpfcc-tools python3-bpfcc curl wrk nginx python3 gcc libc6-dev redis-server prometheus iproute2 libibverbs1 libibverbs-dev linux-perf nodejs gnutls-bin)

installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]; }

# True when apt knows an installable version of the package (needs a fresh `apt-get update`).
apt_has() {
    local candidate
    candidate="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
    [ -n "$candidate" ] && [ "$candidate" != "(none)" ]
}

apt_log="$(mktemp)"
trap 'rm -f "$apt_log"' EXIT

apt_run() {
    if ! apt-get "$@" >"$apt_log" 2>&1; then
        tail -n 20 "$apt_log" >&2
        die "apt-get $* failed (see above): check the network and /etc/apt/sources.list"
    fi
}

apt_updated=0
apt_update_once() {
    if [ "$apt_updated" -eq 0 ]; then
        log "apt-get update"
        apt_run -q update
        apt_updated=1
    fi
}

# Generic header flavours, best first: Debian's cloud kernel headers are the smallest install.
generic_flavours() {
    case "$(dpkg --print-architecture)" in
        amd64) echo cloud-amd64 amd64 ;;
        arm64) echo cloud-arm64 arm64 ;;
        *) die "no generic kernel headers known for architecture $(dpkg --print-architecture)" ;;
    esac
}

# How /lib/modules/$release/build stands:
#   real    - headers made for this kernel (a distro package or a hand-made tree): leave alone
#   generic - a symlink to another kernel's /usr/src/linux-headers-* (what this script makes)
#   none    - missing or dangling
headers_state() {
    local build="$moddir/build" target
    [ -e "$build" ] || { echo none; return; }
    target="$(readlink -f "$build")"
    if [ -L "$build" ] && [[ "$target" == /usr/src/linux-headers-* ]] &&
        [ "$(basename "$target")" != "linux-headers-$release" ]; then
        echo generic
    elif [ -d "$target/include" ]; then
        echo real
    else
        echo none
    fi
}

# Newest installed generic arch-specific header tree, e.g. /usr/src/linux-headers-6.1.0-57-cloud-amd64.
newest_generic_headers() {
    local flavour dir
    for flavour in $(generic_flavours); do
        dir="$(find /usr/src -maxdepth 1 -type d -name "linux-headers-*-$flavour" 2>/dev/null | sort -V | tail -n 1)"
        if [ -n "$dir" ]; then
            echo "$dir"
            return
        fi
    done
}

# Point build -> arch tree and source -> the matching -common tree. BCC needs both: generated
# headers live in the arch tree, most of include/ in -common.
link_generic_headers() {
    local build_dir common_dir="" flavour link
    build_dir="$(newest_generic_headers)"
    [ -n "$build_dir" ] || die "no generic kernel headers under /usr/src after installing them"
    for flavour in $(generic_flavours); do
        if [[ "$build_dir" == *"-$flavour" ]]; then
            common_dir="${build_dir%"-$flavour"}-common"
            break
        fi
    done
    [ -d "$common_dir" ] || die "$build_dir has no matching $common_dir"

    if [ "$(readlink "$moddir/build" 2>/dev/null)" != "$build_dir" ] ||
        [ "$(readlink "$moddir/source" 2>/dev/null)" != "$common_dir" ]; then
        need_root "linking kernel headers into $moddir"
        mkdir -p "$moddir"
        # A real directory here would be swallowed by `ln -sfn` (it links inside it): refuse.
        for link in build source; do
            if [ -e "$moddir/$link" ] && [ ! -L "$moddir/$link" ]; then
                die "$moddir/$link is a real directory without usable headers; move it away first"
            fi
        done
        ln -sfn "$build_dir" "$moddir/build"
        ln -sfn "$common_dir" "$moddir/source"
        log "linked $moddir/build -> $build_dir, source -> $common_dir"
    fi
    warn "no headers package exists for kernel $release: BCC compiles against the generic" \
        "$(basename "$build_dir") headers instead. That is safe for otel-ebpf: its BPF programs" \
        "attach to stable tracepoints, uprobes and TC, and read kernel struct fields only at offsets" \
        "from the running kernel's BTF, so no struct layout from these headers reaches the kernel."
}

install_packages() {
    local missing=() pkg state flavour generic_pkg=""
    for pkg in "${base_packages[@]}"; do
        installed "$pkg" || missing+=("$pkg")
    done
    state="$(headers_state)"
    installed "linux-headers-$release" && state=real

    if [ "${#missing[@]}" -eq 0 ] && [ "$state" != none ]; then
        log "packages: ok ($state kernel headers)"
        [ "$state" = generic ] && link_generic_headers
        return 0
    fi

    command -v apt-get >/dev/null || die "apt-get not found: install ${missing[*]:-} and kernel headers by hand"
    need_root "installing Debian packages (${missing[*]:-kernel headers})"
    apt_update_once

    if [ "$state" = none ]; then
        if apt_has "linux-headers-$release"; then
            missing+=("linux-headers-$release")
            state=real
        else
            for flavour in $(generic_flavours); do
                if apt_has "linux-headers-$flavour"; then
                    generic_pkg="linux-headers-$flavour"
                    break
                fi
            done
            [ -n "$generic_pkg" ] || die "apt has neither linux-headers-$release nor generic headers"
            installed "$generic_pkg" || missing+=("$generic_pkg")
            state=generic
        fi
    fi

    if [ "${#missing[@]}" -gt 0 ]; then
        log "apt-get install ${missing[*]}"
        apt_run -q install -y "${missing[@]}"
    fi
    [ "$state" = generic ] && link_generic_headers
    return 0
}

# ---------------------------------------------------------------------------------------------
# Pseudo file systems
# ---------------------------------------------------------------------------------------------
mount_fs() { # type path why
    local fstype="$1" path="$2" why="$3"
    mountpoint -q "$path" 2>/dev/null && return 0
    if is_root && mount -t "$fstype" "$fstype" "$path" 2>/dev/null; then
        log "mounted $fstype on $path"
    else
        warn "could not mount $fstype on $path ($why); run: mount -t $fstype $fstype $path"
    fi
}

mount_filesystems() {
    mount_fs tracefs /sys/kernel/tracing "BCC reads tracepoint formats there"
    mount_fs debugfs /sys/kernel/debug "older tools expect /sys/kernel/debug/tracing"
    mount_fs securityfs /sys/kernel/security "'otel-ebpf doctor' reads the active LSMs there"
}

# ---------------------------------------------------------------------------------------------
# Python virtual environment
# ---------------------------------------------------------------------------------------------
setup_venv() {
    local vpy="$venv/bin/python" stamp="$venv/.bootstrap-pyproject.sha256" want bcc_dir
    # bench: FastAPI, uvicorn and OpenTelemetry's instrumentation (make bench); lint: ruff and mypy
    local extras="test,bench,lint"
    if [ -e "$venv" ] && [ ! -x "$vpy" ]; then
        die "$venv exists but $vpy cannot run here (made by another user or interpreter?): remove $venv"
    fi
    if [ ! -x "$vpy" ]; then
        command -v "$python" >/dev/null || die "$python not found (set PYTHON=/path/to/python3)"
        if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
            # Debian's own python3 ships venv/ensurepip separately.
            need_root "installing python3-venv"
            apt_update_once
            apt_run -q install -y python3-venv
        fi
        log "creating $venv with $("$python" -c 'import sys; print(sys.executable)')"
        "$python" -m venv "$venv"
    fi

    # The stamp covers the extras too: adding one here reinstalls even if pyproject.toml is unchanged.
    want="$( (cat "$repo/pyproject.toml"; echo "extras=$extras") | sha256sum | cut -d' ' -f1)"
    if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        log "pip install -e '.[$extras]'"
        "$vpy" -m pip install -q --disable-pip-version-check -e "${repo}[$extras]" ||
            die "pip install failed (see above)"
        echo "$want" >"$stamp"
    else
        log "venv: ok (pyproject.toml unchanged)"
    fi

    bcc_dir="$(bash "$repo/scripts/bcc_shim.sh" "$venv")" || exit 1
    log "venv: $vpy imports bcc from $bcc_dir"
}

start=$SECONDS
install_packages
mount_filesystems
setup_venv
log "done in $((SECONDS - start))s"
