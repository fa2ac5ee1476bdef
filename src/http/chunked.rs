//! Chunked transfer coding (RFC 9112 §7.1): the sans-IO decoder for request bodies,
//! and the encoder of response chunks ([`write_chunk`], [`LAST_CHUNK`]).
//!
//! Bounded everywhere: the chunk size may not overflow, an extension is at most
//! `MAX_CHUNK_EXT_BYTES`, the trailer section at most `MAX_TRAILER_BYTES`, and the
//! decoded body at most the route's cap. Line ends may be CRLF or bare LF, as in heads.

use super::limits::{MAX_CHUNK_EXT_BYTES, MAX_TRAILER_BYTES};

/// The last chunk of a response with no trailer section.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// The size line of a chunk of `len` bytes (`len` must not be 0: that is the last chunk).
pub fn chunk_head(len: usize) -> Vec<u8> {
    debug_assert!(len > 0, "a zero-length chunk ends the body");
    format!("{len:x}\r\n").into_bytes()
}

/// Appends `payload` as one chunk (nothing for an empty payload, which would end the
/// body).
pub fn write_chunk(out: &mut Vec<u8>, payload: &[u8]) {
    if payload.is_empty() {
        return;
    }
    // Straight into `out`: this is every SSE event's path.
    let _ = std::io::Write::write_fmt(out, format_args!("{:x}\r\n", payload.len()));
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

/// Why a chunked body was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// Malformed framing; the text says where.
    #[error("malformed chunked body: {0}")]
    Malformed(&'static str),
    /// The decoded body exceeded the route's cap.
    #[error("body too large")]
    TooLarge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Size { digits: u8 },
    Ext,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerLineStart,
    TrailerLine,
    TrailerLf { blank: bool },
    Done,
}

/// The decoder state for one body.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
    size: u64,
    ext_bytes: usize,
    trailer_bytes: usize,
    decoded: usize,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        ChunkedDecoder {
            state: State::Size { digits: 0 },
            size: 0,
            ext_bytes: 0,
            trailer_bytes: 0,
            decoded: 0,
        }
    }

    /// Whether the terminating chunk and trailers have been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes bytes of `input`, appending decoded data to `out` (at most `cap` bytes in
    /// all). Returns how many input bytes were consumed; stops right after the body ends.
    ///
    /// # Errors
    /// [`ChunkError`] on malformed framing or when the body would exceed `cap`.
    pub fn feed(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        cap: usize,
    ) -> Result<usize, ChunkError> {
        let mut i = 0;
        while i < input.len() && self.state != State::Done {
            let c = input[i];
            match self.state {
                State::Size { digits } => match c {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        // 15 hex digits bound the size below 2^60: no overflow possible.
                        if digits >= 15 {
                            return Err(ChunkError::Malformed("chunk size too large"));
                        }
                        let v = (c as char).to_digit(16).map(u64::from).unwrap_or(0);
                        self.size = self.size * 16 + v;
                        self.state = State::Size { digits: digits + 1 };
                    }
                    b';' | b' ' | b'\t' if digits > 0 => {
                        self.ext_bytes = 0;
                        self.state = State::Ext;
                    }
                    b'\r' if digits > 0 => self.state = State::SizeLf,
                    b'\n' if digits > 0 => self.end_size_line(),
                    _ => return Err(ChunkError::Malformed("invalid chunk size")),
                },
                State::Ext => match c {
                    b'\r' => self.state = State::SizeLf,
                    b'\n' => self.end_size_line(),
                    b'\t' | 0x20..=0x7e => {
                        self.ext_bytes += 1;
                        if self.ext_bytes > MAX_CHUNK_EXT_BYTES {
                            return Err(ChunkError::Malformed("chunk extension too long"));
                        }
                    }
                    _ => return Err(ChunkError::Malformed("invalid byte in chunk extension")),
                },
                State::SizeLf => {
                    if c != b'\n' {
                        return Err(ChunkError::Malformed("expected LF after chunk size"));
                    }
                    self.end_size_line();
                }
                State::Data => {
                    let want = usize::try_from(self.size)
                        .unwrap_or(usize::MAX)
                        .min(input.len() - i);
                    if self.decoded + want > cap {
                        return Err(ChunkError::TooLarge);
                    }
                    out.extend_from_slice(&input[i..i + want]);
                    self.decoded += want;
                    self.size -= want as u64;
                    i += want;
                    if self.size == 0 {
                        self.state = State::DataCr;
                    }
                    continue;
                }
                State::DataCr => match c {
                    b'\r' => self.state = State::DataLf,
                    b'\n' => self.state = State::Size { digits: 0 },
                    _ => return Err(ChunkError::Malformed("missing CRLF after chunk data")),
                },
                State::DataLf => {
                    if c != b'\n' {
                        return Err(ChunkError::Malformed("missing LF after chunk data"));
                    }
                    self.state = State::Size { digits: 0 };
                }
                State::TrailerLineStart => match c {
                    b'\r' => self.state = State::TrailerLf { blank: true },
                    b'\n' => self.state = State::Done,
                    _ => {
                        self.count_trailer()?;
                        self.state = State::TrailerLine;
                    }
                },
                State::TrailerLine => match c {
                    b'\r' => self.state = State::TrailerLf { blank: false },
                    b'\n' => self.state = State::TrailerLineStart,
                    0 => return Err(ChunkError::Malformed("NUL in trailer")),
                    _ => self.count_trailer()?,
                },
                State::TrailerLf { blank } => {
                    if c != b'\n' {
                        return Err(ChunkError::Malformed("expected LF in trailer"));
                    }
                    self.state = if blank {
                        State::Done
                    } else {
                        State::TrailerLineStart
                    };
                }
                State::Done => break,
            }
            i += 1;
        }
        Ok(i)
    }

    fn end_size_line(&mut self) {
        self.state = if self.size == 0 {
            State::TrailerLineStart
        } else {
            State::Data
        };
    }

    fn count_trailer(&mut self) -> Result<(), ChunkError> {
        self.trailer_bytes += 1;
        if self.trailer_bytes > MAX_TRAILER_BYTES {
            return Err(ChunkError::Malformed("trailer section too large"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_encoded_chunks_decode_back() {
        let mut out = Vec::new();
        for p in [&b"hello"[..], b"", &[b'x'; 300][..]] {
            write_chunk(&mut out, p);
        }
        out.extend_from_slice(LAST_CHUNK);
        assert!(out.starts_with(b"5\r\nhello\r\n12c\r\n"));
        let mut d = ChunkedDecoder::new();
        let mut body = Vec::new();
        assert_eq!(d.feed(&out, &mut body, 1 << 20), Ok(out.len()));
        assert!(d.is_done());
        assert_eq!(body.len(), 305);
    }

    fn decode_all(input: &[u8], cap: usize) -> Result<(Vec<u8>, usize), ChunkError> {
        let mut d = ChunkedDecoder::new();
        let mut out = Vec::new();
        let n = d.feed(input, &mut out, cap)?;
        assert!(d.is_done(), "not done");
        Ok((out, n))
    }

    #[test]
    fn test_decodes_and_stops_at_end() {
        let (out, n) = decode_all(
            b"4\r\nWiki\r\n5;ext=1\r\npedia\r\n0\r\nX-T: y\r\n\r\nNEXT",
            100,
        )
        .unwrap();
        assert_eq!(out, b"Wikipedia");
        assert_eq!(n, 38);
    }

    #[test]
    fn test_same_result_in_any_split() {
        let body = b"3\r\nabc\r\na\r\n0123456789\r\n0\r\n\r\n";
        for split in 0..body.len() {
            let mut d = ChunkedDecoder::new();
            let mut out = Vec::new();
            let n1 = d.feed(&body[..split], &mut out, 100).unwrap();
            assert_eq!(n1, split);
            d.feed(&body[split..], &mut out, 100).unwrap();
            assert!(d.is_done());
            assert_eq!(out, b"abc0123456789");
        }
    }

    #[test]
    fn test_overflow_and_garbage_rejected() {
        assert!(matches!(
            decode_all(b"f0000000000000003\r\nabc\r\n0\r\n\r\n", 100),
            Err(ChunkError::Malformed(_))
        ));
        let mut d = ChunkedDecoder::new();
        assert!(d.feed(b"1\r\nZ\r\n\r\n", &mut Vec::new(), 100).is_err());
        assert!(decode_all(b"zz\r\n", 100).is_err());
        assert!(decode_all(b"\r\n", 100).is_err());
    }

    #[test]
    fn test_limits() {
        assert_eq!(
            decode_all(b"5\r\nhello\r\n0\r\n\r\n", 4),
            Err(ChunkError::TooLarge)
        );
        assert!(decode_all(b"5\r\nhello\r\n0\r\n\r\n", 5).is_ok());
        let mut ext = b"1;".to_vec();
        ext.extend(std::iter::repeat_n(b'a', MAX_CHUNK_EXT_BYTES + 1));
        let mut d = ChunkedDecoder::new();
        assert_eq!(
            d.feed(&ext, &mut Vec::new(), 100),
            Err(ChunkError::Malformed("chunk extension too long"))
        );
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..10_000 {
            trailers.extend_from_slice(b"X-i: 1\r\n");
        }
        let mut d = ChunkedDecoder::new();
        assert_eq!(
            d.feed(&trailers, &mut Vec::new(), 100),
            Err(ChunkError::Malformed("trailer section too large"))
        );
    }
}
