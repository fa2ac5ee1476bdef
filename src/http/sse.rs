//! Server-sent events framing (HTML Living Standard, "Server-sent events").
//!
//! `data` may hold newlines: each line becomes its own `data:` field, which the client
//! joins back with `\n`. Comments (`: ...`) keep idle streams alive through proxies.
//! A run's output becomes text here too ([`take_utf8`]): never a broken character.

/// Appends the head of an SSE response: 200, `text/event-stream`, not cached nor
/// buffered by proxies, chunked, with `extra` headers (a run's id).
pub fn write_head(out: &mut Vec<u8>, keep_alive: bool, extra: &[(&'static str, String)]) {
    let mut headers = vec![
        ("Content-Type", "text/event-stream".to_string()),
        ("Cache-Control", "no-cache".to_string()),
        ("X-Accel-Buffering", "no".to_string()),
        ("Transfer-Encoding", "chunked".to_string()),
    ];
    headers.extend_from_slice(extra);
    super::response::write_head(out, 200, &headers, None, keep_alive);
}

/// Appends one event with name `event` and payload `data` to `out`.
pub fn write_event(out: &mut Vec<u8>, event: &str, data: &str) {
    write_event_id(out, None, event, data);
}

/// [`write_event`] with an `id:` field (what a reconnecting client sends back as
/// `Last-Event-ID`).
pub fn write_event_id(out: &mut Vec<u8>, id: Option<u64>, event: &str, data: &str) {
    if let Some(id) = id {
        out.extend_from_slice(format!("id: {id}\n").as_bytes());
    }
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.push(b'\n');
    // Split on every line terminator the standard recognises: CRLF, LF, CR.
    for line in data.split("\r\n").flat_map(|l| l.split(['\n', '\r'])) {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// Appends a keep-alive comment line.
pub fn write_comment(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(b": ");
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// Takes the longest UTF-8-safe prefix of `buf` as text: invalid bytes become U+FFFD,
/// an incomplete character at the end is held back unless `last`.
pub fn take_utf8(buf: &mut Vec<u8>, last: bool) -> String {
    let mut out = String::new();
    let mut start = 0;
    loop {
        match std::str::from_utf8(&buf[start..]) {
            Ok(s) => {
                out.push_str(s);
                start = buf.len();
                break;
            }
            Err(e) => {
                let valid = start + e.valid_up_to();
                out.push_str(std::str::from_utf8(&buf[start..valid]).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        start = valid + n;
                    }
                    None if last => {
                        out.push('\u{FFFD}');
                        start = buf.len();
                        break;
                    }
                    None => {
                        start = valid;
                        break;
                    }
                }
            }
        }
    }
    buf.drain(..start);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_multiline_data_split_into_fields() {
        let mut out = Vec::new();
        write_event(&mut out, "stdout", "a\nb\r\nc");
        assert_eq!(out, b"event: stdout\ndata: a\ndata: b\ndata: c\n\n");
    }
}
