//! The init protocol's decoder (`sandbox::wire::Decoder`), which the daemon runs on
//! whatever a sandbox's init (that is, the user's code) writes: the same bytes give the
//! same frames, and the same first error, however they arrive; a length over the bound
//! is refused before its body is buffered; every decoded frame re-encodes to exactly
//! the bytes it came from.
#![no_main]

use isobox::sandbox::wire::{encode, Decoder, Frame, WireError, MAX_FRAME_BYTES};
use isobox_fuzz::{pieces, Rng};
use libfuzzer_sys::fuzz_target;

fn decode(parts: &[&[u8]]) -> (Vec<Frame>, Option<WireError>, usize) {
    let mut d = Decoder::default();
    let mut frames = Vec::new();
    for p in parts {
        d.push(p);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => return (frames, Some(e), d.pending()),
            }
        }
        // Nothing beyond one frame and its length prefix waits undecoded.
        assert!(d.pending() <= MAX_FRAME_BYTES + 4 + p.len(), "{} pending", d.pending());
    }
    (frames, None, d.pending())
}

fuzz_target!(|data: &[u8]| {
    let mut rng = Rng::new(data);
    let whole = decode(&[data]);
    let split = decode(&pieces(&mut rng, data, 16));
    assert_eq!(whole.0, split.0);
    assert_eq!(whole.1, split.1);
    if whole.1.is_none() {
        assert_eq!(whole.2, split.2);
    }
    // Decoded frames are the input's prefix, byte for byte.
    let mut again = Vec::new();
    for f in &whole.0 {
        encode(&mut again, f.kind, f.channel, &f.payload).unwrap();
    }
    assert_eq!(&data[..again.len()], again.as_slice());
});
