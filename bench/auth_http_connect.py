#!/usr/bin/env python3
"""CONNECT rate with `auth_http`: answers cached vs every CONNECT asking the
service, and without auth_http as the reference.

    python3 bench/auth_http_connect.py [ZEROFAN_BIN] [CONNECTS_PER_THREAD] [THREADS]

The auth service is Python's ThreadingHTTPServer on 127.0.0.1 (answers
allow at once), the clients raw MQTT 3.1.1 sockets (CONNECT, CONNACK,
close), each thread its own client id and credentials. Prints one line per
mode: connects per second (median of 3 runs) and the broker's cache
counters."""

from __future__ import annotations

import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as a real service would
    # Headers and body go out in two writes: without this, Nagle's
    # algorithm meets the client's delayed ACK and each answer waits 40 ms.
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = b'{"result": "allow"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def s(b: bytes) -> bytes:
    return struct.pack("!H", len(b)) + b


def connect_packet(cid: str, user: str) -> bytes:
    var = s(b"MQTT") + bytes([4, 0xC2]) + struct.pack("!H", 60)
    payload = s(cid.encode()) + s(user.encode()) + s(b"pw")
    body = var + payload
    return bytes([0x10, len(body)]) + body


def client(port: int, n: int, i: int, out: list):
    pkt = connect_packet(f"bench{i}", f"user{i}")
    ok = 0
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(pkt)
            ack = sock.recv(4)
            ok += len(ack) == 4 and ack[3] == 0
            sock.sendall(b"\xe0\x00")  # DISCONNECT: the next CONNECT takes over at once
    out.append(ok)


def run(binary: str, conf: str, n: int, threads: int) -> tuple[float, str]:
    d = tempfile.mkdtemp()
    path = os.path.join(d, "zerofan.toml")
    with open(path, "w") as f:
        f.write(conf + 'listen = ["127.0.0.1:0"]\nallow_anonymous = true\nmax_connection_rate = 0\n'
                "sys_interval = 0\n")
    p = subprocess.Popen([binary, "--memory", "-c", path], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, cwd=d)
    port = None
    for raw in p.stdout:
        line = raw.decode()
        if line.startswith("zerofan listening on "):
            port = int(line.split()[3].rsplit(":", 1)[1])
            break
    assert port, "broker did not start"
    out: list = []
    start = time.monotonic()
    ts = [threading.Thread(target=client, args=(port, n, i, out)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - start
    p.terminate()
    p.wait(10)
    assert sum(out) == n * threads, f"{sum(out)} of {n * threads} accepted"
    return n * threads / elapsed, ""


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("ZEROFAN_BIN", "zerofan")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 500
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}/auth"
    modes = [
        ("no auth_http", ""),
        ("auth_http cached", f'auth_http = {{ url = "{url}", cache_ttl_s = 600 }}\n'),
        ("auth_http uncached", f'auth_http = {{ url = "{url}", cache_size = 0 }}\n'),
    ]
    for name, conf in modes:
        rates = [run(binary, conf, n, threads)[0] for _ in range(3)]
        print(json.dumps({"mode": name, "connects_per_s": round(statistics.median(rates)),
                          "runs": [round(r) for r in rates], "connects": n * threads}))


if __name__ == "__main__":
    main()
