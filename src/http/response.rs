//! Responses and their serialisation. Every error body is JSON: `{"error":..,"detail":..}`.

use serde::Serialize;

/// A complete (non-streamed) response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Extra headers (Content-Length, Connection and Date are written for you).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
}

impl Response {
    /// A JSON response of `value`.
    pub fn json<T: Serialize + ?Sized>(status: u16, value: &T) -> Response {
        let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
        Response {
            status,
            headers: vec![("Content-Type", "application/json".into())],
            body,
        }
    }

    /// A JSON error body `{"error":code}` or `{"error":code,"detail":detail}`.
    pub fn error(status: u16, code: &str, detail: Option<&str>) -> Response {
        Response::json(
            status,
            &ErrorBody {
                error: code,
                detail,
            },
        )
    }

    /// `204 No Content`.
    pub fn no_content() -> Response {
        Response {
            status: 204,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    /// A body of `content_type`.
    pub fn bytes(status: u16, content_type: &str, body: Vec<u8>) -> Response {
        Response {
            status,
            headers: vec![("Content-Type", content_type.to_string())],
            body,
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }

    /// Appends the response to `out`; `head_only` omits the body (HEAD requests).
    pub fn write_to(&self, out: &mut Vec<u8>, head_only: bool, keep_alive: bool) {
        // RFC 9110 §8.6: no Content-Length (and no body) on 204; a 304 has none either.
        let bodiless = matches!(self.status, 204 | 304);
        write_head(
            out,
            self.status,
            &self.headers,
            (!bodiless).then_some(self.body.len()),
            keep_alive,
        );
        if !head_only && !bodiless {
            out.extend_from_slice(&self.body);
        }
    }
}

/// The interim answer to `Expect: 100-continue` (RFC 9110 §10.1.1).
pub const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Writes a status line and headers. `content_length: None` means the body is streamed
/// until the connection closes (SSE).
pub fn write_head(
    out: &mut Vec<u8>,
    status: u16,
    headers: &[(&'static str, String)],
    content_length: Option<usize>,
    keep_alive: bool,
) {
    use std::io::Write;
    let _ = write!(out, "HTTP/1.1 {} {}\r\n", status, reason(status));
    for (k, v) in headers {
        let _ = write!(out, "{k}: {v}\r\n");
    }
    if let Some(n) = content_length {
        let _ = write!(out, "Content-Length: {n}\r\n");
    }
    out.extend_from_slice(if keep_alive {
        b"Connection: keep-alive\r\n\r\n"
    } else {
        b"Connection: close\r\n\r\n"
    });
}

/// The reason phrase of a status code.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        417 => "Expectation Failed",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        507 => "Insufficient Storage",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_error_body_shape() {
        let r = Response::error(404, "not_found", None);
        assert_eq!(r.body, br#"{"error":"not_found"}"#);
        let r = Response::error(400, "invalid_json", Some("x"));
        assert_eq!(r.body, br#"{"error":"invalid_json","detail":"x"}"#);
    }

    #[test]
    fn test_head_only_has_length_but_no_body() {
        let mut out = Vec::new();
        Response::bytes(200, "text/plain", b"hello".to_vec()).write_to(&mut out, true, true);
        let s = String::from_utf8(out).unwrap();
        assert!(s.contains("Content-Length: 5\r\n"));
        assert!(s.ends_with("\r\n\r\n"));
    }
}
