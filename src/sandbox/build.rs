//! The compile stage of compiled runtimes (go, rust, typescript), inside the same sandbox.
//!
//! The sandbox runs `/bin/sh -c BUILD_SCRIPT` with the build argv and the run argv as
//! positional parameters (never interpolated into the script, so names and args arrive
//! literally). The script runs the build under `timeout -s KILL`, with its output to
//! files in /tmp (the shell's own stderr is muted meanwhile, so its "Killed" notice
//! cannot precede the frame), then writes ONE frame on stderr — before the program exists, so the
//! program cannot forge it — and `exec`s the program only when the build succeeded:
//!
//! ```text
//! \x1eISOBOX-BUILD <exit> <ms> <stdout-len> <stderr-len>\n<stdout bytes><stderr bytes>
//! ```

use crate::sandbox::plan::CompileResult;

/// The wrapper script. `$1` compile timeout (s), `$2` output cap, `$3` build word count.
pub const BUILD_SCRIPT: &str = r#"printf '\036ISOBOX-START\n' >&2
t=$1; cap=$2; n=$3; shift 3
m=$(( $# - n ))
j=0; while [ $j -lt $n ]; do set -- "$@" "$1"; shift; j=$((j+1)); done
s=$(date +%s%N)
exec 3>&2 2>/dev/null
( shift $m; exec timeout -s KILL "$t" "$@" ) >/tmp/.isobox-build.out 2>/tmp/.isobox-build.err </dev/null 3>&-
rc=$?
exec 2>&3 3>&-
e=$(date +%s%N)
o=$(head -c "$cap" /tmp/.isobox-build.out | wc -c); r=$(head -c "$cap" /tmp/.isobox-build.err | wc -c)
printf '\036ISOBOX-BUILD %s %s %s %s\n' "$rc" $(( (e - s) / 1000000 )) "$o" "$r" >&2
head -c "$cap" /tmp/.isobox-build.out >&2; head -c "$cap" /tmp/.isobox-build.err >&2
rm -f /tmp/.isobox-build.out /tmp/.isobox-build.err
[ "$rc" -eq 0 ] || exit "$rc"
j=0; while [ $j -lt $m ]; do set -- "$@" "$1"; shift; j=$((j+1)); done
shift $n
unset PWD
exec "$@"
"#;

const MAGIC: &[u8] = b"\x1eISOBOX-BUILD ";
const MAX_HEADER: usize = 128;
/// Largest compile output length a frame may announce (the wrapper caps at outputBytes).
const MAX_OUTPUT: usize = 1 << 20;

/// The sandbox argv for a compiled runtime.
pub fn wrap(build: Vec<String>, run: Vec<String>, timeout_ms: u64, cap: u64) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        BUILD_SCRIPT.to_string(),
        "isobox-build".to_string(),
    ];
    argv.push(timeout_ms.div_ceil(1000).to_string());
    argv.push(cap.to_string());
    argv.push(build.len().to_string());
    argv.extend(build);
    argv.extend(run);
    argv
}

/// Parses the frame off the front of stderr.
#[derive(Debug, Default)]
pub struct FrameParser {
    buf: Vec<u8>,
    header: Option<(i32, u64, usize, usize)>,
}

/// What feeding bytes produced.
#[derive(Debug, PartialEq)]
pub enum Feed {
    /// Need more bytes.
    More,
    /// The frame is complete; the rest of the input belongs to the program.
    Done(CompileResult, Vec<u8>),
    /// Not a frame (the wrapper failed); all bytes are ordinary stderr.
    Invalid(Vec<u8>),
}

impl FrameParser {
    /// Feeds stderr bytes.
    pub fn feed(&mut self, data: &[u8], timeout_ms: u64) -> Feed {
        self.buf.extend_from_slice(data);
        if self.header.is_none() {
            let n = self.buf.len().min(MAGIC.len());
            if self.buf[..n] != MAGIC[..n] {
                return Feed::Invalid(std::mem::take(&mut self.buf));
            }
            // The same bound whether the header arrives whole or in pieces.
            let nl = self
                .buf
                .iter()
                .take(MAX_HEADER + 1)
                .position(|&b| b == b'\n');
            let Some(nl) = nl else {
                return if self.buf.len() > MAX_HEADER {
                    Feed::Invalid(std::mem::take(&mut self.buf))
                } else {
                    Feed::More
                };
            };
            let line = String::from_utf8_lossy(&self.buf[MAGIC.len()..nl]).into_owned();
            let f: Vec<&str> = line.split(' ').collect();
            let parsed = match f.as_slice() {
                [rc, ms, o, e] => rc
                    .parse()
                    .ok()
                    .zip(ms.parse().ok())
                    .zip(o.parse().ok())
                    .zip(e.parse().ok())
                    .map(|(((a, b), c), d)| (a, b, c, d)),
                _ => None,
            };
            // Lengths are capped by the wrapper's `head -c`; anything larger is not ours.
            let Some(h) = parsed.filter(|&(_, _, o, e): &(i32, u64, usize, usize)| {
                o <= MAX_OUTPUT && e <= MAX_OUTPUT
            }) else {
                return Feed::Invalid(std::mem::take(&mut self.buf));
            };
            self.header = Some(h);
            self.buf.drain(..=nl);
        }
        let Some((rc, ms, o, e)) = self.header else {
            return Feed::More;
        };
        if self.buf.len() < o + e {
            return Feed::More;
        }
        let rest = self.buf.split_off(o + e);
        let timed_out = (rc == 124 || rc == 137) && ms.saturating_add(50) >= timeout_ms;
        let result = CompileResult {
            stdout: String::from_utf8_lossy(&self.buf[..o]).into_owned(),
            stderr: String::from_utf8_lossy(&self.buf[o..o + e]).into_owned(),
            exit_code: if timed_out { 137 } else { rc },
            timed_out,
            oom_killed: false,
            duration_ms: ms,
        };
        Feed::Done(result, rest)
    }

    /// Bytes held so far (for a frame that never completed).
    pub fn take_partial(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_frame_in_any_split() {
        let frame = b"\x1eISOBOX-BUILD 2 1234 4 4\nout\nerr!program stderr";
        for split in 0..frame.len() {
            let mut p = FrameParser::default();
            let first = p.feed(&frame[..split], 30_000);
            let done = match first {
                Feed::Done(r, mut rest) => {
                    rest.extend_from_slice(&frame[split..]);
                    Feed::Done(r, rest)
                }
                _ => p.feed(&frame[split..], 30_000),
            };
            let Feed::Done(r, rest) = done else {
                panic!("split {split}: {done:?}")
            };
            assert_eq!(
                (
                    r.exit_code,
                    r.duration_ms,
                    r.stdout.as_str(),
                    r.stderr.as_str()
                ),
                (2, 1234, "out\n", "err!")
            );
            assert!(!r.timed_out);
            assert_eq!(rest, b"program stderr");
        }
    }

    #[test]
    fn test_timeout_and_invalid() {
        let mut p = FrameParser::default();
        let Feed::Done(r, _) = p.feed(b"\x1eISOBOX-BUILD 137 30001 0 0\n", 30_000) else {
            panic!()
        };
        assert!(r.timed_out);
        assert_eq!(r.exit_code, 137);
        let mut p = FrameParser::default();
        assert_eq!(
            p.feed(b"sh: 1: timeout: not found\n", 30_000),
            Feed::Invalid(b"sh: 1: timeout: not found\n".to_vec())
        );
    }

    /// Inputs found by fuzzing (fuzz/regressions/build_frame): no panic, and the same
    /// outcome whole or split anywhere.
    #[test]
    fn test_fuzz_regressions_same_outcome_in_any_split() {
        let long = format!("\x1eISOBOX-BUILD 0 0 {}\n", "0".repeat(115));
        let cases: Vec<Vec<u8>> = vec![
            b"\x1eISOBOX-BUILD 124 18446744073709551615 0 0\n".to_vec(),
            b"\x1eISOBOX-BUILD 4 3 5 18446744073709551615\n".to_vec(),
            b"\x1eISOBOX-BUILD 0 0 5 18446744073709551615\nabcd".to_vec(),
            long.into_bytes(),
        ];
        for input in cases {
            let whole = FrameParser::default().feed(&input, 30_000);
            for split in 0..=input.len() {
                let mut p = FrameParser::default();
                let first = p.feed(&input[..split], 30_000);
                let outcome = match first {
                    Feed::More => p.feed(&input[split..], 30_000),
                    Feed::Done(r, mut rest) => {
                        rest.extend_from_slice(&input[split..]);
                        Feed::Done(r, rest)
                    }
                    Feed::Invalid(mut b) => {
                        b.extend_from_slice(&input[split..]);
                        Feed::Invalid(b)
                    }
                };
                assert_eq!(
                    outcome,
                    whole,
                    "split at {split} of {:?}",
                    String::from_utf8_lossy(&input)
                );
            }
        }
    }
}
