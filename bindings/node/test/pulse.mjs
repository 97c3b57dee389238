// A throwaway PulseAudio session for the audio tests (as the Rust tests of
// crates/zerofan-audio do): a server with its own HOME/XDG_RUNTIME_DIR, a
// 48 kHz mono null sink `zf_null`, and a 440 Hz tone from sox played into
// it with pacat. Each helper runs under a small `sh` wrapper whose stdin
// this process holds: when the process ends, for any reason, the wrapper
// reads EOF, kills its helper and removes the temp dir.
import { spawn, execFileSync } from 'node:child_process'
import { mkdtempSync, mkdirSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'

export const SINK = 'zf_null'
export const MONITOR = 'zf_null.monitor'

function which (tool) {
  try {
    execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' })
    return true
  } catch {
    return false
  }
}

function lifeline (script, args) {
  const child = spawn('sh', ['-c', script, 'sh', ...args], { stdio: ['pipe', 'ignore', 'pipe'] })
  child.unref()
  child.stdin.unref?.()
  child.stderr.unref?.()
  return child
}

let session = null

/** Starts the session once per process; sets PULSE_* in process.env. */
export async function startPulse () {
  if (session) return session
  const missing = ['pulseaudio', 'pacat', 'sox'].filter((t) => !which(t))
  if (missing.length) {
    throw new Error(
      `missing ${missing.join(', ')}: the audio tests need a PulseAudio server, pacat and sox; ` +
        'run scripts/install-audio-deps.sh (apt: pulseaudio pulseaudio-utils sox libasound2-plugins), ' +
        'which scripts/test.sh does first'
    )
  }
  const dir = mkdtempSync(path.join(os.tmpdir(), 'zerofan-node-pulse-'))
  for (const sub of ['home', 'run']) mkdirSync(path.join(dir, sub))
  const sock = path.join(dir, 'native')
  // For the server, the helpers and this process (cpal's hosts and ALSA's
  // pulse plugin read these).
  process.env.HOME = path.join(dir, 'home')
  process.env.XDG_RUNTIME_DIR = path.join(dir, 'run')
  process.env.PULSE_SERVER = `unix:${sock}`
  process.env.PULSE_SOURCE = MONITOR
  process.env.PULSE_SINK = SINK
  const pulse = lifeline(
    `dir=$1; sock=$2; sink=$3
pulseaudio --daemonize=no --exit-idle-time=-1 --disallow-exit=yes --system=no \\
  --use-pid-file=no -n --log-target=stderr --log-level=info \\
  -L "module-native-protocol-unix socket=$sock auth-anonymous=1" \\
  -L "module-null-sink sink_name=$sink rate=48000 channels=1" &
pa=$!
read _ignored
kill "$pa" 2>/dev/null; wait "$pa" 2>/dev/null; rm -rf "$dir"`,
    [dir, sock, SINK]
  )
  await new Promise((resolve, reject) => {
    let log = ''
    const timer = setTimeout(() => reject(new Error(`pulseaudio did not start within 20 s:\n${log}`)), 20000)
    pulse.stderr.on('data', (d) => {
      if (log.length < 20000) log += d
      if (log.includes('Daemon startup complete')) {
        clearTimeout(timer)
        resolve()
      }
    })
    pulse.on('exit', () => {
      clearTimeout(timer)
      reject(new Error(`pulseaudio exited:\n${log}`))
    })
  })
  pulse.removeAllListeners('exit')
  const tone = lifeline(
    `sox -q -n -t raw -r 48000 -e signed -b 16 -c 1 - synth 600 sine 440 vol 0.5 2>/dev/null \\
  | pacat --device=${SINK} --format=s16le --rate=48000 --channels=1 --raw &
p=$!
read _ignored
kill "$p" 2>/dev/null; wait "$p" 2>/dev/null`,
    []
  )
  tone.stderr.resume()
  session = { dir, pulse, tone }
  return session
}

/** Power of `freq` in `x` (Goertzel). */
export function goertzel (x, rate, freq) {
  const coeff = 2 * Math.cos((2 * Math.PI * freq) / rate)
  let s1 = 0
  let s2 = 0
  for (let i = 0; i < x.length; i++) {
    const s = x[i] + coeff * s1 - s2
    s2 = s1
    s1 = s
  }
  return s1 * s1 + s2 * s2 - coeff * s1 * s2
}

/** The strongest frequency between 100 Hz and 2 kHz, to 0.5 Hz. */
export function dominantFrequency (x, rate) {
  const best = (lo, hi, step) => {
    let bf = lo
    let bp = -Infinity
    for (let f = lo; f <= hi; f += step) {
      const p = goertzel(x, rate, f)
      if (p > bp) {
        bp = p
        bf = f
      }
    }
    return bf
  }
  const coarse = best(100, 2000, 10)
  return best(coarse - 10, coarse + 10, 0.5)
}

/** Samples of a packet Buffer as numbers (first channel). */
export function samplesOf (buf, format, channels) {
  const out = []
  if (format === 'i16') {
    for (let i = 0; i + 1 < buf.length; i += 2 * channels) out.push(buf.readInt16LE(i) / 32768)
  } else {
    for (let i = 0; i + 3 < buf.length; i += 4 * channels) out.push(buf.readFloatLE(i))
  }
  return out
}
