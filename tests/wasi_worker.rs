//! `isobox-wasm wasi`: one WASI preview 1 command module, run by the real worker binary
//! as the daemon will start it for a WebAssembly job. The modules are assembled from
//! WebAssembly text here (`wat`, the assembler wasmtime uses) and call WASI themselves:
//! what they print is what the worker gave them.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

fn worker() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_isoboxd")).with_file_name("isobox-wasm")
}

/// A scratch directory of this test's own.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("isobox-wasi-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The imports and a `$write (fd, ptr, len)` helper every module here uses; iovec at
/// 1000, `nwritten` at 1008.
const PRELUDE: &str = r#"
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $environ_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $environ_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock_time_get (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open" (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_symlink" (func $path_symlink (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func $write (param $fd i32) (param $ptr i32) (param $len i32)
    (i32.store (i32.const 1000) (local.get $ptr))
    (i32.store (i32.const 1004) (local.get $len))
    (drop (call $fd_write (local.get $fd) (i32.const 1000) (i32.const 1) (i32.const 1008))))
  ;; one byte: '0' + n (an errno or a flag, readable in the output)
  (func $digit (param $n i32)
    (i32.store8 (i32.const 1020) (i32.add (i32.const 48) (local.get $n)))
    (call $write (i32.const 1) (i32.const 1020) (i32.const 1)))
"#;

fn module(dir: &Path, body: &str) -> PathBuf {
    let text = format!("(module {PRELUDE} {body})");
    let bytes = wat::parse_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let p = dir.join("main.wasm");
    std::fs::write(&p, bytes).unwrap();
    p
}

struct Out {
    code: i32,
    stdout: Vec<u8>,
    /// stderr without the worker's last line
    stderr: String,
    /// the worker's last line: how the module ended
    ended: Value,
}

fn run(module: &Path, args: &[&str]) -> Out {
    let out = Command::new(worker())
        .arg("wasi")
        .arg("--module")
        .arg(module)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let (before, last) = match err.trim_end().rsplit_once('\n') {
        Some((b, l)) => (b.to_string(), l.to_string()),
        None => (String::new(), err.trim_end().to_string()),
    };
    let ended: Value =
        serde_json::from_str(&last).unwrap_or_else(|e| panic!("{e}: last stderr line {last:?}"));
    Out {
        code: out.status.code().unwrap(),
        stdout: out.stdout,
        stderr: before,
        ended,
    }
}

#[test]
fn test_a_module_gets_its_arguments_and_environment_and_its_exit_code_is_kept() {
    let d = scratch("args");
    let m = module(
        &d,
        r#"
        (data (i32.const 0) "hello\n")
        (data (i32.const 16) "bye\n")
        (func (export "_start")
          (call $write (i32.const 1) (i32.const 0) (i32.const 6))
          (drop (call $args_sizes_get (i32.const 2000) (i32.const 2004)))
          (drop (call $args_get (i32.const 2100) (i32.const 3000)))
          (call $write (i32.const 1) (i32.const 3000) (i32.load (i32.const 2004)))
          (drop (call $environ_sizes_get (i32.const 2000) (i32.const 2004)))
          (drop (call $environ_get (i32.const 2100) (i32.const 4000)))
          (call $write (i32.const 1) (i32.const 4000) (i32.load (i32.const 2004)))
          (call $write (i32.const 2) (i32.const 16) (i32.const 4))
          (call $proc_exit (i32.const 3)))
        "#,
    );
    let o = run(
        &m,
        &[
            "--memory-mb",
            "16",
            "--arg",
            "--fast",
            "--arg",
            "x y",
            "--env",
            "A=b=c",
        ],
    );
    assert_eq!(
        o.stdout, b"hello\nmain.wasm\0--fast\0x y\0A=b=c\0",
        "argv[0] is main.wasm, then the job's args; the env as given"
    );
    assert_eq!(o.stderr, "bye");
    assert_eq!(o.code, 3);
    assert_eq!(o.ended["exit_code"], 3);
    assert_eq!(o.ended["trap"], Value::Null);
    assert_eq!(o.ended["peak_memory_bytes"], 65536, "one page");
    assert!(o.ended["run_ms"].as_u64().is_some());
    // Returning from _start is exit 0.
    let m = module(&d, r#"(func (export "_start"))"#);
    let o = run(&m, &["--memory-mb", "16"]);
    assert_eq!((o.code, o.ended["exit_code"].as_i64()), (0, Some(0)));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn test_a_trap_and_what_cannot_start_are_told_apart() {
    let d = scratch("trap");
    let m = module(&d, r#"(func (export "_start") unreachable)"#);
    let o = run(&m, &["--memory-mb", "16"]);
    assert_eq!(o.code, 134, "a trap exits as an abort");
    assert_eq!(o.ended["exit_code"], 134);
    let trap = o.ended["trap"].as_str().unwrap();
    assert!(trap.contains("unreachable"), "{trap}");
    assert!(!trap.contains("backtrace"), "one line: {trap}");

    // Not a module, no _start, an import WASI does not have, a bad flag: exit 2 and why.
    std::fs::write(d.join("junk.wasm"), b"\0asm junk").unwrap();
    let o = run(&d.join("junk.wasm"), &["--memory-mb", "16"]);
    assert_eq!(o.code, 2);
    assert!(
        o.ended["error"]
            .as_str()
            .unwrap()
            .starts_with("not a WebAssembly module this runtime takes"),
        "{}",
        o.ended
    );
    let m = module(&d, r#"(func (export "main"))"#);
    let o = run(&m, &["--memory-mb", "16"]);
    assert_eq!(o.code, 2);
    assert!(
        o.ended["error"].as_str().unwrap().contains("_start"),
        "{}",
        o.ended
    );
    let bytes = wat::parse_str(
        r#"(module (import "env" "socket" (func)) (memory (export "memory") 1) (func (export "_start")))"#,
    )
    .unwrap();
    std::fs::write(d.join("imp.wasm"), bytes).unwrap();
    let o = run(&d.join("imp.wasm"), &["--memory-mb", "16"]);
    assert_eq!(o.code, 2);
    assert!(
        o.ended["error"].as_str().unwrap().contains("WASI"),
        "{}",
        o.ended
    );
    let o = run(&m, &["--memory-mb", "0"]);
    assert_eq!(o.code, 2);
    assert!(o.ended["error"].as_str().unwrap().contains("--memory-mb"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// The memory limit at, below and above its bound: 16 MiB is 256 pages.
#[test]
fn test_memory_grows_to_the_limit_and_not_a_page_past_it() {
    let d = scratch("memory");
    // Grows by 254 pages (to 255), then 1 (to 256 = 16 MiB), then 1 more (refused);
    // prints 1 for each grow that worked, 0 for each refused.
    let m = module(
        &d,
        r#"
        (func $grow (param $n i32)
          (call $digit (i32.ne (memory.grow (local.get $n)) (i32.const -1))))
        (func (export "_start")
          (call $grow (i32.const 254))
          (call $grow (i32.const 1))
          (call $grow (i32.const 1))
          ;; the memory still works at its top
          (i32.store (i32.const 16777212) (i32.const 7))
          (call $digit (i32.load (i32.const 16777212))))
        "#,
    );
    let o = run(&m, &["--memory-mb", "16"]);
    assert_eq!(o.stdout, b"1107", "{}", o.stderr);
    assert_eq!(o.code, 0);
    assert_eq!(o.ended["peak_memory_bytes"], 16 << 20);
    // With 17 MiB the third grow works too.
    let o = run(&m, &["--memory-mb", "17"]);
    assert_eq!(o.stdout, b"1117");
    assert_eq!(o.ended["peak_memory_bytes"], (16 << 20) + 65536);
    // A refused grow leaves the count as it was: after 254, a grow of 2 and one of
    // 2^32 - 1 pages fail, and 1 more still fits exactly.
    let m = module(
        &d,
        r#"
        (func $grow (param $n i32)
          (call $digit (i32.ne (memory.grow (local.get $n)) (i32.const -1))))
        (func (export "_start")
          (call $grow (i32.const 254))
          (call $grow (i32.const 2))
          (call $grow (i32.const -1))
          (call $grow (i32.const 1))
          (call $grow (i32.const 1)))
        "#,
    );
    let o = run(&m, &["--memory-mb", "16"]);
    assert_eq!(o.stdout, b"10010");
    assert_eq!(o.ended["peak_memory_bytes"], 16 << 20);
    // Tables count too (8 bytes an element): 16 MiB of memory and table together.
    let m = module(
        &d,
        r#"
        (table $t 0 funcref)
        (func (export "_start")
          (call $digit (i32.ne (table.grow $t (ref.null func) (i32.const 1000)) (i32.const -1)))
          ;; 2,100,000 more elements (16.8 MB): refused
          (call $digit (i32.ne (table.grow $t (ref.null func) (i32.const 2100000)) (i32.const -1)))
          (call $digit (i32.ne (memory.grow (i32.const 254)) (i32.const -1))))
        "#,
    );
    let o = run(&m, &["--memory-mb", "16"]);
    assert_eq!(o.stdout, b"101", "{}", o.ended);
    assert_eq!(o.ended["peak_memory_bytes"], (255 << 16) + 8000);
    // What cannot start is a setup error (exit 2), not a trap: an initial memory over
    // the limit, two memories, a 64-bit memory.
    for (name, text, says) in [
        (
            "big",
            r#"(module (memory (export "memory") 300) (func (export "_start")))"#,
            "instantiated",
        ),
        (
            "two",
            r#"(module (memory (export "memory") 1) (memory 1) (func (export "_start")))"#,
            "not a WebAssembly module this runtime takes",
        ),
        (
            "m64",
            r#"(module (memory (export "memory") i64 1) (func (export "_start")))"#,
            "not a WebAssembly module this runtime takes",
        ),
    ] {
        let path = d.join(format!("{name}.wasm"));
        std::fs::write(&path, wat::parse_str(text).unwrap()).unwrap();
        let o = run(&path, &["--memory-mb", "16"]);
        assert_eq!(o.code, 2, "{name}: {}", o.ended);
        let error = o.ended["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{name}: {error}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// /input is read only, /output is writable, and neither leads out.
#[test]
fn test_the_module_sees_only_its_directories() {
    let d = scratch("dirs");
    let (input, output) = (d.join("input"), d.join("output"));
    std::fs::create_dir_all(&input).unwrap();
    std::fs::create_dir_all(&output).unwrap();
    std::fs::write(input.join("in.txt"), b"data from input\n").unwrap();
    std::fs::write(d.join("secret"), b"outside").unwrap();
    // fd 3 = /input, fd 4 = /output (preopens in the order given). Each path_open
    // prints its errno (0 = opened); the copy goes /input/in.txt -> /output/out.txt.
    let m = module(
        &d,
        r#"
        (data (i32.const 100) "in.txt")
        (data (i32.const 120) "out.txt")
        (data (i32.const 140) "new.txt")
        (data (i32.const 160) "../secret")
        (data (i32.const 180) "/etc/passwd")
        (func $open (param $dir i32) (param $path i32) (param $len i32) (param $oflags i32) (param $rights i64) (result i32)
          (local $e i32)
          (local.set $e (call $path_open (local.get $dir) (i32.const 0) (local.get $path) (local.get $len)
            (local.get $oflags) (local.get $rights) (i64.const 0) (i32.const 0) (i32.const 1100)))
          (call $digit (i32.lt_u (local.get $e) (i32.const 1)))
          (i32.load (i32.const 1100)))
        (func (export "_start")
          (local $in i32) (local $out i32)
          ;; read in.txt (rights: fd_read = 2)
          (local.set $in (call $open (i32.const 3) (i32.const 100) (i32.const 6) (i32.const 0) (i64.const 2)))
          (i32.store (i32.const 1200) (i32.const 5000))
          (i32.store (i32.const 1204) (i32.const 1000))
          (drop (call $fd_read (local.get $in) (i32.const 1200) (i32.const 1) (i32.const 1208)))
          ;; create out.txt in /output (creat = 1, fd_write = 64) and write it there
          (local.set $out (call $open (i32.const 4) (i32.const 120) (i32.const 7) (i32.const 1) (i64.const 64)))
          (call $write (local.get $out) (i32.const 5000) (i32.load (i32.const 1208)))
          ;; create in /input: refused
          (drop (call $open (i32.const 3) (i32.const 140) (i32.const 7) (i32.const 1) (i64.const 64)))
          ;; ../secret and an absolute path from /output: refused
          (drop (call $open (i32.const 4) (i32.const 160) (i32.const 9) (i32.const 0) (i64.const 2)))
          (drop (call $open (i32.const 4) (i32.const 180) (i32.const 11) (i32.const 0) (i64.const 2)))
          ;; a symbolic link in /output (to ../secret): refused, EPERM (63)
          (call $digit (call $path_symlink (i32.const 160) (i32.const 9) (i32.const 4) (i32.const 140) (i32.const 7))))
        "#,
    );
    let o = run(
        &m,
        &[
            "--memory-mb",
            "16",
            "--ro-dir",
            &format!("/input={}", input.display()),
            "--dir",
            &format!("/output={}", output.display()),
        ],
    );
    assert_eq!(o.stdout, b"11000o", "{} {}", o.stderr, o.ended);
    assert!(std::fs::symlink_metadata(output.join("new.txt")).is_err());
    assert_eq!(o.code, 0);
    assert_eq!(
        std::fs::read(output.join("out.txt")).unwrap(),
        b"data from input\n"
    );
    assert!(!input.join("new.txt").exists());
    std::fs::remove_dir_all(&d).unwrap();
}

/// Clocks and random numbers are the same on every run; stdin is the file given.
#[test]
fn test_clocks_random_numbers_and_stdin_are_deterministic() {
    let d = scratch("det");
    std::fs::write(d.join("stdin"), b"from stdin").unwrap();
    // Prints: realtime (8 bytes), realtime again, monotonic, 16 random bytes, then
    // what fd 0 gave (up to 64 bytes).
    let m = module(
        &d,
        r#"
        (func (export "_start")
          (drop (call $clock_time_get (i32.const 0) (i64.const 1) (i32.const 3000)))
          (drop (call $clock_time_get (i32.const 0) (i64.const 1) (i32.const 3008)))
          (drop (call $clock_time_get (i32.const 1) (i64.const 1) (i32.const 3016)))
          (drop (call $random_get (i32.const 3024) (i32.const 16)))
          (i32.store (i32.const 1200) (i32.const 3040))
          (i32.store (i32.const 1204) (i32.const 64))
          (drop (call $fd_read (i32.const 0) (i32.const 1200) (i32.const 1) (i32.const 1208)))
          (call $write (i32.const 1) (i32.const 3000) (i32.add (i32.const 40) (i32.load (i32.const 1208)))))
        "#,
    );
    let stdin = d.join("stdin");
    let args = ["--memory-mb", "16", "--stdin", stdin.to_str().unwrap()];
    let a = run(&m, &args);
    let b = run(&m, &args);
    assert_eq!(a.code, 0, "{} {}", a.stderr, a.ended);
    assert_eq!(a.stdout, b.stdout, "the same bytes on every run");
    let u64_at = |i: usize| u64::from_le_bytes(a.stdout[i..i + 8].try_into().unwrap());
    assert_eq!(u64_at(0), 946_684_800_000_000_000, "2000-01-01T00:00:00Z");
    assert!(u64_at(8) > u64_at(0), "the wall clock moves on");
    assert!(
        u64_at(16) < 1_000_000_000,
        "the monotonic clock starts at zero"
    );
    let random = &a.stdout[24..40];
    assert!(random.iter().filter(|&&x| x == 0).count() < 4, "{random:?}");
    assert_eq!(&a.stdout[40..], b"from stdin");
    // No --stdin: an empty stdin.
    let o = run(&m, &["--memory-mb", "16"]);
    assert_eq!(o.stdout.len(), 40);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A sleep is on the module's time: a 1 s sleep and a sleep until 5 s past the wall
/// clock's start both return at once, and the clocks say the time has passed.
#[test]
fn test_sleeping_moves_the_modules_time_not_the_hosts() {
    let d = scratch("sleep");
    // Subscription at 6000 (48 bytes), event at 7000, nevents at 7100. Prints: nevents,
    // userdata == 42, the event's errno, then monotonic >= 1 s; then the same for an
    // absolute realtime deadline, and realtime >= it.
    let m = module(
        &d,
        r#"
        (func $sub (param $id i32) (param $timeout i64) (param $flags i32)
          (i64.store (i32.const 6000) (i64.const 42))
          (i32.store8 (i32.const 6008) (i32.const 0))
          (i32.store (i32.const 6016) (local.get $id))
          (i64.store (i32.const 6024) (local.get $timeout))
          (i64.store (i32.const 6032) (i64.const 0))
          (i32.store16 (i32.const 6040) (local.get $flags))
          (call $digit (call $poll_oneoff (i32.const 6000) (i32.const 7000) (i32.const 1) (i32.const 7100)))
          (call $digit (i32.load (i32.const 7100)))
          (call $digit (i64.eq (i64.load (i32.const 7000)) (i64.const 42)))
          (call $digit (i32.load16_u (i32.const 7008))))
        (func (export "_start")
          (call $sub (i32.const 1) (i64.const 1000000000) (i32.const 0))
          (drop (call $clock_time_get (i32.const 1) (i64.const 1) (i32.const 3000)))
          (call $digit (i64.ge_u (i64.load (i32.const 3000)) (i64.const 1000000000)))
          (call $sub (i32.const 0) (i64.const 946684805000000000) (i32.const 1))
          (drop (call $clock_time_get (i32.const 0) (i64.const 1) (i32.const 3000)))
          (call $digit (i64.ge_u (i64.load (i32.const 3000)) (i64.const 946684805000000000)))
          ;; a CPU-time clock is not the module's: the event says EINVAL (28)
          (call $sub (i32.const 2) (i64.const 1) (i32.const 0)))
        "#,
    );
    let started = std::time::Instant::now();
    let o = run(&m, &["--memory-mb", "16"]);
    assert_eq!(o.stdout, b"0110101101011L", "{} {}", o.stderr, o.ended);
    assert_eq!(o.code, 0);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "sleeping took {:?} of the host's time",
        started.elapsed()
    );
    std::fs::remove_dir_all(&d).unwrap();
}

/// As the daemon runs it: the outcome on fd 3 (a socket), nothing of it on stderr, and
/// the seccomp filter in force while the module runs (seen in /proc while it waits on
/// a stdin that is a FIFO).
#[test]
fn test_the_outcome_goes_to_fd_3_and_the_filter_is_on_while_the_module_runs() {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let d = scratch("fd3");
    let fifo = d.join("stdin");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    // Reads stdin (blocks until the test writes), then echoes it.
    let m = module(
        &d,
        r#"
        (func (export "_start")
          (i32.store (i32.const 1200) (i32.const 3000))
          (i32.store (i32.const 1204) (i32.const 64))
          (drop (call $fd_read (i32.const 0) (i32.const 1200) (i32.const 1) (i32.const 1208)))
          (call $write (i32.const 1) (i32.const 3000) (i32.load (i32.const 1208))))
        "#,
    );
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
    let fd = theirs.as_raw_fd();
    let mut cmd = Command::new(worker());
    cmd.args(["wasi", "--memory-mb", "16", "--module"])
        .arg(&m)
        .arg("--stdin")
        .arg(&fifo)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: dup2 is async-signal-safe and touches only fd numbers.
    unsafe {
        cmd.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    drop(theirs);
    // Opening the FIFO's writing end lets the worker's open of it return.
    let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let status = format!("/proc/{}/status", child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let seccomp = loop {
        let s = std::fs::read_to_string(&status).unwrap_or_default();
        let mode = s
            .lines()
            .find_map(|l| l.strip_prefix("Seccomp:"))
            .map(str::trim);
        if mode == Some("2") || std::time::Instant::now() > deadline {
            break mode.map(str::to_string);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(seccomp.as_deref(), Some("2"), "the filter is on (mode 2)");
    writer.write_all(b"ping").unwrap();
    drop(writer);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.stdout, b"ping");
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut line = String::new();
    ours.read_to_string(&mut line).unwrap();
    let ended: Value = serde_json::from_str(line.trim_end()).unwrap();
    assert_eq!(ended["exit_code"], 0);
    assert_eq!(ended["peak_memory_bytes"], 65536);
    std::fs::remove_dir_all(&d).unwrap();
}
