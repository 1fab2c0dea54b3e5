"""``otel-ebpf flamegraph FILE``: any profile file -> SVG flame graph (and folded stacks).

Reads the file exporter's ``profiles.jsonl`` (OTLP/JSON, every line summed), a pprof profile
(``.pb``/``.pb.gz``, as Pyroscope and ``go tool pprof`` take), or folded stacks.
"""

from __future__ import annotations

import sys
from pathlib import Path

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest

from otel_ebpf.exporters.file import from_json_line
from otel_ebpf.profiles import flamegraph, otlp, pprof
from otel_ebpf.profiles.model import Profile


def load_profiles(path: Path) -> list[Profile] | None:
    """The profiles in an OTLP JSON Lines or pprof file; None for folded (or unknown) text."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b" or (data and data[:1] not in b"{[" and not _looks_like_text(data)):
        return [pprof.decode(data)]
    text = data.decode("utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        profiles: list[Profile] = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    request = from_json_line(line, ExportProfilesServiceRequest())
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: {exc}") from None
                profiles.extend(otlp.decode(request))
        return profiles
    return None


def _looks_like_text(data: bytes) -> bool:
    try:
        data[:4096].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\0" not in data[:4096]


def folded_stacks(path: Path, service: str | None = None) -> tuple[dict[str, int], str]:
    """Folded stacks of the file (of one service, when named) and a title."""
    profiles = load_profiles(path)
    if profiles is None:
        return flamegraph.parse_folded(path.read_text(errors="replace")), path.name
    chosen = [p for p in profiles if service is None or p.service_name == service]
    if not chosen:
        services = sorted({p.service_name for p in profiles})
        raise ValueError(f"no profile of service {service!r} in {path} (services: {', '.join(services) or 'none'})")
    names = sorted({p.service_name for p in chosen})
    title = f"{', '.join(names[:3])}{' …' if len(names) > 3 else ''} — {chosen[0].sample_types[0].type}"
    return flamegraph.merge_folded(flamegraph.folded(p) for p in chosen), title


def main(source: str, output: str | None, folded_out: str | None, service: str | None) -> int:
    path = Path(source)
    try:
        stacks, title = folded_stacks(path, service)
    except (OSError, ValueError) as exc:
        print(f"otel-ebpf flamegraph: {exc}", file=sys.stderr)
        return 1
    if not stacks:
        print(f"otel-ebpf flamegraph: no samples in {path}", file=sys.stderr)
        return 1
    svg_path = Path(output) if output else path.with_suffix(".svg")
    svg_path.write_text(flamegraph.render_svg(stacks, title))
    if folded_out:
        Path(folded_out).write_text(flamegraph.format_folded(stacks))
    print(f"{svg_path} ({sum(stacks.values())} samples, {len(stacks)} stacks)")
    return 0
