//! Chunked request bodies: the same bytes give the same outcome however they arrive.
//!
//! Each input is decoded fed whole, fed in two pieces split at an input-derived point,
//! and fed in small pieces, with the same cap; the outcome (decoded bytes, bytes
//! consumed and whether the body ended, or the error) must be identical. The decoded
//! body never exceeds the cap, and the decoder never consumes past the body's end.
//! Two caps are tried: 1 MiB (never reached by fuzz-sized input) and a small one
//! derived from the input, so `TooLarge` is exercised too.
#![no_main]

use isobox::http::chunked::{ChunkError, ChunkedDecoder};
use isobox_fuzz::{pieces, Rng};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, PartialEq)]
enum Outcome {
    Ok {
        decoded: Vec<u8>,
        consumed: usize,
        done: bool,
    },
    Err(ChunkError),
}

fn decode(parts: &[&[u8]], cap: usize) -> Outcome {
    let mut d = ChunkedDecoder::new();
    let mut out = Vec::new();
    let mut consumed = 0;
    for part in parts {
        let r = d.feed(part, &mut out, cap);
        assert!(
            out.len() <= cap,
            "decoded {} bytes past the cap {cap}",
            out.len()
        );
        match r {
            Ok(n) => {
                assert!(n <= part.len(), "consumed {n} of {} bytes", part.len());
                if !d.is_done() {
                    assert_eq!(n, part.len(), "stopped early without ending the body");
                }
                consumed += n;
            }
            Err(e) => return Outcome::Err(e),
        }
        if d.is_done() {
            // What follows belongs to the next request: a done decoder takes nothing.
            let mut extra = Vec::new();
            assert_eq!(d.feed(b"1\r\nx\r\n", &mut extra, cap), Ok(0));
            assert!(extra.is_empty());
            break;
        }
    }
    Outcome::Ok {
        decoded: out,
        consumed,
        done: d.is_done(),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut rng = Rng::new(data);
    let small_cap = rng.upto(64);
    for cap in [1 << 20, small_cap] {
        let whole = decode(&[data], cap);
        let k = rng.upto(data.len());
        let two = decode(&[&data[..k], &data[k..]], cap);
        assert_eq!(whole, two, "fed whole vs split at {k} (cap {cap})");
        let many = pieces(&mut rng, data, 8);
        let small = decode(&many, cap);
        assert_eq!(
            whole,
            small,
            "fed whole vs in pieces {:?} (cap {cap})",
            many.iter().map(|p| p.len()).collect::<Vec<_>>()
        );
        if let Outcome::Ok {
            decoded,
            consumed,
            done,
        } = &whole
        {
            assert!(decoded.len() <= *consumed);
            assert!(*consumed <= data.len());
            if !done {
                assert_eq!(*consumed, data.len());
            }
        }
    }
});
