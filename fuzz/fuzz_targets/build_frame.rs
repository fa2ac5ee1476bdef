//! The compile-stage frame on stderr: same outcome whether it arrives whole or split.
//!
//! Fed whole vs in two pieces (every split point of inputs up to 160 bytes; for longer
//! ones the points around the header cap and the first newline; plus four
//! input-derived ones), the outcome must be identical: `Done`
//! with the same result and rest, `Invalid` with the same bytes, or `More`. When the
//! first piece already decided, the second is appended to `Done`'s rest or `Invalid`'s
//! bytes, exactly as the reactor then treats later stderr as the program's.
//! Also: `Invalid` hands back every byte fed, `Done`'s rest is a suffix of the input,
//! and a timed-out build reports exit code 137.
#![no_main]

use isobox::sandbox::build::{Feed, FrameParser};
use isobox_fuzz::Rng;
use libfuzzer_sys::fuzz_target;

const TIMEOUT_MS: u64 = 30_000;

fn split(data: &[u8], k: usize) -> Feed {
    let mut p = FrameParser::default();
    match p.feed(&data[..k], TIMEOUT_MS) {
        Feed::Done(r, mut rest) => {
            rest.extend_from_slice(&data[k..]);
            Feed::Done(r, rest)
        }
        Feed::Invalid(mut bytes) => {
            bytes.extend_from_slice(&data[k..]);
            Feed::Invalid(bytes)
        }
        Feed::More => p.feed(&data[k..], TIMEOUT_MS),
    }
}

/// A short description (byte vectors abbreviated) for assertion messages.
fn show(f: &Feed) -> String {
    let bytes = |b: &[u8]| {
        let s = b.escape_ascii().to_string();
        if s.len() > 80 {
            format!("{}...({} bytes)", &s[..80], b.len())
        } else {
            format!("b\"{s}\"")
        }
    };
    match f {
        Feed::More => "More".into(),
        Feed::Invalid(b) => format!("Invalid({})", bytes(b)),
        Feed::Done(r, rest) => format!("Done({r:?}, rest {})", bytes(rest)),
    }
}

fuzz_target!(|data: &[u8]| {
    let whole = FrameParser::default().feed(data, TIMEOUT_MS);
    match &whole {
        Feed::Invalid(bytes) => assert_eq!(bytes.as_slice(), data, "Invalid lost bytes"),
        Feed::Done(r, rest) => {
            assert!(data.ends_with(rest), "rest is not the input's tail");
            if r.timed_out {
                assert_eq!(r.exit_code, 137, "timed out but exit code {}", r.exit_code);
            }
        }
        Feed::More => {}
    }
    let mut rng = Rng::new(data);
    let mut ks: Vec<usize> = if data.len() <= 160 {
        (0..=data.len()).collect()
    } else {
        // Long inputs: around the header cap and the first newline, plus random points.
        let nl = data.iter().position(|&b| b == b'\n').unwrap_or(0);
        (120..=140).chain(nl.saturating_sub(1)..=nl + 1).collect()
    };
    ks.extend((0..4).map(|_| rng.upto(data.len())));
    for k in ks.into_iter().filter(|&k| k <= data.len()) {
        let two = split(data, k);
        assert!(
            whole == two,
            "fed whole vs split at {k}:\n  whole: {}\n  split: {}",
            show(&whole),
            show(&two)
        );
    }
});
