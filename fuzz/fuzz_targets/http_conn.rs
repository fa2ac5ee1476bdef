//! The connection state machine (`http::conn::Conn`): the same bytes give the same
//! requests however they arrive.
//!
//! The input is a byte stream from a client: pipelined heads and bodies, anything at
//! all. It is fed whole and in random 1–64-byte reads (input-derived); after each read
//! the machine is driven as the daemon drives it (`next_head`, `begin_body` with a small
//! input-derived body cap, `advance_body`, an answer to each dispatched request). The
//! sequence of outcomes (each request's method, path and body, an over-cap body, a
//! refusal and its status) must be identical, the read buffer never holds more than
//! `MAX_READ_AHEAD_BYTES`, no body exceeds its cap, and a connection that refused
//! takes no more input.
#![no_main]

use isobox::http::conn::{BodyStep, Conn, HeadStep, Owner, Phase, Role};
use isobox::http::limits::MAX_READ_AHEAD_BYTES;
use isobox::http::{Params, Response};
use isobox_fuzz::{pieces, Rng};
use libfuzzer_sys::fuzz_target;
use std::io::{self, Read};
use std::time::Instant;

struct Waits;
impl Owner for Waits {
    fn role(&self) -> Role {
        Role::Answers
    }
}

#[derive(Debug, PartialEq)]
enum Seen {
    Request(String, String, Vec<u8>),
    OverCap,
    Refused(u16),
}

/// Gives `data` once, then would block.
struct Once<'a>(Option<&'a [u8]>);
impl Read for Once<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.0.take() {
            Some(d) if !d.is_empty() => {
                let n = d.len().min(buf.len());
                buf[..n].copy_from_slice(&d[..n]);
                if n < d.len() {
                    self.0 = Some(&d[n..]);
                }
                Ok(n)
            }
            _ => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

fn status_of(wbuf: &[u8]) -> u16 {
    // The last response queued: "HTTP/1.1 NNN ".
    let text = String::from_utf8_lossy(wbuf);
    text.rfind("HTTP/1.1 ")
        .and_then(|i| text.get(i + 9..i + 12))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn drive(parts: &[&[u8]], cap: usize) -> Vec<Seen> {
    let now = Instant::now();
    let mut c: Conn<(), Waits> = Conn::new(now);
    let mut seen = Vec::new();
    for part in parts {
        if c.close_after_flush {
            break;
        }
        let mut r = Once(Some(part));
        // The bound stops a read; what is left waits for the next turn, as in the daemon.
        while c.read_from(&mut r) {
            assert!(c.rbuf.len() <= MAX_READ_AHEAD_BYTES);
            if !step(&mut c, cap, &mut seen, now) {
                return seen;
            }
        }
        assert!(c.rbuf.len() <= MAX_READ_AHEAD_BYTES);
        if !step(&mut c, cap, &mut seen, now) {
            return seen;
        }
    }
    seen
}

/// Parses and answers what the buffer holds. False once the connection refused.
fn step(c: &mut Conn<(), Waits>, cap: usize, seen: &mut Vec<Seen>, now: Instant) -> bool {
    loop {
        if c.close_after_flush {
            assert!(!c.takes_input());
            return false;
        }
        let (body_step, begun) = match &c.phase {
            Phase::Head => match c.next_head(now) {
                HeadStep::Wait => return true,
                HeadStep::Began => continue,
                HeadStep::Refused { .. } => {
                    seen.push(Seen::Refused(status_of(&c.wbuf)));
                    return false;
                }
                HeadStep::Head(h) => (
                    c.begin_body(h, (), cap, Params::default(), String::new()),
                    true,
                ),
            },
            Phase::Body { .. } => (c.advance_body(), false),
            Phase::Json(_) | Phase::Owned(_) => unreachable!("never handed over here"),
        };
        match body_step {
            // A body just begun may already be in the buffer: the daemon goes on to read it.
            BodyStep::Wait { .. } if begun => {}
            BodyStep::Wait { .. } => return true,
            BodyStep::Dispatch((), req) => {
                assert!(req.body.len() <= cap, "body {} over cap {cap}", req.body.len());
                seen.push(Seen::Request(req.head.method, req.head.path, req.body));
                c.respond(Response::no_content(), false);
            }
            BodyStep::OverCap(()) => {
                seen.push(Seen::OverCap);
                return false;
            }
            BodyStep::Refused => {
                seen.push(Seen::Refused(status_of(&c.wbuf)));
                return false;
            }
            BodyStep::Malformed((), why) => {
                c.respond_and_close(Response::error(400, "bad_request", Some(&why)));
                seen.push(Seen::Refused(status_of(&c.wbuf)));
                return false;
            }
        }
        // The responses go out as they are made.
        assert!(c.write_to(&mut io::sink(), now));
    }
}

fuzz_target!(|data: &[u8]| {
    let mut rng = Rng::new(data);
    let cap = 1 + rng.upto(200);
    let whole = drive(&[data], cap);
    let split = drive(&pieces(&mut rng, data, 64), cap);
    assert_eq!(whole, split, "cap {cap}");
});
