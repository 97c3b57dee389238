#!/usr/bin/env node
// One version for the main package and its platform packages.
//
//   node scripts/version.mjs          check: every npm/<platform>/package.json
//                                     is zerofan-<platform> at the version of
//                                     package.json, with the os/cpu/libc and
//                                     file of its platform; exit 1 otherwise
//   node scripts/version.mjs 0.2.0    set 0.2.0 in package.json, package-lock.json
//                                     and every platform package, then check
//
// scripts/pack.sh writes the optionalDependencies of the packed main package
// from the same version, so a release can only pair matching packages.
import fs from 'node:fs'
import path from 'node:path'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'

const dir = path.resolve(process.env.ZEROFAN_PKG_DIR || path.join(path.dirname(fileURLToPath(import.meta.url)), '..'))
const require = createRequire(import.meta.url)
const { PLATFORMS, TRIPLES } = require(path.join(dir, 'lib', 'platforms.js'))

const readJson = (f) => JSON.parse(fs.readFileSync(f, 'utf8'))
const writeJson = (f, v) => fs.writeFileSync(f, JSON.stringify(v, null, 2) + '\n')
const platformJson = (p) => path.join(dir, 'npm', p, 'package.json')

/** The fields a platform package must have, from its name. */
export function expectedPlatformFields (p) {
  const [os, cpu, abi] = p.split('-')
  const file = `zerofan.${p}.node`
  const want = { name: `zerofan-${p}`, os: [os], cpu: [cpu], main: file, files: [file] }
  if (os === 'linux') want.libc = [abi === 'musl' ? 'musl' : 'glibc']
  return want
}

function setVersion (version) {
  if (!/^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$/.test(version)) throw new Error(`not a version: ${version}`)
  const main = readJson(path.join(dir, 'package.json'))
  main.version = version
  writeJson(path.join(dir, 'package.json'), main)
  const lockFile = path.join(dir, 'package-lock.json')
  if (fs.existsSync(lockFile)) {
    const lock = readJson(lockFile)
    lock.version = version
    if (lock.packages && lock.packages['']) lock.packages[''].version = version
    writeJson(lockFile, lock)
  }
  for (const p of PLATFORMS) {
    const pj = readJson(platformJson(p))
    pj.version = version
    writeJson(platformJson(p), pj)
  }
}

/** Every mismatch, as text; empty when all agree. */
export function check () {
  const errors = []
  const main = readJson(path.join(dir, 'package.json'))
  const version = main.version
  const lockFile = path.join(dir, 'package-lock.json')
  if (fs.existsSync(lockFile)) {
    const lock = readJson(lockFile)
    const lv = lock.packages && lock.packages[''] && lock.packages[''].version
    if (lock.version !== version || lv !== version) errors.push(`package-lock.json: version ${lock.version}/${lv}, package.json ${version}`)
  }
  const triples = (main.napi && main.napi.triples && main.napi.triples.additional) || []
  const want = PLATFORMS.map((p) => TRIPLES[p]).sort()
  if (JSON.stringify([...triples].sort()) !== JSON.stringify(want)) {
    errors.push(`package.json napi.triples.additional ${JSON.stringify(triples)} is not ${JSON.stringify(want)}`)
  }
  const dirs = fs.readdirSync(path.join(dir, 'npm')).filter((d) => fs.statSync(path.join(dir, 'npm', d)).isDirectory())
  for (const d of dirs) if (!PLATFORMS.includes(d)) errors.push(`npm/${d}: not a platform of lib/platforms.js`)
  for (const p of PLATFORMS) {
    let pj
    try {
      pj = readJson(platformJson(p))
    } catch (e) {
      errors.push(`npm/${p}/package.json: ${e.message}`)
      continue
    }
    if (pj.version !== version) errors.push(`npm/${p}: version ${pj.version}, package.json ${version}`)
    for (const [k, v] of Object.entries(expectedPlatformFields(p))) {
      if (JSON.stringify(pj[k]) !== JSON.stringify(v)) errors.push(`npm/${p}: ${k} is ${JSON.stringify(pj[k])}, want ${JSON.stringify(v)}`)
    }
  }
  return errors
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const arg = process.argv[2]
  if (arg) setVersion(arg)
  const errors = check()
  if (errors.length > 0) {
    console.error('zerofan versions disagree:\n  ' + errors.join('\n  '))
    process.exit(1)
  }
  console.log(`zerofan ${readJson(path.join(dir, 'package.json')).version}: main and ${PLATFORMS.length} platform packages agree`)
}
