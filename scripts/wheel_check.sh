#!/usr/bin/env bash
# Prove the agent works as users install it: from the wheel, in a fresh virtualenv, with no source
# tree on sys.path. Every other test runs on the editable install, which imports straight from the
# source tree and so cannot notice a module, a BPF source or a dependency missing from the package.
#
#   1. sdist and wheel built with `python -m build` from a clean copy of the working tree; the wheel
#      is built from the sdist, so both are checked: the wheel must hold every .py of otel_ebpf/
#      and protocols/ and every .c/.h/.py of bpf/, at their otel_ebpf.* paths
#   2. the wheel installed (not editable) into a fresh venv, Debian's bcc exposed to it as
#      bootstrap.sh does (scripts/bcc_shim.sh)
#   3. every module of the installed package imported, every protocol entry point loaded
#   4. `otel-ebpf doctor`
#   5. `otel-ebpf run` against a local HTTP server: one curl request gives exactly one SERVER span
#
# Needs root (steps 4-5 load BPF) and a machine prepared by scripts/bootstrap.sh (BCC, kernel
# headers, tracefs, curl). Leaves nothing behind: temp dirs and processes are removed on exit.
# Environment: PYTHON (interpreter for the venvs, default python3).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-python3}"
start=$SECONDS

log() { printf '[wheel-check] %s\n' "$*"; }
fail() {
    printf '[wheel-check] FAILED: %s\n' "$*" >&2
    exit 1
}
# Runs a command with its output in a log file, shown only when it fails: pip and build are noisy.
quiet() { # name command...
    local name="$1"
    shift
    if ! "$@" >"$tmp/$name.log" 2>&1; then
        tail -n 40 "$tmp/$name.log" >&2
        fail "$name failed (last lines above): $*"
    fi
}

[ "$(id -u)" -eq 0 ] || fail "needs root: 'otel-ebpf doctor' and 'otel-ebpf run' load BPF programs"
for tool in git curl "$python"; do
    command -v "$tool" >/dev/null || fail "$tool not found (run scripts/bootstrap.sh)"
done

tmp="$(mktemp -d /tmp/otel-ebpf-wheel-check.XXXXXX)"
server_pid=""
agent_pid=""
cleanup() {
    local pid
    for pid in "$agent_pid" "$server_pid"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. build ------------------------------------------------------------------------------------
# A copy of what git sees (tracked and untracked files, minus ignored ones): a build/ or *.egg-info
# left in the working tree by an earlier build could otherwise put files in the wheel that the
# packaging configuration no longer selects, and the check would pass on stale output.
log "copying the working tree of $repo"
mkdir "$tmp/src"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
    tar --null --files-from=- --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$tmp/src" ||
    fail "could not copy the working tree (is $repo a git checkout?)"

log "building sdist and wheel (python -m build)"
quiet venv-tools "$python" -m venv "$tmp/tools"
quiet pip-install-build "$tmp/tools/bin/pip" install --disable-pip-version-check build
quiet build "$tmp/tools/bin/python" -m build --outdir "$tmp/dist" "$tmp/src"
sdist="$(find "$tmp/dist" -name 'otel_ebpf-*.tar.gz')"
wheel="$(find "$tmp/dist" -name 'otel_ebpf-*.whl')"
[ -f "$sdist" ] && [ -f "$wheel" ] || fail "expected one sdist and one wheel in $tmp/dist: $(ls "$tmp/dist")"
log "built $(basename "$sdist") and $(basename "$wheel")"

"$python" - "$tmp/src" "$wheel" <<'EOF' || fail "the wheel lacks files of the source tree (listed above)"
import sys
import zipfile
from pathlib import Path

src, wheel = Path(sys.argv[1]), sys.argv[2]
# Source folder -> its place in the one otel_ebpf namespace (pyproject.toml's package-dir).
folders = {"otel_ebpf": ("otel_ebpf", "*.py"), "protocols": ("otel_ebpf/protocols", "*.py"),
           "bpf": ("otel_ebpf/bpf", "*.[ch]", "*.py")}
want = set()
for folder, (target, *patterns) in folders.items():
    for pattern in patterns:
        want |= {f"{target}/{p.relative_to(src / folder).as_posix()}" for p in (src / folder).rglob(pattern)}
have = set(zipfile.ZipFile(wheel).namelist())
missing = sorted(want - have)
for name in missing:
    print(f"[wheel-check]   missing from the wheel: {name}", file=sys.stderr)
if missing:
    sys.exit(1)
print(f"[wheel-check] the wheel holds all {len(want)} source files of otel_ebpf/, protocols/ and bpf/")
EOF

# --- 2. install ----------------------------------------------------------------------------------
log "installing the wheel into a fresh venv"
quiet venv "$python" -m venv "$tmp/venv"
quiet pip-install-wheel "$tmp/venv/bin/pip" install --disable-pip-version-check "$wheel"
bcc_dir="$(bash "$repo/scripts/bcc_shim.sh" "$tmp/venv")" || fail "could not expose Debian's bcc to the venv"
log "venv imports bcc from $bcc_dir"

# From here on the cwd is outside the repository and python runs isolated (-I: no cwd, no
# PYTHONPATH, no user site on sys.path), so only the installed package can be imported.
cd "$tmp"

# --- 3. import everything ------------------------------------------------------------------------
log "importing every module of the installed package"
"$tmp/venv/bin/python" -I - <<'EOF' || fail "the installed package does not import (see above)"
import importlib
import pkgutil
import sys
import sysconfig
import traceback
from importlib.metadata import entry_points
from pathlib import Path

import otel_ebpf

site = Path(sysconfig.get_paths()["purelib"])
if site not in Path(otel_ebpf.__file__).parents:
    sys.exit(f"[wheel-check] otel_ebpf imported from {otel_ebpf.__file__}, not from {site}")

failed = []
# onerror: a package that fails to import is recorded (its subpackages cannot be walked) instead of
# being skipped silently (ImportError) or ending the walk (anything else).
names = ["otel_ebpf"] + [m.name for m in pkgutil.walk_packages(otel_ebpf.__path__, "otel_ebpf.", failed.append)]
for name in names:
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name)
        traceback.print_exc()
plugins = entry_points(group="otel_ebpf.protocols")
for ep in plugins:
    try:
        ep.load()
    except Exception:
        failed.append(f"entry point {ep.name} = {ep.value}")
        traceback.print_exc()
if not plugins:
    failed.append("the otel_ebpf.protocols entry points (none installed)")
for name in dict.fromkeys(failed):  # a broken package is reported by the walk and by its import
    print(f"[wheel-check]   cannot import {name}", file=sys.stderr)
if failed:
    sys.exit(1)
print(f"[wheel-check] imported {len(names)} modules and {len(plugins)} protocol entry points from {site}")
EOF

# --- 4. doctor -----------------------------------------------------------------------------------
log "otel-ebpf doctor"
if ! "$tmp/venv/bin/otel-ebpf" doctor >"$tmp/doctor.log" 2>&1; then
    cat "$tmp/doctor.log" >&2
    fail "otel-ebpf doctor reports a required check failed (above)"
fi
log "doctor: $(tail -n 1 "$tmp/doctor.log")"

# --- 5. one request, one span --------------------------------------------------------------------
mkdir "$tmp/www" "$tmp/out"
echo "hello from the wheel check" >"$tmp/www/hello.txt"
"$python" -u -m http.server 0 --bind 127.0.0.1 --directory "$tmp/www" >"$tmp/server.log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 100); do
    port="$(sed -n 's/^Serving HTTP on .* port \([0-9]*\) .*/\1/p' "$tmp/server.log")"
    [ -n "$port" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.log" >&2; fail "the HTTP server exited"; }
    sleep 0.1
done
[ -n "$port" ] || fail "the HTTP server did not report its port within 10 s"
log "HTTP server on 127.0.0.1:$port; starting otel-ebpf run"

# --duration only bounds a hung agent: the check stops it with SIGINT once the request is done.
"$tmp/venv/bin/otel-ebpf" run --port "$port" --exporter file --output "$tmp/out" \
    --ready-file "$tmp/ready" --duration 300 >"$tmp/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 1200); do
    [ -s "$tmp/ready" ] && break
    kill -0 "$agent_pid" 2>/dev/null || { cat "$tmp/agent.log" >&2; fail "otel-ebpf run exited before it was ready"; }
    sleep 0.1
done
[ -s "$tmp/ready" ] || { cat "$tmp/agent.log" >&2; fail "otel-ebpf run not ready within 120 s"; }
log "agent attached (ready file written); sending one request"

curl -sSf -o /dev/null "http://127.0.0.1:$port/hello.txt" || fail "curl http://127.0.0.1:$port/hello.txt failed"
kill -INT "$agent_pid"
for _ in $(seq 600); do
    kill -0 "$agent_pid" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$agent_pid" 2>/dev/null; then
    cat "$tmp/agent.log" >&2
    fail "otel-ebpf run did not stop within 60 s of SIGINT"
fi
agent_rc=0
wait "$agent_pid" || agent_rc=$?
agent_pid=""
[ "$agent_rc" -eq 0 ] || { cat "$tmp/agent.log" >&2; fail "otel-ebpf run exited with $agent_rc"; }

"$python" - "$tmp/out/traces.jsonl" <<'EOF' || { cat "$tmp/agent.log" >&2; fail "wrong spans for the request (agent log above)"; }
import json
import sys
from pathlib import Path

SERVER = 2  # SPAN_KIND_SERVER: the file exporter writes OTLP/JSON, enums as integers
path = Path(sys.argv[1])
if not path.is_file():
    sys.exit(f"[wheel-check] {path} was not written")
spans = [span
         for line in path.read_text().splitlines() if line.strip()
         for resource in json.loads(line).get("resourceSpans", [])
         for scope in resource.get("scopeSpans", [])
         for span in scope.get("spans", [])]


def attrs(span):
    return {a["key"]: next(iter(a["value"].values()), None) for a in span.get("attributes", [])}


server = [s for s in spans if s.get("kind") == SERVER]
want = {"http.request.method": "GET", "url.path": "/hello.txt", "http.response.status_code": "200"}
if len(server) == 1 and {k: str(v) for k, v in attrs(server[0]).items() if k in want} == want:
    print(f"[wheel-check] one SERVER span: {server[0].get('name')!r} -> 200 ({len(spans)} spans in all)")
    sys.exit(0)
for s in spans:
    print(f"[wheel-check]   span kind={s.get('kind')} name={s.get('name')!r} {attrs(s)}", file=sys.stderr)
sys.exit(f"[wheel-check] expected exactly 1 SERVER span with {want}; got {len(server)} SERVER of {len(spans)} spans")
EOF

log "ok in $((SECONDS - start))s"
