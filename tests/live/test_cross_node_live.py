"""Live BPF: one call across two nodes, each watched by its own agent (issue 15).

A node is stood for by a network namespace and a PID namespace of its own (tests/live/node.py):
node A is the root network namespace, node B one the test creates, joined by a veth pair. Each node
runs an agent in sidecar mode, which traces that node's processes and sees no other's, so only the
wire can join what the two export. A client on A calls a proxy on B, whose handler calls a server
on A: both hops cross the veth, where a packet socket reads each handshake's addresses, ports and
sequence numbers.

With traceparent injection on, the four spans (client CLIENT, proxy SERVER, proxy CLIENT, server
SERVER) are one trace, each the parent of the next, though no agent saw both ends of a hop: the far
agent read the header the near one inserted. The server got the request exactly as the proxy wrote
it but for one added ``traceparent`` line. With injection off nothing is added, and the halves of
each hop carry the join attributes: the peer each side saw and the handshake's two sequence numbers,
as the wire has them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.live.file_agent import kill_all, start_file_agent, stop_file_agent
from tests.live.node import node, pid_in_node
from tests.live.test_inject_live import Peer, _head, _outcomes, _sent, _span, _without_injected
from tests.live.test_isn_join_live import CLIENT_ISN, SERVER_ISN, HandshakeCapture
from tests.live.veth_pair import veth_pair
from tests.otlp_receiver import load_file_metrics, load_file_spans

pytestmark = pytest.mark.bpf

PATH = "/across"
CONFIG = "capture:\n  socket_mode: {socket_mode}\ntrace:\n  inject_traceparent: {inject}\n"


def _assert_joinable(client_span: dict, server_span: dict, connection: tuple, isns: tuple) -> None:
    """The CLIENT span of one node and the SERVER span of the other carry what joins them: each the
    other end's address and port as the wire has them, and the handshake's sequence numbers."""
    client_address, client_port, server_address, server_port = connection
    for span, peer in ((client_span, (server_address, server_port)), (server_span, (client_address, client_port))):
        attributes = span["attributes"]
        assert (attributes["network.peer.address"], attributes["network.peer.port"]) == peer, (span, connection)
        assert (attributes.get(CLIENT_ISN), attributes.get(SERVER_ISN)) == isns, (span, isns)


@pytest.mark.parametrize("inject", [True, False], ids=["injection-on", "injection-off"])
@pytest.mark.parametrize("socket_mode", ["tracepoints", "fd-tracking"])
def test_one_call_across_two_nodes(tmp_path: Path, socket_mode: str, inject: bool) -> None:
    config = CONFIG.format(socket_mode=socket_mode, inject=str(inject).lower())
    with veth_pair("oexn", 252) as pair, node() as node_a, node(pair.namespace) as node_b:
        server = Peer("recorder", "--listen", pair.outer_ipv4, popen=node_a.popen)
        server_port = int(server.first)
        proxy = Peer("proxy", "--listen", pair.inner_ipv4, f"{pair.outer_ipv4}:{server_port}", popen=node_b.popen)
        proxy_port = int(proxy.first)
        client = Peer("client", f"{pair.inner_ipv4}:{proxy_port}", popen=node_a.popen)
        pids = {peer: pid_in_node(peer.process) for peer in (server, proxy, client)}
        agents = []
        try:
            for name, where in (("a", node_a), ("b", node_b)):
                (tmp_path / name).mkdir()
                agents.append(start_file_agent(tmp_path / name, (), config, popen=where.popen))
            capture = HandshakeCapture(pair.outer, proxy_port, server_port)
            try:
                assert client.send({"path": PATH}) == "200"
                head = _head(server)
            finally:
                capture.close()
            for agent in agents:
                stop_file_agent(agent)
        finally:
            kill_all(*agents)
            for peer in (client, proxy, server):
                peer.close()

    spans_a, spans_b = (load_file_spans(tmp_path / name / "out") for name in ("a", "b"))
    outcomes_a, outcomes_b = (_outcomes(load_file_metrics(tmp_path / name / "out")) for name in ("a", "b"))
    # each agent exported its own node's two spans of the call, and nothing else
    assert len(spans_a) == len(spans_b) == 2, (spans_a, spans_b)
    client_span = _span(spans_a, "CLIENT", pids[client], PATH)
    server_span = _span(spans_a, "SERVER", pids[server], PATH)
    proxy_server = _span(spans_b, "SERVER", pids[proxy], PATH)
    proxy_call = _span(spans_b, "CLIENT", pids[proxy], PATH)

    # both hops crossed the wire once each; their halves carry the same join attributes as it
    to_proxy, to_server = (
        [(c, isns) for c, isns in capture.handshakes.items() if c[2:] == address]
        for address in ((pair.inner_ipv4, proxy_port), (pair.outer_ipv4, server_port))
    )
    assert len(to_proxy) == len(to_server) == 1 and len(capture.handshakes) == 2, capture.handshakes
    _assert_joinable(client_span, proxy_server, *to_proxy[0])
    _assert_joinable(proxy_call, server_span, *to_server[0])

    sent = _sent(PATH, server_port, host=pair.outer_ipv4)  # what the proxy's http.client wrote
    if inject:
        # one trace: client CLIENT -> proxy SERVER -> proxy CLIENT -> server SERVER
        chain = [client_span, proxy_server, proxy_call, server_span]
        assert {s["trace_id"] for s in chain} == {client_span["trace_id"]}, chain
        assert [s["parent_span_id"] for s in chain] == [None, *(s["span_id"] for s in chain[:-1])], chain
        # the server got the proxy's request byte for byte, but for one line carrying the proxy's call
        received, ids = _without_injected(head)
        assert received == sent, head
        assert ids == (proxy_call["trace_id"], proxy_call["span_id"])
        # each agent inserted the line into its node's one outgoing request, and did nothing else
        for outcomes in (outcomes_a, outcomes_b):
            assert {outcome: count for outcome, count in outcomes.items() if count} == {"injected": 1}, outcomes
    else:
        assert head == sent
        assert outcomes_a == outcomes_b == {}
        # the proxy's call continues its request (one process: its agent joins them); nothing else joins
        assert proxy_call["parent_span_id"] == proxy_server["span_id"]
        assert len({client_span["trace_id"], proxy_server["trace_id"], server_span["trace_id"]}) == 3
        assert client_span["parent_span_id"] is None and server_span["parent_span_id"] is None
