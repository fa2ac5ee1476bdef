//! A background process's output ring: the last [`RING_BYTES`] of each stream (and at
//! most [`RING_CHUNKS`] pieces of each), in the order the pieces came, so a client
//! attaching later gets the output so far with stdout and stderr interleaved as they
//! were written.

use isobox::sandbox::wire::{Stream, RING_BYTES, RING_CHUNKS};
use std::collections::VecDeque;

/// Pieces are joined up to this size when nothing came between them.
const JOIN_BYTES: usize = 64 << 10;

/// One stream's pieces, each with its place in the order of both streams.
#[derive(Debug, Default)]
struct Side {
    pieces: VecDeque<(u64, Vec<u8>)>,
    bytes: usize,
    /// The stream's offset of the first byte kept (every byte dropped before it).
    start: u64,
}

/// Both streams of one process.
#[derive(Debug)]
pub struct Ring {
    sides: [Side; 2],
    /// The order of the last piece written.
    seq: u64,
    cap_bytes: usize,
    cap_pieces: usize,
}

fn index(s: Stream) -> usize {
    match s {
        Stream::Stdout => 0,
        Stream::Stderr => 1,
    }
}

impl Default for Ring {
    fn default() -> Ring {
        Ring::with_caps(RING_BYTES, RING_CHUNKS)
    }
}

impl Ring {
    /// A ring keeping `bytes` and `pieces` per stream.
    pub fn with_caps(bytes: usize, pieces: usize) -> Ring {
        Ring {
            sides: Default::default(),
            seq: 0,
            cap_bytes: bytes,
            cap_pieces: pieces.max(1),
        }
    }

    /// Appends output, dropping the oldest of that stream beyond the caps.
    pub fn push(&mut self, stream: Stream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let i = index(stream);
        let latest = self.seq;
        let side = &mut self.sides[i];
        match side.pieces.back_mut() {
            // Nothing of the other stream came since: one piece.
            Some((seq, last)) if *seq == latest && last.len() + data.len() <= JOIN_BYTES => {
                last.extend_from_slice(data);
            }
            _ => {
                self.seq += 1;
                side.pieces.push_back((self.seq, data.to_vec()));
            }
        }
        side.bytes += data.len();
        while side.bytes > self.cap_bytes {
            let excess = side.bytes - self.cap_bytes;
            let Some((_, front)) = side.pieces.front_mut() else {
                break;
            };
            if front.len() <= excess {
                side.bytes -= front.len();
                side.start += front.len() as u64;
                side.pieces.pop_front();
            } else {
                front.drain(..excess);
                side.bytes -= excess;
                side.start += excess as u64;
            }
        }
        while side.pieces.len() > self.cap_pieces {
            if let Some((_, p)) = side.pieces.pop_front() {
                side.bytes -= p.len();
                side.start += p.len() as u64;
            }
        }
    }

    /// What it holds, oldest first, both streams in the order they were written: each
    /// piece with its stream's offset of its first byte.
    pub fn replay(&self) -> Vec<(Stream, u64, &[u8])> {
        let [out, err] = &self.sides;
        let (mut a, mut b) = (out.pieces.iter().peekable(), err.pieces.iter().peekable());
        let (mut at_out, mut at_err) = (out.start, err.start);
        let mut v = Vec::with_capacity(out.pieces.len() + err.pieces.len());
        loop {
            let take_out = match (a.peek(), b.peek()) {
                (Some((sa, _)), Some((sb, _))) => sa < sb,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return v,
            };
            if take_out {
                if let Some((_, p)) = a.next() {
                    v.push((Stream::Stdout, at_out, p.as_slice()));
                    at_out += p.len() as u64;
                }
            } else if let Some((_, p)) = b.next() {
                v.push((Stream::Stderr, at_err, p.as_slice()));
                at_err += p.len() as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(r: &Ring) -> Vec<(Stream, String)> {
        r.replay()
            .into_iter()
            .map(|(s, _, d)| (s, String::from_utf8_lossy(d).into_owned()))
            .collect()
    }

    #[test]
    fn test_interleaving_is_kept_and_adjacent_pieces_join() {
        let mut r = Ring::default();
        r.push(Stream::Stdout, b"a");
        r.push(Stream::Stdout, b"b");
        r.push(Stream::Stderr, b"E");
        r.push(Stream::Stdout, b"c");
        r.push(Stream::Stderr, b"");
        assert_eq!(
            text(&r),
            [
                (Stream::Stdout, "ab".to_string()),
                (Stream::Stderr, "E".to_string()),
                (Stream::Stdout, "c".to_string())
            ]
        );
        // Each piece's offset is in its own stream.
        let offsets: Vec<u64> = r.replay().iter().map(|p| p.1).collect();
        assert_eq!(offsets, [0, 0, 2]);
    }

    #[test]
    fn test_bytes_at_below_and_above_the_cap() {
        for (n, kept) in [(9usize, 9usize), (10, 10), (11, 10), (25, 10)] {
            let mut r = Ring::with_caps(10, 100);
            for i in 0..n {
                // Alternate with stderr so no pieces join.
                r.push(Stream::Stdout, &[b'0' + (i % 10) as u8]);
                r.push(Stream::Stderr, b"x");
            }
            let out: String = text(&r)
                .into_iter()
                .filter(|(s, _)| *s == Stream::Stdout)
                .map(|(_, t)| t)
                .collect();
            assert_eq!(out.len(), kept, "{n}");
            // The newest are kept.
            let want: String = (n - kept..n)
                .map(|i| char::from(b'0' + (i % 10) as u8))
                .collect();
            assert_eq!(out, want, "{n}");
        }
        // One big piece is cut to its newest bytes, and says where they start.
        let mut r = Ring::with_caps(4, 100);
        r.push(Stream::Stdout, b"abcdefgh");
        assert_eq!(text(&r), [(Stream::Stdout, "efgh".to_string())]);
        assert_eq!(r.replay()[0].1, 4);
        // The other stream keeps its own budget.
        r.push(Stream::Stderr, b"12");
        r.push(Stream::Stdout, b"ij");
        assert_eq!(
            text(&r),
            [
                (Stream::Stdout, "gh".to_string()),
                (Stream::Stderr, "12".to_string()),
                (Stream::Stdout, "ij".to_string())
            ]
        );
    }

    #[test]
    fn test_pieces_at_below_and_above_the_cap() {
        for (n, kept) in [(3usize, 3usize), (4, 4), (5, 4)] {
            let mut r = Ring::with_caps(1 << 20, 4);
            for _ in 0..n {
                r.push(Stream::Stdout, b"o");
                r.push(Stream::Stderr, b"e");
            }
            let pieces = r.replay();
            assert_eq!(pieces.len(), kept * 2, "{n}");
            assert_eq!(pieces[0].0, Stream::Stdout);
        }
    }

    #[test]
    fn test_a_big_output_keeps_exactly_the_newest_mebibyte() {
        let mut r = Ring::default();
        let mut all = Vec::new();
        for i in 0..100_000u32 {
            let line = format!("line {i:06}\n");
            all.extend_from_slice(line.as_bytes());
            r.push(Stream::Stdout, line.as_bytes());
        }
        let got: Vec<u8> = r
            .replay()
            .into_iter()
            .flat_map(|(_, _, d)| d.to_vec())
            .collect();
        assert!(all.len() > RING_BYTES);
        assert_eq!(got.len(), RING_BYTES);
        assert!(all.ends_with(&got));
        // Its first piece says where in the stream it starts: what was dropped.
        assert_eq!(r.replay()[0].1, (all.len() - RING_BYTES) as u64);
    }
}
