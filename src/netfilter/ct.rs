//! ctnetlink: forgetting the connections of a run whose link is gone.
//!
//! A sandbox's flows stay in the host's conntrack table after its link is deleted
//! (an established TCP entry for five days by default): left there, runs that hold
//! many connections open would fill the table over time, and a later run given the
//! same link name would find its connection budget already spent. So a lease's release
//! deletes every entry whose original source is the run's address, and the startup
//! sweep deletes every entry from the pool.

use super::nl::{self, Conn, Msg};
use super::Cidr;
use crate::sys::netlink::{NlSocket, NETLINK_NETFILTER};
use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

const SUBSYS_CTNETLINK: u16 = 1 << 8;
const CT_GET: u16 = 1;
const CT_DELETE: u16 = 2;
const CTA_TUPLE_ORIG: u16 = 1;
const CTA_TUPLE_IP: u16 = 1;
const CTA_IP_V4_SRC: u16 = 1;
const CTA_ZONE: u16 = 18;
const CTA_FILTER: u16 = 25;
const CTA_FILTER_ORIG_FLAGS: u16 = 1;
const CTA_FILTER_REPLY_FLAGS: u16 = 2;
/// `CTA_FILTER_FLAG(CTA_IP_SRC)`.
const FILTER_IP_SRC: u32 = 1;
const AF_INET: u8 = libc::AF_INET as u8;

fn header() -> [u8; 4] {
    // nfgenmsg: family, NFNETLINK_V0, res_id 0.
    [AF_INET, 0, 0, 0]
}

/// One tracked connection: its original tuple and zone as the kernel dumped them.
struct Entry {
    src: Option<Ipv4Addr>,
    tuple: Vec<u8>,
    zone: Option<Vec<u8>>,
}

fn parse(payload: &[u8]) -> Option<Entry> {
    let top = nl::attrs(payload, 4);
    let tuple = nl::find(&top, CTA_TUPLE_ORIG)?;
    let src = nl::find(&nl::attrs(&tuple, 0), CTA_TUPLE_IP)
        .and_then(|ip| nl::find(&nl::attrs(&ip, 0), CTA_IP_V4_SRC))
        .and_then(|b| <[u8; 4]>::try_from(b.as_slice()).ok())
        .map(Ipv4Addr::from);
    Some(Entry {
        src,
        tuple,
        zone: nl::find(&top, CTA_ZONE),
    })
}

/// Conntrack in the calling thread's network namespace.
pub struct Conntrack {
    conn: Conn,
}

impl Conntrack {
    /// Opens a connection.
    ///
    /// # Errors
    /// Socket failures.
    pub fn open() -> io::Result<Conntrack> {
        Ok(Conntrack {
            conn: Conn::new(NlSocket::open(NETLINK_NETFILTER, Duration::from_secs(5))?),
        })
    }

    /// The IPv4 entries, only those from `src` when given (filtered by the kernel where
    /// it can, since Linux 5.9; by us in any case).
    fn list(&mut self, src: Option<Ipv4Addr>) -> io::Result<Vec<Entry>> {
        // Entries are filtered as they arrive: a kernel that ignores the filter (before
        // 5.9) sends the whole table, which is never held at once.
        let dump = |conn: &mut Conn, filtered: bool| -> io::Result<Vec<Entry>> {
            let s = conn.next_seq();
            let mut m = Msg::new(SUBSYS_CTNETLINK | CT_GET, nl::F_REQUEST | nl::F_DUMP, s);
            m.header(&header());
            if let (Some(ip), true) = (src, filtered) {
                m.begin(CTA_TUPLE_ORIG)
                    .begin(CTA_TUPLE_IP)
                    .attr(CTA_IP_V4_SRC, &ip.octets())
                    .end()
                    .end()
                    .begin(CTA_FILTER)
                    .attr_u32(CTA_FILTER_ORIG_FLAGS, FILTER_IP_SRC)
                    .attr_u32(CTA_FILTER_REPLY_FLAGS, 0)
                    .end();
            }
            let mut out = Vec::new();
            conn.dump_each(m, s, |_, p| {
                if let Some(e) = parse(p).filter(|e| src.is_none() || e.src == src) {
                    out.push(e);
                }
            })?;
            Ok(out)
        };
        match dump(&mut self.conn, src.is_some()) {
            Err(e) if src.is_some() && e.kind() != io::ErrorKind::Interrupted => {
                log::debug!("conntrack: filtered dump refused ({e}), listing all");
                // A fresh socket: the refused dump may still be running on the old one.
                self.conn = Self::open()?.conn;
                dump(&mut self.conn, false)
            }
            r => r,
        }
    }

    /// Deletes every entry whose original source `matches`; returns how many went.
    /// `hint` narrows the kernel's dump to one source address.
    ///
    /// # Errors
    /// Netlink failures (an entry that vanished meanwhile is not one).
    pub fn forget(
        &mut self,
        hint: Option<Ipv4Addr>,
        matches: impl Fn(Ipv4Addr) -> bool,
    ) -> io::Result<usize> {
        let mut n = 0;
        // An interrupted dump (the table changed under it) is simply asked again.
        for _ in 0..3 {
            let entries = match self.list(hint) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    // Asked again on a fresh socket (the old one may be mid-dump).
                    self.conn = Self::open()?.conn;
                    continue;
                }
                r => r?,
            };
            for e in entries.iter().filter(|e| e.src.is_some_and(&matches)) {
                let s = self.conn.next_seq();
                let mut m = Msg::new(SUBSYS_CTNETLINK | CT_DELETE, nl::F_REQUEST | nl::F_ACK, s);
                m.header(&header())
                    .attr(CTA_TUPLE_ORIG | nl::NESTED, &e.tuple);
                if let Some(z) = &e.zone {
                    m.attr(CTA_ZONE, z);
                }
                match self.conn.request(m, s) {
                    Ok(()) => n += 1,
                    Err(err) if err.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(err) => return Err(err),
                }
            }
            return Ok(n);
        }
        Ok(n)
    }
}

/// Forgets the connections of the sandbox at `addr` (best effort, logged).
pub fn forget_addr(addr: Ipv4Addr) {
    match Conntrack::open().and_then(|mut c| c.forget(Some(addr), |a| a == addr)) {
        Ok(0) => {}
        Ok(n) => log::debug!("conntrack: forgot {n} connections of {addr}"),
        Err(e) => log::warn!("conntrack: forgetting the connections of {addr}: {e}"),
    }
}

/// Forgets every connection from `pool` (the startup sweep).
pub fn forget_pool(pool: Cidr) {
    match Conntrack::open().and_then(|mut c| c.forget(None, |a| pool.contains(a))) {
        Ok(0) => {}
        Ok(n) => log::info!("conntrack: swept {n} connections from {pool}"),
        Err(e) => log::warn!("conntrack: sweeping connections from {pool}: {e}"),
    }
}
