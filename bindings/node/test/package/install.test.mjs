// The package as users get it: scripts/pack.sh writes the npm tarballs,
// a registry on 127.0.0.1 serves them (and nothing else), and
// `npm install zerofan` in a new project in a temporary directory, with no
// Rust toolchain on PATH and none of this repository's environment, must
// install the main package plus the platform package npm picks from its
// optionalDependencies. There the README's example runs as ESM and as
// CommonJS, and TypeScript (a copy of the compiler and @types/node, outside
// the repository) compiles it under --strict against the installed types.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { spawn, spawnSync } from 'node:child_process'
import crypto from 'node:crypto'
import fs from 'node:fs'
import http from 'node:http'
import os from 'node:os'
import path from 'node:path'
import { createRequire } from 'node:module'
import { fileURLToPath } from 'node:url'

const require = createRequire(import.meta.url)
const pkgDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..')
const repoDir = path.resolve(pkgDir, '..', '..')
const { PLATFORMS, platformId } = require(path.join(pkgDir, 'lib', 'platforms.js'))
const host = platformId()
const version = JSON.parse(fs.readFileSync(path.join(pkgDir, 'package.json'), 'utf8')).version
const RUST_TOOLS = ['cargo', 'rustc', 'rustup']

let tmp, dist, app, registry, cleanEnv

/** The package.json inside a tarball. */
function manifestOf (tgz) {
  const r = spawnSync('tar', ['-xzOf', tgz, 'package/package.json'], { encoding: 'utf8' })
  assert.equal(r.status, 0, r.stderr)
  return JSON.parse(r.stdout)
}

function listOf (tgz) {
  const r = spawnSync('tar', ['-tzf', tgz], { encoding: 'utf8' })
  assert.equal(r.status, 0, r.stderr)
  return r.stdout.split('\n').filter(Boolean)
}

/** A read-only npm registry over the tarballs in `dir`; 404 for any other name. */
async function startRegistry (dir) {
  const packages = new Map()
  for (const f of fs.readdirSync(dir).filter((f) => f.endsWith('.tgz'))) {
    const file = path.join(dir, f)
    const data = fs.readFileSync(file)
    const m = manifestOf(file)
    packages.set(m.name, { m, data, file: f })
  }
  const requested = []
  const server = http.createServer((req, res) => {
    const url = decodeURIComponent(req.url.split('?')[0])
    requested.push(url)
    const tarball = url.match(/^\/-\/(.+\.tgz)$/)
    if (tarball) {
      const p = [...packages.values()].find((p) => p.file === tarball[1])
      if (!p) return res.writeHead(404).end()
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': p.data.length })
      return res.end(p.data)
    }
    const p = packages.get(url.slice(1))
    if (!p) return res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":"not found"}')
    const { port } = server.address()
    const integrity = 'sha512-' + crypto.createHash('sha512').update(p.data).digest('base64')
    const shasum = crypto.createHash('sha1').update(p.data).digest('hex')
    const doc = {
      name: p.m.name,
      'dist-tags': { latest: p.m.version },
      versions: {
        [p.m.version]: { ...p.m, dist: { tarball: `http://127.0.0.1:${port}/-/${p.file}`, integrity, shasum } }
      }
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(doc))
  })
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve))
  return { url: `http://127.0.0.1:${server.address().port}/`, requested, close: () => server.close() }
}

/**
 * PATH without any directory that holds a Rust tool, after a directory of
 * links to node, npm and sh (which may share a directory with rustc).
 */
function pathWithoutRust (bin) {
  fs.mkdirSync(bin)
  const which = (cmd) => spawnSync('sh', ['-c', `command -v ${cmd}`], { encoding: 'utf8' }).stdout.trim()
  fs.symlinkSync(process.execPath, path.join(bin, 'node'))
  for (const cmd of ['npm', 'sh']) fs.symlinkSync(fs.realpathSync(which(cmd)), path.join(bin, cmd))
  const rest = (process.env.PATH || '')
    .split(path.delimiter)
    .filter((d) => d && !RUST_TOOLS.some((t) => fs.existsSync(path.join(d, t))))
  return [bin, ...rest].join(path.delimiter)
}

/** Runs a command without blocking the event loop (the registry lives in this process). */
function run (cmd, args, opts = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: app, env: cleanEnv, ...opts, stdio: ['ignore', 'pipe', 'pipe'] })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (d) => (stdout += d))
    child.stderr.on('data', (d) => (stderr += d))
    const limit = opts.timeoutMs || 120000
    const timer = setTimeout(() => child.kill('SIGKILL'), limit)
    child.on('error', reject)
    child.on('close', (status, signal) => {
      clearTimeout(timer)
      resolve({ status, signal, stdout, stderr })
    })
  })
}

/** The README's fenced blocks that start with `// example.mjs` / `// example.cjs`. */
function readmeExamples (readme) {
  const out = {}
  for (const m of readme.matchAll(/```js\n(\/\/ (example\.(?:mjs|cjs))\n[\s\S]*?)```/g)) out[m[2]] = m[1]
  return out
}

before(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'zerofan-package-'))
  assert.ok(path.relative(repoDir, tmp).startsWith('..'), 'the temporary directory is outside the repository')
  dist = path.join(tmp, 'dist')
  const r = spawnSync('bash', [path.join(pkgDir, 'scripts', 'pack.sh'), '--host-only', dist], { stdio: 'inherit', timeout: 540000 })
  assert.equal(r.status, 0, 'scripts/pack.sh failed')
  app = path.join(tmp, 'app')
  fs.mkdirSync(app)
  fs.writeFileSync(path.join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }))
  fs.writeFileSync(path.join(tmp, 'npmrc'), '')
  // Nothing of this shell: no CARGO_*, ZEROFAN_*, npm_config_* of an
  // enclosing `npm run`, no user npmrc, an empty npm cache.
  cleanEnv = {
    PATH: pathWithoutRust(path.join(tmp, 'bin')),
    HOME: path.join(tmp, 'home'),
    TMPDIR: tmp,
    LANG: 'C.UTF-8',
    npm_config_userconfig: path.join(tmp, 'npmrc'),
    npm_config_cache: path.join(tmp, 'npm-cache'),
    npm_config_audit: 'false',
    npm_config_fund: 'false',
    npm_config_update_notifier: 'false'
  }
})

after(() => {
  if (registry) registry.close()
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true })
})

test('pack.sh writes the main package and the host platform package at one version', () => {
  const mainTgz = path.join(dist, `zerofan-${version}.tgz`)
  const platTgz = path.join(dist, `zerofan-${host}-${version}.tgz`)
  const main = manifestOf(mainTgz)
  assert.equal(main.version, version)
  assert.deepEqual(main.optionalDependencies, Object.fromEntries(PLATFORMS.map((p) => [`zerofan-${p}`, version])))
  assert.equal(main.scripts, undefined, 'the published package runs no scripts')
  const mainFiles = listOf(mainTgz)
  for (const f of ['index.js', 'index.mjs', 'index.d.ts', 'index.d.mts', 'native.d.ts', 'lib/native.js', 'README.md']) {
    assert.ok(mainFiles.includes(`package/${f}`), `${f} in the main tarball`)
  }
  assert.ok(!mainFiles.some((f) => f.endsWith('.node')), 'no addon in the main tarball')

  const plat = manifestOf(platTgz)
  assert.equal(plat.name, `zerofan-${host}`)
  assert.equal(plat.version, version)
  assert.deepEqual(plat.os, [process.platform])
  assert.deepEqual(plat.cpu, [process.arch])
  assert.ok(listOf(platTgz).includes(`package/zerofan.${host}.node`))
})

test('no Rust toolchain is reachable from the install environment', () => {
  for (const t of RUST_TOOLS) {
    const r = spawnSync('sh', ['-c', `command -v ${t}`], { env: cleanEnv, encoding: 'utf8' })
    assert.notEqual(r.status, 0, `${t} found at ${r.stdout.trim()}`)
  }
})

test('npm install zerofan installs the platform package from optionalDependencies', async () => {
  registry = await startRegistry(dist)
  const r = await run('npm', ['install', 'zerofan', '--registry', registry.url, '--no-audit', '--no-fund'], {
    timeoutMs: 180000
  })
  assert.equal(r.status, 0, `npm install failed:\n${r.stdout}\n${r.stderr}`)
  const deps = JSON.parse(fs.readFileSync(path.join(app, 'package.json'), 'utf8')).dependencies
  assert.deepEqual(Object.keys(deps), ['zerofan'])
  const installed = JSON.parse(fs.readFileSync(path.join(app, 'node_modules', `zerofan-${host}`, 'package.json'), 'utf8'))
  assert.equal(installed.version, version)
  // Only the host's platform package was fetched as a tarball.
  const tarballs = registry.requested.filter((u) => u.endsWith('.tgz')).sort()
  assert.deepEqual(tarballs, [`/-/zerofan-${host}-${version}.tgz`, `/-/zerofan-${version}.tgz`].sort())
  for (const p of PLATFORMS.filter((p) => p !== host)) {
    assert.ok(!fs.existsSync(path.join(app, 'node_modules', `zerofan-${p}`)), `zerofan-${p} not installed`)
  }
})

test('the addon loads from the installed platform package', async () => {
  const r = await run(process.execPath, [
    '-e',
    "require('zerofan'); console.log(Object.keys(require.cache).find((f) => f.endsWith('.node')))"
  ])
  assert.equal(r.status, 0, r.stderr)
  assert.equal(r.stdout.trim(), path.join(fs.realpathSync(app), 'node_modules', `zerofan-${host}`, `zerofan.${host}.node`))
})

test("the README's example runs as ESM and as CommonJS", async () => {
  const examples = readmeExamples(fs.readFileSync(path.join(app, 'node_modules', 'zerofan', 'README.md'), 'utf8'))
  assert.deepEqual(Object.keys(examples).sort(), ['example.cjs', 'example.mjs'])
  for (const [name, code] of Object.entries(examples)) {
    fs.writeFileSync(path.join(app, name), code)
    const r = await run(process.execPath, [name], { timeoutMs: 60000 })
    assert.equal(r.status, 0, `${name}: ${r.signal || ''}\n${r.stdout}\n${r.stderr}`)
    assert.equal(r.stdout, 'sensors/a 21.5\n', name)
  }
  const esm = await run(process.execPath, ['--input-type=module', '-e', "console.log(import.meta.resolve('zerofan'))"])
  assert.equal(esm.stdout.trim(), 'file://' + path.join(fs.realpathSync(app), 'node_modules', 'zerofan', 'index.mjs'))
})

test('TypeScript --strict compiles the example against the installed types', async () => {
  // The compiler and Node's types, copied out of the repository's
  // node_modules so that nothing resolves back into it.
  const tools = path.join(tmp, 'tools', 'node_modules')
  for (const d of ['typescript', '@types/node', 'undici-types']) {
    fs.cpSync(path.join(pkgDir, 'node_modules', d), path.join(tools, d), { recursive: true })
  }
  const tsc = path.join(tools, 'typescript', 'bin', 'tsc')
  const common = ['--strict', '--module', 'nodenext', '--target', 'es2022', '--types', 'node', '--typeRoots', path.join(tools, '@types')]
  fs.copyFileSync(path.join(app, 'example.mjs'), path.join(app, 'example.mts'))
  const r = await run(process.execPath, [tsc, ...common, '--allowJs', '--checkJs', '--outDir', 'out', '--listFiles', 'example.mts', 'example.cjs'], {
    timeoutMs: 180000
  })
  assert.equal(r.status, 0, `tsc failed:\n${r.stdout}\n${r.stderr}`)
  const files = r.stdout.split('\n').filter(Boolean).map((f) => path.resolve(app, f))
  const installed = path.join(fs.realpathSync(app), 'node_modules', 'zerofan')
  for (const f of ['index.d.ts', 'index.d.mts', 'native.d.ts']) assert.ok(files.includes(path.join(installed, f)), `${f} used`)
  const fromRepo = files.filter((f) => !path.relative(repoDir, f).startsWith('..'))
  assert.deepEqual(fromRepo, [], 'nothing compiled from the repository')
  const out = await run(process.execPath, [path.join('out', 'example.mjs')], { timeoutMs: 60000 })
  assert.equal(out.stdout, 'sensors/a 21.5\n', out.stderr)

  // The types are real: a wrong call does not compile.
  fs.writeFileSync(path.join(app, 'bad.mts'), "import { connect } from 'zerofan'\nconnect(42)\n")
  const bad = await run(process.execPath, [tsc, ...common, '--noEmit', 'bad.mts'], { timeoutMs: 180000 })
  assert.notEqual(bad.status, 0)
  assert.match(bad.stdout, /bad\.mts\(2,9\): error TS2769/)
})

test('on a platform without a package the error names the platform', async () => {
  const fake = (platform, arch) =>
    `Object.defineProperty(process, 'platform', { value: '${platform}' }); Object.defineProperty(process, 'arch', { value: '${arch}' })\n`
  fs.writeFileSync(path.join(app, 'freebsd.cjs'), fake('freebsd', 'x64'))
  const unsupported = await run(process.execPath, ['-r', './freebsd.cjs', '-e', "require('zerofan')"])
  assert.notEqual(unsupported.status, 0)
  assert.match(unsupported.stderr, /no prebuilt addon for this platform: freebsd-x64/)
  assert.match(unsupported.stderr, /Prebuilt platforms: linux-x64-gnu, /)

  // A platform zerofan publishes, whose package npm did not install here.
  const [platform, arch] = host === 'darwin-arm64' ? ['darwin', 'x64'] : ['darwin', 'arm64']
  fs.writeFileSync(path.join(app, 'other.cjs'), fake(platform, arch))
  const missing = await run(process.execPath, ['-r', './other.cjs', '-e', "require('zerofan')"])
  assert.notEqual(missing.status, 0)
  assert.match(missing.stderr, new RegExp(`for this platform \\(${platform}-${arch}\\), zerofan-${platform}-${arch}, is not installed`))
})
