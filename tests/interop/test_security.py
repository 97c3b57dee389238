"""Authentication and access control: a password file written by Debian's
mosquitto_passwd and by `zerofan passwd`, refused logins (MQTT 5 and 3.1.1
codes), login throttling, an ACL matrix end to end (publish, subscribe,
delivery, retained, $SYS), `zerofan -c mosquitto.conf`, `--test-config`."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

import mqttraw
from brokerenv import IS_ZEROFAN
from secutil import make_certs, sec_client, start_broker, toml_str, zerofan_bin

pytestmark = pytest.mark.skipif(not IS_ZEROFAN, reason="zerofan security configuration")

MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"


@pytest.fixture
def brokers():
    made = []
    yield made
    for b in made:
        assert b.stop() == 0, b.stderr()[-2000:]


def mosquitto_passwd_file(path, users):
    first = True
    for user, pw in users.items():
        args = [MOSQUITTO_PASSWD] + (["-c"] if first else []) + ["-b", str(path), user, pw]
        subprocess.run(args, check=True, capture_output=True)
        first = False
    assert path.read_text().startswith(next(iter(users)) + ":$7$")


def raw_connect(port, version, user=None, password=None, cid="c"):
    raw = mqttraw.RawClient("127.0.0.1", port, version=version)
    kw = {}
    if user is not None:
        kw["username"] = user
    if password is not None:
        kw["password"] = password
    ack = raw.connect(cid, expect_reason=None, **kw)
    return raw, ack.reason


@pytest.mark.skipif(not shutil.which("mosquitto_passwd") and
                    not __import__("os").path.exists(MOSQUITTO_PASSWD),
                    reason="mosquitto_passwd not installed")
@pytest.mark.parametrize("version", [4, 5], ids=["v311", "v5"])
def test_mosquitto_passwd_file_logins(tmp_path, brokers, version):
    pw = tmp_path / "passwd"
    mosquitto_passwd_file(pw, {"alice": "wonderland", "bob": "builder"})
    b = start_broker(tmp_path / "b", f"password_file = {toml_str(pw)}\nallow_anonymous = false\n"
                     'listen = ["127.0.0.1:0"]\n', 1)
    brokers.append(b)
    port = b.listeners[0][1]
    bad, anon = (0x86, 0x87) if version == 5 else (4, 5)
    cases = [("alice", b"wonderland", 0), ("bob", b"builder", 0),
             ("alice", b"builder", bad), ("carol", b"x", bad), (None, None, anon)]
    for user, password, want in cases:
        raw, rc = raw_connect(port, version, user, password)
        assert rc == want, (user, password, rc)
        raw.close()
    # paho too
    c = sec_client(b.addr(0), version=version, username="alice", password="wonderland")
    c.close()


def test_login_failures_are_throttled(tmp_path, brokers):
    pw = tmp_path / "passwd"
    mosquitto_passwd_file(pw, {"alice": "wonderland", "bob": "builder"})
    b = start_broker(tmp_path / "b", f"password_file = {toml_str(pw)}\nsys_interval = 1\n"
                     'allow_anonymous = false\nlisten = ["127.0.0.1:0"]\n', 1)
    brokers.append(b)
    port = b.listeners[0][1]
    # Anonymous refusals are not failures: never throttled.
    for _ in range(5):
        raw, rc = raw_connect(port, 5)
        assert rc == 0x87
        raw.close()
    # 3 failures are free; the 4th starts a 1 s penalty during which even the
    # right password is refused with 0x9F (3.1.1: 3) without being checked.
    for _ in range(4):
        raw, rc = raw_connect(port, 5, "alice", b"wrong")
        assert rc == 0x86
        raw.close()
    raw, rc = raw_connect(port, 5, "alice", b"wonderland")
    assert rc == 0x9F
    raw.close()
    raw, rc = raw_connect(port, 4, "alice", b"wonderland")
    assert rc == 3
    raw.close()
    # Another account from the same address is not locked out.
    raw, rc = raw_connect(port, 5, "bob", b"builder", cid="b")
    assert rc == 0
    raw.close()
    time.sleep(1.2)  # the penalty is a wall-clock delay: waiting it out is the test
    raw, rc = raw_connect(port, 5, "alice", b"wonderland")
    assert rc == 0
    raw.subscribe([("$SYS/broker/security/auth/throttled", 0)])
    p = raw.expect(mqttraw.PUBLISH)
    assert int(p.payload) >= 2
    raw.close()


def test_zerofan_passwd(tmp_path, brokers):
    f = tmp_path / "passwd"
    zf = str(zerofan_bin())
    r = subprocess.run([zf, "passwd", "-c", "-b", "s3cret", str(f), "dave"], capture_output=True)
    assert r.returncode == 0, r.stderr
    # From stdin (not a terminal), adding a second user to the same file.
    r = subprocess.run([zf, "passwd", str(f), "erin"], input=b"hunter2\n", capture_output=True)
    assert r.returncode == 0, r.stderr
    # Change dave's password.
    r = subprocess.run([zf, "passwd", "-b", "n3w", str(f), "dave"], capture_output=True)
    assert r.returncode == 0, r.stderr
    lines = f.read_text().splitlines()
    assert [l.split(":")[0] for l in lines] == ["dave", "erin"]
    assert all(l.split(":")[1].startswith("$7$") for l in lines)
    # Bad username, missing file without -c.
    assert subprocess.run([zf, "passwd", "-b", "x", str(f), "a:b"],
                          capture_output=True).returncode != 0
    assert subprocess.run([zf, "passwd", "-b", "x", str(tmp_path / "none"), "a"],
                          capture_output=True).returncode != 0
    b = start_broker(tmp_path / "b", f"password_file = {toml_str(f)}\n"
                     'listen = ["127.0.0.1:0"]\n', 1)
    brokers.append(b)
    port = b.listeners[0][1]
    for user, password, want in [("dave", b"n3w", 0), ("dave", b"s3cret", 0x86),
                                 ("erin", b"hunter2", 0)]:
        raw, rc = raw_connect(port, 5, user, password)
        assert rc == want
        raw.close()
    # mosquitto itself can read what zerofan wrote: mosquitto_passwd -U would
    # rehash plain text, so instead check the verify path through mosquitto_passwd
    # by updating the file (it refuses to touch a file it cannot parse).
    r = subprocess.run([MOSQUITTO_PASSWD, "-b", str(f), "frank", "x"], capture_output=True)
    assert r.returncode == 0, r.stderr
    assert "dave:$7$" in f.read_text()


def test_zerofan_passwd_scram_sha256_entry(tmp_path, brokers):
    """`--scram-sha-256` writes PostgreSQL's `SCRAM-SHA-256$ITER:SALT$STORED:SERVER`
    form; the broker reads it beside `$7$` entries and checks plain passwords
    against it (the SCRAM-SHA-256 exchange itself is a core unit test)."""
    f = tmp_path / "passwd"
    zf = str(zerofan_bin())
    r = subprocess.run([zf, "passwd", "-c", "-b", "s3cret", str(f), "dave"], capture_output=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([zf, "passwd", "--scram-sha-256", "-b", "glass", str(f), "carol"],
                       capture_output=True)
    assert r.returncode == 0, r.stderr
    entry = dict(l.split(":", 1) for l in f.read_text().splitlines())["carol"]
    assert entry.startswith("SCRAM-SHA-256$4096:"), entry
    b = start_broker(tmp_path / "b", f"password_file = {toml_str(f)}\n"
                     'allow_anonymous = false\nlisten = ["127.0.0.1:0"]\n', 1)
    brokers.append(b)
    port = b.listeners[0][1]
    for user, password, want in [("carol", b"glass", 0), ("carol", b"s3cret", 0x86),
                                 ("dave", b"s3cret", 0)]:
        raw, rc = raw_connect(port, 5, user, password)
        assert rc == want, (user, rc)
        raw.close()


ACL = """\
# anonymous clients
topic read public/#
topic read $SYS/broker/uptime

user alice
topic readwrite alice/#
topic deny alice/secret
topic read public/#
topic write public/alice

user bob
topic read alice/#
topic read public/#

pattern readwrite devices/%c/#
pattern read users/%u/inbox
"""


@pytest.fixture
def acl_broker(tmp_path, brokers):
    pw = tmp_path / "passwd"
    mosquitto_passwd_file(pw, {"alice": "a", "bob": "b"})
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    b = start_broker(tmp_path / "b", f"password_file = {toml_str(pw)}\nacl_file = {toml_str(acl)}\n"
                     'allow_anonymous = true\nsys_interval = 1\nlisten = ["127.0.0.1:0"]\n', 1)
    brokers.append(b)
    return b


def test_acl_publish_matrix(acl_broker):
    b = acl_broker
    port = b.listeners[0][1]
    # Every publish seen by a reader that may read everything it could get.
    cases = [
        # (user, client id, topic, allowed)
        ("alice", "a1", "alice/x", True),
        ("alice", "a1", "alice/secret", False),
        ("alice", "a1", "public/alice", True),
        ("alice", "a1", "public/other", False),
        ("alice", "a1", "bob/x", False),
        ("bob", "b1", "alice/x", False),
        ("bob", "b1", "devices/b1/state", True),
        ("bob", "b1", "devices/other/state", False),
        (None, "anon", "public/x", False),
        (None, "anon", "devices/anon/t", True),
        ("alice", "a1", "$SYS/broker/x", False),
    ]
    for user, cid, topic, allowed in cases:
        for version in (5, 4):
            raw, rc = raw_connect(port, version, user, user and user[0].encode(), cid)
            assert rc == 0
            ack = raw.publish(topic, b"p", qos=1)
            want = 0 if allowed or version == 4 else 0x87
            got = ack.reason
            if allowed and version == 5:
                assert got in (0, 0x10), (user, topic, got)
            else:
                assert got == want, (user, topic, version, got)
            # QoS 2 under MQTT 5: PUBREC 0x87 ends the flow.
            if version == 5 and not allowed:
                raw.send(mqttraw.publish(topic, b"p", 2, False, False, 7, 5))
                rec = raw.expect(mqttraw.PUBREC)
                assert rec.reason == 0x87
            raw.close()


def test_acl_subscribe_and_delivery(acl_broker):
    b = acl_broker
    addr = b.addr(0)
    alice = sec_client(addr, username="alice", password="a", client_id="a1")
    bob = sec_client(addr, username="bob", password="b", client_id="b1")
    anon = sec_client(addr, client_id="anon1")
    anon4 = sec_client(addr, client_id="anon2", version=4)
    try:
        # SUBSCRIBE: refused when nothing could ever be delivered.
        assert alice.subscribe("bob/#", qos=1) == [0x87]
        assert anon4.subscribe("alice/#", qos=1) == [0x80]
        assert alice.subscribe("alice/secret", qos=1) == [0x87]
        # A wide filter is granted; what may not be read is not delivered.
        assert bob.subscribe("#", qos=1) == [1]
        assert anon.subscribe("#", qos=1) == [1]
        alice.publish("alice/x", b"for bob", qos=1)
        alice.publish("public/alice", b"for all", qos=1)
        alice.publish("devices/a1/t", b"own device", qos=1)
        assert sorted(m.payload for m in bob.expect_messages(2)) == [b"for all", b"for bob"]
        assert anon.expect_message().payload == b"for all"
        bob.assert_no_message(0.5)
        anon.assert_no_message(0.2)
        # Retained messages are checked at delivery too.
        alice.publish("alice/retained", b"r", qos=1, retain=True)
        late_anon = sec_client(addr, client_id="anon3")
        late_bob = sec_client(addr, username="bob", password="b", client_id="b2")
        try:
            assert late_anon.subscribe("alice/#", qos=1) == [0x87]
            assert late_bob.subscribe("alice/#", qos=1) == [1]
            assert late_bob.expect_message().payload == b"r"
            # $SYS: only what the ACL grants (anonymous: uptime only).
            late_anon.subscribe("$SYS/#")
            for _ in range(3):
                m = late_anon.expect_message()
                assert m.topic == "$SYS/broker/uptime", m.topic
            late_bob.subscribe("$SYS/#")
            late_bob.assert_no_message(1.5)
        finally:
            late_anon.close()
            late_bob.close()
        # %u pattern: bob may read users/bob/inbox, not users/alice/inbox.
        assert bob.subscribe("users/bob/inbox") == [0]
        assert bob.subscribe("users/alice/inbox") == [0x87]
    finally:
        for c in (alice, bob, anon, anon4):
            c.close()


def test_refusal_counters_in_sys(acl_broker):
    port = acl_broker.listeners[0][1]
    raw, rc = raw_connect(port, 5, "alice", b"a", "a9")
    raw.publish("bob/x", b"", qos=1)
    raw.subscribe([("bob/#", 1)], packet_id=2)
    raw.close()
    raw, rc = raw_connect(port, 5, "alice", b"zzz", "a10")
    assert rc == 0x86
    raw.close()
    watcher = sec_client(acl_broker.addr(0), username="alice", password="a", client_id="a11")
    # alice has no $SYS rule: she sees nothing there.
    watcher.subscribe("$SYS/broker/security/#")
    watcher.assert_no_message(1.5)
    watcher.close()


# ------------------------------------------------------------------ mosquitto.conf

def test_zerofan_reads_mosquitto_conf(tmp_path, brokers):
    import socket
    certs = make_certs(tmp_path / "certs")
    pw = tmp_path / "passwd"
    mosquitto_passwd_file(pw, {"alice": "wonderland"})
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite home/#\n")
    ports = []
    for _ in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    conf = f"""\
# /etc/mosquitto/mosquitto.conf (Debian style; pid file moved where a test may write)
pid_file {tmp_path / "mosquitto.pid"}
persistence false
persistence_location /var/lib/mosquitto/
log_dest stdout
log_type error
per_listener_settings false
allow_anonymous false
password_file {pw}
acl_file {acl}
max_inflight_messages 20
max_queued_messages 1000
max_keepalive 300
max_packet_size 1048576
autosave_interval 1800
not_a_mosquitto_option yes

listener {ports[0]} 127.0.0.1

listener {ports[1]} 127.0.0.1
certfile {certs.server}
keyfile {certs.server_key}
cafile {certs.ca}

listener {ports[2]} 127.0.0.1
protocol websockets
"""
    b = start_broker(tmp_path / "b", conf, 3, conf_name="mosquitto.conf")
    brokers.append(b)
    assert [(p, k) for _, p, k in b.listeners] == [(ports[0], "mqtt"), (ports[1], "mqtt+tls"),
                                                 (ports[2], "websockets")]
    err = b.stderr()
    for d in ("autosave_interval", "not_a_mosquitto_option"):
        assert err.count(d) == 1, err
    # pid_file and log_dest are read, not warned about.
    assert "pid_file" not in err and "log_dest" not in err, err
    assert (tmp_path / "mosquitto.pid").read_text().strip() == str(b.proc.pid)
    tls = {"ca": certs.ca}
    subs = sec_client(b.addr(2), ws=True, username="alice", password="wonderland")
    pub = sec_client(b.addr(1), tls=tls, username="alice", password="wonderland")
    try:
        subs.subscribe("home/#", qos=1)
        pub.publish("home/door", b"open", qos=1)
        assert subs.expect_message().payload == b"open"
        sec_client(b.addr(0), expect_rc=0x87).close()
        sec_client(b.addr(0), username="alice", password="nope", expect_rc=0x86).close()
    finally:
        subs.close()
        pub.close()


def run_test_config(tmp_path, name, text):
    f = tmp_path / name
    f.write_text(text)
    return subprocess.run([str(zerofan_bin()), "--test-config", "-c", str(f)],
                          capture_output=True, text=True, timeout=30)


def test_test_config_good_and_bad(tmp_path):
    pw = tmp_path / "passwd"
    mosquitto_passwd_file(pw, {"alice": "x"})
    acl = tmp_path / "acl"
    acl.write_text("user alice\ntopic readwrite a/#\n")
    good = run_test_config(tmp_path, "good.toml",
                           f'password_file = {toml_str(pw)}\nacl_file = {toml_str(acl)}\n'
                           '[[listener]]\nbind = "127.0.0.1:8883"\n')
    assert good.returncode == 0 and "configuration OK" in good.stdout, good
    good = run_test_config(tmp_path, "good.conf", f"listener 1883\npassword_file {pw}\n")
    assert good.returncode == 0 and "configuration OK" in good.stdout, good
    bad_cases = [
        ("syntax.toml", 'listen = ["127.0.0.1:1"]\nmax_keepalive = = 3\n', ["syntax.toml", "line 2"]),
        ("key.toml", "max_keep_alive = 3\n", ["key.toml", "max_keep_alive"]),
        ("bad.conf", "listener 1883\nmax_keepalive lots\n", ["bad.conf", "line 2"]),
        ("acl.toml", f"acl_file = {toml_str(tmp_path / 'badacl')}\n", ["badacl", ":2:"]),
        ("cert.toml", '[[listener]]\nbind = "127.0.0.1:1"\n'
                      'tls = { cert = "/nonexistent/c.pem", key = "/nonexistent/k.pem" }\n',
         ["/nonexistent/c.pem"]),
    ]
    (tmp_path / "badacl").write_text("user alice\ntopic sideways a/#\n")
    for name, text, needles in bad_cases:
        r = run_test_config(tmp_path, name, text)
        assert r.returncode == 1, (name, r)
        for n in needles:
            assert n in r.stderr, (name, n, r.stderr)
