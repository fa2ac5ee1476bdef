//! The frames between the daemon and the WebAssembly worker: a 4-byte big-endian
//! length, then that many bytes of JSON. One file for both sides: the daemon has it as
//! `wasm::frame`, the worker (`wasm-worker/`, a crate of its own) includes it by path.
//! Only `std` here.

use std::io::{Read, Write};

/// Largest frame either side sends (a run's code and its answer are bounded below it).
pub const MAX_FRAME: usize = 16 << 20;

/// Largest saved state of an eryx session (the document: "up to 1 MB"), as the bytes
/// dill writes; in frames it travels as base64.
pub const STATE_BYTES: usize = 1 << 20;

/// Wall time each of a session run's two bookkeeping phases (restoring the state
/// before the code, saving it after) may take, beside the run's own limit. They are
/// not charged to the run (the document: "saving and restoring the state is free"),
/// but bounded: objects can run their own code while they are saved or loaded.
pub const STATE_PHASE_MS: u64 = 10_000;

/// WebAssembly instructions each bookkeeping phase may use (see [`STATE_PHASE_MS`]).
pub const STATE_PHASE_FUEL: u64 = 10_000_000_000;

/// The next frame; `None` at a clean end of the stream.
///
/// # Errors
/// A read error, an end inside a frame, or a length over [`MAX_FRAME`].
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = u32::from_be_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(std::io::Error::other(format!("a frame of {n} bytes")));
    }
    let mut buf = vec![0u8; n];
    r.read_exact(&mut buf)?;
    Ok(Some(buf))
}

/// Writes `body` as one frame.
///
/// # Errors
/// A write error, or a body over [`MAX_FRAME`].
pub fn write_frame(w: &mut impl Write, body: &[u8]) -> std::io::Result<()> {
    if body.len() > MAX_FRAME {
        return Err(std::io::Error::other("frame too large"));
    }
    w.write_all(&(body.len() as u32).to_be_bytes())?;
    w.write_all(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_frames_round_trip_and_oversize_is_refused() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"{\"a\":1}").unwrap();
        let mut r = std::io::Cursor::new(buf);
        assert_eq!(read_frame(&mut r).unwrap().unwrap(), b"{\"a\":1}");
        assert_eq!(read_frame(&mut r).unwrap(), None);
        let mut big = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
        big.extend_from_slice(&[0; 8]);
        assert!(read_frame(&mut std::io::Cursor::new(big)).is_err());
        assert!(write_frame(&mut Vec::new(), &vec![0; MAX_FRAME + 1]).is_err());
    }
}
