"""The resource of each observed process, for the signals the probes assemble themselves.

Spans and HTTP metrics get their resource from the ``ProcessInfo`` events the socket probe sends
(``Telemetry``); CPU profiles and GPU views look processes up as their samples arrive. Both build
the same attributes (:func:`telemetry.process_resource_attributes`), so a backend joins a
process's profile, GPU memory and spans on one resource.
"""

from __future__ import annotations

from collections import OrderedDict

from . import procfs
from .containers import ContainerResolver
from .pipeline.events import ProcessInfo
from .pipeline.telemetry import SDK_ATTRIBUTES, process_resource_attributes
from .protocol import Attributes

MAX_PROCESSES = 4096


class ProcessResources:
    """Resource attributes by pid, read from ``/proc`` on first use; at most ``max_processes``
    remembered, least recently used forgotten (a forgotten process is read again)."""

    def __init__(
        self,
        extra: Attributes,
        host_name: str,
        containers: ContainerResolver,
        max_processes: int = MAX_PROCESSES,
    ) -> None:
        self._extra = dict(extra)
        self._host_name = host_name
        self._containers = containers
        self._max = max_processes
        self._known: OrderedDict[int, Attributes] = OrderedDict()

    def of(self, pid: int) -> Attributes:
        known = self._known.get(pid)
        if known is not None:
            self._known.move_to_end(pid)
            return known
        # a process already gone still gets a resource: its pid and the agent's host
        info = procfs.process_info(pid, 0, self._containers) or ProcessInfo(0, pid, "", "", {})
        known = {**self._extra, **process_resource_attributes(info, self._host_name), **SDK_ATTRIBUTES}
        self._known[pid] = known
        if len(self._known) > self._max:
            self._known.popitem(last=False)
        return known

    def pop(self, pid: int) -> Attributes | None:
        """Forget ``pid`` (it exited); what was known of it, None if nothing was."""
        return self._known.pop(pid, None)
