//! The init's processes: starting them (pipes or a terminal, each in its own process
//! group), forwarding their output and stdin, signals, and reporting each exit after
//! its last output. A background process's output also goes into its ring, and is
//! forwarded only while the daemon watches it; the ring outlives the process until the
//! daemon forgets it.

use super::ring::Ring;
use super::{Init, Settings};
use isobox::sandbox::wire::{
    output_head, output_payload, Exited, Kind, Stream, MAX_DATA_BYTES, OUTPUT_HEAD_BYTES,
};
use mio::unix::pipe;
use mio::{Interest, Token};
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// What a token of a process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Out(Stream),
    In,
}

/// One process the daemon started.
struct Proc {
    /// Its output: stdout and stderr pipes, or one terminal.
    out: Vec<(Stream, pipe::Receiver, Token)>,
    /// Its stdin, while open.
    stdin: Option<(pipe::Sender, Token)>,
    /// Input not written yet, and whether its end was asked for.
    pending: Vec<u8>,
    eof: bool,
    /// A terminal's controller (its size is set through it).
    pty: Option<OwnedFd>,
    /// Its client is behind: its output is not read until released.
    held: bool,
    /// It was reaped; its `Exit` goes once what its pipes held is forwarded.
    exited: Option<Exited>,
    /// A background process's ring.
    ring: Option<Ring>,
    /// Its output is forwarded (always, unless it is a background process nobody
    /// watches).
    watched: bool,
    /// Bytes read so far from stdout and from stderr: the offset of the next.
    written: [u64; 2],
}

/// Every process the daemon started and has not heard the end of.
pub struct Procs {
    by_pid: HashMap<i32, Proc>,
    tokens: HashMap<Token, (i32, Side)>,
    next_token: usize,
    env: Vec<(String, String)>,
    user: Option<u32>,
    home: Option<String>,
    /// Every process group started: what a process left running lives on in its group
    /// after the process itself is gone.
    groups: Vec<i32>,
    /// Ended background processes' rings and exits, oldest first, until forgotten.
    ended: Vec<(i32, Ring, Exited)>,
}

/// Ended background processes kept at most (the daemon forgets them sooner).
const MAX_ENDED: usize = 64;

impl Procs {
    /// Processes' defaults; as root with `--user`, the user gets a passwd entry and a
    /// home if it has none (the root filesystem is the sandbox's own, writable).
    pub fn new(s: &Settings) -> io::Result<Procs> {
        if let (Some(uid), Some(home)) = (s.user, &s.home) {
            ensure_user(uid, home)?;
        }
        let mut env: Vec<(String, String)> = std::env::vars().collect();
        let mut put = |k: &str, v: String| {
            env.retain(|(n, _)| n != k);
            env.push((k.to_string(), v));
        };
        if let Some(home) = &s.home {
            put("HOME", home.clone());
        }
        if s.user.is_some() {
            put("USER", "user".into());
            put("LOGNAME", "user".into());
        }
        Ok(Procs {
            by_pid: HashMap::new(),
            tokens: HashMap::new(),
            next_token: 16,
            env,
            user: s.user,
            home: s.home.clone(),
            groups: Vec::new(),
            ended: Vec::new(),
        })
    }

    /// Adds or replaces variables for later processes.
    pub fn set_env(&mut self, vars: Vec<(String, String)>) {
        for (k, v) in vars {
            self.env.retain(|(n, _)| *n != k);
            self.env.push((k, v));
        }
    }

    fn token(&mut self, pid: i32, side: Side) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        self.tokens.insert(t, (pid, side));
        t
    }
}

/// Gives `uid` a passwd and group entry named `user` and a home it owns, if missing.
fn ensure_user(uid: u32, home: &str) -> io::Result<()> {
    let has = |file: &str| {
        std::fs::read_to_string(file).is_ok_and(|t| {
            t.lines()
                .any(|l| l.split(':').nth(2) == Some(uid.to_string().as_str()))
        })
    };
    if !has("/etc/passwd") {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open("/etc/passwd")?;
        writeln!(f, "user:x:{uid}:{uid}::{home}:/bin/sh")?;
    }
    if !has("/etc/group") {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open("/etc/group")?;
        writeln!(f, "user:x:{uid}:")?;
    }
    std::fs::create_dir_all(home)?;
    std::os::unix::fs::chown(home, Some(uid), Some(uid))
}

/// Starts `cmd` with `/bin/sh -c`; its pid.
pub fn spawn(
    init: &mut Init,
    cmd: &str,
    cwd: Option<&str>,
    env: &[(String, String)],
    stdin: bool,
    pty: Option<(u16, u16)>,
    background: bool,
) -> Result<u32, String> {
    let p = &init.procs;
    let dir = cwd.or(p.home.as_deref()).unwrap_or(".").to_string();
    if !std::path::Path::new(&dir).is_dir() {
        return Err(format!("cwd {dir} is not a directory"));
    }
    let mut c = Command::new("/bin/sh");
    c.arg("-c").arg(cmd).current_dir(&dir).env_clear();
    c.envs(p.env.iter().map(|(k, v)| (k, v)));
    c.envs(env.iter().map(|(k, v)| (k, v)));
    if let Some(uid) = p.user {
        c.uid(uid).gid(uid);
    }
    let mut controller = None;
    match pty {
        Some((cols, rows)) => {
            let (ctl, dev) = isobox::sys::process::open_pty(cols.max(1), rows.max(1))
                .map_err(|e| format!("cannot open a terminal: {e}"))?;
            let dup = |f: &OwnedFd| f.try_clone().map(Stdio::from);
            let (i, o, e) = (dup(&dev), dup(&dev), dup(&dev));
            let (Ok(i), Ok(o), Ok(e)) = (i, o, e) else {
                return Err("cannot open a terminal".into());
            };
            c.stdin(i).stdout(o).stderr(e);
            if !env.iter().any(|(k, _)| k == "TERM") {
                c.env("TERM", "xterm-256color");
            }
            isobox::sys::process::spawn_with_terminal(&mut c);
            controller = Some(ctl);
        }
        None => {
            c.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
        }
    }
    let mut child = c
        .spawn()
        .map_err(|e| format!("cannot start /bin/sh: {e}"))?;
    drop(c);
    let pid = i32::try_from(child.id()).map_err(|_| "pid out of range".to_string())?;
    let mut proc_ = Proc {
        out: Vec::new(),
        stdin: None,
        pending: Vec::new(),
        eof: false,
        pty: None,
        held: false,
        exited: None,
        ring: background.then(Ring::default),
        watched: !background,
        written: [0; 2],
    };
    let reg = init.poll.registry();
    let procs = &mut init.procs;
    if let Some(ctl) = controller {
        // The terminal's controller is read and written through one fd: two handles.
        let (r, w) = match (ctl.try_clone(), ctl.try_clone()) {
            (Ok(r), Ok(w)) => (r, w),
            _ => return Err("cannot open a terminal".into()),
        };
        let mut rx = pipe::Receiver::from(r);
        let mut tx = pipe::Sender::from(w);
        let _ = rx.set_nonblocking(true);
        let _ = tx.set_nonblocking(true);
        let t = procs.token(pid, Side::Out(Stream::Stdout));
        let _ = reg.register(&mut rx, t, Interest::READABLE);
        proc_.out.push((Stream::Stdout, rx, t));
        let t = procs.token(pid, Side::In);
        let _ = reg.register(&mut tx, t, Interest::WRITABLE);
        proc_.stdin = Some((tx, t));
        proc_.pty = Some(ctl);
    } else {
        for (stream, fd) in [
            (Stream::Stdout, child.stdout.take().map(OwnedFd::from)),
            (Stream::Stderr, child.stderr.take().map(OwnedFd::from)),
        ] {
            let Some(fd) = fd else { continue };
            let mut rx = pipe::Receiver::from(fd);
            let _ = rx.set_nonblocking(true);
            let t = procs.token(pid, Side::Out(stream));
            let _ = reg.register(&mut rx, t, Interest::READABLE);
            proc_.out.push((stream, rx, t));
        }
        if let Some(s) = child.stdin.take() {
            let mut tx = pipe::Sender::from(OwnedFd::from(s));
            let _ = tx.set_nonblocking(true);
            let t = procs.token(pid, Side::In);
            let _ = reg.register(&mut tx, t, Interest::WRITABLE);
            proc_.stdin = Some((tx, t));
        }
    }
    // The init reaps by pid (waitpid(-1)): the Child handle is not waited on.
    drop(child);
    procs.by_pid.insert(pid, proc_);
    procs.groups.push(pid);
    Ok(u32::try_from(pid).unwrap_or(0))
}

/// Input for `pid`'s stdin; empty means its end.
pub fn input(init: &mut Init, pid: i32, data: &[u8]) {
    let Some(p) = init.procs.by_pid.get_mut(&pid) else {
        return;
    };
    if data.is_empty() {
        p.eof = true;
    } else if let Some(ctl) = p.pty.as_ref().filter(|_| !p.eof) {
        // A terminal's ^C, ^\ and ^Z signal its foreground process group while ISIG is
        // on, and the byte goes no further, as on Linux. gVisor's line discipline gets
        // it wrong in both runsc isobox has run on: the 2022 one passes them on as
        // plain bytes, the 2024 one signals whatever ISIG says (gVisor #12786, fixed
        // in 2026) and lets the byte through as well. So the init does it while ISIG is on
        // (the line discipline never sees the byte: never twice). In raw mode (ISIG
        // off) they are input; the 2024 runsc also signals them then.
        let specials = isobox::sys::process::pty_signal_chars(ctl.as_fd()).unwrap_or_default();
        for &b in data {
            match specials.iter().find(|&&(c, _)| c == b) {
                Some(&(_, sig)) => {
                    let group = isobox::sys::process::pty_foreground(ctl.as_fd()).unwrap_or(pid);
                    let _ = isobox::sys::process::signal_group(group, sig);
                }
                None => p.pending.push(b),
            }
        }
    } else if !p.eof {
        p.pending.extend_from_slice(data);
    }
    write_stdin(init, pid);
}

fn write_stdin(init: &mut Init, pid: i32) {
    let Some(p) = init.procs.by_pid.get_mut(&pid) else {
        return;
    };
    let Some((tx, _)) = p.stdin.as_mut() else {
        p.pending.clear();
        return;
    };
    while !p.pending.is_empty() {
        match tx.write(&p.pending) {
            Ok(n) => {
                p.pending.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                // The program closed its stdin: what is left has nowhere to go.
                p.pending.clear();
                p.eof = true;
                break;
            }
        }
    }
    // A terminal's input ends with ^D on the line discipline, never a close: closing
    // the controller would hang the terminal up.
    if p.eof && p.pty.is_none() {
        if let Some((mut tx, t)) = p.stdin.take() {
            let _ = init.poll.registry().deregister(&mut tx);
            init.procs.tokens.remove(&t);
        }
    }
}

/// Sets `pid`'s terminal size (it gets SIGWINCH).
pub fn resize(init: &mut Init, pid: u32, cols: u16, rows: u16) -> Result<(), String> {
    let pid = i32::try_from(pid).map_err(|_| "no such process".to_string())?;
    let p = init
        .procs
        .by_pid
        .get(&pid)
        .ok_or_else(|| format!("no such process: {pid}"))?;
    let ctl = p
        .pty
        .as_ref()
        .ok_or_else(|| format!("process {pid} has no terminal"))?;
    isobox::sys::process::set_pty_size(ctl.as_fd(), cols.max(1), rows.max(1))
        .map_err(|e| format!("resize: {e}"))
}

/// Sends `signal` to `pid`'s process group.
pub fn signal(init: &mut Init, pid: u32, signal: i32) -> Result<(), String> {
    let pid = i32::try_from(pid).map_err(|_| "no such process".to_string())?;
    if !init.procs.by_pid.contains_key(&pid) {
        return Err(format!("no such process: {pid}"));
    }
    isobox::sys::process::signal_group(pid, signal).map_err(|e| format!("signal: {e}"))
}

/// A process's fd is ready.
pub fn event(init: &mut Init, t: Token, readable: bool, writable: bool) {
    let Some(&(pid, side)) = init.procs.tokens.get(&t) else {
        return;
    };
    match side {
        Side::Out(_) if readable => pump_and_finish(init, pid),
        Side::In if writable => write_stdin(init, pid),
        _ => {}
    }
}

/// Forwards what `pid`'s outputs hold, until they would block or close. False when it
/// stopped early: the process is held, or the daemon fell behind.
fn pump(init: &mut Init, pid: i32) -> bool {
    let mut buf = std::mem::take(&mut init.buf);
    buf.resize(MAX_DATA_BYTES + OUTPUT_HEAD_BYTES, 0);
    let mut frames: Vec<Vec<u8>> = Vec::new();
    let mut closed = Vec::new();
    let mut drained = true;
    {
        let Some(p) = init.procs.by_pid.get_mut(&pid) else {
            init.buf = buf;
            return true;
        };
        if p.held {
            init.buf = buf;
            return false;
        }
        let mut backlog = init.wbuf.len() - init.wpos;
        for (i, (stream, rx, _)) in p.out.iter_mut().enumerate() {
            loop {
                // Output nobody watches goes into the ring only: it never waits for
                // the daemon.
                if p.watched && backlog >= super::MAX_CTL_BACKLOG_BYTES {
                    drained = false;
                    break;
                }
                // The frame's head (stream, offset) comes first.
                match rx.read(&mut buf[OUTPUT_HEAD_BYTES..]) {
                    Ok(0) => {
                        closed.push(i);
                        break;
                    }
                    Ok(n) => {
                        let data = OUTPUT_HEAD_BYTES..OUTPUT_HEAD_BYTES + n;
                        if let Some(r) = p.ring.as_mut() {
                            r.push(*stream, &buf[data.clone()]);
                        }
                        let side = usize::from(*stream == Stream::Stderr);
                        let offset = p.written[side];
                        p.written[side] += n as u64;
                        if p.watched {
                            backlog += n + 18;
                            let mut head = [0u8; OUTPUT_HEAD_BYTES];
                            output_head(&mut head, *stream, offset);
                            buf[..OUTPUT_HEAD_BYTES].copy_from_slice(&head);
                            frames.push(buf[..data.end].to_vec());
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    // A terminal whose programs all closed it reads EIO: its end.
                    Err(_) => {
                        closed.push(i);
                        break;
                    }
                }
            }
        }
    }
    init.buf = buf;
    let channel = u32::try_from(pid).unwrap_or(0);
    for payload in frames {
        init.send(Kind::Output, channel, &payload);
    }
    let Some(p) = init.procs.by_pid.get_mut(&pid) else {
        return true;
    };
    for i in closed.into_iter().rev() {
        let (_, mut rx, t) = p.out.remove(i);
        let _ = init.poll.registry().deregister(&mut rx);
        init.procs.tokens.remove(&t);
    }
    drained
}

/// Forwards `pid`'s output, and, if it was reaped and its pipes are forwarded up to
/// now, sends its `Exit` and forgets it.
fn pump_and_finish(init: &mut Init, pid: i32) {
    let drained = pump(init, pid);
    if drained
        && init
            .procs
            .by_pid
            .get(&pid)
            .is_some_and(|p| p.exited.is_some())
    {
        finish(init, pid);
    }
}

/// Forwards every process's waiting output (the daemon caught up).
pub fn pump_all(init: &mut Init) {
    let pids: Vec<i32> = init.procs.by_pid.keys().copied().collect();
    for pid in pids {
        pump_and_finish(init, pid);
    }
}

/// Holds or releases `pid`'s output.
pub fn hold(init: &mut Init, pid: u32, held: bool) -> Result<(), String> {
    let pid = i32::try_from(pid).map_err(|_| "no such process".to_string())?;
    let p = init
        .procs
        .by_pid
        .get_mut(&pid)
        .ok_or_else(|| format!("no such process: {pid}"))?;
    p.held = held;
    if !held {
        // Edge-triggered: what waits in its pipes brings no new event.
        pump_and_finish(init, pid);
    }
    Ok(())
}

/// Reaps every child that ended. A process the daemon started gets what its pipes
/// hold forwarded first (at once, or once it is released and the daemon caught up),
/// then its `Exit`; what its background children still hold of its pipes after that
/// is closed (their later writes fail). Orphans are reaped silently.
pub fn reap(init: &mut Init) {
    while let Some(r) = isobox::sys::process::reap_any() {
        let Some(p) = init.procs.by_pid.get_mut(&r.pid) else {
            continue;
        };
        p.exited = Some(Exited {
            code: r.code,
            signal: r.signal,
        });
        pump_and_finish(init, r.pid);
    }
    // Groups with nobody left in them are done with.
    init.procs
        .groups
        .retain(|&g| isobox::sys::process::group_exists(g));
}

/// Closes a reaped process's pipes and sends its `Exit`.
fn finish(init: &mut Init, pid: i32) {
    let Some(mut p) = init.procs.by_pid.remove(&pid) else {
        return;
    };
    let reg = init.poll.registry();
    for (_, mut rx, t) in p.out.drain(..) {
        let _ = reg.deregister(&mut rx);
        init.procs.tokens.remove(&t);
    }
    if let Some((mut tx, t)) = p.stdin.take() {
        let _ = reg.deregister(&mut tx);
        init.procs.tokens.remove(&t);
    }
    if let Some(exited) = p.exited {
        init.send_json(Kind::Exit, u32::try_from(pid).unwrap_or(0), &exited);
        if let Some(ring) = p.ring.take() {
            let ended = &mut init.procs.ended;
            ended.push((pid, ring, exited));
            if ended.len() > MAX_ENDED {
                ended.remove(0);
            }
        }
    }
}

/// `Watch`: replays `pid`'s ring on call `call`'s channel and forwards its output from
/// now on; whether (and how) it ended.
pub fn watch(init: &mut Init, call: u32, pid: u32) -> Result<Option<Exited>, String> {
    let pid = i32::try_from(pid).map_err(|_| "no such process".to_string())?;
    let mut frames = Vec::new();
    let add = |frames: &mut Vec<Vec<u8>>, ring: &Ring| {
        for (stream, offset, data) in ring.replay() {
            for (i, part) in data.chunks(MAX_DATA_BYTES).enumerate() {
                let at = offset + (i * MAX_DATA_BYTES) as u64;
                frames.push(output_payload(stream, at, part));
            }
        }
    };
    let exited = if let Some(p) = init.procs.by_pid.get_mut(&pid) {
        let ring = p
            .ring
            .as_ref()
            .ok_or_else(|| format!("process {pid} is not a background process"))?;
        add(&mut frames, ring);
        p.watched = true;
        None
    } else if let Some((_, ring, exited)) = init.procs.ended.iter().find(|(p, _, _)| *p == pid) {
        add(&mut frames, ring);
        Some(*exited)
    } else {
        return Err(format!("no such process: {pid}"));
    };
    for f in frames {
        init.send(Kind::Replay, call, &f);
    }
    Ok(exited)
}

/// `Unwatch`: `pid`'s output goes into its ring only (and is never held).
pub fn unwatch(init: &mut Init, pid: u32) -> Result<(), String> {
    let pid = i32::try_from(pid).map_err(|_| "no such process".to_string())?;
    let Some(p) = init.procs.by_pid.get_mut(&pid) else {
        // Ended meanwhile: nothing is forwarded any more.
        return Ok(());
    };
    if p.ring.is_none() {
        return Err(format!("process {pid} is not a background process"));
    }
    p.watched = false;
    p.held = false;
    pump_and_finish(init, pid);
    Ok(())
}

/// `Forget`: drops an ended background process's ring.
pub fn forget(init: &mut Init, pid: u32) {
    if let Ok(pid) = i32::try_from(pid) {
        init.procs.ended.retain(|(p, _, _)| *p != pid);
    }
}

/// Kills every process group the daemon started, and what is left of them (the channel
/// is gone), then reaps them.
pub fn kill_all(init: &mut Init) {
    for &g in &init.procs.groups {
        let _ = isobox::sys::process::signal_group(g, libc::SIGKILL);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while std::time::Instant::now() < deadline {
        match isobox::sys::process::reap_any() {
            Some(_) => continue,
            None if init.procs.groups.iter().any(|&g| group_alive(g)) => {
                std::thread::sleep(std::time::Duration::from_millis(5))
            }
            None => break,
        }
    }
}

/// Whether any process of group `g` is left, a zombie included (reaped next turn).
fn group_alive(g: i32) -> bool {
    isobox::sys::process::group_exists(g)
}
