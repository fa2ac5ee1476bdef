//! A minimal DNS client for the gate: one `A` question over UDP to the sandboxes' own
//! resolvers (`ISOBOX_NET_DNS`), never the host's `/etc/hosts` or resolv.conf, so the
//! gate sees the names as the sandbox would, and nothing the host alone resolves.
//!
//! The parser is sans-IO and bounded: it follows at most `MAX_CHAIN` CNAMEs within one
//! answer, reads compressed names with at most `MAX_POINTERS` jumps, and never reads
//! beyond the message.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};

/// CNAMEs followed within one answer.
const MAX_CHAIN: usize = 8;
/// Compression pointers followed within one name.
const MAX_POINTERS: usize = 16;
/// Addresses kept from one answer.
const MAX_ADDRS: usize = 16;

/// Why a name did not resolve.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    /// The resolver says there is no such name (NXDOMAIN) or it has no `A` record.
    #[error("{0} has no IPv4 address")]
    NoAddress(String),
    /// The resolver answered with an error code.
    #[error("the resolver answered rcode {0}")]
    Rcode(u8),
    /// The answer was not a DNS answer to our question.
    #[error("malformed answer: {0}")]
    Malformed(&'static str),
    /// No resolver answered in time.
    #[error("no resolver answered")]
    Timeout,
}

/// The question for `name`'s `A` record, with id `id`, recursion desired.
pub fn query(name: &str, id: u16) -> Vec<u8> {
    let mut q = Vec::with_capacity(18 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        q.push(label.len().min(63) as u8);
        q.extend_from_slice(&label.as_bytes()[..label.len().min(63)]);
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Reads the name at `at`; returns it (lower case) and where the record goes on.
fn read_name(msg: &[u8], mut at: usize) -> Result<(String, usize), DnsError> {
    let bad = DnsError::Malformed;
    let mut name = String::new();
    let mut next = None;
    let mut jumps = 0;
    loop {
        let len = *msg.get(at).ok_or(bad("name beyond the message"))? as usize;
        match len & 0xc0 {
            0x00 if len == 0 => {
                return Ok((name, next.unwrap_or(at + 1)));
            }
            0x00 => {
                let label = msg
                    .get(at + 1..at + 1 + len)
                    .ok_or(bad("label beyond the message"))?;
                if !name.is_empty() {
                    name.push('.');
                }
                name.extend(label.iter().map(|b| b.to_ascii_lowercase() as char));
                if name.len() > 255 {
                    return Err(bad("name too long"));
                }
                at += 1 + len;
            }
            0xc0 => {
                let lo = *msg.get(at + 1).ok_or(bad("pointer beyond the message"))? as usize;
                jumps += 1;
                if jumps > MAX_POINTERS {
                    return Err(bad("compression loop"));
                }
                next.get_or_insert(at + 2);
                at = (len & 0x3f) << 8 | lo;
            }
            _ => return Err(bad("unknown label type")),
        }
    }
}

fn be16(msg: &[u8], at: usize) -> Result<u16, DnsError> {
    msg.get(at..at + 2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]))
        .ok_or(DnsError::Malformed("record beyond the message"))
}

/// The `A` addresses of `name` in answer `msg` to question id `id`, following CNAMEs
/// the answer carries.
///
/// # Errors
/// Not an answer to our question, an error code, or no address.
pub fn parse_a(msg: &[u8], id: u16, name: &str) -> Result<Vec<Ipv4Addr>, DnsError> {
    let bad = DnsError::Malformed;
    if msg.len() < 12 || be16(msg, 0)? != id || msg[2] & 0x80 == 0 {
        return Err(bad("not the answer to our question"));
    }
    match msg[3] & 0x0f {
        0 => {}
        3 => return Err(DnsError::NoAddress(name.to_string())),
        rc => return Err(DnsError::Rcode(rc)),
    }
    let (qd, an) = (be16(msg, 4)?, be16(msg, 6)?);
    if qd != 1 {
        return Err(bad("not one question"));
    }
    let (qname, at) = read_name(msg, 12)?;
    if qname != name || be16(msg, at)? != 1 || be16(msg, at + 2)? != 1 {
        return Err(bad("the answer's question is not ours"));
    }
    let mut at = at + 4;
    let mut records: Vec<(String, u16, Vec<u8>, usize)> = Vec::new();
    for _ in 0..an.min(64) {
        let (owner, p) = read_name(msg, at)?;
        let ty = be16(msg, p)?;
        let class = be16(msg, p + 2)?;
        let len = be16(msg, p + 8)? as usize;
        let data_at = p + 10;
        let data = msg
            .get(data_at..data_at + len)
            .ok_or(bad("record data beyond the message"))?;
        if class == 1 {
            records.push((owner, ty, data.to_vec(), data_at));
        }
        at = data_at + len;
    }
    let mut want = name.to_string();
    let mut addrs = Vec::new();
    for _ in 0..=MAX_CHAIN {
        for (owner, ty, data, _) in &records {
            if *owner == want && *ty == 1 && data.len() == 4 && addrs.len() < MAX_ADDRS {
                addrs.push(Ipv4Addr::new(data[0], data[1], data[2], data[3]));
            }
        }
        if !addrs.is_empty() {
            return Ok(addrs);
        }
        let Some((_, _, _, data_at)) = records.iter().find(|(o, ty, _, _)| *o == want && *ty == 5)
        else {
            break;
        };
        want = read_name(msg, *data_at)?.0;
    }
    Err(DnsError::NoAddress(name.to_string()))
}

/// Sends the question for `name`'s `A` record to resolver `ns` from a fresh
/// non-blocking socket connected to it (so only `ns`'s datagrams arrive on it); the
/// socket and the question's id. The caller watches the socket and reads the answer
/// with [`parse_a`] (a datagram that is [`DnsError::Malformed`] is someone else's,
/// such as a late answer to an earlier try: keep waiting).
///
/// # Errors
/// The socket could not be made or the question not sent.
pub fn send_query(name: &str, ns: Ipv4Addr) -> io::Result<(UdpSocket, u16)> {
    let sock = UdpSocket::bind("0.0.0.0:0")?;
    sock.connect(SocketAddr::new(ns.into(), 53))?;
    sock.set_nonblocking(true)?;
    let mut id = [0u8; 2];
    let _ = getrandom(&mut id);
    let id = u16::from_be_bytes(id);
    sock.send(&query(name, id))?;
    Ok((sock, id))
}

fn getrandom(buf: &mut [u8]) -> Result<(), ring::error::Unspecified> {
    use ring::rand::SecureRandom;
    ring::rand::SystemRandom::new().fill(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(id: u16, name: &str, rrs: &[(&str, u16, Vec<u8>)], rcode: u8) -> Vec<u8> {
        let mut m = query(name, id);
        m[2] = 0x81;
        m[3] = 0x80 | rcode;
        m[7] = rrs.len() as u8;
        for (owner, ty, data) in rrs {
            if *owner == name {
                m.extend_from_slice(&[0xc0, 12]);
            } else {
                m.extend_from_slice(&query(owner, 0)[12..12 + owner.len() + 2]);
            }
            m.extend_from_slice(&ty.to_be_bytes());
            m.extend_from_slice(&[0, 1, 0, 0, 0, 60]);
            m.extend_from_slice(&(data.len() as u16).to_be_bytes());
            m.extend_from_slice(data);
        }
        m
    }

    fn name_bytes(n: &str) -> Vec<u8> {
        query(n, 0)[12..12 + n.len() + 2].to_vec()
    }

    #[test]
    fn a_records_and_cname_chains_are_followed() {
        let m = answer(7, "pypi.org", &[("pypi.org", 1, vec![151, 101, 0, 223])], 0);
        assert_eq!(
            parse_a(&m, 7, "pypi.org").unwrap(),
            vec![Ipv4Addr::new(151, 101, 0, 223)]
        );
        let m = answer(
            9,
            "www.x.org",
            &[
                ("www.x.org", 5, name_bytes("cdn.y.net")),
                ("cdn.y.net", 1, vec![203, 0, 113, 5]),
                ("other.z", 1, vec![10, 0, 0, 1]),
            ],
            0,
        );
        assert_eq!(
            parse_a(&m, 9, "www.x.org").unwrap(),
            vec![Ipv4Addr::new(203, 0, 113, 5)]
        );
        // An address for a name the chain never reaches is not taken.
        let m = answer(9, "www.x.org", &[("other.z", 1, vec![10, 0, 0, 1])], 0);
        assert_eq!(
            parse_a(&m, 9, "www.x.org"),
            Err(DnsError::NoAddress("www.x.org".into()))
        );
    }

    #[test]
    fn errors_wrong_ids_and_hostile_messages_are_refused() {
        let m = answer(7, "a.org", &[], 3);
        assert_eq!(
            parse_a(&m, 7, "a.org"),
            Err(DnsError::NoAddress("a.org".into()))
        );
        assert_eq!(
            parse_a(&answer(7, "a.org", &[], 2), 7, "a.org"),
            Err(DnsError::Rcode(2))
        );
        let ok = answer(7, "a.org", &[("a.org", 1, vec![1, 2, 3, 4])], 0);
        assert!(parse_a(&ok, 8, "a.org").is_err());
        assert!(parse_a(&ok, 7, "b.org").is_err());
        for cut in 0..ok.len() {
            assert!(parse_a(&ok[..cut], 7, "a.org").is_err(), "{cut}");
        }
        // A pointer to itself.
        let mut looped = answer(7, "a.org", &[], 0);
        looped[7] = 1;
        looped.extend_from_slice(&[
            0xc0,
            (looped.len()) as u8,
            0,
            1,
            0,
            1,
            0,
            0,
            0,
            1,
            0,
            4,
            1,
            2,
            3,
            4,
        ]);
        assert!(parse_a(&looped, 7, "a.org").is_err());
        // A CNAME loop ends.
        let m = answer(
            7,
            "a.org",
            &[
                ("a.org", 5, name_bytes("b.org")),
                ("b.org", 5, name_bytes("a.org")),
            ],
            0,
        );
        assert_eq!(
            parse_a(&m, 7, "a.org"),
            Err(DnsError::NoAddress("a.org".into()))
        );
    }
}
