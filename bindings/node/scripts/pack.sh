#!/usr/bin/env bash
# Builds the addon for every platform this machine can build and writes the
# npm tarballs, ready for `npm publish`, into OUTDIR:
#   zerofan-VERSION.tgz                the JavaScript, types and loader, with
#                                      optionalDependencies on every platform
#                                      package at VERSION (npm installs the one
#                                      whose os/cpu/libc match)
#   zerofan-PLATFORM-VERSION.tgz       one per platform built: its stripped
#                                      zerofan.PLATFORM.node
#
#   bindings/node/scripts/pack.sh OUTDIR
#   bindings/node/scripts/pack.sh --host-only OUTDIR   no cross builds (tests)
#
# The host's platform is built natively (`napi build --release`, the same
# build as build-and-test.sh, so a fresh addon is reused). Cross builds run
# when their toolchain is present, else they are skipped with the reason:
#   linux-arm64-gnu   rustup target aarch64-unknown-linux-gnu, gcc-aarch64-linux-gnu,
#                     libasound2-dev:arm64 (cpal links ALSA)
#   linux-x64-musl    rustup target x86_64-unknown-linux-musl, musl-tools, and a
#                     libasound built for musl: pkg-config dir in
#                     $ZEROFAN_MUSL_PKG_CONFIG_LIBDIR (Debian packages none)
# darwin-* and win32-* are built on their own systems.
set -euo pipefail
cross=1
if [ "${1:-}" = --host-only ]; then
  cross=0
  shift
fi
if [ $# -ne 1 ]; then
  echo "usage: $0 [--host-only] OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
root=$(cd ../.. && pwd)

node scripts/version.mjs
version=$(node -p "require('./package.json').version")
host=$(node -p "require('./lib/platforms').platformId()")
if [ ! -x node_modules/.bin/napi ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
built=()
skipped=()

has_target() { rustup target list --installed 2>/dev/null | grep -qx "$1"; }

if [ -d "npm/$host" ]; then
  echo "== pack: building $host (native)"
  npx napi build --platform --release --dts native.d.ts --js false
  built+=("$host")
else
  skipped+=("$host (this machine): zerofan publishes no package for it (lib/platforms.js)")
fi

if [ "$cross" = 0 ]; then
  skipped+=("cross builds: --host-only")
elif [ "$host" != linux-arm64-gnu ]; then
  arm_pc=/usr/lib/aarch64-linux-gnu/pkgconfig
  if ! has_target aarch64-unknown-linux-gnu; then
    skipped+=("linux-arm64-gnu: rustup target aarch64-unknown-linux-gnu not installed")
  elif ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    skipped+=("linux-arm64-gnu: no aarch64-linux-gnu-gcc (apt install gcc-aarch64-linux-gnu)")
  elif ! PKG_CONFIG_LIBDIR=$arm_pc pkg-config --exists alsa 2>/dev/null; then
    skipped+=("linux-arm64-gnu: no arm64 libasound (dpkg --add-architecture arm64; apt install libasound2-dev:arm64)")
  else
    echo "== pack: building linux-arm64-gnu (cross)"
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
      CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
      AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar \
      PKG_CONFIG_ALLOW_CROSS=1 PKG_CONFIG_LIBDIR=$arm_pc PKG_CONFIG_PATH= \
      npx napi build --platform --release --target aarch64-unknown-linux-gnu --dts native.d.ts --js false
    built+=(linux-arm64-gnu)
  fi
fi

if [ "$cross" = 1 ] && [ "$host" != linux-x64-musl ]; then
  if ! has_target x86_64-unknown-linux-musl; then
    skipped+=("linux-x64-musl: rustup target x86_64-unknown-linux-musl not installed")
  elif ! command -v musl-gcc >/dev/null; then
    skipped+=("linux-x64-musl: no musl-gcc (apt install musl-tools)")
  elif [ -z "${ZEROFAN_MUSL_PKG_CONFIG_LIBDIR:-}" ] \
    || ! PKG_CONFIG_LIBDIR=$ZEROFAN_MUSL_PKG_CONFIG_LIBDIR pkg-config --exists alsa 2>/dev/null; then
    skipped+=("linux-x64-musl: no libasound for musl (set ZEROFAN_MUSL_PKG_CONFIG_LIBDIR)")
  else
    echo "== pack: building linux-x64-musl (cross)"
    # A cdylib needs musl's dynamic libc: no static CRT.
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_LINKER=musl-gcc \
      CARGO_TARGET_X86_64_UNKNOWN_LINUX_MUSL_RUSTFLAGS="-C target-feature=-crt-static" \
      CC_x86_64_unknown_linux_musl=musl-gcc \
      PKG_CONFIG_ALLOW_CROSS=1 PKG_CONFIG_LIBDIR=$ZEROFAN_MUSL_PKG_CONFIG_LIBDIR PKG_CONFIG_PATH= \
      npx napi build --platform --release --target x86_64-unknown-linux-musl --dts native.d.ts --js false
    built+=(linux-x64-musl)
  fi
fi

pack() {
  (cd "$1" && npm pack --pack-destination "$out" --loglevel=error >/dev/null)
}

# The main package: the files `npm pack` would take from here, with the
# platform packages as optionalDependencies at this version.
mkdir "$stage/zerofan"
npm pack --dry-run --json --loglevel=error | node -e '
  const fs = require("fs"), path = require("path")
  const [{ files }] = JSON.parse(fs.readFileSync(0, "utf8"))
  for (const { path: f } of files) {
    fs.mkdirSync(path.dirname(path.join(process.argv[1], f)), { recursive: true })
    fs.copyFileSync(f, path.join(process.argv[1], f))
  }
  const { PLATFORMS } = require("./lib/platforms")
  const file = path.join(process.argv[1], "package.json")
  const pj = JSON.parse(fs.readFileSync(file, "utf8"))
  // what only a checkout uses: the build, test and pack scripts
  delete pj.scripts
  delete pj.devDependencies
  pj.optionalDependencies = Object.fromEntries(PLATFORMS.map((p) => ["zerofan-" + p, pj.version]))
  pj.files.push("LICENSE-MIT", "LICENSE-APACHE")
  fs.writeFileSync(file, JSON.stringify(pj, null, 2) + "\n")
' "$stage/zerofan"
cp "$root/LICENSE-MIT" "$root/LICENSE-APACHE" "$stage/zerofan/"
pack "$stage/zerofan"

for p in "${built[@]}"; do
  d="$stage/$p"
  mkdir "$d"
  cp "npm/$p/README.md" "$root/LICENSE-MIT" "$root/LICENSE-APACHE" "$d/"
  node -e '
    const fs = require("fs")
    const pj = JSON.parse(fs.readFileSync(process.argv[1], "utf8"))
    pj.files.push("LICENSE-MIT", "LICENSE-APACHE")
    fs.writeFileSync(process.argv[2], JSON.stringify(pj, null, 2) + "\n")
  ' "npm/$p/package.json" "$d/package.json"
  cp "zerofan.$p.node" "$d/"
  # release builds keep line tables (debug = 1): not for the tarball
  case "$p" in
    linux-arm64-gnu) strip_tool=aarch64-linux-gnu-strip ;;
    linux-* | darwin-*) strip_tool=strip ;;
    *) strip_tool= ;;
  esac
  if [ -n "$strip_tool" ] && command -v "$strip_tool" >/dev/null; then
    "$strip_tool" --strip-debug "$d/zerofan.$p.node" 2>/dev/null || "$strip_tool" -S "$d/zerofan.$p.node"
  fi
  pack "$d"
done

echo "== pack: zerofan $version tarballs in $out"
(cd "$out" && ls -l zerofan-*"$version".tgz)
for s in ${skipped[@]+"${skipped[@]}"}; do echo "skipped $s"; done
