"""Operability: the Prometheus /metrics page scraped with a real HTTP client
during traffic, /healthz and /readyz, JSON log lines, the per-client log rate
limit, and SIGHUP reloads (limits, password file, ACL) that keep clients
connected and keep the old configuration when a file is bad.

zerofan-specific: every test here is skipped under BROKER=mosquitto.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import mqttraw
from conftest import free_port
from pahoclient import PacketTypes, props

pytestmark = pytest.mark.zerofan_only

WAIT = 10.0

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def start(broker_factory, **settings):
    """A broker with its metrics listener on a free port; returns (broker, base URL)."""
    port = free_port()
    b = broker_factory(metrics=f"127.0.0.1:{port}", **settings)
    return b, f"http://127.0.0.1:{port}"


def http(base: str, path: str, method: str = "GET") -> tuple[int, dict, bytes]:
    req = urllib.request.Request(base + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def parse(text: str) -> dict:
    """{(name, frozenset(labels)): value}; checks HELP/TYPE come before samples."""
    out = {}
    typed = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        assert m, f"bad sample line {line!r}"
        name = m.group(1)
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in typed else name
        assert family in typed, f"{name} has no # TYPE line"
        labels = frozenset(LABEL.findall(m.group(3) or ""))
        out[(name, labels)] = float(m.group(4))
    return out


def scrape(base: str) -> dict:
    status, headers, body = http(base, "/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(body.decode())


def val(metrics: dict, name: str, **labels) -> float:
    key = (name, frozenset((k, str(v)) for k, v in labels.items()))
    assert key in metrics, f"{name}{labels} missing"
    return metrics[key]


def wait_for(cond, what: str, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while True:
        r = cond()
        if r:
            return r
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)  # polling a scrape: there is no event to wait for


def test_metrics_move_during_traffic(broker_factory, client_factory):
    b, base = start(broker_factory)
    before = scrape(base)
    assert any(k[0] == "zerofan_build_info" and v == 1 for k, v in before.items())
    sub = client_factory(b)
    sub.subscribe("ops/#", qos=1)
    pub = client_factory(b)
    during = scrape(base)
    assert val(during, "zerofan_connections") >= 2
    assert val(during, "zerofan_sessions", state="online") >= 2
    listeners = [k for k in during if k[0] == "zerofan_listener_connections"]
    assert listeners and sum(during[k] for k in listeners) >= 2, listeners
    for i in range(20):
        pub.publish(f"ops/{i}", b"x" * 100, qos=0)
        pub.publish(f"ops/{i}", b"y" * 50, qos=1)
    sub.expect_messages(40)
    after = scrape(base)

    def moved(name, **labels):
        return val(after, name, **labels) - val(before, name, **labels)

    assert moved("zerofan_messages_received_total", qos=0) == 20
    assert moved("zerofan_messages_received_total", qos=1) == 20
    assert moved("zerofan_payload_bytes_received_total", qos=0) == 2000
    assert moved("zerofan_payload_bytes_received_total", qos=1) == 1000
    assert moved("zerofan_messages_sent_total", qos=0) >= 20
    assert moved("zerofan_messages_sent_total", qos=1) == 20
    assert moved("zerofan_payload_bytes_sent_total", qos=1) == 1000
    assert moved("zerofan_connections_opened_total") >= 2
    assert moved("zerofan_clients_connected_total") >= 2
    assert moved("zerofan_network_bytes_received_total") > 3000
    assert moved("zerofan_network_bytes_sent_total") > 3000
    assert moved("zerofan_pool_gets_total") > 0
    assert val(after, "zerofan_pool_hits_total") + val(after, "zerofan_pool_misses_total") \
        == val(after, "zerofan_pool_gets_total")
    assert 0 <= val(after, "zerofan_pool_hit_ratio") <= 1
    assert val(after, "zerofan_subscriptions") >= 1
    assert val(after, "zerofan_messages_dropped_total", reason="queue_full") == 0
    assert val(after, "zerofan_store_open") == 1
    assert val(after, "zerofan_store_durable") == 0
    assert val(after, "zerofan_store_fsync_seconds_count") == 0
    assert ("zerofan_store_fsync_seconds_bucket", frozenset({("le", "+Inf")})) in after


def test_health_endpoints(broker_factory):
    b, base = start(broker_factory)
    assert http(base, "/healthz")[0] == 200
    # Ready once the listeners serve: with several shards, a moment after
    # the listening line (every shard has the others' restored sessions).
    assert wait_for(lambda: http(base, "/readyz")[0] == 200, "/readyz 200")
    status, _, body = http(base, "/readyz")
    assert (status, body) == (200, b"ready\n")
    status, headers, body = http(base, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 1000
    assert http(base, "/nope")[0] == 404
    assert http(base, "/metrics", method="POST")[0] == 405
    # An endless request head is cut at a bound, not buffered.
    with socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=WAIT) as s:
        s.sendall(b"GET /metrics HTTP/1.1\r\n" + b"X-Junk: " + b"a" * 20000 + b"\r\n\r\n")
        reply = s.recv(100)
    assert reply.startswith(b"HTTP/1.1 431"), reply


def test_readyz_503_while_shutting_down(broker_factory, client_factory):
    """While the broker flushes its connections at shutdown, /readyz says 503
    and /healthz still 200."""
    b, base = start(broker_factory)
    # A subscriber that never reads, with megabytes queued towards it: its
    # writer cannot flush, which keeps the broker in its shutdown grace period.
    raw = mqttraw.RawClient(b.host, b.port, 5)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect("slow")
    raw.subscribe("big/#")
    pub = client_factory(b)
    for _ in range(100):
        pub.publish("big/x", b"z" * 65536, qos=1)
    assert http(base, "/readyz")[0] == 200
    b.proc.send_signal(signal.SIGTERM)
    seen = wait_for(lambda: http(base, "/readyz")[0] == 503, "/readyz 503")
    assert seen
    assert http(base, "/healthz")[0] == 200
    raw.close()
    assert b.terminate() == 0


def test_json_logs_one_object_per_line(broker_factory, monkeypatch):
    monkeypatch.setenv("RUST_LOG", "info")
    b, base = start(broker_factory, log_format="json")
    for _ in range(3):
        raw = mqttraw.RawClient(b.host, b.port, 5)
        raw.send(b"\x00\x00")
        try:
            raw.recv_until_closed(WAIT)
        except (TimeoutError, OSError):
            pass
        raw.close()
    wait_for(lambda: "bad input" in b.log_path.read_text(), "a bad-input log line")
    assert b.terminate() == 0
    lines = [l for l in b.log_path.read_text().splitlines() if l.strip()]
    assert lines
    objs = [json.loads(l) for l in lines]  # every line is one JSON object
    assert all(isinstance(o, dict) and "level" in o and "timestamp" in o for o in objs)
    bad = [o for o in objs if "bad input" in o.get("message", "")]
    assert bad and all("peer" in o and "what" in o for o in bad), bad


def test_log_rate_limit_for_garbage(broker_factory):
    b, base = start(broker_factory)
    n = 100
    for _ in range(n):
        raw = mqttraw.RawClient(b.host, b.port, 5)
        raw.send(b"\x00\x00")
        try:
            raw.recv_until_closed(WAIT)
        except (TimeoutError, OSError):
            pass
        raw.close()
    m = wait_for(lambda: (lambda s: s if val(s, "zerofan_connection_errors_total",
                                             reason="malformed_packet")
                          + val(s, "zerofan_connection_errors_total", reason="protocol_error")
                          >= n else None)(scrape(base)), "every garbage connection counted")
    logged = [l for l in b.log_path.read_text().splitlines() if "bad input" in l]
    assert 1 <= len(logged) <= 20, logged
    assert val(m, "zerofan_log_lines_suppressed_total") >= n - len(logged)
    assert "suppressed" in logged[-1]


def conf_path(b):
    return b.log_path.parent / "zerofan.toml"


def set_setting(b, key: str, value: str):
    path = conf_path(b)
    lines = [l for l in path.read_text().splitlines() if not l.startswith(f"{key} =")]
    lines.append(f"{key} = {value}")
    path.write_text("\n".join(lines) + "\n")


def reload(b, base: str, result: str):
    before = scrape(base)
    want = val(before, "zerofan_reloads_total", result=result) + 1
    b.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: val(scrape(base), "zerofan_reloads_total", result=result) >= want,
             f"a reload with result {result}")


def queued_while_offline(b, base: str, client_factory, name: str, n: int = 20) -> int:
    """How many of n QoS 1 publishes an offline persistent session queues
    (then it reconnects and drains them)."""
    sp = props(PacketTypes.CONNECT, SessionExpiryInterval=300)
    sub = client_factory(b, client_id=name, clean=False, connect_props=sp)
    sub.subscribe(f"q/{name}", qos=1)
    sub.disconnect()
    pub = client_factory(b)
    for i in range(n):
        pub.publish(f"q/{name}", str(i).encode(), qos=1)
    queued = int(val(scrape(base), "zerofan_queued_messages_max"))
    assert val(scrape(base), "zerofan_sessions", state="offline") == 1
    sub2 = client_factory(b, client_id=name, clean=False, connect_props=sp)
    sub2.expect_messages(queued)
    return queued


def test_reload_limits_keeps_clients(broker_factory, client_factory):
    b, base = start(broker_factory)
    assert queued_while_offline(b, base, client_factory, "before") == 20
    watcher = client_factory(b)
    watcher.subscribe("alive/#", qos=1)
    set_setting(b, "max_queued_messages", "5")
    reload(b, base, "ok")
    assert queued_while_offline(b, base, client_factory, "after") == 5
    m = scrape(base)
    assert val(m, "zerofan_messages_dropped_total", reason="queue_full") == 15
    # A bad file: the error names the file and line, the old limits stay.
    set_setting(b, "max_queued_messages", '"lots"')
    reload(b, base, "error")
    err = b.log_path.read_text()
    assert "reload failed" in err and str(conf_path(b)) in err and "line" in err, err[-2000:]
    assert queued_while_offline(b, base, client_factory, "bad") == 5
    # The client connected before both reloads is still connected and served.
    pub = client_factory(b)
    pub.publish("alive/1", b"still here", qos=1)
    assert watcher.expect_message().payload == b"still here"
    assert val(scrape(base), "zerofan_connection_errors_total", reason="protocol_error") == 0


def zerofan_passwd(*args):
    from conftest import zerofan_bin
    subprocess.run([str(zerofan_bin()), "passwd", *args], check=True,
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=60)


def login(b, client_factory, user: str, password: str, expect_rc: int = 0):
    c = client_factory(b, connect=False)
    c.c.username_pw_set(user, password)
    c.connect(expect_rc=expect_rc)
    return c


def test_reload_password_file_and_acl(broker_factory, client_factory, tmp_path):
    pw, acl = tmp_path / "passwd", tmp_path / "acl"
    zerofan_passwd("-c", "-b", "alice-1", str(pw), "alice")
    zerofan_passwd("-b", "bob-1", str(pw), "bob")
    acl.write_text("user alice\ntopic readwrite a/#\nuser bob\ntopic read a/#\ntopic read b/#\n")
    b, base = start(broker_factory, password_file=str(pw), acl_file=str(acl),
                    allow_anonymous=False)
    alice = login(b, client_factory, "alice", "alice-1")
    bob = login(b, client_factory, "bob", "bob-1")
    bob.subscribe("a/#", qos=1)
    bob.subscribe("b/#", qos=1)
    alice.publish("a/1", b"one", qos=1)
    assert bob.expect_message().payload == b"one"
    alice.publish("b/1", b"denied", qos=1)
    bob.assert_no_message()
    assert val(scrape(base), "zerofan_acl_denied_total", action="publish") == 1

    # New password for alice, and alice may now write b/# instead of a/#.
    zerofan_passwd("-b", "alice-2", str(pw), "alice")
    acl.write_text("user alice\ntopic readwrite b/#\nuser bob\ntopic read a/#\ntopic read b/#\n")
    reload(b, base, "ok")
    # Both stayed connected, and the new ACL governs the connected alice.
    alice.publish("b/2", b"two", qos=1)
    assert bob.expect_message().payload == b"two"
    alice.publish("a/2", b"now denied", qos=1)
    bob.assert_no_message()
    assert val(scrape(base), "zerofan_acl_denied_total", action="publish") == 2
    login(b, client_factory, "alice", "alice-1", expect_rc=0x86)
    login(b, client_factory, "alice", "alice-2")
    m = scrape(base)
    assert val(m, "zerofan_auth_refused_total", reason="bad_credentials") == 1

    # A broken password file: reload refused with file and line, old one kept.
    pw.write_text(pw.read_text() + "no colon here\n")
    reload(b, base, "error")
    err = b.log_path.read_text()
    assert "reload failed" in err and f"{pw}:3:" in err, err[-2000:]
    login(b, client_factory, "alice", "alice-2")
    # A broken ACL likewise (with the password file repaired).
    pw.write_text(pw.read_text().replace("no colon here\n", ""))
    acl.write_text("user alice\ntopic sideways b/#\n")
    reload(b, base, "error")
    err = b.log_path.read_text()
    assert f"{acl}:2:" in err, err[-2000:]
    alice.publish("b/3", b"three", qos=1)
    assert bob.expect_message().payload == b"three"
    assert alice.c.is_connected() and bob.c.is_connected()
