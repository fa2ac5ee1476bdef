//! A sandbox's network allowlist: the names its web traffic may ask for, the ranges it
//! may reach directly, and what it may never reach even so (`block` wins over `allow`).
//!
//! Names are checked by the gate against the HTTP `Host` or the TLS SNI of each
//! connection; ranges go into the kernel's sets for the sandbox's link. Either way the
//! operator's deny list applies first: an allowlist only ever narrows.

use super::Cidr;
use std::net::Ipv4Addr;

/// At most this many entries in `allow`, and as many in `block`.
pub const MAX_ENTRIES: usize = 64;
/// The longest name (RFC 1035's 253 characters).
const MAX_NAME: usize = 253;

/// A name pattern: `example.com` (that name only) or `*.example.com` (any name below
/// it, at any depth, not `example.com` itself).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Name {
    Exact(String),
    Below(String),
}

impl Name {
    fn matches(&self, host: &str) -> bool {
        match self {
            Name::Exact(n) => n == host,
            Name::Below(n) => host
                .strip_suffix(n.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }
}

/// One sandbox's allowlist.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Allowlist {
    names: Vec<Name>,
    nets: Vec<Cidr>,
    block_names: Vec<Name>,
    block_nets: Vec<Cidr>,
}

/// A host name as the gate compares it: lower case, without a trailing dot, of
/// letters, digits, hyphens and underscores in labels of 1 to 63; `None` when it is not
/// one (an address, an empty label, a space...).
pub fn normalize_host(host: &str) -> Option<String> {
    let h = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if h.is_empty() || h.len() > MAX_NAME || h.parse::<Ipv4Addr>().is_ok() {
        return None;
    }
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    h.split('.').all(label_ok).then_some(h)
}

/// One entry of `allow` or `block`: a name pattern or a range.
fn entry(field: &str, s: &str) -> Result<Result<Name, Cidr>, String> {
    let t = s.trim();
    let bad = || {
        format!(
            "{field}: {s:?} is not a domain (like pypi.org or *.pythonhosted.org), an IPv4 address or a range like 203.0.113.0/24"
        )
    };
    if t.contains("://") {
        return Err(bad());
    }
    if t.parse::<std::net::Ipv6Addr>().is_ok()
        || t.split_once('/')
            .is_some_and(|(a, _)| a.parse::<std::net::Ipv6Addr>().is_ok())
    {
        return Err(format!(
            "{field}: {s:?}: IPv6 is not available to sandboxes"
        ));
    }
    if t.contains(':') {
        return Err(format!(
            "{field}: {s:?}: an entry takes no port (names apply to ports 80 and 443; an address or range to every port)"
        ));
    }
    if t.parse::<Ipv4Addr>().is_ok() {
        return format!("{t}/32")
            .parse::<Cidr>()
            .map(Err)
            .map_err(|e| format!("{field}: {s:?}: {e}"));
    }
    if let Some((a, _)) = t.split_once('/') {
        if a.parse::<Ipv4Addr>().is_err() {
            return Err(bad());
        }
        return t
            .parse::<Cidr>()
            .map(Err)
            .map_err(|e| format!("{field}: {s:?}: {e}"));
    }
    if let Some(rest) = t.strip_prefix("*.") {
        let n = normalize_host(rest).ok_or_else(bad)?;
        // `*.com` would open a whole top-level domain; ask for a registrable name.
        if !n.contains('.') {
            return Err(format!(
                "{field}: {s:?}: a wildcard needs at least two labels after `*.` (like *.example.com)"
            ));
        }
        return Ok(Ok(Name::Below(n)));
    }
    normalize_host(t)
        .map(|n| Ok(Name::Exact(n)))
        .ok_or_else(bad)
}

impl Allowlist {
    /// Parses `allow` and `block` (field names `network.allow`/`network.block` in
    /// errors). A range that lies wholly inside one of `denied` is refused: the
    /// sandbox could never reach it.
    ///
    /// # Errors
    /// What is wrong, naming the field and the entry.
    pub fn parse(allow: &[String], block: &[String], denied: &[Cidr]) -> Result<Allowlist, String> {
        let mut a = Allowlist::default();
        for (field, list) in [("network.allow", allow), ("network.block", block)] {
            if list.len() > MAX_ENTRIES {
                return Err(format!("{field}: at most {MAX_ENTRIES} entries"));
            }
            for s in list {
                if s.len() > MAX_NAME + 2 {
                    return Err(format!("{field}: entries of at most {MAX_NAME} characters"));
                }
                let blocking = field == "network.block";
                match entry(field, s)? {
                    Ok(n) if blocking => a.block_names.push(n),
                    Ok(n) => a.names.push(n),
                    Err(c) if blocking => a.block_nets.push(c),
                    Err(c) => {
                        if let Some(d) = denied
                            .iter()
                            .find(|d| d.prefix_len() <= c.prefix_len() && d.overlaps(c))
                        {
                            return Err(format!(
                                "{field}: {s:?} is inside {d}, which sandboxes may never reach"
                            ));
                        }
                        a.nets.push(c);
                    }
                }
            }
        }
        if a.names.is_empty() && a.nets.is_empty() {
            return Err("network.allow: list at least one domain or address for mode allowlist (or use mode none)".into());
        }
        Ok(a)
    }

    /// Whether a connection asking for `host` (already normalised) may be made.
    pub fn allows_name(&self, host: &str) -> bool {
        self.names.iter().any(|n| n.matches(host))
            && !self.block_names.iter().any(|n| n.matches(host))
    }

    /// Whether `ip` is in a blocked range.
    pub fn blocks(&self, ip: Ipv4Addr) -> bool {
        self.block_nets.iter().any(|c| c.contains(ip))
    }

    /// The ranges the sandbox reaches directly.
    pub fn nets(&self) -> &[Cidr] {
        &self.nets
    }

    /// The ranges it never reaches.
    pub fn block_nets(&self) -> &[Cidr] {
        &self.block_nets
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(allow: &[&str], block: &[&str]) -> Result<Allowlist, String> {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let denied: Vec<Cidr> = super::super::DENIED
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        Allowlist::parse(&v(allow), &v(block), &denied)
    }

    #[test]
    fn names_match_exactly_or_below_a_wildcard_and_block_wins() {
        let a = p(
            &["pypi.org", "*.pythonhosted.org", "Example.COM."],
            &["evil.pythonhosted.org"],
        )
        .unwrap();
        for ok in [
            "pypi.org",
            "files.pythonhosted.org",
            "a.b.pythonhosted.org",
            "example.com",
        ] {
            assert!(a.allows_name(ok), "{ok}");
        }
        for no in [
            "pythonhosted.org",
            "evil.pythonhosted.org",
            "www.pypi.org",
            "pypi.org.evil.test",
            "xpythonhosted.org",
            "notpypi.org",
        ] {
            assert!(!a.allows_name(no), "{no}");
        }
        assert_eq!(normalize_host("PyPI.org."), Some("pypi.org".into()));
        for bad in [
            "",
            "a..b",
            "-a.b",
            "a b",
            "1.2.3.4",
            "a.b:80",
            &"a".repeat(64),
        ] {
            assert_eq!(normalize_host(bad), None, "{bad}");
        }
    }

    #[test]
    fn ranges_parse_and_denied_ones_are_refused_with_the_reason() {
        let a = p(&["203.0.113.9", "198.51.100.0/24"], &["198.51.100.7"]).unwrap();
        assert_eq!(a.nets().len(), 2);
        assert!(a.blocks("198.51.100.7".parse().unwrap()));
        assert!(!a.blocks("198.51.100.8".parse().unwrap()));
        let e = p(&["10.1.2.3"], &[]).unwrap_err();
        assert_eq!(
            e,
            "network.allow: \"10.1.2.3\" is inside 10.0.0.0/8, which sandboxes may never reach"
        );
        assert!(p(&["169.254.169.254/32"], &[]).is_err());
        // A range only partly denied is allowed: the deny list still cuts its part.
        assert!(p(&["0.0.0.0/0"], &[]).is_ok());
        assert!(p(&["2001:db8::1"], &[]).unwrap_err().contains("IPv6"));
        assert!(p(&["10.0.0.1/8"], &[]).unwrap_err().contains("host bits"));
        assert!(p(&["*.com"], &[]).unwrap_err().contains("two labels"));
        assert!(p(&["http://x.org"], &[]).is_err());
        assert!(p(&[], &["x.org"]).unwrap_err().contains("at least one"));
    }

    #[test]
    fn entry_counts_are_bounded_at_the_limit() {
        let names: Vec<String> = (0..MAX_ENTRIES)
            .map(|i| format!("h{i}.example.com"))
            .collect();
        let v: Vec<&str> = names.iter().map(String::as_str).collect();
        assert!(p(&v, &v).is_ok());
        let more: Vec<String> = (0..=MAX_ENTRIES)
            .map(|i| format!("h{i}.example.com"))
            .collect();
        let v2: Vec<&str> = more.iter().map(String::as_str).collect();
        assert_eq!(
            p(&v2, &[]).unwrap_err(),
            format!("network.allow: at most {MAX_ENTRIES} entries")
        );
        assert!(p(&["a.org"], &v2)
            .unwrap_err()
            .starts_with("network.block: at most"));
    }
}
