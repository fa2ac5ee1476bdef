//! A run's output on the event loop: its stdout and stderr pipes read into captures
//! (capped, UTF-8 safe), streamed as SSE with backpressure (a client that stops reading
//! pauses the pipes), its stdin fed from the request, a claimed pooled sandbox's exit
//! channel read, and the keep-alive comments of a quiet stream.

use super::runs::MAX_DRAIN_PAST_CAP_BYTES;
use super::runs::{KEEPALIVE, RUNS};
use super::sink::Stream;
use super::Daemon;
use crate::http::sse::take_utf8;
use crate::reactor::Addr;
use crate::sandbox::build::Feed;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

impl Daemon {
    /// Reads a pipe until WouldBlock/EOF (or until paused by backpressure).
    pub(crate) fn run_pipe_event(&mut self, rk: usize, is_err: bool) {
        let idx = usize::from(is_err);
        let mut buf = [0u8; 32 * 1024];
        loop {
            let Some(run) = self.runs.get_mut(rk) else {
                return;
            };
            // Backpressure pauses reading, except stderr before the start signal (a
            // bounded read: a frame gate keeps at most 4 KiB, a hooked one HOLD_MAX and
            // one read), which must not stay unseen.
            if run.paused && (idx != 1 || run.gate.began()) {
                return;
            }
            // Awaiting the hook's signal, stderr is held back up to a bound; then the
            // program waits on its pipe until the signal (which reads on).
            if idx == 1 && run.gate.holding_full() {
                return;
            }
            let Some((rx, _)) = run.out[idx].pipe.as_mut() else {
                return;
            };
            match rx.read(&mut buf) {
                Ok(0) => {
                    self.run_pipe_eof(rk, idx);
                    break;
                }
                Ok(n) => self.run_output(rk, idx, &buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // After the harness's exit frame, an empty pipe is a drained one:
                    // the program flushed everything before it sent the frame.
                    if self.runs.get(rk).is_some_and(|r| r.early_exit.is_some()) {
                        self.run_pipe_eof(rk, idx);
                    }
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    self.run_pipe_eof(rk, idx);
                    break;
                }
            }
        }
        self.run_check_done(rk);
    }

    pub(super) fn run_pipe_eof(&mut self, rk: usize, idx: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if let Some((mut rx, t)) = run.out[idx].pipe.take() {
            let _ = self.reactor.registry().deregister(&mut rx);
            self.reactor.release(t);
        }
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        run.out[idx].eof = true;
        if run.sink.as_ref().is_some_and(|s| s.live()) && !run.out[idx].pending_utf8.is_empty() {
            let text = take_utf8(&mut run.out[idx].pending_utf8, true);
            self.run_send_chunk(rk, idx, &text);
        }
    }

    pub(super) fn run_output(&mut self, rk: usize, idx: usize, data: &[u8]) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if idx == 1 && !run.gate.began() {
            let Some(rest) = run.gate.feed(data) else {
                return;
            };
            if run.compile.is_none() {
                self.run_program_starts(rk, Instant::now());
            }
            if !rest.is_empty() {
                self.run_output(rk, idx, &rest);
            }
            return;
        }
        if idx == 1 {
            if let Some(cs) = run.compile.as_mut().filter(|c| !c.done) {
                match cs.parser.feed(data, self.cfg.compile_timeout_ms) {
                    Feed::More => return,
                    Feed::Done(result, rest) => {
                        cs.done = true;
                        let built = result.exit_code == 0;
                        cs.result = Some(result);
                        if !built {
                            return; // The script exits with the build's code; no program.
                        }
                        self.run_program_starts(rk, Instant::now());
                        if !rest.is_empty() {
                            self.run_output(rk, idx, &rest);
                        }
                        return;
                    }
                    Feed::Invalid(bytes) => {
                        cs.done = true;
                        self.run_output(rk, idx, &bytes);
                        return;
                    }
                }
            }
        }
        let cap = &mut run.out[idx];
        let room = cap.cap.saturating_sub(cap.kept.len());
        let keep = room.min(data.len());
        cap.kept.extend_from_slice(&data[..keep]);
        if keep < data.len() {
            cap.truncated = true;
            cap.drained_past_cap += (data.len() - keep) as u64;
        }
        let flood = cap.drained_past_cap > MAX_DRAIN_PAST_CAP_BYTES;
        if keep > 0 && run.sink.as_ref().is_some_and(|s| s.live()) {
            cap.pending_utf8.extend_from_slice(&data[..keep]);
            let text = take_utf8(&mut cap.pending_utf8, false);
            if !text.is_empty() {
                self.run_send_chunk(rk, idx, &text);
            }
        }
        if flood {
            self.run_kill(rk);
        }
    }

    pub(super) fn run_send_chunk(&mut self, rk: usize, idx: usize, text: &str) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        run.last_event = Instant::now();
        let Some(sink) = run.sink.clone() else {
            return;
        };
        if sink.output(self, Stream::of(idx), text) {
            if let Some(run) = self.runs.get_mut(rk) {
                // Backpressure: stop reading the sandbox; its writes block in the pipe.
                run.paused = true;
            }
        }
    }

    /// Called when a streaming client's buffer drained: read the sandbox again.
    pub(crate) fn run_resume(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        if !run.paused {
            return;
        }
        run.paused = false;
        // Edge-triggered: data may be waiting with no new edge coming, so read now.
        self.run_pipe_event(rk, false);
        self.run_pipe_event(rk, true);
    }

    pub(crate) fn run_stdin_event(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        let Some((tx, _)) = run.stdin.as_mut() else {
            return;
        };
        let mut done = false;
        while run.stdin_pos < run.plan.stdin.len() {
            match tx.write(&run.plan.stdin[run.stdin_pos..]) {
                Ok(n) => run.stdin_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    done = true; // The program closed stdin (EPIPE): fine.
                    break;
                }
            }
        }
        if done || run.stdin_pos >= run.plan.stdin.len() {
            if let Some((mut tx, t)) = run.stdin.take() {
                crate::sys::shutdown_write(tx.as_fd());
                let _ = self.reactor.registry().deregister(&mut tx);
                self.reactor.release(t);
            }
        }
    }

    /// The poststart hook's FIFO is readable: the program has started (`start.rs`);
    /// stderr held back until now is the program's, and reading goes on.
    pub(crate) fn run_start_signal_event(&mut self, rk: usize) {
        if self.run_take_start_signal(rk) {
            self.run_pipe_event(rk, true);
        }
    }

    /// Reads the hook's signal, when it is there: the gate opens, the program's wall
    /// time counts from when the hook ran, and what stderr held goes on as output.
    /// Whether it came.
    pub(super) fn run_take_start_signal(&mut self, rk: usize) -> bool {
        let Some(run) = self.runs.get_mut(rk) else {
            return false;
        };
        let Some((f, _)) = run.start_signal.as_ref() else {
            return false;
        };
        let mut signal = [0u8; crate::sandbox::start::SIGNAL_BYTES];
        // One atomic write of 8 bytes: all of it or none (0: no writer; WouldBlock).
        let got = loop {
            match (&*f).read(&mut signal) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r.unwrap_or(0),
            }
        };
        if got != signal.len() {
            return false;
        }
        let (now, now_ns) = (Instant::now(), crate::sys::monotonic_ns());
        self.run_close_start_signal(rk);
        let Some(held) = self.runs.get_mut(rk).and_then(|r| r.gate.signal()) else {
            return false;
        };
        let at = crate::sandbox::start::signal_instant(signal, now, now_ns);
        self.run_program_starts(rk, at);
        if !held.is_empty() {
            self.run_output(rk, 1, &held);
        }
        true
    }

    /// Stops watching the hook's FIFO (the signal came, or the run is cleaned up).
    pub(super) fn run_close_start_signal(&mut self, rk: usize) {
        let Some((f, t)) = self.runs.get_mut(rk).and_then(|r| r.start_signal.take()) else {
            return;
        };
        let _ = self
            .reactor
            .registry()
            .deregister(&mut mio::unix::SourceFd(&f.as_raw_fd()));
        self.reactor.release(t);
    }

    /// The program started at `at` (the start signal, or the end of its build): its
    /// wall time counts from then, unless it has exited already and the drain grace
    /// runs.
    fn run_program_starts(&mut self, rk: usize, at: Instant) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        run.program_started = Some(at);
        if run.exited_at.is_none() {
            let wall = Duration::from_millis(run.plan.limits.wall_time_ms);
            self.arm_run(rk, at + wall);
        }
    }

    /// A run that ends with output on stdout but no start signal: the program ran (runsc
    /// never writes to stdout) and its start went unheard (a hook that did not run). Its
    /// result stands, the stderr held is its own, and its time counts from the sandbox's
    /// start; logged. (A frame gate is never opened this way.)
    pub(super) fn run_start_unheard(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        let wrote = !run.out[0].kept.is_empty() || run.out[0].drained_past_cap > 0;
        if run.gate.began() || !wrote {
            return;
        }
        let Some(held) = run.gate.signal() else {
            return;
        };
        run.program_started = run.started;
        crate::warn_limited!(
            "run={} op=start err=no start signal, but the program wrote to stdout: its result stands, timed from the sandbox's start",
            run.id
        );
        if !held.is_empty() {
            self.run_output(rk, 1, &held);
        }
    }

    /// Reads a claimed pooled sandbox's exit channel (`warm.rs`).
    pub(crate) fn run_ctl_event(&mut self, rk: usize) {
        let mut buf = [0u8; 128];
        loop {
            let Some(run) = self.runs.get_mut(rk) else {
                return;
            };
            let Some((ctl, _)) = run.exit_ctl.as_mut() else {
                return;
            };
            match ctl.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    run.exit_buf.extend_from_slice(&buf[..n]);
                    match crate::sandbox::warm::exit_frame(&run.exit_buf) {
                        crate::sandbox::warm::ExitFrame::More => continue,
                        crate::sandbox::warm::ExitFrame::Exit(code) => {
                            self.run_close_ctl(rk);
                            self.run_exited_early(rk, code);
                            return;
                        }
                        crate::sandbox::warm::ExitFrame::Invalid => break,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        // Closed, or not the harness's frame: the run ends when runsc exits.
        self.run_close_ctl(rk);
    }

    pub(super) fn run_close_ctl(&mut self, rk: usize) {
        let Some(run) = self.runs.get_mut(rk) else {
            return;
        };
        run.exit_buf = Vec::new();
        if let Some((mut ctl, t)) = run.exit_ctl.take() {
            let _ = self.reactor.registry().deregister(&mut ctl);
            self.reactor.release(t);
        }
    }

    pub(super) fn arm_keepalive(&mut self, rk: usize) {
        let every = Duration::from_millis(self.cfg.sse_keepalive_ms);
        let Some(run) = self.runs.get(rk) else { return };
        let (at, serial) = (run.last_event + every, run.serial);
        self.reactor.arm(at, Addr::new(RUNS, rk, KEEPALIVE), serial);
    }

    /// Sends a comment when the stream has been silent for a whole interval.
    pub(crate) fn run_keepalive(&mut self, rk: usize, serial: u64) {
        let every = Duration::from_millis(self.cfg.sse_keepalive_ms);
        let Some(run) = self.runs.get_mut(rk).filter(|r| r.serial == serial) else {
            return;
        };
        let Some(sink) = run.sink.clone() else { return };
        if run.last_event.elapsed() + Duration::from_millis(5) >= every {
            run.last_event = Instant::now();
            sink.keepalive(self);
        }
        self.arm_keepalive(rk);
    }
}
