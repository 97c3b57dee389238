'use strict'
// Loads the compiled addon: $ZEROFAN_NODE_BINARY if set, else the
// zerofan.<platform>.node that `napi build --platform` put next to
// package.json, else a plain zerofan.node.
const fs = require('node:fs')
const path = require('node:path')

function candidates () {
  const dir = path.join(__dirname, '..')
  const out = []
  if (process.env.ZEROFAN_NODE_BINARY) out.push(path.resolve(process.env.ZEROFAN_NODE_BINARY))
  const prefix = `zerofan.${process.platform}-${process.arch}`
  let names = []
  try {
    names = fs.readdirSync(dir)
  } catch {}
  for (const n of names.sort()) {
    if (n.startsWith(prefix) && n.endsWith('.node')) out.push(path.join(dir, n))
  }
  out.push(path.join(dir, 'zerofan.node'))
  return out
}

function load () {
  const tried = []
  for (const file of candidates()) {
    if (!fs.existsSync(file)) {
      tried.push(`${file} (missing)`)
      continue
    }
    return require(file)
  }
  throw new Error(
    'zerofan: native addon not found; run `npm run build` in bindings/node.\nTried:\n  ' +
      tried.join('\n  ')
  )
}

module.exports = load()
