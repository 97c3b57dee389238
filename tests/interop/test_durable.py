"""Durability: the broker keeps persistent sessions, their queues and
retained messages in its store (--data-dir), and survives kill -9.

Every test here runs zerofan with a data directory of its own, on a port
that stays the same across restarts, and kills it with SIGKILL (never a
clean shutdown, unless said).
"""

from __future__ import annotations

import random
import signal
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes

from conftest import Broker, free_port, start_zerofan
from pahoclient import PahoClient, props

pytestmark = pytest.mark.zerofan_only

RUNS = 5
SETTINGS = {"sys_interval": 1, "max_queued_messages": 1_000_000,
            "max_queued_bytes": 1 << 30}


class DurableBroker:
    """zerofan on a fixed port over one data directory; kill -9 and restart."""

    def __init__(self, tmp: Path, settings: dict | None = None):
        self.tmp = tmp
        self.data = tmp / "data"
        self.port = free_port()
        self.settings = {**SETTINGS, **(settings or {})}
        self.broker: Broker | None = None
        self.starts = 0

    def start(self) -> Broker:
        d = self.tmp / f"run{self.starts}"
        d.mkdir()
        self.starts += 1
        deadline = time.monotonic() + 10
        while True:
            try:
                self.broker = start_zerofan(d, self.settings,
                                            store_args=("--data-dir", str(self.data)),
                                            listen=f"127.0.0.1:{self.port}")
                return self.broker
            except BaseException:
                # The port may linger for a moment after a kill.
                if time.monotonic() > deadline:
                    raise
                d = self.tmp / f"run{self.starts}"
                d.mkdir()
                self.starts += 1
                time.sleep(0.2)

    def kill9(self):
        b = self.broker
        if b is not None and b.alive():
            b.proc.send_signal(signal.SIGKILL)
            b.proc.wait(10)
            b.returncode = b.proc.returncode
        self.broker = None

    def stderr(self) -> str:
        return self.broker.log() if self.broker else ""


@pytest.fixture
def durable(tmp_path):
    """A DurableBroker (not yet started); killed at teardown."""
    db = DurableBroker(tmp_path)
    yield db
    db.kill9()


def persistent(broker, client_id: str, version: int = 5) -> PahoClient:
    """A client whose session outlives its connection (expiry 1 h / clean 0)."""
    if version == 5:
        return PahoClient(broker, client_id, version=5, clean=False,
                          connect_props=props(PacketTypes.CONNECT, SessionExpiryInterval=3600))
    return PahoClient(broker, client_id, version=4, clean=False)


class Publisher:
    """Publishes numbered QoS 1 and QoS 2 messages as fast as paho's window
    allows until the connection drops; records which were acknowledged
    (PUBACK for QoS 1, PUBCOMP for QoS 2)."""

    def __init__(self, broker: Broker, run: int):
        self.run = run
        self.c = mqtt.Client(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                             client_id=f"dur-pub-{run}", protocol=mqtt.MQTTv5,
                             reconnect_on_failure=False)
        self.c.max_inflight_messages_set(200)
        self.c.max_queued_messages_set(400)
        self.lock = threading.Lock()
        self.by_mid: dict[int, bytes] = {}
        self.early: dict[int, bool] = {}
        self.acked: set[bytes] = set()
        self.sent = 0
        self.down = threading.Event()
        self.up = threading.Event()
        self.c.on_publish = self._on_publish
        self.c.on_disconnect = lambda *a: self.down.set()
        self.c.on_connect = lambda *a: self.up.set()
        self.c.connect(broker.host, broker.port, 60, clean_start=True)
        self.c.loop_start()
        assert self.up.wait(10), "publisher did not connect"
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _on_publish(self, client, userdata, mid, rc, properties):
        ok = rc is None or rc.value < 0x80
        with self.lock:
            payload = self.by_mid.pop(mid, None)
            if payload is None:
                # Acknowledged before _pump recorded the mid.
                self.early[mid] = ok
            elif ok:
                self.acked.add(payload)

    def _pump(self):
        seq = 0
        while not self.down.is_set():
            qos = 1 + (seq % 2)
            payload = f"{self.run}:{seq}:{qos}".encode()
            # Never call paho while holding self.lock: paho calls
            # _on_publish with its own lock held.
            info = self.c.publish(f"dur/q{qos}", payload, qos)
            if info.rc == mqtt.MQTT_ERR_QUEUE_SIZE:
                time.sleep(0.001)
                continue
            if info.rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN):
                break
            with self.lock:
                ok = self.early.pop(info.mid, None)
                if ok is None:
                    self.by_mid[info.mid] = payload
                elif ok:
                    self.acked.add(payload)
                seq += 1
                self.sent = seq

    def stop(self):
        self.down.wait(10)
        self.thread.join(10)
        self.c.loop_stop()
        with self.lock:
            return set(self.acked), self.sent


def drain(sub: PahoClient, quiet: float = 2.0, limit: float = 240.0,
          stall: float = 20.0, want: set | None = None) -> list:
    """Every message that arrives until none came for `quiet` seconds, and
    (with `want`) not before every payload of `want` came, nothing came for
    `stall` seconds, or `limit` passed. On a loaded machine a subscriber's
    QoS 2 messages (surfaced by paho at PUBREL, a round trip later, and each
    window sent after a durable send record) can trail its QoS 1 messages by
    a minute while still flowing; a lost message shows as a stall."""
    got = []
    missing = set(want or ())
    end = time.monotonic() + limit
    while time.monotonic() < end:
        wait = quiet if not missing else min(stall, max(end - time.monotonic(), 0.01))
        try:
            m = sub.messages.get(timeout=wait)
        except Exception:
            break
        got.append(m)
        missing.discard(m.payload)
    return got


def test_kill9_during_publish_loses_no_acknowledged_message(durable):
    """Persistent subscribers (MQTT 5 expiry 1 h, 3.1.1 clean session 0) are
    offline; a publisher sends QoS 1 and QoS 2 messages while the broker is
    killed with SIGKILL at a random moment, RUNS times. After every restart
    each subscriber gets every message whose PUBACK / PUBCOMP the publisher
    saw: QoS 2 exactly once, QoS 1 at least once."""
    rng = random.Random(0xD0AB1E)
    b = durable.start()
    subs = {"dur-sub5": 5, "dur-sub4": 4}
    for cid, v in subs.items():
        s = persistent(b, cid, v)
        assert s.subscribe("dur/#", 2) == [2]
        s.disconnect()
    seen_q2: dict[str, dict[bytes, int]] = {cid: {} for cid in subs}
    seen_q1: dict[str, set[bytes]] = {cid: set() for cid in subs}
    figures = []
    for run in range(RUNS):
        pub = Publisher(b, run)
        time.sleep(rng.uniform(0.4, 2.0))
        durable.kill9()
        acked, sent = pub.stop()
        assert acked, f"run {run}: nothing was acknowledged before the kill"
        b = durable.start()
        delivered = {}
        for cid, v in subs.items():
            s = persistent(b, cid, v)
            assert s.session_present, f"{cid}: session lost after kill -9 (run {run})"
            earlier = seen_q1[cid] | set(seen_q2[cid])
            got = drain(s, want={p for p in acked if p not in earlier})
            s.disconnect()
            delivered[cid] = len(got)
            for m in got:
                if m.qos == 2 or m.payload.endswith(b":2"):
                    seen_q2[cid][m.payload] = seen_q2[cid].get(m.payload, 0) + 1
                else:
                    seen_q1[cid].add(m.payload)
            missing = [p for p in acked
                       if p not in seen_q1[cid] and p not in seen_q2[cid]]
            assert not missing, (f"run {run}: {cid} lost {len(missing)} of {len(acked)} "
                                 f"acknowledged messages, e.g. {sorted(missing)[:5]}")
            dups = {p: n for p, n in seen_q2[cid].items() if n > 1}
            assert not dups, f"run {run}: {cid} got QoS 2 messages twice: {list(dups)[:5]}"
        figures.append((run, sent, len(acked), delivered))
    print("\nkill -9 runs (run, published, acknowledged, delivered per subscriber):")
    for f in figures:
        print("  ", f)


def test_retained_and_subscriptions_survive_expired_session_gone(durable, client_factory):
    b = durable.start()
    p = client_factory(b)
    p.publish("dur/ret", b"keep", qos=1, retain=True)
    p.publish("dur/ret0", b"keep0", qos=0, retain=True)
    p.publish("dur/gone", b"x", qos=1, retain=True)
    p.publish("dur/gone", b"", qos=1, retain=True)  # cleared
    keep = persistent(b, "dur-keep")
    assert keep.subscribe("dur/s/+", 1) == [1]
    keep.disconnect()
    short = PahoClient(b, "dur-short", version=5, clean=False,
                       connect_props=props(PacketTypes.CONNECT, SessionExpiryInterval=1))
    assert short.subscribe("dur/s/+", 1) == [1]
    short.disconnect()
    p.close()
    time.sleep(0.3)  # the retained messages' commits are durable by now (acked)
    durable.kill9()
    time.sleep(1.5)  # dur-short expires while the broker is down
    b = durable.start()

    r = PahoClient(b, version=5)
    r.subscribe("dur/#", 1)
    got = {m.topic: m.payload for m in r.expect_messages(2)}
    assert got == {"dur/ret": b"keep", "dur/ret0": b"keep0"}
    r.assert_no_message(0.5)
    r.close()

    short = PahoClient(b, "dur-short", version=5, clean=False,
                       connect_props=props(PacketTypes.CONNECT, SessionExpiryInterval=60))
    assert not short.session_present, "an expired session came back after a restart"
    short.close()
    keep = persistent(b, "dur-keep")
    assert keep.session_present
    p = PahoClient(b, version=5)
    p.publish("dur/s/1", b"hello", qos=1)
    m = keep.expect_message()
    assert (m.topic, m.payload) == ("dur/s/1", b"hello")
    keep.close()
    p.close()


def test_truncated_log_recovers(durable):
    b = durable.start()
    sub = persistent(b, "dur-trunc")
    sub.subscribe("dur/t", 1)
    sub.disconnect()
    p = PahoClient(b, version=5)
    for i in range(50):
        p.publish("dur/t", f"m{i}".encode() * 20, qos=1)
    p.close()
    durable.kill9()
    logs = sorted(durable.data.glob("log-*.zlog"))
    assert logs, list(durable.data.iterdir())
    log = logs[-1]
    size = log.stat().st_size
    with open(log, "r+b") as f:
        f.truncate(size - 37)
    b = durable.start()
    sub = persistent(b, "dur-trunc")
    assert sub.session_present
    got = drain(sub, quiet=1.0)
    # The cut-off tail held the last message(s); the rest is intact.
    assert 40 <= len(got) < 50, len(got)
    assert [m.payload for m in got] == [f"m{i}".encode() * 20 for i in range(len(got))]
    # The repair is counted.
    watch = PahoClient(b, version=5)
    watch.subscribe("$SYS/broker/store/torn_tails", 0)
    assert watch.expect_message().payload == b"1"
    watch.close()
    # ... and the broker serves.
    p = PahoClient(b, version=5)
    p.publish("dur/t", b"after", qos=1)
    assert sub.expect_message().payload == b"after"
    sub.close()
    p.close()
    assert "truncat" in durable.stderr().lower() or "torn" in durable.stderr().lower()


def _saved_clock(data: Path) -> int | None:
    try:
        text = (data / "CLOCK").read_text()
    except FileNotFoundError:
        return None
    prefix = "zerofan-store clock="
    return int(text.strip()[len(prefix):]) if text.startswith(prefix) else None


def test_a_clock_behind_the_last_run_is_counted_past(durable):
    """The store saves its clock in the data dir (CLOCK) every second. A
    restart whose wall clock is behind the last run's (it stepped back)
    counts from past the saved time, says so in its log, and serves what
    the last run acknowledged."""
    b = durable.start()
    sub = persistent(b, "dur-clock")
    assert sub.subscribe("dur/clock", 1) == [1]
    sub.disconnect()
    p = PahoClient(b, version=5)
    p.publish("dur/clock", b"before", qos=1)
    p.close()
    first = _saved_clock(durable.data)
    assert first is not None, "no CLOCK in the data dir"
    deadline = time.monotonic() + 10
    while (_saved_clock(durable.data) or 0) <= first:
        assert time.monotonic() < deadline, "the clock was not saved again"
        time.sleep(0.05)
    durable.kill9()
    ahead = first + 3_600_000  # as if the clock had stepped back an hour
    (durable.data / "CLOCK").write_text(f"zerofan-store clock={ahead}\n")
    b = durable.start()
    assert "wall clock is behind" in durable.stderr(), durable.stderr()
    assert (_saved_clock(durable.data) or 0) >= ahead + 60_000
    sub = persistent(b, "dur-clock")
    assert sub.session_present
    assert sub.expect_message().payload == b"before"
    sub.close()


def test_newer_format_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "MANIFEST").write_text("zerofan-store format=99 generation=1\n")
    from conftest import zerofan_bin
    import subprocess
    r = subprocess.run([str(zerofan_bin()), "--listen", "127.0.0.1:0", "--data-dir", str(data)],
                       capture_output=True, timeout=20, cwd=tmp_path)
    assert r.returncode != 0
    err = r.stderr.decode()
    assert "99" in err and "up to version 4" in err, err


@pytest.mark.parametrize("after", [4, 2])
def test_kill9_with_sessions_on_several_shards(tmp_path, after):
    """Four shards share one store: persistent sessions spread over them,
    messages acknowledged to the publisher, kill -9; after a restart with
    `after` shards (each session now owned by the shard its id hashes to
    under the new count) every session is present and gets every
    acknowledged message once, in order."""
    db = DurableBroker(tmp_path, {"threads": 4})
    try:
        b = db.start()
        ids = [f"shard-sess-{i}" for i in range(12)]
        for cid in ids:
            c = persistent(b, cid)
            assert c.subscribe("multi/#", 1) == [1]
            c.disconnect()
        pub = PahoClient(b, "shard-pub")
        n = 60
        for i in range(n):
            pub.publish("multi/x", b"%d" % i, qos=1, wait=False)
        pub.publish("multi/x", b"%d" % n, qos=1)  # every PUBACK is in by its own
        pub.close()
        db.kill9()
        db.settings["threads"] = after
        b = db.start()
        for cid in ids:
            c = persistent(b, cid)
            assert c.session_present, cid
            got = [int(m.payload) for m in c.expect_messages(n + 1)]
            assert got == list(range(n + 1)), cid
            c.assert_no_message(0.05)
            c.close()
    finally:
        db.kill9()
