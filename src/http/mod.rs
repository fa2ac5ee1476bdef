//! HTTP/1.1: sans-IO head parsing, chunked bodies, responses, SSE framing, limits.
//!
//! Nothing here touches a socket; the reactor feeds bytes in and writes bytes out.

pub mod chunked;
pub mod conn;
pub mod json;
pub mod lazy;
pub mod limits;
pub mod parse;
pub mod relay;
pub mod response;
pub mod sse;
pub mod ws;

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
    /// What its route's pattern took from the path.
    pub params: Params,
}

/// The parameters a route's pattern took from the path (`{id}`, `{key*}`), in pattern
/// order, still percent-encoded as sent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params(Vec<(&'static str, String)>);

impl Params {
    /// Adds parameter `name`.
    pub fn push(&mut self, name: &'static str, value: &str) {
        self.0.push((name, value.to_string()));
    }

    /// The value of parameter `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Every parameter, in pattern order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &str)> {
        self.0.iter().map(|(n, v)| (*n, v.as_str()))
    }
}
