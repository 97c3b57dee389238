"""Helpers for the security / listener / limit interop tests.

- Certificates made at test time with the `cryptography` package: a CA, a
  server certificate for localhost / 127.0.0.1, client certificates with a
  chosen CN, and a second (untrusted) CA. Also a command line for the MQTT.js
  tests: `python secutil.py certs DIR` writes them as PEM files.
- `start_broker(tmp, toml)`: the zerofan binary with a full TOML
  configuration, waiting for one "zerofan listening on ADDR KIND" line per
  listener; `.listeners` lists (host, port, kind) in configuration order.
- `SecClient`: the harness's PahoClient with TLS, WebSocket and username /
  password options.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

START_TIMEOUT = 20.0


# ------------------------------------------------------------------ certificates

def _cryptography():
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID, ExtendedKeyUsageOID
    return x509, hashes, serialization, ec, NameOID, ExtendedKeyUsageOID


def _write_key(path: Path, key) -> None:
    _, _, serialization, _, _, _ = _cryptography()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _write_cert(path: Path, cert) -> None:
    _, _, serialization, _, _, _ = _cryptography()
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _issue(subject_cn: str, issuer_name, issuer_key, *, ca: bool, server: bool = False,
           key=None):
    x509, hashes, _, ec, NameOID, EKU = _cryptography()
    key = key or ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "zerofan tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)])
    now = datetime.datetime.now(datetime.timezone.utc)
    b = (x509.CertificateBuilder()
         .subject_name(name)
         .issuer_name(issuer_name if issuer_name is not None else name)
         .public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(now - datetime.timedelta(hours=1))
         .not_valid_after(now + datetime.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        b = b.add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                          crl_sign=True, content_commitment=False,
                                          key_encipherment=False, data_encipherment=False,
                                          key_agreement=False, encipher_only=False,
                                          decipher_only=False), critical=True)
    else:
        b = b.add_extension(x509.ExtendedKeyUsage(
            [EKU.SERVER_AUTH] if server else [EKU.CLIENT_AUTH]), critical=False)
    if server:
        b = b.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    cert = b.sign(issuer_key or key, hashes.SHA256())
    return cert, key


def make_certs(d: Path) -> SimpleNamespace:
    """CA, server, two clients (CN alice, CN bob) and a client of another CA."""
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _issue("zerofan test CA", None, None, ca=True)
    other, other_key = _issue("untrusted CA", None, None, ca=True)
    out = {}
    _write_cert(d / "ca.pem", ca)
    out["ca"] = d / "ca.pem"
    for name, cn, issuer, ikey, server in [
        ("server", "localhost", ca, ca_key, True),
        ("alice", "alice", ca, ca_key, False),
        ("bob", "bob", ca, ca_key, False),
        ("rogue", "alice", other, other_key, False),
    ]:
        cert, key = _issue(cn, issuer.subject, ikey, ca=False, server=server)
        _write_cert(d / f"{name}.pem", cert)
        _write_key(d / f"{name}-key.pem", key)
        out[name] = d / f"{name}.pem"
        out[f"{name}_key"] = d / f"{name}-key.pem"
    return SimpleNamespace(**out)


def make_cluster_certs(d: Path, nodes: int) -> SimpleNamespace:
    """Cluster mutual TLS: a cluster CA, `node1`..`nodeN` certificates (each
    both server and client: a node dials and is dialed), a `cli` one, and a
    `rogue` node certificate from another CA."""
    x509, _, _, _, _, EKU = _cryptography()
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = _issue("zerofan cluster CA", None, None, ca=True)
    other, other_key = _issue("another CA", None, None, ca=True)
    _write_cert(d / "ca.pem", ca)
    out = {"ca": d / "ca.pem"}
    names = [f"node{i}" for i in range(1, nodes + 1)] + ["cli", "rogue"]
    for name in names:
        issuer, ikey = (other, other_key) if name == "rogue" else (ca, ca_key)
        cert, key = _issue(name, issuer.subject, ikey, ca=False)
        # Re-issued with both usages.
        from cryptography.hazmat.primitives import hashes
        b = (x509.CertificateBuilder().subject_name(cert.subject)
             .issuer_name(cert.issuer).public_key(key.public_key())
             .serial_number(x509.random_serial_number())
             .not_valid_before(cert.not_valid_before_utc)
             .not_valid_after(cert.not_valid_after_utc)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([EKU.SERVER_AUTH, EKU.CLIENT_AUTH]),
                            critical=False))
        cert = b.sign(ikey, hashes.SHA256())
        _write_cert(d / f"{name}.pem", cert)
        _write_key(d / f"{name}-key.pem", key)
        out[name] = d / f"{name}.pem"
        out[f"{name}_key"] = d / f"{name}-key.pem"
    return SimpleNamespace(**out)


# ------------------------------------------------------------------ broker

def zerofan_bin() -> Path:
    from conftest import zerofan_bin as zb
    return zb()


class SecBroker:
    def __init__(self, proc, listeners, tmp: Path):
        self.proc = proc
        self.listeners = listeners  # [(host, port, kind)]
        self.tmp = tmp
        self.returncode = None

    def addr(self, i: int = 0) -> SimpleNamespace:
        host, port, _ = self.listeners[i]
        return SimpleNamespace(host=host, port=port)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return (self.tmp / "zerofan.stderr.log").read_text(errors="replace")

    def stop(self, timeout: float = 10.0) -> int:
        if self.returncode is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.returncode = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("zerofan did not exit after SIGTERM")
        return self.returncode


from brokerenv import threads_args  # noqa: E402


def start_broker(tmp: Path, toml: str, listeners: int, args=(), conf_name="zerofan.toml",
                 ) -> SecBroker:
    """Start zerofan with `toml` as its whole configuration; wait for `listeners`
    listening lines."""
    tmp.mkdir(parents=True, exist_ok=True)
    conf = tmp / conf_name
    conf.write_text(toml)
    args = [*threads_args(toml), *args]
    err = open(tmp / "zerofan.stderr.log", "wb")
    proc = subprocess.Popen([str(zerofan_bin()), "--memory", "-c", str(conf), *args],
                            stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                            cwd=tmp)
    err.close()
    found: list = []
    done = threading.Event()

    def pump():
        with open(tmp / "zerofan.log", "w") as log:
            for raw in iter(proc.stdout.readline, b""):
                line = raw.decode(errors="replace")
                log.write(line)
                log.flush()
                if line.startswith("zerofan listening on "):
                    parts = line.split()
                    addr, kind = parts[3], parts[4] if len(parts) > 4 else "mqtt"
                    host, port = addr.rsplit(":", 1)
                    found.append((host.strip("[]"), int(port), kind))
                    if len(found) >= listeners:
                        done.set()
        done.set()

    threading.Thread(target=pump, daemon=True).start()
    done.wait(START_TIMEOUT)
    if len(found) < listeners:
        proc.kill()
        proc.wait()
        raise AssertionError(f"zerofan did not start ({len(found)}/{listeners} listeners)\n"
                             + (tmp / "zerofan.stderr.log").read_text(errors="replace")[-3000:])
    return SecBroker(proc, found, tmp)


def toml_str(p) -> str:
    return '"' + str(p).replace("\\", "\\\\").replace('"', '\\"') + '"'


# ------------------------------------------------------------------ clients

def sec_client(addr, *, version=5, username=None, password=None, tls=None, ws=False,
               client_id=None, connect=True, expect_rc=0):
    """A PahoClient over TCP/TLS/WebSocket with optional credentials.
    tls: dict(ca=..., cert=..., key=...)."""
    import paho.mqtt.client as mqtt
    from pahoclient import PahoClient
    pc = PahoClient(addr, client_id=client_id, version=version, connect=False)
    if ws:
        kw = dict(callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
                  client_id=pc.client_id,
                  protocol=mqtt.MQTTv5 if version == 5 else mqtt.MQTTv311,
                  reconnect_on_failure=False, transport="websockets")
        if version != 5:
            kw["clean_session"] = True
        c = mqtt.Client(**kw)
        c.ws_set_options(path="/mqtt")
        c.on_connect = pc._on_connect
        c.on_disconnect = pc._on_disconnect
        c.on_message = pc._on_message
        c.on_subscribe = pc._on_subscribe
        c.on_unsubscribe = pc._on_unsubscribe
        pc.c = c
    if tls is not None:
        pc.c.tls_set(ca_certs=str(tls["ca"]),
                     certfile=str(tls["cert"]) if tls.get("cert") else None,
                     keyfile=str(tls["key"]) if tls.get("key") else None)
    if username is not None:
        pc.c.username_pw_set(username, password)
    if connect:
        pc.connect(expect_rc=expect_rc)
    return pc


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "certs":
        make_certs(Path(sys.argv[2]))
    else:
        sys.exit("usage: secutil.py certs DIR")
