// Where the CPU goes in a client-bound run: per-thread CPU time of this
// process (JavaScript thread, tokio workers) and of the replay server, per
// message, read from /proc/<pid>/task/*/stat (Linux).
//
//   node bench/threads.mjs [size=64] [seconds=5] ['{"batchSize":1024}']
//   CLIENT=mqtt node bench/threads.mjs 64 5      # MQTT.js instead
//
// zerofan's line also gives the mean batch size.
import { fork } from 'node:child_process'
import { readdirSync, readFileSync } from 'node:fs'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { createRequire } from 'node:module'
const require = createRequire(import.meta.url)
const zf = require('..')
const here = path.dirname(fileURLToPath(import.meta.url))
const size = Number(process.argv[2] || 64)
const secs = Number(process.argv[3] || 5)
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
function threads (pid) {
  const out = {}
  for (const t of readdirSync(`/proc/${pid}/task`)) {
    try {
      const st = readFileSync(`/proc/${pid}/task/${t}/stat`, 'utf8')
      const comm = st.slice(st.indexOf('(') + 1, st.lastIndexOf(')'))
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ')
      // utime + stime, in clock ticks (100 per second on Linux).
      out[t] = { comm, ticks: Number(f[11]) + Number(f[12]) }
    } catch {}
  }
  return out
}
const child = fork(path.join(here, 'replay.mjs'), [], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
const { port } = await new Promise((resolve) => child.once('message', resolve))
await new Promise((resolve) => { child.once('message', resolve); child.send({ cmd: 'size', size }) })
const extra = JSON.parse(process.argv[4] || "{}")
const useMqtt = process.env.CLIENT === 'mqtt'
const c = useMqtt
  ? await require('mqtt').connectAsync(`mqtt://127.0.0.1:${port}`, { protocolVersion: 4, reconnectPeriod: 0 })
  : await zf.connectAsync(`mqtt://127.0.0.1:${port}`, { protocolVersion: 4, reconnectPeriod: 0, ...extra })
let batches = 0
if (!useMqtt) {
  const d = c._dispatch.bind(c)
  c._dispatch = (bt) => { batches++; d(bt) }
}
let n = 0
let sink = 0
c.on('message', (t, p) => { n++; sink ^= p[p.length - 1] })
await c.subscribeAsync('bench/r', { qos: 0 })
await sleep(1000)
const a = [threads(process.pid), threads(child.pid)]
const n0 = n
const b0 = batches
const elu0 = performance.eventLoopUtilization()
const t0 = performance.now()
await sleep(secs * 1000)
const dt = (performance.now() - t0) / 1000
const rate = (n - n0) / dt
const elu = performance.eventLoopUtilization(elu0).utilization
const b = [threads(process.pid), threads(child.pid)]
const per = useMqtt ? 'MQTT.js' : `zerofan ${JSON.stringify(extra)} ${((n - n0) / (batches - b0)).toFixed(0)} msg/batch,`
console.log(`${per} ${size} B: ${rate.toFixed(0)} msg/s, event loop busy ${(elu * 100).toFixed(0)}%, load ${readFileSync('/proc/loadavg', 'utf8').trim()}`)
for (const [i, who] of [[0, 'client'], [1, 'replay']]) {
  for (const [tid, v] of Object.entries(b[i])) {
    const before = a[i][tid] ? a[i][tid].ticks : 0
    const pct = (v.ticks - before) / dt
    if (pct >= 1) console.log(`  ${who} ${v.comm.padEnd(16)} ${pct.toFixed(0)}% CPU = ${(pct / 100 / rate * 1e9).toFixed(0)} ns CPU per message`)
  }
}
await c.endAsync()
child.send({ cmd: 'exit' })
