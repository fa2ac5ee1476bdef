//! The web UI (`GET /`) in a real browser: the real daemon (with an API key configured)
//! serves the page, and `tests/ui/notebook.test.mjs` drives Debian's headless Chromium
//! through it with playwright-core (notebook cells on a kernel session, streaming,
//! artifacts, one-shot runs, the file panel, the chat pane against a fake model
//! endpoint, the key field, a narrow screen). Needs `node`, `/usr/bin/chromium` and
//! `tests/ui/node_modules` (`make test` installs all three); without them this test
//! FAILS, it never skips.

mod common;

use common::Daemon;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const KEY: &str = "ui-test-key";

fn manifest() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The node binary and the browser, checked up front so a missing one is one clear failure.
fn prerequisites() -> (String, String) {
    let node = std::env::var("ISOBOX_TEST_NODE").unwrap_or_else(|_| "node".into());
    match Command::new(&node).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => panic!(
            "`{node}` does not run: the UI test needs Node.js (Debian packages nodejs and npm; \
             `make deps` installs them)"
        ),
    }
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(
        Path::new(&chromium).exists(),
        "{chromium} is missing: the UI test needs Debian's chromium package \
         (`apt-get install --no-install-recommends chromium`; `make deps` installs it)"
    );
    let pw = manifest().join("tests/ui/node_modules/playwright-core/package.json");
    assert!(
        pw.exists(),
        "{} is missing: run `npm ci --prefix tests/ui` (`make test-ui-deps` does)",
        pw.display()
    );
    (node, chromium)
}

/// Reads a child's pipe to the end on a thread.
fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

#[test]
fn test_notebook_in_a_real_browser() {
    let (node, chromium) = prerequisites();
    let d = Daemon::start_with(&[("ISOBOX_API_KEYS", KEY)]);
    d.wait_ready();
    // The page itself needs no key (the API behind it does) and carries its policy.
    let page = d.get("/");
    assert_eq!(page.status, 200, "{}", page.text());
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        page.header("content-security-policy")
            .is_some_and(|c| c.contains("default-src 'none'")),
        "{:?}",
        page.headers
    );
    assert!(page.text().len() < 60 * 1024, "the page stays small");
    assert_eq!(d.get("/runtimes").status, 401);

    let artifacts: PathBuf = manifest().join("target/ui-artifacts");
    let shot = artifacts.join("notebook.png");
    let _ = std::fs::remove_file(&shot);
    let started = Instant::now();
    let mut child = Command::new(&node)
        .arg(manifest().join("tests/ui/notebook.test.mjs"))
        .arg(format!("http://{}", d.addr))
        .env("ISOBOX_UI_KEY", KEY)
        .env("CHROMIUM", &chromium)
        .env("ISOBOX_UI_ARTIFACTS", &artifacts)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start node");
    let out = drain(child.stdout.take().unwrap());
    let err = drain(child.stderr.take().unwrap());
    // The script has its own 100 s ceiling; this one only guards against a wedged node.
    let deadline = started + Duration::from_secs(150);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    println!(
        "browser test ({:.1} s):\n{out}{err}",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "the browser test failed ({status:?}):\n--- stdout\n{out}\n--- stderr\n{err}\n--- isoboxd log\n{}",
        d.log()
    );
    let png = std::fs::read(&shot).expect("the screenshot was saved");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG screenshot");

    // The page ended its kernel sessions (End session, and the ended kernel it replaced):
    // no kernel, no workspace is left.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let used = d.get("/healthz").json()["kernels"]["used"].as_u64();
        let sessions = std::fs::read_dir(d.data_dir.join("sessions"))
            .map(|r| r.count())
            .unwrap_or(0);
        if used == Some(0) && sessions == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left by the page: {used:?} kernels, {sessions} session workspaces\nlog:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    d.assert_clean();
    d.stop();
}
