//! Crash recovery (catalogue S2, issue 11): `kill -9` the daemon while work of every
//! kind is in flight, restart it with the same instance name, data dir and port, and
//! check what the startup sweep and the stores promise:
//!
//! * every orphan of the crashed daemon (runsc containers and processes, cgroups,
//!   bundles, mounts, loop devices) is gone within 10 s of the restart;
//! * the port binds again (no runsc process inherited the listener) and `/readyz` is 200;
//! * every acknowledged KV write is intact, with its ETag;
//! * sessions survive: the token works, uploaded files are byte-exact, a new step sees
//!   them; the volume is still held by its session, with what a completed step wrote;
//! * clients whose request was in flight saw their connection closed, not a hang;
//! * long-lived (WBX) sandboxes, one running a command, the other background
//!   processes (one on a terminal) and a file watch, are swept like runs: their ids
//!   answer 404 and new ones start.

mod common;

use common::session::Session;
use common::{mounts_under, read_response, sha256_hex, Daemon};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Deterministic pseudo-random bytes (no rand crate in the tests).
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// An acknowledged KV write: key, value, ETag.
type Acked = (String, Vec<u8>, String);

/// Uploads `data` to `path` in the session's workspace (200, every byte stored).
fn upload(d: &Daemon, s: &Session, path: &str, data: &[u8]) {
    let r = s.fs(d, "PUT", &format!("path={path}"), data);
    assert_eq!(r.status, 200, "upload {path}: {}", r.text());
    assert_eq!(r.json()["bytes"], data.len());
}

/// An offline step that must be answered 200; its `run`.
fn step_run(d: &Daemon, s: &Session, code: &str) -> Value {
    s.step_with(d, &json!({"code": code, "network": false}))["run"].clone()
}

/// What happened to a client whose request was in flight at the crash.
#[derive(Debug)]
enum Outcome {
    /// The connection was closed (EOF or reset) this long after the kill.
    Closed(Option<Duration>),
    /// A complete response arrived (the request was not in flight after all).
    Answered(#[allow(dead_code)] u16),
    /// Nothing happened within the read timeout: a hang.
    Hung,
}

/// How a watched response arrives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    /// All at once, at the end.
    No,
    /// Server-sent events (`/execute` with `Accept: text/event-stream`).
    Sse,
    /// NDJSON (`/wbx/…/exec/stream`).
    Ndjson,
}

/// Reads until the peer closes. `ready` is set once the response is visibly under way
/// (for SSE: the first stdout event), so the test knows the run is really running.
fn watch(
    s: TcpStream,
    killed_at: Arc<Mutex<Option<Instant>>>,
    ready: Arc<AtomicBool>,
    stream: Stream,
) -> Outcome {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let closed = |killed: &Mutex<Option<Instant>>| {
        Outcome::Closed(killed.lock().unwrap().map(|t| t.elapsed()))
    };
    if stream == Stream::No {
        ready.store(true, Ordering::SeqCst);
        let mut r = BufReader::new(s);
        // Synchronous /execute: nothing is sent until the run ends.
        return match r.fill_buf() {
            Ok([]) => closed(&killed_at),
            Ok(_) => match read_response(&mut r, false) {
                Some(resp) => Outcome::Answered(resp.status),
                None => closed(&killed_at),
            },
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed(&killed_at),
            Err(_) => Outcome::Hung,
        };
    }
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => return closed(&killed_at),
            Ok(_) => {
                let (out, done) = match stream {
                    Stream::Sse => ("event: stdout", "event: done"),
                    _ => (r#""type":"stdout""#, r#""type":"exit""#),
                };
                if line.contains(done) {
                    return Outcome::Answered(200);
                }
                if line.contains(out) {
                    ready.store(true, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return closed(&killed_at),
            Err(_) => return Outcome::Hung,
        }
    }
}

/// Child cgroup names under the instance's slice, per v1 hierarchy (or v2).
fn slice_children(instance: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for root in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        let slice = root.path().join(instance);
        for e in std::fs::read_dir(&slice).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                out.insert(e.path().display().to_string());
            }
        }
    }
    out
}

/// runsc containers in the instance's runsc root.
fn containers(instance: &str) -> BTreeSet<String> {
    let root = format!("/run/isobox/{instance}/runsc");
    let o = std::process::Command::new("runsc")
        .args(["--root", &root, "list", "-quiet"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Live processes whose command line mentions the instance's runsc root: (pid, args).
fn runsc_processes(instance: &str) -> Vec<(u32, String)> {
    let needle = format!("/run/isobox/{instance}/runsc");
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if args.contains(&needle) {
            let state = std::fs::read_to_string(e.path().join("stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(") ")
                        .map(|(_, r)| r.chars().next().unwrap_or('?'))
                })
                .unwrap_or('?');
            out.push((pid, format!("[{state}] {}", args.trim())));
        }
    }
    out
}

/// Loop devices whose backing file is under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/block")
        .into_iter()
        .flatten()
        .flatten()
    {
        let f = e.path().join("loop/backing_file");
        if let Ok(b) = std::fs::read_to_string(&f) {
            if Path::new(b.trim()).starts_with(dir) {
                out.push(format!(
                    "{} -> {}",
                    e.file_name().to_string_lossy(),
                    b.trim()
                ));
            }
        }
    }
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn test_kill_9_with_everything_in_flight_then_restart() {
    let t_test = Instant::now();
    let instance = format!("isobox-rec{}", std::process::id());
    let data_dir: PathBuf = std::env::temp_dir().join(&instance);
    let _ = std::fs::remove_dir_all(&data_dir);
    let listen = format!("127.0.0.1:{}", free_port());
    let env = [
        ("ISOBOX_INSTANCE", instance.as_str()),
        ("ISOBOX_LISTEN", listen.as_str()),
        ("ISOBOX_MAX_CONCURRENT", "4"),
    ];
    let mut d = Daemon::start_with(&env);
    d.wait_ready();
    let addr = d.addr;
    assert_eq!(addr.to_string(), listen);

    // ---- (d) a volume attached to a session; (b) that session's files ----------
    let r = d.post_json("/v1/volumes", &json!({"name": "recovery"}));
    assert_eq!(r.status, 201, "{}", r.text());
    let vid = r.json()["id"].as_str().unwrap().to_string();
    let a = Session::create(&d, &json!({"runtime": "python-slim", "volumeId": vid}));
    let a_files: Vec<(&str, Vec<u8>)> = vec![
        ("data/in.bin", bytes(1, 300_000)),
        ("notes/readme.txt", b"uploaded before the crash\n".to_vec()),
    ];
    for (p, data) in &a_files {
        upload(&d, &a, p, data);
    }
    // A completed step writes the volume and the workspace.
    let run = step_run(
        &d,
        &a,
        "import hashlib\nopen('/memory/note.txt','w').write('written by a completed step')\n\
         open('step1.txt','w').write(hashlib.sha256(open('data/in.bin','rb').read()).hexdigest())\nprint('ok')",
    );
    assert_eq!(
        (run["exitCode"].as_i64(), run["stdout"].as_str()),
        (Some(0), Some("ok\n")),
        "{run}"
    );
    // A second session without a volume, with files only (mounted, idle at the crash).
    let b = Session::create(&d, &json!({"runtime": "python-slim"}));
    let b_file = bytes(2, 1 << 20);
    upload(&d, &b, "big/blob.bin", &b_file);

    // ---- (c) acknowledged KV writes, then a writer that runs into the crash ------
    let acked: Arc<Mutex<Vec<Acked>>> = Arc::new(Mutex::new(Vec::new()));
    for i in 0..50 {
        let v = bytes(100 + i, 10 + (i as usize * 37) % 3000);
        let r = d.request("PUT", &format!("/v1/memory/rec/pre{i}"), &[], &v);
        assert_eq!(r.status, 204);
        let etag = r.header("etag").unwrap().to_string();
        acked.lock().unwrap().push((format!("pre{i}"), v, etag));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (acked, stop) = (Arc::clone(&acked), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("storm{i}");
                let v = bytes(10_000 + i, 1 + (i as usize * 131) % 5000);
                let Ok(mut s) = TcpStream::connect(addr) else {
                    break;
                };
                let req = format!(
                    "PUT /v1/memory/rec/{key} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                    v.len()
                );
                if s.write_all(req.as_bytes())
                    .and_then(|()| s.write_all(&v))
                    .is_err()
                {
                    break;
                }
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                match read_response(&mut BufReader::new(s), false) {
                    Some(r) if r.status == 204 => {
                        let etag = r.header("etag").unwrap().to_string();
                        acked.lock().unwrap().push((key, v, etag));
                    }
                    _ => break,
                }
                i += 1;
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };

    // ---- (a) three long /execute runs (one streamed) and (b) a step mid-write ----
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let mut watchers = Vec::new();
    let long = "import time\nprint('go', flush=True)\ntime.sleep(60)";
    for (i, sse) in [(0, false), (1, false), (2, true)] {
        let body = json!({"language": "python-slim", "network": false, "code": long,
                          "limits": {"wallTimeMs": 20000}})
        .to_string();
        let hdrs: &[(&str, &str)] = if sse {
            &[("Accept", "text/event-stream")]
        } else {
            &[]
        };
        let s = d.send("POST", "/execute", hdrs, body.as_bytes());
        let (k, ready) = (Arc::clone(&killed_at), Arc::new(AtomicBool::new(false)));
        let r2 = Arc::clone(&ready);
        watchers.push((
            format!("execute#{i}{}", if sse { " (SSE)" } else { "" }),
            ready,
            std::thread::spawn(move || watch(s, k, r2, if sse { Stream::Sse } else { Stream::No })),
        ));
    }
    let inflight_code = "import time\nf=open('growing.bin','wb')\nn=0\nwhile True:\n \
                         if n < (24<<20):\n  f.write(b'z'*65536); f.flush(); n += 65536\n \
                         if n == (1<<20): open('/memory/inflight.txt','w').write('maybe')\n \
                         time.sleep(0.005)";
    let body = json!({"code": inflight_code, "network": false, "limits": {"wallTimeMs": 20000}})
        .to_string();
    let s = d.send(
        "POST",
        &format!("/v1/sessions/{}/exec", a.id),
        &[("X-Session-Token", &a.token)],
        body.as_bytes(),
    );
    let (k, ready) = (Arc::clone(&killed_at), Arc::new(AtomicBool::new(false)));
    let r2 = Arc::clone(&ready);
    watchers.push((
        "session step".into(),
        ready,
        std::thread::spawn(move || watch(s, k, r2, Stream::No)),
    ));

    // ---- (e) two long-lived WBX sandboxes, one running a command -------------------
    let mut boxes = Vec::new();
    for _ in 0..2 {
        let r = d.post_json("/wbx/v1/sandboxes", &json!({"timeout_s": 600}));
        assert_eq!(r.status, 201, "{}", r.text());
        boxes.push(r.json()["id"].as_str().unwrap().to_string());
    }
    // The other runs background processes (one with a child of its own, one on a
    // terminal) and is watched: all of it must go with the crash too.
    for body in [
        json!({"cmd": "sleep 600 & sleep 600", "tag": "bg"}),
        json!({"cmd": "exec python3 -i -q", "pty": {"cols": 80, "rows": 24}}),
    ] {
        let r = d.post_json(&format!("/wbx/v1/sandboxes/{}/process", boxes[1]), &body);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let _watching = d.send(
        "GET",
        &format!("/wbx/v1/sandboxes/{}/fs/watch?path=/tmp", boxes[1]),
        &[],
        b"",
    );
    let body = json!({"cmd": "echo go; sleep 600"}).to_string();
    let s = d.send(
        "POST",
        &format!("/wbx/v1/sandboxes/{}/exec/stream", boxes[0]),
        &[],
        body.as_bytes(),
    );
    let (k, ready) = (Arc::clone(&killed_at), Arc::new(AtomicBool::new(false)));
    let r2 = Arc::clone(&ready);
    watchers.push((
        "wbx exec/stream".into(),
        ready,
        std::thread::spawn(move || watch(s, k, r2, Stream::Ndjson)),
    ));

    // Wait until all six sandboxes really run: the SSE run and the WBX command
    // printed, the step is writing (its file grows, seen through the file API), six
    // cgroups exist.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let growing = a.fs(&d, "HEAD", "path=growing.bin", b"");
        let grown: usize = growing
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let cgroups = std::fs::read_dir(Path::new("/sys/fs/cgroup/memory").join(&instance))
            .map(|rd| rd.flatten().filter(|e| e.path().is_dir()).count())
            .unwrap_or(0);
        let streaming = watchers.iter().all(|(_, r, _)| r.load(Ordering::SeqCst));
        if growing.status == 200 && grown >= 1 << 20 && cgroups >= 6 && streaming {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "work never got going: growing {} ({} bytes), {cgroups} cgroups, streaming {streaming}\nlog:\n{}",
            growing.status,
            grown,
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let h = d.get("/healthz").json();
    // The four runs hold execution slots; WBX sandboxes have their own limits.
    assert_eq!(h["inFlight"], 4, "{h}");
    let before = mounts_under(&data_dir);
    assert!(
        before.len() >= 3,
        "A's workspace and volume, B's workspace: {before:?}"
    );

    // ---- kill -9 ----------------------------------------------------------------
    let old_pid = d.pid();
    let old_cgroups = slice_children(&instance);
    let old_containers = containers(&instance);
    let old_procs = runsc_processes(&instance);
    assert_eq!(old_containers.len(), 6, "{old_containers:?}");
    assert!(!old_procs.is_empty());
    let mut child = d.child.take().unwrap();
    *killed_at.lock().unwrap() = Some(Instant::now());
    child.kill().unwrap();
    child.wait().unwrap();
    // Not dropped: the harness's Drop would delete the data dir.
    std::mem::forget(d);
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    // In-flight clients see their connection closed promptly (no runsc process holds
    // a copy of the client sockets).
    for (name, _, w) in watchers {
        match w.join().unwrap() {
            Outcome::Closed(Some(after)) => {
                assert!(
                    after < Duration::from_secs(3),
                    "{name}: closed only {after:?} after the kill"
                )
            }
            other => panic!("{name}: {other:?} instead of a closed connection"),
        }
    }
    // For the record: what the crash left for the sweep. (runsc runs with
    // PDEATHSIG=SIGKILL, so its processes usually die with the daemon; zombies have an
    // empty command line and are not counted.)
    let still = runsc_processes(&instance);
    eprintln!(
        "after kill -9 of {old_pid}: {} cgroups, {} containers, {} of {} runsc processes still running, \
         {} mounts, {} loop devices",
        slice_children(&instance).len(),
        containers(&instance).len(),
        still.len(),
        old_procs.len(),
        mounts_under(&data_dir).len(),
        loops_under(&data_dir).len()
    );

    // ---- restart: same instance, data dir and port --------------------------------
    let t_restart = Instant::now();
    let d = Daemon::start_with(&env);
    assert_eq!(d.addr.to_string(), listen, "the port binds again");
    let swept_in = loop {
        let cg: Vec<_> = slice_children(&instance)
            .intersection(&old_cgroups)
            .cloned()
            .collect();
        let ct: Vec<_> = containers(&instance)
            .intersection(&old_containers)
            .cloned()
            .collect();
        let procs: Vec<_> = runsc_processes(&instance)
            .into_iter()
            .filter(|(p, args)| {
                old_procs.iter().any(|(q, _)| q == p)
                    || args.contains(&format!("{instance}-{old_pid:x}-"))
            })
            .collect();
        // Nothing has used a session since the restart: nothing may be mounted.
        let mounts = mounts_under(&data_dir);
        let loops = loops_under(&data_dir);
        if cg.is_empty()
            && ct.is_empty()
            && procs.is_empty()
            && mounts.is_empty()
            && loops.is_empty()
        {
            break t_restart.elapsed();
        }
        assert!(
            t_restart.elapsed() < Duration::from_secs(10),
            "orphans of the crashed daemon left 10 s after the restart:\n cgroups {cg:?}\n containers {ct:?}\n \
             processes {procs:#?}\n mounts {mounts:?}\n loops {loops:?}\nlog:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    d.wait_ready();
    let ready_in = t_restart.elapsed();
    assert!(
        ready_in < Duration::from_secs(10),
        "ready only after {ready_in:?}"
    );
    assert!(d.log().contains("startup sweep removed"), "{}", d.log());
    // Once the self-probe is gone nothing of any run exists, and no runsc process of the
    // instance runs at all.
    d.assert_clean();
    let procs = runsc_processes(&instance);
    assert!(
        procs.is_empty(),
        "runsc processes of the instance: {procs:#?}"
    );
    eprintln!("restart: orphans gone after {swept_in:?}, ready after {ready_in:?}");

    // ---- what must have survived -----------------------------------------------
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 55,
        "the storm was acknowledged only {} times",
        acked.len()
    );
    for (key, v, etag) in &acked {
        let r = d.get(&format!("/v1/memory/rec/{key}"));
        assert_eq!(r.status, 200, "{key} lost");
        assert!(r.body == *v, "{key}: value differs");
        assert_eq!(r.header("etag"), Some(etag.as_str()), "{key}: ETag");
    }
    // Sessions: the token works, uploads are byte-exact, a new step sees them and what
    // the completed step wrote (workspace and volume).
    for (p, data) in &a_files {
        let r = a.fs(&d, "GET", &format!("path={p}"), b"");
        assert_eq!(r.status, 200, "{p}: {}", r.text());
        assert!(r.body == *data, "{p}: {} bytes, differs", r.body.len());
    }
    let r = b.fs(&d, "GET", "path=big/blob.bin", b"");
    assert_eq!(r.status, 200);
    assert!(r.body == b_file, "B's upload differs");
    let r = a.fs(&d, "GET", "path=x", b"");
    assert_eq!(r.status, 404, "token accepted, file absent: {}", r.text());
    let r = d.request(
        "GET",
        &format!("/v1/sessions/{}/fs?path=", a.id),
        &[("X-Session-Token", "wrong")],
        b"",
    );
    assert_eq!(r.status, 401, "a wrong token is still refused");
    let run = step_run(
        &d,
        &a,
        "import hashlib\nh=hashlib.sha256(open('data/in.bin','rb').read()).hexdigest()\n\
         print(h==open('step1.txt').read(), h)\nprint(open('notes/readme.txt').read(), end='')\n\
         print(open('/memory/note.txt').read())",
    );
    assert_eq!(run["exitCode"], 0, "{run}");
    assert_eq!(
        run["stdout"],
        format!(
            "True {}\nuploaded before the crash\nwritten by a completed step\n",
            sha256_hex(&a_files[0].1)
        ),
        "{run}"
    );
    let run = step_run(&d, &b, "import os\nprint(os.path.getsize('big/blob.bin'))");
    assert_eq!(run["stdout"], format!("{}\n", b_file.len()), "{run}");
    // Long-lived sandboxes die with the daemon (README): their ids are gone, not
    // half-alive, and a new one starts.
    for id in &boxes {
        let r = d.get(&format!("/wbx/v1/sandboxes/{id}"));
        assert_eq!(r.status, 404, "{id}: {}", r.text());
        assert_eq!(r.json(), json!({"error": "sandbox not found"}));
    }
    let r = d.get("/wbx/v1/sandboxes");
    assert_eq!(r.json(), json!({"sandboxes": []}), "{}", r.text());
    // The volume is still held by A: not attachable elsewhere, not deletable.
    let v = d.get(&format!("/v1/volumes/{vid}")).json();
    assert_eq!(v["attachedSession"], a.id.as_str(), "{v}");
    let r = d.post_json(
        "/v1/sessions",
        &json!({"runtime": "python-slim", "volumeId": vid}),
    );
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (409, Some("volume_busy"))
    );
    assert_eq!(
        d.request("DELETE", &format!("/v1/volumes/{vid}"), &[], b"")
            .status,
        409
    );

    // ---- tidy up: end the sessions, release and delete the volume ---------------
    assert_eq!(a.delete(&d).status, 204);
    assert_eq!(b.delete(&d).status, 204);
    assert_eq!(
        d.get(&format!("/v1/volumes/{vid}")).json()["attachedSession"],
        Value::Null
    );
    assert_eq!(
        d.request("DELETE", &format!("/v1/volumes/{vid}"), &[], b"")
            .status,
        204
    );
    let r = d.post_json("/wbx/v1/sandboxes", &json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let r = d.post_json(
        &format!("/wbx/v1/sandboxes/{id}/exec"),
        &json!({"cmd": "echo after"}),
    );
    assert_eq!(r.json()["stdout"], "after\n", "{}", r.text());
    let r = d.request("DELETE", &format!("/wbx/v1/sandboxes/{id}"), &[], b"");
    assert_eq!(r.status, 204);
    d.assert_clean();
    assert!(
        mounts_under(&data_dir).is_empty(),
        "{:?}",
        mounts_under(&data_dir)
    );
    eprintln!("total {:?}", t_test.elapsed());
    d.stop();
}
