// Interop both ways with MQTT.js, on the zerofan binary and on the
// embedded broker.
import test from 'node:test'
import assert from 'node:assert/strict'
import { zf, mqtt, collect, zerofanBinary, runZerofan } from './helpers.mjs'

const SIZES = [0, 1, 100, 3840, 70000, 300000]

function payloadOf (i, size) {
  const b = Buffer.alloc(size)
  for (let j = 0; j < size; j++) b[j] = (i * 31 + j) & 0xff
  return b
}

async function mqttjs (url, opts) {
  return mqtt.connectAsync(url, { reconnectPeriod: 0, ...opts })
}

async function bothWays (url, t) {
  await t.test('zerofan publishes, MQTT.js receives (QoS 0/1/2, 3.1.1 and 5)', async () => {
    for (const protocolVersion of [4, 5]) {
      const sub = await mqttjs(url, { protocolVersion })
      await sub.subscribeAsync('io/zf2js/#', { qos: 2 })
      const pub = await zf.connectAsync(url, { protocolVersion })
      const n = SIZES.length * 3
      const got = collect(sub, n)
      let i = 0
      for (const size of SIZES) {
        for (const qos of [0, 1, 2]) {
          await pub.publishAsync(`io/zf2js/${i}`, payloadOf(i, size), { qos })
          i++
        }
      }
      const msgs = await got
      msgs.sort((a, b) => Number(a.topic.split('/')[2]) - Number(b.topic.split('/')[2]))
      msgs.forEach((m, k) => {
        assert.equal(m.topic, `io/zf2js/${k}`)
        assert.ok(m.payload.equals(payloadOf(k, SIZES[Math.floor(k / 3)])), `payload ${k}`)
        assert.equal(m.packet.qos, k % 3)
      })
      await pub.endAsync()
      await sub.endAsync()
    }
  })

  await t.test('MQTT.js publishes, zerofan receives (QoS 0/1/2, 3.1.1 and 5)', async () => {
    for (const protocolVersion of [4, 5]) {
      const sub = await zf.connectAsync(url, { protocolVersion })
      await sub.subscribeAsync('io/js2zf/#', { qos: 2 })
      const pub = await mqttjs(url, { protocolVersion })
      const n = SIZES.length * 3
      const got = collect(sub, n)
      let i = 0
      for (const size of SIZES) {
        for (const qos of [0, 1, 2]) {
          await pub.publishAsync(`io/js2zf/${i}`, payloadOf(i, size), { qos })
          i++
        }
      }
      const msgs = await got
      msgs.sort((a, b) => Number(a.topic.split('/')[2]) - Number(b.topic.split('/')[2]))
      msgs.forEach((m, k) => {
        assert.equal(m.topic, `io/js2zf/${k}`)
        assert.ok(m.payload.equals(payloadOf(k, SIZES[Math.floor(k / 3)])), `payload ${k}`)
        assert.equal(m.packet.qos, k % 3)
      })
      await pub.endAsync()
      await sub.endAsync()
    }
  })

  await t.test('retained from MQTT.js reaches zerofan, user properties from zerofan reach MQTT.js', async () => {
    const js = await mqttjs(url, { protocolVersion: 5 })
    await js.publishAsync('io/ret', 'from-js', { qos: 1, retain: true })
    const zsub = await zf.connectAsync(url)
    const got = collect(zsub, 1)
    await zsub.subscribeAsync('io/ret', { qos: 1 })
    const [m] = await got
    assert.equal(m.payload.toString(), 'from-js')
    assert.equal(m.packet.retain, true)
    await js.publishAsync('io/ret', '', { qos: 1, retain: true })

    await js.subscribeAsync('io/props', { qos: 1 })
    const gotJs = collect(js, 1)
    await zsub.publishAsync('io/props', 'p', { qos: 1, properties: { userProperties: { k: 'v' }, contentType: 'ct' } })
    const [pm] = await gotJs
    assert.deepEqual({ ...pm.packet.properties.userProperties }, { k: 'v' })
    assert.equal(pm.packet.properties.contentType, 'ct')
    await zsub.endAsync()
    await js.endAsync()
  })
}

test('interop on the zerofan binary', async (t) => {
  const bin = zerofanBinary()
  if (!bin) {
    // The README's test command builds it and names it in ZEROFAN_BIN:
    // there, a missing binary is a failure, not a reason to skip.
    if (process.env.ZEROFAN_BIN) assert.fail(`ZEROFAN_BIN=${process.env.ZEROFAN_BIN} does not exist`)
    t.skip('zerofan binary not built (cargo build -p zerofan-broker)')
    return
  }
  const b = await runZerofan(bin)
  try {
    await bothWays(`mqtt://127.0.0.1:${b.port}`, t)
  } finally {
    await b.close()
  }
})

test('interop on the embedded broker', async (t) => {
  const b = await zf.startBroker({ port: 0 })
  try {
    await bothWays(`mqtt://127.0.0.1:${b.port}`, t)
    await t.test('MQTT.js to MQTT.js through the embedded broker', async () => {
      const url = `mqtt://127.0.0.1:${b.port}`
      const s = await mqttjs(url)
      await s.subscribeAsync('io/jsjs', { qos: 1 })
      const got = collect(s, 1)
      const p = await mqttjs(url)
      await p.publishAsync('io/jsjs', 'hi', { qos: 1 })
      assert.equal((await got)[0].payload.toString(), 'hi')
      await p.endAsync()
      await s.endAsync()
    })
  } finally {
    await b.close()
  }
})
