//! The start signal of a cold run: tells "the sandbox never started" (a 5xx
//! `sandbox_start_failed`) from "the program ran and failed" (a 200 with its result),
//! and marks when the program's own time begins.
//!
//! `runsc run` hands the container its own stdio, so anything runsc says when it fails
//! (and its exit status) looks exactly like the program's. Two ways say the program
//! started, both out of the program's reach (it can neither forge nor hide them):
//!
//! - **The hook** (gVisor on x86-64, the default): the run's OCI spec names
//!   `isobox-started` ([`HOOK`], `started.c`: static, no libc) as its `poststart` hook,
//!   which `runsc run` executes on the host once the program has started; it writes the
//!   host's monotonic time into a FIFO of the run's bundle (outside everything the
//!   sandbox sees) whose reading end the loop holds. Nothing extra runs inside gVisor,
//!   where an exec costs ~10 ms of CPU on the ptrace platform. Until the signal, stderr
//!   is held back (up to [`HOLD_MAX`]); with it, what was held is the program's; a run
//!   that ends without it failed to start and what was held is runsc's.
//! - **The frame**: the run's argv is prefixed with a program that writes FRAME to
//!   stderr and then execs the program's argv: `isobox-start` ([`BINARY`], `start.c`),
//!   copied into the run's root overlay at [`PATH`], or for a program not named by an
//!   absolute path (and on other CPUs) `/bin/sh -c 'printf FRAME >&2; exec "$@"'`.
//!   (The compiled runtimes' build script prints the same frame first.) The frame is the
//!   first thing on the sandbox's stderr, written before the program exists. Until it
//!   arrives the run is starting; the frame is stripped, and whatever came before it
//!   (runsc's own words) is kept for the log, never shown as the program's stderr.
//!
//! A run that ends, or reaches its start deadline, without its signal failed to start.
//! Pooled (warm) runs and kernel steps need none: their harness said `ready` before the
//! run was handed over.

use std::time::Instant;

/// The frame, as bytes.
pub const FRAME: &[u8] = b"\x1eISOBOX-START\n";
/// The frame as `printf` writes it (octal escape: dash's printf has no `\x`).
pub const PRINTF: &str = r"printf '\036ISOBOX-START\n' >&2";
/// How much of what precedes the frame is kept for the log.
const MAX_NOISE: usize = 4096;

/// `isobox-start`, built from `start.c` for x86-64 Linux (`None` elsewhere).
#[cfg(isobox_static)]
pub const BINARY: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/isobox-start")));
/// `isobox-start`, built from `start.c` for x86-64 Linux (`None` elsewhere).
#[cfg(not(isobox_static))]
pub const BINARY: Option<&[u8]> = None;

/// `isobox-started`, the poststart hook, built from `started.c` for x86-64 Linux
/// (`None` elsewhere).
#[cfg(isobox_hook)]
pub const HOOK: Option<&[u8]> = Some(include_bytes!(concat!(env!("OUT_DIR"), "/isobox-started")));
/// `isobox-started`, the poststart hook, built from `started.c` for x86-64 Linux
/// (`None` elsewhere).
#[cfg(not(isobox_hook))]
pub const HOOK: Option<&[u8]> = None;

/// How much stderr a run awaiting its hook's signal holds back; past it, stderr is not
/// read until the signal (the program waits on a full pipe for a few milliseconds).
pub const HOLD_MAX: usize = 64 << 10;

/// The hook's signal: the host's `CLOCK_MONOTONIC` nanoseconds when it ran.
pub const SIGNAL_BYTES: usize = 8;

/// When the hook that wrote `signal` ran, as an `Instant` (`now` and `now_ns` read
/// together; a signal from the future, which the clock cannot give, counts as now).
pub fn signal_instant(signal: [u8; SIGNAL_BYTES], now: Instant, now_ns: u64) -> Instant {
    let at = u64::from_le_bytes(signal);
    now.checked_sub(std::time::Duration::from_nanos(now_ns.saturating_sub(at)))
        .unwrap_or(now)
}

/// The installed poststart hook ([`install_hook`]): where it is, which file it was,
/// and whether it may still be used.
#[derive(Debug)]
pub struct StartHook {
    /// Its path (absolute when the data directory's is).
    pub path: std::path::PathBuf,
    dev: u64,
    ino: u64,
    usable: std::sync::atomic::AtomicBool,
}

impl StartHook {
    /// The hook, when it may signal this run's start: it was not given up on, and the
    /// file is still the one installed (the same inode, a regular file of the same
    /// size, mode 0555, owned by this user; one `lstat`). Else `None`, logged: the run
    /// then uses the frame. A hook that runsc cannot run would make a run that started
    /// look as if it never did; the frame cannot go missing that way.
    pub fn for_run(&self) -> Option<&std::path::Path> {
        use std::os::unix::fs::MetadataExt;
        if !self.usable.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let intact = std::fs::symlink_metadata(&self.path).is_ok_and(|m| {
            m.file_type().is_file()
                && (m.dev(), m.ino()) == (self.dev, self.ino)
                && m.mode() & 0o7777 == 0o555
                && m.uid() == crate::sys::euid()
                && Some(m.len()) == HOOK.map(|b| b.len() as u64)
        });
        if !intact {
            crate::warn_limited!(
                "start hook {} changed or is gone; cold runs signal their start with the frame until the daemon restarts",
                self.path.display()
            );
            self.give_up();
            return None;
        }
        Some(&self.path)
    }

    /// Gives it up for good: cold runs use the frame.
    pub fn give_up(&self) {
        self.usable
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Writes [`HOOK`] into `dir` as `isobox-started` (a new file, never through a link,
/// then renamed over what is there, so the file runsc executes is never open for
/// writing) and checks that it runs there and signals a FIFO. The hook, or `None` (the
/// reason logged) when this build has none, `dir` is writable by anyone but this user
/// (runsc runs the hook as root), or it cannot run there (a `noexec` mount): cold runs
/// then use the frame.
pub fn install_hook(dir: &std::path::Path) -> Option<std::sync::Arc<StartHook>> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let bin = HOOK?;
    let path = dir.join("isobox-started");
    let pid = std::process::id();
    let tmp = dir.join(format!(".isobox-started.{pid}"));
    let fifo = dir.join(format!(".isobox-started-check.{pid}"));
    let checked = (|| -> std::io::Result<StartHook> {
        let d = std::fs::metadata(dir)?;
        if d.uid() != crate::sys::euid() || d.mode() & 0o022 != 0 {
            return Err(std::io::Error::other(format!(
                "{} is not this user's alone (owner {}, mode {:o})",
                dir.display(),
                d.uid(),
                d.mode() & 0o7777
            )));
        }
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o500)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(bin)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o555))?;
        drop(f);
        std::fs::rename(&tmp, &path)?;
        let m = std::fs::symlink_metadata(&path)?;
        let _ = std::fs::remove_file(&fifo);
        let rx = std::fs::File::from(crate::sys::fifo_reader(&fifo, 0o600)?);
        let before = crate::sys::monotonic_ns();
        let status = status_of_new_program(
            std::process::Command::new(&path)
                .arg(&fifo)
                .env_clear()
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        )?;
        let mut got = [0u8; SIGNAL_BYTES];
        let n = std::io::Read::read(&mut &rx, &mut got)?;
        let at = u64::from_le_bytes(got);
        if !status.success() || n != SIGNAL_BYTES || at < before || at > crate::sys::monotonic_ns()
        {
            return Err(std::io::Error::other(format!(
                "it exited {status} and wrote {n} bytes ({at} against the clock's {before})"
            )));
        }
        Ok(StartHook {
            path: path.clone(),
            dev: m.dev(),
            ino: m.ino(),
            usable: std::sync::atomic::AtomicBool::new(true),
        })
    })();
    let _ = std::fs::remove_file(&tmp);
    let _ = std::fs::remove_file(&fifo);
    match checked {
        Ok(h) => Some(std::sync::Arc::new(h)),
        Err(e) => {
            log::warn!(
                "start hook {} does not work ({e}); cold runs signal their start from inside the sandbox",
                path.display()
            );
            None
        }
    }
}

/// `cmd.status()` for a program this process has just written: while another thread's
/// fork still holds a copy of the write descriptor (until that child's exec closes it)
/// the kernel refuses the exec with ETXTBSY; a few short retries outlast it.
///
/// # Errors
/// The spawn's error, once retrying does not help.
pub fn status_of_new_program(
    cmd: &mut std::process::Command,
) -> std::io::Result<std::process::ExitStatus> {
    let mut tries = 0;
    loop {
        match cmd.status() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            r => return r,
        }
    }
}

/// Where [`BINARY`] is in a run's root.
pub const PATH: &str = "/opt/isobox/start";

/// The sandbox argv of a cold interpreted run (`argv` is the program's own) whose root
/// holds [`BINARY`] at [`PATH`]: that, when the program is named by an absolute path
/// (the shell would have searched `PATH` for it); else [`wrap`].
pub fn wrap_with_binary(argv: Vec<String>) -> Vec<String> {
    if BINARY.is_none() || !argv.first().is_some_and(|p| p.starts_with('/')) {
        return wrap(argv);
    }
    let mut v = vec![PATH.to_string()];
    v.extend(argv);
    v
}

/// The sandbox argv of a cold interpreted run (`argv` is the program's own), by the
/// shell.
pub fn wrap(argv: Vec<String>) -> Vec<String> {
    let mut v = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        // dash exports PWD to what it execs; the program gets only the runtime's env.
        format!("{PRINTF}; unset PWD; exec \"$@\""),
        "isobox-start".to_string(),
    ];
    v.extend(argv);
    v
}

/// Watches the front of a cold run's stderr for the frame, or holds it back until the
/// hook's signal.
#[derive(Debug, Default)]
pub struct StartGate {
    buf: Vec<u8>,
    noise: Vec<u8>,
    began: bool,
    /// Waits for the hook's signal rather than a frame.
    hooked: bool,
}

impl StartGate {
    /// A gate that is already open (pooled runs, kernel steps).
    pub fn open() -> StartGate {
        StartGate {
            began: true,
            ..StartGate::default()
        }
    }

    /// A gate that opens on the hook's signal ([`StartGate::signal`]), holding stderr
    /// back until then.
    pub fn hooked() -> StartGate {
        StartGate {
            hooked: true,
            ..StartGate::default()
        }
    }

    /// Whether the frame (or the hook's signal) has arrived.
    pub fn began(&self) -> bool {
        self.began
    }

    /// Whether it holds all it may ([`HOLD_MAX`]) while awaiting the hook's signal.
    pub fn holding_full(&self) -> bool {
        self.hooked && !self.began && self.buf.len() >= HOLD_MAX
    }

    /// The hook said the program started: opens the gate and returns the stderr held
    /// back, which is the program's. `None` when it is open already or awaits a frame.
    pub fn signal(&mut self) -> Option<Vec<u8>> {
        if !self.hooked || self.began {
            return None;
        }
        self.began = true;
        Some(std::mem::take(&mut self.buf))
    }

    /// What came before the frame (or, when it never came, everything so far), up to
    /// 4 KiB.
    pub fn noise(&self) -> Vec<u8> {
        let mut v = self.noise.clone();
        if !self.began {
            v.extend_from_slice(&self.buf);
        }
        v.truncate(MAX_NOISE);
        v
    }

    /// Feeds stderr bytes read while the gate is closed. Returns what follows the frame
    /// (the program's stderr) once it is complete; `None` while still waiting (a hooked
    /// gate holds everything until its signal: the loop reads no more once it is full).
    pub fn feed(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        if self.began {
            return Some(data.to_vec());
        }
        self.buf.extend_from_slice(data);
        if self.hooked {
            return None;
        }
        if let Some(i) = self.buf.windows(FRAME.len()).position(|w| w == FRAME) {
            self.keep_noise(i);
            self.began = true;
            let rest = self.buf.split_off(FRAME.len());
            self.buf = Vec::new();
            return Some(rest);
        }
        // Keep only a tail that could still begin the frame; what is older is noise.
        let keep = FRAME.len() - 1;
        if self.buf.len() > keep {
            let cut = self.buf.len() - keep;
            self.keep_noise(cut);
        }
        None
    }

    /// Moves `buf[..n]` to the noise log (bounded).
    fn keep_noise(&mut self, n: usize) {
        let room = MAX_NOISE.saturating_sub(self.noise.len());
        self.noise.extend_from_slice(&self.buf[..n.min(room)]);
        self.buf.drain(..n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_binary_is_used_only_for_a_program_named_by_an_absolute_path() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let abs = wrap_with_binary(argv(&["/usr/bin/python3", "main.py"]));
        let rel = wrap_with_binary(argv(&["python3", "main.py"]));
        if BINARY.is_some() {
            assert_eq!(abs, argv(&[PATH, "/usr/bin/python3", "main.py"]));
        } else {
            assert_eq!(abs, wrap(argv(&["/usr/bin/python3", "main.py"])));
        }
        // The shell would have searched PATH for it: the shell it is.
        assert_eq!(rel, wrap(argv(&["python3", "main.py"])));
        assert_eq!(&rel[..2], &argv(&["/bin/sh", "-c"])[..]);
    }

    /// `isobox-start` itself, run on the host (it is a static x86-64 Linux program).
    #[cfg(isobox_static)]
    #[test]
    fn test_isobox_start_writes_the_frame_then_execs_with_argv_and_env_untouched() {
        use std::os::unix::fs::PermissionsExt;
        use std::process::Command;
        // Beside the test binary (it runs from there, so that place allows exec; a
        // `noexec` /tmp would not).
        let exe = std::env::current_exe().unwrap();
        let dir = exe
            .parent()
            .unwrap()
            .join(format!("isobox-start-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("isobox-start");
        std::fs::write(&bin, BINARY.unwrap()).unwrap();
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o555)).unwrap();
        // The first exec outlasts another test's fork that still holds the write fd.
        let first = status_of_new_program(
            Command::new(&bin)
                .env_clear()
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null()),
        );
        assert_eq!(first.unwrap().code(), Some(127));
        let out = Command::new(&bin)
            .args([
                "/bin/sh",
                "-c",
                r#"printf '%s|%s' "$0" "$1"; printf err >&2; exit 7"#,
            ])
            .args(["a b", "c"])
            .env_clear()
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(7));
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b|c");
        // The frame first, then the program's own stderr.
        assert_eq!(out.stderr, [FRAME, b"err"].concat());
        // The environment goes on exactly as given (the shell added PWD).
        let env = Command::new(&bin)
            .arg("/usr/bin/env")
            .env_clear()
            .env("FOO", "bar baz")
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&env.stdout), "FOO=bar baz\n");
        // A program that cannot be executed: the frame, a line saying why, status 127.
        let missing = Command::new(&bin)
            .arg("/nonexistent/program")
            .env_clear()
            .output()
            .unwrap();
        assert_eq!(missing.status.code(), Some(127));
        assert_eq!(
            missing.stderr,
            [FRAME, b"isobox-start: exec /nonexistent/program: errno 2\n"].concat()
        );
        assert!(missing.stdout.is_empty());
        // Nothing to run: the frame, status 127.
        let none = Command::new(&bin).env_clear().output().unwrap();
        assert_eq!(
            (none.status.code(), none.stderr.as_slice()),
            (Some(127), FRAME)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn frame_in_any_split_opens_the_gate_and_keeps_the_rest() {
        let stream = b"runsc: warning\n\x1eISOBOX-START\nTraceback\n".to_vec();
        for split in 0..=stream.len() {
            let mut g = StartGate::default();
            let mut rest = Vec::new();
            for part in [&stream[..split], &stream[split..]] {
                if let Some(r) = g.feed(part) {
                    rest.extend(r);
                }
            }
            assert!(g.began(), "split {split}");
            assert_eq!(rest, b"Traceback\n", "split {split}");
            assert_eq!(g.noise(), b"runsc: warning\n", "split {split}");
        }
    }

    #[test]
    fn no_frame_keeps_the_gate_closed_and_the_noise_bounded() {
        let mut g = StartGate::default();
        assert_eq!(g.feed(b"runsc: creating container: failed\n"), None);
        assert!(!g.began());
        assert_eq!(g.noise(), b"runsc: creating container: failed\n");
        for _ in 0..100 {
            assert_eq!(g.feed(&[b'x'; 1000]), None);
        }
        assert!(g.noise().len() <= 4096);
        assert!(g.buf.len() < FRAME.len());
        // A frame after the flood still opens it (the tail was kept).
        assert_eq!(g.feed(&FRAME[..5]), None);
        assert_eq!(g.feed(&FRAME[5..]).as_deref(), Some(&b""[..]));
        assert!(g.began());
    }

    #[test]
    fn a_hooked_gate_holds_stderr_until_its_signal_and_then_passes_it() {
        let mut g = StartGate::hooked();
        // Even the frame's bytes are only stderr here.
        assert_eq!(g.feed(b"early\n"), None);
        assert_eq!(g.feed(FRAME), None);
        assert!(!g.began());
        assert_eq!(g.noise(), [b"early\n".as_slice(), FRAME].concat());
        assert_eq!(g.signal(), Some([b"early\n".as_slice(), FRAME].concat()));
        assert!(g.began());
        assert_eq!(g.feed(b"late").as_deref(), Some(&b"late"[..]));
        // One signal only; a frame gate takes none.
        assert_eq!(g.signal(), None);
        assert_eq!(StartGate::default().signal(), None);
        assert_eq!(StartGate::open().signal(), None);
    }

    #[test]
    fn a_hooked_gate_is_full_at_its_bound_and_its_noise_stays_bounded() {
        let mut g = StartGate::hooked();
        g.feed(&vec![b'x'; HOLD_MAX - 1]);
        assert!(!g.holding_full());
        g.feed(b"x");
        assert!(g.holding_full());
        assert_eq!(g.noise().len(), MAX_NOISE);
        assert_eq!(g.signal().map(|v| v.len()), Some(HOLD_MAX));
        assert!(!g.holding_full());
        // A frame gate is never "full": it keeps only a tail.
        let mut f = StartGate::default();
        f.feed(&vec![b'x'; HOLD_MAX * 2]);
        assert!(!f.holding_full());
    }

    #[test]
    fn the_signal_is_placed_on_the_monotonic_clock() {
        let now = Instant::now();
        let ns = 5_000_000_000u64;
        let at = signal_instant((ns - 1_500_000).to_le_bytes(), now, ns);
        assert_eq!(now - at, std::time::Duration::from_micros(1500));
        // A signal from the future (the clock cannot give one) counts as now.
        assert_eq!(signal_instant((ns + 10).to_le_bytes(), now, ns), now);
        // The real clock: a signal read just now is within a moment of now.
        let real = signal_instant(
            crate::sys::monotonic_ns().to_le_bytes(),
            Instant::now(),
            crate::sys::monotonic_ns(),
        );
        assert!(real.elapsed() < std::time::Duration::from_secs(1));
    }

    /// `isobox-started` itself, run on the host as runsc runs it, and installed.
    #[cfg(isobox_hook)]
    #[test]
    fn test_isobox_started_signals_its_fifo_and_only_its_fifo() {
        use std::io::Read;
        use std::os::unix::fs::PermissionsExt;
        use std::process::Command;
        // Beside the test binary (a `noexec` /tmp would refuse the exec).
        let exe = std::env::current_exe().unwrap();
        let dir = exe
            .parent()
            .unwrap()
            .join(format!("isobox-started-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let installed = install_hook(&dir).expect("the hook installs and runs here");
        let hook = installed.path.clone();
        assert_eq!(hook, dir.join("isobox-started"));
        assert_eq!(installed.for_run(), Some(hook.as_path()));
        assert_eq!(std::fs::read(&hook).unwrap(), HOOK.unwrap());
        assert_eq!(
            std::fs::metadata(&hook).unwrap().permissions().mode() & 0o7777,
            0o555
        );
        // Nothing of the install's own check is left.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["isobox-started"]);
        let fifo = dir.join("started");
        let rx = std::fs::File::from(crate::sys::fifo_reader(&fifo, 0o600).unwrap());
        let before = crate::sys::monotonic_ns();
        assert_eq!(run_hook(&hook, &fifo), Some(0));
        let mut got = Vec::new();
        (&rx).read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), SIGNAL_BYTES);
        let at = u64::from_le_bytes(got.try_into().unwrap());
        assert!(before <= at && at <= crate::sys::monotonic_ns());
        drop(rx);
        // No reader: it fails at once rather than waiting for one.
        assert_eq!(run_hook(&hook, &fifo), Some(1));
        // Not through a link, and never into a file that is not there.
        let link = dir.join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        let _rx = crate::sys::fifo_reader(&dir.join("other"), 0o600).unwrap();
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(dir.join("other"), &link).unwrap();
        assert_eq!(run_hook(&hook, &link), Some(1));
        assert_eq!(run_hook(&hook, &dir.join("absent")), Some(1));
        assert!(!dir.join("absent").exists());
        // Nothing to signal.
        assert_eq!(Command::new(&hook).status().unwrap().code(), Some(1));
        // Installed again (a restart): a new file; the first install's hook no longer
        // signals runs (its file was replaced), and stays given up.
        let again = install_hook(&dir).expect("installs over itself");
        assert_eq!(again.for_run(), Some(hook.as_path()));
        assert_eq!(installed.for_run(), None);
        assert_eq!(installed.for_run(), None);
        // Its mode changed: not used.
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(again.for_run(), None);
        // A directory others may write: refused (runsc runs the hook as root).
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(install_hook(&dir).is_none());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(install_hook(&dir).is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Runs `hook` as runsc does with the spec's `args` (argv[0] included), the spec's
    /// empty environment; its exit code.
    #[cfg(isobox_hook)]
    fn run_hook(hook: &std::path::Path, fifo: &std::path::Path) -> Option<i32> {
        use std::os::unix::process::CommandExt;
        status_of_new_program(
            std::process::Command::new(hook)
                .arg0("isobox-started")
                .arg(fifo)
                .env_clear(),
        )
        .unwrap()
        .code()
    }

    #[test]
    fn an_open_gate_passes_everything() {
        let mut g = StartGate::open();
        assert_eq!(g.feed(b"\x1eISOBOX-START\n").as_deref(), Some(FRAME));
    }

    #[test]
    fn the_wrapper_prints_the_frame_before_exec() {
        let argv = wrap(vec![
            "/usr/bin/python3".into(),
            "main.py".into(),
            "a b".into(),
        ]);
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..3])
            .arg(&argv[3])
            .args(["/bin/echo", "hi", "a b"])
            .output()
            .unwrap();
        assert_eq!(out.stderr, FRAME);
        assert_eq!(out.stdout, b"hi a b\n");
        // Nothing of the shell's own reaches the program's environment.
        let env = std::process::Command::new(&argv[0])
            .args(&argv[1..4])
            .arg("/usr/bin/env")
            .env_clear()
            .env("A", "1")
            .output()
            .unwrap();
        assert_eq!(env.stdout, b"A=1\n");
        assert_eq!(&argv[4..], ["/usr/bin/python3", "main.py", "a b"]);
    }
}
