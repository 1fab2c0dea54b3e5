"""Live BPF: BCC modules made and freed on several threads at once do not corrupt BCC's process-wide
table storage (otel_ebpf/probes/loading.py, ``_BCC_MODULES``).

Without the lock this crashes the interpreter within a second (SIGSEGV, or glibc's heap checks
aborting); the agent hit it now and then at stop, freeing its probes side by side. It runs in a
child process so that a crash fails this test instead of the test run."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.bpf

THREADS = 3
ROUNDS = 4

# Each thread makes and frees modules with tables of three kinds, each module its own names.
CHURN = f"""
import threading
from otel_ebpf.probes.loading import close_program, compile_program

SOURCE = '''
BPF_HASH(h_ID, u32, u64, 64);
BPF_ARRAY(a_ID, u64, 4);
BPF_PERCPU_ARRAY(p_ID, u64, 4);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {{
    u32 zero = 0;
    u64 *n = a_ID.lookup(&zero);
    if (n)
        *n += 1;
    return 0;
}}
'''

def churn(thread):
    for round in range({ROUNDS}):
        bpf = compile_program(SOURCE.replace("ID", f"{{thread}}_{{round}}"), [], "churned module")
        close_program(bpf)

threads = [threading.Thread(target=churn, args=(t,)) for t in range({THREADS})]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("done")
"""


def test_modules_made_and_freed_on_several_threads_at_once_do_not_crash() -> None:
    out = subprocess.run([sys.executable, "-c", CHURN], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}:\n{out.stderr[-3000:]}"
    assert out.stdout.strip() == "done"
