//! Background jobs' pieces that are not the loop: sealing a job's env values with its
//! own key, keeping them out of its log, the result-file patterns, and money as
//! decimal strings. The loop that runs jobs is `daemon::jobs`; the face that parses
//! and shapes them is `wbx::jobs`.

pub mod compute;
pub mod digest;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

pub use crate::store::jobs::{Sealed, JOB_KEY_BYTES};

/// What replaces an env value in the log.
pub const REDACTED: &[u8] = b"[REDACTED]";

/// Values shorter than this are not redacted: a one-letter value would blank every
/// occurrence of that letter and say what it was.
pub const MIN_REDACTED_BYTES: usize = 3;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Seals `env` under a fresh key: the key (kept apart from the job's record and
/// deleted when the job ends) and the sealed values.
///
/// # Errors
/// When the system's random source fails.
pub fn seal(env: &[(String, String)]) -> Result<([u8; JOB_KEY_BYTES], Sealed), String> {
    let rng = SystemRandom::new();
    let mut key = [0u8; JOB_KEY_BYTES];
    let mut nonce = [0u8; NONCE_LEN];
    rng.fill(&mut key)
        .and_then(|()| rng.fill(&mut nonce))
        .map_err(|_| "the system's random source failed".to_string())?;
    let sealing = LessSafeKey::new(
        UnboundKey::new(&CHACHA20_POLY1305, &key).map_err(|_| "bad key length".to_string())?,
    );
    let mut data = serde_json::to_vec(env).map_err(|e| e.to_string())?;
    sealing
        .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut data)
        .map_err(|_| "sealing failed".to_string())?;
    use base64::Engine as _;
    Ok((
        key,
        Sealed {
            nonce: hex(&nonce),
            data: base64::engine::general_purpose::STANDARD.encode(&data),
        },
    ))
}

/// Opens what [`seal`] sealed with `key`; `None` when it does not open (another key,
/// or edited).
pub fn open(key: &[u8; JOB_KEY_BYTES], sealed: &Sealed) -> Option<Vec<(String, String)>> {
    use base64::Engine as _;
    let nonce: [u8; NONCE_LEN] = unhex(&sealed.nonce)?.try_into().ok()?;
    let mut data = base64::engine::general_purpose::STANDARD
        .decode(&sealed.data)
        .ok()?;
    let opening = LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, key).ok()?);
    let plain = opening
        .open_in_place(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut data)
        .ok()?;
    serde_json::from_slice(plain).ok()
}

/// SHA-256 of env values as the receipt names them: of the JSON object of names to
/// values, names sorted, hex.
pub fn env_sha256(env: &[(String, String)]) -> String {
    let sorted: std::collections::BTreeMap<&str, &str> =
        env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let bytes = serde_json::to_vec(&sorted).unwrap_or_default();
    sha256_hex(&bytes)
}

/// SHA-256 of `bytes`, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

/// Replaces secret values in a stream as it passes, in one pass over the bytes however
/// many values there are (Aho-Corasick, leftmost-longest), holding back only as many
/// bytes as a value could still need to complete.
#[derive(Debug, Default)]
pub struct Redactor {
    finder: Option<aho_corasick::AhoCorasick>,
    longest: usize,
    pending: Vec<u8>,
}

impl Redactor {
    /// A redactor of `values` (those shorter than [`MIN_REDACTED_BYTES`] are left).
    pub fn new<'a>(values: impl IntoIterator<Item = &'a str>) -> Redactor {
        let mut secrets: Vec<&[u8]> = values
            .into_iter()
            .filter(|v| v.len() >= MIN_REDACTED_BYTES)
            .map(str::as_bytes)
            .collect();
        secrets.sort_unstable();
        secrets.dedup();
        let longest = secrets.iter().map(|s| s.len()).max().unwrap_or(0);
        let finder = (!secrets.is_empty())
            .then(|| {
                // Never a DFA, which the crate picks for a few values: its build is a
                // table of 256 entries per byte of the values (a 256 KiB value took 35 s
                // of the loop and hundreds of MiB, found by schemathesis); the NFA's is
                // linear in them.
                aho_corasick::AhoCorasick::builder()
                    .match_kind(aho_corasick::MatchKind::LeftmostLongest)
                    .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
                    .build(&secrets)
                    .ok()
            })
            .flatten();
        Redactor {
            finder,
            longest,
            pending: Vec::new(),
        }
    }

    /// Takes `data`; gives what can be written now.
    pub fn push(&mut self, data: &[u8]) -> Vec<u8> {
        if self.finder.is_none() {
            return data.to_vec();
        }
        self.pending.extend_from_slice(data);
        // Only a value starting at or after `safe` could still be incomplete.
        let safe = self.pending.len().saturating_sub(self.longest - 1);
        self.drain(safe)
    }

    /// The rest, at the stream's end.
    pub fn finish(&mut self) -> Vec<u8> {
        let n = self.pending.len();
        self.drain(n)
    }

    /// Writes out the pending bytes before `upto`: a value starting before it lies
    /// whole in `pending` (it is at most `longest` long), and is replaced whole.
    fn drain(&mut self, upto: usize) -> Vec<u8> {
        let Some(finder) = &self.finder else {
            return std::mem::take(&mut self.pending);
        };
        let mut out = Vec::with_capacity(upto + REDACTED.len());
        let mut i = 0;
        for m in finder.find_iter(&self.pending) {
            if m.start() >= upto {
                break;
            }
            out.extend_from_slice(&self.pending[i..m.start()]);
            out.extend_from_slice(REDACTED);
            i = m.end();
        }
        let end = upto.max(i);
        if i < end {
            out.extend_from_slice(&self.pending[i..end]);
        }
        self.pending.drain(..end);
        out
    }
}

/// One result-file pattern, relative to the job's working directory: `dir/` takes
/// the whole tree under `dir`; otherwise a glob over the path where `*` and `?` stay
/// within one path segment and a `**` segment stands for any number of directories
/// (`*.csv` is the working directory's own CSV files, `**/*.csv` every one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    segments: Vec<String>,
    tree: bool,
    /// What [`Pattern::base`] answers, worked out at parse.
    base_dir: String,
    base_depth: Option<usize>,
}

/// Longest pattern.
pub const MAX_PATTERN_BYTES: usize = 1024;
/// Work matching may do for one job's saving, in steps (one byte of a name compared,
/// or one cell of the segment table): hostile patterns (many `**`, many `*` in a
/// segment) against a deep tree cost at most this, wherever the matching runs.
pub const MATCH_BUDGET: u64 = 20_000_000;

impl Pattern {
    /// Parses a pattern.
    ///
    /// # Errors
    /// In words, when it is empty, absolute, climbs out with `..`, or holds a NUL.
    pub fn parse(s: &str) -> Result<Pattern, String> {
        if s.is_empty() || s.len() > MAX_PATTERN_BYTES || s.contains('\0') {
            return Err(format!(
                "{s:?}: a pattern is 1 to {MAX_PATTERN_BYTES} bytes, without NUL"
            ));
        }
        if s.starts_with('/') {
            return Err(format!(
                "{s:?}: patterns are relative to the working directory"
            ));
        }
        let tree = s.ends_with('/');
        let mut segments: Vec<String> = s
            .trim_end_matches('/')
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .map(str::to_string)
            .collect();
        // `**/**` is `**`.
        segments.dedup_by(|a, b| a == "**" && b == "**");
        if segments.iter().any(|p| p == "..") {
            return Err(format!("{s:?}: a pattern may not climb out with .."));
        }
        if segments.is_empty() && !tree {
            return Err(format!("{s:?}: names no file"));
        }
        let literal = segments
            .iter()
            .take_while(|p| !p.contains(['*', '?', '[']))
            .count();
        // The last literal segment may be the file itself: list its directory.
        let dir_len = if tree {
            literal
        } else {
            literal.min(segments.len().saturating_sub(1))
        };
        let rest = &segments[dir_len..];
        let base_depth = if tree || rest.iter().any(|p| p == "**") {
            None
        } else {
            Some(rest.len())
        };
        Ok(Pattern {
            base_dir: segments[..dir_len].join("/"),
            base_depth,
            segments,
            tree,
        })
    }

    /// The directory (relative, `""` for the working directory) under which every match
    /// lies, and how many levels below it a match can be (`None`: any).
    pub fn base(&self) -> (&str, Option<usize>) {
        (&self.base_dir, self.base_depth)
    }

    /// Whether relative path `path` matches, however long that takes (tests only: the
    /// daemon always matches within a budget).
    #[cfg(test)]
    fn matches(&self, path: &str) -> bool {
        let mut unbounded = u64::MAX;
        self.matches_within(path, &mut unbounded).unwrap_or(false)
    }

    /// Whether relative path `path` matches, within `budget` steps (taken from it);
    /// `None` when it ran out. A path outside the pattern's base directory costs
    /// nothing.
    pub fn matches_within(&self, path: &str, budget: &mut u64) -> Option<bool> {
        let b = &self.base_dir;
        let under = b.is_empty()
            || path
                .strip_prefix(b.as_str())
                .is_some_and(|r| r.starts_with('/'));
        if !under {
            return Some(false);
        }
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        if self.tree {
            // `dir/` is everything below what `dir` matches: `dir/**/*`.
            let mut pat: Vec<&str> = self.segments.iter().map(String::as_str).collect();
            pat.extend(["**", "*"]);
            return segments_match(&pat, &parts, budget);
        }
        segments_match(&self.segments, &parts, budget)
    }
}

/// Takes `n` steps from `budget`; `None` (and nothing left) when it has fewer.
fn spend(budget: &mut u64, n: u64) -> Option<()> {
    match budget.checked_sub(n) {
        Some(b) => {
            *budget = b;
            Some(())
        }
        None => {
            *budget = 0;
            None
        }
    }
}

/// Whether `parts` match segments `pat`, by a table of which suffix of the pattern
/// matches which suffix of the path (segments × parts cells, each name compared at
/// most once per segment): a `**` tries every split without trying them again.
fn segments_match<S: AsRef<str>>(pat: &[S], parts: &[&str], budget: &mut u64) -> Option<bool> {
    let n = parts.len();
    // next[j]: the segments after this one match parts[j..].
    let mut next = vec![false; n + 1];
    next[n] = true;
    let mut cur = vec![false; n + 1];
    for p in pat.iter().rev() {
        let p = p.as_ref();
        spend(budget, n as u64 + 1)?;
        if p == "**" {
            cur[n] = next[n];
            for j in (0..n).rev() {
                cur[j] = next[j] || cur[j + 1];
            }
        } else {
            cur[n] = false;
            for j in 0..n {
                cur[j] = next[j + 1] && glob(p.as_bytes(), parts[j].as_bytes(), budget)?;
            }
        }
        std::mem::swap(&mut next, &mut cur);
    }
    Some(next[0])
}

/// `*` and `?` within one segment (a leading `.` included: hidden files are files),
/// within `budget` steps.
fn glob(p: &[u8], s: &[u8], budget: &mut u64) -> Option<bool> {
    let (mut pi, mut si) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while si < s.len() {
        spend(budget, 1)?;
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return Some(false);
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    Some(pi == p.len())
}

/// An amount of money in billionths of the currency unit: prices per second are
/// tiny, and money is never a float.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Money(pub i128);

/// Billionths in one unit.
const NANO: i128 = 1_000_000_000;

impl Money {
    /// Parses a non-negative decimal string (`"0.10"`, `"5"`), at most 9 decimals.
    ///
    /// # Errors
    /// In words.
    pub fn parse(s: &str) -> Result<Money, String> {
        let bad = || format!("{s:?} is not an amount like \"0.10\"");
        let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
        if whole.is_empty()
            || whole.len() > 15
            || frac.len() > 9
            || !whole.bytes().all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
            || (s.contains('.') && frac.is_empty())
        {
            return Err(bad());
        }
        let w: i128 = whole.parse().map_err(|_| bad())?;
        let f: i128 = format!("{frac:0<9}").parse().map_err(|_| bad())?;
        Ok(Money(w * NANO + f))
    }

    /// `price` per unit for `millis` of a thousandth unit each (per-second prices times
    /// milliseconds), rounded up to a billionth; saturating, never wrapping (the
    /// largest price a setting can give, for a job's longest worst case, fits).
    pub fn per_ms(price: Money, millis: u64, scale: u64) -> Money {
        let n = price
            .0
            .saturating_mul(i128::from(millis))
            .saturating_mul(i128::from(scale));
        let d = 1000 * 1000;
        Money(n.saturating_add(d - 1) / d)
    }

    /// Every decimal that is there, at least six (`0.000002`, `0.0000015`): how a price
    /// is shown, never rounded.
    pub fn display_price(self) -> String {
        let s = format!("{}.{:09}", self.0 / NANO, self.0 % NANO);
        let keep = s.trim_end_matches('0').len().max(s.len() - 3);
        s[..keep].to_string()
    }

    /// Six decimals, as the document writes amounts (`0.000312`), rounded up.
    pub fn display(self) -> String {
        let micro = (self.0 + 999) / 1000;
        format!("{}.{:06}", micro / 1_000_000, micro % 1_000_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_largest_price_for_the_longest_worst_case_neither_wraps_nor_panics() {
        let max = Money::parse("999999999999999.999999999").unwrap();
        // Five attempts of a day and a minute, at 8 GiB.
        let ms = 5 * (86_400 + 60) * 1000;
        let m = Money::per_ms(max, ms, 8589);
        assert!(m.0 > 0 && m.0 < i128::MAX, "{m:?}");
        assert_eq!(m.0, (max.0 * i128::from(ms) * 8589 + 999_999) / 1_000_000);
        // Past what any setting gives: saturated, not wrapped.
        assert_eq!(
            Money::per_ms(Money(i128::MAX / 2), u64::MAX, u64::MAX).0,
            i128::MAX / 1_000_000
        );
    }

    #[test]
    fn test_a_price_shows_every_decimal_and_at_least_six() {
        for (v, shown) in [
            ("0", "0.000000"),
            ("0.000002", "0.000002"),
            ("0.0000015", "0.0000015"),
            ("0.000000001", "0.000000001"),
            ("12.5", "12.500000"),
        ] {
            assert_eq!(Money::parse(v).unwrap().display_price(), shown);
        }
    }

    #[test]
    fn test_sealed_values_open_only_with_their_key() {
        let env = vec![("TOKEN".to_string(), "s3cret".to_string())];
        let (key, sealed) = seal(&env).unwrap();
        assert!(!sealed.data.contains("s3cret"));
        assert_eq!(open(&key, &sealed).unwrap(), env);
        let mut other = key;
        other[0] ^= 1;
        assert!(open(&other, &sealed).is_none());
        let mut edited = sealed.clone();
        edited.data.replace_range(
            0..1,
            if edited.data.starts_with('A') {
                "B"
            } else {
                "A"
            },
        );
        assert!(open(&key, &edited).is_none());
    }

    #[test]
    fn test_redaction_catches_values_split_across_chunks() {
        let mut r = Redactor::new(["hunter22", "hunter2", "ab"]);
        let mut out = Vec::new();
        for part in [&b"pass=hun"[..], b"ter22 and hunter2", b"!ab\n"] {
            out.extend(r.push(part));
        }
        out.extend(r.finish());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "pass=[REDACTED] and [REDACTED]!ab\n"
        );
        let mut none = Redactor::new([]);
        assert_eq!(none.push(b"x"), b"x");
        // Many long values that share a prefix: one pass, not one comparison per value
        // per byte (a tenant could otherwise stall the loop with its output).
        let values: Vec<String> = (0..128)
            .map(|i| format!("{}{i:03}", "A".repeat(32_000)))
            .collect();
        let mut r = Redactor::new(values.iter().map(String::as_str));
        // (The value-by-value comparison this replaced took hours for these 4 MiB.)
        let mut n = 0;
        for _ in 0..4 {
            n += r.push(&vec![b'A'; 1 << 20]).len();
        }
        n += r.finish().len();
        assert_eq!(n, 4 << 20);
        let mut r = Redactor::new(values.iter().map(String::as_str));
        let mut out = r.push(format!("x{}y", values[77]).as_bytes());
        out.extend(r.finish());
        assert_eq!(out, b"x[REDACTED]y");
        // One value as long as a job's whole env may be (256 KiB): its matcher is linear
        // in it, not a table of 256 entries per byte (a DFA: over 256 MiB, built in
        // tens of seconds on the loop).
        let value: String = (0..256 * 1024)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        let mut r = Redactor::new([value.as_str()]);
        let used = r.finder.as_ref().unwrap().memory_usage();
        assert!(
            used < 64 * value.len(),
            "{used} bytes for a {} byte value",
            value.len()
        );
        let mut out = r.push(format!("<{value}>").as_bytes());
        out.extend(r.finish());
        assert_eq!(out, b"<[REDACTED]>");
    }

    #[test]
    fn test_patterns() {
        let p = |s: &str| Pattern::parse(s).unwrap();
        assert!(p("output/").matches("output/a/b.csv"));
        assert!(!p("output/").matches("output"));
        assert!(!p("output/").matches("outputs/a"));
        assert!(p("*.csv").matches("r.csv"));
        assert!(!p("*.csv").matches("d/r.csv"));
        assert!(p("**/*.csv").matches("d/e/r.csv"));
        assert!(p("**/*.csv").matches("r.csv"));
        assert!(p("report.txt").matches("report.txt"));
        assert!(p("./a/?.txt").matches("a/b.txt"));
        assert_eq!(p("output/").base(), ("output", None));
        assert_eq!(p("a/b/*.txt").base(), ("a/b", Some(1)));
        assert_eq!(p("report.txt").base(), ("", Some(1)));
        assert_eq!(p("**/x").base(), ("", None));
        assert!(p("a/**/**/b").matches("a/b") && p("a/**/**/b").matches("a/x/y/b"));
        assert_eq!(p("a/**/**/b"), p("a/**/b"));
        assert!(!p("a/**/b").matches("a/x/c"));
        // A tree under a `**`: everything below what the pattern's directories match.
        assert!(p("a/**/b/").matches("a/b/f") && p("a/**/b/").matches("a/x/b/f/g"));
        assert!(!p("a/**/b/").matches("a/b") && !p("a/**/b/").matches("c/b/f"));
        for bad in ["", "/etc/passwd", "../x", "a/../../b", "."] {
            assert!(Pattern::parse(bad).is_err(), "{bad}");
        }
    }

    /// Hostile patterns cost a bounded amount of work: hundreds of `**` (one, once
    /// collapsed) or alternating with a literal against a deep path, and a segment of
    /// many stars against a long name, finish within the budget or say they ran out.
    #[test]
    fn test_hostile_patterns_are_bounded() {
        let deep = vec!["a"; 2000].join("/");
        let stars = format!("{}zz", "**/".repeat(340));
        let p = Pattern::parse(&stars).unwrap();
        let mut budget = MATCH_BUDGET;
        assert_eq!(p.matches_within(&deep, &mut budget), Some(false));
        assert!(budget > MATCH_BUDGET / 2, "{budget}");
        assert_eq!(
            p.matches_within(&format!("{deep}/zz"), &mut budget),
            Some(true)
        );
        // `**` and `a` alternating (nothing to collapse): a table, not a search.
        let alt = format!("{}b", "**/a/".repeat(200));
        let p = Pattern::parse(&alt).unwrap();
        let mut budget = MATCH_BUDGET;
        let r = p.matches_within(&deep, &mut budget);
        assert_eq!(r, Some(false));
        // Stars within a segment against a long name.
        let p = Pattern::parse(&format!("{}b", "*a".repeat(500))).unwrap();
        let name = "a".repeat(255);
        let mut budget = MATCH_BUDGET;
        let mut n = 0;
        while p.matches_within(&name, &mut budget).is_some() {
            n += 1;
            assert!(n < 10_000_000, "the budget never ran out");
        }
        assert_eq!(budget, 0);
        // Runs that fit: the same answer as without a budget.
        let mut budget = MATCH_BUDGET;
        assert_eq!(
            Pattern::parse("**/*.csv")
                .unwrap()
                .matches_within("d/e/r.csv", &mut budget),
            Some(true)
        );
    }

    #[test]
    fn test_money() {
        assert_eq!(Money::parse("0.10").unwrap(), Money(100_000_000));
        assert_eq!(Money::parse("5").unwrap(), Money(5 * NANO));
        for bad in ["", "-1", "1.", ".5", "1e3", "0.1234567891", "1,5"] {
            assert!(Money::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Money(312_000).display(), "0.000312");
        assert_eq!(Money(1).display(), "0.000001");
        assert_eq!(Money(0).display(), "0.000000");
        // 0.00001 per vCPU-second, 2 vCPUs, 1.5 s.
        let price = Money::parse("0.00001").unwrap();
        assert_eq!(Money::per_ms(price, 1500, 2000).display(), "0.000030");
    }
}
