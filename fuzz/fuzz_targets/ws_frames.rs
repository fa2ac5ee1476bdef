//! WebSocket client frames (`http::ws::Decoder`): never a panic, never a message over
//! the cap, control payloads within 125 bytes, and the same messages (or the same
//! error) whether the bytes come all at once or in pieces.
//!
//! The first byte sets the piece size (1–64); the rest is the client's bytes.
#![no_main]

use isobox::http::ws::{Decoder, Message, WsError};
use libfuzzer_sys::fuzz_target;

const CAP: usize = 4096;

/// Every message until the input runs out or an error ends the connection.
fn decode(wire: &[u8], piece: usize) -> (Vec<Message>, Option<WsError>) {
    let mut d = Decoder::new(CAP);
    let mut buf = Vec::new();
    let mut out = Vec::new();
    for chunk in wire.chunks(piece) {
        buf.extend_from_slice(chunk);
        loop {
            let before = buf.len();
            match d.next(&mut buf) {
                Ok(Some(m)) => {
                    match &m {
                        Message::Text(t) => assert!(t.len() <= CAP),
                        Message::Binary(b) => assert!(b.len() <= CAP),
                        Message::Ping(p) | Message::Pong(p) => assert!(p.len() <= 125),
                        Message::Close(Some((_, r))) => assert!(r.len() <= 123),
                        Message::Close(None) => {}
                    }
                    out.push(m);
                }
                Ok(None) => {
                    // Waiting for more means it took what it could: at most a frame
                    // header's 14 bytes stay behind.
                    assert!(buf.len() < 14, "{} bytes left unread", buf.len());
                    assert!(buf.len() <= before);
                    break;
                }
                Err(e) => return (out, Some(e)),
            }
        }
    }
    (out, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&p, wire)) = data.split_first() else {
        return;
    };
    let piece = usize::from(p % 64) + 1;
    let whole = decode(wire, wire.len().max(1));
    let pieces = decode(wire, piece);
    assert_eq!(whole, pieces);
});
