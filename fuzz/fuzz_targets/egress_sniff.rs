//! The gate's readers of hostile bytes: `netfilter::sniff::http_host` and `tls_sni` on a
//! sandbox's first bytes, and `netfilter::dns::parse_a` on a resolver's answer.
//!
//! None panics. A name found is already normalised (lower case, no trailing dot, valid
//! labels, not an address). Once the first bytes give a name, more bytes after them
//! change nothing (the name is decided by what came first). `parse_a` returns at most
//! 16 addresses, and only for the name asked.
#![no_main]

use isobox::netfilter::dns::parse_a;
use isobox::netfilter::policy::normalize_host;
use isobox::netfilter::sniff::{http_host, tls_sni, Sniff, MAX_SNIFF};
use libfuzzer_sys::fuzz_target;

fn check(buf: &[u8], f: fn(&[u8]) -> Sniff) {
    let r = f(buf);
    if let Sniff::Name(n) = &r {
        assert_eq!(normalize_host(n).as_deref(), Some(n.as_str()), "unnormalised {n:?}");
        let mut more = buf.to_vec();
        more.extend_from_slice(b"\x16\x03\x01GET / HTTP/1.1\r\nHost: other.example\r\n\r\n");
        assert_eq!(f(&more), r, "bytes after the name changed it");
    }
    if buf.len() >= MAX_SNIFF + 64 * 1024 {
        assert_ne!(r, Sniff::More, "still asking for more after {} bytes", buf.len());
    }
}

fuzz_target!(|data: &[u8]| {
    check(data, http_host);
    check(data, tls_sni);
    if data.len() >= 2 {
        let id = u16::from_be_bytes([data[0], data[1]]);
        if let Ok(a) = parse_a(data, id, "a.example") {
            assert!(!a.is_empty() && a.len() <= 16, "{a:?}");
        }
    }
});
