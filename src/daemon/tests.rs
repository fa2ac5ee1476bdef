//! The loop's own tests, behind its seams: the real reactor, connections and run
//! lifecycle, on loopback, with the fake backend (`sandbox::fake`: plain host processes
//! instead of gVisor sandboxes) and a shutdown pipe instead of signal handlers. No root,
//! runsc or cgroups is needed. The runtime is `sh`: a descriptor and an empty tree made
//! here, so each run is `/bin/sh main.sh` behind the real start-signal wrapper.

use super::Daemon;
use crate::sandbox::fake::Fake;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A daemon on its own thread; stopped (and its directory removed) on drop.
struct Loop {
    addr: SocketAddr,
    term: Option<UnixStream>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    fake: Arc<Fake>,
    dir: std::path::PathBuf,
}

impl Loop {
    fn start(extra: &[&str]) -> Loop {
        static SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let instance = format!("isobox-looptest-{}-{n}", std::process::id());
        let dir = std::env::temp_dir().join(&instance);
        let _ = std::fs::remove_dir_all(&dir);
        let (rt, rootfs) = (dir.join("runtimes"), dir.join("rootfs"));
        std::fs::create_dir_all(rt.join("x")).unwrap();
        std::fs::write(
            rt.join("sh.toml"),
            "language = \"sh\"\nrootfs = \"sh\"\nversion_key = \"sh\"\nsource_file = \"main.sh\"\nrun = [\"/bin/sh\", \"main.sh\"]\nenv = [\"PATH=/usr/bin:/bin\"]\n[limits]\nmemory_bytes = 67108864\ncpus = 1.0\nwall_time_ms = 5000\n",
        )
        .unwrap();
        std::fs::create_dir_all(rootfs.join("sh/.isobox")).unwrap();
        std::fs::create_dir_all(rootfs.join("sh/bin")).unwrap();
        std::fs::write(rootfs.join("sh/.isobox/versions"), "sh=1\n").unwrap();
        std::fs::write(rootfs.join("sh/bin/sh"), "").unwrap();
        let mut args: Vec<String> = [
            "--listen=127.0.0.1:0",
            "--egress=off",
            "--seccomp=0",
            "--warm-pool=off",
            "--log=warn",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(format!("--instance={instance}"));
        args.push(format!("--data-dir={}", dir.join("data").display()));
        args.push(format!("--runtimes-dir={}", rt.display()));
        args.push(format!("--rootfs-dir={}", rootfs.display()));
        args.extend(extra.iter().map(|s| s.to_string()));
        let cfg = crate::config::Config::load(&args).expect("test config");
        let fake = Fake::new(&dir.join("runs"));
        let (term_tx, term_rx) = UnixStream::pair().unwrap();
        let (_reload_tx, reload_rx) = UnixStream::pair().unwrap();
        term_rx.set_nonblocking(true).unwrap();
        reload_rx.set_nonblocking(true).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let backend: Arc<dyn crate::sandbox::Backend> = fake.clone();
        let thread = std::thread::spawn(move || {
            let _keep = _reload_tx;
            let mut d = Daemon::build(cfg, Some(backend), Some((term_rx, reload_rx)))
                .expect("daemon starts");
            tx.send(d.local_addr()).unwrap();
            d.run()
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).expect("ready");
        let l = Loop {
            addr,
            term: Some(term_tx),
            thread: Some(thread),
            fake,
            dir,
        };
        // The startup probe runs `/bin/cat` through the fake: wait for it, so every
        // sandbox a test sees is its own. (/readyz stays 503: there is no cgroup slice.)
        l.assert_idle();
        l
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// One request on a fresh connection; the whole response as (status, head, body).
    fn request(&self, raw: &str) -> (u16, String, String) {
        let mut s = self.connect();
        s.write_all(raw.as_bytes()).unwrap();
        read_response(&mut s)
    }

    fn get(&self, path: &str) -> (u16, String, String) {
        self.request(&format!(
            "GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        ))
    }

    fn execute(&self, body: &serde_json::Value) -> (u16, serde_json::Value) {
        let (status, _, b) = self.request(&post("/execute", body, false));
        (status, serde_json::from_str(&b).unwrap_or_default())
    }

    fn health(&self) -> serde_json::Value {
        serde_json::from_str(&self.get("/healthz").2).unwrap()
    }

    fn wait_for(&self, f: impl Fn(&Loop) -> bool, what: &str) {
        let t0 = Instant::now();
        while !f(self) {
            assert!(t0.elapsed() < Duration::from_secs(15), "waited for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Every sandbox is gone and every slot free.
    fn assert_idle(&self) {
        self.wait_for(
            |l| l.fake.live.load(Ordering::SeqCst) == 0 && l.health()["inFlight"] == 0,
            "every sandbox removed and every slot free",
        );
    }

    /// Asks for a shutdown (as SIGTERM would) and waits for the loop to end.
    fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        // One byte is one SIGTERM. The pipe stays open until the loop has ended: its
        // EOF would read as a second signal, which kills running executions at once.
        if let Some(t) = self.term.as_mut() {
            let _ = t.write_all(b"x");
        }
        if let Some(th) = self.thread.take() {
            th.join().expect("loop thread").expect("loop ends cleanly");
        }
        self.term = None;
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The loop may be wedged (that may be the failure): do not wait for it, but
            // leave no sandbox process behind.
            self.fake.kill_all();
        } else {
            self.stop_inner();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn post(path: &str, body: &serde_json::Value, sse: bool) -> String {
    let b = body.to_string();
    let accept = if sse {
        "Accept: text/event-stream\r\n"
    } else {
        ""
    };
    format!(
        "POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n{accept}Content-Length: {}\r\nConnection: close\r\n\r\n{b}",
        b.len()
    )
}

fn sh(script: &str, limits: serde_json::Value) -> serde_json::Value {
    serde_json::json!({"language": "sh", "network": false, "code": script, "limits": limits})
}

/// Reads one response: by Content-Length, by chunks, or to EOF.
/// One read, retried when a signal interrupts it (a socket with a read timeout is
/// never restarted by the kernel).
fn read_some(s: &mut TcpStream, buf: &mut [u8]) -> usize {
    loop {
        match s.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r.expect("read from the daemon"),
        }
    }
}

fn read_response(s: &mut TcpStream) -> (u16, String, String) {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = read_some(s, &mut tmp);
        assert!(
            n > 0,
            "closed before a head: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status: u16 = head[9..12].parse().unwrap();
    let mut body = buf[head_end..].to_vec();
    let lower = head.to_ascii_lowercase();
    if let Some(len) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .map(|v| v.trim().parse::<usize>().unwrap())
    {
        while body.len() < len {
            let n = read_some(s, &mut tmp);
            assert!(n > 0, "closed mid-body");
            body.extend_from_slice(&tmp[..n]);
        }
        body.truncate(len);
    } else if lower.contains("transfer-encoding: chunked") {
        while !body.ends_with(b"0\r\n\r\n") {
            let n = read_some(s, &mut tmp);
            assert!(n > 0, "closed mid-stream");
            body.extend_from_slice(&tmp[..n]);
        }
        body = dechunk(&body);
    } else {
        s.read_to_end(&mut body).unwrap();
    }
    (status, head, String::from_utf8_lossy(&body).into_owned())
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let i = b.windows(2).position(|w| w == b"\r\n").unwrap();
        let n = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 4 + n..];
    }
}

/// SSE events of a stream body: (event, data as JSON).
fn events(body: &str) -> Vec<(String, serde_json::Value)> {
    body.split("\n\n")
        .filter_map(|e| {
            let ev = e.lines().find_map(|l| l.strip_prefix("event: "))?;
            let data = e.lines().find_map(|l| l.strip_prefix("data: "))?;
            Some((ev.to_string(), serde_json::from_str(data).unwrap()))
        })
        .collect()
}

#[test]
fn test_a_run_reports_output_exit_and_cleans_up() {
    let l = Loop::start(&[]);
    let (status, v) = l.execute(&sh(
        "echo out; echo err >&2; printf 'é'; exit 3",
        serde_json::json!({}),
    ));
    assert_eq!(status, 200, "{v}");
    let run = &v["run"];
    assert_eq!(run["stdout"], "out\né");
    assert_eq!(run["stderr"], "err\n");
    assert_eq!(run["exitCode"], 3);
    assert_eq!(
        (run["timedOut"].as_bool(), run["truncated"].as_bool()),
        (Some(false), Some(false))
    );
    assert_eq!(v["language"], "sh");
    l.assert_idle();
    assert_eq!(l.health()["counters"]["runsTotal"], 1);
    l.stop();
}

#[test]
fn test_output_cap_below_at_and_above() {
    let l = Loop::start(&[]);
    for (n, truncated) in [(1023usize, false), (1024, false), (1025, true)] {
        let (status, v) = l.execute(&sh(
            &format!("head -c {n} /dev/zero | tr '\\0' x; head -c {n} /dev/zero | tr '\\0' y >&2"),
            serde_json::json!({"outputBytes": 1024}),
        ));
        assert_eq!(status, 200);
        let run = &v["run"];
        assert_eq!(
            run["stdout"].as_str().map(str::len),
            Some(n.min(1024)),
            "{n}"
        );
        assert_eq!(
            run["stderr"].as_str().map(str::len),
            Some(n.min(1024)),
            "{n}"
        );
        assert_eq!(run["truncated"], truncated, "{n}");
        assert_eq!(run["exitCode"], 0);
    }
    l.assert_idle();
    l.stop();
}

#[test]
fn test_wall_time_kills_the_sandbox() {
    let l = Loop::start(&[]);
    let t0 = Instant::now();
    let (_, v) = l.execute(&sh(
        "echo started; sleep 30",
        serde_json::json!({"wallTimeMs": 300}),
    ));
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let run = &v["run"];
    assert_eq!(run["stdout"], "started\n");
    assert_eq!(
        (run["timedOut"].as_bool(), run["exitCode"].as_i64()),
        (Some(true), Some(137))
    );
    assert!(run["durationMs"].as_u64().unwrap() >= 300, "{run}");
    assert!(l.fake.kills.load(Ordering::SeqCst) >= 1);
    l.assert_idle();
    assert_eq!(l.health()["counters"]["runsTimedOut"], 1);
    l.stop();
}

#[test]
fn test_stdin_reaches_the_program() {
    let l = Loop::start(&[]);
    let mut body = sh("tr a-z A-Z", serde_json::json!({}));
    body["stdin"] = "hello\n".into();
    let (_, v) = l.execute(&body);
    assert_eq!(v["run"]["stdout"], "HELLO\n");
    l.stop();
}

#[test]
fn test_sse_streams_output_then_done() {
    let l = Loop::start(&[]);
    let (status, head, body) = l.request(&post(
        "/execute",
        &sh(
            "echo a; sleep 0.2; echo b >&2; sleep 0.2; echo c",
            serde_json::json!({}),
        ),
        true,
    ));
    assert_eq!(status, 200);
    assert!(head.contains("text/event-stream"), "{head}");
    let evs = events(&body);
    // Each stream's events in order (how the loaded host batches them is its business),
    // and the first event well before the end: output is live, not replayed at exit.
    let stream = |name: &str| -> String {
        evs.iter()
            .filter(|(e, _)| e == name)
            .map(|(_, d)| d["chunk"].as_str().unwrap())
            .collect()
    };
    assert_eq!(
        (stream("stdout"), stream("stderr")),
        ("a\nc\n".into(), "b\n".into())
    );
    assert_eq!(
        evs.first().map(|(e, _)| e.as_str()),
        Some("stdout"),
        "{evs:?}"
    );
    let (last, done) = evs.last().unwrap();
    assert_eq!(last, "done");
    assert_eq!(done["run"]["stdout"], "a\nc\n");
    assert_eq!(done["run"]["exitCode"], 0);
    l.stop();
}

#[test]
fn test_a_client_that_leaves_cancels_its_run() {
    let l = Loop::start(&[]);
    let mut s = l.connect();
    s.write_all(
        post(
            "/execute",
            &sh(
                "echo first; sleep 30",
                serde_json::json!({"wallTimeMs": 20000}),
            ),
            true,
        )
        .as_bytes(),
    )
    .unwrap();
    let mut got = Vec::new();
    let mut tmp = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("first") {
        let n = read_some(&mut s, &mut tmp);
        assert!(n > 0);
        got.extend_from_slice(&tmp[..n]);
    }
    let t0 = Instant::now();
    drop(s);
    l.assert_idle();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(l.fake.kills.load(Ordering::SeqCst) >= 1);
    assert_eq!(l.health()["counters"]["runsCancelled"], 1);
    l.stop();
}

#[test]
fn test_a_sandbox_that_cannot_start_is_a_500_and_frees_its_slot() {
    let l = Loop::start(&["--max-concurrent=1"]);
    l.fake.fail_runs.store(true, Ordering::SeqCst);
    let (status, v) = l.execute(&sh("echo never", serde_json::json!({})));
    assert_eq!(status, 500, "{v}");
    assert_eq!(v["error"], "sandbox_start_failed");
    // No host detail reaches the client.
    assert!(!v.to_string().contains("refused by the test"), "{v}");
    l.fake.fail_runs.store(false, Ordering::SeqCst);
    let (status, v) = l.execute(&sh("echo again", serde_json::json!({})));
    assert_eq!(
        (status, v["run"]["stdout"].as_str()),
        (200, Some("again\n"))
    );
    l.stop();
}

#[test]
fn test_the_slot_cap_answers_429_when_full() {
    let l = Loop::start(&["--max-concurrent=1"]);
    let mut first = l.connect();
    first
        .write_all(
            post(
                "/execute",
                &sh("sleep 1; echo one", serde_json::json!({})),
                false,
            )
            .as_bytes(),
        )
        .unwrap();
    l.wait_for(
        |l| l.health()["inFlight"] == 1,
        "the first run to hold the slot",
    );
    let (status, v) = l.execute(&sh("echo two", serde_json::json!({})));
    assert_eq!(status, 429, "{v}");
    let (status, _, b) = read_response(&mut first);
    assert_eq!(status, 200);
    assert!(b.contains("one"), "{b}");
    l.stop();
}

#[test]
fn test_pipelined_runs_are_answered_in_order() {
    let l = Loop::start(&[]);
    let mut s = l.connect();
    let keep = |script: &str| {
        let b = sh(script, serde_json::json!({})).to_string();
        format!(
            "POST /execute HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n{b}",
            b.len()
        )
    };
    s.write_all(format!("{}{}", keep("sleep 0.3; echo 1"), keep("echo 2")).as_bytes())
        .unwrap();
    let (_, _, a) = read_response(&mut s);
    let (_, _, b) = read_response(&mut s);
    let out =
        |b: &str| serde_json::from_str::<serde_json::Value>(b).unwrap()["run"]["stdout"].clone();
    assert_eq!((out(&a), out(&b)), ("1\n".into(), "2\n".into()));
    l.stop();
}

#[test]
fn test_shutdown_lets_a_running_run_finish() {
    let l = Loop::start(&[]);
    let mut s = l.connect();
    s.write_all(
        post(
            "/execute",
            &sh("sleep 0.5; echo done", serde_json::json!({})),
            false,
        )
        .as_bytes(),
    )
    .unwrap();
    l.wait_for(|l| l.health()["inFlight"] == 1, "the run to start");
    let fake = Arc::clone(&l.fake);
    l.stop();
    let (status, _, b) = read_response(&mut s);
    assert_eq!(status, 200);
    assert!(b.contains("\"stdout\":\"done\\n\""), "{b}");
    assert_eq!(fake.live.load(Ordering::SeqCst), 0, "nothing left behind");
}

#[test]
fn test_a_second_signal_kills_runs_and_still_answers_their_clients() {
    // A run that has not started yet when the second signal kills it (slow to start:
    // the wrapper's start frame comes after a pause), and one that has.
    let l = Loop::start(&[]);
    let mut started = l.connect();
    started
        .write_all(
            post(
                "/execute",
                &sh("echo up; sleep 30", serde_json::json!({})),
                true,
            )
            .as_bytes(),
        )
        .unwrap();
    let mut got = Vec::new();
    let mut tmp = [0u8; 4096];
    while !String::from_utf8_lossy(&got).contains("up") {
        let n = read_some(&mut started, &mut tmp);
        assert!(n > 0);
        got.extend_from_slice(&tmp[..n]);
    }
    l.fake.delay_start_ms.store(3000, Ordering::SeqCst);
    let mut waiting = l.connect();
    waiting
        .write_all(post("/execute", &sh("echo never", serde_json::json!({})), false).as_bytes())
        .unwrap();
    l.wait_for(|l| l.health()["inFlight"] == 2, "both runs to hold a slot");
    let t0 = Instant::now();
    let mut term = l.term.as_ref().unwrap();
    term.write_all(b"x").unwrap();
    // The first signal is seen once the listener is gone; only then the second.
    l.wait_for(
        |l| TcpStream::connect(l.addr).is_err(),
        "the shutdown to close the listener",
    );
    term.write_all(b"x").unwrap();
    let (status, _, b) = read_response(&mut waiting);
    assert_eq!(status, 503, "{b}");
    assert!(b.contains("shutting_down"), "{b}");
    started.read_to_end(&mut got).unwrap();
    let evs = events(&String::from_utf8_lossy(&dechunk(
        &got[got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4..],
    )));
    let (last, done) = evs.last().unwrap();
    assert_eq!(last, "done");
    assert_eq!(done["run"]["exitCode"], 137);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let fake = Arc::clone(&l.fake);
    l.stop();
    assert_eq!(fake.live.load(Ordering::SeqCst), 0, "nothing left behind");
}

#[test]
fn test_no_container_id_is_a_prefix_of_another() {
    // runsc resolves ids by prefix: `…-b1` next to `…-b10` made every verb on `…-b1`
    // fail as ambiguous (found by schemathesis: a pause answered 502).
    let mut ids = Vec::new();
    for kind in ["r", "k", "b", "w", "probe"] {
        for serial in [0, 1, 2, 9, 10, 11, 19, 100, 101, 1000, u64::MAX] {
            ids.push(super::container_id("isobox-t1", 0x1a2b, kind, serial));
        }
    }
    for a in &ids {
        assert!(a.starts_with("isobox-t1-1a2b-") && a.ends_with('.'), "{a}");
        for b in &ids {
            assert!(
                a == b || !b.starts_with(a.as_str()),
                "{a} is a prefix of {b}"
            );
        }
    }
}

#[test]
fn test_stderr_before_the_hooks_signal_is_the_programs_and_time_counts_from_it() {
    // The program writes at once; the hook's signal comes 1 s later (a slow `runsc
    // run`). What came before it is the program's, in order, and its time counts from
    // the signal (the program ran 1.5 s from its spawn).
    let l = Loop::start(&[]);
    l.fake.signal_delay_ms.store(1000, Ordering::SeqCst);
    let (status, v) = l.execute(&sh(
        "echo early >&2; echo out; sleep 1.5; echo late >&2",
        serde_json::json!({}),
    ));
    assert_eq!(status, 200, "{v}");
    let run = &v["run"];
    assert_eq!(run["stderr"], "early\nlate\n", "{run}");
    assert_eq!(run["stdout"], "out\n", "{run}");
    assert_eq!(run["exitCode"], 0, "{run}");
    let ms = run["durationMs"].as_u64().unwrap();
    assert!(
        (300..1400).contains(&ms),
        "durationMs {ms}: not from the signal"
    );
    l.assert_idle();
    l.stop();
}

#[test]
fn test_more_stderr_than_is_held_before_the_signal_is_all_kept() {
    // 200 KiB of stderr before the signal: the gate holds 64 KiB (and a read), the
    // program waits on its full pipe, and after the signal every byte arrives.
    let l = Loop::start(&[]);
    l.fake.signal_delay_ms.store(300, Ordering::SeqCst);
    let n = 200 * 1024;
    let (status, v) = l.execute(&sh(
        &format!("head -c {n} /dev/zero | tr '\\0' e >&2; echo done"),
        serde_json::json!({"outputBytes": 1 << 20}),
    ));
    assert_eq!(status, 200, "{v}");
    let run = &v["run"];
    let err = run["stderr"].as_str().unwrap();
    assert_eq!(err.len(), n);
    assert!(err.bytes().all(|b| b == b'e'));
    assert_eq!(
        (run["stdout"].as_str(), run["truncated"].as_bool()),
        (Some("done\n"), Some(false))
    );
    l.assert_idle();
    l.stop();
}

#[test]
fn test_a_run_that_ends_without_the_hooks_signal_failed_to_start() {
    // runsc said something and exited before the program existed: a 500, and runsc's
    // words are not the client's (plain and over SSE).
    let l = Loop::start(&[]);
    l.fake.signal_delay_ms.store(u64::MAX, Ordering::SeqCst);
    let script = "echo 'runsc: creating container: injected' >&2; exit 128";
    let (status, v) = l.execute(&sh(script, serde_json::json!({})));
    assert_eq!(
        (status, v["error"].as_str()),
        (500, Some("sandbox_start_failed")),
        "{v}"
    );
    assert!(!v.to_string().contains("injected"), "{v}");
    let (status, _, body) = l.request(&post("/execute", &sh(script, serde_json::json!({})), true));
    assert_eq!(status, 200);
    assert!(
        body.contains("event: error") && body.contains("sandbox_start_failed"),
        "{body}"
    );
    assert!(
        !body.contains("injected") && !body.contains("event: done"),
        "{body}"
    );
    // A program that never gets its signal is killed at the start deadline and is a
    // start failure too.
    let (status, v) = l.execute(&sh("sleep 30", serde_json::json!({"wallTimeMs": 200})));
    assert_eq!(
        (status, v["error"].as_str()),
        (500, Some("sandbox_start_failed")),
        "{v}"
    );
    l.fake.signal_delay_ms.store(0, Ordering::SeqCst);
    let (status, v) = l.execute(&sh("echo fine", serde_json::json!({})));
    assert_eq!(
        (status, v["run"]["stdout"].as_str()),
        (200, Some("fine\n")),
        "{v}"
    );
    l.assert_idle();
    l.stop();
}

#[test]
fn test_the_frame_still_says_a_start_without_the_hook() {
    // gVisor without a working hook (another CPU, a noexec data directory) falls back
    // to the frame before the argv: the frame is stripped, what precedes it is not
    // the program's, and a run without it failed to start.
    let l = Loop::start(&[]);
    l.fake.frame_start.store(true, Ordering::SeqCst);
    let (status, v) = l.execute(&sh("echo err >&2; echo out", serde_json::json!({})));
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["run"]["stderr"].as_str(), v["run"]["stdout"].as_str()),
        (Some("err\n"), Some("out\n"))
    );
    // The program printing the frame's bytes itself is just its output.
    let (status, v) = l.execute(&sh(
        "printf '\\036ISOBOX-START\\n' >&2",
        serde_json::json!({}),
    ));
    assert_eq!(
        (status, v["run"]["stderr"].as_str()),
        (200, Some("\u{1e}ISOBOX-START\n")),
        "{v}"
    );
    l.assert_idle();
    l.stop();
}

#[test]
fn test_a_program_that_wrote_to_stdout_ran_even_when_its_start_went_unheard() {
    // No signal (a hook that did not run), but the program wrote to stdout, which runsc
    // never does: its result stands (with its stderr), not a start failure.
    let l = Loop::start(&[]);
    l.fake.signal_delay_ms.store(u64::MAX, Ordering::SeqCst);
    let (status, v) = l.execute(&sh("echo err >&2; echo out; exit 4", serde_json::json!({})));
    assert_eq!(status, 200, "{v}");
    let run = &v["run"];
    assert_eq!(
        (
            run["stdout"].as_str(),
            run["stderr"].as_str(),
            run["exitCode"].as_i64()
        ),
        (Some("out\n"), Some("err\n"), Some(4)),
        "{v}"
    );
    assert!(run["durationMs"].as_u64().is_some(), "{v}");
    l.assert_idle();
    l.stop();
}
