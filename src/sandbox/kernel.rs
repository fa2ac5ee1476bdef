//! The kernel protocol: the harness a kernel session runs (`runtimes/kernel/harness.py`,
//! one persistent interpreter), the frames it sends on its control channel, the
//! environment it runs with, and the bounds on what it may send. The kernel's life on
//! the event loop is `daemon::kernels`.

use crate::http::Response;
use serde::Deserialize;
use std::time::Duration;

/// The harness, run as `python3 -c`.
pub const HARNESS: &str = include_str!("../../runtimes/kernel/harness.py");
/// Largest frame the harness may send: one artifact (2 MiB of payload, JSON-escaped:
/// at worst 6 bytes for a control byte) and a little framing.
pub const MAX_FRAME_BYTES: usize = (12 << 20) + (64 << 10);
/// Most artifacts one step returns.
pub const MAX_ARTIFACTS: usize = 8;
/// Largest artifact payload (base64 length for PNG, byte length for HTML).
pub const MAX_ARTIFACT_BYTES: usize = 2 << 20;
/// A kernel must say it is ready within this.
pub const BOOT_TIMEOUT: Duration = Duration::from_secs(30);
/// A frame from the harness.
#[derive(Deserialize)]
#[serde(tag = "ev", rename_all = "lowercase")]
pub enum Frame {
    /// The interpreter is up and waits for steps.
    Ready {},
    /// A rich output of the current step.
    Artifact {
        /// `image/png` or `text/html`.
        #[serde(rename = "type")]
        kind: String,
        /// A PNG's standard base64.
        #[serde(rename = "dataB64")]
        data_b64: Option<String>,
        /// An HTML fragment.
        data: Option<String>,
    },
    /// The step ended; its output is all in the pipes.
    Done {
        /// Exit status the harness reports for the step.
        exit: i64,
        /// The harness cut the step's output.
        #[serde(default)]
        truncated: bool,
    },
}

/// The kernel's environment: the runtime's, with `HOME` and the user site under
/// `/workspace` so `pip install --user` works and lasts the session.
pub fn kernel_env(runtime_env: &[String]) -> Vec<String> {
    let mut env: Vec<String> = runtime_env
        .iter()
        .filter(|e| !e.starts_with("HOME=") && !e.starts_with("PATH="))
        .cloned()
        .collect();
    env.extend(
        [
            "HOME=/workspace",
            "PATH=/workspace/.local/bin:/usr/local/bin:/usr/bin:/bin",
            "PYTHONUSERBASE=/workspace/.local",
            // Debian marks its Python externally managed; --user installs are ours.
            "PIP_BREAK_SYSTEM_PACKAGES=1",
            "PIP_DISABLE_PIP_VERSION_CHECK=1",
            "PIP_NO_CACHE_DIR=1",
            // Caches stay out of the user's workspace.
            "MPLCONFIGDIR=/tmp/.matplotlib",
            "XDG_CACHE_HOME=/tmp/.cache",
        ]
        .map(String::from),
    );
    env
}

/// Whether `s` is made of base64 characters only.
pub fn is_base64(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='))
}

/// 410 for a step in a session whose kernel has ended.
pub fn kernel_dead(why: &str) -> Response {
    Response::error(
        410,
        "kernel_dead",
        Some(&format!(
            "this session's kernel has ended: {why}; its files are still readable; delete the session and create a new one"
        )),
    )
}

/// Where a kernel is, as far as its protocol goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Started; `ready` is the one frame it may send.
    Booting,
    /// Between steps: it may send nothing.
    Idle,
    /// Running a step: `artifact` frames (at most [`MAX_ARTIFACTS`]), then `done`.
    Busy,
}

/// What the next bytes of the control channel mean.
#[derive(Debug, PartialEq)]
pub enum Said {
    /// Not a whole frame yet.
    NeedMore,
    /// The interpreter is up (it was booting).
    Ready,
    /// A rich output of the running step.
    Artifact {
        /// `image/png` or `text/html`.
        kind: String,
        /// A PNG's base64.
        data_b64: Option<String>,
        /// An HTML fragment.
        data: Option<String>,
    },
    /// The running step ended.
    Done {
        /// Its exit status.
        exit: i64,
        /// The harness cut its output.
        truncated: bool,
    },
    /// The harness broke its protocol: the kernel must end, for this reason.
    Broken(&'static str),
}

/// Takes the next frame (a 4-byte big-endian length, then JSON) out of `buf` and
/// judges it against `phase`; `artifacts` counts the current step's artifact frames.
/// Sans-IO: the event loop feeds what the socket gave and acts on the answer. A frame
/// over [`MAX_FRAME_BYTES`] is refused from its length alone, before it arrives.
pub fn next_said(buf: &mut Vec<u8>, phase: Phase, artifacts: &mut usize) -> Said {
    let Some(len) = buf.get(..4) else {
        return Said::NeedMore;
    };
    let n = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if n > MAX_FRAME_BYTES {
        return Said::Broken("the kernel broke its protocol (oversized frame)");
    }
    let Some(body) = buf.get(4..4 + n) else {
        return Said::NeedMore;
    };
    let frame: Result<Frame, _> = serde_json::from_slice(body);
    buf.drain(..4 + n);
    if matches!(frame, Ok(Frame::Artifact { .. })) {
        *artifacts += 1;
        if *artifacts > MAX_ARTIFACTS {
            return Said::Broken("the kernel broke its protocol (too many artifacts)");
        }
    }
    match (frame, phase) {
        (Ok(Frame::Ready {}), Phase::Booting) => Said::Ready,
        (
            Ok(Frame::Artifact {
                kind,
                data_b64,
                data,
            }),
            Phase::Busy,
        ) => Said::Artifact {
            kind,
            data_b64,
            data,
        },
        (Ok(Frame::Done { exit, truncated }), Phase::Busy) => Said::Done { exit, truncated },
        _ => Said::Broken("the kernel broke its protocol"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(json: &str) -> Vec<u8> {
        let mut f = u32::try_from(json.len()).unwrap().to_be_bytes().to_vec();
        f.extend_from_slice(json.as_bytes());
        f
    }

    #[test]
    fn test_frames_are_taken_whole_in_any_split() {
        let bytes = [
            frame(r#"{"ev":"artifact","type":"text/html","data":"<b>"}"#),
            frame(r#"{"ev":"done","exit":3}"#),
        ]
        .concat();
        for cut in 0..bytes.len() {
            let (mut buf, mut arts, mut said) = (bytes[..cut].to_vec(), 0, Vec::new());
            for chunk in [&bytes[..cut], &bytes[cut..]] {
                if !std::ptr::eq(chunk, &bytes[..cut]) {
                    buf.extend_from_slice(chunk);
                }
                loop {
                    match next_said(&mut buf, Phase::Busy, &mut arts) {
                        Said::NeedMore => break,
                        s => said.push(s),
                    }
                }
            }
            assert_eq!(
                said,
                vec![
                    Said::Artifact {
                        kind: "text/html".into(),
                        data_b64: None,
                        data: Some("<b>".into())
                    },
                    Said::Done {
                        exit: 3,
                        truncated: false
                    }
                ],
                "cut at {cut}"
            );
            assert!(buf.is_empty() && arts == 1);
        }
    }

    #[test]
    fn test_each_frame_only_in_its_phase() {
        let ready = frame(r#"{"ev":"ready"}"#);
        let done = frame(r#"{"ev":"done","exit":0,"truncated":true}"#);
        let said = |f: &[u8], p| next_said(&mut f.to_vec(), p, &mut 0);
        assert_eq!(said(&ready, Phase::Booting), Said::Ready);
        assert!(matches!(said(&ready, Phase::Busy), Said::Broken(_)));
        assert!(matches!(said(&ready, Phase::Idle), Said::Broken(_)));
        assert_eq!(
            said(&done, Phase::Busy),
            Said::Done {
                exit: 0,
                truncated: true
            }
        );
        assert!(matches!(said(&done, Phase::Booting), Said::Broken(_)));
        assert!(matches!(said(&done, Phase::Idle), Said::Broken(_)));
        for junk in [
            r#"{"ev":"nope"}"#,
            "not json",
            r#"{"ev":"done"}"#,
            r#"{"ev":"done","exit":"0"}"#,
        ] {
            assert!(
                matches!(said(&frame(junk), Phase::Busy), Said::Broken(_)),
                "{junk}"
            );
        }
    }

    #[test]
    fn test_frame_and_artifact_bounds_at_below_and_above() {
        // A length over the bound is refused before the body arrives.
        let mut over = u32::try_from(MAX_FRAME_BYTES + 1)
            .unwrap()
            .to_be_bytes()
            .to_vec();
        assert_eq!(
            next_said(&mut over, Phase::Busy, &mut 0),
            Said::Broken("the kernel broke its protocol (oversized frame)")
        );
        // At the bound: a whole frame of exactly MAX_FRAME_BYTES is read (and judged).
        let mut at = u32::try_from(MAX_FRAME_BYTES)
            .unwrap()
            .to_be_bytes()
            .to_vec();
        assert_eq!(next_said(&mut at, Phase::Busy, &mut 0), Said::NeedMore);
        at.resize(4 + MAX_FRAME_BYTES, b' ');
        assert!(matches!(
            next_said(&mut at, Phase::Busy, &mut 0),
            Said::Broken(_)
        ));
        assert!(at.is_empty());
        // Artifacts: MAX_ARTIFACTS pass, one more ends the kernel.
        let art = frame(r#"{"ev":"artifact","type":"image/png","dataB64":"AAAA"}"#);
        let mut n = 0;
        for _ in 0..MAX_ARTIFACTS {
            assert!(matches!(
                next_said(&mut art.clone(), Phase::Busy, &mut n),
                Said::Artifact { .. }
            ));
        }
        assert_eq!(
            next_said(&mut art.clone(), Phase::Busy, &mut n),
            Said::Broken("the kernel broke its protocol (too many artifacts)")
        );
    }
}
