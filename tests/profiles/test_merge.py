"""Splicing Python frames into native stacks (otel_ebpf/profiles/merge.py)."""

from __future__ import annotations

from otel_ebpf.profiles.merge import merge, python_groups
from otel_ebpf.profiles.model import Frame, FrameKind

LIBPY = "/usr/lib/libpython3.11.so.1.0"


def native(name: str, module: str = "/usr/lib/libc.so.6", resolved: bool = True) -> Frame:
    return Frame(name, module=module, kind=FrameKind.NATIVE, resolved=resolved)


def py(name: str) -> Frame:
    return Frame(name, file="app.py", line=1, kind=FrameKind.PYTHON)


EVAL = native("_PyEval_EvalFrameDefault", LIBPY)
KERNEL = Frame("do_syscall_64", module="[kernel.kallsyms]", kind=FrameKind.KERNEL)


def names(stack) -> list[str]:
    return [f.function for f in stack]


def test_groups_follow_entry_marks() -> None:
    frames = [py("c"), py("b"), py("a"), py("main")]
    assert [names(g) for g in python_groups(frames, [False, True, False, True])] == [["c", "b"], ["a", "main"]]
    # root frames without a mark join the last call
    assert [names(g) for g in python_groups(frames, [True, False, False, False])] == [["c", "b", "a", "main"]]
    assert [names(g) for g in python_groups(frames, [False] * 4)] == [["c", "b", "a", "main"]]


def test_whole_native_stack_is_spliced_at_each_eval_frame() -> None:
    # leaf first: libc memcpy <- C extension <- eval(b) <- PyObject_Call <- eval(a, main) <- main <- _start
    stack = [
        native("memcpy"),
        native("ext_func", "/x/ext.so"),
        EVAL,
        native("PyObject_Call", LIBPY),
        EVAL,
        native("Py_RunMain", LIBPY),
        native("_start", "/usr/bin/python3"),
    ]
    merged = merge([KERNEL], stack, [py("b"), py("a"), py("main")], [True, False, True], LIBPY)
    assert names(merged) == [
        "do_syscall_64",
        "memcpy",
        "ext_func",
        "b",
        "PyObject_Call",
        "a",
        "main",
        "Py_RunMain",
        "_start",
    ]


def test_broken_native_stack_keeps_leaf_frames_then_all_python() -> None:
    # no frame pointers in libpython: the unwind wanders off after the C extension
    stack = [
        native("deflate_slow", "/lib/libz.so.1", resolved=False),
        native("zlib_compress", "/x/zlib.so"),
        native("PyObject_Vectorcall", LIBPY),
        native("garbage", "/lib/libc.so.6"),
    ]
    merged = merge([], stack, [py("hot_native"), py("main")], [False, True], LIBPY)
    assert names(merged) == ["deflate_slow", "zlib_compress", "hot_native", "main"]


def test_frames_outside_mappings_end_the_trusted_part() -> None:
    stack = [native("leaf", "/lib/libz.so.1"), Frame("[unknown]+0x10", resolved=False), native("random")]
    assert names(merge([], stack, [py("f")], [True], LIBPY)) == ["leaf", "f"]


def test_eval_count_mismatch_falls_back_to_the_safe_order() -> None:
    stack = [native("memcpy"), EVAL, native("_start", "/usr/bin/python3")]
    merged = merge([], stack, [py("b"), py("a")], [True, True], LIBPY)  # two calls, one eval frame seen
    assert names(merged) == ["memcpy", "b", "a"]


def test_no_python_frames_keeps_the_native_stack() -> None:
    stack = [native("memcpy"), native("main", "/bin/app")]
    assert names(merge([KERNEL], stack)) == ["do_syscall_64", "memcpy", "main"]
