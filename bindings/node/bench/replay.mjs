// Child process of recv.mjs: a minimal MQTT 3.1.1 "replay" server that
// measures a client's receive capacity without a broker's cost. It answers
// CONNECT, SUBSCRIBE, UNSUBSCRIBE and PINGREQ, and after the first SUBACK
// writes one pre-encoded block of QoS 0 PUBLISH packets (topic bench/r,
// payload `size` bytes) over and over, as fast as the socket drains, until
// the client disconnects. Parent messages: { cmd: 'size', size } to set
// the payload size for the next connection; replies { port } once listening.
import net from 'node:net'

let size = 64
const TOPIC = Buffer.from('bench/r')

function remainingLength (n) {
  const out = []
  do {
    let b = n % 128
    n = Math.floor(n / 128)
    if (n > 0) b |= 0x80
    out.push(b)
  } while (n > 0)
  return Buffer.from(out)
}

function block (size) {
  const body = Buffer.alloc(2 + TOPIC.length + size, 0x5a)
  body.writeUInt16BE(TOPIC.length, 0)
  TOPIC.copy(body, 2)
  const one = Buffer.concat([Buffer.from([0x30]), remainingLength(body.length), body])
  const count = Math.max(1, Math.floor((256 * 1024) / one.length))
  return Buffer.concat(Array(count).fill(one))
}

const server = net.createServer((sock) => {
  sock.setNoDelay(true)
  const data = block(size)
  let buf = Buffer.alloc(0)
  let streaming = false
  let open = true
  sock.on('close', () => { open = false })
  sock.on('error', () => { open = false })
  const pump = () => {
    while (open && sock.write(data)) { /* keep the socket full */ }
    if (open) sock.once('drain', pump)
  }
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d])
    for (;;) {
      if (buf.length < 2) return
      let mult = 1
      let len = 0
      let i = 1
      let b
      do {
        if (i >= buf.length) return
        b = buf[i++]
        len += (b & 127) * mult
        mult *= 128
      } while (b & 128)
      if (buf.length < i + len) return
      const type = buf[0] >> 4
      const pkt = buf.subarray(i, i + len)
      buf = buf.subarray(i + len)
      if (type === 1) sock.write(Buffer.from([0x20, 2, 0, 0]))
      else if (type === 8) {
        let nfilters = 0
        for (let o = 2; o + 2 <= pkt.length; o += 2 + pkt.readUInt16BE(o) + 1) nfilters++
        const suback = Buffer.alloc(4 + nfilters)
        suback[0] = 0x90
        suback[1] = 2 + nfilters
        pkt.copy(suback, 2, 0, 2)
        sock.write(suback)
        if (!streaming) {
          streaming = true
          setImmediate(pump)
        }
      } else if (type === 10) sock.write(Buffer.from([0xb0, 2, pkt[0], pkt[1]]))
      else if (type === 12) sock.write(Buffer.from([0xd0, 0]))
      else if (type === 14) sock.destroy()
    }
  })
})

process.on('message', (m) => {
  if (m.cmd === 'size') {
    size = m.size
    process.send({ ok: true })
  } else if (m.cmd === 'exit') {
    server.close()
    process.exit(0)
  }
})
server.listen(0, '127.0.0.1', () => process.send({ port: server.address().port }))
