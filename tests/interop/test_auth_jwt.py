"""JSON Web Tokens in the password field (`auth_jwt`) against the real
binary: HS256, RS256 and ES256 tokens made here (keys generated here with
`cryptography`, signed by hand: no JWT library needed), expired and
tampered ones refused with MQTT 5 and 3.1.1 codes, the disconnect at
expiry, and SIGHUP reloading the key."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import signal
import time

import pytest

import mqttraw
from brokerenv import IS_ZEROFAN
from secutil import start_broker, toml_str

pytestmark = pytest.mark.skipif(not IS_ZEROFAN, reason="zerofan auth_jwt configuration")

crypto = pytest.importorskip("cryptography")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa  # noqa: E402
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature  # noqa: E402


@pytest.fixture
def brokers():
    made = []
    yield made
    for b in made:
        assert b.stop() == 0, b.stderr()[-2000:]


def b64u(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def int_b64u(n: int) -> str:
    return b64u(n.to_bytes((n.bit_length() + 7) // 8, "big"))


def make_jwt(alg: str, key, claims: dict, kid: str | None = None) -> bytes:
    header = {"alg": alg, "typ": "JWT"}
    if kid:
        header["kid"] = kid
    signing = f"{b64u(json.dumps(header).encode())}.{b64u(json.dumps(claims).encode())}".encode()
    if alg == "HS256":
        sig = hmac.new(key, signing, hashlib.sha256).digest()
    elif alg == "RS256":
        sig = key.sign(signing, padding.PKCS1v15(), hashes.SHA256())
    elif alg == "ES256":
        r, s = decode_dss_signature(key.sign(signing, ec.ECDSA(hashes.SHA256())))
        sig = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    else:
        raise ValueError(alg)
    return signing + b"." + b64u(sig).encode()


def tamper(token: bytes, claims: dict) -> bytes:
    """Another payload under the original signature."""
    h, _, s = token.split(b".")
    return b".".join([h, b64u(json.dumps(claims).encode()).encode(), s])


def login(port, version, user, password, cid="c"):
    raw = mqttraw.RawClient("127.0.0.1", port, version=version)
    ack = raw.connect(cid, expect_reason=None, username=user, password=password)
    return raw, ack.reason


def keys():
    secret = b"hs256-test-secret"
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rn, en = rsa_key.public_key().public_numbers().n, rsa_key.public_key().public_numbers().e
    ecn = ec_key.public_key().public_numbers()
    jwks = {"keys": [
        {"kty": "oct", "kid": "h", "k": b64u(secret)},
        {"kty": "RSA", "kid": "r", "n": int_b64u(rn), "e": int_b64u(en)},
        {"kty": "EC", "kid": "e", "crv": "P-256",
         "x": b64u(ecn.x.to_bytes(32, "big")), "y": b64u(ecn.y.to_bytes(32, "big"))},
    ]}
    return {"HS256": (secret, "h"), "RS256": (rsa_key, "r"), "ES256": (ec_key, "e")}, jwks


def test_hs256_rs256_es256_tokens(tmp_path, brokers):
    signers, jwks = keys()
    (tmp_path / "jwks.json").write_text(json.dumps(jwks))
    b = start_broker(tmp_path / "b", f"auth_jwt = {{ jwks_file = {toml_str(tmp_path / 'jwks.json')} }}\n"
                     'allow_anonymous = false\nlisten = ["127.0.0.1:0"]\n', 1)
    brokers.append(b)
    port = b.listeners[0][1]
    now = int(time.time())
    for alg, (key, kid) in signers.items():
        for version, (ok, bad, unauth) in [(5, (0, 0x86, 0x87)), (4, (0, 4, 5))]:
            # Each case its own username: refusals count per (address, user).
            def user(case):
                return f"dev-{alg}-{version}-{case}"
            good = make_jwt(alg, key, {"sub": user("ok"), "exp": now + 600}, kid)
            raw, rc = login(port, version, user("ok"), good)
            assert rc == ok, (alg, version)
            raw.close()
            expired = make_jwt(alg, key, {"sub": user("exp"), "exp": now - 60}, kid)
            raw, rc = login(port, version, user("exp"), expired)
            assert rc == unauth, (alg, version, "expired")
            raw.close()
            forged = tamper(make_jwt(alg, key, {"sub": user("t"), "exp": now + 600}, kid),
                            {"sub": user("t"), "exp": now + 10 ** 6})
            raw, rc = login(port, version, user("t"), forged)
            assert rc == bad, (alg, version, "tampered")
            raw.close()
            # Somebody else's token.
            raw, rc = login(port, version, user("other"), good)
            assert rc == unauth, (alg, version, "other user")
            raw.close()
    # An unsigned token ("alg": "none") is refused.
    none = (b64u(b'{"alg":"none"}') + "." + b64u(json.dumps({"sub": "x", "exp": now + 60}).encode())
            + ".").encode()
    raw, rc = login(port, 5, "x", none)
    assert rc == 0x86
    raw.close()


def test_expiry_disconnects_and_sighup_reloads_the_key(tmp_path, brokers):
    old_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    new_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def publish_key(k):
        (tmp_path / "pub.pem").write_bytes(k.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    publish_key(old_key)
    b = start_broker(tmp_path / "b",
                     f"auth_jwt = {{ public_key_file = {toml_str(tmp_path / 'pub.pem')},"
                     ' algorithms = ["RS256"] }\nallow_anonymous = false\nlisten = ["127.0.0.1:0"]\n', 1)
    brokers.append(b)
    port = b.listeners[0][1]
    now = int(time.time())
    raw, rc = login(port, 5, "short", make_jwt("RS256", old_key, {"sub": "short", "exp": now + 2}))
    assert rc == 0
    d = raw.expect(mqttraw.DISCONNECT, timeout=8)
    assert d.reason == 0x87
    raw.close()

    publish_key(new_key)
    b.proc.send_signal(signal.SIGHUP)
    # Wait for the reload: a new-key token is accepted (each probe its own
    # user, so the refusals before the reload are not throttled).
    deadline = time.monotonic() + 10
    for i in range(200):
        assert time.monotonic() < deadline, "new key never accepted"
        user = f"probe{i}"
        raw, rc = login(port, 5, user, make_jwt("RS256", new_key, {"sub": user, "exp": now + 600}))
        raw.close()
        if rc == 0:
            break
        assert rc == 0x86
        time.sleep(0.05)  # the reload runs on a signal we cannot observe otherwise
    raw, rc = login(port, 5, "late", make_jwt("RS256", old_key, {"sub": "late", "exp": now + 600}))
    assert rc == 0x86
    raw.close()


# -- MQTT 5 enhanced authentication: SCRAM-SHA-512 against a password file
# written by mosquitto_passwd (its $7$ entries are SCRAM-SHA-512 keys).

def scram_client_final(password: bytes, first_bare: str, server_first: str):
    attrs = dict(kv.split("=", 1) for kv in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha512", password, base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha512).digest()
    stored = hashlib.sha512(client_key).digest()
    without = f"c=biws,r={attrs['r']}"
    auth = f"{first_bare},{server_first},{without}".encode()
    sig = hmac.new(stored, auth, hashlib.sha512).digest()
    proof = bytes(a ^ b for a, b in zip(client_key, sig))
    server_sig = hmac.new(hmac.new(salted, b"Server Key", hashlib.sha512).digest(), auth,
                          hashlib.sha512).digest()
    return f"{without},p={base64.b64encode(proof).decode()}", "v=" + base64.b64encode(server_sig).decode()


@pytest.mark.skipif(not __import__("shutil").which("mosquitto_passwd"),
                    reason="mosquitto_passwd not installed")
def test_scram_sha512_with_a_mosquitto_password_file(tmp_path, brokers):
    import subprocess
    pw = tmp_path / "passwd"
    subprocess.run(["mosquitto_passwd", "-c", "-b", str(pw), "alice", "wonderland"], check=True)
    b = start_broker(tmp_path / "b", f"password_file = {toml_str(pw)}\n"
                     'allow_anonymous = false\nlisten = ["127.0.0.1:0"]\n', 1)
    brokers.append(b)
    port = b.listeners[0][1]
    for password, want in [(b"wonderland", 0), (b"guess", 0x86)]:
        raw = mqttraw.RawClient("127.0.0.1", port, version=5)
        raw.send(mqttraw.connect("s1", 5, props={mqttraw.AUTH_METHOD: "SCRAM-SHA-512",
                                                 mqttraw.AUTH_DATA: b"n,,n=alice,r=pynonce"}))
        a = raw.expect(mqttraw.AUTH)
        assert a.reason == 0x18
        first = a.prop(mqttraw.AUTH_DATA).decode()
        fin, server_sig = scram_client_final(password, "n=alice,r=pynonce", first)
        body = bytes([0x18]) + mqttraw.encode_props({mqttraw.AUTH_METHOD: "SCRAM-SHA-512",
                                                     mqttraw.AUTH_DATA: fin.encode()})
        raw.send(mqttraw.packet(mqttraw.AUTH, 0, body))
        ack = raw.expect(mqttraw.CONNACK)
        assert ack.reason == want
        if want == 0:
            assert ack.prop(mqttraw.AUTH_DATA).decode() == server_sig
        raw.close()
