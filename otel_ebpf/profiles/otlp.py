"""Profiles <-> OTLP ``profiles/v1development`` messages (opentelemetry-proto >= 1.43).

:func:`encode` builds one ``ExportProfilesServiceRequest`` for a batch of :class:`Profile`: one
``ResourceProfiles`` per resource, every string, function, mapping, location, stack, link and
attribute stored once in the shared ``ProfilesDictionary`` whose tables all start with the zero
value at index 0, as the protocol requires. Stacks are leaf first. :func:`decode` reads such a
request back (the ``flamegraph`` command renders ``profiles.jsonl`` through it), and
:func:`validate` checks the dictionary rules a receiver relies on.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from otel_ebpf import __version__
from otel_ebpf.profiles.model import Frame, FrameKind, Profile, SampleKey, ValueType

SCOPE_NAME = "otel-ebpf"
FRAME_TYPE = "profile.frame.type"  # semantic convention: cpython, native, kernel, ...
BUILD_ID = "process.executable.build_id.gnu"
_FRAME_TYPES = {FrameKind.PYTHON: "cpython", FrameKind.NATIVE: "native", FrameKind.KERNEL: "kernel"}
_KINDS = {value: kind for kind, value in _FRAME_TYPES.items()}


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, (list, tuple)):
        result = AnyValue()
        result.array_value.values.extend(any_value(v) for v in value)
        return result
    return AnyValue(string_value=str(value))


def plain_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class _Table:
    """Values stored once; index 0 is the zero value."""

    def __init__(self, zero: Hashable) -> None:
        self.index: dict[Hashable, int] = {zero: 0}

    def add(self, key: Hashable) -> tuple[int, bool]:
        known = self.index.get(key)
        if known is not None:
            return known, False
        self.index[key] = len(self.index)
        return self.index[key], True


class _Encoder:
    def __init__(self) -> None:
        self.dictionary = pb.ProfilesDictionary()
        d = self.dictionary
        d.string_table.append("")
        d.mapping_table.add()
        d.location_table.add()
        d.function_table.add()
        d.link_table.add()
        d.attribute_table.add()
        d.stack_table.add()
        self._strings = _Table("")
        self._mappings = _Table(None)
        self._locations = _Table(None)
        self._functions = _Table(None)
        self._links = _Table(None)
        self._attributes = _Table(None)
        self._stacks = _Table(())

    def string(self, text: str) -> int:
        i, new = self._strings.add(text)
        if new:
            self.dictionary.string_table.append(text)
        return i

    def attribute(self, key: str, value: Any) -> int:
        i, new = self._attributes.add((key, repr(value)))
        if new:
            self.dictionary.attribute_table.add(key_strindex=self.string(key), value=any_value(value))
        return i

    def function(self, name: str, filename: str) -> int:
        i, new = self._functions.add((name, filename))
        if new:
            n = self.string(name)
            self.dictionary.function_table.add(
                name_strindex=n, system_name_strindex=n, filename_strindex=self.string(filename)
            )
        return i

    def mapping(self, module: str, build_id: str) -> int:
        if not module:
            return 0
        i, new = self._mappings.add((module, build_id))
        if new:
            attrs = [self.attribute(BUILD_ID, build_id)] if build_id else []
            self.dictionary.mapping_table.add(filename_strindex=self.string(module), attribute_indices=attrs)
        return i

    def location(self, frame: Frame) -> int:
        i, new = self._locations.add(frame)
        if new:
            location = self.dictionary.location_table.add(
                mapping_index=self.mapping(frame.module, frame.build_id) if frame.kind is FrameKind.NATIVE else 0,
                address=frame.address,
                attribute_indices=[self.attribute(FRAME_TYPE, _FRAME_TYPES[frame.kind])],
            )
            filename = frame.file if frame.kind is FrameKind.PYTHON else frame.module
            location.lines.add(function_index=self.function(frame.function, filename), line=frame.line)
        return i

    def stack(self, frames: Sequence[Frame]) -> int:
        locations = tuple(self.location(f) for f in frames)
        i, new = self._stacks.add(locations)
        if new:
            self.dictionary.stack_table.add(location_indices=locations)
        return i

    def link(self, trace_id: int, span_id: int) -> int:
        i, new = self._links.add((trace_id, span_id))
        if new:
            self.dictionary.link_table.add(trace_id=trace_id.to_bytes(16, "big"), span_id=span_id.to_bytes(8, "big"))
        return i

    def value_type(self, value_type: ValueType) -> pb.ValueType:
        return pb.ValueType(type_strindex=self.string(value_type.type), unit_strindex=self.string(value_type.unit))

    def profile(self, profile: Profile, into: pb.Profile) -> None:
        into.sample_type.CopyFrom(self.value_type(profile.sample_types[0]))
        into.period_type.CopyFrom(self.value_type(profile.period_type))
        into.period = profile.period
        into.time_unix_nano = profile.start_ns
        into.duration_nano = max(0, profile.end_ns - profile.start_ns)
        for key, values in profile.samples.items():
            sample = into.samples.add(stack_index=self.stack(key.stack), values=values[:1])
            if key.link is not None:
                sample.link_index = self.link(*key.link)
            sample.attribute_indices.extend(self.attribute(k, v) for k, v in key.attributes)
            sample.timestamps_unix_nano.extend(profile.timestamps.get(key, ()))


def encode(profiles: Iterable[Profile], scope_name: str = SCOPE_NAME) -> ExportProfilesServiceRequest:
    """One export request for ``profiles``. A profile with several sample types becomes one OTLP
    profile per type (OTLP profiles carry a single sample type each)."""
    encoder = _Encoder()
    request = ExportProfilesServiceRequest()
    by_resource: dict[tuple, pb.ScopeProfiles] = {}
    for profile in profiles:
        rkey = tuple(sorted((k, repr(v)) for k, v in profile.resource.items()))
        scope = by_resource.get(rkey)
        if scope is None:
            resource_profiles = request.resource_profiles.add()
            resource_profiles.resource.CopyFrom(
                Resource(attributes=[KeyValue(key=k, value=any_value(v)) for k, v in profile.resource.items()])
            )
            scope = by_resource[rkey] = resource_profiles.scope_profiles.add(
                scope=InstrumentationScope(name=scope_name, version=__version__)
            )
        for index, sample_type in enumerate(profile.sample_types):
            single = profile if len(profile.sample_types) == 1 else _only(profile, index)
            encoder.profile(single, scope.profiles.add())
    request.dictionary.CopyFrom(encoder.dictionary)
    return request


def _only(profile: Profile, index: int) -> Profile:
    return Profile(
        profile.resource,
        (profile.sample_types[index],),
        profile.period_type,
        profile.period,
        profile.start_ns,
        profile.end_ns,
        {k: [v[index]] for k, v in profile.samples.items()},
        profile.timestamps,
    )


def decode(request: ExportProfilesServiceRequest) -> list[Profile]:
    """The profiles of an export request (one per OTLP profile)."""
    d = request.dictionary
    strings = list(d.string_table)

    def text(i: int) -> str:
        return strings[i] if 0 <= i < len(strings) else ""

    def attributes(indices: Iterable[int]) -> dict[str, Any]:
        return {text(d.attribute_table[i].key_strindex): plain_value(d.attribute_table[i].value) for i in indices}

    frames: dict[int, Frame] = {}

    def frame(li: int) -> Frame:
        known = frames.get(li)
        if known is not None:
            return known
        location = d.location_table[li]
        kind = _KINDS.get(attributes(location.attribute_indices).get(FRAME_TYPE), FrameKind.NATIVE)
        line = location.lines[-1] if location.lines else pb.Line()
        function = d.function_table[line.function_index]
        mapping = d.mapping_table[location.mapping_index]
        filename = text(function.filename_strindex)
        frames[li] = known = Frame(
            text(function.name_strindex),
            file=filename if kind is FrameKind.PYTHON else "",
            line=line.line,
            module=text(mapping.filename_strindex) or (filename if kind is not FrameKind.PYTHON else ""),
            kind=kind,
            address=location.address,
            build_id=str(attributes(mapping.attribute_indices).get(BUILD_ID, "")),
        )
        return known

    def value_type(v: pb.ValueType) -> ValueType:
        return ValueType(text(v.type_strindex), text(v.unit_strindex))

    profiles = []
    for resource_profiles in request.resource_profiles:
        resource = {kv.key: plain_value(kv.value) for kv in resource_profiles.resource.attributes}
        for scope in resource_profiles.scope_profiles:
            for p in scope.profiles:
                profile = Profile(
                    resource,
                    (value_type(p.sample_type),),
                    value_type(p.period_type),
                    p.period,
                    p.time_unix_nano,
                    p.time_unix_nano + p.duration_nano,
                )
                for sample in p.samples:
                    stack = tuple(frame(i) for i in d.stack_table[sample.stack_index].location_indices)
                    link = None
                    if sample.link_index:
                        raw = d.link_table[sample.link_index]
                        link = (int.from_bytes(raw.trace_id, "big"), int.from_bytes(raw.span_id, "big"))
                    attrs = tuple(sorted(attributes(sample.attribute_indices).items()))
                    key = SampleKey(stack, link, attrs)
                    values = list(sample.values) or [len(sample.timestamps_unix_nano)]
                    known = profile.samples.get(key)
                    if known is None:
                        profile.samples[key] = values
                    else:
                        known[0] += values[0]
                profiles.append(profile)
    return profiles


def validate(request: ExportProfilesServiceRequest) -> list[str]:
    """Violations of the dictionary rules (empty when the request is well formed)."""
    d = request.dictionary
    problems = []
    zero_checks: Mapping[str, Any] = {
        "string_table": d.string_table[0] == "" if d.string_table else False,
        "mapping_table": len(d.mapping_table) > 0 and d.mapping_table[0] == pb.Mapping(),
        "location_table": len(d.location_table) > 0 and d.location_table[0] == pb.Location(),
        "function_table": len(d.function_table) > 0 and d.function_table[0] == pb.Function(),
        "link_table": len(d.link_table) > 0 and d.link_table[0] == pb.Link(),
        "attribute_table": len(d.attribute_table) > 0 and d.attribute_table[0] == pb.KeyValueAndUnit(),
        "stack_table": len(d.stack_table) > 0 and d.stack_table[0] == pb.Stack(),
    }
    problems += [f"{table}[0] is not the zero value" for table, ok in zero_checks.items() if not ok]
    n_str = len(d.string_table)

    def check(what: str, index: int, size: int) -> None:
        if not 0 <= index < size:
            problems.append(f"{what} index {index} out of range (size {size})")

    for f in d.function_table:
        check("function name", f.name_strindex, n_str)
        check("function file", f.filename_strindex, n_str)
    for loc in d.location_table:
        check("location mapping", loc.mapping_index, len(d.mapping_table))
        for line in loc.lines:
            check("line function", line.function_index, len(d.function_table))
    for stack in d.stack_table:
        for i in stack.location_indices:
            check("stack location", i, len(d.location_table))
    for a in d.attribute_table:
        check("attribute key", a.key_strindex, n_str)
    for rp in request.resource_profiles:
        for sp in rp.scope_profiles:
            for p in sp.profiles:
                check("sample type", p.sample_type.type_strindex, n_str)
                check("period type", p.period_type.type_strindex, n_str)
                for s in p.samples:
                    check("sample stack", s.stack_index, len(d.stack_table))
                    check("sample link", s.link_index, len(d.link_table))
                    for i in s.attribute_indices:
                        check("sample attribute", i, len(d.attribute_table))
                    if len(s.values) != 1:
                        problems.append(f"sample has {len(s.values)} values for one sample type")
                    if s.stack_index == 0:
                        problems.append("sample without a stack")
    return problems
