"""Folded stacks and SVG flame graphs, from any :class:`Profile` (or a folded-stack file).

Folded stacks are Brendan Gregg's format, one ``root;...;leaf count`` line per distinct stack,
read by ``flamegraph.pl``, speedscope, Pyroscope (``format=folded``) and :func:`render_svg`. The SVG
is self-contained (no script): one rectangle per frame, width proportional to its samples, a
tooltip (``<title>``) with the full name and share, colours by frame kind (Python green, native
orange, kernel red-brown).
"""

from __future__ import annotations

import hashlib
import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from otel_ebpf.profiles.model import FrameKind, Profile

WIDTH = 1200
FRAME_HEIGHT = 16
FONT_SIZE = 11
MIN_WIDTH = 0.3  # px: narrower frames are left out (their parent still counts them)
_KIND_MARK = {FrameKind.PYTHON: "", FrameKind.NATIVE: "", FrameKind.KERNEL: "_[k]"}


def _label(frame) -> str:
    # ';' separates frames in the folded format; keep it out of names
    return (frame.label() + _KIND_MARK[frame.kind]).replace(";", ":").replace("\n", " ")


def folded(profile: Profile, index: int = 0) -> dict[str, int]:
    """``root;...;leaf`` -> value (sample type ``index``), for one profile."""
    out: dict[str, int] = {}
    for key, values in profile.samples.items():
        line = ";".join(_label(f) for f in reversed(key.stack)) or "[no stack]"
        out[line] = out.get(line, 0) + values[index]
    return out


def format_folded(stacks: Mapping[str, int]) -> str:
    return "".join(f"{line} {count}\n" for line, count in sorted(stacks.items()) if count > 0)


def parse_folded(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for raw in text.splitlines():
        line, _, count = raw.rstrip().rpartition(" ")
        if line and count.isdigit():
            out[line] = out.get(line, 0) + int(count)
    return out


@dataclass
class _Node:
    name: str
    value: int = 0
    children: dict[str, _Node] = field(default_factory=dict)


def _tree(stacks: Mapping[str, int]) -> _Node:
    root = _Node("all")
    for line, count in stacks.items():
        root.value += count
        node = root
        for name in line.split(";"):
            node = node.children.setdefault(name, _Node(name))
            node.value += count
    return root


def _colour(name: str) -> str:
    h = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=2).digest(), "big") / 65535
    if name.endswith("_[k]"):
        return f"rgb({200 + int(40 * h)},{110 + int(40 * h)},{80 + int(30 * h)})"
    if name.endswith(")") and ".py:" in name or name.endswith(".py)"):
        return f"rgb({80 + int(60 * h)},{170 + int(50 * h)},{90 + int(40 * h)})"
    return f"rgb({225 + int(30 * h)},{120 + int(80 * h)},{40 + int(40 * h)})"


def render_svg(stacks: Mapping[str, int], title: str = "CPU flame graph", unit: str = "samples") -> str:
    """An SVG flame graph (root at the bottom) of folded ``stacks``."""
    root = _tree(stacks)
    total = max(root.value, 1)
    scale = (WIDTH - 20) / total
    rects: list[str] = []
    depth_max = 0

    def walk(node: _Node, x: float, depth: int) -> None:
        nonlocal depth_max
        width = node.value * scale
        if width < MIN_WIDTH:
            return
        depth_max = max(depth_max, depth)
        rects.append((x, depth, width, node))  # type: ignore[arg-type]
        child_x = x
        for child in sorted(node.children.values(), key=lambda n: n.name):
            walk(child, child_x, depth + 1)
            child_x += child.value * scale

    walk(root, 10.0, 0)
    height = (depth_max + 1) * FRAME_HEIGHT + 60
    out = [
        f'<?xml version="1.0" standalone="no"?>\n<svg version="1.1" width="{WIDTH}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg" font-family="Verdana, sans-serif" font-size="{FONT_SIZE}">',
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#f8f8f8"/>',
        f'<text x="{WIDTH // 2}" y="24" text-anchor="middle" font-size="16">{html.escape(title)}</text>',
    ]
    for x, depth, width, node in rects:  # type: ignore[misc]
        y = height - 20 - (depth + 1) * FRAME_HEIGHT
        share = 100.0 * node.value / total
        name = html.escape(node.name)
        fill = "rgb(230,230,230)" if depth == 0 else _colour(node.name)
        out.append(
            f"<g><title>{name} ({node.value} {unit}, {share:.2f}%)</title>"
            f'<rect x="{x:.1f}" y="{y}" width="{width:.1f}" height="{FRAME_HEIGHT - 1}" fill="{fill}" rx="2"/>'
        )
        chars = int(width / (FONT_SIZE * 0.6))
        if chars >= 3:
            text = node.name if len(node.name) <= chars else node.name[: chars - 2] + ".."
            out.append(f'<text x="{x + 3:.1f}" y="{y + FRAME_HEIGHT - 4}">{html.escape(text)}</text>')
        out.append("</g>")
    out.append("</svg>\n")
    return "\n".join(out)


def merge_folded(many: Iterable[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for stacks in many:
        for line, count in stacks.items():
            out[line] = out.get(line, 0) + count
    return out


def shares(stacks: Mapping[str, int], names: Sequence[str]) -> dict[str, float]:
    """Share (0..1) of the total held by stacks containing each of ``names`` as a frame prefix."""
    total = sum(stacks.values()) or 1
    return {
        name: sum(c for line, c in stacks.items() if any(part.startswith(name) for part in line.split(";"))) / total
        for name in names
    }
