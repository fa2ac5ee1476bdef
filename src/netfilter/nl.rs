//! Netlink message encoding and decoding: headers, attributes, nests, acks and dumps.
//!
//! Pure byte work; the socket is `sys::netlink::NlSocket`.

use crate::sys::netlink::NlSocket;
use std::io;

/// `NLM_F_REQUEST`.
pub const F_REQUEST: u16 = 0x1;
/// `NLM_F_MULTI`.
pub const F_MULTI: u16 = 0x2;
/// `NLM_F_ACK`.
pub const F_ACK: u16 = 0x4;
/// `NLM_F_DUMP` (`ROOT | MATCH`).
pub const F_DUMP: u16 = 0x300;
/// `NLM_F_EXCL`.
pub const F_EXCL: u16 = 0x200;
/// `NLM_F_CREATE`.
pub const F_CREATE: u16 = 0x400;
/// `NLMSG_ERROR`.
pub const MSG_ERROR: u16 = 2;
/// `NLMSG_DONE`.
pub const MSG_DONE: u16 = 3;
/// `NLA_F_NESTED`.
pub const NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;
const HDR: usize = 16;

fn align(n: usize) -> usize {
    (n + 3) & !3
}

/// One netlink message under construction.
#[derive(Debug)]
pub struct Msg {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Msg {
    /// A message of `ty` with `flags` and sequence number `seq`.
    pub fn new(ty: u16, flags: u16, seq: u32) -> Msg {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes());
        Msg {
            buf,
            nests: Vec::new(),
        }
    }

    /// Appends a fixed family header (e.g. `ifinfomsg`), padded to 4 bytes.
    pub fn header(&mut self, bytes: &[u8]) -> &mut Msg {
        self.buf.extend_from_slice(bytes);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    /// Appends an attribute.
    pub fn attr(&mut self, ty: u16, data: &[u8]) -> &mut Msg {
        let len = 4 + data.len();
        self.buf
            .extend_from_slice(&u16::try_from(len).unwrap_or(u16::MAX).to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(align(self.buf.len()), 0);
        self
    }

    /// A NUL-terminated string attribute.
    pub fn attr_str(&mut self, ty: u16, s: &str) -> &mut Msg {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(ty, &v)
    }

    /// A big-endian u32 attribute (nftables' convention).
    pub fn attr_be32(&mut self, ty: u16, v: u32) -> &mut Msg {
        self.attr(ty, &v.to_be_bytes())
    }

    /// A native-endian u32 attribute (rtnetlink's convention).
    pub fn attr_u32(&mut self, ty: u16, v: u32) -> &mut Msg {
        self.attr(ty, &v.to_ne_bytes())
    }

    /// Opens a nested attribute; close it with [`Msg::end`].
    pub fn begin(&mut self, ty: u16) -> &mut Msg {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(ty | NESTED).to_ne_bytes());
        self
    }

    /// Opens a nested attribute without `NLA_F_NESTED` (for `VETH_INFO_PEER`, which
    /// carries a header before its attributes).
    pub fn begin_raw(&mut self, ty: u16) -> &mut Msg {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self
    }

    /// Closes the innermost nested attribute.
    pub fn end(&mut self) -> &mut Msg {
        if let Some(start) = self.nests.pop() {
            let len = u16::try_from(self.buf.len() - start).unwrap_or(u16::MAX);
            self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        }
        self
    }

    /// The finished message bytes.
    pub fn finish(mut self) -> Vec<u8> {
        let len = u32::try_from(self.buf.len()).unwrap_or(u32::MAX);
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf
    }
}

/// One received message.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    /// `nlmsg_type`.
    pub ty: u16,
    /// `nlmsg_flags`.
    pub flags: u16,
    /// `nlmsg_seq`.
    pub seq: u32,
    /// Everything after the netlink header.
    pub payload: &'a [u8],
}

/// Splits a datagram into messages; stops at the first malformed one.
pub fn messages(buf: &[u8]) -> Vec<Received<'_>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off + HDR <= buf.len() {
        let len = u32::from_ne_bytes(buf[off..off + 4].try_into().unwrap_or_default()) as usize;
        if len < HDR || off + len > buf.len() {
            break;
        }
        out.push(Received {
            ty: u16::from_ne_bytes([buf[off + 4], buf[off + 5]]),
            flags: u16::from_ne_bytes([buf[off + 6], buf[off + 7]]),
            seq: u32::from_ne_bytes(buf[off + 8..off + 12].try_into().unwrap_or_default()),
            payload: &buf[off + HDR..off + len],
        });
        off += align(len);
    }
    out
}

/// Attributes of a payload (after its fixed header of `skip` bytes), as
/// `(type without flags, data)`.
pub fn attrs(payload: &[u8], skip: usize) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = align(skip);
    while off + 4 <= payload.len() {
        let len = u16::from_ne_bytes([payload[off], payload[off + 1]]) as usize;
        let ty = u16::from_ne_bytes([payload[off + 2], payload[off + 3]]) & NLA_TYPE_MASK;
        if len < 4 || off + len > payload.len() {
            break;
        }
        out.push((ty, &payload[off + 4..off + len]));
        off += align(len);
    }
    out
}

/// The first attribute of type `ty`.
pub fn find(attrs: &[(u16, &[u8])], ty: u16) -> Option<Vec<u8>> {
    attrs
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, d)| d.to_vec())
}

/// A string attribute's text without its NUL.
pub fn text(data: &[u8]) -> String {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

/// The error carried by an `NLMSG_ERROR` payload: `Ok(())` for an ack.
pub fn ack_result(payload: &[u8]) -> io::Result<()> {
    let code = payload.get(0..4).map_or(-libc::EIO, |b| {
        i32::from_ne_bytes(b.try_into().unwrap_or_default())
    });
    if code == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(-code))
    }
}

/// A netlink conversation: a socket and a sequence counter.
#[derive(Debug)]
pub struct Conn {
    sock: NlSocket,
    seq: u32,
    buf: Vec<u8>,
}

impl Conn {
    /// Wraps an open socket.
    pub fn new(sock: NlSocket) -> Conn {
        Conn {
            sock,
            seq: 1,
            buf: vec![0u8; 1 << 16],
        }
    }

    /// The next sequence number.
    pub fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `bytes` (one or more messages, each with `NLM_F_ACK`) and waits for the
    /// acks of the sequence numbers in `seqs`. The first error wins.
    ///
    /// # Errors
    /// The kernel's error for a message, or an I/O error.
    pub fn transact(&mut self, bytes: &[u8], seqs: &[u32]) -> io::Result<()> {
        self.sock.send(bytes)?;
        let mut pending: Vec<u32> = seqs.to_vec();
        while !pending.is_empty() {
            let n = self.sock.recv(&mut self.buf)?;
            for m in messages(&self.buf[..n]) {
                if m.ty == MSG_ERROR {
                    // An error under any sequence number of ours fails the whole
                    // exchange (nftables reports a refused batch under the batch
                    // header's number, which is not acked on success).
                    ack_result(m.payload)?;
                    if let Some(i) = pending.iter().position(|&s| s == m.seq) {
                        pending.swap_remove(i);
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends one request and acks it.
    ///
    /// # Errors
    /// See [`Conn::transact`].
    pub fn request(&mut self, msg: Msg, seq: u32) -> io::Result<()> {
        self.transact(&msg.finish(), &[seq])
    }

    /// Runs a dump request and returns each reply message's `(type, payload)`.
    ///
    /// # Errors
    /// The kernel's error, or an I/O error.
    pub fn dump(&mut self, msg: Msg, seq: u32) -> io::Result<Vec<(u16, Vec<u8>)>> {
        let mut out = Vec::new();
        self.dump_each(msg, seq, |ty, p| out.push((ty, p.to_vec())))?;
        Ok(out)
    }

    /// [`Conn::dump`], handing each reply's `(type, payload)` to `f` as it arrives
    /// instead of keeping them all.
    ///
    /// # Errors
    /// The kernel's error, or an I/O error.
    pub fn dump_each(
        &mut self,
        msg: Msg,
        seq: u32,
        mut f: impl FnMut(u16, &[u8]),
    ) -> io::Result<()> {
        self.sock.send(&msg.finish())?;
        let mut interrupted = false;
        loop {
            let n = self.sock.recv(&mut self.buf)?;
            for m in messages(&self.buf[..n]) {
                if m.seq != seq {
                    continue;
                }
                // NLM_F_DUMP_INTR: the set changed during the dump, which may then
                // miss or repeat entries; the caller should ask again.
                interrupted |= m.flags & 0x10 != 0;
                match m.ty {
                    MSG_DONE if interrupted => {
                        return Err(io::Error::new(
                            io::ErrorKind::Interrupted,
                            "dump interrupted by a concurrent change",
                        ))
                    }
                    MSG_DONE => return Ok(()),
                    MSG_ERROR => {
                        ack_result(m.payload)?;
                        return Ok(());
                    }
                    _ => f(m.ty, m.payload),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_attributes_round_trip() {
        let mut m = Msg::new(16, F_REQUEST, 7);
        m.header(&[1, 2, 3]);
        m.attr_str(3, "eth0");
        m.begin(18)
            .attr_str(1, "veth")
            .begin(2)
            .attr_u32(28, 5)
            .end()
            .end();
        let bytes = m.finish();
        assert_eq!(bytes.len() % 4, 0);
        let msgs = messages(&bytes);
        assert_eq!(msgs.len(), 1);
        assert_eq!((msgs[0].ty, msgs[0].seq), (16, 7));
        let top = attrs(msgs[0].payload, 3);
        assert_eq!(top.len(), 2);
        assert_eq!(text(top[0].1), "eth0");
        let info = attrs(top[1].1, 0);
        assert_eq!(text(&find(&info, 1).unwrap()), "veth");
        let inner = find(&info, 2).unwrap();
        let data = attrs(&inner, 0);
        assert_eq!(find(&data, 28).unwrap(), 5u32.to_ne_bytes());
    }

    #[test]
    fn malformed_input_stops_parsing() {
        assert!(messages(&[0xff; 10]).is_empty());
        let mut bad = Msg::new(1, 0, 1).finish();
        bad[0] = 200; // claims more than there is
        assert!(messages(&bad).is_empty());
        assert!(attrs(&[0xff, 0xff, 0, 0], 0).is_empty());
        assert_eq!(ack_result(&0i32.to_ne_bytes()).ok(), Some(()));
        assert_eq!(
            ack_result(&(-libc::ENOENT).to_ne_bytes())
                .unwrap_err()
                .raw_os_error(),
            Some(libc::ENOENT)
        );
    }
}
