//! The NDJSON writer of the WBX face's streams (`exec/stream`, `process/{pid}/stream`,
//! `fs/watch`): output bytes arrive in reads of any size, are cut at whole UTF-8
//! characters (`take_utf8`), made one `{"type","data"}` line each (`event_line`) and
//! one chunk each (`write_chunk`), then the last chunk.
//!
//! Read back as a client would (chunk by chunk): every chunk is exactly one line of
//! JSON ending in one newline, with a string `data`; the chunked framing decodes
//! whole with the server's own decoder; and the data of all lines together is
//! `String::from_utf8_lossy` of the whole output, however the reads split it.
#![no_main]

use isobox::http::chunked::{write_chunk, ChunkedDecoder, LAST_CHUNK};
use isobox::http::sse::take_utf8;
use isobox::wbx::sandboxes::event_line;
use isobox_fuzz::{pieces, Rng};
use libfuzzer_sys::fuzz_target;

fn write(reads: &[&[u8]]) -> Vec<u8> {
    let mut body = Vec::new();
    let mut pending = Vec::new();
    for (i, read) in reads.iter().enumerate() {
        pending.extend_from_slice(read);
        let text = take_utf8(&mut pending, i + 1 == reads.len());
        if !text.is_empty() {
            let line = event_line(&serde_json::json!({"type": "stdout", "data": text}));
            write_chunk(&mut body, &line);
        }
    }
    body.extend_from_slice(LAST_CHUNK);
    body
}

/// The chunks of `body`, split as a client reads them.
fn chunks(mut body: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    loop {
        let eol = body.windows(2).position(|w| w == b"\r\n").expect("a size line");
        let size = usize::from_str_radix(std::str::from_utf8(&body[..eol]).unwrap(), 16).unwrap();
        body = &body[eol + 2..];
        if size == 0 {
            assert_eq!(body, b"\r\n", "the last chunk ends the body");
            return out;
        }
        out.push(&body[..size]);
        assert_eq!(&body[size..size + 2], b"\r\n");
        body = &body[size + 2..];
    }
}

fuzz_target!(|data: &[u8]| {
    let mut rng = Rng::new(data);
    let random = pieces(&mut rng, data, 9);
    for reads in [vec![data], random] {
        let body = write(&reads);
        let mut whole = Vec::new();
        let mut dec = ChunkedDecoder::new();
        let used = dec.feed(&body, &mut whole, usize::MAX).expect("valid chunked framing");
        assert!(dec.is_done() && used == body.len());
        let mut text = String::new();
        for c in chunks(&body) {
            assert_eq!(c.iter().filter(|&&b| b == b'\n').count(), 1, "one line per chunk");
            assert_eq!(c.last(), Some(&b'\n'));
            let v: serde_json::Value = serde_json::from_slice(c).expect("a JSON line");
            assert_eq!(v["type"], "stdout");
            text.push_str(v["data"].as_str().expect("string data"));
        }
        assert_eq!(text, String::from_utf8_lossy(data));
    }
});
