//! HTTP/1.1: sans-IO head parsing, chunked bodies, responses, SSE framing, limits.
//!
//! Nothing here touches a socket; the reactor feeds bytes in and writes bytes out.

pub mod chunked;
pub mod lazy;
pub mod limits;
pub mod parse;
pub mod response;
pub mod sse;

pub use parse::{Framing, Head, HttpError};
pub use response::Response;

/// A complete request: head plus decoded body.
#[derive(Debug)]
pub struct Request {
    /// The parsed head.
    pub head: Head,
    /// The body, decoded from its framing.
    pub body: Vec<u8>,
    /// The tenant admission derived for it (server-side, from the key).
    pub tenant: String,
}
