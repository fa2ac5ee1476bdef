// isobox warm-pool harness for node runtimes: preloaded (`node -r`) in a sandbox booted
// ahead of time, before the runtime's own `-e` launcher runs the program.
//
// fd 0 is a socket to isoboxd. This sends one frame (a 4-byte big-endian length, then
// JSON) when node is ready, then blocks for the claim:
//   {"files": [["main.js", "<base64>"], ...], "argv": ["main.js", "arg1", ...]}
// writes the files into /workspace (read-only, like the cold path's bind mounts), sets
// process.argv as `node ... main.js arg1 ...` would have it, and returns: node then runs
// the runtime's launcher and the program exactly as on the cold path. Whatever follows
// the frame on fd 0 is the program's stdin. One execution per sandbox.
'use strict';
const fs = require('fs');
const path = require('path');

// A preload also runs in worker threads; they are the program's, not a sandbox's.
if (!require('worker_threads').isMainThread) return;

function readExact(n) {
  const buf = Buffer.alloc(n);
  let off = 0;
  while (off < n) {
    let r;
    try {
      r = fs.readSync(0, buf, off, n - off, null);
    } catch (e) {
      if (e.code === 'EAGAIN') {
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 5);
        continue;
      }
      throw e;
    }
    if (r === 0) process.exit(0); // isoboxd discarded this sandbox
    off += r;
  }
  return buf;
}

function send(obj) {
  const body = Buffer.from(JSON.stringify(obj));
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length, 0);
  const all = Buffer.concat([head, body]);
  let off = 0;
  while (off < all.length) off += fs.writeSync(0, all, off);
}

send({ ev: 'ready' });
const n = readExact(4).readUInt32BE(0);
const msg = JSON.parse(readExact(n).toString('utf8'));
for (const [name, data] of msg.files) {
  const p = path.join('/workspace', name);
  fs.mkdirSync(path.dirname(p), { recursive: true });
  fs.writeFileSync(p, Buffer.from(data, 'base64'), { mode: 0o444, flag: 'wx' });
}
process.argv[1] = msg.argv[0];
process.argv.push(...msg.argv.slice(1));
// Processes the program forks (child_process.fork) take process.execArgv: not this.
const pre = process.execArgv.indexOf('-r');
if (pre >= 0 && process.execArgv[pre + 1] === __filename) process.execArgv.splice(pre, 2);
// The exit frame goes on fd 0 only if fd 0 is still the socket (the program may close
// it and open something else there).
const ctlStat = fs.fstatSync(0);

// Exit report: once node has emitted 'exit' to every listener (the program's included),
// the status it is about to exit with is known and stdout and stderr, synchronous on
// pipes, hold everything; one more frame on fd 0 (if it is still the socket) says so:
//   {"ev": "exit", "code": <status>}
// and isoboxd answers without waiting for the sandbox's teardown. An uncaught exception
// or rejection is printed only after 'exit' has been emitted, so a run that had one (the
// 'uncaughtExceptionMonitor' event goes first) sends no frame and ends the cold way, as
// do a status that is not an integer, a failed write, any exit without 'exit', other
// processes still alive, and a process.emit that something else has wrapped since.
const realEmit = process.emit;
let fatal = false;
let reported = false;
process.emit = function emit(ev, ...args) {
  // Fatal unless the program handles it (then the exit to come is an ordinary one).
  if (
    ev === 'uncaughtExceptionMonitor' &&
    process.listenerCount('uncaughtException') === 0 &&
    !process.hasUncaughtExceptionCaptureCallback()
  ) {
    fatal = true;
  }
  const r = Reflect.apply(realEmit, this, [ev, ...args]);
  // Only node's own 'exit' (it sets process._exiting first), once, and not when
  // something wrapped process.emit after us (signal-exit runs its handlers after
  // ours: their output would come after the frame).
  if (ev === 'exit' && process._exiting === true && !fatal && !reported && process.emit === emit) {
    reported = true;
    // What node exits with after 'exit': process.exitCode || 0.
    const c = process.exitCode || 0;
    try {
      const now = fs.fstatSync(0);
      // Processes the program started and left running may still write to the pipes.
      const others = fs.readdirSync('/proc').some((p) => /^\d+$/.test(p) && +p !== process.pid);
      if (
        Number.isInteger(c) && c >= -(2 ** 31) && c < 2 ** 31 && !others &&
        now.dev === ctlStat.dev && now.ino === ctlStat.ino
      ) {
        send({ ev: 'exit', code: c & 0xff });
      }
    } catch (e) {
      // The cold way then.
    }
  }
  return r;
};
