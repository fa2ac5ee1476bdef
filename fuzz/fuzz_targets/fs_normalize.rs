//! Request paths of the session file API: `workspace::fs::normalize` never panics, and
//! what it returns is a path confined to the workspace root.
//!
//! On `Ok`: no component is empty, `.` or `..`, none holds `/` or NUL, none is longer
//! than `MAX_NAME_LEN`, the joined path is at most `MAX_PATH_LEN` bytes; every component
//! is one of the input's `/`-separated segments, in input order (exactly those segments
//! minus `""` and `.` when there is no `..`); normalising `to_bytes()` again gives the
//! same path (idempotent); a leading `/`, `../` or `../../` changes nothing (traversal
//! is collapsed inside the root); `parent`/`file_name`/`is_root` agree with the
//! components; `display()` is `/` + the bytes, and the `Display` used in logs holds no
//! control character (a hostile name cannot forge log lines). On `Err`: only
//! `FsError::InvalidPath`, exactly when the input has a NUL, is over `MAX_PATH_LEN` or
//! has a segment over `MAX_NAME_LEN`, and the prefixed inputs fail too.
#![no_main]

use isobox::workspace::fs::{normalize, FsError, RelPath, MAX_NAME_LEN, MAX_PATH_LEN};
use libfuzzer_sys::fuzz_target;

fn check_ok(raw: &[u8], p: &RelPath) {
    let comps = p.components();
    for c in comps {
        assert!(!c.is_empty(), "empty component in {p:?}");
        assert!(c != b"." && c != b"..", "dot component in {p:?}");
        assert!(!c.contains(&b'/'), "'/' in a component of {p:?}");
        assert!(!c.contains(&0), "NUL in a component of {p:?}");
        assert!(c.len() <= MAX_NAME_LEN, "component of {} bytes", c.len());
    }
    let bytes = p.to_bytes();
    assert!(bytes.len() <= MAX_PATH_LEN, "normalised path of {} bytes", bytes.len());
    assert!(bytes.len() <= raw.len(), "normalising made the path longer");
    assert_eq!(bytes.is_empty(), p.is_root());
    assert!(!bytes.starts_with(b"/") && !bytes.ends_with(b"/"), "{bytes:?}");

    // Every component is an input segment, in input order (`..` only removes).
    let segments: Vec<&[u8]> = raw.split(|&b| b == b'/').collect();
    let mut at = 0;
    for c in comps {
        let i = segments[at..]
            .iter()
            .position(|s| *s == c.as_slice())
            .unwrap_or_else(|| panic!("component {c:?} is not an input segment after #{at}"));
        at += i + 1;
    }
    if !segments.iter().any(|s| *s == b"..") {
        let plain: Vec<&[u8]> = segments
            .iter()
            .copied()
            .filter(|s| !s.is_empty() && *s != b".")
            .collect();
        let got: Vec<&[u8]> = comps.iter().map(Vec::as_slice).collect();
        assert_eq!(got, plain, "without `..` the components are the plain segments");
    }

    // Idempotent.
    match normalize(&bytes) {
        Ok(again) => assert_eq!(&again, p, "normalize(to_bytes()) differs"),
        Err(e) => panic!("normalize(to_bytes() of {p:?}) failed: {e}"),
    }

    // Accessors.
    assert_eq!(p.file_name(), comps.last().map(Vec::as_slice));
    let parent = p.parent();
    assert_eq!(
        parent.components(),
        &comps[..comps.len().saturating_sub(1)],
        "parent of {p:?}"
    );
    let shown = p.display();
    assert!(shown.starts_with('/'));
    let mut want = b"/".to_vec();
    want.extend_from_slice(&bytes);
    assert_eq!(shown, String::from_utf8_lossy(&want), "display()");
    let logged = p.to_string();
    assert!(logged.starts_with('/'));
    assert!(
        !logged.chars().any(char::is_control),
        "control character in the log form {logged:?}"
    );
    if p.is_root() {
        assert_eq!(logged, "/");
    }
}

fn invalid(e: &FsError) -> bool {
    matches!(e, FsError::InvalidPath(_))
}

fuzz_target!(|raw: &[u8]| {
    let res = normalize(raw);
    let should_fail = raw.contains(&0)
        || raw.len() > MAX_PATH_LEN
        || raw.split(|&b| b == b'/').any(|s| s.len() > MAX_NAME_LEN);
    match &res {
        Ok(p) => {
            assert!(!should_fail, "accepted {} bytes: {p:?}", raw.len());
            check_ok(raw, p);
        }
        Err(e) => {
            assert!(invalid(e), "normalize failed with {e:?}, not InvalidPath");
            assert!(should_fail, "refused a valid path: {e}");
        }
    }

    // Traversal and absolute paths collapse inside the root.
    for prefix in [&b"/"[..], b"../", b"../../", b"//./../"] {
        let mut prefixed = prefix.to_vec();
        prefixed.extend_from_slice(raw);
        let again = normalize(&prefixed);
        match (&res, &again) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "prefix {:?} changed the result", prefix),
            (Ok(_), Err(e)) => {
                // Only the extra length may make it fail.
                assert!(invalid(e), "{e:?}");
                assert!(
                    prefixed.len() > MAX_PATH_LEN,
                    "prefix {:?} made a valid path fail: {e}",
                    prefix
                );
            }
            (Err(_), Ok(b)) => panic!("prefix {:?} made an invalid path valid: {b:?}", prefix),
            (Err(_), Err(e)) => assert!(invalid(e), "{e:?}"),
        }
    }
});
