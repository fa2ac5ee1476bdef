//! `isobox-init`: pid 1 of a long-lived sandbox. It talks to the daemon over fd 0 (one
//! end of a socket pair the daemon donated as the sandbox's stdin) in the protocol of
//! `isobox::sandbox::wire`, starts the processes the daemon asks for (each in its own
//! process group, with pipes or a terminal), forwards their output as it comes and
//! their stdin as it is given, signals and resizes them, reports each exit after its
//! last output, and reaps every process in the sandbox, as an init must.
//!
//! It is the sandbox's only trusted-looking program and it is not trusted: it runs inside
//! gVisor with the user's code, which may kill it, replace nothing (its binary is bound
//! read-only) and write anything on the channel's other end only through it. The
//! daemon treats what it says as the sandbox's word, bounded like any peer's.
//!
//! Flags: `--user=UID` runs every process as that user and group (the init, root in the
//! sandbox, first gives the user a passwd entry and a home if it has none), `--home=DIR`
//! is where processes start and their `HOME`. Without them (the tests' host runs) every
//! process runs as the init's own user, from the init's working directory.

mod files;
mod fs;
mod procs;
mod ring;
mod watch;

use isobox::sandbox::wire::{self, Call, Decoder, Hello, Kind, Reply};
use mio::net::UnixStream;
use mio::{Events, Interest, Poll, Token};
use std::io::{self, Read, Write};
use std::time::Duration;

/// The control socket.
const CTL: Token = Token(0);
/// The SIGCHLD pipe.
const CHILD: Token = Token(1);
/// The file thread's waker.
const FS: Token = Token(2);
/// Output the daemon has not taken yet beyond which the init stops reading its
/// processes' output (they then block on their full pipes): backpressure end to end.
const MAX_CTL_BACKLOG_BYTES: usize = 4 << 20;

/// The init's settings.
#[derive(Debug, Default, Clone)]
pub struct Settings {
    /// Run processes as this uid (and gid).
    pub user: Option<u32>,
    /// Their start directory and `HOME`.
    pub home: Option<String>,
}

fn parse_args() -> Result<Settings, String> {
    let mut s = Settings::default();
    for a in std::env::args().skip(1) {
        if let Some(v) = a.strip_prefix("--user=") {
            s.user = Some(
                v.parse()
                    .map_err(|_| format!("--user: {v:?} is not a uid"))?,
            );
        } else if let Some(v) = a.strip_prefix("--home=") {
            s.home = Some(v.to_string());
        } else {
            return Err(format!("unknown argument {a:?}"));
        }
    }
    Ok(s)
}

fn main() {
    let settings = match parse_args() {
        Ok(s) => s,
        Err(e) => {
            let _ = writeln!(io::stderr(), "isobox-init: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(settings) {
        let _ = writeln!(io::stderr(), "isobox-init: {e}");
        std::process::exit(1);
    }
}

/// The init's state: the channel and the processes.
pub struct Init {
    poll: Poll,
    ctl: UnixStream,
    decoder: Decoder,
    wbuf: Vec<u8>,
    /// INVARIANT: `wpos <= wbuf.len()`.
    wpos: usize,
    procs: procs::Procs,
    /// The thread that does file operations as the user.
    fs: fs::Fs,
    /// Files being read or written for the daemon.
    files: files::Files,
    /// Directories watched for the daemon.
    watches: watch::Watches,
    /// The buffer output is read into (reused: every allocation costs more in gVisor).
    buf: Vec<u8>,
}

impl Init {
    /// Queues a frame for the daemon. Output is split at `MAX_DATA_BYTES` and every
    /// other frame is small, so none is ever over the bound; one that were would be
    /// dropped rather than break the channel.
    pub fn send(&mut self, kind: Kind, channel: u32, payload: &[u8]) {
        let _ = wire::encode(&mut self.wbuf, kind, channel, payload);
    }

    /// Queues a JSON frame for the daemon (a reply too large to send says so instead).
    pub fn send_json<T: serde::Serialize>(&mut self, kind: Kind, channel: u32, v: &T) {
        if wire::encode_json(&mut self.wbuf, kind, channel, v).is_err() && kind == Kind::Reply {
            let r = Reply::Error("the answer is too large to send".into());
            let _ = wire::encode_json(&mut self.wbuf, kind, channel, &r);
        }
    }

    /// The daemon is this far behind: read no more output for now.
    pub fn backlogged(&self) -> bool {
        self.wbuf.len() - self.wpos >= MAX_CTL_BACKLOG_BYTES
    }

    /// Writes what is queued. False when the channel is gone.
    fn flush(&mut self) -> bool {
        while self.wpos < self.wbuf.len() {
            match self.ctl.write(&self.wbuf[self.wpos..]) {
                Ok(0) => return false,
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
        } else if self.wpos > 1 << 20 {
            self.wbuf.drain(..self.wpos);
            self.wpos = 0;
        }
        true
    }

    /// Reads the channel and acts on every whole frame. False when it is gone or broke
    /// the protocol (the init then ends, and the sandbox with it).
    fn read_ctl(&mut self) -> bool {
        let mut buf = [0u8; 64 << 10];
        loop {
            match self.ctl.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => self.decoder.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
            loop {
                match self.decoder.next_frame() {
                    Ok(Some(f)) => {
                        if !self.frame(f) {
                            return false;
                        }
                    }
                    Ok(None) => break,
                    Err(_) => return false,
                }
            }
        }
        true
    }

    /// One frame from the daemon. False for one it may not send.
    fn frame(&mut self, f: wire::Frame) -> bool {
        match f.kind {
            Kind::Call => {
                let reply = match serde_json::from_slice::<Call>(&f.payload) {
                    Ok(call) => self.call(f.channel, call),
                    Err(e) => Some(Reply::Error(format!("bad call: {e}"))),
                };
                // A file operation is answered when its thread is done.
                if let Some(reply) = reply {
                    self.send_json(Kind::Reply, f.channel, &reply);
                }
                true
            }
            Kind::Input => {
                let Ok(pid) = i32::try_from(f.channel) else {
                    return true;
                };
                procs::input(self, pid, &f.payload);
                true
            }
            Kind::FileData => {
                files::data(self, f.channel, &f.payload);
                true
            }
            Kind::Hello
            | Kind::Reply
            | Kind::Output
            | Kind::Exit
            | Kind::Replay
            | Kind::FsEvent => false,
        }
    }

    /// Carries out call `id`: its reply, or none yet (a file operation's comes from
    /// its thread).
    fn call(&mut self, id: u32, call: Call) -> Option<Reply> {
        match call {
            Call::Fs(op) => self
                .fs
                .submit(fs::Job::Call(id, op))
                .err()
                .map(Reply::Error),
            Call::FileCommit { handle } => files::commit(self, id, handle),
            call => Some(self.call_now(id, call)),
        }
    }

    /// Answers the file operations that are done.
    fn fs_done(&mut self) {
        while let Ok((id, reply, opened)) = self.fs.done.try_recv() {
            let reply = match opened {
                Some(o) => files::opened(self, id, o, reply),
                None => reply,
            };
            self.send_json(Kind::Reply, id, &reply);
        }
    }

    fn call_now(&mut self, id: u32, call: Call) -> Reply {
        match call {
            Call::Spawn {
                cmd,
                cwd,
                env,
                stdin,
                pty,
                background,
            } => match procs::spawn(self, &cmd, cwd.as_deref(), &env, stdin, pty, background) {
                Ok(pid) => Reply::Ok(serde_json::json!({ "pid": pid })),
                Err(e) => Reply::Error(e),
            },
            Call::Watch { pid } => match procs::watch(self, id, pid) {
                Ok(exited) => Reply::Ok(serde_json::json!({ "exited": exited })),
                Err(e) => Reply::Error(e),
            },
            Call::Unwatch { pid } => match procs::unwatch(self, pid) {
                Ok(()) => Reply::Ok(serde_json::Value::Null),
                Err(e) => Reply::Error(e),
            },
            Call::Forget { pid } => {
                procs::forget(self, pid);
                Reply::Ok(serde_json::Value::Null)
            }
            Call::Signal { pid, signal } => match procs::signal(self, pid, signal) {
                Ok(()) => Reply::Ok(serde_json::Value::Null),
                Err(e) => Reply::Error(e),
            },
            Call::Hold { pid } => match procs::hold(self, pid, true) {
                Ok(()) => Reply::Ok(serde_json::Value::Null),
                Err(e) => Reply::Error(e),
            },
            Call::Release { pid } => match procs::hold(self, pid, false) {
                Ok(()) => Reply::Ok(serde_json::Value::Null),
                Err(e) => Reply::Error(e),
            },
            Call::Resize { pid, cols, rows } => match procs::resize(self, pid, cols, rows) {
                Ok(()) => Reply::Ok(serde_json::Value::Null),
                Err(e) => Reply::Error(e),
            },
            Call::Disk {} => {
                let fs = |p: &str| isobox::sys::process::disk_usage(p).ok();
                Reply::Ok(serde_json::json!({ "root": fs("/"), "tmp": fs("/tmp") }))
            }
            Call::Env { env } => {
                self.procs.set_env(env);
                Reply::Ok(serde_json::Value::Null)
            }
            Call::FileMore { handle, bytes } => files::more(self, handle, bytes),
            Call::FileClose { handle } => {
                files::close(self, handle);
                Reply::Ok(serde_json::Value::Null)
            }
            Call::WatchEnd { handle } => {
                watch::end(self, handle);
                Reply::Ok(serde_json::Value::Null)
            }
            Call::Fs(_) | Call::FileCommit { .. } => {
                Reply::Error("answered by the file thread".into())
            }
        }
    }
}

fn run(settings: Settings) -> io::Result<()> {
    let ctl = isobox::sys::process::take_stdin_socket()?;
    isobox::sys::process::become_subreaper()?;
    ctl.set_nonblocking(true)?;
    let mut ctl = UnixStream::from_std(ctl);
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut ctl, CTL, Interest::READABLE | Interest::WRITABLE)?;
    let (tx, rx) = std::os::unix::net::UnixStream::pair()?;
    tx.set_nonblocking(true)?;
    rx.set_nonblocking(true)?;
    signal_hook::low_level::pipe::register(signal_hook::consts::SIGCHLD, tx)?;
    let mut child_rx = UnixStream::from_std(rx);
    poll.registry()
        .register(&mut child_rx, CHILD, Interest::READABLE)?;
    let procs = procs::Procs::new(&settings)?;
    let waker = mio::Waker::new(poll.registry(), FS)?;
    let fs = fs::Fs::start(settings.user, settings.home.clone(), waker)?;
    let mut init = Init {
        poll,
        ctl,
        decoder: Decoder::default(),
        wbuf: Vec::new(),
        wpos: 0,
        procs,
        fs,
        files: files::Files::default(),
        watches: watch::Watches::default(),
        buf: Vec::new(),
    };
    init.send_json(
        Kind::Hello,
        0,
        &Hello {
            version: wire::VERSION,
            pid: std::process::id(),
        },
    );
    let mut events = Events::with_capacity(256);
    loop {
        let was_backlogged = init.backlogged();
        if !init.flush() {
            return Ok(());
        }
        if was_backlogged && !init.backlogged() {
            // Edge-triggered: output waiting in the pipes brings no new event.
            procs::pump_all(&mut init);
            files::pump_all(&mut init);
            watch::pump_all(&mut init);
            continue;
        }
        // A second's timeout: a SIGCHLD that raced the pipe's registration is still seen.
        match init.poll.poll(&mut events, Some(Duration::from_secs(1))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        let mut reap = events.is_empty();
        for ev in events.iter() {
            match ev.token() {
                CTL => {
                    if (ev.is_readable() || ev.is_read_closed()) && !init.read_ctl() {
                        // The daemon is gone (or broke the protocol): so is the sandbox.
                        procs::kill_all(&mut init);
                        return Ok(());
                    }
                }
                CHILD => {
                    let mut b = [0u8; 64];
                    while matches!(child_rx.read(&mut b), Ok(n) if n > 0) {}
                    reap = true;
                }
                FS => init.fs_done(),
                t if watch::handle_of(t).is_some() => {
                    if let Some(h) = watch::handle_of(t) {
                        watch::pump(&mut init, h);
                    }
                }
                t => procs::event(
                    &mut init,
                    t,
                    ev.is_readable() || ev.is_read_closed() || ev.is_error(),
                    ev.is_writable(),
                ),
            }
        }
        if reap {
            procs::reap(&mut init);
        }
    }
}
