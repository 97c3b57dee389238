// mqtt://, mqtts://, ws:// and wss:// (TLS and WebSocket through local
// proxies in front of the embedded broker, with the test CA).
import test from 'node:test'
import assert from 'node:assert/strict'
import { zf, mqtt, collect, fixture, tlsProxy, wsProxy } from './helpers.mjs'

let broker, tlsP, wsP, wssP

test.before(async () => {
  broker = await zf.startBroker({ port: 0 })
  tlsP = await tlsProxy(broker.port)
  wsP = await wsProxy(broker.port, false)
  wssP = await wsProxy(broker.port, true)
})

test.after(async () => {
  await tlsP.close()
  await wsP.close()
  await wssP.close()
  await broker.close()
})

async function roundTrip (url, opts) {
  const c = await zf.connectAsync(url, { reconnectPeriod: 0, ...opts })
  await c.subscribeAsync('tr/t', { qos: 1 })
  const got = collect(c, 2)
  await c.publishAsync('tr/t', 'over ' + url.split(':')[0], { qos: 1 })
  // and from MQTT.js over plain TCP
  const js = await mqtt.connectAsync(`mqtt://127.0.0.1:${broker.port}`, { reconnectPeriod: 0 })
  await js.publishAsync('tr/t', Buffer.alloc(50000, 7), { qos: 1 })
  const msgs = await got
  assert.equal(msgs[0].payload.toString(), 'over ' + url.split(':')[0])
  assert.ok(msgs[1].payload.equals(Buffer.alloc(50000, 7)))
  await js.endAsync()
  await c.endAsync()
}

test('mqtt://', () => roundTrip(`mqtt://127.0.0.1:${broker.port}`))
test('mqtts:// with ca', () => roundTrip(`mqtts://localhost:${tlsP.port}`, { ca: fixture('ca.pem') }))
test('mqtts:// with rejectUnauthorized: false', () =>
  roundTrip(`mqtts://127.0.0.1:${tlsP.port}`, { rejectUnauthorized: false }))
test('ws://', () => roundTrip(`ws://127.0.0.1:${wsP.port}/mqtt`))
test('wss:// with ca', () => roundTrip(`wss://localhost:${wssP.port}/mqtt`, { ca: [fixture('ca.pem')] }))

test('mqtts:// refuses a certificate from an unknown CA', async () => {
  await assert.rejects(zf.connectAsync(`mqtts://localhost:${tlsP.port}`, { reconnectPeriod: 0, connectTimeout: 3000 }), /tls|certificate|issuer/i)
})

test('unknown protocol is refused', () => {
  assert.throws(() => zf.connect('gopher://localhost'), /unsupported protocol/)
})
