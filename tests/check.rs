//! `isoboxd check` on this host, run as an operator would: what passes, what fails by
//! name and makes it exit 1, what only warns, and that it changes nothing.

mod common;
use common::Daemon;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `isoboxd check` with only `env` among the ISOBOX_* settings: exit code, stdout,
/// stderr.
fn check(env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_isoboxd"));
    cmd.arg("check")
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run isoboxd check");
    (
        out.status.code().expect("exit code"),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// A directory of this test's own under /tmp, removed first if a run left it.
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(format!("/tmp/isobox-check-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn line<'a>(out: &'a str, start: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting {start:?} in:\n{out}"))
}

fn nft_tables() -> String {
    let o = Command::new("nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    String::from_utf8(o.stdout).unwrap()
}

#[test]
fn test_check_passes_on_this_host_and_changes_nothing() {
    let dir = scratch("ok");
    let data = dir.join("data");
    let instance = format!("isobox-chk{}", std::process::id());
    // The same settings each time: this test's instance and data dir.
    let run = || {
        check(&[
            ("ISOBOX_INSTANCE", &instance),
            ("ISOBOX_DATA_DIR", data.to_str().unwrap()),
            ("ISOBOX_LISTEN", "127.0.0.1:0"),
        ])
    };
    let (code, out, err) = run();
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("FAIL"), "{out}");
    assert_eq!(line(&out, "ok    root"), "ok    root       running as root");
    assert!(
        line(&out, "ok    runsc").contains("/usr/bin/runsc: runsc version"),
        "{out}"
    );
    assert!(
        line(&out, "ok    cgroups").ends_with("with memory, cpu and pids"),
        "{out}"
    );
    assert!(
        line(&out, "ok    runtime    python-slim 3.")
            .contains("/var/lib/isobox/rootfs/python-slim"),
        "{out}"
    );
    assert_eq!(
        line(&out, "ok    egress"),
        "ok    egress     nftables answers over netlink"
    );
    assert!(line(&out, "ok    init").ends_with("/isobox-init"), "{out}");
    // `make test` made the snapshot before the suite.
    assert!(
        line(&out, "ok    wasm").ends_with("/isobox-wasm, snapshot in /var/cache/isobox/wasm"),
        "{out}"
    );
    assert!(
        line(&out, "ok    overlay").starts_with("ok    overlay    overlayfs"),
        "{out}"
    );
    assert_eq!(
        line(&out, "ok    data dir"),
        format!(
            "ok    data dir   {} does not exist yet; isoboxd creates it",
            data.display()
        )
    );
    assert!(line(&out, "ok    disk").contains(" free under "), "{out}");
    assert_eq!(
        line(&out, "ok    listen"),
        "ok    listen     127.0.0.1:0 can be bound"
    );
    assert!(
        out.ends_with("warnings)\n") || out.ends_with("warning)\n"),
        "{out}"
    );
    assert!(line(&out, "result: ").starts_with("result: isoboxd can serve on this host ("));
    // Nothing made: no data dir, no lock, no table left by the nftables probe.
    assert!(!data.exists());
    assert!(!Path::new(&format!("/run/isobox/{instance}.lock")).exists());
    assert!(!nft_tables().contains("isobox_check"), "{}", nft_tables());
    // An existing data dir is written to (one file, removed at once).
    std::fs::create_dir(&data).unwrap();
    let (code, out, _) = run();
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        line(&out, "ok    data dir"),
        format!("ok    data dir   {} is writable", data.display())
    );
    assert_eq!(std::fs::read_dir(&data).unwrap().count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn test_check_fails_by_name_for_what_keeps_the_daemon_from_serving() {
    let dir = scratch("fail");
    let base = [
        ("ISOBOX_INSTANCE", "isobox-chkfail"),
        ("ISOBOX_LISTEN", "127.0.0.1:0"),
        ("ISOBOX_DATA_DIR", "/tmp/isobox-check-absent/data"),
    ];
    let with = |extra: &[(&str, &str)]| {
        let mut env: Vec<(&str, &str)> = base.to_vec();
        env.extend_from_slice(extra);
        check(&env)
    };
    // No runsc.
    let (code, out, _) = with(&[("ISOBOX_RUNSC", "/nonexistent/runsc")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        line(&out, "FAIL  runsc").starts_with(
            "FAIL  runsc      /nonexistent/runsc: No such file or directory (os error 2)"
        ),
        "{out}"
    );
    assert!(
        line(&out, "result: ")
            .starts_with("result: isoboxd could not serve on this host (1 failure, "),
        "{out}"
    );
    // No runtime built: each named, then the failure.
    let empty = dir.join("rootfs");
    std::fs::create_dir(&empty).unwrap();
    let (code, out, _) = with(&[("ISOBOX_ROOTFS_DIR", empty.to_str().unwrap())]);
    assert_eq!(code, 1, "{out}");
    assert!(
        line(&out, "warn  runtime    python-slim not installed").contains("not built"),
        "{out}"
    );
    assert_eq!(
        line(&out, "FAIL  runtime"),
        format!("FAIL  runtime    no runtime is installed under {}: build them with `make runtimes` (or isobox-runtimes from the package)", empty.display())
    );
    // The port is someone else's.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, out, _) = with(&[("ISOBOX_LISTEN", &addr)]);
    assert_eq!(code, 1, "{out}");
    assert!(
        line(&out, "FAIL  listen").starts_with(&format!(
            "FAIL  listen     {addr} cannot be bound: Address already in use"
        )),
        "{out}"
    );
    drop(taken);
    // The data dir is a file.
    let file = dir.join("file");
    std::fs::write(&file, b"x").unwrap();
    let (code, out, _) = with(&[("ISOBOX_DATA_DIR", file.to_str().unwrap())]);
    assert_eq!(code, 1, "{out}");
    assert_eq!(
        line(&out, "FAIL  data dir"),
        format!("FAIL  data dir   {} is not a directory", file.display())
    );
    // kvm without /dev/kvm.
    let (code, out, _) = with(&[("ISOBOX_PLATFORM", "kvm")]);
    if Path::new("/dev/kvm").exists() {
        assert_eq!(code, 0, "{out}");
    } else {
        assert_eq!(code, 1, "{out}");
        assert!(
            line(&out, "FAIL  runsc").contains("needs /dev/kvm"),
            "{out}"
        );
    }
    // A bad setting is not a check: 2, naming the variable.
    let (code, out, err) = with(&[("ISOBOX_WORKERS", "four")]);
    assert_eq!((code, out.as_str()), (2, ""));
    assert!(
        err.contains("ISOBOX_WORKERS") && err.contains("four"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn test_check_warns_but_passes_for_what_only_limits_the_daemon() {
    let base = [
        ("ISOBOX_INSTANCE", "isobox-chkwarn"),
        ("ISOBOX_LISTEN", "127.0.0.1:0"),
        ("ISOBOX_DATA_DIR", "/tmp/isobox-check-absent/data"),
    ];
    let mut env = base.to_vec();
    env.extend([
        ("ISOBOX_STORAGE_RESERVE_BYTES", "1152921504606846976"),
        ("ISOBOX_INIT", "/nonexistent/isobox-init"),
        ("ISOBOX_WASM_WORKER", "/nonexistent/isobox-wasm"),
        ("ISOBOX_EGRESS", "off"),
    ]);
    let (code, out, _) = check(&env);
    assert_eq!(code, 0, "{out}");
    assert!(
        line(&out, "warn  disk").ends_with(
            "free under /tmp, below ISOBOX_STORAGE_RESERVE_BYTES (1048576.0 TiB): new sessions and volumes are refused"
        ),
        "{out}"
    );
    assert_eq!(
        line(&out, "warn  init"),
        "warn  init       /nonexistent/isobox-init is missing: long-lived sandboxes (/wbx) cannot start (set ISOBOX_INIT)"
    );
    assert_eq!(
        line(&out, "warn  wasm"),
        "warn  wasm       /nonexistent/isobox-wasm is missing: Python in WebAssembly (/eryx) answers 503 (set ISOBOX_WASM_WORKER)"
    );
    assert_eq!(
        line(&out, "ok    egress"),
        "ok    egress     off (ISOBOX_EGRESS=off): every run is offline"
    );
    assert!(!out.contains("forwarding"), "{out}");
    let mut off = base.to_vec();
    off.push(("ISOBOX_WASM_WORKER", "off"));
    let (_, out, _) = check(&off);
    assert_eq!(
        line(&out, "ok    wasm"),
        "ok    wasm       off (ISOBOX_WASM_WORKER=off): /eryx answers 503"
    );
}

#[test]
fn test_check_beside_a_running_daemon_names_it() {
    let d = Daemon::start();
    let addr = d.addr.to_string();
    let (code, out, _) = check(&[
        ("ISOBOX_INSTANCE", &d.instance),
        ("ISOBOX_LISTEN", &addr),
        ("ISOBOX_DATA_DIR", d.data_dir.to_str().unwrap()),
    ]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        line(&out, "ok    listen"),
        format!(
            "ok    listen     {addr} is in use by the running isoboxd of instance {} (pid {})",
            d.instance,
            d.pid()
        )
    );
    // The daemon goes on serving, its lock untouched.
    assert_eq!(d.get("/healthz").status, 200);
    d.stop();
}

#[test]
fn test_version_and_help_name_the_build_and_the_check() {
    let bin = env!("CARGO_BIN_EXE_isoboxd");
    let v = Command::new(bin).arg("--version").output().unwrap();
    assert!(v.status.success());
    let text = String::from_utf8(v.stdout).unwrap();
    assert!(
        text.starts_with("isoboxd ") && text.ends_with('\n') && text.len() > 9,
        "{text}"
    );
    let h = Command::new(bin).arg("--help").output().unwrap();
    assert!(h.status.success());
    let help = String::from_utf8(h.stdout).unwrap();
    assert!(
        help.contains("`isoboxd check [FLAGS]` prints what is missing or wrong"),
        "{help}"
    );
}
