"""Which broker the interop tests run against (env BROKER: zerofan or mosquitto)."""

import os

BROKER = os.environ.get("BROKER", "zerofan")
IS_ZEROFAN = BROKER == "zerofan"
# ZEROFAN_THREADS=N: every zerofan of the suite runs N shards unless a test
# names its own (conftest.py, secutil.py, test_bridge.py). Unset: 1, said
# explicitly (the broker's own default is one shard per core).
THREADS = int(os.environ.get("ZEROFAN_THREADS") or 1)


def shard_of(client_id: str, shards: int = THREADS) -> int:
    """The shard that owns `client_id` (FNV-1a, as zerofan's `core::shard_of`)."""
    h = 0xCBF29CE484222325
    for b in client_id.encode():
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % max(shards, 1)


def threads_args(conf_text: str) -> list:
    """`--threads N`: the suite's shards (THREADS), unless the configuration
    text names its own."""
    if "threads" in conf_text:
        return []
    return ["--threads", str(THREADS)]
