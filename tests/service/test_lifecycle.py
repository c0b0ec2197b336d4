"""lifecycle.ClientWatch on real sockets: a client's hang-up is seen by polling its connection, before the server's
event loop has read it (waitress' own flag still says connected)."""
from __future__ import annotations

import socket
import time

from ortllm.service.lifecycle import ClientWatch


class _Channel:
    """What waitress puts behind environ["waitress.client_disconnected"]: a channel's bound method; its socket."""

    def __init__(self, sock: socket.socket):
        self.socket, self.connected = sock, True

    def check_client_disconnected(self) -> bool:
        return not self.connected


def _pair():
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    server.close()
    return client, conn


def test_a_hang_up_is_seen_at_once():
    client, conn = _pair()
    channel = _Channel(conn)
    watch = ClientWatch({"waitress.client_disconnected": channel.check_client_disconnected})
    assert not watch.gone()
    client.sendall(b"GET / HTTP/1.1\r\n\r\n")        # more bytes (a pipelined request) are not a hang-up
    time.sleep(0.05)
    assert not watch.gone()
    client.close()
    end = time.monotonic() + 1
    while not watch.gone():
        assert time.monotonic() < end, "a closed client was not seen within 1 s"
        time.sleep(0.01)
    assert channel.connected                          # seen by the poll, not by waitress' flag
    conn.close()
    assert watch.gone()                               # the server closed it too: gone


def test_the_servers_flag_alone():
    """Without a socket behind it (the Ray proxy's flag), the flag decides; without either, a client stays."""
    gone = []
    watch = ClientWatch({"waitress.client_disconnected": lambda: bool(gone)})
    assert not watch.gone()
    gone.append(1)
    assert watch.gone()
    assert not ClientWatch({}).gone()
