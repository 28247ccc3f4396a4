"""The network guard of the tracked test runs (`tests/tracking.py` puts this folder first on a launch's PYTHONPATH,
so every Python process of the launch loads it): a connection or a name lookup that would leave the machine is
refused and written, a line each, to the file NETWORK_RECORD names; the test reads that file back empty. Loopback
addresses, the machine's own name and local (Unix) sockets pass."""

import ipaddress
import os
import socket


def _local(host) -> bool:
    if host is None or str(host) in ("", "localhost", socket.gethostname()):
        return True
    try:
        address = ipaddress.ip_address(str(host).split("%")[0])
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _refuse(what: str):
    with open(os.environ["NETWORK_RECORD"], "a") as record:
        record.write(f"pid {os.getpid()}: {what}\n")
    raise OSError(f"network guard: {what} refused (a test run stays on this machine)")


def _guard_lookup(lookup):
    def guarded(host, *args, **kwargs):
        if not _local(host):
            _refuse(f"{lookup.__name__} {host!r}")
        return lookup(host, *args, **kwargs)

    return guarded


def _guard_connect(connect):
    def guarded(self, address, *args, **kwargs):
        if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
            _refuse(f"{connect.__name__} {address!r}")
        return connect(self, address, *args, **kwargs)

    return guarded


if os.environ.get("NETWORK_RECORD"):
    socket.getaddrinfo = _guard_lookup(socket.getaddrinfo)
    socket.gethostbyname = _guard_lookup(socket.gethostbyname)
    socket.socket.connect = _guard_connect(socket.socket.connect)
    socket.socket.connect_ex = _guard_connect(socket.socket.connect_ex)
