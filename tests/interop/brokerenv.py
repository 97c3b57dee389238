"""Which broker the interop tests run against (env BROKER: zerofan or mosquitto)."""

import os

BROKER = os.environ.get("BROKER", "zerofan")
IS_ZEROFAN = BROKER == "zerofan"
# ZEROFAN_THREADS=N: every zerofan of the suite runs N shards (conftest.py).
THREADS = int(os.environ.get("ZEROFAN_THREADS") or 1)


def shard_of(client_id: str, shards: int = THREADS) -> int:
    """The shard that owns `client_id` (FNV-1a, as zerofan's `core::shard_of`)."""
    h = 0xCBF29CE484222325
    for b in client_id.encode():
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h % max(shards, 1)
