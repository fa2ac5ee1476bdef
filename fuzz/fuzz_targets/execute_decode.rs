//! `POST /execute` bodies: `decode` never panics, and what it accepts is safe to run.
//!
//! The runtimes are `isobox_fuzz::runtimes()`: the embedded descriptors, with only
//! `python-slim` and `python` "installed".
//!
//! On `Ok`: every limit within its bound, at least one file and at most `MAX_FILES`,
//! every name valid (`validate_name`), no name twice and none both a file and a
//! directory, the entry is the first file, args bounded and NUL-free, an installed
//! runtime, and file contents as sent (utf8) or strictly hex-decoded. On `Err`: status 400 and a JSON object body with an `"error"` string
//! (one of the codes the spec names).
#![no_main]

use isobox::api::execute::{decode, validate_name, MAX_ARGS, MAX_FILES};
use isobox::sandbox::limits::{CPUS, MEMORY_BYTES, OUTPUT_BYTES, PIDS, WALL_TIME_MS};
use isobox_fuzz::{runtimes, INSTALLED};
use libfuzzer_sys::fuzz_target;

const ERROR_CODES: [&str; 6] = [
    "invalid_json",
    "language_required",
    "unknown_language",
    "unknown_version",
    "no_source",
    "invalid_file",
];

/// Strict hex: pairs of `[0-9a-fA-F]`, nothing else.
fn strict_hex(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    if b.len() % 2 != 0 || !b.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let nib = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    b.chunks(2)
        .map(|p| Some(nib(p[0])? << 4 | nib(p[1])?))
        .collect()
}

/// The plan's file contents are the request's, decoded as each file's encoding says.
fn check_contents(body: &[u8], files: &[(String, Vec<u8>)]) {
    let v: serde_json::Value = serde_json::from_slice(body).expect("accepted body is JSON");
    let offset = usize::from(v.get("code").is_some_and(|c| c.is_string()));
    let Some(list) = v.get("files").and_then(|f| f.as_array()) else {
        return;
    };
    assert_eq!(files.len(), offset + list.len(), "files dropped or added");
    for (i, f) in list.iter().enumerate() {
        let (name, got) = &files[offset + i];
        assert_eq!(Some(name.as_str()), f["name"].as_str());
        let content = f["content"].as_str().expect("content is a string");
        match f.get("encoding").and_then(|e| e.as_str()).unwrap_or("utf8") {
            "utf8" | "utf-8" => assert_eq!(got.as_slice(), content.as_bytes()),
            "hex" => assert_eq!(
                Some(got),
                strict_hex(content.trim()).as_ref(),
                "files[{i}]: hex {content:?} decoded leniently"
            ),
            _ => {}
        }
    }
}

fuzz_target!(|body: &[u8]| {
    let rts = runtimes();
    match decode(rts, body) {
        Ok(plan) => {
            let l = plan.limits;
            assert!(
                (MEMORY_BYTES.0..=MEMORY_BYTES.1).contains(&l.memory_bytes),
                "{l:?}"
            );
            assert!(l.cpus >= CPUS.0 && l.cpus <= CPUS.1, "{l:?}");
            assert!((PIDS.0..=PIDS.1).contains(&l.pids), "{l:?}");
            assert!(
                (OUTPUT_BYTES.0..=OUTPUT_BYTES.1).contains(&l.output_bytes),
                "{l:?}"
            );
            assert!(
                (WALL_TIME_MS.0..=WALL_TIME_MS.1).contains(&l.wall_time_ms),
                "{l:?}"
            );
            assert!(!plan.files.is_empty(), "a plan with no files");
            assert!(plan.files.len() <= MAX_FILES, "{} files", plan.files.len());
            for (i, (name, _)) in plan.files.iter().enumerate() {
                assert_eq!(validate_name(name), Ok(()), "file name {name:?} accepted");
                for (other, _) in &plan.files[..i] {
                    assert_ne!(name, other, "{name:?} twice");
                    let (s, l) = if name.len() < other.len() {
                        (name, other)
                    } else {
                        (other, name)
                    };
                    assert!(
                        !(l.starts_with(s.as_str()) && l.as_bytes().get(s.len()) == Some(&b'/')),
                        "{s:?} is both a file and a directory"
                    );
                }
            }
            assert_eq!(plan.entry, plan.files[0].0);
            assert!(plan.args.len() <= MAX_ARGS);
            assert!(!plan.args.iter().any(|a| a.contains('\0')));
            assert!(plan.runtime.is_installed());
            assert!(INSTALLED.contains(&plan.runtime.desc.language.as_str()));
            assert!(
                serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v.is_object()),
                "accepted a body that is not a JSON object"
            );
            check_contents(body, &plan.files);
        }
        Err(resp) => {
            assert_eq!(resp.status, 400, "decode answered {}", resp.status);
            let v: serde_json::Value =
                serde_json::from_slice(&resp.body).expect("error body is JSON");
            let code = v
                .get("error")
                .and_then(|e| e.as_str())
                .expect("an \"error\" string");
            assert!(
                ERROR_CODES.contains(&code),
                "unexpected error code {code:?}"
            );
            if let Some(d) = v.get("detail") {
                assert!(d.is_string(), "detail {d}");
            }
        }
    }
});
