"""Bridges (issue 17): zerofan bridged to a real mosquitto and to another
zerofan, configured by `[[bridge]]` tables and by an unchanged mosquitto.conf.

Every wait is on an event (a message, the bridge's `1` on its notification
topic) with a timeout; the only fixed windows are the "no echo" checks.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from brokerenv import threads_args
from conftest import Broker, free_port, launch_mosquitto, launch_zerofan, zerofan_bin
from pahoclient import PahoClient, props

pytestmark = [
    pytest.mark.zerofan_only,
    pytest.mark.skipif(shutil.which("mosquitto") is None and not Path("/usr/sbin/mosquitto").exists(),
                       reason="mosquitto is not installed"),
]

WAIT = 20.0


def start_zerofan_conf(tmp: Path, text: str, name: str = "zerofan.toml",
                       args: tuple = ("--memory",)) -> Broker:
    """zerofan with this configuration file, as written (no --listen: the
    file says where)."""
    tmp.mkdir(parents=True, exist_ok=True)
    conf = tmp / name
    conf.write_text(text)
    return launch_zerofan(tmp, [*args, *threads_args(text), "-c", str(conf)])


def start_mosquitto_at(tmp: Path, port: int, persist: bool = False) -> Broker:
    tmp.mkdir(parents=True, exist_ok=True)
    lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", "log_dest stdout",
             "log_type error", "log_type warning", "log_type notice"]
    if persist:
        lines += ["persistence true", f"persistence_location {tmp}/"]
        if os.geteuid() == 0:
            # Otherwise it writes its store as user `mosquitto`, who cannot
            # reach pytest's private temporary directory.
            lines.append("user root")
    return launch_mosquitto(tmp, port, lines)


@pytest.fixture
def procs():
    """Brokers started by a test; stopped (SIGTERM, exit 0) at teardown."""
    started: list[Broker] = []
    yield started
    errors = []
    for b in started:
        rc = b.terminate()
        if rc != 0 and b.kind == "zerofan":
            errors.append(f"{b.kind} exited {rc}\n{b.log()}")
    assert not errors, "\n".join(errors)


@pytest.fixture
def clients():
    made: list[PahoClient] = []

    def make(b: Broker, **kw) -> PahoClient:
        c = PahoClient(b, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def bridge_toml(name: str, port: int, topics: list[tuple], protocol: str = "mqttv311",
                extra: str = "") -> str:
    ts = ", ".join(
        f'{{ pattern = "{p}", direction = "{d}", qos = {q} }}' for p, d, q in topics)
    return (f'listen = ["127.0.0.1:0"]\nsys_interval = 1\n\n[[bridge]]\nname = "{name}"\n'
            f'addresses = ["127.0.0.1:{port}"]\nremote_clientid = "{name}"\n'
            f'protocol_version = "{protocol}"\nrestart_timeout = 1\nrestart_timeout_max = 2\n'
            f'topic = [{ts}]\n{extra}')


def wait_bridge_up(clients, z: Broker, remote_id: str):
    """The bridge says `1` on its notification topic once both sides are
    subscribed."""
    watcher = clients(z)
    watcher.subscribe(f"$SYS/broker/connection/{remote_id}/state", 1)
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        m = watcher.expect_message(timeout=deadline - time.monotonic())
        if m.payload == b"1":
            return watcher
    pytest.fail("bridge never came up")


def wait_state(watcher: PahoClient, state: bytes) -> None:
    """The bridge's notification topic says `state` within WAIT."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if watcher.expect_message(timeout=deadline - time.monotonic()).payload == state:
            return
    pytest.fail(f"bridge state never became {state!r}")


def collect(c: PahoClient, n: int, timeout: float = WAIT) -> list:
    return [c.expect_message(timeout=timeout) for _ in range(n)]


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_both_directions_against_mosquitto(tmp_path, procs, clients, qos):
    mport = free_port()
    m = start_mosquitto_at(tmp_path / "m", mport)
    procs.append(m)
    z = start_zerofan_conf(tmp_path / "z", bridge_toml(
        "edge", mport, [("up/#", "out", qos), ("down/#", "in", qos)]))
    procs.append(z)
    wait_bridge_up(clients, z, "edge")

    on_m = clients(m, version=4)
    on_m.subscribe("up/#", 2)
    on_z = clients(z)
    on_z.subscribe("down/#", 2)

    pub_z = clients(z)
    pub_m = clients(m, version=4)
    payloads = [bytes([i]) * (1 + i * 1000) for i in range(5)]
    for i, p in enumerate(payloads):
        pub_z.publish(f"up/{i}", p, qos=2)
        pub_m.publish(f"down/{i}", p, qos=2)
    got_m = collect(on_m, len(payloads))
    got_z = collect(on_z, len(payloads))
    for got, prefix in ((got_m, "up"), (got_z, "down")):
        assert sorted((g.topic, g.payload) for g in got) == \
            sorted((f"{prefix}/{i}", p) for i, p in enumerate(payloads))
        # The bridge subscribes with `qos`: it caps what crosses.
        assert {g.qos for g in got} == {qos}
    on_m.assert_no_message(0.3)
    on_z.assert_no_message(0.3)


def test_mosquitto_restart_loses_nothing_acknowledged(tmp_path, procs, clients):
    """zerofan -> mosquitto at QoS 1; mosquitto restarts mid-stream. Every
    message zerofan acknowledged reaches the subscriber on mosquitto."""
    mport = free_port()
    m = start_mosquitto_at(tmp_path / "m", mport, persist=True)
    procs.append(m)  # stopped below; terminate() again at teardown is a no-op
    z = start_zerofan_conf(tmp_path / "z", bridge_toml("edge", mport, [("data/#", "out", 1)]))
    procs.append(z)
    watcher = wait_bridge_up(clients, z, "edge")
    sub = PahoClient(m, client_id="collector", version=4, clean=False)
    sub.subscribe("data/#", 1)

    pub = clients(z)
    n = 300
    for i in range(n // 2):
        pub.publish(f"data/{i}", str(i).encode(), qos=1)  # waits for zerofan's PUBACK
    seen = {int(x.payload) for x in collect(sub, 10)}
    sub.close()
    while not sub.messages.empty():  # delivered (and acknowledged) before the close
        seen.add(int(sub.messages.get_nowait().payload))
    # SIGTERM: mosquitto saves its sessions (the collector's queue) first.
    assert m.terminate() == 0
    # The bridge says so on its notification topic. A "1" may come first:
    # with several shards, the retained "1" replayed at SUBSCRIBE and the
    # live one can both reach the watcher.
    wait_state(watcher, b"0")
    for i in range(n // 2, n):
        pub.publish(f"data/{i}", str(i).encode(), qos=1)  # acknowledged while it is down
    m2 = start_mosquitto_at(tmp_path / "m", mport, persist=True)
    procs.append(m2)
    sub2 = clients(m2, client_id="collector", version=4, clean=False)
    assert sub2.session_present
    deadline = time.monotonic() + 60
    while len(seen) < n and time.monotonic() < deadline:
        try:
            seen.add(int(sub2.messages.get(timeout=max(0.0, deadline - time.monotonic())).payload))
        except queue.Empty:
            break
    missing = sorted(set(range(n)) - seen)
    assert not missing, f"{len(missing)} acknowledged messages lost: {missing[:20]}"


@pytest.mark.parametrize("peer", ["zerofan-v5", "mosquitto-v311-try-private"])
def test_both_ways_on_hash_without_echo(tmp_path, procs, clients, peer):
    if peer == "zerofan-v5":
        far = start_zerofan_conf(tmp_path / "far", 'listen = ["127.0.0.1:0"]\n')
        protocol = "mqttv50"
    else:
        far = start_mosquitto_at(tmp_path / "far", free_port())
        protocol = "mqttv311"
    procs.append(far)
    near = start_zerofan_conf(tmp_path / "near", bridge_toml(
        "loop", far.port, [("#", "both", 1)], protocol=protocol))
    procs.append(near)
    wait_bridge_up(clients, near, "loop")
    a = clients(near)
    a.subscribe("#", 1)
    b = clients(far, version=5 if peer == "zerofan-v5" else 4)
    b.subscribe("#", 1)
    b.assert_no_message(0.3)  # the bridge's own state, if any, is under $SYS
    a.publish("from/near", b"n", qos=1)
    b.publish("from/far", b"f", qos=1)
    got_a = sorted((x.topic, x.payload) for x in collect(a, 2))
    got_b = sorted((x.topic, x.payload) for x in collect(b, 2))
    assert got_a == got_b == [("from/far", b"f"), ("from/near", b"n")]
    # No echo: each message crossed once and did not come back.
    a.assert_no_message(1.0)
    b.assert_no_message(0.2)


def test_mosquitto_conf_with_bridge_runs_unchanged(tmp_path, procs, clients):
    mport, zport = free_port(), free_port()
    m = start_mosquitto_at(tmp_path / "m", mport)
    procs.append(m)
    text = f"""# edge broker
listener {zport} 127.0.0.1
allow_anonymous true

connection central
address 127.0.0.1:{mport}
topic site/# out 1 "" edge1/
topic cmd/# in 1
remote_clientid edge1
cleansession false
keepalive_interval 30
restart_timeout 1 2
try_private true
notifications true
"""
    z = start_zerofan_conf(tmp_path / "z", text, name="mosquitto.conf", args=())
    procs.append(z)
    assert z.port == zport
    wait_bridge_up(clients, z, "edge1")
    # No "unsupported directive" warning for any bridge line.
    assert "warning" not in (tmp_path / "z" / "zerofan.stderr.log").read_text()
    on_m = clients(m, version=4)
    on_m.subscribe("edge1/site/#", 1)
    on_z = clients(z)
    on_z.subscribe("cmd/#", 1)
    clients(z).publish("site/t1", b"21.5", qos=1)
    clients(m, version=4).publish("cmd/reboot", b"now", qos=1)
    x = on_m.expect_message(WAIT)
    assert (x.topic, x.payload) == ("edge1/site/t1", b"21.5")
    y = on_z.expect_message(WAIT)
    assert (y.topic, y.payload) == ("cmd/reboot", b"now")
    # mosquitto sees the bridge's state too (retained `1`).
    state = clients(m, version=4)
    state.subscribe("$SYS/broker/connection/edge1/state", 1)
    assert state.expect_message(WAIT).payload == b"1"


def test_test_config_checks_bridges(tmp_path):
    bad = tmp_path / "bad.conf"
    bad.write_text("listener 1883 127.0.0.1\nconnection c\ntopic a/# sideways\n")
    r = subprocess.run([str(zerofan_bin()), "--test-config", "-c", str(bad)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "line 3" in r.stderr, r.stderr
    missing = tmp_path / "tls.toml"
    missing.write_text('[[bridge]]\nname = "c"\naddresses = ["h"]\ncafile = "/nonexistent/ca.pem"\n'
                       'topic = [{ pattern = "#" }]\n')
    r = subprocess.run([str(zerofan_bin()), "--test-config", "-c", str(missing)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "/nonexistent/ca.pem" in r.stderr, r.stderr
    good = tmp_path / "good.conf"
    good.write_text("listener 1883 127.0.0.1\nconnection c\naddress h\ntopic a/# both 2\n")
    r = subprocess.run([str(zerofan_bin()), "--test-config", "-c", str(good)],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_bridge_figures_in_sys_and_metrics(tmp_path, procs, clients):
    mport, metrics = free_port(), free_port()
    m = start_mosquitto_at(tmp_path / "m", mport)
    procs.append(m)
    conf = f'metrics = "127.0.0.1:{metrics}"\n' + bridge_toml("fig", mport, [("f/#", "both", 1)])
    z = start_zerofan_conf(tmp_path / "z", conf)
    procs.append(z)
    wait_bridge_up(clients, z, "fig")
    on_m = clients(m, version=4)
    on_m.subscribe("f/#", 1)
    pub = clients(z)
    for i in range(3):
        pub.publish(f"f/{i}", b"12345", qos=1)
    collect(on_m, 3)
    clients(m, version=4).publish("f/back", b"xy", qos=1)
    # $SYS/broker/bridge/NAME/... is refreshed every sys_interval.
    sys = clients(z)
    sys.subscribe("$SYS/broker/bridge/fig/#", 0)
    want = {"connected": b"1", "messages/sent": b"3", "bytes/sent": b"15",
            "messages/received": b"1", "bytes/received": b"2", "queue/sent": b"0"}
    latest: dict = {}
    deadline = time.monotonic() + WAIT
    while any(latest.get(k) != v for k, v in want.items()) and time.monotonic() < deadline:
        x = sys.expect_message(timeout=max(0.1, deadline - time.monotonic()))
        latest[x.topic.removeprefix("$SYS/broker/bridge/fig/")] = x.payload
    assert all(latest.get(k) == v for k, v in want.items()), latest
    page = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
    for line in ['zerofan_bridge_connected{bridge="fig"} 1',
                 'zerofan_bridge_messages_total{bridge="fig",direction="out"} 3',
                 'zerofan_bridge_messages_total{bridge="fig",direction="in"} 1',
                 'zerofan_bridge_bytes_total{bridge="fig",direction="out"} 15',
                 'zerofan_bridge_dropped_total{bridge="fig",direction="out"} 0',
                 'zerofan_bridge_queued{bridge="fig",direction="out"} 0',
                 'zerofan_bridge_connects_total{bridge="fig"} 1']:
        assert line in page, f"{line!r} not in /metrics"


def test_acknowledged_messages_survive_a_zerofan_restart(tmp_path, procs, clients):
    """With persistence, what zerofan acknowledged while the remote broker was
    down waits in the bridge's durable session, across a zerofan restart."""
    mport = free_port()
    m = start_mosquitto_at(tmp_path / "m", mport, persist=True)
    procs.append(m)
    collector = PahoClient(m, client_id="collector", version=4, clean=False)
    collector.subscribe("keep/#", 1)
    collector.close()
    conf = bridge_toml("durable", mport, [("keep/#", "out", 1)])
    data = tmp_path / "zdata"
    z = start_zerofan_conf(tmp_path / "z", conf, args=("--data-dir", str(data)))
    procs.append(z)
    wait_bridge_up(clients, z, "durable")  # its session and subscription now exist
    assert m.terminate() == 0
    pub = clients(z)
    n = 50
    for i in range(n):
        pub.publish(f"keep/{i}", str(i).encode(), qos=1)  # acknowledged by zerofan
    assert z.terminate() == 0
    z2 = start_zerofan_conf(tmp_path / "z", conf, args=("--data-dir", str(data)))
    procs.append(z2)
    m2 = start_mosquitto_at(tmp_path / "m", mport, persist=True)
    procs.append(m2)
    sub = clients(m2, client_id="collector", version=4, clean=False)
    seen: set = set()
    deadline = time.monotonic() + 60
    while len(seen) < n and time.monotonic() < deadline:
        try:
            seen.add(int(sub.messages.get(timeout=max(0.0, deadline - time.monotonic())).payload))
        except queue.Empty:
            break
    assert seen == set(range(n)), f"lost: {sorted(set(range(n)) - seen)[:20]}"


def test_v5_properties_cross(tmp_path, procs, clients):
    """Between MQTT 5 brokers, user properties, content type and the like
    cross the bridge with the message."""
    far = start_zerofan_conf(tmp_path / "far", 'listen = ["127.0.0.1:0"]\n')
    procs.append(far)
    near = start_zerofan_conf(tmp_path / "near", bridge_toml(
        "props", far.port, [("p/#", "out", 1)], protocol="mqttv50"))
    procs.append(near)
    wait_bridge_up(clients, near, "props")
    sub = clients(far)
    sub.subscribe("p/#", 1)
    clients(near).publish("p/1", b"{}", qos=1, properties=props(
        ContentType="application/json", UserProperty=[("site", "edge-1")]))
    x = sub.expect_message(WAIT)
    assert x.properties.ContentType == "application/json"
    assert ("site", "edge-1") in x.properties.UserProperty


def test_mosquitto_edge_bridges_in_with_try_private(tmp_path, procs, clients):
    """A mosquitto edge with its default `try_private true` bridges INTO
    zerofan (CONNECT level 0x84): zerofan accepts the mark and treats the
    bridge as mosquitto does (No Local, Retain As Published), so a both-ways
    3.1.1 bridge on a wildcard does not echo, and a retained message crosses
    as retained."""
    z = start_zerofan_conf(tmp_path / "z", 'listen = ["127.0.0.1:0"]\n')
    procs.append(z)
    mport = free_port()
    (tmp_path / "m").mkdir()
    m = launch_mosquitto(tmp_path / "m", mport, [
        f"listener {mport} 127.0.0.1", "allow_anonymous true", "log_dest stdout",
        "log_type error", "log_type warning", "log_type notice",
        "connection edge", f"address 127.0.0.1:{z.port}", "remote_clientid edge",
        "bridge_protocol_version mqttv311", "try_private true", "cleansession true",
        "restart_timeout 1", "notification_topic edge/state", "topic t/# both 1",
    ])
    procs.append(m)
    state = clients(z)
    state.subscribe("edge/state", 1)
    deadline = time.monotonic() + WAIT
    while state.expect_message(timeout=deadline - time.monotonic()).payload != b"1":
        pass
    on_z = clients(z)
    on_z.subscribe("t/#", 1)
    on_m = clients(m, version=4)
    on_m.subscribe("t/#", 1)
    on_z.publish("t/from-z", b"z", qos=1)
    on_m.publish("t/from-m", b"m", qos=1)
    got_z = sorted((x.topic, x.payload) for x in collect(on_z, 2))
    got_m = sorted((x.topic, x.payload) for x in collect(on_m, 2))
    assert got_z == got_m == [("t/from-m", b"m"), ("t/from-z", b"z")]
    on_z.assert_no_message(1.0)
    on_m.assert_no_message(0.2)
    # Retained on zerofan crosses as retained: a later subscriber on
    # mosquitto gets it from mosquitto's own store.
    clients(z).publish("t/kept", b"k", qos=1, retain=True)
    assert on_m.expect_message(WAIT).payload == b"k"
    late = clients(m, version=4)
    late.subscribe("t/kept", 1)
    x = late.expect_message(WAIT)
    assert (x.payload, x.retain) == (b"k", 1)


def start_mosquitto_tls(tmp: Path, plain: int, tls: int, certs) -> Broker:
    """mosquitto with a plain listener (for the test's clients) and a TLS
    one that wants a client certificate from `certs.ca` (the bridge's)."""
    tmp.mkdir(parents=True, exist_ok=True)
    lines = ["per_listener_settings false", "allow_anonymous true", "log_dest stdout",
             "log_type error", "log_type warning", "log_type notice",
             f"listener {plain} 127.0.0.1", f"listener {tls} 127.0.0.1",
             f"cafile {certs.ca}", f"certfile {certs.server}", f"keyfile {certs.server_key}",
             "require_certificate true"]
    if os.geteuid() == 0:
        # It reads the keys as user `mosquitto` otherwise, who cannot reach
        # pytest's private temporary directory.
        lines.append("user root")
    return launch_mosquitto(tmp, plain, lines)


def tls_bridge(tmp_path: Path, procs, trust_other_ca: bool) -> tuple[Broker, Broker]:
    """mosquitto with a TLS listener, and a zerofan bridged to it with the
    client certificate `alice`; its `cafile` is the CA that signed
    mosquitto's certificate, or with `trust_other_ca` another one."""
    from secutil import make_certs
    certs = make_certs(tmp_path / "certs")
    ca = make_certs(tmp_path / "other").ca if trust_other_ca else certs.ca
    plain, tls = free_port(), free_port()
    m = start_mosquitto_tls(tmp_path / "m", plain, tls, certs)
    procs.append(m)
    extra = f'cafile = "{ca}"\ncertfile = "{certs.alice}"\nkeyfile = "{certs.alice_key}"\n'
    z = start_zerofan_conf(tmp_path / "z", bridge_toml(
        "sec", tls, [("up/#", "out", 1), ("down/#", "in", 1)], extra=extra))
    procs.append(z)
    return m, z


def test_bridge_over_mutual_tls(tmp_path, procs, clients):
    """`cafile` verifies mosquitto's certificate, `certfile`/`keyfile` are
    the bridge's own (mosquitto requires one): messages cross both ways."""
    m, z = tls_bridge(tmp_path, procs, trust_other_ca=False)
    wait_bridge_up(clients, z, "sec")
    on_m = clients(m, version=4)
    on_m.subscribe("up/#", 1)
    on_z = clients(z)
    on_z.subscribe("down/#", 1)
    clients(z).publish("up/1", b"to mosquitto", qos=1)
    clients(m, version=4).publish("down/1", b"to zerofan", qos=1)
    assert on_m.expect_message().payload == b"to mosquitto"
    assert on_z.expect_message().payload == b"to zerofan"


def test_bridge_refuses_a_certificate_its_cafile_did_not_sign(tmp_path, procs, clients):
    """A `cafile` that did not sign mosquitto's certificate: the bridge never
    connects, and says why."""
    m, z = tls_bridge(tmp_path, procs, trust_other_ca=True)
    deadline = time.monotonic() + WAIT
    while "bridge connect failed" not in z.log():
        assert time.monotonic() < deadline, "no failed connect logged"
        time.sleep(0.05)  # polling a log file: there is no event to wait for
    line = next(x for x in z.log().splitlines() if "bridge connect failed" in x)
    assert "certificate" in line.lower(), line
    # mosquitto never had it as a client.
    assert " as sec " not in m.log(), m.log()
