//! A fake internet for the egress tests. Nothing ever leaves the machine:
//!
//! - a "harness" network namespace, where a test runs isoboxd; its only uplink is a veth
//!   (`uplink0`, 192.0.2.2/30 and 2001:db8:ff::2/64) into
//! - a "fakenet" network namespace (`down0`, 192.0.2.1/30 and 2001:db8:ff::1/64) whose
//!   loopback holds the fake hosts: the public stand-in 198.51.100.7, fake SMTP
//!   198.51.100.25, the fake resolver 198.51.100.53, fake metadata and private hosts, and
//!   2001:db8::7.
//!
//! Every listener logs every connection it accepts and every datagram it receives (a
//! [`Hit`]); a hit on a denied host means the case failed. The harness namespace has its
//! own listeners too (tcp and udp on [`FakeNet::host_port`], udp/tcp 53), standing for
//! services of the daemon's host. Both namespaces are deleted on drop, even on panic.
#![allow(dead_code)]

use crate::common::in_netns;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The harness end of the uplink (what masquerade rewrites sandbox sources to).
pub const HARNESS_UPLINK: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
/// The fakenet end of the uplink (the harness default route's gateway).
pub const FAKENET_LINK: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
/// The allowed public stand-in (tcp 80 answers HTTP, tcp 443 a banner).
pub const PUBLIC: &str = "198.51.100.7";
/// Fake SMTP (25, 465, 587).
pub const SMTP: &str = "198.51.100.25";
/// The fake resolver (udp 53).
pub const DNS: &str = "198.51.100.53";
/// What the fake public host's HTTP answer carries.
pub const PUBLIC_BODY: &str = "fake-public-ok";
/// What every denied fake host's HTTP answer carries (must never reach a sandbox).
pub const SECRET_BODY: &str = "FAKE-METADATA-SECRET";

/// Names the fake resolver answers (A records); everything else is NXDOMAIN, AAAA of a
/// known name is an empty NOERROR.
pub const DNS_MAP: &[(&str, Ipv4Addr)] = &[
    ("public.test", Ipv4Addr::new(198, 51, 100, 7)),
    ("other.test", Ipv4Addr::new(198, 51, 100, 7)),
    ("tls.test", Ipv4Addr::new(203, 0, 113, 10)),
    ("meta.evil.test", Ipv4Addr::new(169, 254, 169, 254)),
    ("rebind.test", Ipv4Addr::new(10, 0, 0, 1)),
    // An address of fakenet's that nothing holds: fakenet does not forward, so what is
    // sent to it is dropped without a word (a connection to it never completes).
    ("hole.test", Ipv4Addr::new(198, 51, 100, 99)),
];

/// A name the fake resolver never answers (the query is logged as a hit).
pub const SILENT_NAME: &str = "silent.test";

/// Denied fake hosts, each with tcp 80 (HTTP with [`SECRET_BODY`]) and udp 53 (answers
/// DNS from [`DNS_MAP`]).
pub const DENIED_V4: &[&str] = &[
    "169.254.169.254",
    "169.254.170.2",
    "169.254.0.1",
    "169.254.169.253",
    "10.0.0.1",
    "172.16.0.1",
    "192.168.1.1",
    "100.100.100.200",
    // The far ends of the denied prefixes (a too-narrow prefix lets these through).
    "10.255.255.254",
    "172.31.255.254",
    "192.168.255.254",
    "100.64.0.1",
    "100.127.255.254",
    "169.254.255.254",
    "198.18.0.1",
    "198.19.255.254",
    "192.0.0.1",
    "192.0.0.254",
    "240.0.0.1",
];

/// The second allowed public stand-in (tcp 80 answers HTTP with [`PUBLIC_BODY`]).
pub const PUBLIC2: &str = "203.0.113.9";

/// A public address with no listener of ours: a test starts its own TLS server there
/// (`tls.test`).
pub const TLS_HOST: &str = "203.0.113.10";

/// Ports of the public stand-in that are neither web nor DNS: tcp (a banner) and udp
/// (logs datagrams).
pub const PUBLIC_OTHER_TCP: u16 = 8080;
pub const PUBLIC_OTHER_UDP: u16 = 9999;

/// The fake public v6 host (tcp 443 and 80).
pub const PUBLIC_V6: &str = "2001:db8::7";

/// What a listener answers.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Reads a request head, answers HTTP 200 with this body.
    Http(&'static str),
    /// Like `Http(PUBLIC_BODY)`, but a path set with [`FakeNet::publish`] answers what
    /// was published (a way to hand a running sandbox something learnt meanwhile).
    Public,
    /// Writes this line and closes.
    Banner(&'static str),
    /// UDP: answers DNS queries from [`DNS_MAP`].
    Dns,
    /// UDP: logs only.
    Sink,
}

/// One logged connection or datagram.
#[derive(Clone, Debug)]
pub struct Hit {
    /// "fakenet" or "harness".
    pub ns: &'static str,
    /// "tcp" or "udp".
    pub proto: &'static str,
    /// The listener's address (which fake host was reached).
    pub local: SocketAddr,
    /// Who connected.
    pub peer: SocketAddr,
    /// For DNS: the queried name; otherwise empty.
    pub detail: String,
    /// When it was logged.
    pub at: Instant,
}

/// The two namespaces and their listeners.
pub struct FakeNet {
    /// Where isoboxd runs.
    pub harness: String,
    /// Where the fake hosts live.
    pub fakenet: String,
    /// tcp and udp port the harness namespace listens on ([::], dual-stack), standing for any
    /// service of the daemon's host.
    pub host_port: u16,
    hits: Arc<Mutex<Vec<Hit>>>,
    published: Published,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

type Published = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// Runs a command, panicking with its output when it fails.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command; (success, stdout + stderr).
pub fn try_sh(args: &[&str]) -> (bool, String) {
    match Command::new(args[0]).args(&args[1..]).output() {
        Ok(out) => (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        ),
        Err(e) => (false, e.to_string()),
    }
}

impl FakeNet {
    /// Creates both namespaces, the uplink and every fake host, and starts logging.
    pub fn new() -> FakeNet {
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let mut fake = FakeNet {
            harness: format!("ibh{pid}_{n}"),
            fakenet: format!("ibf{pid}_{n}"),
            host_port: 0,
            hits: Arc::new(Mutex::new(Vec::new())),
            published: Arc::new(Mutex::new(Vec::new())),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
        };
        // From here on, Drop deletes whatever part exists.
        let (h, f) = (fake.harness.clone(), fake.fakenet.clone());
        sh(&["ip", "netns", "add", &h]);
        sh(&["ip", "netns", "add", &f]);
        let ip_h = |args: &[&str]| {
            let mut v = vec!["ip", "-n", &h];
            v.extend_from_slice(args);
            sh(&v);
        };
        let ip_f = |args: &[&str]| {
            let mut v = vec!["ip", "-n", &f];
            v.extend_from_slice(args);
            sh(&v);
        };
        ip_h(&["link", "set", "lo", "up"]);
        ip_f(&["link", "set", "lo", "up"]);
        ip_h(&[
            "link", "add", "uplink0", "type", "veth", "peer", "name", "down0", "netns", &f,
        ]);
        ip_h(&["addr", "add", "192.0.2.2/30", "dev", "uplink0"]);
        ip_h(&[
            "-6",
            "addr",
            "add",
            "2001:db8:ff::2/64",
            "dev",
            "uplink0",
            "nodad",
        ]);
        ip_f(&["addr", "add", "192.0.2.1/30", "dev", "down0"]);
        ip_f(&[
            "-6",
            "addr",
            "add",
            "2001:db8:ff::1/64",
            "dev",
            "down0",
            "nodad",
        ]);
        ip_h(&["link", "set", "uplink0", "up"]);
        ip_f(&["link", "set", "down0", "up"]);
        ip_h(&[
            "route",
            "add",
            "default",
            "via",
            "192.0.2.1",
            "dev",
            "uplink0",
        ]);
        ip_h(&[
            "-6",
            "route",
            "add",
            "default",
            "via",
            "2001:db8:ff::1",
            "dev",
            "uplink0",
        ]);
        for a in [PUBLIC, PUBLIC2, TLS_HOST, SMTP, DNS]
            .iter()
            .chain(DENIED_V4)
        {
            ip_f(&["addr", "add", &format!("{a}/32"), "dev", "lo"]);
        }
        ip_f(&[
            "-6",
            "addr",
            "add",
            &format!("{PUBLIC_V6}/128"),
            "dev",
            "lo",
            // Without it the address is tentative until the kernel's DAD work runs
            // (even on lo), and binding it fails with EADDRNOTAVAIL on a loaded host.
            "nodad",
        ]);

        // fakenet never forwards: it only answers for its own fake hosts.
        in_netns(&f, || {
            std::fs::write("/proc/sys/net/ipv4/ip_forward", "0").unwrap();
            std::fs::write("/proc/sys/net/ipv6/conf/all/forwarding", "0").unwrap();
        });
        // Fake hosts: bound from a thread inside fakenet (sockets keep their namespace).
        let mut specs: Vec<(&str, u16, bool, Kind)> = vec![
            (PUBLIC, 80, true, Kind::Public),
            (PUBLIC, 443, true, Kind::Banner("fake-tls")),
            (PUBLIC2, 80, true, Kind::Http(PUBLIC_BODY)),
            (PUBLIC, PUBLIC_OTHER_TCP, true, Kind::Banner("fake-other")),
            (PUBLIC, PUBLIC_OTHER_UDP, false, Kind::Sink),
            (DNS, 53, false, Kind::Dns),
            (PUBLIC_V6, 443, true, Kind::Banner("fake-tls-v6")),
            (PUBLIC_V6, 80, true, Kind::Http(PUBLIC_BODY)),
        ];
        for p in [25, 465, 587] {
            specs.push((SMTP, p, true, Kind::Banner("220 fake-smtp ESMTP")));
        }
        for a in DENIED_V4 {
            specs.push((a, 80, true, Kind::Http(SECRET_BODY)));
            specs.push((a, 53, false, Kind::Dns));
        }
        let specs2: Vec<(SocketAddr, bool, Kind)> = specs
            .iter()
            .map(|(a, p, tcp, k)| (SocketAddr::new(a.parse().unwrap(), *p), *tcp, *k))
            .collect();
        let socks = in_netns(&f, move || bind_all(&specs2));
        fake.spawn_server("fakenet", socks);

        // The harness namespace's own services (the daemon's host).
        let socks = in_netns(&h, || {
            // Dual-stack: IPv4 (as mapped addresses) and IPv6, link-local included.
            let l = TcpListener::bind("[::]:0").expect("harness tcp");
            l.set_nonblocking(true).unwrap();
            let port = l.local_addr().unwrap().port();
            let any = |p: u16| SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), p);
            let mut v = vec![(Sock::Tcp(l), Kind::Http(SECRET_BODY))];
            v.extend(bind_all(&[
                (any(port), false, Kind::Sink),
                (any(53), false, Kind::Dns),
                (any(53), true, Kind::Http(SECRET_BODY)),
            ]));
            v
        });
        fake.host_port = match &socks[0].0 {
            Sock::Tcp(l) => l.local_addr().unwrap().port(),
            Sock::Udp(_) => unreachable!(),
        };
        fake.spawn_server("harness", socks);
        fake
    }

    fn spawn_server(&mut self, ns: &'static str, socks: Vec<(Sock, Kind)>) {
        let hits = Arc::clone(&self.hits);
        let published = Arc::clone(&self.published);
        let stop = Arc::clone(&self.stop);
        self.threads.push(std::thread::spawn(move || {
            serve(ns, socks, hits, published, stop)
        }));
    }

    /// From now on `GET <path>` on the public stand-in's port 80 answers `body`.
    pub fn publish(&self, path: &str, body: &str) {
        self.publish_bytes(path, body.as_bytes());
    }

    /// Like [`publish`](Self::publish), with any bytes (a wheel for pip, say).
    pub fn publish_bytes(&self, path: &str, body: &[u8]) {
        self.published
            .lock()
            .unwrap()
            .push((path.to_string(), body.to_vec()));
    }

    /// Everything logged so far.
    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// Forgets what was logged (call before the part of a test whose hits you check).
    pub fn clear(&self) {
        self.hits.lock().unwrap().clear();
    }

    /// Hits on a given fake host (any port/proto), in either namespace.
    pub fn hits_to(&self, ip: &str) -> Vec<Hit> {
        let ip: IpAddr = ip.parse().unwrap();
        self.hits()
            .into_iter()
            .filter(|h| h.local.ip() == ip)
            .collect()
    }

    /// Hits on anything but the allowed public stand-ins (198.51.100.7, 203.0.113.9 and
    /// the resolver 198.51.100.53): every denied fake host, the v6 host (IPv6 is denied
    /// as a whole) and the harness namespace's own listeners.
    pub fn denied_hits(&self) -> Vec<Hit> {
        let ok: [IpAddr; 3] = [
            PUBLIC.parse().unwrap(),
            PUBLIC2.parse().unwrap(),
            DNS.parse().unwrap(),
        ];
        self.hits()
            .into_iter()
            .filter(|h| h.ns == "harness" || !ok.contains(&h.local.ip()))
            .collect()
    }

    /// Runs a command inside the harness namespace (via nsenter, no /sys remount).
    pub fn in_harness(&self, args: &[&str]) -> (bool, String) {
        let net = format!("--net=/run/netns/{}", self.harness);
        let mut v = vec!["nsenter", net.as_str()];
        v.extend_from_slice(args);
        try_sh(&v)
    }

    /// Interface names in the harness namespace.
    pub fn harness_links(&self) -> Vec<String> {
        let (_, out) = try_sh(&["ip", "-n", &self.harness, "-o", "link", "show"]);
        out.lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .collect()
    }
}

impl Drop for FakeNet {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // The servers poll every 50 ms; never hang a test's teardown on one.
        let deadline = Instant::now() + Duration::from_secs(3);
        while self.threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // What a daemon in the harness noted when it turned forwarding on there
        // (`/run/isobox/ip_forward-by-isobox.<netns inode>`) goes with the namespace.
        if let Ok(m) = std::fs::metadata(format!("/run/netns/{}", self.harness)) {
            use std::os::unix::fs::MetadataExt;
            let _ = std::fs::remove_file(format!("/run/isobox/ip_forward-by-isobox.{}", m.ino()));
        }
        let _ = try_sh(&["ip", "netns", "del", &self.harness]);
        let _ = try_sh(&["ip", "netns", "del", &self.fakenet]);
    }
}

enum Sock {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

impl Sock {
    fn fd(&self) -> i32 {
        match self {
            Sock::Tcp(s) => s.as_raw_fd(),
            Sock::Udp(s) => s.as_raw_fd(),
        }
    }
}

fn bind_all(specs: &[(SocketAddr, bool, Kind)]) -> Vec<(Sock, Kind)> {
    specs
        .iter()
        .map(|(a, tcp, k)| {
            let s = if *tcp {
                Sock::Tcp(TcpListener::bind(a).unwrap_or_else(|e| panic!("bind tcp {a}: {e}")))
            } else {
                Sock::Udp(UdpSocket::bind(a).unwrap_or_else(|e| panic!("bind udp {a}: {e}")))
            };
            match &s {
                Sock::Tcp(l) => l.set_nonblocking(true).unwrap(),
                Sock::Udp(u) => u.set_nonblocking(true).unwrap(),
            }
            (s, *k)
        })
        .collect()
}

/// One thread polls every listener of a namespace until `stop`.
fn serve(
    ns: &'static str,
    socks: Vec<(Sock, Kind)>,
    hits: Arc<Mutex<Vec<Hit>>>,
    published: Published,
    stop: Arc<AtomicBool>,
) {
    let mut fds: Vec<libc::pollfd> = socks
        .iter()
        .map(|(s, _)| libc::pollfd {
            fd: s.fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let mut buf = [0u8; 2048];
    while !stop.load(Ordering::SeqCst) {
        for p in fds.iter_mut() {
            p.revents = 0;
        }
        // SAFETY: fds is a valid array of pollfd of the given length.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 50) };
        if n <= 0 {
            continue;
        }
        for (i, (sock, kind)) in socks.iter().enumerate() {
            if fds[i].revents == 0 {
                continue;
            }
            match sock {
                Sock::Tcp(l) => {
                    while let Ok((stream, peer)) = l.accept() {
                        let local = stream.local_addr().unwrap_or(l.local_addr().unwrap());
                        hits.lock().unwrap().push(Hit {
                            ns,
                            proto: "tcp",
                            local,
                            peer,
                            detail: String::new(),
                            at: Instant::now(),
                        });
                        let kind = *kind;
                        let published = Arc::clone(&published);
                        std::thread::spawn(move || answer_tcp(stream, kind, published));
                    }
                }
                Sock::Udp(u) => {
                    while let Ok((len, peer)) = u.recv_from(&mut buf) {
                        let q = &buf[..len];
                        let (name, reply) = match kind {
                            Kind::Dns => match dns_answer(q) {
                                Some((name, r)) => (name, Some(r)),
                                None => (String::from("<not dns>"), None),
                            },
                            _ => (
                                String::from_utf8_lossy(&q[..q.len().min(64)]).into_owned(),
                                None,
                            ),
                        };
                        hits.lock().unwrap().push(Hit {
                            ns,
                            proto: "udp",
                            local: u.local_addr().unwrap(),
                            peer,
                            detail: name,
                            at: Instant::now(),
                        });
                        if let Some(r) = reply.filter(|r| !r.is_empty()) {
                            let _ = u.send_to(&r, peer);
                        }
                    }
                }
            }
        }
    }
}

fn answer_tcp(mut s: TcpStream, kind: Kind, published: Published) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    match kind {
        Kind::Banner(b) => {
            let _ = s.write_all(format!("{b}\r\n").as_bytes());
        }
        Kind::Http(_) | Kind::Public => {
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16384 {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&req);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let body = match kind {
                Kind::Http(b) => b.as_bytes().to_vec(),
                _ => published
                    .lock()
                    .unwrap()
                    .iter()
                    .rev()
                    .find(|(p, _)| p == path)
                    .map_or_else(|| PUBLIC_BODY.as_bytes().to_vec(), |(_, b)| b.clone()),
            };
            let mut resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .into_bytes();
            resp.extend_from_slice(&body);
            let _ = s.write_all(&resp);
        }
        Kind::Dns | Kind::Sink => {}
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    // Let the peer read before the close (no RST over unread data).
    let mut sink = [0u8; 512];
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    while let Ok(n) = s.read(&mut sink) {
        if n == 0 {
            break;
        }
    }
}

/// Parses a DNS query; returns the name and the answer from [`DNS_MAP`] (empty: no
/// answer is sent, for [`SILENT_NAME`]).
pub fn dns_answer(q: &[u8]) -> Option<(String, Vec<u8>)> {
    if q.len() < 12 || q[2] & 0x80 != 0 {
        return None;
    }
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let l = *q.get(i)? as usize;
        i += 1;
        if l == 0 {
            break;
        }
        if l > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + l)?).to_ascii_lowercase());
        i += l;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let qend = i + 4;
    q.get(..qend)?;
    let name = labels.join(".");
    if name == SILENT_NAME {
        return Some((format!("{name} type {qtype}"), Vec::new()));
    }
    let found = DNS_MAP.iter().find(|(n, _)| *n == name).map(|(_, a)| *a);
    let mut r = Vec::with_capacity(qend + 16);
    r.extend_from_slice(&q[..2]); // id
    r.push(0x84 | (q[2] & 0x79)); // QR, opcode, AA, RD
    r.push(0x80 | if found.is_some() { 0 } else { 3 }); // RA, NOERROR/NXDOMAIN
    r.extend_from_slice(&[0, 1]); // qdcount
    let answer = found.filter(|_| qtype == 1);
    r.extend_from_slice(&[0, answer.is_some() as u8, 0, 0, 0, 0]);
    r.extend_from_slice(&q[12..qend]);
    if let Some(a) = answer {
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        r.extend_from_slice(&a.octets());
    }
    Some((format!("{name} type {qtype}"), r))
}
