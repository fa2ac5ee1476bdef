//! WebAssembly jobs (`"runtime": "wasi"` in the WBX document's "WebAssembly jobs"),
//! against the real daemon: the module runs in `isobox-wasm` jailed for the job, with
//! real cgroups, the job queue in LMDB, and its `/output` saved as result files. The
//! modules are real WASI preview 1 commands, assembled here from WebAssembly text
//! (`wat`, wasmtime's own assembler) and calling WASI themselves.

mod common;
use base64::Engine as _;
use common::wbx::*;
use common::{sha256_hex, Daemon};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Imports and helpers: `$write (fd, ptr, len)` (iovec at 1000), `$digit n` prints
/// '0' + n, `$open (dirfd, path, len, oflags, rights) -> fd` (prints nothing; the fd
/// is 0 when refused), `$read (fd, ptr, max) -> n`.
const PRELUDE: &str = r#"
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $environ_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $environ_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_create_directory" (func $mkdir (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func $write (param $fd i32) (param $ptr i32) (param $len i32)
    (i32.store (i32.const 1000) (local.get $ptr))
    (i32.store (i32.const 1004) (local.get $len))
    (drop (call $fd_write (local.get $fd) (i32.const 1000) (i32.const 1) (i32.const 1008))))
  (func $digit (param $n i32)
    (i32.store8 (i32.const 1020) (i32.add (i32.const 48) (local.get $n)))
    (call $write (i32.const 1) (i32.const 1020) (i32.const 1)))
  (func $open (param $dir i32) (param $path i32) (param $len i32) (param $oflags i32) (param $rights i64) (result i32)
    (i32.store (i32.const 1100) (i32.const 0))
    (drop (call $path_open (local.get $dir) (i32.const 0) (local.get $path) (local.get $len)
      (local.get $oflags) (local.get $rights) (i64.const 0) (i32.const 0) (i32.const 1100)))
    (i32.load (i32.const 1100)))
  (func $read (param $fd i32) (param $ptr i32) (param $max i32) (result i32)
    (i32.store (i32.const 1200) (local.get $ptr))
    (i32.store (i32.const 1204) (local.get $max))
    (i32.store (i32.const 1208) (i32.const 0))
    (drop (call $fd_read (local.get $fd) (i32.const 1200) (i32.const 1) (i32.const 1208)))
    (i32.load (i32.const 1208)))
"#;

fn wasm(body: &str) -> Vec<u8> {
    let text = format!("(module {PRELUDE} {body})");
    wat::parse_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Prints "hello", its argv and environ; copies stdin into /output/out.txt and
/// /output/sub/copy.txt (fd 3 = /output, fd 4 = /tmp), writes /tmp/t (printing 1 when
/// it could), says "bye" on stderr, exits 0.
fn report_module() -> Vec<u8> {
    wasm(
        r#"
        (data (i32.const 100) "hello\n")
        (data (i32.const 120) "out.txt")
        (data (i32.const 140) "bye\n")
        (data (i32.const 160) "t")
        (data (i32.const 180) "sub")
        (data (i32.const 200) "sub/copy.txt")
        (func (export "_start")
          (local $n i32) (local $fd i32)
          (call $write (i32.const 1) (i32.const 100) (i32.const 6))
          (drop (call $args_sizes_get (i32.const 2000) (i32.const 2004)))
          (drop (call $args_get (i32.const 2100) (i32.const 3000)))
          (call $write (i32.const 1) (i32.const 3000) (i32.load (i32.const 2004)))
          (drop (call $environ_sizes_get (i32.const 2000) (i32.const 2004)))
          (drop (call $environ_get (i32.const 2100) (i32.const 4000)))
          (call $write (i32.const 1) (i32.const 4000) (i32.load (i32.const 2004)))
          (local.set $n (call $read (i32.const 0) (i32.const 8000) (i32.const 4000)))
          (local.set $fd (call $open (i32.const 3) (i32.const 120) (i32.const 7) (i32.const 1) (i64.const 64)))
          (call $write (local.get $fd) (i32.const 8000) (local.get $n))
          (drop (call $mkdir (i32.const 3) (i32.const 180) (i32.const 3)))
          (local.set $fd (call $open (i32.const 3) (i32.const 200) (i32.const 12) (i32.const 1) (i64.const 64)))
          (call $write (local.get $fd) (i32.const 8000) (local.get $n))
          (call $digit (i32.ne (call $open (i32.const 4) (i32.const 160) (i32.const 1) (i32.const 1) (i64.const 64)) (i32.const 0)))
          (call $write (i32.const 2) (i32.const 140) (i32.const 4)))
        "#,
    )
}

fn submit_raw(d: &Daemon, body: &Value) -> common::Resp {
    wbx(d, "POST", "/v1/jobs", None, Some(body))
}

/// Nothing of a run is left (a sandbox job's sandbox goes a moment after its end).
fn leftovers(d: &Daemon) {
    let runs = d.data_dir.join("runs");
    let t0 = Instant::now();
    loop {
        let left: Vec<_> = std::fs::read_dir(&runs)
            .map(|r| r.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        if left.is_empty() {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "left in runs/: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(d.data_dir.to_str().unwrap()),
        "a mount left under the data dir"
    );
}

#[test]
fn test_a_webassembly_job_runs_its_module_and_saves_its_output() {
    let d = Daemon::start_with(&[]);
    d.wait_ready();
    // The runtimes, with what each can do.
    let r = wbx(&d, "GET", "/v1/runtimes", None, None);
    assert_eq!(r.status, 200, "{}", r.text());
    let rt = r.json();
    let names: Vec<&str> = rt["runtimes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["sandbox", "wasi"]);
    let w = &rt["runtimes"][1];
    assert_eq!(
        (w["isolation"].as_str(), w["available"].as_bool()),
        (Some("wasm-process"), Some(true))
    );
    assert_eq!(w["capabilities"]["network"], json!(["none"]));
    assert_eq!(w["capabilities"]["max_module_bytes"], 8_000_000);
    assert_eq!(rt["runtimes"][0]["default"], true);

    let module = report_module();
    let secret = "sekret-value-42";
    let body = json!({
        "runtime": "wasi",
        "timeout_s": 60,
        "artifacts": ["output/"],
        "required_artifacts": ["output/out.txt"],
        "env": {"TOKEN": secret},
        "wasm": {"module_b64": b64(&module), "args": ["--fast", "x y"], "memory_mb": 32,
                 "stdin_b64": b64(b"the stdin\n")},
    });
    let r = submit_raw(&d, &body);
    assert_eq!(r.status, 202, "{}", r.text());
    let job = r.json();
    assert_eq!(job["runtime"], "wasi");
    assert_eq!(
        job["wasm"],
        json!({"module_sha256": sha256_hex(&module), "module_bytes": module.len(), "module": null,
               "args": ["--fast", "x y"], "memory_mb": 32, "stdin_bytes": 10})
    );
    assert_eq!(job["network"], "none");
    assert!(!r.text().contains(secret));
    let id = job["id"].as_str().unwrap().to_string();
    let v = finished(&d, None, &id, Duration::from_secs(60));
    assert_eq!(
        (v["status"].as_str(), v["exit_code"].as_i64()),
        (Some("completed"), Some(0)),
        "{v}\n{}",
        d.log_tail()
    );
    assert_eq!(
        names_of(&v),
        ["output/out.txt", "output/sub/copy.txt"],
        "{v}"
    );
    for f in v["result_files"].as_array().unwrap() {
        assert_eq!(f["size"], 10);
        assert_eq!(f["sha256"], sha256_hex(b"the stdin\n"));
    }
    let a = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{id}/artifacts/output/sub/copy.txt"),
        None,
        None,
    );
    assert_eq!((a.status, a.body.as_slice()), (200, &b"the stdin\n"[..]));
    // Its output in the log, the env value redacted; /tmp was writable (the 1).
    let log = wbx(&d, "GET", &format!("/v1/jobs/{id}/logs"), None, None).text();
    // stdout and stderr in the order the module wrote them.
    assert_eq!(
        log,
        "hello\nmain.wasm\0--fast\0x y\0TOKEN=[REDACTED]\x001bye\n"
    );
    assert!(!log.contains(secret));
    // The receipt says what ran where.
    let rc = wbx(&d, "GET", &format!("/v1/jobs/{id}/receipt"), None, None).json();
    assert_eq!(
        rc["runtime"],
        json!({"kind": "wasi", "isolation": "wasm-process", "vcpu": 1, "mem_mb": 32}),
        "{rc}"
    );
    assert_eq!(rc["inputs"]["wasm"]["module_sha256"], sha256_hex(&module));
    assert_eq!(rc["peak_memory_bytes"], 65536, "one page: {rc}");
    assert_eq!(rc["exit_code"], 0);
    assert_eq!(rc["log"]["sha256"], sha256_hex(log.as_bytes()));

    // The same module and input: the same output, byte for byte (its clocks and
    // random numbers are its own).
    let again = finished(
        &d,
        None,
        submit(&d, None, &body)["id"].as_str().unwrap(),
        Duration::from_secs(60),
    );
    let log2 = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/logs", again["id"].as_str().unwrap()),
        None,
        None,
    )
    .text();
    assert_eq!(log2, log);

    // A retry runs the same module (its env sent again).
    let r = wbx(
        &d,
        "POST",
        &format!("/v1/jobs/{id}/retry"),
        None,
        Some(&json!({"env": {"TOKEN": "other"}})),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let rid = r.json()["id"].as_str().unwrap().to_string();
    let rv = finished(&d, None, &rid, Duration::from_secs(60));
    assert_eq!(rv["status"], "completed", "{rv}");
    assert_eq!(rv["wasm"]["module_sha256"], sha256_hex(&module));
    let rlog = wbx(&d, "GET", &format!("/v1/jobs/{rid}/logs"), None, None).text();
    assert!(rlog.contains("TOKEN=[REDACTED]"), "{rlog:?}");
    leftovers(&d);
    d.stop();
}

fn names_of(v: &Value) -> Vec<String> {
    names(&v["result_files"])
}

#[test]
fn test_webassembly_jobs_at_and_past_their_limits_and_bad_input() {
    let d = Daemon::start_with(&[("ISOBOX_WBX_JOBS_RUNNING", "4")]);
    d.wait_ready();
    let ok = wasm(r#"(func (export "_start"))"#);
    let base = |w: Value| json!({"runtime": "wasi", "timeout_s": 30, "wasm": w});
    let refused = |body: Value, says: &str| {
        let r = submit_raw(&d, &body);
        assert_eq!(r.status, 400, "{body:.200}: {}", r.text());
        let msg = r.json()["error"].as_str().unwrap().to_string();
        assert!(msg.contains(says), "{msg} (expected {says:?})");
    };
    refused(
        json!({"runtime": "wasm", "command": "x"}),
        "runtime: \"wasm\" is not a runtime",
    );
    refused(json!({"runtime": "wasi"}), "wasm: required");
    refused(
        json!({"command": "x", "wasm": {"module_b64": b64(&ok)}}),
        "wasm: only with",
    );
    refused(
        json!({"runtime": "wasi", "command": "echo", "wasm": {"module_b64": b64(&ok)}}),
        "command: a WebAssembly job runs its module",
    );
    refused(
        json!({"runtime": "wasi", "template": "base", "wasm": {"module_b64": b64(&ok)}}),
        "template",
    );
    refused(
        json!({"runtime": "wasi", "network": {"mode": "full"}, "wasm": {"module_b64": b64(&ok)}}),
        "network: a WebAssembly job has no network",
    );
    refused(
        base(json!({"module_b64": b64(b"#!/bin/sh\necho")})),
        "not a WebAssembly module",
    );
    refused(
        base(json!({"module_b64": b64(b"\0asm\x0d\0\x01\0")})),
        "a WASI preview 1 core module",
    );
    refused(base(json!({"module_b64": "!!!"})), "not valid base64");
    refused(
        base(json!({"module_b64": b64(&ok), "frobnicate": 1})),
        "unknown field `frobnicate`",
    );
    refused(
        base(json!({"module": "tool.wasm"})),
        "is not one of this job's inputs",
    );
    refused(
        base(json!({"module_b64": b64(&ok), "module": "x"})),
        "not both",
    );
    refused(
        base(json!({"module_b64": b64(&ok), "args": [1]})),
        "wasm.args",
    );
    let big_env: serde_json::Map<String, Value> = (0..10)
        .map(|i| (format!("V{i}"), json!("x".repeat(30_000))))
        .collect();
    let mut b = base(json!({"module_b64": b64(&ok)}));
    b["env"] = Value::Object(big_env);
    refused(b, "a WebAssembly job's env may be 262144 bytes in all");
    // memory_mb 16–1024, timeout_s up to 600, stdin up to 4 MB, module up to 8 MB.
    for (mb, good) in [(15, false), (16, true), (1024, true), (1025, false)] {
        let r = submit_raw(&d, &base(json!({"module_b64": b64(&ok), "memory_mb": mb})));
        assert_eq!(r.status == 202, good, "memory_mb {mb}: {}", r.text());
    }
    for (t, good) in [(600, true), (601, false)] {
        let r = submit_raw(
            &d,
            &json!({"runtime": "wasi", "timeout_s": t, "wasm": {"module_b64": b64(&ok)}}),
        );
        assert_eq!(r.status == 202, good, "timeout_s {t}: {}", r.text());
    }
    for (n, good) in [(4_000_000usize, true), (4_000_001, false)] {
        let r = submit_raw(
            &d,
            &base(json!({"module_b64": b64(&ok), "stdin_b64": b64(&vec![b'x'; n])})),
        );
        assert_eq!(
            r.status == 202,
            good,
            "stdin of {n}: {}",
            &r.text()[..r.text().len().min(300)]
        );
    }
    // A module of exactly 8,000,000 bytes (a custom section pads it), and one more.
    let padded = |total: usize| {
        let mut m = ok.clone();
        // section id 0, size as 4-byte LEB128, name length 1, name "p", then padding.
        let payload = total - m.len() - 1 - 4;
        let mut s = vec![0u8];
        let n = payload as u32;
        s.extend([
            (n & 0x7f) as u8 | 0x80,
            ((n >> 7) & 0x7f) as u8 | 0x80,
            ((n >> 14) & 0x7f) as u8 | 0x80,
            ((n >> 21) & 0x7f) as u8,
        ]);
        s.push(1);
        s.push(b'p');
        s.resize(s.len() + payload - 2, 0);
        m.extend(s);
        assert_eq!(m.len(), total);
        m
    };
    let big = padded(8_000_000);
    let r = submit_raw(&d, &base(json!({"module_b64": b64(&big)})));
    assert_eq!(r.status, 202, "{}", r.text());
    let big_id = r.json()["id"].as_str().unwrap().to_string();
    refused(
        base(json!({"module_b64": b64(&padded(8_000_001))})),
        "at most 8000000 bytes",
    );
    let v = finished(&d, None, &big_id, Duration::from_secs(120));
    assert_eq!(v["status"], "completed", "the 8 MB module runs: {v}");

    // How modules end: an exit code, a trap, no _start, a time limit, memory.
    let run = |module: &[u8], extra: Value| -> Value {
        let mut body = base(json!({"module_b64": b64(module), "memory_mb": 16}));
        if let Value::Object(m) = extra {
            for (k, v) in m {
                body[k] = v;
            }
        }
        let id = submit(&d, None, &body)["id"].as_str().unwrap().to_string();
        finished(&d, None, &id, Duration::from_secs(60))
    };
    let v = run(
        &wasm(r#"(func (export "_start") (call $proc_exit (i32.const 3)))"#),
        json!({}),
    );
    assert_eq!(
        (v["status"].as_str(), v["exit_code"].as_i64()),
        (Some("failed"), Some(3)),
        "{v}"
    );
    assert_eq!(v["error"]["code"], "nonzero_exit");
    let v = run(&wasm(r#"(func (export "_start") unreachable)"#), json!({}));
    assert_eq!(
        (v["status"].as_str(), v["exit_code"].as_i64()),
        (Some("failed"), Some(134)),
        "{v}"
    );
    assert_eq!(v["error"]["code"], "nonzero_exit");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("trapped"),
        "{v}"
    );
    let v = run(&wasm(r#"(func (export "not_start"))"#), json!({}));
    assert_eq!(v["status"], "failed", "{v}");
    assert_eq!(
        (v["error"]["code"].as_str(), v["error"]["kind"].as_str()),
        (Some("start_failed"), Some("job")),
        "{v}"
    );
    let t0 = Instant::now();
    let v = run(
        &wasm(r#"(func (export "_start") (loop $l (br $l)))"#),
        json!({"timeout_s": 2}),
    );
    assert_eq!(v["status"], "expired", "{v}");
    assert_eq!(v["error"]["code"], "timeout");
    assert!(t0.elapsed() < Duration::from_secs(30));
    // 16 MiB: a grow to 256 pages works, one more does not (the module sees -1).
    let v = run(
        &wasm(
            r#"(func (export "_start")
                 (call $digit (i32.ne (memory.grow (i32.const 255)) (i32.const -1)))
                 (call $digit (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))"#,
        ),
        json!({}),
    );
    let log = wbx(
        &d,
        "GET",
        &format!("/v1/jobs/{}/logs", v["id"].as_str().unwrap()),
        None,
        None,
    )
    .text();
    assert_eq!(
        (v["status"].as_str(), log.as_str()),
        (Some("completed"), "10"),
        "{v}"
    );

    // Output past its limits: 65 files, 64 saved, the 65th skipped.
    let v = run(
        &wasm(
            r#"(func (export "_start")
                 (local $i i32) (local $fd i32)
                 (loop $l
                   (i32.store8 (i32.const 100) (i32.const 102))
                   (i32.store8 (i32.const 101) (i32.add (i32.const 48) (i32.div_u (local.get $i) (i32.const 10))))
                   (i32.store8 (i32.const 102) (i32.add (i32.const 48) (i32.rem_u (local.get $i) (i32.const 10))))
                   (local.set $fd (call $open (i32.const 3) (i32.const 100) (i32.const 3) (i32.const 1) (i64.const 64)))
                   (call $write (local.get $fd) (i32.const 101) (i32.const 2))
                   (drop (call $fd_close (local.get $fd)))
                   (local.set $i (i32.add (local.get $i) (i32.const 1)))
                   (br_if $l (i32.lt_u (local.get $i) (i32.const 65)))))"#,
        ),
        json!({}),
    );
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["result_files"].as_array().unwrap().len(), 64, "{v}");
    assert_eq!(v["skipped_files"][0]["name"], "output/f64", "{v}");
    assert!(v["skipped_files"][0]["reason"]
        .as_str()
        .unwrap()
        .contains("64 result files"));

    // Two at once: each its own uid, and a run directory only that uid's group may
    // enter. Then cancelled while they run: killed at once.
    let spin = wasm(r#"(func (export "_start") (loop $l (br $l)))"#);
    let other = submit(&d, None, &base(json!({"module_b64": b64(&spin)})))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let id = submit(&d, None, &base(json!({"module_b64": b64(&spin)})))["id"]
        .as_str()
        .unwrap()
        .to_string();
    until_status(&d, None, &id, "running");
    until_status(&d, None, &other, "running");
    let t0 = Instant::now();
    let uids = loop {
        let mut uids = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(cg) = std::fs::read_to_string(e.path().join("cgroup")) else {
                continue;
            };
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if cg.contains(&d.instance) && String::from_utf8_lossy(&cmd).contains("wasi\0--module")
            {
                let st = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
                let uid = st
                    .lines()
                    .find(|l| l.starts_with("Uid:"))
                    .unwrap_or("")
                    .to_string();
                uids.push(uid);
            }
        }
        if uids.len() == 2 || t0.elapsed() > Duration::from_secs(10) {
            break uids;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(uids.len(), 2, "{uids:?}");
    assert_ne!(uids[0], uids[1], "each run its own uid");
    // Each sees only its own files: its module and stdin read-only, its /output and
    // /tmp writable; nothing else of its run directory, of another job's, or of the
    // daemon's data.
    let jailed = common::instance_processes_with(&d.instance, "isobox-wasm wasi --module");
    assert_eq!(jailed.len(), 2, "{jailed:?}");
    for pid in jailed {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let module = &args[args.iter().position(|a| a == "--module").unwrap() + 1];
        let dir = std::path::Path::new(module)
            .parent()
            .unwrap()
            .display()
            .to_string();
        common::assert_jailed_mounts(
            pid,
            &[
                (format!("{dir}/module.wasm"), "ro,nosuid,nodev,noexec"),
                (format!("{dir}/stdin"), "ro,nosuid,nodev,noexec"),
                (format!("{dir}/fs/output"), "rw,nosuid,nodev,noexec"),
                (format!("{dir}/fs/tmp"), "rw,nosuid,nodev,noexec"),
            ],
        );
    }
    for e in std::fs::read_dir(d.data_dir.join("runs"))
        .unwrap()
        .flatten()
    {
        use std::os::unix::fs::MetadataExt;
        let md = e.metadata().unwrap();
        assert_eq!((md.mode() & 0o7777, md.uid()), (0o710, 0), "{:?}", e.path());
        assert!(
            (65000..65500).contains(&md.gid()),
            "{:?} gid {}",
            e.path(),
            md.gid()
        );
    }
    let r = wbx(&d, "POST", &format!("/v1/jobs/{other}/cancel"), None, None);
    assert_eq!(r.status, 200, "{}", r.text());
    let t0 = Instant::now();
    let r = wbx(&d, "POST", &format!("/v1/jobs/{id}/cancel"), None, None);
    assert!(r.status == 200 || r.status == 202, "{}", r.text());
    let v = finished(&d, None, &id, Duration::from_secs(30));
    assert_eq!(v["status"], "cancelled", "{v}");
    assert!(t0.elapsed() < Duration::from_secs(10));

    // A batch's jobs run in sandboxes here.
    let r = wbx(
        &d,
        "POST",
        "/v1/batches",
        None,
        Some(&json!({"jobs": [{"runtime": "wasi", "wasm": {"module_b64": b64(&ok)}}]})),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("submit a WebAssembly job on its own"),
        "{}",
        r.text()
    );
    assert_eq!(d.get("/healthz").status, 200);
    leftovers(&d);
    d.stop();
}

/// A module given as an input: another job's result file, seen at /input read-only.
#[test]
fn test_a_module_from_an_earlier_jobs_result_file() {
    let d = Daemon::start_with(&[]);
    d.wait_ready();
    let tool = wasm(
        r#"
        (data (i32.const 100) "from input\n")
        (data (i32.const 120) "data.txt")
        (data (i32.const 140) "new.txt")
        (func (export "_start")
          (local $fd i32) (local $n i32)
          (call $write (i32.const 1) (i32.const 100) (i32.const 11))
          ;; fd 5 = /input: read data.txt, refused a new file there
          (local.set $fd (call $open (i32.const 5) (i32.const 120) (i32.const 8) (i32.const 0) (i64.const 2)))
          (local.set $n (call $read (local.get $fd) (i32.const 8000) (i32.const 100)))
          (call $write (i32.const 1) (i32.const 8000) (local.get $n))
          (call $digit (i32.eq (call $open (i32.const 5) (i32.const 140) (i32.const 7) (i32.const 1) (i64.const 64)) (i32.const 0))))
        "#,
    );
    let make = submit(
        &d,
        None,
        &json!({"command": format!("mkdir -p output && echo {} | base64 -d > output/tool.wasm && echo payload > output/data.txt", b64(&tool)),
                "network": {"mode": "none"}, "timeout_s": 60, "artifacts": ["output/"]}),
    );
    let mid = make["id"].as_str().unwrap().to_string();
    let v = finished(&d, None, &mid, Duration::from_secs(120));
    assert_eq!(v["status"], "completed", "{v}");
    let r = submit_raw(
        &d,
        &json!({"runtime": "wasi", "timeout_s": 30,
                "inputs": [{"job_id": mid, "name": "output/tool.wasm"}, {"job_id": mid, "name": "output/data.txt"}],
                "wasm": {"module": "tool.wasm"}}),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let v = finished(&d, None, &id, Duration::from_secs(60));
    assert_eq!(v["status"], "completed", "{v}\n{}", d.log_tail());
    assert_eq!(v["wasm"]["module"], "tool.wasm");
    let log = wbx(&d, "GET", &format!("/v1/jobs/{id}/logs"), None, None).text();
    assert_eq!(log, "from input\npayload\n1");
    // An input that is not a module fails as the job's own fault.
    let r = submit_raw(
        &d,
        &json!({"runtime": "wasi", "inputs": [{"job_id": mid, "name": "output/data.txt"}],
                "wasm": {"module": "data.txt"}}),
    );
    let v = finished(
        &d,
        None,
        r.json()["id"].as_str().unwrap(),
        Duration::from_secs(60),
    );
    assert_eq!(
        (
            v["status"].as_str(),
            v["error"]["code"].as_str(),
            v["error"]["kind"].as_str()
        ),
        (Some("failed"), Some("start_failed"), Some("job")),
        "{v}"
    );
    leftovers(&d);
    d.stop();
}

/// The daemon killed mid-run: the job is recovered at the next start (as a job whose
/// sandbox died is) and the run's directory, mount and cgroup are swept.
#[test]
fn test_a_kill_9_mid_webassembly_job() {
    let instance = format!("isobox-wasik{}", std::process::id());
    let env = [("ISOBOX_INSTANCE", instance.as_str())];
    let mut d = Daemon::start_with(&env);
    d.wait_ready();
    let spin = wasm(r#"(func (export "_start") (loop $l (br $l)))"#);
    let quick = wasm(
        r#"(data (i32.const 100) "done\n") (func (export "_start") (call $write (i32.const 1) (i32.const 100) (i32.const 5)))"#,
    );
    let lost = submit(
        &d,
        None,
        &json!({"runtime": "wasi", "timeout_s": 600, "wasm": {"module_b64": b64(&spin)}}),
    );
    let lid = lost["id"].as_str().unwrap().to_string();
    until_status(&d, None, &lid, "running");
    std::thread::sleep(Duration::from_millis(300));
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    // The worker dies with its daemon.
    let t0 = Instant::now();
    loop {
        let ps = std::process::Command::new("pgrep")
            .args(["-f", "isobox-wasm wasi"])
            .output()
            .unwrap();
        let mine = String::from_utf8_lossy(&ps.stdout).lines().any(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.contains(&instance))
        });
        if !mine {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "its worker outlived the daemon"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let d2 = Daemon::start_with(&env);
    d2.wait_ready();
    let l = finished(&d2, None, &lid, Duration::from_secs(60));
    assert_eq!(
        (
            l["status"].as_str(),
            l["error"]["code"].as_str(),
            l["error"]["kind"].as_str()
        ),
        (Some("failed"), Some("sandbox_lost"), Some("system")),
        "{l}"
    );
    let q = submit(
        &d2,
        None,
        &json!({"runtime": "wasi", "wasm": {"module_b64": b64(&quick)}}),
    );
    let q = finished(
        &d2,
        None,
        q["id"].as_str().unwrap(),
        Duration::from_secs(60),
    );
    assert_eq!(q["status"], "completed", "{q}");
    leftovers(&d2);
    d2.assert_clean();
    d2.stop();
    drop(d);
}

/// Job bodies may be 17 MiB (a module in base64), held whole until parsed: all large
/// bodies being read at once are bounded together (72 MiB of caps: four 17 MiB job
/// bodies), so slow senders cannot pin the daemon's memory. The fifth is refused at its
/// head with 503 and `Retry-After: 1`; once one ends, a new one is read.
#[test]
fn test_large_bodies_being_read_are_bounded_together() {
    use std::io::Write as _;
    let d = Daemon::start_with(&[]);
    d.wait_ready();
    let head = |len: usize| {
        format!("POST /wbx/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n")
    };
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut s = d.connect();
        s.write_all(head(17_000_000).as_bytes()).unwrap();
        s.write_all(b"{\"runtime\": \"wasi\", ").unwrap();
        slow.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut fifth = d.connect();
    fifth.write_all(head(17_000_000).as_bytes()).unwrap();
    let r = common::read_response(&mut std::io::BufReader::new(&mut fifth), false).unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({"error": "the server is receiving too many large request bodies at once; retry in a second"})
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    // Small routes are not held back by it.
    assert_eq!(d.get("/healthz").status, 200);
    // One of them goes: a new large body is read again.
    drop(slow.pop());
    std::thread::sleep(Duration::from_millis(300));
    let body = json!({"runtime": "wasi", "wasm": {"module_b64": "AGFzbQEAAAA="}}).to_string();
    let mut s = d.connect();
    s.write_all(head(body.len()).as_bytes()).unwrap();
    s.write_all(body.as_bytes()).unwrap();
    let r = common::read_response(&mut std::io::BufReader::new(&mut s), false).unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    drop(slow);
    d.stop();
}
