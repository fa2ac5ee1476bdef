//! Filtered egress: a network namespace and veth pair per networked run, numbered from
//! a private pool, NATed out of the host's uplink, behind an nftables table of
//! isobox's own that allows the public internet and nothing else.
//!
//! It stays one file: the verified flag, the cutting of links and the lease are one
//! fail-closed protocol (see `set` and `lease`) whose ordering is the safety argument.
//!
//! Fail-closed: the table is read back from the kernel after it is programmed, again
//! every `ISOBOX_EGRESS_VERIFY_SEC` and whenever netlink announces a ruleset change.
//! Only while the last check passed does a run get a network; otherwise it runs
//! offline and says so (`run.network: false` and the spec's warning).

pub mod ct;
pub mod dns;
pub mod nft;
pub mod nl;
pub mod policy;
pub mod rtnl;
pub mod sniff;

use crate::sys::netlink as sys;
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// An IPv4 prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: u32,
    len: u8,
}

impl Cidr {
    /// The default pool.
    pub const DEFAULT_POOL: Cidr = Cidr {
        net: 0x0ac8_0000,
        len: 16,
    };

    /// The netmask.
    pub fn mask(self) -> u32 {
        if self.len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.len))
        }
    }

    /// The network address.
    pub fn net(self) -> u32 {
        self.net
    }

    /// The prefix length.
    pub fn prefix_len(self) -> u8 {
        self.len
    }

    /// Whether `ip` is inside.
    pub fn contains(self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == self.net
    }

    /// Whether the two ranges share an address.
    pub fn overlaps(self, other: Cidr) -> bool {
        let m = self.mask() & other.mask();
        self.net & m == other.net & m
    }
}

/// What egress could not do. Every message names what failed and the path, range or
/// setting involved; a failed check's message is the `reason` `/healthz` shows.
#[derive(Debug, thiserror::Error)]
pub enum NetfilterError {
    /// A range did not parse.
    #[error("{0}")]
    Cidr(String),
    /// A file or mount under the data directory could not be set up.
    #[error("{what} {path}: {source}")]
    Path {
        /// What was being done ("creating", "writing", "bind-mounting", ...).
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// The data directory could not be made a shared mount.
    #[error("making {path} shared: {source}")]
    Shared {
        /// The data directory.
        path: PathBuf,
        /// Cause.
        source: io::Error,
    },
    /// An rtnetlink request failed while checking the host's networks.
    #[error("{what}: {source}")]
    Netlink {
        /// Which request.
        what: &'static str,
        /// Cause.
        source: io::Error,
    },
    /// The sandboxes' address pool overlaps a network of the host.
    #[error("ISOBOX_NET_POOL {pool} overlaps {addr}/{prefix} on {link}")]
    PoolOverlap {
        /// The pool.
        pool: Cidr,
        /// The host address.
        addr: Ipv4Addr,
        /// Its prefix length.
        prefix: u8,
        /// Its link.
        link: String,
    },
    /// A run asked for a network while the table is not verified.
    #[error("egress not verified")]
    NotVerified,
    /// Every address of the pool is leased.
    #[error("no free address in ISOBOX_NET_POOL")]
    PoolExhausted,
    /// Making the run's namespace, link or addresses failed (all undone).
    #[error("network setup: {0}")]
    Setup(#[source] io::Error),
    /// A check failed while the run's network was being made (its link was cut).
    #[error("egress stopped verifying during network setup")]
    StoppedVerifying,
}

impl FromStr for Cidr {
    type Err = NetfilterError;
    fn from_str(s: &str) -> Result<Cidr, NetfilterError> {
        let bad = |why: String| NetfilterError::Cidr(why);
        let (a, l) = s
            .split_once('/')
            .ok_or_else(|| bad("expected a.b.c.d/len".into()))?;
        let ip: Ipv4Addr = a
            .trim()
            .parse()
            .map_err(|_| bad(format!("bad address {a:?}")))?;
        let len: u8 = l
            .trim()
            .parse()
            .map_err(|_| bad(format!("bad prefix length {l:?}")))?;
        if len > 32 {
            return Err(bad("prefix length above 32".into()));
        }
        let c = Cidr { net: 0, len };
        let net = u32::from(ip) & c.mask();
        if net != u32::from(ip) {
            return Err(bad(format!("{s} has host bits set")));
        }
        Ok(Cidr { net, len })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.net), self.len)
    }
}

/// What sandboxes may never reach, beside the host itself (dropped on input) and the
/// pool (added at run time): "this network", RFC 1918, CGNAT (Alibaba's metadata),
/// loopback, link-local (every cloud's metadata), IETF protocol assignments,
/// benchmarking, multicast, reserved and broadcast.
/// Azure's WireServer is denied too, though its address is not special.
pub const DENIED: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    // Azure's WireServer (host agent, metadata): a public-looking address.
    "168.63.129.16/32",
];

/// Whether `ip` is in one of the [`DENIED`] ranges.
pub fn is_denied(ip: Ipv4Addr) -> bool {
    DENIED
        .iter()
        .filter_map(|s| s.parse::<Cidr>().ok())
        .any(|c| c.contains(ip))
}

/// The egress state as `/readyz` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// `ISOBOX_EGRESS=off`.
    Off,
    /// The last check found the table exactly as programmed.
    Verified,
    /// Not (or no longer) verified, and why.
    Unverified(String),
}

/// The egress service.
#[derive(Debug)]
pub struct Egress {
    enabled: bool,
    pool: Cidr,
    prefix: String,
    ruleset: nft::Ruleset,
    dns: Vec<Ipv4Addr>,
    data_dir: PathBuf,
    ns_dir: PathBuf,
    resolv: PathBuf,
    /// What `resolv` holds (made once: the resolvers are fixed at start).
    resolv_text: String,
    verified: AtomicBool,
    /// Failed checks so far (each cut every sandbox link): a long-lived sandbox whose
    /// network predates a cut has none.
    cuts: std::sync::atomic::AtomicU64,
    state: Mutex<State>,
    slots: Mutex<Vec<u64>>,
    /// Where the next slot search starts: round-robin, so a freed /30 (and whatever
    /// conntrack still remembers of it) is reused as late as possible.
    next_slot: std::sync::atomic::AtomicU32,
    /// The startup sweep of the pool's conntrack entries has run.
    ct_swept: AtomicBool,
    /// The leases alive, by slot: what the table's per-lease sets hold for them (put
    /// back whenever the table is programmed anew), and what the gate asks about a
    /// sandbox address. Held while the table is programmed.
    leases: Mutex<HashMap<u32, LeaseInfo>>,
    /// Leases made so far (each one's serial).
    lease_serial: std::sync::atomic::AtomicU64,
    /// The deny list (built-in, the pool, `ISOBOX_EGRESS_DENY`).
    deny: Vec<Cidr>,
    gate_port: u16,
}

/// What the table and the gate know of one lease.
#[derive(Debug, Clone)]
struct LeaseInfo {
    serial: u64,
    addr: Ipv4Addr,
    policy: Option<Arc<policy::Allowlist>>,
    elements: Vec<nft::Element>,
}

/// What the gate learns of a sandbox address: its lease, and its allowlist (`None`:
/// the whole public internet).
#[derive(Debug, Clone)]
pub struct LeaseView {
    /// The lease's serial (a connection whose lease is gone is closed).
    pub serial: u64,
    /// Its allowlist.
    pub policy: Option<Arc<policy::Allowlist>>,
}

/// One run's network: its namespace (bind-mounted at `ns_path`) and veth pair.
#[derive(Debug)]
pub struct NetLease {
    egress: Arc<Egress>,
    slot: u32,
    serial: u64,
    host_if: String,
    ns_path: PathBuf,
    released: bool,
}

impl NetLease {
    /// The namespace file for the OCI spec.
    pub fn ns_path(&self) -> &Path {
        &self.ns_path
    }

    /// The sandbox's address.
    pub fn sandbox_addr(&self) -> Ipv4Addr {
        self.egress.addr(self.slot, 2)
    }

    /// The lease's serial (what the gate compares).
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// The resolv.conf to bind into the sandbox.
    pub fn resolv_conf(&self) -> &Path {
        &self.egress.resolv
    }

    /// What that resolv.conf says: a run whose root is an image gets these bytes
    /// instead (`sandbox::image`), bound over the image's own by `isobox-start`.
    pub fn resolv_conf_bytes(&self) -> &[u8] {
        self.egress.resolv_text.as_bytes()
    }

    /// Removes the veth pair and the namespace, and frees the slot.
    pub fn release(mut self) {
        self.release_inner();
    }

    fn release_inner(&mut self) {
        if std::mem::replace(&mut self.released, true) {
            return;
        }
        let e = &self.egress;
        if let Err(err) = rtnl::Rtnl::open().and_then(|mut r| r.del_link(&self.host_if)) {
            log::warn!("egress: deleting link {}: {err}", self.host_if);
        }
        // The link is gone: nothing matches its elements any more; a later lease of
        // the slot (same link name) must not find them.
        e.forget_lease(self.slot, self.serial);
        // With the link gone nothing new arrives; what conntrack still holds of the run
        // would otherwise stay for days and count against the link's next user.
        ct::forget_addr(self.sandbox_addr());
        remove_ns_file(&self.ns_path);
        e.free(self.slot);
    }
}

impl Drop for NetLease {
    fn drop(&mut self) {
        self.release_inner();
    }
}

fn remove_ns_file(path: &Path) {
    let _ = crate::sys::loopdev::umount2(path, libc::MNT_DETACH);
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            log::warn!("egress: removing {}: {e}", path.display());
        }
    }
}

fn same_file(a: &std::os::fd::OwnedFd, b: &std::os::fd::OwnedFd) -> io::Result<bool> {
    use std::os::fd::AsFd;
    let (x, y) = (
        crate::sys::fsat::fstat(a.as_fd())?,
        crate::sys::fsat::fstat(b.as_fd())?,
    );
    Ok((x.dev, x.ino) == (y.dev, y.ino))
}

/// Turns IPv6 off on `link` (or `all`/`default`) in the calling thread's namespace.
/// A kernel without IPv6 has nothing to turn off.
fn disable_ipv6(link: &str) {
    let path = format!("/proc/sys/net/ipv6/conf/{link}/disable_ipv6");
    if let Err(e) = std::fs::write(&path, "1") {
        if e.kind() != io::ErrorKind::NotFound {
            log::warn!("egress: writing {path}: {e}");
        }
    }
}

fn ctx(what: &'static str) -> impl Fn(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A short tag of the instance name for interface names (`ib` + 5 characters; the
/// kernel allows 15 in all).
fn if_prefix(instance: &str) -> String {
    // FNV-1a: stable across builds, no dependency.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in instance.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz234567";
    let mut s = String::from("ib");
    for i in 0..5 {
        s.push(ALPHABET[((h >> (i * 5)) & 31) as usize] as char);
    }
    s
}

/// Settings of filtered egress.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Give runs network at all.
    pub enabled: bool,
    /// Address pool of the sandboxes' links.
    pub pool: Cidr,
    /// Resolvers for the sandbox.
    pub dns: Vec<std::net::Ipv4Addr>,
    /// Extra denied ranges.
    pub deny: Vec<Cidr>,
    /// Re-verification interval.
    pub verify_sec: u64,
    /// Connections per sandbox at once.
    pub max_conns: u32,
    /// Bytes per second per sandbox, each way.
    pub rate_bytes: u64,
    /// Forwarded traffic of others (neither from nor to a sandbox link).
    pub forward_others: ForwardOthers,
}

/// What isobox's table does with forwarded traffic that is neither from nor to a
/// sandbox link (issue 26 item 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardOthers {
    /// Drop it when isobox turned IPv4 forwarding on in this network namespace (nothing
    /// on the host forwarded before, so nothing relies on it), keep it when the host
    /// forwarded already (a router, a container host: its own firewall decides).
    #[default]
    Auto,
    /// Always drop it.
    Drop,
    /// Never touch it.
    Keep,
}

/// Where isobox notes that it turned IPv4 forwarding on in the network namespace of
/// inode `ns` (so a restart still knows forwarding is its own doing). Under /run: gone
/// at reboot, as the setting itself is.
fn forwarding_marker(ns: u64) -> PathBuf {
    PathBuf::from(format!("/run/isobox/ip_forward-by-isobox.{ns}"))
}

/// IPv4 forwarding in the calling thread's network namespace now (`None`: unreadable),
/// with whether isobox turned it on there (its marker is present).
pub fn forwarding_now() -> Option<(bool, bool)> {
    let on = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
        .ok()?
        .trim()
        == "1";
    let ours = netns_inode().is_some_and(|ns| forwarding_marker(ns).exists());
    Some((on, ours))
}

/// Whether nf_tables answers over netlink with the rights to change it, without
/// changing anything: a transaction deleting a table that does not exist (`name`,
/// which must be no live table's) comes back "no such table" only when both hold.
///
/// # Errors
/// The socket's or the kernel's error (no nf_tables, no CAP_NET_ADMIN).
pub fn nftables_usable(name: &str) -> io::Result<()> {
    nft::Nft::open()?.delete_table(name)
}

/// The inode of the calling thread's network namespace.
fn netns_inode() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net")
        .ok()
        .map(|m| m.ino())
}

/// Whether the table drops others' forwarded traffic, decided at start: `Auto` drops
/// when forwarding is off now (isobox is about to turn it on) or was turned on by isobox
/// (its marker).
fn drops_others(mode: ForwardOthers) -> bool {
    match mode {
        ForwardOthers::Drop => true,
        ForwardOthers::Keep => false,
        ForwardOthers::Auto => forwarding_now().is_some_and(|(on, ours)| !on || ours),
    }
}

/// The sandboxes' resolv.conf: the resolvers, and short timeouts.
fn resolv_text(dns: &[Ipv4Addr]) -> String {
    let mut conf = String::new();
    for d in dns {
        conf.push_str(&format!("nameserver {d}\n"));
    }
    conf.push_str("options timeout:2 attempts:2\n");
    conf
}

/// Whether `path` is a mount point (resolved, so a trailing slash or a symlink in the
/// configured path does not hide it; mountinfo's escapes are undone).
fn is_mount_point(path: &Path) -> bool {
    crate::sys::mountinfo::is_mounted(path)
}

impl Egress {
    /// The service for `e`, for the daemon instance `instance` with its state under
    /// `data_dir` (nothing is touched until [`Egress::start`]).
    /// `gate_port` is the gate's listening port, where allowlisted links' web traffic
    /// is redirected.
    pub fn new(e: &EgressConfig, instance: &str, data_dir: &Path, gate_port: u16) -> Arc<Egress> {
        let prefix = if_prefix(instance);
        let mut deny: Vec<Cidr> = DENIED.iter().filter_map(|s| s.parse().ok()).collect();
        deny.push(e.pool);
        deny.extend(e.deny.iter().copied());
        let table = instance.replace('-', "_");
        let slots = 1usize << (32 - u32::from(e.pool.prefix_len()) - 2);
        let net_dir = data_dir.join("net");
        let drop_others = e.enabled && drops_others(e.forward_others);
        Arc::new(Egress {
            enabled: e.enabled,
            pool: e.pool,
            ruleset: nft::Ruleset::egress(
                &table,
                &prefix,
                e.pool,
                &deny,
                nft::Limits {
                    max_conns: e.max_conns,
                    rate_bytes: e.rate_bytes,
                    links: u32::try_from(slots).unwrap_or(u32::MAX),
                },
                &nft::Gate {
                    port: gate_port,
                    resolvers: e.dns.clone(),
                },
                drop_others,
            ),
            prefix,
            resolv_text: resolv_text(&e.dns),
            dns: e.dns.clone(),
            data_dir: data_dir.to_path_buf(),
            ns_dir: net_dir.join("ns"),
            resolv: net_dir.join("resolv.conf"),
            verified: AtomicBool::new(false),
            cuts: std::sync::atomic::AtomicU64::new(0),
            state: Mutex::new(if e.enabled {
                State::Unverified("not yet programmed".into())
            } else {
                State::Off
            }),
            slots: Mutex::new(vec![0u64; slots.div_ceil(64)]),
            next_slot: std::sync::atomic::AtomicU32::new(0),
            ct_swept: AtomicBool::new(false),
            leases: Mutex::new(HashMap::new()),
            lease_serial: std::sync::atomic::AtomicU64::new(0),
            deny,
            gate_port,
        })
    }

    /// The ranges sandboxes never reach (built-in, the pool, `ISOBOX_EGRESS_DENY`).
    pub fn deny(&self) -> &[Cidr] {
        &self.deny
    }

    /// Whether a sandbox may reach `ip` (not in the deny list).
    pub fn reachable(&self, ip: Ipv4Addr) -> bool {
        !self.deny.iter().any(|c| c.contains(ip))
    }

    /// The resolvers sandboxes use.
    pub fn resolvers(&self) -> &[Ipv4Addr] {
        &self.dns
    }

    /// The gate's port.
    pub fn gate_port(&self) -> u16 {
        self.gate_port
    }

    /// The pool of sandbox addresses.
    pub fn pool(&self) -> Cidr {
        self.pool
    }

    /// The lease of sandbox address `addr`, if one is alive.
    pub fn lease_of(&self, addr: Ipv4Addr) -> Option<LeaseView> {
        if !self.pool.contains(addr) {
            return None;
        }
        let slot = (u32::from(addr) - self.pool.net()) / 4;
        let leases = self.leases.lock().ok()?;
        let l = leases.get(&slot).filter(|l| l.addr == addr)?;
        Some(LeaseView {
            serial: l.serial,
            policy: l.policy.clone(),
        })
    }

    /// Whether lease `serial` is still alive.
    pub fn lease_alive(&self, addr: Ipv4Addr, serial: u64) -> bool {
        self.lease_of(addr).is_some_and(|l| l.serial == serial)
    }

    fn forget_lease(&self, slot: u32, serial: u64) {
        let Ok(mut leases) = self.leases.lock() else {
            return;
        };
        if leases.get(&slot).is_none_or(|l| l.serial != serial) {
            return;
        }
        let Some(info) = leases.remove(&slot) else {
            return;
        };
        if let Err(e) =
            nft::Nft::open().and_then(|mut n| n.elements(self.table(), &info.elements, false))
        {
            log::warn!("egress: removing the set elements of {}: {e}", info.addr);
        }
    }

    /// Whether runs may get a network right now.
    pub fn verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    /// How many failed checks have cut the sandboxes' links so far.
    pub fn cuts(&self) -> u64 {
        self.cuts.load(Ordering::Acquire)
    }

    /// The state for `/readyz`.
    pub fn state(&self) -> State {
        self.state.lock().map(|s| s.clone()).unwrap_or(State::Off)
    }

    /// Whether egress is configured on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The nftables table's name.
    pub fn table(&self) -> &str {
        self.ruleset.table()
    }

    fn set(&self, s: State) {
        let ok = s == State::Verified;
        if !ok {
            // Fail closed for runs already going too: without the table their traffic
            // is unfiltered, so their links go now (the leases' own removal later finds
            // them gone, which is fine). On every failed check, not only the first: it
            // is idempotent. The flag is cleared first, so a lease being built either
            // sees it cleared or has its link cut here (see `lease`).
            self.verified.store(false, Ordering::Release);
            self.cuts.fetch_add(1, Ordering::AcqRel);
            self.cut_links();
        }
        if let Ok(mut cur) = self.state.lock() {
            if *cur != s {
                match &s {
                    State::Verified => log::info!(
                        "egress: verified (table inet {}, {} rules)",
                        self.table(),
                        self.ruleset.rule_count()
                    ),
                    State::Unverified(why) => {
                        log::error!("egress: NOT verified, runs are offline: {why}")
                    }
                    State::Off => {}
                }
            }
            *cur = s;
        }
        self.verified.store(ok, Ordering::Release);
    }

    fn addr(&self, slot: u32, host: u32) -> Ipv4Addr {
        Ipv4Addr::from(self.pool.net() + slot * 4 + host)
    }

    fn free(&self, slot: u32) {
        if let Ok(mut s) = self.slots.lock() {
            s[slot as usize / 64] &= !(1u64 << (slot % 64));
        }
    }

    fn alloc(&self) -> Option<u32> {
        let mut s = self.slots.lock().ok()?;
        let total = 1u32 << (32 - u32::from(self.pool.prefix_len()) - 2);
        let start = self.next_slot.load(Ordering::Relaxed) % total;
        for k in 0..total {
            let slot = (start + k) % total;
            let (w, b) = (slot as usize / 64, slot % 64);
            if s[w] & (1u64 << b) == 0 {
                s[w] |= 1u64 << b;
                self.next_slot.store(slot + 1, Ordering::Relaxed);
                return Some(slot);
            }
        }
        None
    }

    /// Startup: sweeps what a crash left (namespaces, links, the table), prepares the
    /// mount propagation and resolv.conf, enables forwarding, then programs and
    /// verifies. Never fails: problems leave egress unverified, with the reason.
    pub fn start(&self) {
        if self.enabled && !self.ruleset.drops_others() {
            log::warn!(
                "egress: IPv4 forwarding was already on in this network namespace (not by isobox): \
                 forwarded traffic other than the sandboxes' is left to the host's own firewall \
                 (ISOBOX_EGRESS_FORWARD_OTHERS=drop makes isobox's table drop it)"
            );
        }
        self.sweep();
        if !self.enabled {
            // What an earlier egress-on daemon of this instance may have left.
            self.teardown();
            return;
        }
        self.program_and_verify();
    }

    fn bind_marker(&self) -> PathBuf {
        self.resolv.with_file_name("data-dir-bind")
    }

    /// Idempotent set-up, redone before every programming (so a repair also restores
    /// forwarding, and a pool that has come to overlap a host network is caught).
    fn prepare(&self) -> Result<(), NetfilterError> {
        let path = |what, path: &Path| {
            let path = path.to_path_buf();
            move |source| NetfilterError::Path { what, path, source }
        };
        std::fs::create_dir_all(&self.ns_dir).map_err(path("creating", &self.ns_dir))?;
        std::fs::write(&self.resolv, self.resolv_text.as_bytes())
            .map_err(path("writing", &self.resolv))?;
        // A networked runsc lives in a mount namespace copied from ours; for unmounts
        // of workspaces and namespaces under the data dir to reach that copy, the data
        // dir must be a shared mount (and the copy its slave).
        // The marker, written first, says the bind mount is ours to remove at exit
        // (or after a crash); a data dir that is already some other mount point is
        // only marked shared, never unmounted.
        if !is_mount_point(&self.data_dir) {
            let marker = self.bind_marker();
            std::fs::write(&marker, b"").map_err(path("writing", &marker))?;
            sys::bind_mount(&self.data_dir, &self.data_dir)
                .map_err(path("bind-mounting", &self.data_dir))?;
        }
        sys::make_shared(&self.data_dir).map_err(|source| NetfilterError::Shared {
            path: self.data_dir.clone(),
            source,
        })?;
        let fwd = Path::new("/proc/sys/net/ipv4/ip_forward");
        if !std::fs::read_to_string(fwd).is_ok_and(|s| s.trim() == "1") {
            // The marker first: a crash between the two still knows it was ours.
            if let Some(ns) = netns_inode() {
                let m = forwarding_marker(ns);
                if let Some(dir) = m.parent() {
                    std::fs::create_dir_all(dir).map_err(path("creating", dir))?;
                }
                std::fs::write(&m, b"").map_err(path("writing", &m))?;
            }
            std::fs::write(fwd, "1").map_err(path("enabling", fwd))?;
            log::info!("egress: enabled IPv4 forwarding ({})", fwd.display());
        }
        let netlink = |what| move |source| NetfilterError::Netlink { what, source };
        let mut r = rtnl::Rtnl::open().map_err(netlink("rtnetlink"))?;
        let links = r.links().map_err(netlink("listing links"))?;
        for a in r.addrs().map_err(netlink("listing addresses"))? {
            let name = links
                .iter()
                .find(|l| l.index == a.index)
                .map_or("?", |l| l.name.as_str());
            let net = Cidr {
                net: u32::from(a.addr)
                    & Cidr {
                        net: 0,
                        len: a.prefix,
                    }
                    .mask(),
                len: a.prefix,
            };
            if !name.starts_with(&self.prefix) && net.overlaps(self.pool) {
                return Err(NetfilterError::PoolOverlap {
                    pool: self.pool,
                    addr: a.addr,
                    prefix: a.prefix,
                    link: name.to_string(),
                });
            }
        }
        Ok(())
    }

    /// Deletes every link of this instance (ending the network of running sandboxes).
    /// Returns how many it deleted.
    fn cut_links(&self) -> usize {
        let Ok(mut r) = rtnl::Rtnl::open() else {
            return 0;
        };
        r.links()
            .unwrap_or_default()
            .iter()
            .filter(|l| l.name.starts_with(&self.prefix))
            .filter(|l| r.del_link(&l.name).is_ok())
            .count()
    }

    /// Removes namespaces and links a previous run of this instance left.
    fn sweep(&self) {
        if let Ok(rd) = std::fs::read_dir(&self.ns_dir) {
            for e in rd.flatten() {
                log::info!("egress: sweeping namespace {}", e.path().display());
                remove_ns_file(&e.path());
            }
        }
        let n = self.cut_links();
        if n > 0 {
            log::info!("egress: swept {n} links of this instance");
        }
    }

    /// Programs the table and reads it back.
    pub fn program_and_verify(&self) {
        if !self.enabled {
            return;
        }
        if let Err(why) = self.prepare() {
            self.set(State::Unverified(why.to_string()));
            return;
        }
        // Once, and only with egress on and the pool checked not to overlap any host
        // network: then every tracked flow from the pool was one of our sandboxes' (a
        // crash left them; a release forgets its own).
        if !self.ct_swept.swap(true, Ordering::AcqRel) {
            ct::forget_pool(self.pool);
        }
        // The live leases' elements go into the new table in the same transaction; the
        // lock keeps a lease from adding its own meanwhile (and losing them).
        let Ok(leases) = self.leases.lock() else {
            self.set(State::Unverified("the lease table is poisoned".into()));
            return;
        };
        let elems: Vec<nft::Element> = leases.values().flat_map(|l| l.elements.clone()).collect();
        let r = nft::Nft::open().and_then(|mut n| n.apply(&self.ruleset, &elems));
        drop(leases);
        if let Err(e) = r {
            self.set(State::Unverified(format!("programming nftables: {e}")));
            return;
        }
        self.verify();
    }

    /// Reads the table back and updates the state; also checks that forwarding is on.
    pub fn verify(&self) {
        if !self.enabled {
            return;
        }
        let fwd = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").unwrap_or_default();
        let s = if fwd.trim() != "1" {
            State::Unverified("IPv4 forwarding (net.ipv4.ip_forward) is off".into())
        } else {
            // A dump interrupted by someone else's change is asked again.
            let mut r = nft::Nft::open().and_then(|mut n| n.verify(&self.ruleset));
            for _ in 0..3 {
                match &r {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                        r = nft::Nft::open().and_then(|mut n| n.verify(&self.ruleset));
                    }
                    _ => break,
                }
            }
            match r {
                Ok(None) => State::Verified,
                Ok(Some(diff)) => State::Unverified(diff),
                Err(e) => State::Unverified(format!("reading nftables back: {e}")),
            }
        };
        self.set(s);
    }

    /// The periodic check: re-program when the last check failed, then verify.
    pub fn tick(&self) {
        if !self.verified() {
            self.program_and_verify();
        } else {
            self.verify();
        }
    }

    /// A socket that becomes readable on every nftables change (for the event loop).
    ///
    /// # Errors
    /// Socket failures.
    pub fn monitor(&self) -> io::Result<sys::NlSocket> {
        let s = sys::NlSocket::open(sys::NETLINK_NETFILTER, std::time::Duration::from_secs(1))?;
        s.add_membership(nft::GROUP_NFTABLES)?;
        crate::sys::set_nonblocking(std::os::fd::AsFd::as_fd(s.fd()))?;
        Ok(s)
    }

    /// A network for one run, or why there is none (the run then goes offline).
    ///
    /// # Errors
    /// Not verified, no free slot, or a netlink failure (everything made is undone).
    /// With `policy`, the sandbox reaches only what it allows (`None`: the whole public
    /// internet).
    pub fn lease(
        self: &Arc<Egress>,
        run_id: &str,
        policy: Option<Arc<policy::Allowlist>>,
    ) -> Result<NetLease, NetfilterError> {
        if !self.verified() {
            return Err(NetfilterError::NotVerified);
        }
        let slot = self.alloc().ok_or(NetfilterError::PoolExhausted)?;
        let serial = self.lease_serial.fetch_add(1, Ordering::AcqRel) + 1;
        let lease = NetLease {
            egress: Arc::clone(self),
            slot,
            serial,
            host_if: format!("{}{slot:x}", self.prefix),
            ns_path: self.ns_dir.join(run_id),
            released: false,
        };
        // On error, dropping the lease undoes whatever was made.
        self.build(&lease).map_err(NetfilterError::Setup)?;
        let addr = lease.sandbox_addr();
        let mut elements = vec![nft::Element::link(&lease.host_if, addr)];
        match &policy {
            None => elements.push(nft::Element::full(&lease.host_if)),
            Some(p) => {
                for c in p.nets() {
                    elements.push(nft::Element::range("allowed", &lease.host_if, *c));
                }
                for c in p.block_nets() {
                    elements.push(nft::Element::range("blocked", &lease.host_if, *c));
                }
            }
        }
        {
            let mut leases = self
                .leases
                .lock()
                .map_err(|_| NetfilterError::Setup(io::Error::other("lease table poisoned")))?;
            nft::Nft::open()
                .and_then(|mut n| n.elements(self.table(), &elements, true))
                .map_err(|e| NetfilterError::Setup(ctx("adding the link's set elements")(e)))?;
            leases.insert(
                slot,
                LeaseInfo {
                    serial,
                    addr,
                    policy,
                    elements,
                },
            );
        }
        // Cut first, verify after (issue 26 item 9): the link exists and its elements
        // are in, but nothing runs behind it yet. Read the table back now, so a sandbox
        // never starts on a table that was last checked before its link existed: an
        // outside change made since the last check (whose own check may not have run
        // yet) is caught here, and a failed check cuts every link, ours included.
        // (A check that failed while we built may also have cut the links before ours
        // existed: `set` clears the flag before cutting, so either the flag is clear
        // here, or the cut saw our link.)
        self.verify();
        if !self.verified() {
            return Err(NetfilterError::StoppedVerifying);
        }
        Ok(lease)
    }

    fn build(&self, l: &NetLease) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&l.ns_path)?;
        let ns_path = l.ns_path.clone();
        // A fresh thread enters a new namespace, pins it with a bind mount, and opens
        // an rtnetlink socket there (sockets stay in the namespace they were made in).
        let mut inner = std::thread::Builder::new()
            .name("isobox-netns".into())
            .spawn(move || -> io::Result<rtnl::Rtnl> {
                sys::unshare_netns().map_err(ctx("unshare"))?;
                // No IPv6 at all in the sandbox's namespace (links made later inherit
                // `default`); the table drops IPv6 too, this keeps even link-local away.
                disable_ipv6("all");
                disable_ipv6("default");
                sys::bind_mount(Path::new("/proc/thread-self/ns/net"), &ns_path)
                    .map_err(ctx("pinning the namespace"))?;
                let mut r = rtnl::Rtnl::open()?;
                let lo = r.index_of("lo").map_err(ctx("finding lo"))?;
                r.set_up(lo).map_err(ctx("bringing lo up"))?;
                Ok(r)
            })?
            .join()
            .map_err(|_| io::Error::other("netns thread panicked"))??;
        let ns = sys::open_netns(&l.ns_path)?;
        // The tmpfs over /proc/sys/net also hides runsc's own guard against the host's
        // namespace: make sure the pinned namespace is not ours.
        let ours = sys::open_thread_netns()?;
        if same_file(&ns, &ours)? {
            return Err(io::Error::other("the run's namespace is the daemon's own"));
        }
        let mut host = rtnl::Rtnl::open()?;
        host.add_veth(&l.host_if, "eth0", &ns)
            .map_err(ctx("creating the veth pair"))?;
        disable_ipv6(&l.host_if);
        let idx = host.index_of(&l.host_if)?;
        host.add_addr(idx, self.addr(l.slot, 1), 30)
            .map_err(ctx("host address"))?;
        host.set_up(idx).map_err(ctx("host link up"))?;
        let eth0 = inner.index_of("eth0").map_err(ctx("finding eth0"))?;
        inner.set_up(eth0).map_err(ctx("sandbox link up"))?;
        inner
            .add_addr(eth0, self.addr(l.slot, 2), 30)
            .map_err(ctx("sandbox address"))?;
        inner
            .add_default_route(eth0, self.addr(l.slot, 1))
            .map_err(ctx("default route"))?;
        Ok(())
    }

    /// Shutdown: removes the table, leftover namespaces, and the data dir's bind mount.
    pub fn stop(&self) {
        self.verified.store(false, Ordering::Release);
        self.sweep();
        self.teardown();
    }

    /// Deletes the table, resolv.conf and our bind mount of the data dir (only when the
    /// marker says it is ours).
    fn teardown(&self) {
        if let Err(e) = nft::Nft::open().and_then(|mut n| n.delete_table(self.table())) {
            log::warn!("egress: deleting table inet {}: {e}", self.table());
        }
        let _ = std::fs::remove_dir(&self.ns_dir);
        let _ = std::fs::remove_file(&self.resolv);
        let marker = self.bind_marker();
        if marker.exists() {
            if is_mount_point(&self.data_dir) {
                if let Err(e) = crate::sys::loopdev::umount2(&self.data_dir, 0) {
                    log::warn!("egress: unmounting {}: {e}", self.data_dir.display());
                    let _ = crate::sys::loopdev::umount2(&self.data_dir, libc::MNT_DETACH);
                }
            }
            let _ = std::fs::remove_file(&marker);
        }
        let _ = std::fs::remove_dir(self.ns_dir.parent().unwrap_or(&self.ns_dir));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_errors_name_what_failed() {
        let e = "10.200.0.1/16".parse::<Cidr>().unwrap_err();
        assert_eq!(e.to_string(), "10.200.0.1/16 has host bits set");
        let e = NetfilterError::PoolOverlap {
            pool: Cidr::DEFAULT_POOL,
            addr: "10.200.3.1".parse().unwrap(),
            prefix: 24,
            link: "eth1".into(),
        };
        assert_eq!(
            e.to_string(),
            "ISOBOX_NET_POOL 10.200.0.0/16 overlaps 10.200.3.1/24 on eth1"
        );
        let e = NetfilterError::Path {
            what: "writing",
            path: "/x/resolv.conf".into(),
            source: io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert!(e.to_string().starts_with("writing /x/resolv.conf: "), "{e}");
        assert_eq!(
            NetfilterError::PoolExhausted.to_string(),
            "no free address in ISOBOX_NET_POOL"
        );
    }

    #[test]
    fn cidr_parse_contains_overlaps() {
        let p: Cidr = "10.200.0.0/16".parse().unwrap();
        assert_eq!(p, Cidr::DEFAULT_POOL);
        assert_eq!(p.to_string(), "10.200.0.0/16");
        assert!(p.contains("10.200.255.1".parse().unwrap()));
        assert!(!p.contains("10.201.0.1".parse().unwrap()));
        let ten: Cidr = "10.0.0.0/8".parse().unwrap();
        assert!(ten.overlaps(p) && p.overlaps(ten));
        assert!(!p.overlaps("192.168.0.0/16".parse().unwrap()));
        assert!("10.200.0.1/16".parse::<Cidr>().is_err());
        assert!("10.200.0.0/33".parse::<Cidr>().is_err());
        assert!("10.200.0.0".parse::<Cidr>().is_err());
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert_eq!(all.mask(), 0);
        assert!(all.contains("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn denied_ranges_parse_and_keep_test_nets_public() {
        let d: Vec<Cidr> = DENIED.iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(d.len(), DENIED.len());
        for ip in [
            "169.254.169.254",
            "100.100.100.200",
            "172.31.1.1",
            "255.255.255.255",
            "127.0.0.53",
        ] {
            assert!(d.iter().any(|c| c.contains(ip.parse().unwrap())), "{ip}");
        }
        for ip in ["198.51.100.7", "203.0.113.9", "1.1.1.1", "8.8.8.8"] {
            assert!(!d.iter().any(|c| c.contains(ip.parse().unwrap())), "{ip}");
        }
    }

    /// Issue 26 item 9: a lease made after an outside change to the table, before any
    /// periodic or notified check has run (there is no monitor here at all), is
    /// refused, and the link it made is gone. Runs in a network namespace of its own.
    #[test]
    fn test_a_lease_after_an_unchecked_change_is_refused() {
        if !nix_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = std::env::temp_dir().join(format!("isobox-lease-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let d2 = dir.clone();
        let r = std::thread::spawn(move || -> Result<(), String> {
            sys::unshare_netns().map_err(|e| e.to_string())?;
            let cfg = EgressConfig {
                enabled: true,
                pool: Cidr::DEFAULT_POOL,
                dns: vec!["198.51.100.53".parse().unwrap()],
                deny: Vec::new(),
                verify_sec: 3600,
                max_conns: 16,
                rate_bytes: 1 << 20,
                forward_others: ForwardOthers::Keep,
            };
            let e = Egress::new(&cfg, "isobox-leasetest", &d2, 40000);
            e.start();
            if !e.verified() {
                return Err(format!("not verified at start: {:?}", e.state()));
            }
            let ok = e.lease("run-ok", None).map_err(|x| x.to_string())?;
            drop(ok);
            // The outside change: the forward chain is flushed (the table and its sets
            // stay, so the lease's own element writes still succeed), and nobody has
            // checked since.
            let out = std::process::Command::new("nft")
                .args(["flush", "chain", "inet", e.table(), "forward"])
                .output()
                .map_err(|x| format!("nft: {x}"))?;
            if !out.status.success() {
                return Err(String::from_utf8_lossy(&out.stderr).into_owned());
            }
            assert!(e.verified(), "the flag is stale: no check ran");
            let r = e.lease("run-late", None);
            // This namespace dies with the thread: so does its forwarding marker.
            if let Some(ns) = netns_inode() {
                let _ = std::fs::remove_file(forwarding_marker(ns));
            }
            let links: Vec<String> = rtnl::Rtnl::open()
                .and_then(|mut r| r.links())
                .map_err(|x| x.to_string())?
                .into_iter()
                .map(|l| l.name)
                .filter(|n| n.starts_with(&e.prefix))
                .collect();
            e.stop();
            match r {
                Err(NetfilterError::StoppedVerifying) if links.is_empty() => Ok(()),
                Err(other) => Err(format!("refused, but as {other}; links {links:?}")),
                Ok(_) => Err("a lease was given on a table nobody had checked".into()),
            }
        })
        .join()
        .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        r.unwrap();
    }

    fn nix_root() -> bool {
        std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .map(|l| l.split_whitespace().nth(1) == Some("0"))
            })
            .unwrap_or(false)
    }

    #[test]
    fn interface_prefix_is_short_stable_and_per_instance() {
        let a = if_prefix("isobox");
        assert_eq!(a.len(), 7);
        assert_eq!(a, if_prefix("isobox"));
        assert_ne!(a, if_prefix("isobox-t1-0"));
        // The longest name: prefix + slot of a /16 pool in hex.
        assert!(format!("{a}{:x}", (1u32 << 14) - 1).len() <= 15);
    }
}
