"""Ports for the servers we start: free ones, from below the kernel's ephemeral range."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


# Ports we hand to servers come from below the kernel's ephemeral range. A port picked by
# ``bind(0)`` comes from that range, and so do the ports servers bind for themselves (vLLM's
# ZMQ and torch.distributed sockets) and every outgoing connection's local end: a router whose
# port was picked before its replicas' minute of start-up found it taken when it came up (CI:
# "FailedToCreateHTTPListener: Address already in use"). Below that range only a server told
# to use a port takes it.
_LOW_PORTS = (20000, 32767)


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now, outside the kernel's ephemeral range (so
    nothing binds it by chance before our server does); an ephemeral one when that range
    leaves no room below it."""
    low, high = _LOW_PORTS[0], min(_LOW_PORTS[1], _ephemeral_range()[0] - 1)
    rng = random.SystemRandom()
    for _ in range(50 if high - low >= 1000 else 0):
        port = rng.randint(low, high)
        if port_is_free(host, port):
            return port
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now (TIME_WAIT is not "in use": servers set
    SO_REUSEADDR too)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
