//! `isobox-init`, the init of a long-lived sandbox, driven over its control socket as the
//! daemon drives it, here on the host (no sandbox, no root): the real binary with one
//! end of a socket pair as its fd 0, speaking `isobox::sandbox::wire`. What it does inside
//! gVisor (as pid 1, with a user) is tested through the daemon in `tests/wbx.rs`.

use isobox::sandbox::wire::{
    self, Call, Decoder, Exited, Frame, FsCall, Hello, Kind, Reply, Stream,
};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Init {
    child: Child,
    ctl: UnixStream,
    decoder: Decoder,
    next_call: u32,
    /// Frames read but not asked for yet.
    queue: Vec<Frame>,
}

impl Init {
    fn start() -> Init {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_isobox-init"))
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .current_dir(std::env::temp_dir())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("FROM_INIT_ENV", "yes")
            .spawn()
            .unwrap();
        ours.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut init = Init {
            child,
            ctl: ours,
            decoder: Decoder::default(),
            next_call: 1,
            queue: Vec::new(),
        };
        let hello = init.frame(|f| f.kind == Kind::Hello);
        let h: Hello = serde_json::from_slice(&hello.payload).unwrap();
        assert_eq!(h.version, wire::VERSION);
        assert_eq!(h.pid, init.child.id());
        init
    }

    /// The next frame `want` accepts (others are kept for later).
    fn frame(&mut self, want: impl Fn(&Frame) -> bool) -> Frame {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(i) = self.queue.iter().position(&want) {
                return self.queue.remove(i);
            }
            while let Some(f) = self.decoder.next_frame().unwrap() {
                self.queue.push(f);
            }
            if let Some(i) = self.queue.iter().position(&want) {
                return self.queue.remove(i);
            }
            assert!(
                Instant::now() < deadline,
                "no such frame; have {:?}",
                self.queue
            );
            let mut buf = [0u8; 65536];
            let n = self.ctl.read(&mut buf).unwrap();
            assert!(n > 0, "init closed the channel");
            self.decoder.push(&buf[..n]);
        }
    }

    fn call(&mut self, c: &Call) -> Reply {
        let id = self.next_call;
        self.next_call += 1;
        let mut out = Vec::new();
        wire::encode_json(&mut out, Kind::Call, id, c).unwrap();
        self.ctl.write_all(&out).unwrap();
        let f = self.frame(|f| f.kind == Kind::Reply && f.channel == id);
        serde_json::from_slice(&f.payload).unwrap()
    }

    fn spawn(&mut self, cmd: &str, stdin: bool, pty: Option<(u16, u16)>) -> u32 {
        self.spawn_as(cmd, stdin, pty, false)
    }

    fn spawn_as(
        &mut self,
        cmd: &str,
        stdin: bool,
        pty: Option<(u16, u16)>,
        background: bool,
    ) -> u32 {
        match self.call(&Call::Spawn {
            cmd: cmd.into(),
            cwd: None,
            env: vec![("FROM_CALL".into(), "1".into())],
            stdin,
            pty,
            background,
        }) {
            Reply::Ok(v) => v["pid"].as_u64().unwrap() as u32,
            r => panic!("spawn: {r:?}"),
        }
    }

    fn input(&mut self, pid: u32, data: &[u8]) {
        let mut out = Vec::new();
        wire::encode(&mut out, Kind::Input, pid, data).unwrap();
        self.ctl.write_all(&out).unwrap();
    }

    /// Everything `pid` wrote, by stream, until its exit.
    fn run_out(&mut self, pid: u32) -> (String, String, Exited) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        // Where each stream's first frame here started (after a replay: not at 0).
        let mut start: [Option<u64>; 2] = [None, None];
        loop {
            let f = self.frame(|f| f.channel == pid && matches!(f.kind, Kind::Output | Kind::Exit));
            if f.kind == Kind::Exit {
                let e: Exited = serde_json::from_slice(&f.payload).unwrap();
                return (
                    String::from_utf8_lossy(&out).into_owned(),
                    String::from_utf8_lossy(&err).into_owned(),
                    e,
                );
            }
            let (stream, offset, data) = wire::parse_output(&f.payload).expect("an output payload");
            let i = usize::from(stream == Stream::Stderr);
            let side = if i == 0 { &mut out } else { &mut err };
            // Each frame says where in its stream it is: right after the last one.
            let first = *start[i].get_or_insert(offset);
            assert_eq!(offset, first + side.len() as u64, "{stream:?} frame offset");
            side.extend_from_slice(data);
        }
    }

    /// Output of `pid` until `needle` shows up.
    fn wait_output(&mut self, pid: u32, needle: &str) -> String {
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains(needle) {
            let f = self.frame(|f| f.channel == pid && f.kind == Kind::Output);
            got.extend_from_slice(wire::parse_output(&f.payload).unwrap().2);
        }
        String::from_utf8_lossy(&got).into_owned()
    }
}

impl Drop for Init {
    /// Closes the channel, as a daemon that went away would: init kills every process
    /// group it started (what they left running included) and exits.
    fn drop(&mut self) {
        let _ = self.ctl.shutdown(std::net::Shutdown::Both);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn test_hello_spawn_output_and_exit() {
    let mut init = Init::start();
    let pid = init.spawn(
        "echo out; echo err >&2; echo $FROM_INIT_ENV $FROM_CALL; exit 3",
        false,
        None,
    );
    let (out, err, exit) = init.run_out(pid);
    assert_eq!((out.as_str(), err.as_str()), ("out\nyes 1\n", "err\n"));
    assert_eq!(
        exit,
        Exited {
            code: 3,
            signal: None
        }
    );
    // Env for later processes.
    assert!(matches!(
        init.call(&Call::Env {
            env: vec![("LATER".into(), "set".into())]
        }),
        Reply::Ok(_)
    ));
    let pid = init.spawn("echo $LATER", false, None);
    assert_eq!(init.run_out(pid).0, "set\n");
}

#[test]
fn test_stdin_end_and_large_output_in_order() {
    let mut init = Init::start();
    let pid = init.spawn("cat; echo done", true, None);
    init.input(pid, b"abc");
    init.input(pid, b"def\n");
    init.input(pid, b"");
    let (out, _, exit) = init.run_out(pid);
    assert_eq!(out, "abcdef\ndone\n");
    assert_eq!(exit.code, 0);
    // More than one frame's worth, split and in order.
    let pid = init.spawn("head -c 3000000 /dev/zero | tr '\\0' a; echo", false, None);
    let (out, _, _) = init.run_out(pid);
    assert_eq!(out.len(), 3_000_001);
    assert!(out.bytes().take(3_000_000).all(|b| b == b'a'));
}

#[test]
fn test_signals_reach_the_process_group() {
    let mut init = Init::start();
    let pid = init.spawn("sleep 30 & sleep 30; echo never", false, None);
    let t0 = Instant::now();
    assert!(matches!(
        init.call(&Call::Signal {
            pid,
            signal: libc::SIGTERM
        }),
        Reply::Ok(_)
    ));
    let (out, _, exit) = init.run_out(pid);
    assert_eq!(out, "");
    assert_eq!(
        exit,
        Exited {
            code: 128 + libc::SIGTERM,
            signal: Some(libc::SIGTERM)
        }
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    // A process that is not one of init's cannot be signalled through it.
    match init.call(&Call::Signal { pid: 1, signal: 9 }) {
        Reply::Error(e) => assert!(e.contains("no such process"), "{e}"),
        r => panic!("{r:?}"),
    }
}

#[test]
fn test_a_background_child_does_not_hold_the_exit() {
    let mut init = Init::start();
    let t0 = Instant::now();
    let pid = init.spawn("sleep 30 & echo bg", false, None);
    let (out, _, exit) = init.run_out(pid);
    assert_eq!((out.as_str(), exit.code), ("bg\n", 0));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}

#[test]
fn test_a_terminal_with_size_input_and_ctrl_c() {
    let mut init = Init::start();
    let pid = init.spawn(
        "trap 'echo got-int; exit 3' INT; stty size; read line; echo \"read:$line\"; read again; stty size; while :; do sleep 0.1; done",
        true,
        Some((80, 24)),
    );
    let got = init.wait_output(pid, "24 80");
    assert!(got.contains("24 80"), "{got:?}");
    init.input(pid, b"hello\n");
    init.wait_output(pid, "read:hello");
    assert!(matches!(
        init.call(&Call::Resize {
            pid,
            cols: 100,
            rows: 30
        }),
        Reply::Ok(_)
    ));
    // The second size is asked for after the resize, on the next line of input.
    init.input(pid, b"\n");
    init.wait_output(pid, "30 100");
    // Ctrl-C through the line discipline reaches the foreground group as SIGINT.
    init.input(pid, b"\x03");
    init.wait_output(pid, "got-int");
    let (_, _, exit) = init.run_out(pid);
    assert_eq!(exit.code, 3, "the trap's exit: {exit:?}");
    match init.call(&Call::Resize {
        pid,
        cols: 1,
        rows: 1,
    }) {
        Reply::Error(e) => assert!(e.contains("no such process"), "{e}"),
        r => panic!("{r:?}"),
    }
}

#[test]
fn test_bad_calls_are_refused_and_garbage_ends_the_channel() {
    let mut init = Init::start();
    let mut out = Vec::new();
    wire::encode(&mut out, Kind::Call, 7, b"{\"op\":\"format_disk\"}").unwrap();
    init.ctl.write_all(&out).unwrap();
    let f = init.frame(|f| f.kind == Kind::Reply && f.channel == 7);
    let r: Reply = serde_json::from_slice(&f.payload).unwrap();
    assert!(
        matches!(r, Reply::Error(ref e) if e.contains("bad call")),
        "{r:?}"
    );
    match init.call(&Call::Spawn {
        cmd: "true".into(),
        cwd: Some("/no/such/dir".into()),
        env: vec![],
        stdin: false,
        pty: None,
        background: false,
    }) {
        Reply::Error(e) => assert!(e.contains("/no/such/dir"), "{e}"),
        r => panic!("{r:?}"),
    }
    // A frame of an unknown kind: init ends (it would end the sandbox), nothing else.
    init.ctl.write_all(&[0, 0, 0, 5, 99, 0, 0, 0, 0]).unwrap();
    let t0 = Instant::now();
    loop {
        if let Some(status) = init.child.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "init still running");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn test_hold_stops_output_and_release_delivers_it_all_before_the_exit() {
    let mut init = Init::start();
    let pid = init.spawn(
        "head -c 3000000 /dev/zero | tr '\\0' b; echo end",
        false,
        None,
    );
    assert!(matches!(init.call(&Call::Hold { pid }), Reply::Ok(_)));
    // Held: at most what was read before the hold (and one pipe's worth) arrives, and no
    // exit: the writer blocks on its full pipe.
    std::thread::sleep(Duration::from_millis(500));
    init.ctl.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 65536];
    while let Ok(n) = init.ctl.read(&mut buf) {
        if n == 0 {
            break;
        }
        init.decoder.push(&buf[..n]);
    }
    init.ctl.set_nonblocking(false).unwrap();
    while let Some(f) = init.decoder.next_frame().unwrap() {
        init.queue.push(f);
    }
    let so_far: usize = init
        .queue
        .iter()
        .filter(|f| f.kind == Kind::Output && f.channel == pid)
        .map(|f| f.payload.len() - wire::OUTPUT_HEAD_BYTES)
        .sum();
    assert!(so_far < 1_000_000, "held, yet {so_far} bytes came");
    assert!(
        !init.queue.iter().any(|f| f.kind == Kind::Exit),
        "no exit while held"
    );
    assert!(matches!(init.call(&Call::Release { pid }), Reply::Ok(_)));
    let (out, _, exit) = init.run_out(pid);
    assert_eq!(out.len(), 3_000_004, "every byte, then the exit");
    assert!(out.ends_with("end\n"));
    assert_eq!(exit.code, 0);
    // Holding a process that is gone is refused.
    assert!(matches!(init.call(&Call::Hold { pid }), Reply::Error(_)));
}

/// `Watch`: the ring as `Replay` frames on the call's channel (stdout and stderr in the
/// order written), then the reply; `(replayed text, reply)`.
fn watch(init: &mut Init, pid: u32) -> (String, Reply) {
    let id = init.next_call;
    let reply = init.call(&Call::Watch { pid });
    let mut text = String::new();
    while let Some(i) = init
        .queue
        .iter()
        .position(|f| f.kind == Kind::Replay && f.channel == id)
    {
        let f = init.queue.remove(i);
        let (stream, _, data) = wire::parse_output(&f.payload).unwrap();
        let tag = if stream == Stream::Stderr { "E:" } else { "O:" };
        text.push_str(tag);
        text.push_str(&String::from_utf8_lossy(data));
    }
    (text, reply)
}

#[test]
fn test_background_process_ring_watch_unwatch_forget() {
    let mut init = Init::start();
    // Unwatched, its output goes into the ring only.
    let pid = init.spawn_as(
        "echo one; sleep 0.05; echo two >&2; sleep 0.05; echo three; read x; echo four; exit 4",
        true,
        None,
        true,
    );
    std::thread::sleep(Duration::from_millis(400));
    assert!(
        !init.queue.iter().any(|f| f.channel == pid),
        "nothing forwarded while unwatched: {:?}",
        init.queue
    );
    let (text, reply) = watch(&mut init, pid);
    assert_eq!(text, "O:one\nE:two\nO:three\n");
    assert_eq!(reply, Reply::Ok(serde_json::json!({"exited": null})));
    // Watched: what comes next is forwarded, then the exit.
    init.input(pid, b"go\n");
    let four = init.frame(|f| f.channel == pid && f.kind == Kind::Output);
    // Its offset goes on from the replayed "one\nthree\n" (10 bytes of stdout).
    assert_eq!(
        wire::parse_output(&four.payload),
        Some((Stream::Stdout, 10, &b"four\n"[..]))
    );
    let (out, err, exit) = init.run_out(pid);
    assert_eq!((out.as_str(), err.as_str(), exit.code), ("", "", 4));
    // After its end the ring is still there, with the exit.
    let (text, reply) = watch(&mut init, pid);
    assert_eq!(text, "O:one\nE:two\nO:three\nfour\n");
    assert_eq!(
        reply,
        Reply::Ok(serde_json::json!({"exited": {"code": 4, "signal": null}}))
    );
    assert!(matches!(init.call(&Call::Forget { pid }), Reply::Ok(_)));
    let (text, reply) = watch(&mut init, pid);
    assert_eq!(text, "");
    assert_eq!(reply, Reply::Error(format!("no such process: {pid}")));

    // Unwatch: forwarding stops, the ring goes on; a foreground process has no ring.
    // It also writes its count to a file: the test waits for progress, not a time.
    let count = std::env::temp_dir().join(format!("isobox-init-ring-{}", std::process::id()));
    let pid = init.spawn_as(
        &format!(
            "i=0; while :; do i=$((i+1)); echo $i; echo $i > {}; sleep 0.02; done",
            count.display()
        ),
        false,
        None,
        true,
    );
    let _ = watch(&mut init, pid);
    init.wait_output(pid, "3\n");
    assert!(matches!(init.call(&Call::Unwatch { pid }), Reply::Ok(_)));
    init.queue.retain(|f| f.channel != pid);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let counted = || -> u32 {
        std::fs::read_to_string(&count)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    };
    while counted() < 10 {
        assert!(std::time::Instant::now() < deadline, "the process stalled");
        std::thread::sleep(Duration::from_millis(20));
    }
    let reached = counted();
    assert!(
        !init
            .queue
            .iter()
            .any(|f| f.channel == pid && f.kind == Kind::Output),
        "forwarded after unwatch"
    );
    let (text, _) = watch(&mut init, pid);
    let last: u32 = text
        .trim_end()
        .rsplit('\n')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        last >= reached,
        "the ring went on while unwatched: {reached} written, ring {text:?}"
    );
    let _ = std::fs::remove_file(&count);
    assert!(text.starts_with("O:1\n2\n"), "{text:?}");
    assert!(matches!(
        init.call(&Call::Signal { pid, signal: 9 }),
        Reply::Ok(_)
    ));
    let fg = init.spawn("sleep 5", false, None);
    assert_eq!(
        watch(&mut init, fg).1,
        Reply::Error(format!("process {fg} is not a background process"))
    );
    assert_eq!(
        init.call(&Call::Unwatch { pid: fg }),
        Reply::Error(format!("process {fg} is not a background process"))
    );
}

#[test]
fn test_file_operations_are_answered_by_their_thread() {
    let mut init = Init::start();
    let dir = std::env::temp_dir().join(format!("isobox-init-fs-test-{}", std::process::id()));
    let d = dir.display().to_string();
    let _ = std::fs::remove_dir_all(&dir);
    let fs = |init: &mut Init, op: FsCall| init.call(&Call::Fs(op));
    let r = fs(
        &mut init,
        FsCall::Mkdir {
            path: format!("{d}/x/y").into(),
            parents: true,
        },
    );
    let Reply::Ok(v) = r else { panic!("{r:?}") };
    assert_eq!(
        (v["path"].as_str(), v["type"].as_str()),
        (Some(format!("{d}/x/y").as_str()), Some("dir"))
    );
    std::fs::write(dir.join("x/f"), b"abc").unwrap();
    // A process runs meanwhile: the loop serves both.
    let pid = init.spawn("echo still here", false, None);
    let r = fs(
        &mut init,
        FsCall::List {
            path: d.clone().into(),
            depth: 3,
        },
    );
    let Reply::Ok(v) = r else { panic!("{r:?}") };
    let listed: Vec<(&str, &str, u64)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap(),
                e["type"].as_str().unwrap(),
                e["size"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        listed[1..],
        [
            (format!("{d}/x/f").as_str(), "file", 3),
            (format!("{d}/x/y").as_str(), "dir", listed[2].2)
        ]
    );
    assert_eq!(listed[0].0, format!("{d}/x"));
    let (out, _, exited) = init.run_out(pid);
    assert_eq!((out.as_str(), exited.code), ("still here\n", 0));
    let r = fs(
        &mut init,
        FsCall::Remove {
            path: d.clone().into(),
            recursive: true,
            files_only: false,
        },
    );
    assert_eq!(r, Reply::Ok(serde_json::Value::Null));
    let r = fs(
        &mut init,
        FsCall::Stat {
            path: d.clone().into(),
        },
    );
    assert_eq!(
        r,
        Reply::Refused {
            status: 404,
            message: format!("{d}: no such file or directory")
        }
    );
}

#[test]
fn test_a_watch_reports_changes_and_ends_with_its_directory() {
    let mut init = Init::start();
    let dir = std::env::temp_dir().join(format!("isobox-init-watch-{}", std::process::id()));
    let d = dir.display().to_string();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    let r = init.call(&Call::Fs(FsCall::Watch {
        path: d.clone().into(),
        recursive: true,
    }));
    let Reply::Ok(v) = r else { panic!("{r:?}") };
    let h = u32::try_from(v["handle"].as_u64().unwrap()).unwrap();
    let next = |init: &mut Init| -> Option<wire::WatchEvent> {
        let f = init.frame(|f| f.kind == Kind::FsEvent && f.channel == h);
        (!f.payload.is_empty()).then(|| serde_json::from_slice(&f.payload).unwrap())
    };
    std::fs::write(dir.join("sub/a"), b"1").unwrap();
    std::fs::rename(dir.join("sub/a"), dir.join("b")).unwrap();
    let seen: Vec<(String, Vec<u8>, Option<Vec<u8>>)> = (0..3)
        .map(|_| {
            let e = next(&mut init).unwrap();
            (e.kind, e.path, e.from)
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("create".into(), format!("{d}/sub/a").into(), None),
            ("write".into(), format!("{d}/sub/a").into(), None),
            (
                "rename".into(),
                format!("{d}/b").into(),
                Some(format!("{d}/sub/a").into())
            ),
        ]
    );
    // Ended: no more frames after WatchEnd; a new watch of a missing path is refused.
    std::fs::remove_dir_all(&dir).unwrap();
    let mut last = None;
    while let Some(e) = next(&mut init) {
        last = Some(e);
    }
    assert_eq!(
        last.map(|e| (e.kind, e.path)),
        Some(("remove".to_string(), d.clone().into_bytes()))
    );
    let r = init.call(&Call::Fs(FsCall::Watch {
        path: d.clone().into(),
        recursive: false,
    }));
    assert_eq!(
        r,
        Reply::Refused {
            status: 404,
            message: format!("{d}: no such file or directory")
        }
    );
}
