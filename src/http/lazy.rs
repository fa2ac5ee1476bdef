//! A JSON body encoded as the socket drains (catalogue H12).
//!
//! A run's result holds up to `outputBytes` of stdout and of stderr, and a string of
//! control bytes grows six-fold when escaped (`\u0001`): serialised whole, one response
//! could queue ~3.5 MB on a connection whose client never reads. Instead the large
//! strings are taken out of the value before it is serialised (each leaves a
//! placeholder with a per-body random nonce, which no content can forge), the small
//! rest is serialised at once, and the strings are escaped a window at a time, as the
//! write buffer drains. The length is known in advance (`Content-Length`), and the
//! escaping is byte for byte serde_json's. A connection then holds the raw strings and
//! at most one window of encoded bytes.

use serde::Serialize;
use std::collections::VecDeque;

enum Part {
    Raw(Vec<u8>, usize),
    Str(String, usize),
}

/// Strings taken out of a value, to be written lazily.
pub struct Deferred {
    nonce: String,
    strings: Vec<String>,
}

impl Default for Deferred {
    fn default() -> Deferred {
        Deferred::new()
    }
}

impl Deferred {
    /// A fresh set with its own random nonce.
    pub fn new() -> Deferred {
        let mut b = [0u8; 16];
        if crate::sys::fsat::getrandom(&mut b).is_err() {
            // Without randomness the placeholder could in principle be forged by the
            // content; fall back to the clock, which a program cannot predict exactly.
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            b = t.to_le_bytes();
        }
        Deferred {
            nonce: b.iter().map(|x| format!("{x:02x}")).collect(),
            strings: Vec::new(),
        }
    }

    fn placeholder(&self, i: usize) -> String {
        format!("\u{1}isobox-{}-{i}\u{1}", self.nonce)
    }

    /// Takes `s` out of the value, leaving its placeholder.
    pub fn take(&mut self, s: &mut String) {
        let ph = self.placeholder(self.strings.len());
        self.strings.push(std::mem::replace(s, ph));
    }

    /// Serialises `value` (whose deferred strings are placeholders) into a lazy body.
    pub fn body<T: Serialize>(self, value: &T) -> LazyBody {
        let skeleton = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
        // Where each placeholder stands (as serde_json wrote it, quotes included).
        let mut at: Vec<(usize, usize, String)> = Vec::new();
        for (i, s) in self.strings.into_iter().enumerate() {
            let needle = serde_json::to_vec(&format!("\u{1}isobox-{}-{i}\u{1}", self.nonce))
                .unwrap_or_default();
            if let Some(p) = find(&skeleton, &needle) {
                at.push((p, needle.len(), s));
            }
        }
        at.sort_by_key(|(p, _, _)| *p);
        let mut parts = VecDeque::new();
        let mut len = 0;
        let mut from = 0;
        for (p, n, s) in at {
            parts.push_back(Part::Raw(skeleton[from..p].to_vec(), 0));
            parts.push_back(Part::Raw(b"\"".to_vec(), 0));
            len += p - from + 2 + escaped_len(&s);
            parts.push_back(Part::Str(s, 0));
            parts.push_back(Part::Raw(b"\"".to_vec(), 0));
            from = p + n;
        }
        len += skeleton.len() - from;
        parts.push_back(Part::Raw(skeleton[from..].to_vec(), 0));
        LazyBody { parts, len }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A body written in windows.
pub struct LazyBody {
    parts: VecDeque<Part>,
    len: usize,
}

impl LazyBody {
    /// Its total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never, for a JSON value).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The same body between `prefix` and `suffix` (e.g. an SSE event in a chunk).
    pub fn wrapped(mut self, prefix: Vec<u8>, suffix: Vec<u8>) -> LazyBody {
        self.len += prefix.len() + suffix.len();
        self.parts.push_front(Part::Raw(prefix, 0));
        self.parts.push_back(Part::Raw(suffix, 0));
        self
    }

    /// Whether everything has been written out.
    pub fn done(&self) -> bool {
        self.parts.is_empty()
    }

    /// Appends to `out` until it holds at least `upto` bytes or the body is done.
    pub fn fill(&mut self, out: &mut Vec<u8>, upto: usize) {
        while out.len() < upto {
            let Some(part) = self.parts.front_mut() else {
                return;
            };
            let finished = match part {
                Part::Raw(b, pos) => {
                    let n = (upto - out.len()).min(b.len() - *pos);
                    out.extend_from_slice(&b[*pos..*pos + n]);
                    *pos += n;
                    *pos == b.len()
                }
                Part::Str(s, pos) => {
                    let bytes = s.as_bytes();
                    while *pos < bytes.len() && out.len() < upto {
                        escape_byte(out, bytes[*pos]);
                        *pos += 1;
                    }
                    *pos == bytes.len()
                }
            };
            if finished {
                self.parts.pop_front();
            }
        }
    }
}

/// serde_json's escape of one byte of a UTF-8 string (bytes of multi-byte characters
/// are all >= 0x80 and pass unchanged, so a string may be cut at any byte).
fn escape_byte(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    match b {
        b'"' => out.extend_from_slice(b"\\\""),
        b'\\' => out.extend_from_slice(b"\\\\"),
        0x08 => out.extend_from_slice(b"\\b"),
        0x0c => out.extend_from_slice(b"\\f"),
        b'\n' => out.extend_from_slice(b"\\n"),
        b'\r' => out.extend_from_slice(b"\\r"),
        b'\t' => out.extend_from_slice(b"\\t"),
        0..=0x1f => out.extend_from_slice(&[
            b'\\',
            b'u',
            b'0',
            b'0',
            HEX[usize::from(b >> 4)],
            HEX[usize::from(b & 15)],
        ]),
        _ => out.push(b),
    }
}

fn escaped_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Clone)]
    struct Body {
        a: String,
        n: u32,
        inner: Inner,
        tail: Vec<String>,
    }
    #[derive(Serialize, Clone)]
    struct Inner {
        out: String,
        err: String,
    }

    fn all_bytes_string(seed: u32, len: usize) -> String {
        // Every control byte, quotes, backslashes, ASCII and multi-byte characters.
        let alphabet: Vec<char> = (0u8..0x80)
            .map(char::from)
            .chain(['é', '€', '𝄞', '\u{7f}', '\u{2028}'])
            .collect();
        let mut x = seed;
        (0..len)
            .map(|_| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
                alphabet[(x >> 8) as usize % alphabet.len()]
            })
            .collect()
    }

    #[test]
    fn lazy_body_is_byte_for_byte_serde_json_in_any_window() {
        for seed in 0..20 {
            let body = Body {
                a: "lang".into(),
                n: seed,
                inner: Inner {
                    out: all_bytes_string(seed, 3000),
                    err: all_bytes_string(seed + 100, 500),
                },
                tail: vec![all_bytes_string(seed + 7, 40), String::new()],
            };
            let want = serde_json::to_vec(&body).unwrap();
            for window in [1usize, 7, 64, 4096, 1 << 20] {
                let mut b = body.clone();
                let mut d = Deferred::new();
                d.take(&mut b.inner.out);
                d.take(&mut b.inner.err);
                d.take(&mut b.tail[1]);
                let mut lazy = d.body(&b);
                assert_eq!(lazy.len(), want.len(), "seed {seed}");
                let mut got = Vec::new();
                while !lazy.done() {
                    let before = got.len();
                    lazy.fill(&mut got, before + window);
                    assert!(got.len() - before <= window + 5, "window {window} overshot");
                    assert!(got.len() > before || lazy.done());
                }
                assert_eq!(got, want, "seed {seed} window {window}");
            }
        }
    }

    #[test]
    fn content_cannot_forge_a_placeholder() {
        let mut b = Body {
            a: String::new(),
            n: 0,
            inner: Inner {
                out: "x".into(),
                err: String::new(),
            },
            tail: vec![],
        };
        let mut d = Deferred::new();
        // The same text as a placeholder, but not with this body's nonce.
        b.a = "\u{1}isobox-00000000000000000000000000000000-0\u{1}".into();
        d.take(&mut b.inner.out);
        let mut lazy = d.body(&b);
        let mut got = Vec::new();
        lazy.fill(&mut got, usize::MAX);
        let v: serde_json::Value = serde_json::from_slice(&got).unwrap();
        assert_eq!(v["inner"]["out"], "x");
        assert_eq!(
            v["a"],
            "\u{1}isobox-00000000000000000000000000000000-0\u{1}"
        );
    }
}
