#!/usr/bin/env python3
"""Hostile and broken peers of dtrain's federated-learning protocol, over real TCP, for
tests/fl_limits.sh. Each mode prints one JSON line saying what the server did to its sockets.

  idle HOST PORT N HOLD READY      N connections that never send a byte; READY is written once all
                                   are open; waits up to HOLD s. Reports how many the server closed.
  bigframe HOST PORT N DECL SEND HOLD SENT GO
                                   N connections that each send a valid frame header declaring DECL MiB,
                                   then try to send SEND MiB of it, then stall (up to HOLD s). SENT is
                                   written once all have sent; it waits (up to HOLD s) for the file GO
                                   before it watches, so that the server can be measured meanwhile.
  stall HOST PORT ID HOLD          one connection that sends a valid HELLO (client ID, 100 samples)
                                   and then neither reads nor writes (up to HOLD s).
  refuse PORTFILE SECONDS          a server that accepts each connection and closes it at once;
                                   writes its port to PORTFILE, reports how many it accepted.

Frames: magic u32 "DTFL" | version u16 | type u16 | length u32 | crc32(payload) u32 |
crc32(header[0..16)) u32, little endian (src/fl/fl.h)."""
import json
import os
import resource
import select
import socket
import struct
import sys
import time
import zlib

MAGIC, VERSION, HELLO, UPDATE = 0x4C465444, 1, 1, 3


def header(ftype, length, payload_crc):
    h = struct.pack("<IHHII", MAGIC, VERSION, ftype, length, payload_crc)
    return h + struct.pack("<I", zlib.crc32(h))


def frame(ftype, payload):
    return header(ftype, len(payload), zlib.crc32(payload) if payload else 0) + payload


def closed_by_peer(s):
    """True when the server closed (or reset) s, which is readable: EOF or an error."""
    try:
        return s.recv(65536) == b""
    except (ConnectionResetError, BrokenPipeError, OSError):
        return True


def watch(socks, hold):
    """Waits up to hold seconds until the server has closed every socket; returns how many it closed.
    (poll, not select: select cannot watch descriptors past 1023.)"""
    by_fd = {s.fileno(): s for s in socks}
    p = select.poll()
    for fd in by_fd:
        p.register(fd, select.POLLIN)
    closed = 0
    end = time.monotonic() + hold
    while by_fd and time.monotonic() < end:
        for fd, _ in p.poll(200):
            if fd in by_fd and closed_by_peer(by_fd[fd]):
                p.unregister(fd)
                del by_fd[fd]
                closed += 1
    return closed


def raise_fd_limit(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 64), hard))


def idle(host, port, n, hold, ready):
    raise_fd_limit(n)
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=30)
        socks.append(s)
    with open(ready, "w") as f:
        f.write("open\n")
    closed = watch(socks, hold)
    print(json.dumps({"opened": n, "closed_by_server": closed}, separators=(",", ":")))


def bigframe(host, port, n, decl, mib, hold, sent_file, go_file):
    size = decl << 20
    socks, sent = [], []
    chunk = bytes(1 << 20)
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        got = 0
        try:
            s.sendall(header(UPDATE, size, 0))
            for _ in range(mib):  # the payload; a server that refuses the header closes first
                s.sendall(chunk)
                got += len(chunk)
        except (socket.timeout, ConnectionResetError, BrokenPipeError, OSError):
            pass
        socks.append(s)
        sent.append(got)
    with open(sent_file, "w") as f:
        f.write("sent\n")
    end = time.monotonic() + hold
    while not os.path.exists(go_file) and time.monotonic() < end:
        time.sleep(0.05)
    closed = watch(socks, hold)
    print(json.dumps({"peers": n, "declared": size, "max_sent": max(sent), "closed_by_server": closed}, separators=(",", ":")))


def tcp_state(s):
    """The kernel's TCP state of s (tcpi_state: 1 established, 7 closed, 8 close-wait = FIN received)."""
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


def stall(host, port, cid, hold):
    s = socket.socket()
    # room for the models the server queues, so that its FIN is not stuck behind them
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    s.settimeout(10)
    s.connect((host, port))
    s.sendall(frame(HELLO, struct.pack("<QI", cid, 100)))
    # neither read nor write: a client that hung after saying hello. The server's close shows in
    # the socket's state (unread model bytes stay queued ahead of the FIN, so no recv is needed)
    end = time.monotonic() + hold
    while tcp_state(s) == 1 and time.monotonic() < end:
        time.sleep(0.2)
    print(json.dumps({"closed_by_server": tcp_state(s) != 1}, separators=(",", ":")))


def refuse(portfile, seconds):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    with open(portfile, "w") as f:
        f.write("%d\n" % ls.getsockname()[1])
    accepted = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, _, _ = select.select([ls], [], [], 0.2)
        if r:
            c, _ = ls.accept()
            c.close()
            accepted += 1
    print(json.dumps({"accepted": accepted}, separators=(",", ":")))


def main(a):
    if a[0] == "idle":
        idle(a[1], int(a[2]), int(a[3]), float(a[4]), a[5])
    elif a[0] == "bigframe":
        bigframe(a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]), float(a[6]), a[7], a[8])
    elif a[0] == "stall":
        stall(a[1], int(a[2]), int(a[3]), float(a[4]))
    elif a[0] == "refuse":
        refuse(a[1], float(a[2]))
    else:
        sys.exit("unknown mode %s" % a[0])


if __name__ == "__main__":
    main(sys.argv[1:])
