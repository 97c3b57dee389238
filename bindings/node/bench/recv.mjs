// Receive benchmark: zerofan's Node client against MQTT.js in the same run.
//
//   node --expose-gc bench/recv.mjs [--seconds 5] [--sizes 64,3840] [--rate 5000]
//
// A native load publisher in a child process publishes QoS 0 messages as
// fast as the broker takes them (zerofan binary if built, else the embedded
// broker) to one topic; one client at a time (MQTT.js, zerofan, zerofan
// with copies) subscribes and counts. Figures per client and size:
// - msg/s received during the run (after a 1 s ramp that is not counted);
// - heapUsed growth per second, after full collections before and after;
// - p50 / p99 latency (publish stamp to 'message' event) at a paced rate
//   (--rate msg/s, 64-byte payloads), where queues stay short.
import { fork } from 'node:child_process'
import { writeFileSync, mkdirSync } from 'node:fs'
import path from 'node:path'
import os from 'node:os'
import { fileURLToPath } from 'node:url'
import { createRequire } from 'node:module'
import { zerofanBinary, runZerofan } from '../test/helpers.mjs'

const require = createRequire(import.meta.url)
const zf = require('..')
const mqtt = require('mqtt')
const here = path.dirname(fileURLToPath(import.meta.url))

const args = process.argv.slice(2)
const arg = (name, dflt) => {
  const i = args.indexOf(`--${name}`)
  return i >= 0 ? args[i + 1] : dflt
}
const SECONDS = Number(arg('seconds', 5))
const SIZES = arg('sizes', '64,3840').split(',').map(Number)
const RATE = Number(arg('rate', 5000))
const LAT_SECONDS = Number(arg('latency-seconds', 3))
const BROKER = arg('broker', 'auto')

if (!global.gc) {
  console.error('run with node --expose-gc')
  process.exit(2)
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))
async function fullGc () {
  for (let i = 0; i < 4; i++) {
    global.gc()
    await new Promise((resolve) => setImmediate(resolve))
    await sleep(5)
  }
}
const nowNs = () => BigInt(Math.round((performance.timeOrigin + performance.now()) * 1e6))

function startPublisher () {
  const child = fork(path.join(here, 'publisher.mjs'), [], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const ready = new Promise((resolve) => child.once('message', resolve))
  return {
    ready,
    run (options) {
      return new Promise((resolve) => {
        child.once('message', resolve)
        child.send({ cmd: 'run', options })
      })
    },
    exit () {
      child.send({ cmd: 'exit' })
    }
  }
}

const clients = {
  'MQTT.js': async (port) => {
    const c = await mqtt.connectAsync(`mqtt://127.0.0.1:${port}`, { protocolVersion: 4, reconnectPeriod: 0 })
    return { c, end: () => c.endAsync() }
  },
  zerofan: async (port) => {
    const c = await zf.connectAsync(`mqtt://127.0.0.1:${port}`, { protocolVersion: 4, reconnectPeriod: 0 })
    return { c, end: () => c.endAsync() }
  },
  'zerofan (copy)': async (port) => {
    const c = await zf.connectAsync(`mqtt://127.0.0.1:${port}`, { protocolVersion: 4, reconnectPeriod: 0, useExternalBuffer: false })
    return { c, end: () => c.endAsync() }
  }
}

async function throughput (name, port, pub, size, topic) {
  const { c, end } = await clients[name](port)
  await c.subscribeAsync(topic, { qos: 0 })
  let n = 0
  let sink = 0
  c.on('message', (t, payload) => {
    n++
    sink ^= payload[payload.length - 1]
  })
  await fullGc()
  const h0 = process.memoryUsage().heapUsed
  const running = pub.run({ port, topic, size, durationMs: (SECONDS + 1) * 1000 })
  await sleep(1000)
  const n0 = n
  const t0 = performance.now()
  await sleep(SECONDS * 1000)
  const n1 = n
  const secs = (performance.now() - t0) / 1000
  const res = await running
  await end()
  await sleep(200)
  await fullGc()
  const h1 = process.memoryUsage().heapUsed
  return { rate: (n1 - n0) / secs, heapBps: (h1 - h0) / (secs + 1), sent: res.sent, received: n, sink }
}

function startReplay () {
  const child = fork(path.join(here, 'replay.mjs'), [], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'] })
  const ready = new Promise((resolve) => child.once('message', resolve))
  return {
    ready,
    size (size) {
      return new Promise((resolve) => {
        child.once('message', resolve)
        child.send({ cmd: 'size', size })
      })
    },
    exit () {
      child.send({ cmd: 'exit' })
    }
  }
}

// Client-bound: the replay server streams pre-encoded PUBLISH packets, so
// the figure is what the client can take, not what a broker can route.
async function replay (name, port, rep, size) {
  await rep.size(size)
  const { c, end } = await clients[name](port)
  let n = 0
  let sink = 0
  c.on('message', (t, payload) => {
    n++
    sink ^= payload[payload.length - 1]
  })
  await fullGc()
  const h0 = process.memoryUsage().heapUsed
  const elu0 = performance.eventLoopUtilization()
  await c.subscribeAsync('bench/r', { qos: 0 })
  await sleep(1000)
  const n0 = n
  const t0 = performance.now()
  await sleep(SECONDS * 1000)
  const n1 = n
  const secs = (performance.now() - t0) / 1000
  const elu = performance.eventLoopUtilization(elu0).utilization
  await end()
  await sleep(200)
  await fullGc()
  const h1 = process.memoryUsage().heapUsed
  return { rate: (n1 - n0) / secs, heapBps: (h1 - h0) / (secs + 1), elu, received: n, sink }
}

async function latency (name, port, pub, topic) {
  const { c, end } = await clients[name](port)
  await c.subscribeAsync(topic, { qos: 0 })
  const lat = []
  c.on('message', (t, payload) => {
    lat.push(Number(nowNs() - payload.readBigUInt64LE(0)) / 1000)
  })
  await pub.run({ port, topic, size: 64, rate: RATE, durationMs: LAT_SECONDS * 1000, stamp: true })
  await sleep(300)
  await end()
  lat.sort((a, b) => a - b)
  const q = (p) => lat[Math.min(lat.length - 1, Math.floor(p * lat.length))]
  return { n: lat.length, p50: q(0.5), p99: q(0.99) }
}

async function main () {
  let broker
  const bin = BROKER === 'embedded' ? null : zerofanBinary()
  if (bin) broker = await runZerofan(bin)
  else {
    const b = await zf.startBroker({ port: 0, sysInterval: 0 })
    broker = { port: b.port, close: () => b.close() }
  }
  const brokerName = bin ? `zerofan binary (${path.relative(process.cwd(), bin)})` : 'embedded zerofan broker'
  const pub = startPublisher()
  await pub.ready
  const results = []
  for (const size of SIZES) {
    for (const name of Object.keys(clients)) {
      const r = await throughput(name, broker.port, pub, size, `bench/${size}`)
      results.push({ client: name, size, ...r })
      console.error(`${name.padEnd(15)} ${String(size).padStart(5)} B: ${r.rate.toFixed(0).padStart(8)} msg/s, heap ${(r.heapBps / 1024).toFixed(2)} KB/s`)
    }
  }
  const rep = startReplay()
  const { port: repPort } = await rep.ready
  const replayed = []
  for (const size of SIZES) {
    for (const name of Object.keys(clients)) {
      const r = await replay(name, repPort, rep, size)
      replayed.push({ client: name, size, ...r })
      console.error(`replay ${name.padEnd(15)} ${String(size).padStart(5)} B: ${r.rate.toFixed(0).padStart(8)} msg/s, heap ${(r.heapBps / 1024).toFixed(2)} KB/s, event loop busy ${(r.elu * 100).toFixed(0)}%`)
    }
  }
  rep.exit()
  const lat = {}
  for (const name of Object.keys(clients)) {
    lat[name] = await latency(name, broker.port, pub, 'bench/lat')
    console.error(`${name.padEnd(15)} latency at ${RATE}/s: p50 ${lat[name].p50.toFixed(0)} us, p99 ${lat[name].p99.toFixed(0)} us`)
  }
  pub.exit()
  await broker.close()

  const lines = []
  lines.push(`Broker: ${brokerName}. Node ${process.version}, ${os.cpus().length} cores (${os.cpus()[0].model}), load average ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}.`)
  lines.push('')
  lines.push('| payload | client | msg/s received | vs MQTT.js | heapUsed growth | p50 latency | p99 latency |')
  lines.push('| ---: | --- | ---: | ---: | ---: | ---: | ---: |')
  for (const size of SIZES) {
    const base = results.find((r) => r.size === size && r.client === 'MQTT.js').rate
    for (const r of results.filter((x) => x.size === size)) {
      const l = size === 64 ? lat[r.client] : null
      lines.push(`| ${size} B | ${r.client} | ${r.rate.toFixed(0)} | ${(r.rate / base).toFixed(2)}x | ${(r.heapBps / 1024).toFixed(2)} KB/s | ${l ? l.p50.toFixed(0) + ' µs' : ''} | ${l ? l.p99.toFixed(0) + ' µs' : ''} |`)
    }
  }
  lines.push('')
  lines.push('Client-bound (replay server instead of a broker):')
  lines.push('')
  lines.push('| payload | client | msg/s received | vs MQTT.js | heapUsed growth | event loop busy |')
  lines.push('| ---: | --- | ---: | ---: | ---: | ---: |')
  for (const size of SIZES) {
    const base = replayed.find((r) => r.size === size && r.client === 'MQTT.js').rate
    for (const r of replayed.filter((x) => x.size === size)) {
      lines.push(`| ${size} B | ${r.client} | ${r.rate.toFixed(0)} | ${(r.rate / base).toFixed(2)}x | ${(r.heapBps / 1024).toFixed(2)} KB/s | ${(r.elu * 100).toFixed(0)}% |`)
    }
  }
  const table = lines.join('\n')
  console.log(table)
  mkdirSync(path.join(here, 'results'), { recursive: true })
  writeFileSync(path.join(here, 'results', `recv-${Date.now()}.json`), JSON.stringify({ seconds: SECONDS, rate: RATE, broker: brokerName, results, replayed, latency: lat }, null, 2))
}

main().catch((e) => {
  console.error(e)
  process.exit(1)
})
