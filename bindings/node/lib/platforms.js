'use strict'
// The platforms zerofan publishes an addon package for, by napi-rs's names
// (npm/<platform>/package.json is the package zerofan-<platform>), and the
// name of the platform this process runs on. No native code: scripts and
// tests read it without loading the addon.
const fs = require('node:fs')

// platform -> Rust target triple
const TRIPLES = {
  'linux-x64-gnu': 'x86_64-unknown-linux-gnu',
  'linux-x64-musl': 'x86_64-unknown-linux-musl',
  'linux-arm64-gnu': 'aarch64-unknown-linux-gnu',
  'darwin-x64': 'x86_64-apple-darwin',
  'darwin-arm64': 'aarch64-apple-darwin',
  'win32-x64-msvc': 'x86_64-pc-windows-msvc'
}
const PLATFORMS = Object.keys(TRIPLES)

function isMusl () {
  // ldd is a text script on glibc and musl's loader on musl: cheaper than
  // a process report, which is the fallback.
  try {
    const ldd = fs.readFileSync('/usr/bin/ldd', 'latin1')
    if (ldd.includes('musl')) return true
    if (ldd.includes('GNU C Library') || ldd.includes('glibc')) return false
  } catch {}
  try {
    if (process.report) process.report.excludeNetwork = true
    const header = process.report && process.report.getReport().header
    return !(header && header.glibcVersionRuntime)
  } catch {
    return false
  }
}

/** napi-rs's name of the platform this process runs on: linux-x64-gnu, darwin-arm64, ... */
function platformId () {
  const { platform, arch } = process
  if (platform === 'linux') return `linux-${arch}-${isMusl() ? 'musl' : 'gnu'}`
  if (platform === 'win32') return `win32-${arch}-msvc`
  return `${platform}-${arch}`
}

module.exports = { PLATFORMS, TRIPLES, platformId }
