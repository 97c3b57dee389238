"""Logins decided by an HTTP service (`auth_http`, EMQX's conventions)
against a small service in this file on 127.0.0.1: allowed, denied,
cached, slow (the other clients are not slowed), down (the `fail`
policy), and the MQTT 5 / 3.1.1 codes."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import mqttraw
from brokerenv import IS_ZEROFAN
from secutil import start_broker

pytestmark = pytest.mark.skipif(not IS_ZEROFAN, reason="zerofan auth_http configuration")


class AuthService:
    """allow for users starting with "good" (superuser: "root"), deny for
    "bad", 500 for "err", and "slow" waits for `release` (10 s at most).
    On .../acl: deny for topics under deny/, else allow."""

    def __init__(self):
        self.calls: list[dict] = []
        self.release = threading.Event()
        svc = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n))
                svc.calls.append(req)
                if self.path.endswith("/acl"):
                    allow = not req.get("topic", "").startswith("deny/")
                    data = json.dumps({"result": "allow" if allow else "deny"}).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                user = req.get("username", "")
                if user.startswith("slow"):
                    svc.release.wait(10)
                if user.startswith("err"):
                    self.send_response(500)
                    self.end_headers()
                    return
                body = {"result": "allow" if user.startswith(("good", "slow", "root")) else "deny"}
                if user == "root":
                    body["is_superuser"] = True
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/mqtt/auth"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, user: str) -> int:
        return sum(1 for c in self.calls if c.get("username") == user)

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def service():
    s = AuthService()
    yield s
    s.close()


@pytest.fixture
def brokers():
    made = []
    yield made
    for b in made:
        assert b.stop() == 0, b.stderr()[-2000:]


def broker(tmp_path, brokers, url, extra=""):
    b = start_broker(tmp_path, f'auth_http = {{ url = "{url}"{extra} }}\n'
                     'allow_anonymous = false\nlisten = ["127.0.0.1:0"]\n', 1)
    brokers.append(b)
    return b.listeners[0][1]


def login(port, version, user, password=b"pw", cid=None):
    raw = mqttraw.RawClient("127.0.0.1", port, version=version)
    ack = raw.connect(cid or user, expect_reason=None, username=user, password=password)
    return raw, ack.reason


def test_allowed_denied_and_cached(tmp_path, service, brokers):
    port = broker(tmp_path, brokers, service.url)
    for version, bad in [(5, 0x86), (4, 4)]:
        raw, rc = login(port, version, f"good{version}")
        assert rc == 0
        raw.close()
        raw, rc = login(port, version, f"bad{version}")
        assert rc == bad
        raw.close()
    assert service.calls[0] == {"username": "good5", "password": "pw", "clientid": "good5",
                                "address": "127.0.0.1", "listener": "0"}
    # The same login again: answered from the cache, the service not asked.
    raw, rc = login(port, 5, "good5")
    assert rc == 0
    raw.close()
    assert service.count("good5") == 1
    # Another password is another question.
    raw, rc = login(port, 5, "good5", b"other")
    assert rc == 0
    raw.close()
    assert service.count("good5") == 2


def test_slow_service_does_not_slow_the_others(tmp_path, service, brokers):
    port = broker(tmp_path, brokers, service.url, ", timeout_ms = 8000")
    result = {}

    def slow_login():
        raw, rc = login(port, 5, "slow1")
        result["rc"] = rc
        raw.close()

    t = threading.Thread(target=slow_login)
    t.start()
    deadline = time.monotonic() + 5
    while service.count("slow1") == 0:
        assert time.monotonic() < deadline, "the slow login never reached the service"
        time.sleep(0.01)
    # While slow1 waits for its answer, another client logs in and gets a
    # message through, quickly.
    start = time.monotonic()
    raw, rc = login(port, 5, "good-fast")
    assert rc == 0
    raw.subscribe([("t/fast", 1)])
    raw.publish("t/fast", b"hello", qos=0)
    assert raw.expect(mqttraw.PUBLISH, timeout=2).payload == b"hello"
    elapsed = time.monotonic() - start
    raw.close()
    assert elapsed < 1.0, elapsed
    assert "rc" not in result, "the slow login was answered before the service was"
    service.release.set()
    t.join(10)
    assert result.get("rc") == 0


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("fail", ["deny", "allow"])
def test_service_down_follows_fail(tmp_path, brokers, fail):
    url = f"http://127.0.0.1:{free_port()}/auth"
    port = broker(tmp_path, brokers, url, f', fail = "{fail}", timeout_ms = 500')
    for version, refused in [(5, 0x88), (4, 3)]:
        for i in range(5):  # never throttled: not the client's failure
            raw, rc = login(port, version, "dev", cid=f"c{version}{i}")
            assert rc == (refused if fail == "deny" else 0), (version, i)
            raw.close()


def test_service_errors_and_timeouts_follow_fail(tmp_path, service, brokers):
    port = broker(tmp_path, brokers, service.url, ", timeout_ms = 300")
    raw, rc = login(port, 5, "err1")
    assert rc == 0x88
    raw.close()
    # slow: no answer within 300 ms.
    raw, rc = login(port, 5, "slow2")
    assert rc == 0x88
    raw.close()
    # Failures are not cached: asked again.
    raw, rc = login(port, 5, "err1")
    assert rc == 0x88
    raw.close()
    assert service.count("err1") == 2


def test_acl_url_decides_publish_and_subscribe(tmp_path, service, brokers):
    acl = service.url.rsplit("/", 1)[0] + "/acl"
    port = broker(tmp_path, brokers, service.url, f', acl_url = "{acl}"')
    sub, rc = login(port, 5, "good-sub")
    assert rc == 0
    ack = sub.subscribe([("ok/#", 1), ("deny/#", 1)])
    assert ack.reasons == [1, 0x87]
    pub, rc = login(port, 5, "good-pub")
    assert rc == 0
    for i in range(2):  # the second time from the cache
        assert pub.publish("ok/x", b"fine", qos=1, packet_id=1 + 2 * i).reason in (0, None)
        assert sub.expect(mqttraw.PUBLISH, timeout=3).payload == b"fine"
        assert pub.publish("deny/x", b"no", qos=1, packet_id=2 + 2 * i).reason == 0x87
    sub.assert_silent(0.2)
    acl_calls = [c for c in service.calls if "action" in c]
    assert {(c["topic"], c["action"]) for c in acl_calls} == {
        ("ok/#", "subscribe"), ("deny/#", "subscribe"), ("ok/x", "publish"), ("deny/x", "publish")}
    assert len(acl_calls) == 4, acl_calls
    sub.close()
    pub.close()
