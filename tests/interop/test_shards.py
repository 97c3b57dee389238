"""Several shards (`threads = 4`): one broker to its clients.

Each client's session lives on the shard its client id hashes to; publishes
cross between shards. These tests drive the real binary over many
connections, so that clients land on every shard.
"""

import time

import pytest

import mqttraw as r
from brokerenv import shard_of

pytestmark = pytest.mark.zerofan_only

SHARDS = 4


@pytest.fixture
def sharded(broker_factory):
    return broker_factory(threads=SHARDS)


def _raw(raw_factory, broker, client_id, version=5):
    c = raw_factory(broker, version)
    ack = c.connect(client_id)
    assert ack.reason == 0, ack
    return c


def test_fan_out_over_shards_every_message_once_in_publisher_order(sharded, raw_factory):
    """200 subscribers and 20 publishers: every subscriber gets every
    message once, each publisher's in the order it sent them."""
    subscribers = []
    for i in range(200):
        c = _raw(raw_factory, sharded, f"fan-sub-{i}")
        assert c.subscribe([("fan/#", 1)]).reasons == [1]
        subscribers.append(c)
    publishers = [_raw(raw_factory, sharded, f"fan-pub-{p}") for p in range(20)]
    per_publisher = 10
    for n in range(per_publisher):
        for p, c in enumerate(publishers):
            c.send(r.publish(f"fan/{p}", b"%d/%d" % (p, n), qos=1, packet_id=n + 1))
    for c in publishers:
        for _ in range(per_publisher):
            c.expect(r.PUBACK)
    want = 20 * per_publisher
    for i, c in enumerate(subscribers):
        seen = {}
        for _ in range(want):
            pkt = c.expect(r.PUBLISH)
            p, n = (int(x) for x in pkt.payload.split(b"/"))
            seen.setdefault(p, []).append(n)
            c.send(r.ack(r.PUBACK, pkt.packet_id))
        assert seen == {p: list(range(per_publisher)) for p in range(20)}, f"subscriber {i}"
        c.assert_silent(0.05)


def test_a_client_id_connecting_twice_lands_on_one_shard(sharded, raw_factory):
    """Whichever shard accepts the second connection, the first one is
    taken over: DISCONNECT 0x8E, for many client ids."""
    for i in range(16):
        cid = f"twice-{i}"
        old = _raw(raw_factory, sharded, cid)
        new = _raw(raw_factory, sharded, cid)
        packets = old.recv_until_closed()
        assert [p.reason for p in packets if p.type == r.DISCONNECT] == [0x8E], cid
        new.ping()


def test_a_shared_group_over_shards_gets_each_message_once(sharded, raw_factory):
    members = []
    for i in range(12):
        c = _raw(raw_factory, sharded, f"member-{i}")
        c.subscribe([("$share/work/jobs/+", 1)])
        members.append(c)
    pub = _raw(raw_factory, sharded, "job-publisher")
    n = 120
    for i in range(n):
        pub.send(r.publish("jobs/a", b"%d" % i, qos=1, packet_id=i % 60000 + 1))
    for _ in range(n):
        pub.expect(r.PUBACK)
    seen = []
    per_member = [0] * len(members)
    deadline = time.monotonic() + 20
    while len(seen) < n and time.monotonic() < deadline:
        for i, c in enumerate(members):
            try:
                pkt = c.recv(timeout=0.02)
            except TimeoutError:
                continue
            if pkt.type == r.PUBLISH:
                seen.append(int(pkt.payload))
                per_member[i] += 1
                c.send(r.ack(r.PUBACK, pkt.packet_id))
    for c in members:
        c.assert_silent(0.05)
    assert sorted(seen) == list(range(n)), "each message to exactly one member"
    assert sum(1 for k in per_member if k) > 1, f"the group spreads: {per_member}"


def test_retained_messages_are_seen_from_every_shard(sharded, raw_factory):
    pub = _raw(raw_factory, sharded, "retainer")
    for i in range(8):
        pub.send(r.publish(f"ret/{i}", b"v%d" % i, qos=1, retain=True, packet_id=i + 1))
    for _ in range(8):
        pub.expect(r.PUBACK)
    # Many client ids: they land on every shard.
    for i in range(24):
        c = _raw(raw_factory, sharded, f"late-{i}")
        c.subscribe([("ret/#", 0)])
        got = sorted(c.expect(r.PUBLISH).payload for _ in range(8))
        assert got == sorted(b"v%d" % k for k in range(8)), f"late-{i}"


def test_sys_reports_every_shard(sharded, raw_factory):
    """`$SYS` comes from one shard, with the totals of all of them."""
    clients = [_raw(raw_factory, sharded, f"counted-{i}") for i in range(12)]
    watcher = _raw(raw_factory, sharded, "sys-watcher")
    watcher.subscribe([("$SYS/broker/clients/connected", 0)])
    deadline = time.monotonic() + 15
    values = []
    while time.monotonic() < deadline:
        pkt = watcher.expect(r.PUBLISH, timeout=max(0.1, deadline - time.monotonic()))
        values.append(int(pkt.payload))
        if values[-1] == len(clients) + 1:
            break
    assert values and values[-1] == len(clients) + 1, values
    # One publisher of `$SYS`: no other shard's own figure interleaves.
    watcher.assert_silent(0.3)


# ---------------------------------------------------------------- limits

def spread_ids(prefix: str, per_shard: int) -> list[str]:
    """Client ids owned by each shard in turn, `per_shard` for each: a limit
    counted per shard would never see more than `per_shard` of them."""
    by_shard: dict[int, list[str]] = {s: [] for s in range(SHARDS)}
    i = 0
    while any(len(v) < per_shard for v in by_shard.values()):
        cid = f"{prefix}-{i}"
        s = shard_of(cid, SHARDS)
        if len(by_shard[s]) < per_shard:
            by_shard[s].append(cid)
        i += 1
    return [by_shard[s][k] for k in range(per_shard) for s in range(SHARDS)]


def test_max_connections_holds_over_all_shards(broker_factory, raw_factory):
    b = broker_factory(threads=SHARDS, max_connections=4)
    codes = []
    for cid in spread_ids("cap", 2):
        c = raw_factory(b, 5)
        codes.append(c.connect(cid, expect_reason=None).reason)
    assert codes == [0] * 4 + [0x97] * 4


def test_connection_rate_holds_over_all_shards(broker_factory, raw_factory):
    b = broker_factory(threads=SHARDS, max_connection_rate=4)
    codes = []
    for cid in spread_ids("rate", 2):
        c = raw_factory(b, 5)
        codes.append(c.connect(cid, expect_reason=None).reason)
        c.close()
    # 4 tokens for one second, for the whole broker (a refill of at most a
    # few in the time 8 connects take would admit one more, never 8).
    assert codes[:4] == [0] * 4, codes
    assert codes.count(0x9F) >= 3, codes


def test_login_throttle_holds_over_all_shards(tmp_path, broker_factory, raw_factory):
    import subprocess
    from secutil import zerofan_bin
    pw = tmp_path / "passwd"
    r_ = subprocess.run([str(zerofan_bin()), "passwd", "-c", "-b", "wonderland", str(pw), "alice"],
                        capture_output=True)
    assert r_.returncode == 0, r_.stderr
    b = broker_factory(threads=SHARDS, password_file=str(pw), allow_anonymous=False)
    # One failure on each shard: 4 in a row for (address, alice) overall,
    # past the 3 free ones, so the next login waits even with the right
    # password, whichever shard owns its client id.
    for cid in spread_ids("bad", 1):
        c = raw_factory(b, 5)
        assert c.connect(cid, username="alice", password=b"wrong",
                         expect_reason=None).reason == 0x86
        c.close()
    codes = []
    for cid in spread_ids("good", 1):
        c = raw_factory(b, 5)
        codes.append(c.connect(cid, username="alice", password=b"wonderland",
                               expect_reason=None).reason)
        c.close()
    assert codes == [0x9F] * SHARDS, codes


# ---------------------------------------------------------------- TLS, WebSocket

class TlsRaw(r.RawClient):
    """A RawClient over TLS: what OpenSSL already decrypted counts as readable."""

    def __init__(self, port, ca, version=5):
        import socket
        import ssl
        self.version = version
        self.timeout = 10.0
        ctx = ssl.create_default_context(cafile=str(ca))
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock = ctx.wrap_socket(s, server_hostname="localhost")
        self.buf = bytearray()
        self.closed = False

    def _fill(self, deadline):
        import select
        import ssl
        if not self.sock.pending():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                raise TimeoutError("no packet from broker before the deadline")
        try:
            data = self.sock.recv(65536)
        except (ConnectionResetError, ConnectionAbortedError, ssl.SSLError):
            data = b""
        if not data:
            self.closed = True
            raise r.ConnectionClosed("connection closed by broker")
        self.buf += data


def test_a_client_id_connecting_twice_over_tls_is_taken_over(tmp_path):
    """TLS connections move to the shard of their client id too (with the
    TLS state and what was read): the first connection gets 0x8E."""
    from secutil import make_certs, start_broker, toml_str
    certs = make_certs(tmp_path / "certs")
    b = start_broker(tmp_path / "b", f"threads = {SHARDS}\n"
                     '[[listener]]\nbind = "127.0.0.1:0"\n'
                     f"tls = {{ cert = {toml_str(certs.server)}, "
                     f"key = {toml_str(certs.server_key)} }}\n", 1)
    made = []
    try:
        port = b.listeners[0][1]
        for i, cid in enumerate(spread_ids("tls-twice", 2)):
            old = TlsRaw(port, certs.ca)
            made.append(old)
            assert old.connect(cid).reason == 0
            new = TlsRaw(port, certs.ca)
            made.append(new)
            assert new.connect(cid).reason == 0
            packets = old.recv_until_closed()
            assert [p.reason for p in packets if p.type == r.DISCONNECT] == [0x8E], cid
            new.ping()
            # Traffic after the move: a subscription and a message to itself.
            assert new.subscribe([(f"tls/{i}", 0)]).reasons == [0]
            new.send(r.publish(f"tls/{i}", b"back", 0))
            assert new.expect(r.PUBLISH).payload == b"back"
    finally:
        for c in made:
            c.close()
        assert b.stop() == 0, b.stderr()[-2000:]


# ---------------------------------------------------------------- HTTP API

def test_the_http_api_lists_and_disconnects_clients_of_every_shard(broker_factory, raw_factory):
    import json
    import urllib.request
    from conftest import free_port
    port = free_port()
    b = broker_factory(threads=SHARDS, metrics=f"127.0.0.1:{port}", http_allow_anonymous=True)
    base = f"http://127.0.0.1:{port}"

    def get(path, method="GET"):
        req = urllib.request.Request(base + path, method=method)
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")

    ids = spread_ids("api", 2)
    clients = {}
    for cid in ids:
        c = raw_factory(b, 5)
        c.connect(cid)
        c.subscribe([(f"api/{cid}", 1)])
        clients[cid] = c
    status, page = get("/api/v1/clients?limit=100")
    assert status == 200
    assert page["total"] == len(ids), page
    assert sorted(c["clientid"] for c in page["clients"]) == sorted(ids)
    # Paging runs over every shard's clients in client id order.
    pages = [get(f"/api/v1/clients?limit=3&page={n}")[1]["clients"] for n in range(3)]
    listed = [c["clientid"] for p in pages for c in p]
    assert listed == sorted(ids), listed
    # One client, wherever it lives, with its subscriptions.
    for cid in ids[:SHARDS]:
        status, one = get(f"/api/v1/clients/{cid}")
        assert status == 200 and one["clientid"] == cid, one
        assert [s["filter"] for s in one["subscriptions"]] == [f"api/{cid}"], one
    # Disconnecting one on another shard: it gets DISCONNECT 0x98.
    for cid in ids[:SHARDS]:
        status, _ = get(f"/api/v1/clients/{cid}", method="DELETE")
        assert status in (200, 204), status
        packets = clients[cid].recv_until_closed()
        assert [p.reason for p in packets if p.type == r.DISCONNECT] == [0x98], cid
