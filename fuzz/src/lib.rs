//! Helpers shared by the fuzz targets: deterministic, input-derived split points.
//!
//! Every choice a target makes (where to split, how big each read is) comes from a PRNG
//! seeded with a hash of the input, so a crashing input replays exactly.

/// splitmix64 seeded with FNV-1a of the input.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `data` (same data, same sequence).
    pub fn new(data: &[u8]) -> Rng {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in data {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        Rng(h ^ data.len() as u64)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=n`.
    pub fn upto(&mut self, n: usize) -> usize {
        (self.next_u64() % (n as u64 + 1)) as usize
    }
}

/// `count` sorted split points in `0..=len` (duplicates allowed: an empty read).
pub fn split_points(rng: &mut Rng, len: usize, count: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..count).map(|_| rng.upto(len)).collect();
    v.sort_unstable();
    v
}

/// Cuts `data` into consecutive pieces of 1..=max_piece bytes (sizes from `rng`).
pub fn pieces<'a>(rng: &mut Rng, data: &'a [u8], max_piece: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < data.len() {
        let n = 1 + rng.upto(max_piece - 1);
        let end = (i + n).min(data.len());
        out.push(&data[i..end]);
        i = end;
    }
    out
}
