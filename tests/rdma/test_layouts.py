"""The verbs ABI as the probe and the stand-in write it, against the system's infiniband/verbs.h.

- bpf/verbs_trace.c reads struct members at offsets it #defines (the public ABI): each is
  compared with ``offsetof`` from the installed header (Debian's libibverbs-dev).
- The stand-in libibverbs (tests/rdma/standin/libibverbs.c) writes the structs from the ABI
  facts, not from the header: each of its structs is compiled beside the header's (renamed) and
  every member's offset, and each struct's size, must agree.
- ``struct verbs_call`` (the record) against the Python decoder's ``RECORD`` format.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from otel_ebpf.rdma.calls import RECORD
from tests.rdma.standin.build import HERE, VERBS_HEADER

BPF_SOURCE = Path(__file__).resolve().parents[2] / "bpf" / "verbs_trace.c"
# bpf/verbs_trace.c's offset or size -> what of verbs.h it stands for (a C expression)
OFFSETS = {
    "DEVICE_NAME": "offsetof(struct ibv_device, name)",
    "MR_LENGTH": "offsetof(struct ibv_mr, length)",
    "QP_NUM": "offsetof(struct ibv_qp, qp_num)",
    "QP_STATE": "offsetof(struct ibv_qp, state)",
    "QP_TYPE": "offsetof(struct ibv_qp, qp_type)",
    "ATTR_QP_STATE": "offsetof(struct ibv_qp_attr, qp_state)",
    "ATTR_DEST_QP_NUM": "offsetof(struct ibv_qp_attr, dest_qp_num)",
    "ATTR_AH_DGID": "offsetof(struct ibv_qp_attr, ah_attr.grh.dgid)",
    "ATTR_AH_SGID_INDEX": "offsetof(struct ibv_qp_attr, ah_attr.grh.sgid_index)",
    "ATTR_AH_DLID": "offsetof(struct ibv_qp_attr, ah_attr.dlid)",
    "ATTR_AH_IS_GLOBAL": "offsetof(struct ibv_qp_attr, ah_attr.is_global)",
    "ATTR_AH_PORT_NUM": "offsetof(struct ibv_qp_attr, ah_attr.port_num)",
    "ATTR_PORT_NUM": "offsetof(struct ibv_qp_attr, port_num)",
    "CTX_POLL_CQ": "offsetof(struct ibv_context, ops.poll_cq)",
    "CTX_POST_SEND": "offsetof(struct ibv_context, ops.post_send)",
    "SGE_LENGTH": "offsetof(struct ibv_sge, length)",
    "SGE_SIZE": "sizeof(struct ibv_sge)",
    "SEND_WR_HEAD": "offsetof(struct ibv_send_wr, send_flags) + 4",
    "RECV_WR_HEAD": "offsetof(struct ibv_recv_wr, num_sge) + 4",
    "WC_SIZE": "sizeof(struct ibv_wc)",
    "SEND_SIGNALED": "IBV_SEND_SIGNALED",
    "OPCODE_RECV": "IBV_WC_RECV",
}
# the kernel's views of a work request and a completion: member -> verbs.h's
HEADS = {
    "wr_head": ("struct ibv_send_wr", ("wr_id", "next", "sg_list", "num_sge", "opcode", "send_flags")),
    "wc_head": ("struct ibv_wc", ("wr_id", "status", "opcode", "vendor_err", "byte_len", "imm_data", "qp_num")),
}
_CONTEXT_FIRST = ("struct ibv_context, device", "struct ibv_pd, context", "struct ibv_mr, context")
_BLOCK = re.compile(r"^(struct|union) (ibv_\w+) \{(.*?)^\};", re.MULTILINE | re.DOTALL)
_MEMBER = re.compile(r"^\s*(?:struct|union)?\s*[\w ]+?\**\s*(\w+(?:\s*,\s*\w+)*)\s*(?:\[\w+\])?;", re.MULTILINE)

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed (scripts/bootstrap.sh)")


def _run(program: str, tmp_path: Path) -> list[str]:
    if not VERBS_HEADER.exists():
        pytest.skip("libibverbs-dev is not installed (scripts/bootstrap.sh installs it)")  # fails under CI=true
    source = tmp_path / "layout.c"
    source.write_text(program)
    subprocess.run(["gcc", "-o", str(tmp_path / "layout"), str(source)], check=True, capture_output=True, text=True)
    return subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True, text=True).stdout.split()


def test_the_probes_offsets_are_the_headers(tmp_path: Path) -> None:
    found_defines = re.findall(r"^#define (\w+) (0x[\da-f]+|\d+)", BPF_SOURCE.read_text(), re.MULTILINE)
    defines = {name: int(value, 0) for name, value in found_defines}
    members = [*OFFSETS.values(), *(f"offsetof({member})" for member in _CONTEXT_FIRST)]
    prints = "".join(f'    printf("%zu\\n", (size_t)({member}));\n' for member in members)
    found = _run(
        f"#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {{\n{prints}}}\n",
        tmp_path,
    )
    assert {name: defines[name] for name in OFFSETS} == dict(zip(OFFSETS, map(int, found), strict=False))
    assert found[len(OFFSETS) :] == ["0"] * len(_CONTEXT_FIRST)  # OBJECT_CONTEXT


def test_the_standins_structs_are_the_headers(tmp_path: Path) -> None:
    blocks = _BLOCK.findall((HERE / "libibverbs.c").read_text())
    assert len(blocks) >= 12
    renamed = "\n".join(
        re.sub(r"\b(struct|union) ibv_", r"\1 standin_ibv_", f"{kind} {name} {{{body}}};")
        for kind, name, body in blocks
    )
    checks = []
    for kind, name, body in blocks:
        checks.append(f'    printf("{name}.sizeof %zu %zu\\n", sizeof({kind} {name}), sizeof({kind} standin_{name}));')
        for group in _MEMBER.findall(re.sub(r"\{[^{}]*\}", "inner", body)):  # an inner struct: as one member
            for member in (m.strip() for m in group.split(",")):
                checks.append(
                    f'    printf("{name}.{member} %zu %zu\\n", offsetof({kind} {name}, {member}), '
                    f"offsetof({kind} standin_{name}, {member}));"
                )
    program = "\n".join(
        [
            "#include <stddef.h>",
            "#include <stdio.h>",
            "#include <stdint.h>",
            "#include <pthread.h>",
            "#include <infiniband/verbs.h>",
            renamed,
            "int main(void) {",
            *checks,
            "}",
        ]
    )
    lines = _run(program, tmp_path)
    rows = [lines[i : i + 3] for i in range(0, len(lines), 3)]
    assert len(rows) > 60
    assert [row for row in rows if row[1] != row[2]] == []


def test_the_kernels_work_request_and_completion_heads_are_the_headers(tmp_path: Path) -> None:
    source = BPF_SOURCE.read_text()
    stubs = "typedef unsigned int u32; typedef int s32; typedef unsigned long long u64;\n"
    checks = []
    for head, (header_struct, members) in HEADS.items():
        body = re.search(rf"^struct {head} \{{(.*?)^\}};", source, re.MULTILINE | re.DOTALL)
        assert body is not None, head
        stubs += f"struct {head} {{{body.group(1)}}};\n"
        checks += [
            f'    printf("{head}.{m} %zu %zu\\n", offsetof(struct {head}, {m}), offsetof({header_struct}, {m}));'
            for m in members
        ]
    lines = _run(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n"
        + stubs
        + "int main(void) {\n"
        + "\n".join(checks)
        + "\n}\n",
        tmp_path,
    )
    rows = [lines[i : i + 3] for i in range(0, len(lines), 3)]
    assert len(rows) == sum(len(members) for _, members in HEADS.values())
    assert [row for row in rows if row[1] != row[2]] == []


def test_the_record_is_the_decoders(tmp_path: Path) -> None:
    body = re.search(r"^struct verbs_call \{(.*?)^\};", BPF_SOURCE.read_text(), re.MULTILINE | re.DOTALL)
    assert body is not None
    names = re.findall(r"^\s*\w+ (\w+)(?:\[\w+\])?;", body.group(1), re.MULTILINE)
    prints = "".join(f'    printf("%zu\\n", offsetof(struct verbs_call, {name}));\n' for name in names)
    stubs = (
        "typedef unsigned char u8; typedef unsigned short u16; typedef unsigned int u32; "
        "typedef unsigned long long u64;\n"
    )
    program = (
        "#include <stddef.h>\n#include <stdio.h>\n"
        + stubs
        + "#define NAME_MAX_LEN 64\n"
        + f"struct verbs_call {{{body.group(1)}}};\n"
        + f'int main(void) {{\n{prints}    printf("%zu\\n", sizeof(struct verbs_call));\n}}\n'
    )
    found = list(map(int, _run(program, tmp_path)))
    # the decoder's offsets, one per member, from its format
    offsets, position = [], 0
    for count, code in re.findall(r"(\d*)([QIHBxs])", RECORD.format.lstrip("<")):
        if code in "sx":
            offsets.append(position)
            position += int(count or 1)
            continue
        for _ in range(int(count or 1)):
            offsets.append(position)
            position += struct.calcsize(code)
    assert found[:-1] == offsets
    assert found[-1] == (RECORD.size + 7) // 8 * 8  # the C struct, padded to its alignment
