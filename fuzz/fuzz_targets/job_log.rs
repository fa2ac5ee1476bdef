//! A job's log is whatever its command printed: the digest never panics on it, keeps
//! its character budget, and bounds what it stores (failures per framework, each
//! field clipped); the redactor replaces every secret value whichever way the output
//! is split, and changes nothing else.
//!
//! The input's first byte picks a chunk size for the redactor; its next 16 bytes are
//! two secret values (8 bytes each, used when lower-case letters and digits only: then
//! no occurrence can cross a `[REDACTED]`, so none may be left); the rest is the log.
#![no_main]

use isobox::jobs::digest::{self, MAX_FAILURES};
use isobox::jobs::{Redactor, REDACTED};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 17 {
        return;
    }
    let step = usize::from(data[0]).max(1);
    let secrets: Vec<String> = data[1..17]
        .chunks(8)
        .filter(|c| c.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    let log = &data[17..];
    let text = String::from_utf8_lossy(log);
    for budget in [100, 2000] {
        let (out, results) = digest::digest(&text, false, budget);
        assert!(out.chars().count() <= budget + 64, "{} > {budget}", out.chars().count());
        for r in &results {
            assert!(r.failures.len() <= MAX_FAILURES);
            for f in &r.failures {
                assert!(f.name.chars().count() <= 301 && f.message.chars().count() <= 301);
                assert!(f.file.as_ref().is_none_or(|x| x.chars().count() <= 301));
            }
        }
        let (errors, _) = digest::digest(&text, true, budget);
        assert!(errors.chars().count() <= budget);
    }
    // Redaction in pieces equals redaction of the whole, and no secret survives.
    let mut r = Redactor::new(secrets.iter().map(String::as_str));
    let mut pieces = Vec::new();
    for c in log.chunks(step) {
        pieces.extend(r.push(c));
    }
    pieces.extend(r.finish());
    let mut whole = Redactor::new(secrets.iter().map(String::as_str));
    let mut once = whole.push(log);
    once.extend(whole.finish());
    assert_eq!(pieces, once);
    for s in &secrets {
        let s = s.as_bytes();
        assert!(!pieces.windows(s.len()).any(|w| w == s), "a secret was left");
    }
    let _ = REDACTED;
});
