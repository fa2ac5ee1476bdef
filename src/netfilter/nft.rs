//! nftables over netlink: the egress ruleset, applied as one atomic batch, read back
//! from the kernel and compared with what was meant.
//!
//! It stays one file: the encoder and the normaliser that reads the kernel's dump back
//! must agree expression by expression for a verification to mean anything.
//!
//! Expressions are encoded here and decoded by the same normaliser on the way back, so
//! verification compares meaning (attribute values, order of rules) rather than the
//! incidental layout of the kernel's dump.

use super::nl::{self, Conn, Msg};
use super::Cidr;
use crate::sys::netlink::{NlSocket, NETLINK_NETFILTER};
use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

const SUBSYS: u16 = 10 << 8;
const MSG_NEWTABLE: u16 = 0;
const MSG_GETTABLE: u16 = 1;
const MSG_DELTABLE: u16 = 2;
const MSG_NEWCHAIN: u16 = 3;
const MSG_GETCHAIN: u16 = 4;
const MSG_NEWRULE: u16 = 6;
const MSG_GETRULE: u16 = 7;
const MSG_NEWSET: u16 = 9;
const MSG_GETSET: u16 = 10;
const MSG_NEWSETELEM: u16 = 12;
const MSG_GETSETELEM: u16 = 13;
const MSG_DELSETELEM: u16 = 14;
const BATCH_BEGIN: u16 = 0x10;
const BATCH_END: u16 = 0x11;
const NFPROTO_INET: u8 = 1;
/// `NFNLGRP_NFTABLES`: the multicast group announcing every ruleset change.
pub const GROUP_NFTABLES: u32 = 7;

const TABLE_NAME: u16 = 1;
const TABLE_FLAGS: u16 = 2;
const CHAIN_TABLE: u16 = 1;
const CHAIN_NAME: u16 = 3;
const CHAIN_HOOK: u16 = 4;
const CHAIN_POLICY: u16 = 5;
const CHAIN_TYPE: u16 = 7;
const HOOK_NUM: u16 = 1;
const HOOK_PRIORITY: u16 = 2;
const RULE_TABLE: u16 = 1;
const RULE_CHAIN: u16 = 2;
const RULE_EXPRESSIONS: u16 = 4;
const LIST_ELEM: u16 = 1;
const EXPR_NAME: u16 = 1;
const EXPR_DATA: u16 = 2;
const DATA_VALUE: u16 = 1;
const DATA_VERDICT: u16 = 2;
const VERDICT_CODE: u16 = 1;
const SET_TABLE: u16 = 1;
const SET_NAME: u16 = 2;
const SET_FLAGS: u16 = 3;
const SET_KEY_TYPE: u16 = 4;
const SET_KEY_LEN: u16 = 5;
const SET_DESC: u16 = 9;
const SET_DESC_SIZE: u16 = 1;
const SET_ID: u16 = 10;
const SET_DESC_CONCAT: u16 = 2;
const SET_FIELD_LEN: u16 = 1;
/// `NFT_SET_INTERVAL`: elements are ranges.
const SET_F_INTERVAL: u32 = 0x4;
/// `NFT_SET_EVAL`: elements are added from the packet path (`flags dynamic`).
const SET_F_EVAL: u32 = 0x20;
/// `NFT_SET_CONCAT`: keys are concatenations (with `INTERVAL`: the pipapo backend).
const SET_F_CONCAT: u32 = 0x80;
/// nft's datatype numbers (only shown by `nft list`; the kernel keeps them): `ifname`,
/// `ipv4_addr`, and their concatenation (`ifname . ipv4_addr`, nft's `a << 6 | b`).
const TYPE_IFNAME: u32 = 41;
const TYPE_IPV4: u32 = 7;
const TYPE_IFNAME_IPV4: u32 = TYPE_IFNAME << 6 | TYPE_IPV4;
const IFNAMSIZ: u32 = 16;
const ELEMS_TABLE: u16 = 1;
const ELEMS_SET: u16 = 2;
const ELEMS_LIST: u16 = 3;
const ELEMS_SET_ID: u16 = 4;
const ELEM_KEY: u16 = 1;
const ELEM_FLAGS: u16 = 3;
/// `NFT_SET_ELEM_INTERVAL_END`: the element ends a range (exclusive) in an interval set.
const ELEM_INTERVAL_END: u32 = 1;
const ELEM_KEY_END: u16 = 10;
const LOOKUP_SET: u16 = 1;
const LOOKUP_SREG: u16 = 2;
const LOOKUP_SET_ID: u16 = 4;
const LOOKUP_FLAGS: u16 = 5;
/// `NFT_LOOKUP_F_INV`: match when the key is not in the set.
const LOOKUP_F_INV: u32 = 1;
/// `NF_NAT_RANGE_PROTO_SPECIFIED`: `redirect to :port`.
const NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;
const DYNSET_SET_NAME: u16 = 1;
const DYNSET_SET_ID: u16 = 2;
const DYNSET_OP: u16 = 3;
const DYNSET_SREG_KEY: u16 = 4;
const DYNSET_EXPR: u16 = 7;
const DYNSET_OP_ADD: u32 = 0;
/// `NFT_CONNLIMIT_F_INV` / `NFT_LIMIT_F_INV`: match when over.
const F_INV: u32 = 1;
const NFT_LIMIT_PKT_BYTES: u32 = 1;

const HOOK_PREROUTING: u32 = 0;
const HOOK_INPUT: u32 = 1;
const HOOK_FORWARD: u32 = 2;
const HOOK_POSTROUTING: u32 = 4;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
/// The 16-byte register after `REG_1` (where a concatenation's second field goes when
/// the first is an interface name).
const REG_2: u32 = 2;
const META_NFPROTO: u32 = 15;
const META_L4PROTO: u32 = 16;
const META_IIFNAME: u32 = 6;
const META_OIFNAME: u32 = 7;
const CT_STATE: u32 = 0;
const CT_DIRECTION: u32 = 1;
const CT_STATUS: u32 = 2;
/// `IPS_DST_NAT`: the connection's destination was rewritten (by our `redirect`).
const CT_STATUS_DNAT: u32 = 1 << 5;
/// `IP_CT_DIR_REPLY`.
const DIR_REPLY: u8 = 1;
const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;
const BASE_NETWORK: u32 = 1;
const BASE_TRANSPORT: u32 = 2;
const NFPROTO_IPV4: u8 = 2;
const NFPROTO_IPV6: u8 = 10;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
/// `ct state established,related` as conntrack's state bits.
const CT_ESTABLISHED_RELATED: u32 = 0x2 | 0x4;
/// `ct state new`.
const CT_NEW: u32 = 0x8;

/// One nftables expression.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expr {
    Meta(u32),
    Cmp(u32, Vec<u8>),
    Payload(u32, u32, u32),
    /// A payload load into `REG_2` (a concatenation's second field).
    Payload2(u32, u32, u32),
    Bitwise(u32, Vec<u8>),
    Ct(u32),
    Verdict(u32),
    Masq,
    /// `add @set { <reg 1> <expr> }`: the element's stateful expression decides.
    Dynset(&'static str, Box<Expr>),
    /// `ct count over N` (only inside a dynset).
    Connlimit(u32),
    /// `limit rate over N bytes/second` (only inside a dynset).
    LimitBytes(u64),
    /// `<reg 1> [!=] @set` (true: inverted).
    Lookup(&'static str, bool),
    /// Loads bytes into `REG_1` (a port for `Redir`).
    Imm(Vec<u8>),
    /// `redirect to :<port in reg 1>`.
    Redir,
}

impl Expr {
    fn encode(&self, m: &mut Msg) {
        m.begin(LIST_ELEM);
        self.encode_body(m);
        m.end();
    }

    /// The expression's name and data, without the list element around them.
    fn encode_body(&self, m: &mut Msg) {
        let name = match self {
            Expr::Meta(_) => "meta",
            Expr::Cmp(..) => "cmp",
            Expr::Payload(..) | Expr::Payload2(..) => "payload",
            Expr::Bitwise(..) => "bitwise",
            Expr::Ct(_) => "ct",
            Expr::Verdict(_) => "immediate",
            Expr::Masq => "masq",
            Expr::Dynset(..) => "dynset",
            Expr::Connlimit(_) => "connlimit",
            Expr::LimitBytes(_) => "limit",
            Expr::Lookup(..) => "lookup",
            Expr::Imm(_) => "immediate",
            Expr::Redir => "redir",
        };
        m.attr_str(EXPR_NAME, name).begin(EXPR_DATA);
        match self {
            Expr::Meta(key) => {
                m.attr_be32(2, *key).attr_be32(1, REG_1);
            }
            Expr::Cmp(op, data) => {
                m.attr_be32(1, REG_1).attr_be32(2, *op);
                m.begin(3).attr(DATA_VALUE, data).end();
            }
            Expr::Payload(base, off, len) => {
                m.attr_be32(1, REG_1)
                    .attr_be32(2, *base)
                    .attr_be32(3, *off)
                    .attr_be32(4, *len);
            }
            Expr::Payload2(base, off, len) => {
                m.attr_be32(1, REG_2)
                    .attr_be32(2, *base)
                    .attr_be32(3, *off)
                    .attr_be32(4, *len);
            }
            Expr::Bitwise(len, mask) => {
                m.attr_be32(1, REG_1)
                    .attr_be32(2, REG_1)
                    .attr_be32(3, *len)
                    .attr_be32(6, 0);
                m.begin(4).attr(DATA_VALUE, mask).end();
                m.begin(5).attr(DATA_VALUE, &vec![0u8; mask.len()]).end();
            }
            Expr::Ct(key) => {
                m.attr_be32(2, *key).attr_be32(1, REG_1);
            }
            Expr::Verdict(code) => {
                m.attr_be32(1, REG_VERDICT);
                m.begin(2)
                    .begin(DATA_VERDICT)
                    .attr_be32(VERDICT_CODE, *code)
                    .end()
                    .end();
            }
            Expr::Masq => {}
            Expr::Dynset(set, inner) => {
                // The kernel finds a set added in the same batch only by its id.
                m.attr_str(DYNSET_SET_NAME, set)
                    .attr_be32(DYNSET_SET_ID, set_id(set))
                    .attr_be32(DYNSET_OP, DYNSET_OP_ADD)
                    .attr_be32(DYNSET_SREG_KEY, REG_1);
                m.begin(DYNSET_EXPR);
                inner.encode_body(m);
                m.end();
            }
            Expr::Connlimit(count) => {
                m.attr_be32(1, *count).attr_be32(2, F_INV);
            }
            Expr::LimitBytes(rate) => {
                m.attr(1, &rate.to_be_bytes())
                    .attr(2, &1u64.to_be_bytes())
                    .attr_be32(3, 0)
                    .attr_be32(4, NFT_LIMIT_PKT_BYTES)
                    .attr_be32(5, F_INV);
            }
            Expr::Lookup(set, inv) => {
                m.attr_str(LOOKUP_SET, set)
                    .attr_be32(LOOKUP_SET_ID, set_id(set))
                    .attr_be32(LOOKUP_SREG, REG_1)
                    .attr_be32(LOOKUP_FLAGS, if *inv { LOOKUP_F_INV } else { 0 });
            }
            Expr::Imm(data) => {
                m.attr_be32(1, REG_1);
                m.begin(2).attr(DATA_VALUE, data).end();
            }
            Expr::Redir => {
                // Min and max port from the same register (the kernel dumps both).
                m.attr_be32(1, REG_1)
                    .attr_be32(2, REG_1)
                    .attr_be32(3, NAT_RANGE_PROTO_SPECIFIED);
            }
        }
        m.end();
    }
}

/// A base chain of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Chain {
    name: &'static str,
    kind: &'static str,
    hook: u32,
    priority: i32,
    rules: Vec<Vec<Expr>>,
}

/// A named set of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SetDef {
    name: &'static str,
    flags: u32,
    key_type: u32,
    key_len: u32,
    /// The concatenation's field lengths (interval concatenations only).
    fields: &'static [u32],
}

const fn ifname_set(name: &'static str, flags: u32) -> SetDef {
    SetDef {
        name,
        flags,
        key_type: TYPE_IFNAME,
        key_len: IFNAMSIZ,
        fields: &[],
    }
}

/// `ifname . ipv4_addr`, exact (`interval` false) or ranges.
const fn link_addr_set(name: &'static str, interval: bool) -> SetDef {
    SetDef {
        name,
        flags: if interval {
            SET_F_CONCAT | SET_F_INTERVAL
        } else {
            0
        },
        key_type: TYPE_IFNAME_IPV4,
        key_len: IFNAMSIZ + 4,
        fields: if interval { &[IFNAMSIZ, 4] } else { &[] },
    }
}

/// The table's sets, in the order they are created: the deny list (ranges, as
/// `nft list` prints them; its elements are the table's own and verified with it); the
/// per-link meters (N14), filled
/// from the packet path; then those the daemon fills per lease: each link with its
/// sandbox's address (`links`, anti-spoofing), the links with the whole public
/// internet (`full`; a link missing there is held to its allowlist), and each
/// allowlisted link's listed (`allowed`) and blocked (`blocked`) ranges. Every one
/// fails closed when emptied: a link without its `links` element sends nothing, one
/// without its `full` element gets only its allowlist.
const SETS: [SetDef; 8] = [
    SetDef {
        name: "denied",
        flags: SET_F_INTERVAL,
        key_type: TYPE_IPV4,
        key_len: 4,
        fields: &[],
    },
    ifname_set("conns", SET_F_EVAL),
    ifname_set("up", SET_F_EVAL),
    ifname_set("down", SET_F_EVAL),
    link_addr_set("links", false),
    ifname_set("full", 0),
    link_addr_set("allowed", true),
    link_addr_set("blocked", true),
];

/// A set's id within the batch that creates it (what links a rule to it there).
fn set_id(name: &str) -> u32 {
    SETS.iter()
        .position(|s| s.name == name)
        .map_or(0, |i| i as u32 + 1)
}

/// A key of the per-lease sets: an interface name, padded as `meta iifname` loads it,
/// and optionally an address.
pub fn link_key(ifname: &str, addr: Option<std::net::Ipv4Addr>) -> Vec<u8> {
    let mut k = ifname.as_bytes().to_vec();
    k.resize(IFNAMSIZ as usize, 0);
    if let Some(a) = addr {
        k.extend_from_slice(&a.octets());
    }
    k
}

/// One element of a per-lease set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Element {
    /// `links`, `full`, `allowed` or `blocked`.
    pub set: &'static str,
    /// The key ([`link_key`]).
    pub key: Vec<u8>,
    /// The range's last key, for `allowed` and `blocked`.
    pub key_end: Option<Vec<u8>>,
    /// `ELEM_INTERVAL_END` for the end of a range in `denied`.
    flags: u32,
}

impl Element {
    /// `ifname . addr` in `links`.
    pub fn link(ifname: &str, addr: std::net::Ipv4Addr) -> Element {
        Element {
            set: "links",
            key: link_key(ifname, Some(addr)),
            key_end: None,
            flags: 0,
        }
    }

    /// `ifname` in `full`.
    pub fn full(ifname: &str) -> Element {
        Element {
            set: "full",
            key: link_key(ifname, None),
            key_end: None,
            flags: 0,
        }
    }

    /// `ifname . range` in `allowed` (or `blocked`).
    pub fn range(set: &'static str, ifname: &str, c: Cidr) -> Element {
        let first = std::net::Ipv4Addr::from(c.net());
        let last = std::net::Ipv4Addr::from(c.net() | !c.mask());
        Element {
            set,
            key: link_key(ifname, Some(first)),
            key_end: Some(link_key(ifname, Some(last))),
            flags: 0,
        }
    }
}

/// The deny list as elements of `denied`: the ranges merged where they overlap or
/// touch, each a start element and (unless it runs to 255.255.255.255) an end element
/// one past its last address, in order.
fn denied_elements(deny: &[Cidr]) -> Vec<Element> {
    let mut r: Vec<(u64, u64)> = deny
        .iter()
        .map(|c| (u64::from(c.net()), u64::from(c.net() | !c.mask())))
        .collect();
    r.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, b) in r {
        match merged.last_mut() {
            Some(last) if a <= last.1 + 1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    let el = |v: u64, flags| Element {
        set: "denied",
        key: (v as u32).to_be_bytes().to_vec(),
        key_end: None,
        flags,
    };
    let mut out = Vec::new();
    for (a, b) in merged {
        out.push(el(a, 0));
        if b < u64::from(u32::MAX) {
            out.push(el(b + 1, ELEM_INTERVAL_END));
        }
    }
    out
}

/// What redirects an allowlisted link's web traffic to the daemon's gate: the gate's
/// port, and the resolvers such a link may ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gate {
    /// The gate's TCP port on every host address.
    pub port: u16,
    /// The resolvers (DNS on udp and tcp 53 to these only).
    pub resolvers: Vec<std::net::Ipv4Addr>,
}

/// Per-sandbox network limits (catalogue N14).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections (conntrack entries) a sandbox link may have at once.
    pub max_conns: u32,
    /// Bytes per second each way, per sandbox link.
    pub rate_bytes: u64,
    /// Sandbox links that can exist at once (the sets' size).
    pub links: u32,
}

/// The whole table isobox owns.
#[derive(Debug, Clone)]
pub struct Ruleset {
    table: String,
    /// The named sets ([`SETS`]).
    sets: Vec<SetDef>,
    /// Their size: as many elements as sandbox links can exist (times the ranges an
    /// allowlist may hold, for `allowed` and `blocked`).
    set_size: u32,
    /// The forward chain drops traffic neither from nor to an isobox link.
    drop_others: bool,
    /// The elements of `denied` (the table's own, programmed and verified with it).
    denied: Vec<Element>,
    chains: Vec<Chain>,
}

fn iif(prefix: &str, op: u32) -> [Expr; 2] {
    [
        Expr::Meta(META_IIFNAME),
        Expr::Cmp(op, prefix.as_bytes().to_vec()),
    ]
}

fn oif(prefix: &str, op: u32) -> [Expr; 2] {
    [
        Expr::Meta(META_OIFNAME),
        Expr::Cmp(op, prefix.as_bytes().to_vec()),
    ]
}

fn ipv4() -> [Expr; 2] {
    [
        Expr::Meta(META_NFPROTO),
        Expr::Cmp(CMP_EQ, vec![NFPROTO_IPV4]),
    ]
}

/// `ip {saddr|daddr} & mask == net` (offset 12 = source, 16 = destination).
fn addr_in(offset: u32, c: Cidr) -> [Expr; 3] {
    [
        Expr::Payload(BASE_NETWORK, offset, 4),
        Expr::Bitwise(4, c.mask().to_be_bytes().to_vec()),
        Expr::Cmp(CMP_EQ, c.net().to_be_bytes().to_vec()),
    ]
}

/// What every isobox instance's link names begin with (`if_prefix`).
const OUR_LINKS: &str = "ib";

/// At most this many ranges per allowlisted link in `allowed`, and as many in
/// `blocked` (what a sandbox's policy may list).
pub const MAX_RANGES: u32 = 64;

fn l4(proto: u8) -> [Expr; 2] {
    [Expr::Meta(META_L4PROTO), Expr::Cmp(CMP_EQ, vec![proto])]
}

fn dport(port: u16) -> [Expr; 2] {
    [
        Expr::Payload(BASE_TRANSPORT, 2, 2),
        Expr::Cmp(CMP_EQ, port.to_be_bytes().to_vec()),
    ]
}

/// `iifname . ip {saddr|daddr} [!=] @set` (offset 12 = source, 16 = destination).
fn link_addr_in(offset: u32, set: &'static str, inv: bool) -> [Expr; 5] {
    [
        // `meta nfproto ipv4` first: what lets `nft list` print `ip saddr`/`ip daddr`.
        Expr::Meta(META_NFPROTO),
        Expr::Cmp(CMP_EQ, vec![NFPROTO_IPV4]),
        Expr::Meta(META_IIFNAME),
        Expr::Payload2(BASE_NETWORK, offset, 4),
        Expr::Lookup(set, inv),
    ]
}

/// `iifname "prefix*" iifname != @full`: a link held to its allowlist.
fn allowlisted(prefix: &str) -> Vec<Expr> {
    let mut r = iif(prefix, CMP_EQ).to_vec();
    r.extend([Expr::Meta(META_IIFNAME), Expr::Lookup("full", true)]);
    r
}

impl Ruleset {
    /// The egress policy for sandbox links named `prefix*` with addresses from `pool`:
    /// no IPv6, each link only from its own address, none of `deny` (which must include
    /// the pool), no SMTP, nothing into a sandbox but replies, nothing to the host
    /// itself but replies to the host's own connections and, from allowlisted links,
    /// their web traffic redirected to the `gate`; no more than `limits` per sandbox
    /// link, and masquerade out.
    ///
    /// A link in `full` reaches the public internet. Any other is allowlisted: it
    /// reaches its `allowed` ranges (never its `blocked` ones) and the resolvers on port
    /// 53, and its TCP to ports 80 and 443 elsewhere is redirected to the gate, which
    /// checks the name the connection asks for.
    pub fn egress(
        table: &str,
        prefix: &str,
        pool: Cidr,
        deny: &[Cidr],
        limits: Limits,
        gate: &Gate,
        drop_others: bool,
    ) -> Ruleset {
        let drop = || Expr::Verdict(NF_DROP);
        let accept = || Expr::Verdict(NF_ACCEPT);
        let mut fwd: Vec<Vec<Expr>> = Vec::new();
        if drop_others {
            // Forwarding is on because of us: nothing else is to be routed through the
            // host (neighbours into networks only it reaches). Any isobox instance's
            // links (`ib*`) are left to their own rules.
            let mut r: Vec<Expr> = iif(OUR_LINKS, CMP_NEQ).to_vec();
            r.extend(oif(OUR_LINKS, CMP_NEQ));
            r.push(drop());
            fwd.push(r);
        }
        let mut r: Vec<Expr> = iif(prefix, CMP_EQ).to_vec();
        r.extend([
            Expr::Meta(META_NFPROTO),
            Expr::Cmp(CMP_NEQ, vec![NFPROTO_IPV4]),
            drop(),
        ]);
        fwd.push(r);
        // A sandbox link only ever sends from its own sandbox's address (anti-spoofing,
        // per link: a sandbox cannot answer as another, nor leave conntrack entries
        // under an address its lease does not own).
        let mut r: Vec<Expr> = iif(prefix, CMP_EQ).to_vec();
        r.extend(link_addr_in(12, "links", true));
        r.push(drop());
        fwd.push(r);
        // The deny list: one lookup in the interval set `denied`.
        let mut r: Vec<Expr> = iif(prefix, CMP_EQ).to_vec();
        r.extend(ipv4());
        r.extend([
            Expr::Payload(BASE_NETWORK, 16, 4),
            Expr::Lookup("denied", false),
            drop(),
        ]);
        fwd.push(r);
        for port in [25u16, 465, 587] {
            let mut r: Vec<Expr> = iif(prefix, CMP_EQ).to_vec();
            r.extend(l4(IPPROTO_TCP));
            r.extend(dport(port));
            r.push(drop());
            fwd.push(r);
        }
        // Per link: a new connection beyond `max_conns` tracked ones is dropped (before
        // conntrack confirms it, so a flood cannot fill the host's table), and bytes
        // beyond `rate_bytes` a second are dropped each way. Keyed by the link, not the
        // address, so a forged source address does not escape its sandbox's budget.
        let mut r: Vec<Expr> = iif(prefix, CMP_EQ).to_vec();
        r.extend([
            Expr::Ct(CT_STATE),
            Expr::Bitwise(4, CT_NEW.to_ne_bytes().to_vec()),
            Expr::Cmp(CMP_NEQ, vec![0; 4]),
            Expr::Meta(META_IIFNAME),
            Expr::Dynset("conns", Box::new(Expr::Connlimit(limits.max_conns))),
            drop(),
        ]);
        fwd.push(r);
        let mut r: Vec<Expr> = iif(prefix, CMP_EQ).to_vec();
        r.extend([
            Expr::Meta(META_IIFNAME),
            Expr::Dynset("up", Box::new(Expr::LimitBytes(limits.rate_bytes))),
            drop(),
        ]);
        fwd.push(r);
        // Allowlisted links: never a blocked range; DNS to the resolvers; otherwise
        // only their allowed ranges (their web traffic to other addresses never gets
        // here: prerouting sent it to the gate).
        let mut r = allowlisted(prefix);
        r.extend(link_addr_in(16, "blocked", false));
        r.push(drop());
        fwd.push(r);
        for &ns in &gate.resolvers {
            for proto in [IPPROTO_UDP, IPPROTO_TCP] {
                let mut r = allowlisted(prefix);
                r.extend(ipv4());
                r.extend([
                    Expr::Payload(BASE_NETWORK, 16, 4),
                    Expr::Cmp(CMP_EQ, ns.octets().to_vec()),
                ]);
                r.extend(l4(proto));
                r.extend(dport(53));
                r.push(accept());
                fwd.push(r);
            }
        }
        let mut r = allowlisted(prefix);
        r.extend(link_addr_in(16, "allowed", true));
        r.push(drop());
        fwd.push(r);
        let mut r: Vec<Expr> = oif(prefix, CMP_EQ).to_vec();
        r.extend([
            Expr::Meta(META_OIFNAME),
            Expr::Dynset("down", Box::new(Expr::LimitBytes(limits.rate_bytes))),
            drop(),
        ]);
        fwd.push(r);
        let mut r: Vec<Expr> = oif(prefix, CMP_EQ).to_vec();
        r.extend([
            Expr::Ct(CT_STATE),
            Expr::Bitwise(4, CT_ESTABLISHED_RELATED.to_ne_bytes().to_vec()),
            Expr::Cmp(CMP_NEQ, vec![0; 4]),
            accept(),
        ]);
        fwd.push(r);
        let mut r: Vec<Expr> = oif(prefix, CMP_EQ).to_vec();
        r.push(drop());
        fwd.push(r);

        // Into the host from a sandbox link: only from the link's own address, and
        // then only replies to connections the host opened (the public-URL proxy's)
        // and an allowlisted link's connections that prerouting redirected to the gate.
        let mut spoofed: Vec<Expr> = iif(prefix, CMP_EQ).to_vec();
        spoofed.extend(link_addr_in(12, "links", true));
        spoofed.push(drop());
        let mut replies: Vec<Expr> = iif(prefix, CMP_EQ).to_vec();
        // From the pool only: a forged outside source is no reply of ours.
        replies.extend(ipv4());
        replies.extend(addr_in(12, pool));
        replies.extend([
            Expr::Ct(CT_DIRECTION),
            Expr::Cmp(CMP_EQ, vec![DIR_REPLY]),
            accept(),
        ]);
        // What an allowlisted link sends the gate counts against its upload budget, as
        // forwarded traffic does.
        let mut gate_meter = allowlisted(prefix);
        gate_meter.extend([
            Expr::Meta(META_IIFNAME),
            Expr::Dynset("up", Box::new(Expr::LimitBytes(limits.rate_bytes))),
            drop(),
        ]);
        let mut to_gate = allowlisted(prefix);
        to_gate.extend(ipv4());
        to_gate.extend(l4(IPPROTO_TCP));
        to_gate.extend(dport(gate.port));
        to_gate.extend([
            Expr::Ct(CT_STATUS),
            Expr::Bitwise(4, CT_STATUS_DNAT.to_ne_bytes().to_vec()),
            Expr::Cmp(CMP_NEQ, vec![0; 4]),
            accept(),
        ]);
        let mut input: Vec<Expr> = iif(prefix, CMP_EQ).to_vec();
        input.push(drop());
        // The gate's port is for redirected sandbox traffic only: nothing from any
        // other interface reaches it.
        let mut gate_only: Vec<Expr> = iif(prefix, CMP_NEQ).to_vec();
        gate_only.extend(l4(IPPROTO_TCP));
        gate_only.extend(dport(gate.port));
        gate_only.push(drop());

        // An allowlisted link's TCP to ports 80 and 443 of an address it does not list
        // goes to the gate, whatever address it was meant for.
        let mut pre: Vec<Vec<Expr>> = Vec::new();
        for port in [80u16, 443] {
            let mut r = allowlisted(prefix);
            r.extend(ipv4());
            r.extend(l4(IPPROTO_TCP));
            r.extend(dport(port));
            r.extend(link_addr_in(16, "allowed", true));
            r.extend([Expr::Imm(gate.port.to_be_bytes().to_vec()), Expr::Redir]);
            pre.push(r);
        }

        let mut masq: Vec<Expr> = ipv4().to_vec();
        masq.extend(addr_in(12, pool));
        masq.extend(oif(prefix, CMP_NEQ));
        masq.push(Expr::Masq);

        let _ = NFPROTO_IPV6;
        Ruleset {
            table: table.to_string(),
            sets: SETS.to_vec(),
            set_size: limits.links,
            drop_others,
            denied: denied_elements(deny),
            chains: vec![
                Chain {
                    name: "forward",
                    kind: "filter",
                    hook: HOOK_FORWARD,
                    priority: 0,
                    rules: fwd,
                },
                Chain {
                    name: "input",
                    kind: "filter",
                    hook: HOOK_INPUT,
                    priority: 0,
                    rules: vec![spoofed, replies, gate_meter, to_gate, input, gate_only],
                },
                Chain {
                    name: "prerouting",
                    kind: "nat",
                    hook: HOOK_PREROUTING,
                    priority: -100,
                    rules: pre,
                },
                Chain {
                    name: "postrouting",
                    kind: "nat",
                    hook: HOOK_POSTROUTING,
                    priority: 100,
                    rules: vec![masq],
                },
            ],
        }
    }

    /// A set's size: one element per link, or `MAX_RANGES` per link for the ranges.
    fn size_of(&self, s: &SetDef) -> u32 {
        if s.name == "denied" {
            self.denied.len().max(1) as u32
        } else if s.flags & SET_F_INTERVAL != 0 {
            self.set_size.saturating_mul(MAX_RANGES)
        } else {
            self.set_size
        }
    }

    /// Whether forwarded traffic of others is dropped.
    pub fn drops_others(&self) -> bool {
        self.drop_others
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// How many rules the table holds.
    pub fn rule_count(&self) -> usize {
        self.chains.iter().map(|c| c.rules.len()).sum()
    }
}

/// An nftables netlink connection in the calling thread's network namespace.
#[derive(Debug)]
pub struct Nft {
    conn: Conn,
}

fn nfgen(family: u8, res_id: u16) -> [u8; 4] {
    let r = res_id.to_be_bytes();
    [family, 0, r[0], r[1]]
}

/// One `NEWSETELEM`/`DELSETELEM` message for `e` (`by_id`: the set is created in the
/// same batch, which finds it only by its id).
fn element_msg(table: &str, e: &Element, add: bool, seq: u32, by_id: bool) -> Vec<u8> {
    let (ty, flags) = if add {
        (MSG_NEWSETELEM, nl::F_CREATE)
    } else {
        (MSG_DELSETELEM, 0)
    };
    let mut m = Msg::new(SUBSYS | ty, nl::F_REQUEST | nl::F_ACK | flags, seq);
    m.header(&nfgen(NFPROTO_INET, 0));
    m.attr_str(ELEMS_TABLE, table).attr_str(ELEMS_SET, e.set);
    if by_id {
        m.attr_be32(ELEMS_SET_ID, set_id(e.set));
    }
    m.begin(ELEMS_LIST).begin(LIST_ELEM);
    m.begin(ELEM_KEY).attr(DATA_VALUE, &e.key).end();
    if let Some(end) = &e.key_end {
        m.begin(ELEM_KEY_END).attr(DATA_VALUE, end).end();
    }
    if e.flags != 0 {
        m.attr_be32(ELEM_FLAGS, e.flags);
    }
    m.end().end();
    m.finish()
}

impl Nft {
    /// Opens a connection.
    ///
    /// # Errors
    /// Socket failures.
    pub fn open() -> io::Result<Nft> {
        Ok(Nft {
            conn: Conn::new(NlSocket::open(NETLINK_NETFILTER, Duration::from_secs(5))?),
        })
    }

    fn batch(
        &mut self,
        body: impl FnOnce(&mut Vec<u8>, &mut Vec<u32>, &mut Conn),
    ) -> io::Result<()> {
        let mut bytes = Vec::new();
        let mut seqs = Vec::new();
        let s = self.conn.next_seq();
        let mut m = Msg::new(BATCH_BEGIN, nl::F_REQUEST, s);
        m.header(&nfgen(0, 10));
        bytes.extend(m.finish());
        body(&mut bytes, &mut seqs, &mut self.conn);
        let s = self.conn.next_seq();
        let mut m = Msg::new(BATCH_END, nl::F_REQUEST, s);
        m.header(&nfgen(0, 10));
        bytes.extend(m.finish());
        self.conn.transact(&bytes, &seqs)
    }

    /// Replaces the table with `rs` in one transaction: add (no-op if present), delete,
    /// add again with its sets, chains, rules and the live leases' `elems`. Nothing else
    /// on the host is touched.
    ///
    /// # Errors
    /// The kernel's error (the transaction is then rolled back whole).
    pub fn apply(&mut self, rs: &Ruleset, elems: &[Element]) -> io::Result<()> {
        self.batch(|bytes, seqs, conn| {
            let mut msg = |ty: u16, flags: u16| {
                let s = conn.next_seq();
                seqs.push(s);
                let mut m = Msg::new(SUBSYS | ty, nl::F_REQUEST | nl::F_ACK | flags, s);
                m.header(&nfgen(NFPROTO_INET, 0));
                m
            };
            for (ty, flags) in [
                (MSG_NEWTABLE, nl::F_CREATE),
                (MSG_DELTABLE, 0),
                (MSG_NEWTABLE, nl::F_CREATE),
            ] {
                let mut m = msg(ty, flags);
                m.attr_str(TABLE_NAME, &rs.table);
                bytes.extend(m.finish());
            }
            for set in &rs.sets {
                let mut m = msg(MSG_NEWSET, nl::F_CREATE);
                m.attr_str(SET_TABLE, &rs.table)
                    .attr_str(SET_NAME, set.name)
                    .attr_be32(SET_ID, set_id(set.name))
                    .attr_be32(SET_FLAGS, set.flags)
                    .attr_be32(SET_KEY_TYPE, set.key_type)
                    .attr_be32(SET_KEY_LEN, set.key_len)
                    .begin(SET_DESC)
                    .attr_be32(SET_DESC_SIZE, rs.size_of(set));
                if !set.fields.is_empty() {
                    m.begin(SET_DESC_CONCAT);
                    for len in set.fields {
                        m.begin(LIST_ELEM).attr_be32(SET_FIELD_LEN, *len).end();
                    }
                    m.end();
                }
                m.end();
                bytes.extend(m.finish());
            }
            for c in &rs.chains {
                let mut m = msg(MSG_NEWCHAIN, nl::F_CREATE);
                m.attr_str(CHAIN_TABLE, &rs.table)
                    .attr_str(CHAIN_NAME, c.name)
                    .begin(CHAIN_HOOK)
                    .attr_be32(HOOK_NUM, c.hook)
                    .attr_be32(HOOK_PRIORITY, c.priority as u32)
                    .end()
                    .attr_be32(CHAIN_POLICY, NF_ACCEPT)
                    .attr_str(CHAIN_TYPE, c.kind);
                bytes.extend(m.finish());
            }
            for c in &rs.chains {
                for rule in &c.rules {
                    let mut m = msg(MSG_NEWRULE, nl::F_CREATE | 0x800 /* APPEND */);
                    m.attr_str(RULE_TABLE, &rs.table)
                        .attr_str(RULE_CHAIN, c.name)
                        .begin(RULE_EXPRESSIONS);
                    for e in rule {
                        e.encode(&mut m);
                    }
                    m.end();
                    bytes.extend(m.finish());
                }
            }
            for e in rs.denied.iter().chain(elems) {
                let s = conn.next_seq();
                seqs.push(s);
                bytes.extend(element_msg(&rs.table, e, true, s, true));
            }
        })
    }

    /// Adds (or with `add` false, deletes) `elems` in table `table`, in one transaction.
    /// Deleting an element that is not there is not an error.
    ///
    /// # Errors
    /// The kernel's error (nothing is changed then).
    pub fn elements(&mut self, table: &str, elems: &[Element], add: bool) -> io::Result<()> {
        if elems.is_empty() {
            return Ok(());
        }
        let r = self.batch(|bytes, seqs, conn| {
            for e in elems {
                let s = conn.next_seq();
                seqs.push(s);
                bytes.extend(element_msg(table, e, add, s, false));
            }
        });
        match r {
            Err(e) if !add && e.raw_os_error() == Some(libc::ENOENT) => {
                // One missing element fails the whole batch: delete them one by one.
                for el in elems {
                    let r = self.batch(|bytes, seqs, conn| {
                        let s = conn.next_seq();
                        seqs.push(s);
                        bytes.extend(element_msg(table, el, false, s, false));
                    });
                    match r {
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                        r => r?,
                    }
                }
                Ok(())
            }
            r => r,
        }
    }

    /// Deletes the table `name` of family inet; a missing table is fine.
    ///
    /// # Errors
    /// Other kernel errors.
    pub fn delete_table(&mut self, name: &str) -> io::Result<()> {
        let r = self.batch(|bytes, seqs, conn| {
            let s = conn.next_seq();
            seqs.push(s);
            let mut m = Msg::new(SUBSYS | MSG_DELTABLE, nl::F_REQUEST | nl::F_ACK, s);
            m.header(&nfgen(NFPROTO_INET, 0)).attr_str(TABLE_NAME, name);
            bytes.extend(m.finish());
        });
        match r {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r,
        }
    }

    /// The elements of set `set` in table `table`: each key with its flags, sorted.
    fn set_elements(&mut self, table: &str, set: &str) -> io::Result<Vec<(Vec<u8>, u32)>> {
        let s = self.conn.next_seq();
        let mut m = Msg::new(SUBSYS | MSG_GETSETELEM, nl::F_REQUEST | nl::F_DUMP, s);
        m.header(&nfgen(NFPROTO_INET, 0));
        m.attr_str(ELEMS_TABLE, table).attr_str(ELEMS_SET, set);
        let mut out = Vec::new();
        for (_, p) in self.conn.dump(m, s)? {
            let a = nl::attrs(&p, 4);
            let list = nl::find(&a, ELEMS_LIST).unwrap_or_default();
            for (_, el) in nl::attrs(&list, 0) {
                let ea = nl::attrs(el, 0);
                let key = nl::find(&ea, ELEM_KEY)
                    .and_then(|k| nl::find(&nl::attrs(&k, 0), DATA_VALUE))
                    .unwrap_or_default();
                let flags = nl::find(&ea, ELEM_FLAGS)
                    .and_then(|d| {
                        d.get(..4)
                            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
                    })
                    .unwrap_or(0);
                out.push((key, flags));
            }
        }
        out.sort();
        Ok(out)
    }

    fn dump(&mut self, ty: u16) -> io::Result<Vec<Vec<u8>>> {
        let s = self.conn.next_seq();
        let mut m = Msg::new(SUBSYS | ty, nl::F_REQUEST | nl::F_DUMP, s);
        m.header(&nfgen(NFPROTO_INET, 0));
        Ok(self.conn.dump(m, s)?.into_iter().map(|(_, p)| p).collect())
    }

    /// Reads the table back and says how it differs from `rs`; `Ok(None)` when it is
    /// exactly `rs` (same chains with the same hooks, priorities, types and policies;
    /// the same rules in the same order; nothing more).
    ///
    /// # Errors
    /// Netlink failures.
    pub fn verify(&mut self, rs: &Ruleset) -> io::Result<Option<String>> {
        let mut found = None;
        for p in self.dump(MSG_GETTABLE)? {
            let a = nl::attrs(&p, 4);
            if nl::find(&a, TABLE_NAME).map(|d| nl::text(&d)).as_deref() == Some(&rs.table) {
                found = Some(nl::find(&a, TABLE_FLAGS).map_or(0, |d| {
                    d.get(..4)
                        .map_or(0, |b| u32::from_be_bytes(b.try_into().unwrap_or_default()))
                }));
            }
        }
        match found {
            None => return Ok(Some(format!("table inet {} is missing", rs.table))),
            // Dormant (flag 1) keeps the rules in the dump but filters nothing.
            Some(f) if f & 1 != 0 => {
                return Ok(Some(format!(
                    "table inet {} is dormant (flags {f:#x})",
                    rs.table
                )))
            }
            Some(_) => {}
        }
        let mut chains: BTreeMap<String, String> = BTreeMap::new();
        for p in self.dump(MSG_GETCHAIN)? {
            let a = nl::attrs(&p, 4);
            if nl::find(&a, CHAIN_TABLE).map(|d| nl::text(&d)).as_deref() != Some(&rs.table) {
                continue;
            }
            let name = nl::find(&a, CHAIN_NAME)
                .map(|d| nl::text(&d))
                .unwrap_or_default();
            chains.insert(name, chain_signature(&a));
        }
        let want: BTreeMap<String, String> = rs
            .chains
            .iter()
            .map(|c| (c.name.to_string(), expected_signature(c)))
            .collect();
        if chains != want {
            return Ok(Some(format!(
                "chains differ: kernel has {chains:?}, expected {want:?}"
            )));
        }
        let mut sets: BTreeMap<String, String> = BTreeMap::new();
        for p in self.dump(MSG_GETSET)? {
            let a = nl::attrs(&p, 4);
            if nl::find(&a, SET_TABLE).map(|d| nl::text(&d)).as_deref() != Some(&rs.table) {
                continue;
            }
            let name = nl::find(&a, SET_NAME)
                .map(|d| nl::text(&d))
                .unwrap_or_default();
            sets.insert(name, set_signature(&a));
        }
        let want: BTreeMap<String, String> = rs
            .sets
            .iter()
            .map(|set| {
                (
                    set.name.to_string(),
                    format!(
                        "flags={:#x} type={} keylen={} size={}",
                        set.flags,
                        set.key_type,
                        set.key_len,
                        rs.size_of(set)
                    ),
                )
            })
            .collect();
        if sets != want {
            return Ok(Some(format!(
                "sets differ: kernel has {sets:?}, expected {want:?}"
            )));
        }
        let got = self.set_elements(&rs.table, "denied")?;
        let mut want: Vec<(Vec<u8>, u32)> =
            rs.denied.iter().map(|e| (e.key.clone(), e.flags)).collect();
        want.sort();
        if got != want {
            return Ok(Some(format!(
                "set denied holds {} elements, expected {} (the deny list was changed)",
                got.len(),
                want.len()
            )));
        }
        let mut rules: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for p in self.dump(MSG_GETRULE)? {
            let a = nl::attrs(&p, 4);
            if nl::find(&a, RULE_TABLE).map(|d| nl::text(&d)).as_deref() != Some(&rs.table) {
                continue;
            }
            let chain = nl::find(&a, RULE_CHAIN)
                .map(|d| nl::text(&d))
                .unwrap_or_default();
            let exprs = nl::find(&a, RULE_EXPRESSIONS).unwrap_or_default();
            rules.entry(chain).or_default().push(normalise_rule(&exprs));
        }
        for c in &rs.chains {
            let got = rules.remove(c.name).unwrap_or_default();
            let want: Vec<String> = c
                .rules
                .iter()
                .map(|r| normalise_rule(&encode_rule(r)))
                .collect();
            if got != want {
                let at = got.iter().zip(&want).position(|(g, w)| g != w);
                return Ok(Some(format!(
                    "chain {} has {} rules, expected {}{}",
                    c.name,
                    got.len(),
                    want.len(),
                    at.map(|i| format!("; rule {i} is `{}`, expected `{}`", got[i], want[i]))
                        .unwrap_or_default()
                )));
            }
        }
        if let Some((chain, _)) = rules.into_iter().next() {
            return Ok(Some(format!("unexpected rules in chain {chain}")));
        }
        Ok(None)
    }
}

fn expected_signature(c: &Chain) -> String {
    format!(
        "hook={} prio={} type={} policy={}",
        c.hook, c.priority, c.kind, NF_ACCEPT
    )
}

fn chain_signature(a: &[(u16, &[u8])]) -> String {
    let be = |d: &[u8]| {
        d.get(..4)
            .map_or(0, |b| u32::from_be_bytes(b.try_into().unwrap_or_default()))
    };
    let hook = nl::find(a, CHAIN_HOOK).unwrap_or_default();
    let h = nl::attrs(&hook, 0);
    format!(
        "hook={} prio={} type={} policy={}",
        nl::find(&h, HOOK_NUM).map_or(u32::MAX, |d| be(&d)),
        nl::find(&h, HOOK_PRIORITY).map_or(i32::MIN, |d| be(&d) as i32),
        nl::find(a, CHAIN_TYPE)
            .map(|d| nl::text(&d))
            .unwrap_or_default(),
        nl::find(a, CHAIN_POLICY).map_or(u32::MAX, |d| be(&d)),
    )
}

fn set_signature(a: &[(u16, &[u8])]) -> String {
    let be = |ty: u16| {
        nl::find(a, ty).map_or(u32::MAX, |d| {
            d.get(..4).map_or(u32::MAX, |b| {
                u32::from_be_bytes(b.try_into().unwrap_or_default())
            })
        })
    };
    let desc = nl::find(a, SET_DESC).unwrap_or_default();
    let size = nl::find(&nl::attrs(&desc, 0), SET_DESC_SIZE).map_or(u32::MAX, |d| {
        d.get(..4).map_or(u32::MAX, |b| {
            u32::from_be_bytes(b.try_into().unwrap_or_default())
        })
    });
    // A set without flags is dumped without the attribute.
    let flags = if nl::find(a, SET_FLAGS).is_some() {
        be(SET_FLAGS)
    } else {
        0
    };
    format!(
        "flags={flags:#x} type={} keylen={} size={size}",
        be(SET_KEY_TYPE),
        be(SET_KEY_LEN)
    )
}

fn encode_rule(rule: &[Expr]) -> Vec<u8> {
    let mut m = Msg::new(0, 0, 0);
    for e in rule {
        e.encode(&mut m);
    }
    m.finish()[16..].to_vec()
}

/// Which attributes of an expression are nests (data values or verdicts).
fn is_nest(expr: &str, ty: u16) -> bool {
    matches!(
        (expr, ty),
        ("cmp", 3) | ("bitwise", 4 | 5 | 7) | ("immediate", 2) | ("data", DATA_VERDICT)
    )
}

fn normalise_attrs(expr: &str, data: &[u8]) -> String {
    let mut parts: Vec<String> = nl::attrs(data, 0)
        .into_iter()
        .filter(|(ty, d)| match (expr, *ty) {
            // A set id only links a rule to a set in the same batch; the kernel's dump
            // names the set instead. It also dumps a zero timeout and zero flags.
            ("dynset", DYNSET_SET_ID) | ("lookup", LOOKUP_SET_ID) => false,
            ("lookup", LOOKUP_FLAGS) => d.iter().any(|b| *b != 0),
            ("dynset", 6 | 9) => d.iter().any(|b| *b != 0),
            // Alignment padding before 64-bit values (NFTA_DYNSET_PAD, NFTA_LIMIT_PAD),
            // which kernels add on CPUs without efficient unaligned access.
            ("dynset", 8) | ("limit", 6) => false,
            _ => true,
        })
        .map(|(ty, d)| {
            if (expr, ty) == ("dynset", DYNSET_EXPR) {
                let a = nl::attrs(d, 0);
                let name = nl::find(&a, EXPR_NAME)
                    .map(|d| nl::text(&d))
                    .unwrap_or_default();
                let data = nl::find(&a, EXPR_DATA).unwrap_or_default();
                format!("{ty}{{{name}({})}}", normalise_attrs(&name, &data))
            } else if is_nest(expr, ty) {
                let inner = if expr == "data" { "verdict" } else { "data" };
                format!("{ty}{{{}}}", normalise_attrs(inner, d))
            } else {
                let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
                format!("{ty}={hex}")
            }
        })
        .collect();
    parts.sort();
    parts.join(",")
}

/// A rule's expressions as text that is the same for our encoding and the kernel's dump.
fn normalise_rule(exprs: &[u8]) -> String {
    nl::attrs(exprs, 0)
        .into_iter()
        .filter(|(ty, _)| *ty == LIST_ELEM)
        .map(|(_, e)| {
            let a = nl::attrs(e, 0);
            let name = nl::find(&a, EXPR_NAME)
                .map(|d| nl::text(&d))
                .unwrap_or_default();
            let data = nl::find(&a, EXPR_DATA).unwrap_or_default();
            format!("{name}({})", normalise_attrs(&name, &data))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rs() -> Ruleset {
        let pool: Cidr = "10.200.0.0/16".parse().unwrap();
        Ruleset::egress(
            "isobox_t",
            "ibabcde",
            pool,
            &[pool, "10.0.0.0/8".parse().unwrap()],
            Limits {
                max_conns: 16,
                rate_bytes: 1 << 20,
                links: 16384,
            },
            &Gate {
                port: 4321,
                resolvers: vec!["198.51.100.53".parse().unwrap()],
            },
            false,
        )
    }

    #[test]
    fn normalising_our_own_encoding_is_stable_and_readable() {
        let r = rs();
        assert_eq!(r.rule_count(), 15 + 6 + 2 + 1);
        let fwd = &r.chains[0].rules;
        let text = normalise_rule(&encode_rule(&fwd[2]));
        // iifname "ibabcde*" meta nfproto ipv4 ip daddr @denied drop
        assert_eq!(
            text,
            "meta(1=00000001,2=00000006) cmp(1=00000001,2=00000000,3{1=69626162636465}) \
             meta(1=00000001,2=0000000f) cmp(1=00000001,2=00000000,3{1=02}) \
             payload(1=00000001,2=00000001,3=00000010,4=00000004) \
             lookup(1=64656e69656400,2=00000001) immediate(1=00000000,2{2{1=00000000}})"
        );
    }

    #[test]
    fn the_deny_list_becomes_merged_ranges() {
        let c = |s: &str| s.parse::<Cidr>().unwrap();
        let el = denied_elements(&[
            c("10.200.0.0/16"),
            c("10.0.0.0/8"),
            c("0.0.0.0/8"),
            c("11.0.0.0/8"),
            c("240.0.0.0/4"),
            c("192.168.0.0/16"),
        ]);
        let shown: Vec<String> = el
            .iter()
            .map(|e| {
                let ip = std::net::Ipv4Addr::new(e.key[0], e.key[1], e.key[2], e.key[3]);
                format!(
                    "{ip}{}",
                    if e.flags == ELEM_INTERVAL_END {
                        ")"
                    } else {
                        "["
                    }
                )
            })
            .collect();
        // 0/8, then 10/8 + its pool + the touching 11/8 as one, 192.168/16, and 240/4
        // to the end of the space (no end element).
        assert_eq!(
            shown,
            [
                "0.0.0.0[",
                "1.0.0.0)",
                "10.0.0.0[",
                "12.0.0.0)",
                "192.168.0.0[",
                "192.169.0.0)",
                "240.0.0.0["
            ]
        );
    }

    #[test]
    fn attribute_order_does_not_matter_but_values_do() {
        let mut a = Msg::new(0, 0, 0);
        a.begin(LIST_ELEM)
            .attr_str(EXPR_NAME, "meta")
            .begin(EXPR_DATA)
            .attr_be32(1, 1)
            .attr_be32(2, 6)
            .end()
            .end();
        let a = a.finish()[16..].to_vec();
        let b = encode_rule(&[Expr::Meta(META_IIFNAME)]);
        assert_eq!(normalise_rule(&a), normalise_rule(&b));
        let c = encode_rule(&[Expr::Meta(META_OIFNAME)]);
        assert_ne!(normalise_rule(&a), normalise_rule(&c));
    }
}
