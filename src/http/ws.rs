//! WebSocket (RFC 6455), the server's side, sans-IO: the upgrade handshake, a decoder
//! that takes client frames from a read buffer as they arrive (masked, possibly
//! fragmented, control frames between fragments) and gives whole messages, and the
//! framing of what the server sends. No extensions; a subprotocol only where the
//! endpoint names one ([`offered`], [`handshake_with`]).
//!
//! Every size is bounded: a message over the decoder's cap is refused from its frame
//! header, before its payload is read (close code 1009), and a frame's payload is
//! taken as it arrives, so no frame needs to fit the connection's read-ahead. A
//! broken frame ends the connection with 1002, a text message that is not UTF-8
//! with 1007.

use super::{Head, Response};
use base64::Engine as _;

/// The handshake's constant (RFC 6455 §1.3).
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Longest control frame payload.
const MAX_CONTROL: u64 = 125;

/// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key`.
pub fn accept_key(key: &str) -> String {
    let d = ring::digest::digest(
        &ring::digest::SHA1_FOR_LEGACY_USE_ONLY,
        format!("{key}{GUID}").as_bytes(),
    );
    base64::engine::general_purpose::STANDARD.encode(d.as_ref())
}

/// Why an upgrade request cannot be upgraded: the status (400, or 426 with the
/// headers that say what would work) and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// 400 or 426.
    pub status: u16,
    /// What is wrong.
    pub message: &'static str,
}

impl Refused {
    /// Headers a 426 carries.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        if self.status == 426 {
            vec![
                ("Upgrade", "websocket".into()),
                ("Sec-WebSocket-Version", "13".into()),
            ]
        } else {
            Vec::new()
        }
    }
}

/// Checks a request head for a WebSocket upgrade (RFC 6455 §4.2.1); the
/// `Sec-WebSocket-Accept` to answer with.
///
/// # Errors
/// 426 when it is no GET upgrade to `websocket` or not version 13, 400 when its key is
/// not 16 bytes in base64.
pub fn check_upgrade(head: &Head) -> Result<String, Refused> {
    if head.method != "GET" || head.minor_version < 1 {
        return Err(Refused {
            status: 426,
            message: "A WebSocket opens with an HTTP/1.1 GET",
        });
    }
    let has_token = |name: &str, token: &str| {
        head.header(name)
            .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    };
    if !has_token("connection", "upgrade") || !has_token("upgrade", "websocket") {
        return Err(Refused {
            status: 426,
            message:
                "This endpoint is a WebSocket: send Connection: Upgrade and Upgrade: websocket",
        });
    }
    if head.header("sec-websocket-version").map(str::trim) != Some("13") {
        return Err(Refused {
            status: 426,
            message: "Only WebSocket version 13 is supported",
        });
    }
    let key = head.header("sec-websocket-key").unwrap_or("").trim();
    match base64::engine::general_purpose::STANDARD.decode(key) {
        Ok(k) if k.len() == 16 => Ok(accept_key(key)),
        _ => Err(Refused {
            status: 400,
            message: "Sec-WebSocket-Key must be 16 bytes in base64",
        }),
    }
}

/// The `101 Switching Protocols` head for `accept`.
pub fn handshake(accept: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\n\r\n"
    )
    .into_bytes()
}

/// The `101` head for `accept`, naming the subprotocol chosen (one the client offered).
pub fn handshake_with(accept: &str, protocol: Option<&str>) -> Vec<u8> {
    match protocol {
        None => handshake(accept),
        Some(p) => format!(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Accept: {accept}\r\nSec-WebSocket-Protocol: {p}\r\n\r\n"
        )
        .into_bytes(),
    }
}

/// Whether the client offered subprotocol `name` in `Sec-WebSocket-Protocol` (every
/// such header, comma-separated tokens, RFC 6455 §4.1).
pub fn offered(head: &Head, name: &str) -> bool {
    head.headers
        .iter()
        .filter(|(n, _)| n == "sec-websocket-protocol")
        .any(|(_, v)| {
            String::from_utf8_lossy(v)
                .split(',')
                .any(|t| t.trim() == name)
        })
}

/// A refusal as the face shapes errors, with a 426's headers.
pub fn refusal(r: &Refused, shaped: Response) -> Response {
    r.headers()
        .into_iter()
        .fold(shaped, |resp, (n, v)| resp.with_header(n, v))
}

/// A whole message (or control frame) from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message (UTF-8, checked).
    Text(String),
    /// A binary message.
    Binary(Vec<u8>),
    /// A ping, to be answered with a pong of the same payload.
    Ping(Vec<u8>),
    /// A pong.
    Pong(Vec<u8>),
    /// A close, with its code and reason if it had one.
    Close(Option<(u16, String)>),
}

/// Why the connection must end.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WsError {
    /// A frame that breaks the protocol (1002).
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// A message over the cap (1009).
    #[error("message over {0} bytes")]
    TooBig(usize),
    /// A text message or close reason that is not UTF-8 (1007).
    #[error("text that is not UTF-8")]
    BadUtf8,
}

impl WsError {
    /// The close code to send.
    pub fn close_code(&self) -> u16 {
        match self {
            WsError::Protocol(_) => 1002,
            WsError::TooBig(_) => 1009,
            WsError::BadUtf8 => 1007,
        }
    }
}

/// The frame being read.
#[derive(Debug, Clone)]
struct FrameHead {
    fin: bool,
    opcode: u8,
    mask: [u8; 4],
    /// Payload bytes still to come.
    remaining: u64,
    /// Payload bytes taken so far (the mask's position).
    taken: u64,
}

/// Takes client frames out of a read buffer and gives whole messages.
#[derive(Debug)]
pub struct Decoder {
    max_message: usize,
    cur: Option<FrameHead>,
    /// The data message being assembled: text or not, and its bytes so far.
    msg: Option<(bool, Vec<u8>)>,
    /// The control frame being read.
    ctrl: Vec<u8>,
}

impl Decoder {
    /// A decoder that refuses messages over `max_message` bytes.
    pub fn new(max_message: usize) -> Decoder {
        Decoder {
            max_message,
            cur: None,
            msg: None,
            ctrl: Vec::new(),
        }
    }

    /// A data message has begun and not ended (its fragments so far are held).
    pub fn mid_message(&self) -> bool {
        self.msg.is_some()
    }

    /// The next whole message, taking what it reads from the front of `buf`; `None`
    /// when more bytes are needed.
    ///
    /// # Errors
    /// [`WsError`]: the connection must be closed with its code.
    pub fn next(&mut self, buf: &mut Vec<u8>) -> Result<Option<Message>, WsError> {
        loop {
            if self.cur.is_none() {
                match self.head(buf)? {
                    Some(h) => self.cur = Some(h),
                    None => return Ok(None),
                }
            }
            let Some(cur) = self.cur.as_mut() else {
                return Ok(None);
            };
            let take = usize::try_from(cur.remaining)
                .unwrap_or(usize::MAX)
                .min(buf.len());
            let control = cur.opcode >= 8;
            let into = if control {
                &mut self.ctrl
            } else {
                match self.msg.as_mut() {
                    Some((_, m)) => m,
                    None => return Err(WsError::Protocol("data without a message")),
                }
            };
            into.reserve(take);
            for (i, b) in buf.drain(..take).enumerate() {
                into.push(b ^ cur.mask[((cur.taken + i as u64) % 4) as usize]);
            }
            cur.taken += take as u64;
            cur.remaining -= take as u64;
            if cur.remaining > 0 {
                return Ok(None);
            }
            let (fin, opcode) = (cur.fin, cur.opcode);
            self.cur = None;
            if control {
                let p = std::mem::take(&mut self.ctrl);
                return match opcode {
                    8 => close_payload(&p).map(|c| Some(Message::Close(c))),
                    9 => Ok(Some(Message::Ping(p))),
                    _ => Ok(Some(Message::Pong(p))),
                };
            }
            if fin {
                let Some((text, bytes)) = self.msg.take() else {
                    return Err(WsError::Protocol("data without a message"));
                };
                return if text {
                    String::from_utf8(bytes)
                        .map(|s| Some(Message::Text(s)))
                        .map_err(|_| WsError::BadUtf8)
                } else {
                    Ok(Some(Message::Binary(bytes)))
                };
            }
        }
    }

    /// Parses and takes a frame header, checking it against the state.
    fn head(&mut self, buf: &mut Vec<u8>) -> Result<Option<FrameHead>, WsError> {
        if buf.len() < 2 {
            return Ok(None);
        }
        let (b0, b1) = (buf[0], buf[1]);
        if b0 & 0x70 != 0 {
            return Err(WsError::Protocol(
                "reserved bits set (no extension was agreed)",
            ));
        }
        if b1 & 0x80 == 0 {
            return Err(WsError::Protocol("a client frame must be masked"));
        }
        let (fin, opcode) = (b0 & 0x80 != 0, b0 & 0x0f);
        let (len_bytes, len7) = match b1 & 0x7f {
            126 => (2, None),
            127 => (8, None),
            n => (0, Some(u64::from(n))),
        };
        let need = 2 + len_bytes + 4;
        if buf.len() < need {
            return Ok(None);
        }
        let len = match len7 {
            Some(n) => n,
            None => buf[2..2 + len_bytes]
                .iter()
                .fold(0u64, |a, b| (a << 8) | u64::from(*b)),
        };
        if len >> 63 != 0 {
            return Err(WsError::Protocol("a payload length with its top bit set"));
        }
        match opcode {
            8..=10 => {
                if !fin {
                    return Err(WsError::Protocol("a fragmented control frame"));
                }
                if len > MAX_CONTROL {
                    return Err(WsError::Protocol("a control frame over 125 bytes"));
                }
            }
            0 if self.msg.is_none() => {
                return Err(WsError::Protocol("a continuation frame with no message"))
            }
            1 | 2 if self.msg.is_some() => {
                return Err(WsError::Protocol("a new message before the last one ended"))
            }
            0..=2 => {}
            _ => return Err(WsError::Protocol("an unknown opcode")),
        }
        if opcode <= 2 {
            let have = self.msg.as_ref().map_or(0, |(_, m)| m.len());
            if (have as u64).saturating_add(len) > self.max_message as u64 {
                return Err(WsError::TooBig(self.max_message));
            }
            if opcode != 0 {
                self.msg = Some((opcode == 1, Vec::new()));
            }
        }
        let mut mask = [0u8; 4];
        mask.copy_from_slice(&buf[2 + len_bytes..need]);
        buf.drain(..need);
        Ok(Some(FrameHead {
            fin,
            opcode,
            mask,
            remaining: len,
            taken: 0,
        }))
    }
}

/// A close frame's code and reason (RFC 6455 §5.5.1, §7.4).
fn close_payload(p: &[u8]) -> Result<Option<(u16, String)>, WsError> {
    match p.len() {
        0 => Ok(None),
        1 => Err(WsError::Protocol("a close payload of one byte")),
        _ => {
            let code = u16::from_be_bytes([p[0], p[1]]);
            let valid = matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999);
            if !valid {
                return Err(WsError::Protocol("a close code that may not be sent"));
            }
            let reason = String::from_utf8(p[2..].to_vec()).map_err(|_| WsError::BadUtf8)?;
            Ok(Some((code, reason)))
        }
    }
}

/// Appends a server frame (unmasked, final) with `opcode` and `payload`.
pub fn write_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    out.push(0x80 | (opcode & 0x0f));
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= 0xffff => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

/// Appends a binary message.
pub fn write_binary(out: &mut Vec<u8>, data: &[u8]) {
    write_frame(out, 2, data);
}

/// Appends a text message.
pub fn write_text(out: &mut Vec<u8>, text: &str) {
    write_frame(out, 1, text.as_bytes());
}

/// Appends a close frame with `code` and `reason` (cut to fit a control frame).
pub fn write_close(out: &mut Vec<u8>, code: u16, reason: &str) {
    let mut p = code.to_be_bytes().to_vec();
    let mut end = reason.len().min(MAX_CONTROL as usize - 2);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    p.extend_from_slice(&reason.as_bytes()[..end]);
    write_frame(out, 8, &p);
}

/// Appends a pong for a ping's payload.
pub fn write_pong(out: &mut Vec<u8>, payload: &[u8]) {
    write_frame(out, 10, payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client frame: `fin`, `opcode`, `payload` masked with `mask`.
    fn client(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n if n <= 0xffff => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(0x80 | 127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        f
    }

    const M: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

    #[test]
    fn test_accept_key_is_rfc_6455s_example() {
        // RFC 6455 §1.3.
        assert_eq!(
            accept_key("dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }

    #[test]
    fn test_upgrade_heads_are_checked() {
        let head = |extra: &str| {
            crate::http::parse::parse_head(
                format!("GET /eryx/v1/stream HTTP/1.1\r\nHost: h\r\n{extra}\r\n").as_bytes(),
            )
            .unwrap()
        };
        let good = "Connection: keep-alive, Upgrade\r\nUpgrade: WebSocket\r\n\
                    Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
        assert_eq!(
            check_upgrade(&head(good)).unwrap(),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
        assert_eq!(check_upgrade(&head("")).unwrap_err().status, 426);
        let v8 = good.replace("Version: 13", "Version: 8");
        let r = check_upgrade(&head(&v8)).unwrap_err();
        assert_eq!(r.status, 426);
        assert!(r
            .headers()
            .contains(&("Sec-WebSocket-Version", "13".into())));
        let short = good.replace("dGhlIHNhbXBsZSBub25jZQ==", "c2hvcnQ=");
        assert_eq!(check_upgrade(&head(&short)).unwrap_err().status, 400);
        let none = good.replace("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n", "");
        assert_eq!(check_upgrade(&head(&none)).unwrap_err().status, 400);
        let mut as_head = head(good);
        as_head.method = "HEAD".into();
        assert_eq!(check_upgrade(&as_head).unwrap_err().status, 426);
    }

    #[test]
    fn test_messages_whole_fragmented_and_byte_by_byte() {
        let mut wire = client(true, 1, b"hello", M);
        wire.extend(client(false, 1, b"frag", M));
        wire.extend(client(true, 9, b"p", M));
        wire.extend(client(false, 0, "mé".as_bytes(), M));
        wire.extend(client(true, 0, b"!", M));
        let big = vec![b'x'; 70_000];
        wire.extend(client(true, 2, &big, M));
        wire.extend(client(true, 8, &[0x03, 0xe8, b'b', b'y', b'e'], M));
        let want = vec![
            Message::Text("hello".into()),
            Message::Ping(b"p".to_vec()),
            Message::Text("fragmé!".into()),
            Message::Binary(big),
            Message::Close(Some((1000, "bye".into()))),
        ];
        // All at once, and one byte at a time: the same messages.
        for step in [wire.len(), 1, 7] {
            let mut d = Decoder::new(1 << 20);
            let mut buf = Vec::new();
            let mut got = Vec::new();
            for chunk in wire.chunks(step) {
                buf.extend_from_slice(chunk);
                while let Some(m) = d.next(&mut buf).unwrap() {
                    got.push(m);
                }
            }
            assert_eq!(got, want, "step {step}");
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn test_a_message_at_below_and_above_the_cap() {
        for (len, ok) in [(99, true), (100, true), (101, false)] {
            let mut d = Decoder::new(100);
            let mut buf = client(true, 1, &vec![b'a'; len], M);
            // Refused from the header alone: the payload need not have arrived.
            if !ok {
                buf.truncate(8);
            }
            match d.next(&mut buf) {
                Ok(Some(Message::Text(t))) => assert!(ok && t.len() == len),
                Err(WsError::TooBig(100)) => assert!(!ok),
                other => panic!("{len}: {other:?}"),
            }
        }
        // Fragments count together.
        let mut d = Decoder::new(100);
        let mut buf = client(false, 1, &[b'a'; 60], M);
        buf.extend(client(true, 0, &[b'a'; 41], M));
        assert_eq!(d.next(&mut buf), Err(WsError::TooBig(100)));
    }

    #[test]
    fn test_broken_frames_end_the_connection_with_their_code() {
        let unmasked = {
            let mut f = client(true, 1, b"x", M);
            f[1] &= 0x7f;
            f.drain(2..6);
            f
        };
        let rsv = {
            let mut f = client(true, 1, b"x", M);
            f[0] |= 0x40;
            f
        };
        let mut huge = vec![0x81, 0x80 | 127];
        huge.extend_from_slice(&u64::MAX.to_be_bytes());
        huge.extend_from_slice(&M);
        let cases: Vec<(Vec<u8>, u16)> = vec![
            (unmasked, 1002),
            (rsv, 1002),
            (client(true, 3, b"", M), 1002),
            (client(false, 9, b"", M), 1002),
            (client(true, 9, &[0; 126], M), 1002),
            (client(true, 0, b"x", M), 1002),
            (
                [client(false, 1, b"a", M), client(true, 1, b"b", M)].concat(),
                1002,
            ),
            (client(true, 1, &[0xff, 0xfe], M), 1007),
            (client(true, 8, &[0x03], M), 1002),
            (client(true, 8, &[0x03, 0xed], M), 1002),
            (client(true, 8, &[0x03, 0xe8, 0xff], M), 1007),
            (huge, 1002),
        ];
        for (wire, code) in cases {
            let mut d = Decoder::new(1 << 20);
            let mut buf = wire.clone();
            let err = loop {
                match d.next(&mut buf) {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("{wire:x?}: no error"),
                    Err(e) => break e,
                }
            };
            assert_eq!(err.close_code(), code, "{wire:x?}: {err}");
        }
    }

    #[test]
    fn test_server_frames_are_unmasked_and_sized() {
        for len in [0usize, 125, 126, 65_535, 65_536] {
            let mut out = Vec::new();
            write_frame(&mut out, 1, &vec![b'a'; len]);
            let hdr = match len {
                n if n < 126 => 2,
                n if n <= 0xffff => 4,
                _ => 10,
            };
            assert_eq!(out.len(), hdr + len);
            assert_eq!(out[0], 0x81);
            assert_eq!(out[1] & 0x80, 0);
        }
        let mut out = Vec::new();
        write_close(&mut out, 1009, &"é".repeat(100));
        assert!(out.len() <= 2 + 125);
        assert_eq!(&out[2..4], &1009u16.to_be_bytes());
        assert!(std::str::from_utf8(&out[4..]).is_ok());
    }
}
