// The package's own scripts: scripts/version.mjs keeps the main and the
// platform packages at one version; scripts/pretest.mjs (npm test's first
// step) builds the addon when it is missing or stale.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { spawnSync } from 'node:child_process'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'
import { staleReason } from '../../scripts/pretest.mjs'

const require = createRequire(import.meta.url)
const pkgDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..')
const { PLATFORMS, platformId } = require(path.join(pkgDir, 'lib', 'platforms.js'))
const readJson = (f) => JSON.parse(fs.readFileSync(f, 'utf8'))
const writeJson = (f, v) => fs.writeFileSync(f, JSON.stringify(v, null, 2) + '\n')

function versionCopy () {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zerofan-version-'))
  for (const f of ['package.json', 'package-lock.json', 'lib/platforms.js', 'npm']) {
    fs.cpSync(path.join(pkgDir, f), path.join(dir, f), { recursive: true })
  }
  const run = (...args) =>
    spawnSync(process.execPath, [path.join(pkgDir, 'scripts', 'version.mjs'), ...args], {
      env: { ...process.env, ZEROFAN_PKG_DIR: dir },
      encoding: 'utf8'
    })
  return { dir, run }
}

test('version.mjs: the checked-in packages agree', () => {
  const r = spawnSync(process.execPath, [path.join(pkgDir, 'scripts', 'version.mjs')], { encoding: 'utf8' })
  assert.equal(r.status, 0, r.stderr)
  assert.deepEqual(fs.readdirSync(path.join(pkgDir, 'npm')).sort(), [...PLATFORMS].sort())
})

test('version.mjs: a platform package at another version or for another cpu fails the check', (t) => {
  const { dir, run } = versionCopy()
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const arm = path.join(dir, 'npm', 'linux-arm64-gnu', 'package.json')
  writeJson(arm, { ...readJson(arm), version: '9.9.9' })
  const darwin = path.join(dir, 'npm', 'darwin-x64', 'package.json')
  writeJson(darwin, { ...readJson(darwin), cpu: ['arm64'] })
  const r = run()
  assert.equal(r.status, 1)
  assert.match(r.stderr, /npm\/linux-arm64-gnu: version 9\.9\.9, package\.json /)
  assert.match(r.stderr, /npm\/darwin-x64: cpu is \["arm64"\], want \["x64"\]/)
})

test('version.mjs VERSION moves the main package, its lockfile and every platform package', (t) => {
  const { dir, run } = versionCopy()
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const r = run('7.8.9-rc.1')
  assert.equal(r.status, 0, r.stderr)
  assert.equal(readJson(path.join(dir, 'package.json')).version, '7.8.9-rc.1')
  const lock = readJson(path.join(dir, 'package-lock.json'))
  assert.equal(lock.version, '7.8.9-rc.1')
  assert.equal(lock.packages[''].version, '7.8.9-rc.1')
  for (const p of PLATFORMS) assert.equal(readJson(path.join(dir, 'npm', p, 'package.json')).version, '7.8.9-rc.1', p)
  assert.notEqual(run('not-a-version').status, 0)
})

test('pretest: missing, stale and fresh addons', (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'zerofan-pretest-'))
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }))
  const src = path.join(dir, 'lib.rs')
  const addon = path.join(dir, 'zerofan.test.node')
  fs.mkdirSync(path.join(dir, 'release'))
  fs.writeFileSync(src, '')
  const depInfo = path.join(dir, 'release', 'libzerofan_node.d')
  assert.match(staleReason(addon, dir), /zerofan\.test\.node is missing/)
  fs.writeFileSync(addon, '')
  assert.match(staleReason(addon, dir), /no cargo dep-info/)
  fs.writeFileSync(depInfo, `${dir}/libzerofan_node.so: ${src}\n\n${src}:\n`)
  const past = new Date(Date.now() - 60000)
  fs.utimesSync(src, past, past)
  assert.equal(staleReason(addon, dir), null)
  const future = new Date(Date.now() + 60000)
  fs.utimesSync(src, future, future)
  assert.match(staleReason(addon, dir), /lib\.rs is newer than zerofan\.test\.node/)
})

test('npm test builds a missing addon first (the pretest script)', (t) => {
  const addon = path.join(pkgDir, `zerofan.${platformId()}.node`)
  const aside = `${addon}.aside-${process.pid}`
  if (fs.existsSync(addon)) fs.renameSync(addon, aside)
  t.after(() => {
    if (fs.existsSync(aside)) {
      if (fs.existsSync(addon)) fs.rmSync(aside)
      else fs.renameSync(aside, addon)
    }
  })
  const r = spawnSync('npm', ['run', 'pretest', '--silent'], { cwd: pkgDir, encoding: 'utf8', timeout: 540000 })
  assert.equal(r.status, 0, `${r.stdout}\n${r.stderr}`)
  assert.match(r.stdout, /pretest: building the addon \(zerofan\.[\w-]+\.node is missing\)/)
  assert.ok(fs.existsSync(addon), 'the addon was built')
  const again = spawnSync('npm', ['run', 'pretest', '--silent'], { cwd: pkgDir, encoding: 'utf8' })
  assert.match(again.stdout, /is up to date/)
})
