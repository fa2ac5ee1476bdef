//! What name a sandbox's web connection asks for, read from its first bytes: the `Host`
//! header of an HTTP request (port 80) or the `server_name` of a TLS ClientHello (port
//! 443). Sans-IO and bounded: the gate feeds what it has read so far and gets a name,
//! a refusal, or "need more" until `MAX_SNIFF` bytes.

use super::policy::normalize_host;

/// The most the gate reads before it must know the name: a request head of 16 KiB, or
/// a ClientHello of up to 16 KiB in one or more records (with their 5-byte headers).
pub const MAX_SNIFF: usize = 16 * 1024 + 64 * 5;

/// What the first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniff {
    /// Not enough bytes yet.
    More,
    /// The name asked for (normalised).
    Name(String),
    /// No usable name, and why (the connection is refused).
    Refuse(&'static str),
}

/// The `Host` of the HTTP request head that `buf` begins with.
pub fn http_host(buf: &[u8]) -> Sniff {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buf.len() >= MAX_SNIFF {
            Sniff::Refuse("the request head is larger than 16 KiB")
        } else if buf.first().is_some_and(|b| !b.is_ascii_uppercase()) {
            Sniff::Refuse("not an HTTP request")
        } else {
            Sniff::More
        };
    };
    let Ok(head) = std::str::from_utf8(&buf[..end]) else {
        return Sniff::Refuse("the request head is not text");
    };
    let mut lines = head.split("\r\n");
    let request = lines.next().unwrap_or("");
    let mut parts = request.split(' ');
    let (Some(method), Some(_), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Sniff::Refuse("not an HTTP request line");
    };
    if method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !version.starts_with("HTTP/1.")
    {
        return Sniff::Refuse("not an HTTP/1 request");
    }
    let mut host = None;
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            return Sniff::Refuse("a header line without a colon");
        };
        if k.eq_ignore_ascii_case("host") {
            if host.is_some() {
                // Two Hosts: which one a server believes is its own business.
                return Sniff::Refuse("more than one Host header");
            }
            host = Some(v.trim());
        }
    }
    let Some(host) = host else {
        return Sniff::Refuse("no Host header");
    };
    // host[:port]; an IPv6 literal or userinfo is no name.
    let name = match host.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => h,
        Some(_) => return Sniff::Refuse("the Host header is not a name"),
        None => host,
    };
    normalize_host(name).map_or(Sniff::Refuse("the Host header is not a name"), Sniff::Name)
}

/// The `server_name` of the TLS ClientHello that `buf` begins with.
pub fn tls_sni(buf: &[u8]) -> Sniff {
    // The handshake bytes, reassembled from consecutive handshake records.
    let mut hs: Vec<u8> = Vec::new();
    let mut at = 0;
    while let Some(h) = buf.get(at..at + 5) {
        if h[0] != 22 {
            return Sniff::Refuse("not a TLS handshake");
        }
        if h[1] != 3 {
            return Sniff::Refuse("not TLS");
        }
        let len = usize::from(u16::from_be_bytes([h[3], h[4]]));
        if len == 0 || len > 16 * 1024 {
            return Sniff::Refuse("a TLS record of a bad length");
        }
        let Some(body) = buf.get(at + 5..at + 5 + len) else {
            break;
        };
        hs.extend_from_slice(body);
        at += 5 + len;
        if hs.len() >= 4 {
            let need =
                4 + (usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3]));
            if hs.len() >= need {
                break;
            }
        }
    }
    if hs.len() < 4 {
        return more_or_refuse(buf);
    }
    if hs[0] != 1 {
        return Sniff::Refuse("the first TLS message is not a ClientHello");
    }
    let need = 4 + (usize::from(hs[1]) << 16 | usize::from(hs[2]) << 8 | usize::from(hs[3]));
    if need > 16 * 1024 {
        return Sniff::Refuse("a ClientHello larger than 16 KiB");
    }
    if hs.len() < need {
        return more_or_refuse(buf);
    }
    client_hello_sni(&hs[4..need])
}

fn more_or_refuse(buf: &[u8]) -> Sniff {
    if buf.len() >= MAX_SNIFF {
        Sniff::Refuse("the ClientHello is too large")
    } else {
        Sniff::More
    }
}

/// A cursor over a ClientHello's fields.
struct Cur<'a>(&'a [u8]);

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (a, b) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = b;
        Some(a)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
}

fn client_hello_sni(body: &[u8]) -> Sniff {
    let malformed = Sniff::Refuse("a malformed ClientHello");
    let mut c = Cur(body);
    let parsed = (|| -> Option<Option<Sniff>> {
        c.take(2 + 32)?; // version, random
        let n = c.u8()?;
        c.take(n)?; // session id
        let n = c.u16()?;
        c.take(n)?; // cipher suites
        let n = c.u8()?;
        c.take(n)?; // compression methods
        if c.0.is_empty() {
            return Some(None);
        }
        let n = c.u16()?;
        let mut ext = Cur(c.take(n)?);
        while !ext.0.is_empty() {
            let ty = ext.u16()?;
            let n = ext.u16()?;
            let data = ext.take(n)?;
            if ty != 0 {
                continue;
            }
            let mut sn = Cur(data);
            let n = sn.u16()?;
            let mut list = Cur(sn.take(n)?);
            while !list.0.is_empty() {
                let kind = list.u8()?;
                let n = list.u16()?;
                let name = list.take(n)?;
                if kind == 0 {
                    let s = std::str::from_utf8(name).ok();
                    return Some(Some(s.and_then(normalize_host).map_or(
                        Sniff::Refuse("the TLS server name is not a name"),
                        Sniff::Name,
                    )));
                }
            }
            return Some(None);
        }
        Some(None)
    })();
    match parsed {
        None => malformed,
        Some(None) => Sniff::Refuse("the ClientHello names no server (SNI)"),
        Some(Some(s)) => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ClientHello with `sni` (if any) in `records` records.
    pub(crate) fn client_hello(sni: Option<&str>, records: usize) -> Vec<u8> {
        let mut exts = Vec::new();
        // An unrelated extension first (supported_groups).
        exts.extend_from_slice(&[0, 10, 0, 4, 0, 2, 0, 29]);
        if let Some(n) = sni {
            let n = n.as_bytes();
            let list_len = 3 + n.len();
            exts.extend_from_slice(&0u16.to_be_bytes());
            exts.extend_from_slice(&((list_len + 2) as u16).to_be_bytes());
            exts.extend_from_slice(&(list_len as u16).to_be_bytes());
            exts.push(0);
            exts.extend_from_slice(&(n.len() as u16).to_be_bytes());
            exts.extend_from_slice(n);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
        hs.extend_from_slice(&body);
        let per = hs.len().div_ceil(records);
        let mut out = Vec::new();
        for chunk in hs.chunks(per) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn http_host_is_read_with_or_without_port_and_needs_the_whole_head() {
        let req = b"GET /simple/ HTTP/1.1\r\nUser-Agent: pip\r\nHost: PyPI.org:80\r\n\r\n";
        assert_eq!(http_host(req), Sniff::Name("pypi.org".into()));
        for cut in 0..req.len() {
            assert_eq!(http_host(&req[..cut]), Sniff::More, "{cut}");
        }
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nX: y\r\n\r\n"),
            Sniff::Refuse("no Host header")
        );
        assert_eq!(
            http_host(b"GET / HTTP/1.1\r\nHost: a.org\r\nHost: b.org\r\n\r\n"),
            Sniff::Refuse("more than one Host header")
        );
        for bad in [
            &b"GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: u@a.org\r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00\x01",
            b"GET / SPDY\r\nHost: a.org\r\n\r\n",
        ] {
            assert!(matches!(http_host(bad), Sniff::Refuse(_)), "{bad:?}");
        }
        let mut big = b"GET / HTTP/1.1\r\nX: ".to_vec();
        big.resize(MAX_SNIFF, b'a');
        assert!(matches!(http_host(&big), Sniff::Refuse(_)));
    }

    #[test]
    fn sni_is_read_from_one_or_several_records() {
        for records in [1, 2, 5] {
            let ch = client_hello(Some("Files.PythonHosted.org"), records);
            assert_eq!(tls_sni(&ch), Sniff::Name("files.pythonhosted.org".into()));
            for cut in 0..ch.len() {
                assert_eq!(tls_sni(&ch[..cut]), Sniff::More, "{records} {cut}");
            }
        }
        assert_eq!(
            tls_sni(&client_hello(None, 1)),
            Sniff::Refuse("the ClientHello names no server (SNI)")
        );
        assert!(matches!(
            tls_sni(&client_hello(Some("1.2.3.4"), 1)),
            Sniff::Refuse(_)
        ));
        assert!(matches!(tls_sni(b"GET / HTTP/1.1\r\n"), Sniff::Refuse(_)));
        // A truncated extension list inside a complete message.
        let mut ch = client_hello(Some("a.org"), 1);
        let n = ch.len();
        ch[n - 8] = 0xff;
        assert!(matches!(tls_sni(&ch), Sniff::Refuse(_)));
    }
}
