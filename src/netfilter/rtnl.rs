//! rtnetlink: veth pairs, addresses, routes, and link/address dumps.

use super::nl::{self, Conn, Msg};
use crate::sys::netlink::{NlSocket, NETLINK_ROUTE};
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Duration;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const IFLA_IFNAME: u16 = 3;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const RTA_GATEWAY: u16 = 5;
const RTA_OIF: u16 = 4;
const IFF_UP: u32 = 1;

/// An rtnetlink connection in the calling thread's network namespace.
#[derive(Debug)]
pub struct Rtnl {
    conn: Conn,
}

/// `ifinfomsg` with `index`, and `IFF_UP` set (and changed) when `up`.
fn ifinfo(index: i32, up: bool) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0] = libc::AF_UNSPEC as u8;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    if up {
        h[8..12].copy_from_slice(&IFF_UP.to_ne_bytes());
        h[12..16].copy_from_slice(&IFF_UP.to_ne_bytes());
    }
    h
}

/// A link seen in a dump.
#[derive(Debug, Clone)]
pub struct Link {
    /// Interface index.
    pub index: i32,
    /// Interface name.
    pub name: String,
}

/// An IPv4 address seen in a dump.
#[derive(Debug, Clone, Copy)]
pub struct Addr {
    /// The interface's index.
    pub index: i32,
    /// The address.
    pub addr: Ipv4Addr,
    /// Its prefix length.
    pub prefix: u8,
}

impl Rtnl {
    /// Opens a connection in the calling thread's network namespace.
    ///
    /// # Errors
    /// Socket failures.
    pub fn open() -> io::Result<Rtnl> {
        Ok(Rtnl {
            conn: Conn::new(NlSocket::open(NETLINK_ROUTE, Duration::from_secs(5))?),
        })
    }

    /// Creates a veth pair, both ends down (`IFF_UP` at creation fails with `ENOTCONN`:
    /// the peer is not linked yet): `host` here and `peer` in the namespace `ns`.
    ///
    /// # Errors
    /// The kernel's error (`EEXIST` when `host` exists).
    pub fn add_veth(&mut self, host: &str, peer: &str, ns: &OwnedFd) -> io::Result<()> {
        let seq = self.conn.next_seq();
        let mut m = Msg::new(
            RTM_NEWLINK,
            nl::F_REQUEST | nl::F_ACK | nl::F_CREATE | nl::F_EXCL,
            seq,
        );
        m.header(&ifinfo(0, false)).attr_str(IFLA_IFNAME, host);
        m.begin(IFLA_LINKINFO).attr_str(IFLA_INFO_KIND, "veth");
        m.begin(IFLA_INFO_DATA).begin_raw(VETH_INFO_PEER);
        m.header(&ifinfo(0, false))
            .attr_str(IFLA_IFNAME, peer)
            .attr_u32(IFLA_NET_NS_FD, u32::try_from(ns.as_raw_fd()).unwrap_or(0));
        m.end().end().end();
        self.conn.request(m, seq)
    }

    /// Deletes a link by name (a veth takes its peer with it). A missing link is fine.
    ///
    /// # Errors
    /// Other kernel errors.
    pub fn del_link(&mut self, name: &str) -> io::Result<()> {
        let seq = self.conn.next_seq();
        let mut m = Msg::new(RTM_DELLINK, nl::F_REQUEST | nl::F_ACK, seq);
        m.header(&ifinfo(0, false)).attr_str(IFLA_IFNAME, name);
        match self.conn.request(m, seq) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
            r => r,
        }
    }

    /// Brings a link up by index.
    ///
    /// # Errors
    /// The kernel's error.
    pub fn set_up(&mut self, index: i32) -> io::Result<()> {
        let seq = self.conn.next_seq();
        let mut m = Msg::new(RTM_NEWLINK, nl::F_REQUEST | nl::F_ACK, seq);
        m.header(&ifinfo(index, true));
        self.conn.request(m, seq)
    }

    /// Every link in this namespace.
    ///
    /// # Errors
    /// The kernel's error.
    pub fn links(&mut self) -> io::Result<Vec<Link>> {
        let seq = self.conn.next_seq();
        let mut m = Msg::new(RTM_GETLINK, nl::F_REQUEST | nl::F_DUMP, seq);
        m.header(&ifinfo(0, false));
        let mut out = Vec::new();
        for (ty, p) in self.conn.dump(m, seq)? {
            if ty != RTM_NEWLINK || p.len() < 16 {
                continue;
            }
            let index = i32::from_ne_bytes(p[4..8].try_into().unwrap_or_default());
            let a = nl::attrs(&p, 16);
            if let Some(name) = nl::find(&a, IFLA_IFNAME) {
                out.push(Link {
                    index,
                    name: nl::text(&name),
                });
            }
        }
        Ok(out)
    }

    /// The index of the link called `name`.
    ///
    /// # Errors
    /// `NotFound` when there is none.
    pub fn index_of(&mut self, name: &str) -> io::Result<i32> {
        self.links()?
            .into_iter()
            .find(|l| l.name == name)
            .map(|l| l.index)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no link {name}")))
    }

    /// Every IPv4 address in this namespace.
    ///
    /// # Errors
    /// The kernel's error.
    pub fn addrs(&mut self) -> io::Result<Vec<Addr>> {
        let seq = self.conn.next_seq();
        let mut m = Msg::new(RTM_GETADDR, nl::F_REQUEST | nl::F_DUMP, seq);
        m.header(&[libc::AF_INET as u8, 0, 0, 0, 0, 0, 0, 0]);
        let mut out = Vec::new();
        for (ty, p) in self.conn.dump(m, seq)? {
            if ty != RTM_NEWADDR || p.len() < 8 || p[0] != libc::AF_INET as u8 {
                continue;
            }
            let index = i32::from_ne_bytes(p[4..8].try_into().unwrap_or_default());
            let a = nl::attrs(&p, 8);
            let raw = nl::find(&a, IFA_LOCAL).or_else(|| nl::find(&a, IFA_ADDRESS));
            if let Some(Ok(b)) = raw.map(<[u8; 4]>::try_from) {
                out.push(Addr {
                    index,
                    addr: Ipv4Addr::from(b),
                    prefix: p[1],
                });
            }
        }
        Ok(out)
    }

    /// Adds `addr/prefix` to the link `index`.
    ///
    /// # Errors
    /// The kernel's error.
    pub fn add_addr(&mut self, index: i32, addr: Ipv4Addr, prefix: u8) -> io::Result<()> {
        let seq = self.conn.next_seq();
        let mut m = Msg::new(
            RTM_NEWADDR,
            nl::F_REQUEST | nl::F_ACK | nl::F_CREATE | nl::F_EXCL,
            seq,
        );
        let mut h = [0u8; 8];
        h[0] = libc::AF_INET as u8;
        h[1] = prefix;
        h[4..8].copy_from_slice(&index.to_ne_bytes());
        m.header(&h)
            .attr(IFA_LOCAL, &addr.octets())
            .attr(IFA_ADDRESS, &addr.octets());
        self.conn.request(m, seq)
    }

    /// Adds the default route via `gateway` on link `index`.
    ///
    /// # Errors
    /// The kernel's error.
    pub fn add_default_route(&mut self, index: i32, gateway: Ipv4Addr) -> io::Result<()> {
        let seq = self.conn.next_seq();
        let mut m = Msg::new(
            RTM_NEWROUTE,
            nl::F_REQUEST | nl::F_ACK | nl::F_CREATE | nl::F_EXCL,
            seq,
        );
        // rtmsg: family, dst_len, src_len, tos, table main, protocol static, scope
        // universe, type unicast, flags.
        let h = [libc::AF_INET as u8, 0, 0, 0, 254, 4, 0, 1, 0, 0, 0, 0];
        m.header(&h)
            .attr(RTA_GATEWAY, &gateway.octets())
            .attr_u32(RTA_OIF, u32::try_from(index).unwrap_or(0));
        self.conn.request(m, seq)
    }
}
