#!/usr/bin/env bash
# Build the zerofan Node.js package and run its tests: the node:test suites
# and the long heap tests (npm test runs both). Idempotent: node_modules is
# (re)installed from package-lock.json only when missing or stale, and cargo
# rebuilds only what changed. Shares the workspace target dir
# ($CARGO_TARGET_DIR, else <repo>/target); napi copies the built library
# next to package.json as zerofan.<platform>.node.
#
#   bindings/node/build-and-test.sh            build + all tests
#   bindings/node/build-and-test.sh --no-heap  build + main suites only
#   bindings/node/build-and-test.sh --bench    build + tests + bench/recv.mjs
set -euo pipefail
cd "$(dirname "$0")"

heap=1
bench=0
for a in "$@"; do
  case "$a" in
    --no-heap) heap=0 ;;
    --bench) bench=1 ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done

if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  npm ci --no-audit --no-fund
fi

# The zerofan binary for the interop tests, then the addon (release).
cargo build --release -p zerofan-broker --bin zerofan
npx napi build --platform --release --dts native.d.ts --js false

if [ "$heap" = 1 ]; then
  npm test
else
  node --expose-gc --test --test-concurrency=1 --test-timeout=180000 test/*.test.mjs
fi

if [ "$bench" = 1 ]; then
  npm run bench
fi
