// Child process of recv.mjs: one native load publisher, driven by
// messages from the parent ({ cmd: 'run', ...LoadOptions } -> { sent }).
import { createRequire } from 'node:module'
const require = createRequire(import.meta.url)
const zf = require('..')

process.on('message', async (m) => {
  if (m.cmd === 'run') {
    try {
      const p = await zf.startLoadPublisher(m.options)
      const r = await p.done()
      process.send({ sent: r.sent, elapsedMs: r.elapsedMs, error: r.error })
    } catch (e) {
      process.send({ error: String(e) })
    }
  } else if (m.cmd === 'exit') {
    process.exit(0)
  }
})
process.send({ ready: true })
