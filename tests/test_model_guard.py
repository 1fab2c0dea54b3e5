"""Model-file guard, the parts that need no kernel: rules, map contents, records, BTF parsing."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from opentelemetry.sdk.resources import Resource

from otel_ebpf import model_guard as mg
from otel_ebpf.probes.btf import Btf, BtfError


@pytest.mark.parametrize(
    ("pattern", "extension", "directory"),
    [
        ("*.gguf", "gguf", ""),
        ("/models/**/*.bin", "bin", "/models/"),
        ("/models/**/*.bin".replace("/models", "/srv/ml/models/"), "bin", "/srv/ml/models/"),
    ],
)
def test_rule_forms(pattern: str, extension: str, directory: str) -> None:
    assert mg.parse_rule(pattern) == mg.PathRule(pattern, extension, directory)


@pytest.mark.parametrize(
    "pattern",
    [
        "model.gguf",
        "*.tar.gz",
        "/models/*.bin",
        "models/**/*.bin",
        "/mod*/**/*.bin",
        "*.b?n",
        "*.",
        "**/*.bin",
        "*." + "x" * 16,
        "/" + "d" * 127 + "/**/*.bin",
    ],
)
def test_rules_the_kernel_cannot_evaluate_exactly_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"use '\*\.ext'|directory|longer"):
        mg.parse_rule(pattern)


def test_rule_count_is_bounded_by_the_kernel_bit_mask() -> None:
    assert len(mg.compile_rules([f"*.e{i}" for i in range(mg.MAX_RULES)])) == mg.MAX_RULES
    with pytest.raises(ValueError, match="at most 16"):
        mg.compile_rules([f"*.e{i}" for i in range(mg.MAX_RULES + 1)])
    with pytest.raises(ValueError, match="at least one"):
        mg.compile_rules([])


def test_extension_masks_merge_rules_sharing_an_extension() -> None:
    rules = mg.compile_rules(["*.pt", "/models/**/*.bin", "/cache/**/*.bin"])
    assert mg.extension_masks(rules) == {b"pt": 0b001, b"bin": 0b110}


def test_prefix_words_select_exactly_the_directory_bytes() -> None:
    words, masks = mg.prefix_words("/models/")
    assert struct.pack("<16Q", *words)[:9] == b"/models/\0"
    assert struct.pack("<16Q", *masks) == b"\xff" * 8 + b"\0" * 120
    assert mg.prefix_words("") == ([0] * 16, [0] * 16)


def _record(
    path: bytes,
    *,
    decision: int = 1,
    listed: int = 0,
    flags: int = os.O_RDWR,
    result: int = 0,
    dirfd: int = mg.AT_FDCWD,
) -> bytes:
    fixed = mg.RECORD.pack(
        123,
        77,
        4242,
        5 << 20,
        1000,
        1001,
        1000,
        100,
        flags,
        0b10,
        len(path) + 1,
        result,
        dirfd,
        decision,
        listed,
        b"python3\0".ljust(16, b"\0"),
    )
    return fixed + (path + b"\0").ljust(mg.PATH_LEN, b"\0")


def test_decode_open() -> None:
    event = mg.decode_open(_record(b"/models/a/weights.bin"))
    assert event == mg.FileOpen(
        123, 77, 4242, 1000, 1001, 1000, 100, os.O_RDWR, 0b10, True, False, "python3", "/models/a/weights.bin"
    )
    assert mg.decode_open(_record(b"w.gguf", result=-2, dirfd=7)).path == "w.gguf"
    assert (
        mg.decode_open(_record(b"w.gguf", result=-2, dirfd=7)).result,
        mg.decode_open(_record(b"", dirfd=7)).dirfd,
    ) == (-2, 7)
    assert event.access == "read_write"
    assert mg.decode_open(_record(b"", flags=os.O_RDONLY)).access == "read"


def test_log_record_says_who_opened_what_and_the_decision() -> None:
    rules = mg.compile_rules(["*.pt", "/models/**/*.bin"])
    resource = Resource({"host.name": "node-1"})
    event = mg.decode_open(_record(b"/models/a/weights.bin"))
    readable = mg.log_record(
        event, rules, "enforce", "lsm", 5, {"process.executable.path": "/usr/bin/python3"}, resource
    )
    record = readable.log_record
    assert record.event_name == "model_guard.file_open" and record.severity_text == "WARN"
    assert record.body == "denied read_write open of /models/a/weights.bin by /usr/bin/python3 (pid 1000, uid 1000)"
    assert dict(record.attributes) == {
        "process.pid": 1000,
        "process.executable.name": "python3",
        "process.user.id": 1000,
        "process.executable.path": "/usr/bin/python3",
        "file.path": "/models/a/weights.bin",
        "file.name": "weights.bin",
        "model_guard.access": "read_write",
        "model_guard.decision": "denied",
        "model_guard.allow_listed": False,
        "model_guard.mode": "enforce",
        "model_guard.mechanism": "lsm",
        "model_guard.rules": ("/models/**/*.bin",),
        "model_guard.cgroup.id": 77,
    }
    allowed = mg.log_record(
        mg.decode_open(_record(b"/m.pt", decision=0, listed=1)), rules, "audit", "lsm", 5, {}, resource
    )
    assert (
        allowed.log_record.severity_text == "INFO"
        and allowed.log_record.attributes["model_guard.decision"] == "allowed"
    )


def test_log_record_through_tracepoints_says_what_the_open_returned() -> None:
    rules = mg.compile_rules(["*.pt"])
    opened = mg.log_record(
        mg.decode_open(_record(b"/m.pt", decision=0, listed=1, result=5)),
        rules,
        "audit",
        "tracepoints",
        5,
        {},
        Resource({}),
    )
    assert opened.log_record.body == "read_write open of /m.pt by python3 (pid 1000, uid 1000)"
    assert (
        opened.log_record.attributes["model_guard.result"],
        opened.log_record.attributes["model_guard.mechanism"],
    ) == (5, "tracepoints")
    assert "model_guard.errno" not in opened.log_record.attributes
    missing = mg.log_record(
        mg.decode_open(_record(b"/m.pt", decision=0, result=-2)), rules, "audit", "tracepoints", 5, {}, Resource({})
    )
    assert (
        missing.log_record.body == "read_write open of /m.pt by python3 (pid 1000, uid 1000), not in the allow-list "
        "(failed: ENOENT)"
    )
    assert (
        missing.log_record.attributes["model_guard.result"],
        missing.log_record.attributes["model_guard.errno"],
    ) == (-2, "ENOENT")


def test_paths_passed_to_open_are_resolved_against_cwd_or_dirfd(tmp_path: Path) -> None:
    task = tmp_path / "1000" / "task" / "1001"
    task.mkdir(parents=True)
    (task / "cwd").symlink_to("/srv/work")
    (tmp_path / "1000" / "fd").mkdir()
    (tmp_path / "1000" / "fd" / "7").symlink_to("/models/llama")
    proc = str(tmp_path)

    def resolve(path: bytes, dirfd: int = mg.AT_FDCWD) -> str | None:
        return mg.resolve_path(mg.decode_open(_record(path, dirfd=dirfd)), proc)

    assert resolve(b"/models/../m.gguf", dirfd=7) == "/m.gguf"  # absolute: dirfd ignored
    assert resolve(b"w.gguf") == "/srv/work/w.gguf"
    assert resolve(b"../../models/./w.bin") == "/models/w.bin"
    assert resolve(b"sub/w.bin", dirfd=7) == "/models/llama/sub/w.bin"
    assert resolve(b"w.bin", dirfd=8) is None  # the dirfd is closed, or the process gone


def test_match_rules_checks_directories_like_the_kernel() -> None:
    rules = mg.compile_rules(["*.gguf", "/models/**/*.bin", "/cache/**/*.bin"])
    assert mg.match_rules("/models/a/w.bin", 0b110, rules) == 0b010
    assert mg.match_rules("/modelsx/w.bin", 0b110, rules) == 0
    assert mg.match_rules("/srv/w.gguf", 0b001, rules) == 0b001
    assert mg.match_rules(None, 0b001, rules) == 0b001  # no directory to check
    assert mg.match_rules(None, 0b110, rules) == 0


@pytest.mark.parametrize(
    ("mode", "mechanism", "refused", "chosen"),
    [
        ("audit", "auto", None, "lsm"),
        ("enforce", "auto", None, "lsm"),
        ("audit", "auto", "EPERM", "tracepoints"),
        ("audit", "tracepoints", None, "tracepoints"),
        ("audit", "lsm", None, "lsm"),
    ],
)
def test_mechanism_choice(mode: str, mechanism: str, refused: str | None, chosen: str) -> None:
    assert mg.choose_mechanism(mode, mechanism, refused) == chosen


@pytest.mark.parametrize(
    ("mode", "mechanism", "refused", "message"),
    [
        (
            "enforce",
            "auto",
            "EPERM",
            "model_guard enforce needs BPF LSM: EPERM. Enforcing needs a kernel that loads BPF LSM programs",
        ),
        ("enforce", "tracepoints", None, "model_guard enforce needs BPF LSM: model_guard.mechanism is tracepoints"),
        ("audit", "lsm", "EPERM", "model_guard.mechanism lsm: EPERM. It needs a kernel that loads BPF LSM programs"),
    ],
)
def test_mechanism_refusals_name_the_reason_and_the_requirement(
    mode: str, mechanism: str, refused: str | None, message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        mg.choose_mechanism(mode, mechanism, refused)
    assert str(caught.value).startswith(message)
    assert "`bpf` in its lsm= list" in str(caught.value)


def test_container_id_from_proc_cgroup() -> None:
    cid = "a" * 64
    text = f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/cri-containerd-{cid}.scope\n"
    assert mg.container_id(text) == cid
    assert mg.container_id("0::/user.slice/session-1.scope\n") is None


def test_allow_list_keys_match_what_the_kernel_reports(tmp_path: Path) -> None:
    st = os.stat("/bin/sh")
    assert mg.executable_key("/bin/sh") == (st.st_ino, os.major(st.st_dev) << 20 | os.minor(st.st_dev))
    (tmp_path / "kubepods.slice").mkdir()
    assert mg.cgroup_id("/kubepods.slice", root=tmp_path) == (tmp_path / "kubepods.slice").stat().st_ino
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert mg.cgroup2_mount(str(mounts)) == Path("/sys/fs/cgroup/unified")
    mounts.write_text("proc /proc proc rw 0 0\n")
    with pytest.raises(ValueError, match="no cgroup v2"):
        mg.cgroup2_mount(str(mounts))


def _btf(types: list[bytes], strings: bytes) -> bytes:
    body = b"".join(types)
    return struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(body), len(body), len(strings)) + body + strings


def test_btf_offsets_look_through_anonymous_unions() -> None:
    strings = b"\0int\0outer\0x\0a\0b\0bpf_lsm_file_open\0"
    name = {s: strings.index(s.encode() + b"\0") for s in ("int", "outer", "x", "a", "b", "bpf_lsm_file_open")}
    types = [
        struct.pack("<IIII", name["int"], 1 << 24, 4, 32),  # 1: int
        struct.pack("<III", 0, 5 << 24 | 2, 8) + struct.pack("<6I", name["a"], 1, 0, name["b"], 1, 0),  # 2: union
        struct.pack("<III", name["outer"], 4 << 24 | 2, 16)
        + struct.pack("<6I", name["x"], 1, 0, 0, 2, 64),  # 3: struct outer { int x; union { int a, b; }; }
        struct.pack("<III", name["bpf_lsm_file_open"], 12 << 24, 0),  # 4: func
    ]
    btf = Btf(_btf(types, strings))
    assert (btf.offset("outer", "x"), btf.offset("outer", "b")) == (0, 8)
    assert btf.func_id("bpf_lsm_file_open") == 4
    with pytest.raises(BtfError, match="no member y"):
        btf.offset("outer", "y")
    with pytest.raises(BtfError, match="struct file not"):
        btf.offset("file", "f_path")
    with pytest.raises(BtfError, match="not BTF"):
        Btf(b"\0" * 24)


@pytest.mark.skipif(not os.access("/sys/kernel/btf/vmlinux", os.R_OK), reason="no kernel BTF here")
def test_btf_of_the_running_kernel_has_what_the_guard_reads() -> None:
    from otel_ebpf.probes.model_guard import OFFSETS

    btf = Btf.from_file()
    offsets = {name: btf.offset(*member) for name, member in OFFSETS.items()}
    assert offsets["QSTR_LEN"] == 4 and offsets["QSTR_NAME"] == 8  # struct qstr is ABI-stable
    assert all(0 <= value < 4096 for value in offsets.values())
    assert btf.func_id("bpf_lsm_file_open") > 0
