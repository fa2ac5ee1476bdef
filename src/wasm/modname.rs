//! Python module names, as an eryx environment's `imports` may give them. One file for
//! the daemon (which checks an upload's form) and the worker (which checks again what
//! it is asked to import; it includes this file by path).

/// A dotted Python module name (`jinja2`, `xml.etree`), ASCII, at most 200 bytes.
pub fn is_module_name(m: &str) -> bool {
    !m.is_empty()
        && m.len() <= 200
        && m.split('.').all(|p| {
            let mut c = p.chars();
            c.next()
                .is_some_and(|f| f == '_' || f.is_ascii_alphabetic())
                && c.all(|ch| ch == '_' || ch.is_ascii_alphanumeric())
        })
}

/// A name under isobox's own helper modules (`_isobox_…`), which an environment's
/// build adds for itself: not a tenant's to import or ship.
pub fn is_reserved(m: &str) -> bool {
    m.split('.')
        .next()
        .is_some_and(|top| top.starts_with("_isobox_"))
}
