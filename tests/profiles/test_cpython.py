"""CPython support without BPF: line tables against the interpreter's own, detection and code-object
reading on live interpreters of every supported version (through /proc/<pid>/mem)."""

from __future__ import annotations

import dis
import subprocess
import sys
import types
from pathlib import Path

import pytest

from otel_ebpf.probes.loading import inline_headers
from otel_ebpf.profiles import cpython

PYENV = Path("/root/.pyenv/versions")
INTERPRETERS = [PYENV / v / "bin" / "python3" for v in ("3.10.13", "3.11.7", "3.12.1", "3.13.0")] + [
    Path("/usr/bin/python3")
]


def _sample_code() -> types.CodeType:
    source = "def f(x):\n    y = x + 1\n    if y:\n        return [i for i in range(y)]\n\n    return -1\n"
    namespace: dict = {}
    exec(compile(source, "sample.py", "exec"), namespace)
    return namespace["f"].__code__


@pytest.mark.skipif(sys.version_info < (3, 11), reason="3.11+ location table")
def test_location_table_matches_the_interpreter() -> None:
    code = _sample_code()
    for instruction in dis.get_instructions(code):
        lasti = instruction.offset // 2
        expected = instruction.positions.lineno
        got = cpython.line_311(code.co_linetable, code.co_firstlineno, lasti)
        assert got == (expected or 0), instruction
    assert cpython.line_311(code.co_linetable, code.co_firstlineno, -1) == code.co_firstlineno


def test_line_310_table() -> None:
    # (bytecode bytes, line delta) pairs: 4 bytes on line 1, 6 on line 3, 2 without line, 2 on line 2
    table = bytes([4, 0, 6, 2, 2, 0x80, 2, 255])
    assert [cpython.line_310(table, 1, i) for i in range(7)] == [1, 1, 3, 3, 3, 0, 2]


def test_debug_offsets_need_the_cookie() -> None:
    with pytest.raises(ValueError):
        cpython.layout_from_debug_offsets(b"\0" * 584)


@pytest.mark.parametrize("python", INTERPRETERS, ids=lambda p: str(p))
def test_detect_and_read_code_objects(python: Path, tmp_path: Path) -> None:
    if not python.exists():
        pytest.skip(f"{python} is not installed")
    script = tmp_path / "target.py"
    script.write_text(
        "import sys, time\n"
        "def marker_function():\n"
        "    print(id(marker_function.__code__), flush=True)\n"
        "    time.sleep(60)\n"
        "marker_function()\n"
    )
    proc = subprocess.Popen([str(python), str(script)], stdout=subprocess.PIPE, text=True)
    try:
        code_address = int(proc.stdout.readline())
        process = cpython.detect(proc.pid)
        assert process is not None
        version = subprocess.run(
            [str(python), "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
        ).stdout.strip()
        assert str(process.version) == version
        frame = cpython.CodeResolver().frame(process, code_address, -1)
        assert (frame.function, frame.file, frame.line) == ("marker_function", str(script), 2)
        # the thread list and the frame chain reach marker_function (what the BPF walker follows)
        if process.layout.walker == cpython.PY_V310:
            assert proc.pid in cpython.thread_states(process)
    finally:
        proc.kill()
        proc.wait()


def test_inline_headers_pastes_python_stack_h() -> None:
    source = inline_headers('#include <uapi/linux/ptrace.h>\n#include "python_stack.h"\nint x;\n')
    assert "#include <uapi/linux/ptrace.h>" in source
    assert "py_read_stack" in source and '#include "python_stack.h"' not in source


def test_py_proc_matches_the_c_struct() -> None:
    header = (Path(cpython.__file__).resolve().parents[2] / "bpf" / "python_stack.h").read_text()
    body = header[header.index("struct py_proc {") : header.index("};", header.index("struct py_proc {"))]
    c_fields = [
        line.split()[1].rstrip(";").split("[")[0]
        for line in body.splitlines()[1:]
        if line.strip() and not line.strip().startswith("/*")
    ]
    assert c_fields == [name for name, _ in cpython.PyProc._fields_]
