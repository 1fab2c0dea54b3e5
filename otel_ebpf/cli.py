"""``otel-ebpf``: run the agent, check the node, record and replay event streams, advise on what it saw."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__

EXIT_CONFIG = 2


def _add_config_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="YAML configuration file (see docs/configuration.md)")


def _add_target_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("targets (none given: every process but the agent)")
    g.add_argument("--pid", type=int, action="append", metavar="PID", help="trace this process (repeatable)")
    g.add_argument(
        "--port",
        type=int,
        action="append",
        metavar="PORT",
        help="only connections with this local or peer port (repeatable)",
    )
    g.add_argument(
        "--exe",
        action="append",
        metavar="GLOB",
        help="trace processes whose executable path or name, or process name, matches (repeatable)",
    )


def _add_export_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("export")
    g.add_argument(
        "--exporter",
        action="append",
        choices=("otlp", "file", "console", "prometheus"),
        help="where telemetry goes (repeatable); default: otlp when OTEL_EXPORTER_OTLP_ENDPOINT is set, else file",
    )
    g.add_argument("--output", metavar="DIR", help="file exporter directory (default ./otel-ebpf-data)")
    g.add_argument("--otlp-endpoint", metavar="URL", help="OTLP endpoint (default per OTEL_* variables)")
    g.add_argument("--otlp-protocol", choices=("grpc", "http/protobuf"), help="OTLP transport")
    g.add_argument("--prometheus-host", metavar="HOST", help="prometheus exporter: listen address (default localhost)")
    g.add_argument(
        "--prometheus-port", type=int, metavar="PORT", help="prometheus exporter: /metrics port (default 9464)"
    )


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, metavar="SECONDS", help="stop after this long (default: until signalled)")
    p.add_argument("--ready-file", metavar="PATH", help="created once every probe is attached")
    p.add_argument(
        "--health-port",
        type=int,
        metavar="PORT",
        help="serve /healthz and /readyz on this port (they also come with --exporter prometheus)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="otel-ebpf", description=__doc__)
    parser.add_argument("--version", action="version", version=f"otel-ebpf {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="attach the probes and export telemetry", argument_default=argparse.SUPPRESS)
    _add_config_options(run)
    _add_target_options(run)
    _add_export_options(run)
    _add_run_options(run)
    run.add_argument("--record", metavar="FILE", help="also save the decoded event stream to FILE")
    prof = run.add_argument_group("CPU profiling (docs/profiling.md)")
    prof.add_argument("--profile", action="store_const", const=True, help="sample CPU stacks (Python + native)")
    prof.add_argument("--profile-frequency", type=int, metavar="HZ", help="samples per second per CPU (default 49)")
    prof.add_argument("--pyroscope-url", metavar="URL", help="also send profiles to this Pyroscope server")
    run.add_argument(
        "--inject-traceparent",
        action="store_const",
        const=True,
        help="insert W3C traceparent into traced processes' HTTP/1 requests (docs/kubernetes.md)",
    )
    run.add_argument(
        "--gpu",
        choices=("auto", "true", "false"),
        help="CUDA/NCCL views (docs/gpu.md): auto (default) once a target maps a GPU library",
    )

    sub.add_parser("doctor", help="check the kernel features, mounts and libraries the agent needs")

    record = sub.add_parser(
        "record", help="save the decoded event stream (no export)", argument_default=argparse.SUPPRESS
    )
    _add_config_options(record)
    _add_target_options(record)
    _add_run_options(record)
    record.add_argument("--output", required=True, metavar="FILE", dest="record", help="recording to write")

    replay = sub.add_parser("replay", help="run the pipeline over a recording", argument_default=argparse.SUPPRESS)
    replay.add_argument("recording", metavar="FILE")
    _add_config_options(replay)
    _add_export_options(replay)

    flame = sub.add_parser("flamegraph", help="render a profile file (profiles.jsonl, pprof, folded) as SVG")
    flame.add_argument("profile_file", metavar="FILE")
    flame.add_argument("--output", "-o", metavar="SVG", help="SVG to write (default: FILE with .svg)")
    flame.add_argument("--folded", metavar="FILE", help="also write the folded stacks here")
    flame.add_argument("--service", metavar="NAME", help="only this service's samples")

    advise = sub.add_parser("advise", help="ranked findings, with evidence, from what the agent wrote (docs/advise.md)")
    advise.add_argument("directory", metavar="DIR", help="the file exporter's output directory")
    advise.add_argument("--json", action="store_true", help="print the findings as JSON")
    advise.add_argument(
        "--llm", metavar="URL", help="also have this OpenAI-compatible endpoint explain the top findings (redacted)"
    )
    advise.add_argument("--llm-model", metavar="NAME", default="default", help="model to ask (default: default)")
    advise.add_argument("--llm-top", type=int, metavar="N", default=3, help="findings to explain (default 3)")
    advise.add_argument(
        "--peak-bandwidth",
        type=float,
        metavar="GB/S",
        help="the GPU's peak memory bandwidth, for the MBU estimate (default: from a table by the device's name)",
    )
    return parser


# Flags that are not configuration keys.
_NOT_CONFIG = {"command", "verbose", "record", "recording"}


def _load_config(args: argparse.Namespace) -> Any:
    from .config import ConfigError, load_config  # noqa: PLC0415 — each command imports only what it runs: doctor must work when the rest cannot

    flags = {k: v for k, v in vars(args).items() if k not in _NOT_CONFIG}
    try:
        return load_config(flags, os.environ)
    except ConfigError as exc:
        print(f"otel-ebpf: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from exc


def _cmd_doctor() -> int:
    from .doctor import print_report, run_checks  # noqa: PLC0415

    return print_report(run_checks(), sys.stdout)


def _cmd_run(args: argparse.Namespace, export: bool) -> int:
    from .agent import run_live  # noqa: PLC0415
    from .preflight import check_start  # noqa: PLC0415

    config = _load_config(args)
    record_path = getattr(args, "record", None)
    check_start(config, record_path, export)
    if os.geteuid() != 0:
        print(
            "otel-ebpf: attaching eBPF programs needs root (or CAP_BPF + CAP_PERFMON); "
            "run `otel-ebpf doctor` for details",
            file=sys.stderr,
        )
        return 1
    if record_path is None:
        return run_live(config, None, export)
    with open(record_path, "w", encoding="utf-8") as stream:
        return run_live(config, stream, export)


def _cmd_replay(args: argparse.Namespace) -> int:
    from .agent import replay  # noqa: PLC0415
    from .preflight import check_outputs  # noqa: PLC0415
    from .recording import RecordingError, read_recording  # noqa: PLC0415

    config = _load_config(args)
    if "prometheus" in config.exporters:
        print(
            "otel-ebpf: the prometheus exporter is scraped from a running agent; a replay ends before "
            "any scrape: use the file, otlp or console exporter",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    check_outputs(config, None)
    try:
        with open(args.recording, encoding="utf-8") as stream:
            header, events = read_recording(stream)
            replay(config, header, events)
    except OSError as exc:
        print(f"otel-ebpf: cannot read recording: {exc}", file=sys.stderr)
        return 1
    except RecordingError as exc:
        # Everything before the bad line was replayed and exported.
        print(f"otel-ebpf: {args.recording}: {exc}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from .preflight import StartupError  # noqa: PLC0415

    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "doctor":
            return _cmd_doctor()
        if args.command == "run":
            return _cmd_run(args, export=True)
        if args.command == "record":
            return _cmd_run(args, export=False)
        if args.command == "flamegraph":
            from .profiles.render import main as render_main  # noqa: PLC0415

            return render_main(args.profile_file, args.output, args.folded, args.service)
        if args.command == "advise":
            from .advise.command import main as advise_main  # noqa: PLC0415

            return advise_main(args.directory, args.json, args.llm, args.llm_model, args.llm_top, args.peak_bandwidth)
        return _cmd_replay(args)
    except StartupError as exc:
        print(f"otel-ebpf: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (RuntimeError, ImportError) as exc:  # a probe that cannot load, a broken plugin
        print(f"otel-ebpf: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
