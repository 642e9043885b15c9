"""A network guard for the OpenEnv side tests: no connection or name lookup leaves loopback.

openenv-core pulls in gradio, huggingface_hub, fastmcp and an OpenAI client, any of which might
report usage or reach a hub. The tests start the OpenEnv server with this folder first on its
PYTHONPATH, so Python imports this file at startup (`site` imports `sitecustomize`), and the
test process loads it from its conftest. With TIRL_NETGUARD_LOG set, every TCP/UDP connect,
sendto and getaddrinfo aimed outside loopback (127.0.0.0/8, ::1) is refused before any packet
is sent, and written to that file, which the suite checks is empty at the end. Unix sockets
(the sandbox's) pass. Each guarded process also writes its pid to TIRL_NETGUARD_LOG + ".active",
so the tests can see the guard really ran in the server.
"""

from __future__ import annotations

import ipaddress
import os
import socket

LOOPBACK_NAMES = ("localhost", "localhost.")


def is_loopback_host(host) -> bool:
    """Whether `host` (a name or literal, as given to getaddrinfo or connect) is loopback."""
    if host is None:
        return True  # getaddrinfo(None, port): the local wildcard/loopback, never a lookup
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    host = str(host).strip("[]").split("%", 1)[0]
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False  # a name other than localhost: looking it up would use the network
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def install(log_path: str) -> None:
    """Refuse and record every non-loopback connect / sendto / getaddrinfo of this process."""

    def refuse(what: str, target) -> None:
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"pid {os.getpid()}: {what} {target!r}\n")
        raise OSError(f"network guard: {what} {target!r} is outside loopback")

    def inet_target(sock, address):
        if sock.family in (socket.AF_INET, socket.AF_INET6) and isinstance(address, tuple):
            return address[0]
        return None  # a Unix socket, a socketpair: local by construction

    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_sendto = socket.socket.sendto
    real_getaddrinfo = socket.getaddrinfo

    def connect(self, address):
        host = inet_target(self, address)
        if host is not None and not is_loopback_host(host):
            refuse("connect", address)
        return real_connect(self, address)

    def connect_ex(self, address):
        host = inet_target(self, address)
        if host is not None and not is_loopback_host(host):
            refuse("connect_ex", address)
        return real_connect_ex(self, address)

    def sendto(self, data, *args):
        address = args[-1]
        host = inet_target(self, address)
        if host is not None and not is_loopback_host(host):
            refuse("sendto", address)
        return real_sendto(self, data, *args)

    def getaddrinfo(host, *args, **kwargs):
        if not is_loopback_host(host):
            refuse("getaddrinfo", host)
        return real_getaddrinfo(host, *args, **kwargs)

    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.socket.sendto = sendto
    socket.getaddrinfo = getaddrinfo
    with open(log_path + ".active", "a", encoding="utf-8") as active:
        active.write(f"{os.getpid()}\n")


if os.environ.get("TIRL_NETGUARD_LOG"):
    install(os.environ["TIRL_NETGUARD_LOG"])
