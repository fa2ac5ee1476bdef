//! The public-URL proxy's relay (`http::relay`): a client's request bytes and an app's
//! answer bytes — both untrusted, the app's coming from inside a sandbox — arrive in
//! reads of any size, read only as far as the relay says it has room.
//!
//! Input: a split byte, then the client's bytes, then the app's. Checked: nothing
//! panics; no buffer grows past its bound; and everything the relay sent the app
//! parses, with the daemon's own strict parser, as whole requests (each head, then
//! exactly its body by its framing) — a request cannot smuggle a second one past the
//! proxy, whatever the client sent; and after a framing error the relay is spent.
#![no_main]

use isobox::http::chunked::ChunkedDecoder;
use isobox::http::parse::{find_head_end, parse_head};
use isobox::http::relay::{Forwarded, Next, Relay, BUF_BYTES, MAX_RESPONSE_HEAD_BYTES};
use isobox::http::Framing;
use isobox_fuzz::{pieces, Rng};
use libfuzzer_sys::fuzz_target;

/// Parses `out` as requests back to back; the bytes after the last complete one (a
/// body still arriving) are allowed only when `open`.
fn check_requests(mut out: &[u8], open: bool) {
    while !out.is_empty() {
        let Some(end) = find_head_end(out, 0) else {
            assert!(open, "an incomplete head was sent");
            return;
        };
        let head = parse_head(&out[..end]).expect("the app gets only heads our parser takes");
        out = &out[end..];
        match head.framing {
            Framing::None => {}
            Framing::Length(n) => {
                let n = usize::try_from(n).unwrap().min(out.len());
                out = &out[n..];
            }
            Framing::Chunked => {
                let mut dec = ChunkedDecoder::new();
                let mut sink = Vec::new();
                let n = dec
                    .feed(out, &mut sink, usize::MAX)
                    .expect("clean chunked framing");
                out = &out[n..];
                if !dec.is_done() {
                    assert!(open && out.is_empty());
                    return;
                }
            }
        }
    }
}

/// After an error the relay is spent: pumping again is `Ok` and moves nothing, and it
/// takes no more bytes (a caller that pumped on would otherwise loop on one error).
fn spent(relay: &mut Relay) {
    let before = (relay.to_client.len(), relay.to_upstream.len());
    relay.pump().expect("a spent relay pumps without error");
    assert_eq!(before, (relay.to_client.len(), relay.to_upstream.len()));
    assert_eq!(
        (relay.room_from_client(), relay.room_from_upstream()),
        (0, 0)
    );
    assert!(matches!(relay.next_request(), Next::Wait));
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let at = (usize::from(split) * rest.len() / 255).min(rest.len());
    let (client, app) = rest.split_at(at);
    let mut rng = Rng::new(data);
    let mut client = pieces(&mut rng, client, 64).into_iter();
    let mut app = pieces(&mut rng, app, 64).into_iter();
    let mut relay = Relay::new(Vec::new());
    let mut sent = Vec::new();
    let mut pending_c: &[u8] = &[];
    let mut pending_a: &[u8] = &[];
    for _ in 0..10_000 {
        // The client's bytes, as far as there is room.
        if pending_c.is_empty() {
            pending_c = client.next().unwrap_or(&[]);
        }
        let n = relay.room_from_client().min(pending_c.len());
        relay.from_client.extend_from_slice(&pending_c[..n]);
        pending_c = &pending_c[n..];
        if let Next::Head(h) = relay.next_request() {
            let target = match &h.query {
                Some(q) => format!("{}?{q}", h.path),
                None => h.path.clone(),
            };
            relay.forward(
                &h,
                &Forwarded {
                    client: "192.0.2.1",
                    proto: "http",
                    target: &target,
                    strip: &["x-wbx-token"],
                    cookie: None,
                    trusted: data.len() % 2 == 0,
                },
            );
        }
        if relay.pump().is_err() {
            spent(&mut relay);
            break;
        }
        // The app's bytes.
        if pending_a.is_empty() {
            pending_a = app.next().unwrap_or(&[]);
        }
        let n = relay.room_from_upstream().min(pending_a.len());
        relay.from_upstream.extend_from_slice(&pending_a[..n]);
        pending_a = &pending_a[n..];
        if relay.pump().is_err() {
            spent(&mut relay);
            break;
        }
        assert!(relay.from_upstream.len() <= BUF_BYTES.max(MAX_RESPONSE_HEAD_BYTES + 1));
        assert!(relay.to_client.len() <= 2 * BUF_BYTES + 4 * MAX_RESPONSE_HEAD_BYTES);
        assert!(relay.to_upstream.len() <= 2 * BUF_BYTES + 64 * 1024);
        // Both sides take everything queued.
        sent.extend_from_slice(&relay.to_upstream);
        relay.to_upstream.clear();
        relay.to_client.clear();
        if pending_c.is_empty() && pending_a.is_empty() && client.len() == 0 && app.len() == 0 {
            break;
        }
    }
    if !relay.is_tunnel() {
        check_requests(&sent, true);
    }
});
