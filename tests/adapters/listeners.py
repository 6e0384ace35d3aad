"""Listening sockets made as loopbridge once made them, for the checks that tell them apart."""

from __future__ import annotations

import socket


def protocol_zero_bind(host: str, port: int) -> socket.socket:
    """The listening socket as it was made before: protocol 0."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock
