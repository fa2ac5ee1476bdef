//! SSE output text: a multi-byte character split across reads is never emitted broken.
//!
//! The input is fed to `take_utf8` the way the reactor feeds a stream (append the new
//! bytes to the pending buffer, call with `last = false`, and with `last = true` for
//! the final read), one byte at a time and in random-sized reads. The concatenated
//! text must equal `String::from_utf8_lossy` of the whole input: same characters, and
//! the same U+FFFD for each invalid sequence wherever the reads split it.
#![no_main]

use isobox::http::sse::take_utf8;
use isobox_fuzz::{pieces, Rng};
use libfuzzer_sys::fuzz_target;

fn stream(reads: &[&[u8]]) -> String {
    let mut pending = Vec::new();
    let mut text = String::new();
    for (i, read) in reads.iter().enumerate() {
        pending.extend_from_slice(read);
        let last = i + 1 == reads.len();
        text.push_str(&take_utf8(&mut pending, last));
        if last {
            assert!(
                pending.is_empty(),
                "bytes left after the last read: {pending:?}"
            );
        } else {
            // Only an incomplete character (at most 3 bytes of one) may be held back.
            assert!(pending.len() <= 3, "held back {pending:?}");
            assert!(
                matches!(std::str::from_utf8(&pending), Err(e) if e.valid_up_to() == 0 && e.error_len().is_none())
                    || pending.is_empty(),
                "held back {pending:?}, which is not an incomplete character"
            );
        }
    }
    text
}

fuzz_target!(|data: &[u8]| {
    let mut rng = Rng::new(data);
    // Whole, then one byte per read, then random reads (1..=7 bytes), then two reads.
    // One byte per read only over the first KiB: a call per byte is what is slow.
    let head = &data[..data.len().min(1024)];
    let bytes: Vec<&[u8]> = head.chunks(1).collect();
    let random = pieces(&mut rng, data, 7);
    let k = rng.upto(data.len());
    let two: Vec<&[u8]> = vec![&data[..k], &data[k..]];
    for (input, reads) in [
        (data, vec![data]),
        (head, bytes),
        (data, random),
        (data, two),
    ] {
        let got = stream(&reads);
        assert_eq!(
            got,
            String::from_utf8_lossy(input),
            "reads of {:?} bytes",
            reads.iter().map(|r| r.len()).collect::<Vec<_>>()
        );
    }
});
