//! The start signal of a cold run: tells "the sandbox never started" (a 5xx
//! `sandbox_start_failed`) from "the program ran and failed" (a 200 with its result).
//!
//! `runsc run` hands the container its own stdio, so anything runsc says when it fails
//! (and its exit status) looks exactly like the program's. A cold run's argv is therefore
//! prefixed with a program that writes FRAME to stderr and then execs the program's
//! argv: on x86-64, `isobox-start` ([`BINARY`], `start.c`: static, no libc), which the
//! gVisor backend copies into each run's root overlay at [`PATH`]; elsewhere, or for a
//! program not named by an absolute path, `/bin/sh -c 'printf FRAME >&2; exec "$@"'`.
//! (The compiled runtimes' build script prints the same frame first.) The frame is the
//! first thing on the sandbox's stderr, written before the program exists, so the
//! program cannot forge or hide it.
//! Until it arrives the run is starting; the frame is stripped, and whatever came before
//! it (runsc's own words) is kept for the log, never shown as the program's stderr. A
//! run that ends, or reaches its start deadline, without the frame failed to start.
//!
//! Pooled (warm) runs and kernel steps need none: their harness said `ready` before the
//! run was handed over.

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

/// Watches the front of a cold run's stderr for the frame.
#[derive(Debug, Default)]
pub struct StartGate {
    buf: Vec<u8>,
    noise: Vec<u8>,
    began: bool,
}

impl StartGate {
    /// A gate that is already open (pooled runs, kernel steps).
    pub fn open() -> StartGate {
        StartGate {
            began: true,
            ..StartGate::default()
        }
    }

    /// Whether the frame has arrived.
    pub fn began(&self) -> bool {
        self.began
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
    /// (the program's stderr) once it is complete; `None` while still waiting.
    pub fn feed(&mut self, data: &[u8]) -> Option<Vec<u8>> {
        if self.began {
            return Some(data.to_vec());
        }
        self.buf.extend_from_slice(data);
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
