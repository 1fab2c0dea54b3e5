"""TC classifiers on network interfaces (clsact ingress and egress), through netlink (pyroute2).

The agent's filters go in at one priority of their own (:data:`PRIORITY`): a filter another tool put
on the interface is never touched, and one a killed agent left behind is replaced, not doubled.
The clsact qdisc is removed at detach only where this attachment added it.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Any

PRIORITY = 0xEB7C  # tc's "pref": ours alone on the interface
_HANDLE = 1
_PARENTS = {"ingress": "ffff:fff2", "egress": "ffff:fff3"}  # clsact's two hooks


class TcError(RuntimeError):
    """An interface that does not exist, or that the kernel would not let us attach to."""


@dataclass
class _Attached:
    ifindex: int
    added_qdisc: bool


class TcAttachment:
    """Direct-action BPF classifiers on interfaces by name; :meth:`detach` takes them all off."""

    def __init__(self) -> None:
        try:
            from pyroute2 import IPRoute, NetlinkError  # noqa: PLC0415 — needed only where a TC program attaches
        except ImportError as exc:
            raise TcError(f"attaching TC programs needs pyroute2: pip install 'otel-ebpf[roce]' ({exc})") from exc
        self._ipr = IPRoute()
        self._netlink_error: type[Exception] = NetlinkError
        self._attached: dict[str, _Attached] = {}

    def ifindex(self, interface: str) -> int:
        found = self._ipr.link_lookup(ifname=interface)
        if not found:
            raise TcError(f"no network interface named {interface!r}")
        return int(found[0])

    def attach(self, interface: str, programs: dict[str, Any]) -> None:
        """``programs``: hook (``ingress``/``egress``) -> a BCC function loaded as SCHED_CLS."""
        ifindex = self.ifindex(interface)
        try:
            self._ipr.tc("add", "clsact", ifindex)
            added_qdisc = True
        except self._netlink_error as exc:
            if getattr(exc, "code", None) != errno.EEXIST:  # clsact there already: someone else's
                raise TcError(f"cannot add a clsact qdisc to {interface}: {exc}") from exc
            added_qdisc = False
        self._attached[interface] = _Attached(ifindex, added_qdisc)
        for hook, function in programs.items():
            self._remove_filter(ifindex, hook)  # one a killed agent left behind
            try:
                self._ipr.tc(
                    "add-filter",
                    "bpf",
                    ifindex,
                    _HANDLE,
                    fd=function.fd,
                    name=function.name,
                    parent=_PARENTS[hook],
                    prio=PRIORITY,
                    classid=1,
                    direct_action=True,
                )
            except self._netlink_error as exc:
                raise TcError(f"cannot attach to {interface} {hook}: {exc}") from exc

    def detach(self) -> None:
        """Every filter this attachment added, and the qdiscs it added; interfaces gone meanwhile
        took theirs with them."""
        for attached in self._attached.values():
            for hook in _PARENTS:
                self._remove_filter(attached.ifindex, hook)
            if attached.added_qdisc:
                try:
                    self._ipr.tc("del", "clsact", attached.ifindex)
                except self._netlink_error:  # the interface is gone, and its qdisc with it
                    pass
        self._attached.clear()
        self._ipr.close()

    def _remove_filter(self, ifindex: int, hook: str) -> None:
        try:
            self._ipr.tc("del-filter", "bpf", ifindex, _HANDLE, parent=_PARENTS[hook], prio=PRIORITY)
        except self._netlink_error:  # none there (ENOENT), or the interface is gone
            pass
