"""Which broker the interop tests run against (env BROKER: zerofan or mosquitto)."""

import os

BROKER = os.environ.get("BROKER", "zerofan")
IS_ZEROFAN = BROKER == "zerofan"
