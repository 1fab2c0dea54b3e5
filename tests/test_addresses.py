"""Socket ends as the kernel hands them over: a unix stream connection's paths and identities."""

from __future__ import annotations

import struct

from otel_ebpf.probes.addresses import unix_ends

SOCKET, PEER = struct.pack("<Q", 0xFFFF_8881_0A2B_3C00).ljust(16, b"\0"), struct.pack("<Q", 0xFFFF_8881_0A2B_4000)


def test_a_client_names_the_path_it_connected_to_as_its_peer() -> None:
    local, peer = unix_ends(SOCKET, PEER, b"/run/app.sock\0", path_of_peer=True)
    assert (local.address, peer.address, local.port, peer.port) == ("", "/run/app.sock", 0, 0)


def test_an_accepted_socket_has_its_listeners_path() -> None:
    local, peer = unix_ends(PEER, SOCKET, b"/run/app.sock\0", path_of_peer=False)
    assert (local.address, peer.address) == ("/run/app.sock", "")


def test_an_abstract_name_is_written_with_an_at_sign_and_keeps_all_its_bytes() -> None:
    local, _ = unix_ends(SOCKET, PEER, b"\0containerd\0shim", path_of_peer=False)
    assert local.address == "@containerd\0shim"


def test_the_two_ends_of_one_connection_name_each_other_without_kernel_addresses() -> None:
    client_local, client_peer = unix_ends(SOCKET, PEER, b"", path_of_peer=True)
    server_local, server_peer = unix_ends(PEER, SOCKET, b"", path_of_peer=False)
    assert client_local.socket_id == server_peer.socket_id != client_peer.socket_id == server_local.socket_id
    assert 0xFFFF_8881_0A2B_3C00 not in {client_local.socket_id, client_peer.socket_id}


def test_a_peer_already_gone_has_no_identity() -> None:
    _, peer = unix_ends(SOCKET, bytes(16), b"", path_of_peer=False)
    assert peer.socket_id == 0
