"""A directory tree laid out as ``/sys/class/infiniband`` is, for tests on a machine without RDMA
devices: two devices with one port each, their counters, GID tables and LIDs.

The layout is the kernel's (drivers/infiniband/core/sysfs.c): ``<device>/ports/<port>/counters/*``,
``hw_counters/*``, ``gids/<index>``, ``lid``. GID 3 of each port is a RoCEv2 GID (IPv4-mapped),
as the stand-in driver's queue pairs use them.
"""

from __future__ import annotations

from pathlib import Path

GIDS = {  # device -> port 1's GID table (index -> text, as the kernel writes it)
    "mlx5_0": {0: "fe80:0000:0000:0000:0202:c9ff:fe00:0001", 3: "0000:0000:0000:0000:0000:ffff:0a00:0001"},
    "mlx5_1": {0: "fe80:0000:0000:0000:0202:c9ff:fe00:0002", 3: "0000:0000:0000:0000:0000:ffff:0a00:0002"},
}
COUNTERS = {  # device -> group -> name -> value at the start
    "mlx5_0": {
        "counters": {
            "port_xmit_data": 250_000,
            "port_rcv_data": 125_000,
            "port_xmit_packets": 4000,
            "port_rcv_packets": 3000,
            "symbol_error": 0,
            "link_downed": 1,
        },
        "hw_counters": {
            "out_of_sequence": 5,
            "packet_seq_err": 2,
            "local_ack_timeout_err": 1,
            "np_cnp_sent": 7,
            "rp_cnp_handled": 3,
            "lifespan": 10,  # not a counter: left out
        },
    },
    "mlx5_1": {"counters": {"port_xmit_data": 8, "port_rcv_data": 4}, "hw_counters": {}},
}


def build(root: Path) -> Path:
    """The tree under ``root`` (created); returns ``root``."""
    for device, groups in COUNTERS.items():
        port = root / device / "ports" / "1"
        for group, values in groups.items():
            (port / group).mkdir(parents=True, exist_ok=True)
            for name, value in values.items():
                (port / group / name).write_text(f"{value}\n")
        (port / "gids").mkdir(exist_ok=True)
        for index, gid in GIDS[device].items():
            (port / "gids" / str(index)).write_text(f"{gid}\n")
        (port / "lid").write_text("0x0\n")  # RoCE: no LID
        (port / "state").write_text("4: ACTIVE\n")  # not a counter folder: ignored
    return root


def bump(root: Path, device: str, group: str, name: str, by: int) -> int:
    """Add ``by`` to one counter, as traffic would; returns its new value."""
    path = root / device / "ports" / "1" / group / name
    value = int(path.read_text()) + by
    path.write_text(f"{value}\n")
    return value
