#!/usr/bin/env node
// `npm test`'s first step: builds the addon (napi build --release) when
// zerofan.<platform>.node is missing or older than a file it was built
// from, so that `npm install && npm test` passes in a fresh checkout.
// Stale means: a source file listed in cargo's dep-info of the library
// (<target>/release/libzerofan_node.d: every .rs file of this crate and of
// the workspace crates it uses), a Cargo.toml, Cargo.lock or build.rs is
// newer than the addon. Skipped when ZEROFAN_NODE_BINARY names an addon.
import fs from 'node:fs'
import path from 'node:path'
import { spawnSync } from 'node:child_process'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'

const dir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..')
const root = path.resolve(dir, '..', '..')
const require = createRequire(import.meta.url)
const { platformId } = require(path.join(dir, 'lib', 'platforms.js'))

const mtime = (f) => {
  try {
    return fs.statSync(f).mtimeMs
  } catch {
    return undefined
  }
}

/** Files listed in a Makefile-style dep-info file ("out: a b\ c ..."). */
function depInfo (file) {
  let text
  try {
    text = fs.readFileSync(file, 'utf8')
  } catch {
    return undefined
  }
  const out = new Set()
  for (const line of text.split('\n')) {
    const i = line.indexOf(': ')
    if (i < 0) continue
    for (const f of line.slice(i + 2).split(/(?<!\\) /)) if (f) out.add(f.replace(/\\ /g, ' '))
  }
  return [...out]
}

/** Why the addon must be (re)built, or null when it is fresh. */
export function staleReason (addon, targetDir) {
  const built = mtime(addon)
  if (built === undefined) return `${path.basename(addon)} is missing`
  const deps = depInfo(path.join(targetDir, 'release', 'libzerofan_node.d'))
  if (deps === undefined) return `no cargo dep-info in ${targetDir}/release`
  const extra = [
    path.join(root, 'Cargo.toml'),
    path.join(root, 'Cargo.lock'),
    path.join(dir, 'Cargo.toml'),
    path.join(dir, 'build.rs')
  ]
  for (const f of [...deps, ...extra]) {
    const t = mtime(f)
    if (t === undefined) return `${f} (a source of the addon) is gone`
    if (t > built) return `${path.relative(root, f)} is newer than ${path.basename(addon)}`
  }
  return null
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (process.env.ZEROFAN_NODE_BINARY) {
    console.log(`pretest: using ZEROFAN_NODE_BINARY=${process.env.ZEROFAN_NODE_BINARY}`)
    process.exit(0)
  }
  const targetDir = process.env.CARGO_TARGET_DIR ? path.resolve(process.env.CARGO_TARGET_DIR) : path.join(root, 'target')
  const addon = path.join(dir, `zerofan.${platformId()}.node`)
  const reason = staleReason(addon, targetDir)
  if (reason === null) {
    console.log(`pretest: ${path.basename(addon)} is up to date`)
    process.exit(0)
  }
  console.log(`pretest: building the addon (${reason})`)
  const napi = path.join(dir, 'node_modules', '@napi-rs', 'cli', 'scripts', 'index.js')
  const r = spawnSync(process.execPath, [napi, 'build', '--platform', '--release', '--dts', 'native.d.ts', '--js', 'false'], {
    cwd: dir,
    stdio: 'inherit'
  })
  if (r.error) throw r.error
  if (r.status !== 0) {
    console.error('pretest: `napi build` failed; the addon needs a Rust toolchain (https://rustup.rs)')
    process.exit(r.status || 1)
  }
  // cargo may leave an up-to-date library untouched; the copy must look fresh.
  const now = new Date()
  fs.utimesSync(addon, now, now)
}
