"""Harness for the black-box interop tests.

Starts the real broker binary on a free port for each test and tears it down
with SIGTERM, asserting a clean exit. `BROKER=mosquitto` runs the very same
tests against Debian's mosquitto instead, to validate the tests themselves
against a known-good broker; tests marked `zerofan_only` are skipped then.

Environment:
  BROKER       zerofan (default) or mosquitto
  ZEROFAN_BIN  the broker binary (default ${CARGO_TARGET_DIR:-target}/release/zerofan)
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import random
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from pahoclient import PahoClient
from mqttraw import RawClient

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
from brokerenv import BROKER, THREADS  # noqa: E402
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0

# Default settings for every test broker; a test overrides them through
# broker_factory(**settings).
DEFAULT_CONFIG = {"sys_interval": 1}

# zerofan setting -> mosquitto option with the same meaning. A test that needs
# a setting missing here is skipped under mosquitto.
MOSQUITTO_EQUIVALENT = {
    "sys_interval": "sys_interval",
    "max_keepalive": "max_keepalive",
    "max_packet_size": "max_packet_size",
    "max_inflight": "max_inflight_messages",
    "topic_alias_maximum": "max_topic_alias",
    "max_queued_messages": "max_queued_messages",
}


def _raise_fd_limit(want: int = 8192) -> None:
    """The storm opens 1,000+ sockets here and in the broker (which inherits this
    limit); Debian's default soft limit is 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))


_raise_fd_limit()


def zerofan_bin() -> Path:
    env = os.environ.get("ZEROFAN_BIN")
    if env:
        return Path(env)
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    if not target.is_absolute():
        target = REPO / target
    return target / "release" / "zerofan"


_ports_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port to listen on, below the kernel's range of source ports for
    outgoing connections. A port from that range (what binding to port 0
    gives) can be taken as another connection's source port between this
    check and the broker's own bind: a start that failed with "Address
    already in use". Never the same port twice in one test run."""
    high = _ephemeral_low() - 1
    low = max(10000, high - 12000)
    for _ in range(200):
        port = random.randint(low, high)
        if port in _ports_given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _ports_given.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


class Broker:
    """A running broker process."""

    def __init__(self, kind: str, proc: subprocess.Popen, host: str, port: int, log: Path):
        self.kind = kind
        self.proc = proc
        self.host = host
        self.port = port
        self.log_path = log
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def addr(self) -> tuple[str, int]:
        return self.host, self.port

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def terminate(self, timeout: float = STOP_TIMEOUT) -> int:
        """SIGTERM and wait for the exit code."""
        if self.returncode is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.returncode = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(
                    f"{self.kind} did not exit within {timeout}s of SIGTERM\n{self.log()}")
        return self.returncode


def _pump(stream, logf, found: threading.Event, result: list, marker: str):
    """Copy the broker's stdout to its log; note the listening line."""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        logf.write(line)
        logf.flush()
        if not found.is_set() and marker in line:
            result.append(line.strip())
            found.set()
    found.set()  # EOF: wake the waiter; it checks `result`
    logf.close()


def start_zerofan(tmp: Path, settings: dict, store_args: tuple = ("--memory",),
                  listen: str = "127.0.0.1:0") -> Broker:
    """Start zerofan in `tmp`: in memory unless `store_args` says otherwise
    (e.g. ("--data-dir", DIR)), on `listen` (port 0: a free one). It runs
    ZEROFAN_THREADS shards (default 1) unless `settings` names `threads`."""
    settings = {"threads": THREADS, **settings}
    conf = tmp / "zerofan.toml"
    conf.write_text("".join(f"{k} = {_toml_value(v)}\n" for k, v in settings.items()))
    return launch_zerofan(tmp, ["--listen", listen, *store_args, "--config", str(conf)])


def launch_zerofan(tmp: Path, args: list, append: bool = False) -> Broker:
    """Run the zerofan binary with `args` in `tmp`; returns once it printed its
    first listening line (fails the test if it does not). With `append`, a
    restarted broker's stderr log keeps the earlier run's lines after them."""
    binary = zerofan_bin()
    if not binary.exists():
        pytest.fail(f"broker binary {binary} not found (build it, or set ZEROFAN_BIN)")
    log = tmp / "zerofan.log"
    errlog = open(tmp / "zerofan.stderr.log", "ab" if append else "wb")
    proc = subprocess.Popen(
        [str(binary), *args],
        stdout=subprocess.PIPE, stderr=errlog, stdin=subprocess.DEVNULL, cwd=tmp,
    )
    errlog.close()
    found, result = threading.Event(), []
    threading.Thread(target=_pump, daemon=True,
                     args=(proc.stdout, open(log, "w"), found, result,
                           "zerofan listening on ")).start()
    found.wait(START_TIMEOUT)
    if not result:
        proc.kill()
        proc.wait()
        errs = (tmp / "zerofan.stderr.log").read_text(errors="replace")[-3000:]
        pytest.fail(f"zerofan did not print its listening line within {START_TIMEOUT}s "
                    f"(exit {proc.returncode})\nstdout:\n{log.read_text()[-2000:]}\n"
                    f"stderr:\n{errs}")
    addr = result[0].split("zerofan listening on ", 1)[1].split()[0]
    host, port = addr.rsplit(":", 1)
    return Broker("zerofan", proc, host.strip("[]"), int(port), tmp / "zerofan.stderr.log")


def start_mosquitto(tmp: Path, settings: dict) -> Broker:
    port = free_port()
    lines = [f"listener {port} 127.0.0.1", "allow_anonymous true", "persistence false",
             "log_dest stdout", "log_type error", "log_type warning", "log_type notice"]
    for k, v in settings.items():
        if k == "queue_full" and v == "drop_new":
            continue  # what mosquitto always does
        if k not in MOSQUITTO_EQUIVALENT:
            pytest.skip(f"setting {k!r} has no mosquitto equivalent")
        lines.append(f"{MOSQUITTO_EQUIVALENT[k]} {v}")
    return launch_mosquitto(tmp, port, lines)


def launch_mosquitto(tmp: Path, port: int, lines: list) -> Broker:
    """Run mosquitto in `tmp` with these configuration lines (which listen on
    `port`); returns once the port accepts connections. Its log is appended
    to, so a restarted mosquitto keeps the earlier one's lines."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    conf = tmp / "mosquitto.conf"
    conf.write_text("\n".join(lines) + "\n")
    log = tmp / "mosquitto.log"
    logf = open(log, "ab")
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=logf, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, cwd=tmp)
    logf.close()
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"mosquitto did not start\n{log.read_text()}")
            time.sleep(0.02)  # polling a port: there is no event to wait for
    return Broker("mosquitto", proc, "127.0.0.1", port, log)


def pytest_configure(config):
    config.addinivalue_line("markers", "zerofan_only: zerofan-specific; skipped under mosquitto")
    config.addinivalue_line("markers",
                            "zerofan_pending: known to fail on zerofan for now (see pending.txt)")


def _pending_ids() -> list[str]:
    path = HERE / "pending.txt"
    if not path.exists():
        return []
    ids = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        # "shards: ID": pending only when the suite runs several shards.
        if line.startswith("shards:"):
            line = line[len("shards:"):].strip() if THREADS > 1 else ""
        if line:
            ids.append(line)
    return ids


def pytest_collection_modifyitems(config, items):
    pending = _pending_ids()
    for item in items:
        if BROKER == "mosquitto" and item.get_closest_marker("zerofan_only"):
            item.add_marker(pytest.mark.skip(reason="zerofan-specific"))
        if BROKER == "zerofan":
            nodeid = item.nodeid.split("tests/interop/")[-1]
            if any(nodeid == p or nodeid.startswith(p + "[") or nodeid.startswith(p + "::")
                   for p in pending):
                item.add_marker(pytest.mark.zerofan_pending)


@pytest.fixture
def broker_factory(tmp_path):
    """broker_factory(**settings) -> Broker. Every broker started is stopped at
    teardown with SIGTERM, and must exit 0."""
    started: list[Broker] = []

    def start(**settings) -> Broker:
        merged = {**DEFAULT_CONFIG, **settings}
        d = tmp_path / f"broker{len(started)}"
        d.mkdir()
        b = start_zerofan(d, merged) if BROKER == "zerofan" else start_mosquitto(d, merged)
        started.append(b)
        return b

    yield start
    errors = []
    for b in started:
        rc = b.terminate()
        if rc != 0:
            errors.append(f"{b.kind} exited {rc} after SIGTERM\n{b.log()}")
    assert not errors, "\n".join(errors)


@pytest.fixture
def broker(broker_factory) -> Broker:
    return broker_factory()


@pytest.fixture
def client_factory():
    """client_factory(broker, **kw) -> connected PahoClient; all are closed at teardown."""
    made: list[PahoClient] = []

    def make(b: Broker, **kw) -> PahoClient:
        c = PahoClient(b, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture
def raw_factory():
    """raw_factory(broker, version=5) -> RawClient (not yet connected)."""
    made: list[RawClient] = []

    def make(b: Broker, version: int = 5) -> RawClient:
        c = RawClient(b.host, b.port, version)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


@pytest.fixture(params=[4, 5], ids=["v311", "v5"])
def version(request) -> int:
    """MQTT protocol level: 4 (3.1.1) or 5."""
    return request.param
