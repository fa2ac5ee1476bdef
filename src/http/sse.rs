//! Server-sent events framing (HTML Living Standard, "Server-sent events").
//!
//! `data` may hold newlines: each line becomes its own `data:` field, which the client
//! joins back with `\n`. Comments (`: ...`) keep idle streams alive through proxies.

/// Appends one event with name `event` and payload `data` to `out`.
pub fn write_event(out: &mut Vec<u8>, event: &str, data: &str) {
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
