'use strict'
// Loads the compiled addon, in this order: $ZEROFAN_NODE_BINARY; the
// zerofan.<platform>.node that `napi build --platform` put next to
// package.json (a build from this checkout); the platform package
// zerofan-<platform> that npm installed as an optional dependency of
// zerofan, chosen by its os/cpu/libc fields. The platform names are
// napi-rs's (lib/platforms.js).
const fs = require('node:fs')
const path = require('node:path')

const { PLATFORMS, platformId } = require('./platforms')

function load () {
  const id = platformId()
  const tried = []
  const env = process.env.ZEROFAN_NODE_BINARY
  if (env) {
    const file = path.resolve(env)
    if (!fs.existsSync(file)) throw new Error(`zerofan: ZEROFAN_NODE_BINARY=${env}: no such file`)
    return require(file)
  }
  const local = path.join(__dirname, '..', `zerofan.${id}.node`)
  if (fs.existsSync(local)) return require(local)
  tried.push(`${local} (missing)`)

  const pkg = `zerofan-${id}`
  if (!PLATFORMS.includes(id)) {
    throw new Error(
      `zerofan: no prebuilt addon for this platform: ${id} (node ${process.version}).\n` +
        `Prebuilt platforms: ${PLATFORMS.join(', ')}.\n` +
        'Build from source with a Rust toolchain: `npm run build` in bindings/node of the zerofan repository.'
    )
  }
  try {
    return require(pkg)
  } catch (e) {
    if (e && e.code === 'MODULE_NOT_FOUND' && String(e.message).includes(`'${pkg}'`)) {
      tried.push(`${pkg} (not installed)`)
      throw new Error(
        `zerofan: the addon package for this platform (${id}), ${pkg}, is not installed.\n` +
          `npm installs it as an optional dependency of zerofan: reinstall without --omit=optional ` +
          `(or --no-optional); if package-lock.json was made on another platform, remove it and ` +
          `node_modules and install again (npm/cli#4828); or add ${pkg} at the version of zerofan.\n` +
          `In a checkout of the repository, \`npm run build\` builds it.\nTried:\n  ${tried.join('\n  ')}`
      )
    }
    throw new Error(`zerofan: ${pkg} failed to load on ${id}: ${e && e.message}`, { cause: e })
  }
}

module.exports = load()
