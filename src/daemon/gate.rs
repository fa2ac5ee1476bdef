//! The gate: where an allowlisted sandbox's web traffic arrives. The table's prerouting
//! chain redirects such a sandbox's TCP to ports 80 and 443 of any address it does not
//! list here, whatever address it meant; the gate reads the name the connection asks
//! for (the HTTP `Host`, the TLS SNI), checks it against the sandbox's allowlist,
//! resolves that name itself with the sandboxes' resolvers, re-checks every address
//! against the deny list, the allowlist's `block` and the host's own addresses, and
//! connects to the name's address on the original port — never to the address the
//! sandbox chose. So `/etc/hosts`, a lying resolver or DNS rebinding change nothing.
//!
//! Nothing of that waits on a worker: the pool only makes sockets (the loop's seccomp
//! filter has no `socket` or `connect`), and the loop watches each question and each
//! connection being made, with its own timer. A name whose resolvers never answer, or
//! an address that swallows connections, holds only its own connection's sockets, never
//! what other sandboxes' connections need.
//!
//! After the first bytes (forwarded as they came) it is a pipe with a bounded buffer
//! each way, closed when both sides are done, after `IDLE` without a byte, when the
//! sandbox's lease ends, or when egress stops being verified.

use super::proxy::{connect_outcome, write_side};
use super::Daemon;
use crate::netfilter::policy::Allowlist;
use crate::netfilter::sniff::{self, Sniff};
use crate::reactor::{Addr, Component, ComponentId, Done, Readiness};
use mio::net::{TcpListener, TcpStream, UdpSocket};
use mio::{Interest, Token};
use slab::Slab;
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The gate component.
pub(crate) const GATE: ComponentId = ComponentId(9);
/// The listening socket (key 0).
pub(crate) const LISTENER: u16 = 0;
const CLIENT: u16 = 1;
const UPSTREAM: u16 = 2;
/// Timer: accept again after a failed accept (key 0); a connection's check.
const ACCEPT_RETRY: u16 = 3;
const CHECK: u16 = 4;
/// Timer: go on relaying a connection that still had bytes moving when its turn ended.
const CONTINUE: u16 = 5;
/// A resolver's answer (the question's socket).
const ANSWER: u16 = 6;
/// Timer: the question or the connection being made took too long.
const STEP: u16 = 7;
/// Relay rounds (each up to 64 KiB each way) one connection gets per turn of the loop,
/// so one fast pipe cannot keep the reactor from everything else.
const ROUNDS_PER_TURN: usize = 8;

/// How long a connection may take to say which name it wants.
const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);
/// One resolver's time to answer, per try (each resolver is asked in turn, twice round).
const DNS_TRY: Duration = Duration::from_secs(2);
/// Times each resolver is asked.
const DNS_ROUNDS: usize = 2;
/// How long a connection to the name's address may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Addresses of one name tried in turn.
const TRIES: usize = 3;
/// A pipe with no byte either way for this long is closed.
const IDLE: Duration = super::proxy::ACTIVE_IDLE;
/// How often a connection checks that its lease and egress are still there.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// Bytes buffered each way.
const BUF: usize = 64 * 1024;
/// Datagrams read from a question's socket per turn of the loop.
const ANSWER_READS: usize = 64;
/// Connections through the gate at once, all sandboxes together.
const MAX_CONNS: usize = 4096;
/// A TLS alert: fatal, `access_denied`.
const TLS_ACCESS_DENIED: [u8; 7] = [0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x31];

/// The gate's events on the loop.
pub(crate) struct Gates;

impl Component<Daemon> for Gates {
    fn name(&self) -> &'static str {
        "gate"
    }

    fn ready(&self, d: &mut Daemon, gk: usize, what: u16, _: Readiness) {
        match what {
            LISTENER => d.gate_accept(),
            CLIENT => {
                if let Some(c) = d.gate.conns.get_mut(gk) {
                    c.c_readable = true;
                }
                d.gate_pump(gk);
            }
            UPSTREAM => {
                if let Some(c) = d.gate.conns.get_mut(gk) {
                    c.u_readable = true;
                }
                d.gate_pump(gk);
            }
            ANSWER => d.gate_answer(gk),
            _ => {}
        }
    }

    fn timer(&self, d: &mut Daemon, gk: usize, what: u16, gen: u64) {
        match what {
            ACCEPT_RETRY => d.gate_accept(),
            CHECK => d.gate_check(gk, gen),
            CONTINUE => d.gate_pump(gk),
            STEP => d.gate_step_late(gk, gen),
            ANSWER => d.gate_answer(gk),
            _ => {}
        }
    }
}

/// Where a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the first bytes for the name.
    Sniff,
    /// Asking the resolvers for the name's addresses.
    Resolving,
    /// Connecting to one of them.
    Connecting,
    /// Relaying both ways.
    Pipe,
    /// Writing a refusal, then closing.
    Refusing,
}

/// One sandbox connection through the gate.
pub(crate) struct GateConn {
    client: TcpStream,
    ctok: Token,
    up: Option<(TcpStream, Token)>,
    serial: u64,
    sandbox: Ipv4Addr,
    lease: u64,
    /// The port the sandbox meant (80 or 443).
    port: u16,
    policy: Arc<Allowlist>,
    phase: Phase,
    /// The name the connection asked for (once sniffed).
    host: String,
    /// The question waiting for its answer: its socket, token and id.
    asking: Option<(UdpSocket, Token, u16)>,
    /// Questions sent so far.
    asked: usize,
    /// The name's addresses this sandbox may reach, and how many were tried.
    addrs: Vec<Ipv4Addr>,
    tried: usize,
    /// Why the last question or connection failed (said in the refusal).
    last_err: String,
    /// The generation of the step's timer.
    step_gen: u64,
    /// Client to upstream (first: the sniffed bytes).
    to_up: Vec<u8>,
    to_client: Vec<u8>,
    c_readable: bool,
    u_readable: bool,
    c_eof: bool,
    u_eof: bool,
    /// Our write side to the upstream / client is shut.
    u_shut: bool,
    c_shut: bool,
    since: Instant,
    last_io: Instant,
    timer_gen: u64,
}

/// The gate's state.
#[derive(Default)]
pub(crate) struct Gate {
    pub(crate) listener: Option<(TcpListener, Token)>,
    pub(crate) conns: Slab<GateConn>,
    serial: u64,
    per_sandbox: HashMap<Ipv4Addr, usize>,
}

/// What reading one side gave.
#[derive(Default)]
struct Got {
    moved: bool,
    eof: bool,
}

/// Reads `sock` into `buf` up to `cap` bytes; `readable` is cleared when the socket
/// is drained.
fn read_into(sock: &mut TcpStream, buf: &mut Vec<u8>, cap: usize, readable: &mut bool) -> Got {
    let mut got = Got::default();
    let mut chunk = [0u8; 16 * 1024];
    while *readable && buf.len() < cap {
        let n = (cap - buf.len()).min(chunk.len());
        match sock.read(&mut chunk[..n]) {
            Ok(0) => {
                got.eof = true;
                return got;
            }
            Ok(k) => {
                buf.extend_from_slice(&chunk[..k]);
                got.moved = true;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => *readable = false,
            Err(_) => {
                got.eof = true;
                return got;
            }
        }
    }
    got
}

/// The plain-text answer an HTTP client gets when the gate refuses.
fn http_refusal(status: u16, text: &str) -> Vec<u8> {
    let reason = match status {
        403 => "Forbidden",
        504 => "Gateway Timeout",
        _ => "Bad Gateway",
    };
    let body = format!("isobox: {text}\n");
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The addresses of `addrs` a sandbox with `policy` may reach: not denied, not
/// blocked, not one of the host's own. Runs on the pool (it asks the kernel for the
/// host's addresses).
fn reachable(
    host: &str,
    addrs: Vec<Ipv4Addr>,
    egress: &crate::netfilter::Egress,
    policy: &Allowlist,
) -> Result<Vec<Ipv4Addr>, (u16, String)> {
    // The host's own addresses are never a destination (the input chain keeps
    // sandboxes from them; the gate is on the host, so it checks itself).
    let local: Vec<Ipv4Addr> = crate::netfilter::rtnl::Rtnl::open()
        .and_then(|mut r| r.addrs())
        .map_err(|e| (502, format!("listing the host's addresses: {e}")))?
        .into_iter()
        .map(|a| a.addr)
        .collect();
    let ok: Vec<Ipv4Addr> = addrs
        .into_iter()
        .filter(|a| egress.reachable(*a) && !policy.blocks(*a) && !local.contains(a))
        .take(TRIES)
        .collect();
    if ok.is_empty() {
        return Err((
            403,
            format!("{host} resolves only to addresses this sandbox may not reach"),
        ));
    }
    Ok(ok)
}

impl Daemon {
    /// Accepts every pending connection on the gate's socket.
    pub(crate) fn gate_accept(&mut self) {
        loop {
            let Some((l, _)) = &self.gate.listener else {
                return;
            };
            match l.accept() {
                Ok((s, peer)) => self.gate_add(s, peer),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    crate::error_limited!("op=gate_accept err={e}");
                    self.reactor.arm(
                        Instant::now() + Duration::from_millis(50),
                        Addr::new(GATE, 0, ACCEPT_RETRY),
                        0,
                    );
                    return;
                }
            }
        }
    }

    fn gate_add(&mut self, mut s: TcpStream, peer: SocketAddr) {
        // Only an allowlisted sandbox's redirected connection: anything else is closed
        // at once (the table lets nothing else reach this port; this checks again).
        let SocketAddr::V4(p4) = peer else {
            return;
        };
        let ip = *p4.ip();
        let egress = Arc::clone(&self.app.egress);
        let Some(view) = egress.lease_of(ip) else {
            crate::warn_limited!(client = peer.ip(); "gate: refused {peer}: no sandbox has that address");
            return;
        };
        let Some(policy) = view.policy else {
            return;
        };
        let Ok(orig) = crate::sys::original_dst(s.as_fd()) else {
            return;
        };
        if !matches!(orig.port(), 80 | 443) || !egress.verified() || self.app.shutting_down {
            return;
        }
        let n = self.gate.per_sandbox.get(&ip).copied().unwrap_or(0);
        if n >= self.cfg.egress.max_conns as usize || self.gate.conns.len() >= MAX_CONNS {
            crate::warn_limited!(client = peer.ip(); "gate: refused {peer}: too many connections");
            return;
        }
        let _ = s.set_nodelay(true);
        let entry = self.gate.conns.vacant_entry();
        let gk = entry.key();
        let ctok = match self.reactor.register(
            &mut s,
            Addr::new(GATE, gk, CLIENT),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            Ok(t) => t,
            Err(e) => {
                crate::error_limited!("op=register gate err={e}");
                return;
            }
        };
        self.gate.serial += 1;
        let now = Instant::now();
        entry.insert(GateConn {
            client: s,
            ctok,
            up: None,
            serial: self.gate.serial,
            sandbox: ip,
            lease: view.serial,
            port: orig.port(),
            policy,
            phase: Phase::Sniff,
            host: String::new(),
            asking: None,
            asked: 0,
            addrs: Vec::new(),
            tried: 0,
            last_err: String::new(),
            step_gen: 0,
            to_up: Vec::new(),
            to_client: Vec::new(),
            c_readable: true,
            u_readable: false,
            c_eof: false,
            u_eof: false,
            u_shut: false,
            c_shut: false,
            since: now,
            last_io: now,
            timer_gen: 0,
        });
        *self.gate.per_sandbox.entry(ip).or_insert(0) += 1;
        self.gate_arm(gk);
        self.gate_pump(gk);
    }

    fn gate_arm(&mut self, gk: usize) {
        let gen = self
            .reactor
            .arm_new(Instant::now() + CHECK_EVERY, Addr::new(GATE, gk, CHECK));
        if let Some(c) = self.gate.conns.get_mut(gk) {
            c.timer_gen = gen;
        }
    }

    /// The periodic check: the connection's deadline, its lease, and egress.
    fn gate_check(&mut self, gk: usize, gen: u64) {
        let Some(c) = self.gate.conns.get(gk).filter(|c| c.timer_gen == gen) else {
            return;
        };
        let deadline = match c.phase {
            Phase::Sniff => c.since + SNIFF_TIMEOUT,
            // Each step has its own timer; this is the backstop.
            Phase::Resolving | Phase::Connecting => {
                let asks = DNS_ROUNDS * self.app.egress.resolvers().len();
                c.since
                    + SNIFF_TIMEOUT
                    + DNS_TRY * (asks as u32 + 1)
                    + CONNECT_TIMEOUT * (TRIES as u32 + 1)
            }
            Phase::Pipe => c.last_io + IDLE,
            Phase::Refusing => c.last_io + Duration::from_secs(5),
        };
        let egress = &self.app.egress;
        if Instant::now() >= deadline
            || !egress.verified()
            || !egress.lease_alive(c.sandbox, c.lease)
        {
            self.gate_close(gk);
        } else {
            self.gate_arm(gk);
        }
    }

    /// Refuses connection `gk` with `status` and `text` (an HTTP answer on port 80, a
    /// TLS alert on 443), then closes it.
    fn gate_refuse(&mut self, gk: usize, status: u16, text: &str) {
        let Some(c) = self.gate.conns.get_mut(gk) else {
            return;
        };
        crate::warn_limited!(
            "gate: refused sandbox={} port={}: {text}",
            c.sandbox,
            c.port
        );
        c.to_client = if c.port == 80 {
            http_refusal(status, text)
        } else if status == 403 {
            TLS_ACCESS_DENIED.to_vec()
        } else {
            Vec::new()
        };
        c.to_up.clear();
        c.phase = Phase::Refusing;
    }

    /// Moves bytes until nothing moves; takes each phase's next step.
    pub(crate) fn gate_pump(&mut self, gk: usize) {
        let mut rounds = 0;
        loop {
            let Some(c) = self.gate.conns.get_mut(gk) else {
                return;
            };
            match c.phase {
                Phase::Sniff => {
                    let got = read_into(
                        &mut c.client,
                        &mut c.to_up,
                        sniff::MAX_SNIFF,
                        &mut c.c_readable,
                    );
                    let s = if c.port == 80 {
                        sniff::http_host(&c.to_up)
                    } else {
                        sniff::tls_sni(&c.to_up)
                    };
                    match s {
                        Sniff::More if got.eof => return self.gate_close(gk),
                        Sniff::More => return,
                        Sniff::Refuse(why) => self.gate_refuse(gk, 403, why),
                        Sniff::Name(host) if !c.policy.allows_name(&host) => {
                            let text = format!("{host} is not in this sandbox's network allowlist");
                            self.gate_refuse(gk, 403, &text);
                        }
                        Sniff::Name(host) => self.gate_dial(gk, host),
                    }
                }
                Phase::Resolving => return,
                Phase::Connecting => {
                    if !self.gate_connect_event(gk) {
                        return;
                    }
                }
                Phase::Refusing => {
                    let ok = write_side(&mut c.client, &mut c.to_client);
                    if ok.is_none() || c.to_client.is_empty() {
                        return self.gate_close(gk);
                    }
                    return;
                }
                Phase::Pipe => {
                    if !self.gate_relay(gk) {
                        return;
                    }
                    rounds += 1;
                    if rounds >= ROUNDS_PER_TURN {
                        // Readiness is edge-triggered: what is left to read raises no
                        // new event, so the connection's next turn is a timer's.
                        self.reactor
                            .arm(Instant::now(), Addr::new(GATE, gk, CONTINUE), 0);
                        return;
                    }
                }
            }
        }
    }

    /// One round of relaying both ways; whether anything moved (false also when the
    /// connection was closed).
    fn gate_relay(&mut self, gk: usize) -> bool {
        let Some(c) = self.gate.conns.get_mut(gk) else {
            return false;
        };
        let Some((up, _)) = c.up.as_mut() else {
            return false;
        };
        let mut moved = false;
        let mut failed = false;
        if !c.c_eof {
            let g = read_into(&mut c.client, &mut c.to_up, BUF, &mut c.c_readable);
            moved |= g.moved;
            c.c_eof |= g.eof;
        }
        match write_side(up, &mut c.to_up) {
            Some(m) => moved |= m,
            None => failed = true,
        }
        if c.c_eof && c.to_up.is_empty() && !c.u_shut {
            let _ = up.shutdown(std::net::Shutdown::Write);
            c.u_shut = true;
        }
        if !c.u_eof {
            let g = read_into(up, &mut c.to_client, BUF, &mut c.u_readable);
            moved |= g.moved;
            c.u_eof |= g.eof;
        }
        match write_side(&mut c.client, &mut c.to_client) {
            Some(m) => moved |= m,
            None => failed = true,
        }
        if c.u_eof && c.to_client.is_empty() && !c.c_shut {
            let _ = c.client.shutdown(std::net::Shutdown::Write);
            c.c_shut = true;
        }
        if moved {
            c.last_io = Instant::now();
        }
        if failed || (c.c_shut && c.u_shut) {
            self.gate_close(gk);
            return false;
        }
        moved
    }

    /// Refuses connection `gk` and writes the refusal.
    fn gate_fail(&mut self, gk: usize, status: u16, text: &str) {
        self.gate_refuse(gk, status, text);
        self.gate_pump(gk);
    }

    /// Runs `job` on the pool and `done` with its result on the loop, if connection
    /// `gk` is still the one it was for and in `phase`.
    fn gate_submit<T: Send + 'static>(
        &mut self,
        gk: usize,
        phase: Phase,
        job: impl FnOnce() -> T + Send + 'static,
        done: fn(&mut Daemon, usize, T),
    ) {
        let Some(serial) = self.gate.conns.get(gk).map(|c| c.serial) else {
            return;
        };
        let job = Box::new(move || -> Done<Daemon> {
            let r = job();
            Box::new(move |d: &mut Daemon| {
                if d.gate
                    .conns
                    .get(gk)
                    .is_some_and(|c| c.serial == serial && c.phase == phase)
                {
                    done(d, gk, r);
                }
            })
        });
        if self.reactor.submit(job).is_err() {
            self.gate_fail(gk, 502, "the server is overloaded; retry");
        }
    }

    /// Arms the timer of connection `gk`'s current step.
    fn gate_step_timer(&mut self, gk: usize, after: Duration) {
        let gen = self
            .reactor
            .arm_new(Instant::now() + after, Addr::new(GATE, gk, STEP));
        if let Some(c) = self.gate.conns.get_mut(gk) {
            c.step_gen = gen;
        }
    }

    /// The name is allowed: its addresses are asked for.
    fn gate_dial(&mut self, gk: usize, host: String) {
        let Some(c) = self.gate.conns.get_mut(gk) else {
            return;
        };
        c.host = host;
        c.phase = Phase::Resolving;
        self.gate_ask(gk);
    }

    /// Asks the next resolver (each in turn, [`DNS_ROUNDS`] times round); after the
    /// last one, the connection is refused.
    fn gate_ask(&mut self, gk: usize) {
        let resolvers = self.app.egress.resolvers();
        let Some(c) = self.gate.conns.get_mut(gk) else {
            return;
        };
        if c.asked >= DNS_ROUNDS * resolvers.len() {
            let why = if c.last_err.is_empty() {
                crate::netfilter::dns::DnsError::Timeout.to_string()
            } else {
                c.last_err.clone()
            };
            let text = format!("{} did not resolve: {why}", c.host);
            return self.gate_fail(gk, 502, &text);
        }
        let ns = resolvers[c.asked % resolvers.len()];
        c.asked += 1;
        let host = c.host.clone();
        self.gate_submit(
            gk,
            Phase::Resolving,
            move || crate::netfilter::dns::send_query(&host, ns),
            Daemon::gate_asked,
        );
    }

    /// The question went out (or could not): its socket is watched for the answer.
    fn gate_asked(&mut self, gk: usize, r: io::Result<(std::net::UdpSocket, u16)>) {
        let (sock, id) = match r {
            Ok(x) => x,
            Err(e) => {
                if let Some(c) = self.gate.conns.get_mut(gk) {
                    c.last_err = format!("asking the resolver: {e}");
                }
                return self.gate_ask(gk);
            }
        };
        let mut sock = UdpSocket::from_std(sock);
        let tok =
            match self
                .reactor
                .register(&mut sock, Addr::new(GATE, gk, ANSWER), Interest::READABLE)
            {
                Ok(t) => t,
                Err(e) => {
                    crate::error_limited!("op=register gate dns err={e}");
                    return self.gate_close(gk);
                }
            };
        if let Some(c) = self.gate.conns.get_mut(gk) {
            c.asking = Some((sock, tok, id));
        }
        self.gate_step_timer(gk, DNS_TRY);
        self.gate_answer(gk);
    }

    /// Forgets connection `gk`'s question, if any.
    fn gate_drop_question(&mut self, gk: usize) {
        if let Some((mut s, t, _)) = self.gate.conns.get_mut(gk).and_then(|c| c.asking.take()) {
            self.reactor.deregister(&mut s, t);
        }
    }

    /// Reads what arrived on the question's socket: the name's addresses, a definite
    /// "no such name", or a failure that sends the question to the next resolver.
    fn gate_answer(&mut self, gk: usize) {
        use crate::netfilter::dns::{parse_a, DnsError};
        let Some(c) = self.gate.conns.get_mut(gk) else {
            return;
        };
        let Some((sock, _, id)) = c.asking.as_ref() else {
            return;
        };
        let mut buf = [0u8; 1500];
        let mut read = 0;
        // The answer, and whether a failure is definite (no such name: not asked again).
        let got = loop {
            read += 1;
            if read > ANSWER_READS {
                // A flood of someone else's datagrams: the rest on the next turn.
                self.reactor
                    .arm(Instant::now(), Addr::new(GATE, gk, ANSWER), 0);
                return;
            }
            match sock.recv(&mut buf) {
                Ok(n) => match parse_a(&buf[..n], *id, &c.host) {
                    // Someone else's datagram (a late answer to an earlier try).
                    Err(DnsError::Malformed(_)) => {}
                    Ok(addrs) => break Ok(addrs),
                    Err(e) => break Err((matches!(e, DnsError::NoAddress(_)), e.to_string())),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Such as the resolver's port being unreachable.
                Err(e) => break Err((false, e.to_string())),
            }
        };
        let host = c.host.clone();
        self.gate_drop_question(gk);
        match got {
            Ok(addrs) => {
                let Some(c) = self.gate.conns.get_mut(gk) else {
                    return;
                };
                c.phase = Phase::Connecting;
                let (egress, policy) = (Arc::clone(&self.app.egress), Arc::clone(&c.policy));
                self.gate_submit(
                    gk,
                    Phase::Connecting,
                    move || reachable(&host, addrs, &egress, &policy),
                    Daemon::gate_reachable,
                );
            }
            Err((true, e)) => {
                let text = format!("{host} did not resolve: {e}");
                self.gate_fail(gk, 502, &text);
            }
            Err((false, e)) => {
                if let Some(c) = self.gate.conns.get_mut(gk) {
                    c.last_err = e;
                }
                self.gate_ask(gk);
            }
        }
    }

    /// A step's timer: the question had no answer in time (the next resolver is
    /// asked), or the connection was not made in time (the next address is tried).
    fn gate_step_late(&mut self, gk: usize, gen: u64) {
        let Some(c) = self.gate.conns.get_mut(gk).filter(|c| c.step_gen == gen) else {
            return;
        };
        match c.phase {
            Phase::Resolving if c.asking.is_some() => {
                c.last_err = crate::netfilter::dns::DnsError::Timeout.to_string();
                self.gate_drop_question(gk);
                self.gate_ask(gk);
            }
            Phase::Connecting if c.up.is_some() => {
                c.last_err = format!("no answer within {} s", CONNECT_TIMEOUT.as_secs());
                self.gate_drop_upstream(gk);
                self.gate_connect_next(gk);
            }
            _ => {}
        }
    }

    /// The addresses the sandbox may reach (or why none): the first is connected to.
    fn gate_reachable(&mut self, gk: usize, r: Result<Vec<Ipv4Addr>, (u16, String)>) {
        match r {
            Ok(addrs) => {
                if let Some(c) = self.gate.conns.get_mut(gk) {
                    c.addrs = addrs;
                }
                self.gate_connect_next(gk);
            }
            Err((status, text)) => self.gate_fail(gk, status, &text),
        }
    }

    /// Opens a connection to the next address (without blocking, on the pool); after
    /// the last one, the connection is refused.
    fn gate_connect_next(&mut self, gk: usize) {
        let Some(c) = self.gate.conns.get_mut(gk) else {
            return;
        };
        let Some(&a) = c.addrs.get(c.tried) else {
            let text = format!("connecting to {} port {}: {}", c.host, c.port, c.last_err);
            return self.gate_fail(gk, 502, &text);
        };
        c.tried += 1;
        let to = SocketAddr::new(a.into(), c.port);
        self.gate_submit(
            gk,
            Phase::Connecting,
            move || {
                TcpStream::connect(to).and_then(|s| {
                    s.set_nodelay(true)?;
                    Ok(s)
                })
            },
            Daemon::gate_opened,
        );
    }

    /// The pool opened the connection (in progress): watched until it is made.
    fn gate_opened(&mut self, gk: usize, r: io::Result<TcpStream>) {
        let mut stream = match r {
            Ok(s) => s,
            Err(e) => {
                if let Some(c) = self.gate.conns.get_mut(gk) {
                    c.last_err = e.to_string();
                }
                return self.gate_connect_next(gk);
            }
        };
        let tok = match self.reactor.register(
            &mut stream,
            Addr::new(GATE, gk, UPSTREAM),
            Interest::READABLE | Interest::WRITABLE,
        ) {
            Ok(t) => t,
            Err(e) => {
                crate::error_limited!("op=register gate upstream err={e}");
                return self.gate_close(gk);
            }
        };
        if let Some(c) = self.gate.conns.get_mut(gk) {
            c.up = Some((stream, tok));
        }
        self.gate_step_timer(gk, CONNECT_TIMEOUT);
        self.gate_pump(gk);
    }

    /// Forgets connection `gk`'s upstream socket, if any.
    fn gate_drop_upstream(&mut self, gk: usize) {
        if let Some((mut s, t)) = self.gate.conns.get_mut(gk).and_then(|c| c.up.take()) {
            self.reactor.deregister(&mut s, t);
        }
    }

    /// The connection being made: made (the pipe starts; true), failed (the next
    /// address is tried) or not yet.
    fn gate_connect_event(&mut self, gk: usize) -> bool {
        let Some(c) = self.gate.conns.get_mut(gk) else {
            return false;
        };
        let Some((up, _)) = c.up.as_ref() else {
            return false;
        };
        match connect_outcome(up) {
            None => false,
            Some(Ok(())) => {
                c.phase = Phase::Pipe;
                c.u_readable = true;
                c.last_io = Instant::now();
                true
            }
            Some(Err(e)) => {
                c.last_err = e.to_string();
                self.gate_drop_upstream(gk);
                self.gate_connect_next(gk);
                false
            }
        }
    }

    fn gate_close(&mut self, gk: usize) {
        let Some(mut c) = self.gate.conns.try_remove(gk) else {
            return;
        };
        self.reactor.deregister(&mut c.client, c.ctok);
        if let Some((mut s, t)) = c.up.take() {
            self.reactor.deregister(&mut s, t);
        }
        if let Some((mut s, t, _)) = c.asking.take() {
            self.reactor.deregister(&mut s, t);
        }
        if let Some(n) = self.gate.per_sandbox.get_mut(&c.sandbox) {
            *n -= 1;
            if *n == 0 {
                self.gate.per_sandbox.remove(&c.sandbox);
            }
        }
    }

    /// Shutdown: every connection and the listener go.
    pub(crate) fn gate_close_all(&mut self) {
        let keys: Vec<usize> = self.gate.conns.iter().map(|(k, _)| k).collect();
        for k in keys {
            self.gate_close(k);
        }
        if let Some((mut l, t)) = self.gate.listener.take() {
            self.reactor.deregister(&mut l, t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_say_why_in_plain_text() {
        let r = String::from_utf8(http_refusal(
            403,
            "x.org is not in this sandbox's network allowlist",
        ))
        .unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{r}");
        assert!(r.ends_with("\r\n\r\nisobox: x.org is not in this sandbox's network allowlist\n"));
        let body = r.split("\r\n\r\n").nth(1).unwrap();
        assert!(r.contains(&format!("Content-Length: {}\r\n", body.len())));
        assert!(String::from_utf8(http_refusal(502, "y"))
            .unwrap()
            .starts_with("HTTP/1.1 502 Bad Gateway"));
    }
}
