// Shared test helpers: brokers, proxies, payload checks.
import { spawn } from 'node:child_process'
import { existsSync, readFileSync, mkdtempSync, rmSync } from 'node:fs'
import os from 'node:os'
import net from 'node:net'
import tls from 'node:tls'
import https from 'node:https'
import http from 'node:http'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { createRequire } from 'node:module'

const require = createRequire(import.meta.url)
export const here = path.dirname(fileURLToPath(import.meta.url))
export const pkgDir = path.join(here, '..')
export const zf = require(pkgDir)
export const mqtt = require('mqtt')

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

export function fixture (name) {
  return readFileSync(path.join(here, 'fixtures', name), 'utf8')
}

/** Waits for `cond()` to be true, polling every 10 ms. */
export async function until (cond, ms = 5000, what = 'condition') {
  const end = Date.now() + ms
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`)
    await sleep(10)
  }
}

/** Collect garbage until finalizers have run (they run on later turns). */
export async function fullGc (rounds = 4) {
  for (let i = 0; i < rounds; i++) {
    global.gc()
    await new Promise((resolve) => setImmediate(resolve))
    await sleep(5)
  }
}

/** Check the load publisher's payload: 16-byte header, then (seq + i) & 0xff. */
export function checkPayload (buf, size) {
  if (buf.length !== size) return `length ${buf.length} != ${size}`
  const seq = Number(buf.readBigUInt64LE(8) & 0xffn)
  for (let i = 16; i < buf.length; i++) {
    if (buf[i] !== ((seq + i - 16) & 0xff)) return `byte ${i} is ${buf[i]}, want ${(seq + i - 16) & 0xff}`
  }
  return null
}

/** The zerofan binary, or null: $ZEROFAN_BIN, then the cargo target dirs. */
export function zerofanBinary () {
  const dirs = []
  if (process.env.ZEROFAN_BIN) return existsSync(process.env.ZEROFAN_BIN) ? process.env.ZEROFAN_BIN : null
  if (process.env.CARGO_TARGET_DIR) dirs.push(process.env.CARGO_TARGET_DIR)
  dirs.push(path.join(pkgDir, '..', '..', 'target'))
  for (const d of dirs) {
    for (const p of ['release', 'debug']) {
      const f = path.join(d, p, 'zerofan')
      if (existsSync(f)) return f
    }
  }
  return null
}

/** Run the zerofan binary on a free port; resolves { port, close() }. */
export function runZerofan (bin) {
  return new Promise((resolve, reject) => {
    // A scratch working directory: the broker keeps its data under ./zerofan-data.
    const cwd = mkdtempSync(path.join(os.tmpdir(), 'zerofan-node-test-'))
    const child = spawn(bin, ['--listen', '127.0.0.1:0'], { cwd, stdio: ['ignore', 'pipe', 'inherit'] })
    let out = ''
    child.on('error', reject)
    child.on('exit', (code) => reject(new Error(`zerofan exited with ${code}`)))
    child.stdout.on('data', (d) => {
      out += d
      const m = /listening on [^\s]*:(\d+)/.exec(out)
      if (m) {
        child.removeAllListeners('exit')
        resolve({
          port: Number(m[1]),
          close: () => new Promise((resolve) => {
            child.once('exit', () => {
              rmSync(cwd, { recursive: true, force: true })
              resolve()
            })
            child.kill('SIGTERM')
          })
        })
      }
    })
  })
}

/** A TLS terminator in front of a TCP broker (for mqtts://). */
export function tlsProxy (targetPort) {
  const server = tls.createServer({ key: fixture('server.key'), cert: fixture('server.pem') }, (s) => {
    const up = net.connect(targetPort, '127.0.0.1')
    s.pipe(up).pipe(s)
    s.on('error', () => up.destroy())
    up.on('error', () => s.destroy())
  })
  return listen(server)
}

/** A WebSocket (optionally TLS) endpoint that bridges to a TCP broker. */
export function wsProxy (targetPort, secure) {
  const { WebSocketServer } = require('ws')
  const server = secure
    ? https.createServer({ key: fixture('server.key'), cert: fixture('server.pem') })
    : http.createServer()
  const wss = new WebSocketServer({ server, path: '/mqtt', handleProtocols: (p) => (p.has('mqtt') ? 'mqtt' : false) })
  wss.on('connection', (ws) => {
    const up = net.connect(targetPort, '127.0.0.1')
    up.on('data', (d) => ws.send(d))
    ws.on('message', (d) => up.write(d))
    ws.on('close', () => up.destroy())
    up.on('close', () => ws.close())
    up.on('error', () => ws.close())
    ws.on('error', () => up.destroy())
  })
  return listen(server, () => wss.close())
}

function listen (server, extraClose) {
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      resolve({
        port: server.address().port,
        close: () => new Promise((resolve) => {
          if (extraClose) extraClose()
          server.close(() => resolve())
          if (server.closeAllConnections) server.closeAllConnections()
        })
      })
    })
  })
}

/** Collect `n` messages from a client (zerofan or MQTT.js). */
export function collect (client, n, ms = 10000) {
  return new Promise((resolve, reject) => {
    const got = []
    const timer = setTimeout(() => {
      client.removeListener('message', on)
      reject(new Error(`got ${got.length} of ${n} messages`))
    }, ms)
    function on (topic, payload, packet) {
      got.push({ topic, payload, packet })
      if (got.length === n) {
        clearTimeout(timer)
        client.removeListener('message', on)
        resolve(got)
      }
    }
    client.on('message', on)
  })
}

export function once (emitter, event, ms = 10000) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${event} event`)), ms)
    emitter.once(event, (...args) => {
      clearTimeout(timer)
      resolve(args)
    })
  })
}
