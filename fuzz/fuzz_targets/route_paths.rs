//! Request paths through every face's route table (`api::resolve`, `wbx::routes::resolve`,
//! `eryx::resolve`, all on `router::resolve`): the path is whatever a client sent.
//!
//! Never a panic (the daemon aborts on one). When a row is found, its pattern with each
//! parameter replaced by the value found for it is exactly the path: a `{name}` value is
//! one non-empty segment (no `/`), a `{name*}` value the non-empty rest, and every
//! literal segment the path's own. The first input byte picks the method (the methods
//! the tables answer, a lower-case one, and one from the input), the rest is the path
//! (lossy UTF-8, as the head parser hands over only text).
#![no_main]

use isobox::http::Params;
use libfuzzer_sys::fuzz_target;

const METHODS: &[&str] = &["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "get"];

/// `pattern` with its parameters replaced by their values in `params`, checking each.
fn rebuild(pattern: &str, params: &Params, path: &str) -> String {
    pattern
        .split('/')
        .map(|seg| {
            let name = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}'));
            match name {
                None => seg.to_string(),
                Some(n) => {
                    let (n, rest) = n.strip_suffix('*').map_or((n, false), |n| (n, true));
                    let v = params
                        .get(n)
                        .unwrap_or_else(|| panic!("{pattern}: no value for {n} in {path:?}"));
                    assert!(!v.is_empty(), "{pattern}: empty {n} in {path:?}");
                    assert!(rest || !v.contains('/'), "{pattern}: {n}={v:?} holds a slash");
                    v.to_string()
                }
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fuzz_target!(|data: &[u8]| {
    let Some((&m, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let (method, path) = match METHODS.get(usize::from(m) % (METHODS.len() + 1)) {
        Some(m) => (*m, &*text),
        // A method of the input's own: its first line; the path is the rest.
        None => text.split_once('\n').unwrap_or(("", &text)),
    };
    let path = path.to_string();
    if let Ok((spec, params)) = isobox::api::resolve(method, &path) {
        assert_eq!(rebuild(spec.pattern, &params, &path), path);
    }
    if let Ok((spec, params)) = isobox::wbx::routes::resolve(method, &path) {
        assert_eq!(rebuild(spec.pattern, &params, &path), path);
    }
    if let Ok((spec, params)) = isobox::eryx::resolve(method, &path) {
        assert_eq!(rebuild(spec.pattern, &params, &path), path);
    }
});
