//! The start signal of a cold run: tells "the sandbox never started" (a 5xx
//! `sandbox_start_failed`) from "the program ran and failed" (a 200 with its result).
//!
//! `runsc run` hands the container its own stdio, so anything runsc says when it fails
//! (and its exit status) looks exactly like the program's. A cold run's argv is therefore
//! prefixed with `/bin/sh -c 'printf FRAME >&2; exec "$@"'` (the compiled runtimes' build
//! script prints the same frame first): the frame is the first thing on the sandbox's
//! stderr, written before the program exists, so the program cannot forge or hide it.
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

/// The sandbox argv of a cold interpreted run (`argv` is the program's own).
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
