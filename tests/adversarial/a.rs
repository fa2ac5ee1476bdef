//! A: auth, rate limiting, global cap, secrets (tests/ADVERSARIAL.md, section A).

use crate::common::session::Session;
use crate::common::{read_response, sha256_hex, Resp};
use crate::harness::{leaky, run_of, Adv, PY};
use crate::host::{contains, random_hex, rss_bytes};
use crate::wire::{curl_from, raw_send};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// A1: missing and malformed credentials are 401 with `WWW-Authenticate: Bearer` on
/// both protected routes, and spawn no sandbox. (Documented acceptances, not failures:
/// `bearer <key>` — the scheme is case-insensitive, RFC 6750 — and a key followed by
/// optional whitespace, which RFC 9110 §5.5 strips; a NUL inside is a 400.)
#[test]
fn test_a1_bad_credentials_401_and_no_sandbox() {
    let a = Adv::start("a1", &[]);
    let key = a.key.clone();
    let runs0 = a.counter("runsTotal");
    let body = json!({"language": PY, "network": false, "code": "print(7)"}).to_string();
    let cases: Vec<Vec<(String, String)>> = vec![
        vec![],
        vec![("Authorization".into(), "Bearer ".into())],
        vec![("Authorization".into(), format!("Bearer {key} x"))],
        vec![("Authorization".into(), format!("Bearer  {key}"))],
        vec![("Authorization".into(), key.clone())],
        vec![("Authorization".into(), format!("Basic {key}"))],
        vec![("Authorization".into(), format!("Token {key}"))],
        vec![("X-API-Key".into(), String::new())],
        vec![("X-API-Key".into(), key[..key.len() - 1].to_string())],
        vec![("X-API-Key".into(), format!("{key}x"))],
        vec![("X-API-Key".into(), key.to_uppercase())],
        vec![("X-API-Key".into(), format!("Bearer {key}"))],
    ];
    for h in &cases {
        let hs: Vec<(&str, &str)> = h.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        for (m, p, b) in [
            ("POST", "/execute", body.as_bytes()),
            ("GET", "/runtimes", &b""[..]),
        ] {
            let r = a.req_raw(m, p, &hs, b);
            a.expect(
                r.status == 401
                    && r.header("www-authenticate") == Some("Bearer")
                    && r.json() == json!({"error": "unauthorized"}),
                || {
                    format!(
                        "A1 {m} {p} with {h:?}: {} {:?} {}",
                        r.status,
                        r.header("www-authenticate"),
                        r.text()
                    )
                },
            );
        }
    }
    let nul = format!("{key}\0");
    let r = a.req_raw(
        "POST",
        "/execute",
        &[("X-API-Key", nul.as_str())],
        body.as_bytes(),
    );
    a.expect(r.status == 400 || r.status == 401, || {
        format!("A1 key+NUL: {}", r.status)
    });
    // The documented acceptances.
    for (h, v) in [
        ("Authorization", format!("bearer {key}")),
        ("X-API-Key", format!("{key} ")),
    ] {
        let r = a.req_raw("GET", "/runtimes", &[(h, v.as_str())], b"");
        a.expect(r.status == 200, || {
            format!("A1 {h}: {v:?} refused: {}", r.status)
        });
    }
    a.expect(a.counter("runsTotal") == runs0, || {
        "A1: a refused request spawned a sandbox".into()
    });
    a.finish();
}

// ---------------------------------------------------------------------------------------
// A2's statistics: a seeded generator, Spearman's rank correlation.
// ---------------------------------------------------------------------------------------

/// splitmix64: the test's random numbers (seeded from /dev/urandom, the seed printed).
struct Rng(u64);

impl Rng {
    fn seeded() -> Rng {
        Rng(u64::from_str_radix(&random_hex(8), 16).unwrap())
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (the modulo bias of a 64-bit draw is far below anything here).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// Ranks from 1; tied values share the mean of the ranks they span.
fn average_ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[a].total_cmp(&v[b]));
    let mut ranks = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let mean = (i + j) as f64 / 2.0 + 1.0;
        for &t in &idx[i..=j] {
            ranks[t] = mean;
        }
        i = j + 1;
    }
    ranks
}

/// Pearson's correlation; NaN when either series is constant (so `|ρ| < x` fails).
fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    sxy / (sxx * syy).sqrt()
}

/// Spearman's ρ: Pearson's correlation of the average ranks (the tie-corrected form).
fn spearman(x: &[f64], y: &[f64]) -> f64 {
    assert_eq!(x.len(), y.len());
    pearson(&average_ranks(x), &average_ranks(y))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The statistic must be able to fail: exact values (one with ties, checked against
/// scipy.stats.spearmanr), ±1 for monotone series, ≈ 0 for a shuffled one.
fn check_spearman(rng: &mut Rng) {
    let r = spearman(&[1.0, 2.0, 2.0, 3.0], &[1.0, 3.0, 2.0, 4.0]);
    assert!((r - 0.948_683_298_050_513_8).abs() < 1e-12, "ties: {r}");
    let x: Vec<f64> = (0..10_000).map(f64::from).collect();
    let cubes: Vec<f64> = x.iter().map(|v| v * v * v).collect();
    let back: Vec<f64> = x.iter().rev().copied().collect();
    assert!((spearman(&x, &cubes) - 1.0).abs() < 1e-9, "monotone");
    assert!((spearman(&x, &back) + 1.0).abs() < 1e-9, "reversed");
    // 41 tied groups (as many as A2's prefix lengths) against a monotone series.
    let grouped: Vec<f64> = x.iter().map(|v| (v / 244.0).floor()).collect();
    assert!(spearman(&grouped, &x) > 0.99, "tied groups");
    let mut shuffled = x.clone();
    rng.shuffle(&mut shuffled);
    let r = spearman(&x, &shuffled);
    // Under independence ρ is ~N(0, 1/√9999): |ρ| ≥ 0.05 is a 5σ event.
    assert!(r.abs() < 0.05, "shuffled: {r}");
    assert!(spearman(&x, &[1.0; 10_000]).is_nan(), "constant");
    // Within lengths: a cost that depends only on the length (in level and in spread),
    // with `k` tied to the length, is no trend; an order inside each length is one.
    let lens: Vec<usize> = (0..10_000).map(|i| 1 + i % 40).collect();
    let ks: Vec<f64> = lens.iter().map(|&l| rng.below(l + 1) as f64).collect();
    let by_len: Vec<f64> = lens
        .iter()
        .map(|&l| 1000.0 * l as f64 + (l as f64) * rng.below(1000) as f64)
        .collect();
    assert!(spearman(&ks, &by_len) > 0.3, "the confound is there");
    let r = rho_within_lengths(&ks, &by_len, &lens);
    assert!(r.abs() < 0.05, "a length cost: {r}");
    let ordered: Vec<f64> = ks
        .iter()
        .zip(&lens)
        .map(|(k, &l)| 1e6 * l as f64 - k)
        .collect();
    let r = rho_within_lengths(&ks, &ordered, &lens);
    assert!(r < -0.9, "an order within lengths: {r}");
}

/// A2's wrong keys for `key`: for each, `k` leading bytes shared with the key, then a
/// differing byte, then random bytes to a total length `len`. Half have the key's own
/// length (where a length-first comparison would go on to compare bytes), the others a
/// length uniform in 1..=2·len(key); `k` is uniform in 0..=min(len, len(key)), never
/// the key itself. Returns (key, k, len).
fn prefix_keys(key: &str, n: usize, rng: &mut Rng) -> Vec<(String, usize, usize)> {
    let alphabet = b"0123456789abcdefghijklmnopqrstuvwxyz-";
    let real = key.as_bytes();
    let kl = real.len();
    (0..n)
        .map(|_| {
            let len = if rng.below(2) == 0 {
                kl
            } else {
                1 + rng.below(2 * kl)
            };
            let k = rng.below(len.min(kl) + 1 - usize::from(len == kl));
            // One allocation of exactly `len` bytes: a buffer grown from `k` bytes would
            // sit in a size class (so an alignment) that depends on `k`, and reading it
            // would then cost what its placement costs — a trend in `k` from the test.
            let mut b = Vec::with_capacity(len);
            b.extend_from_slice(&real[..k]);
            while b.len() < len {
                let c = alphabet[rng.below(alphabet.len())];
                if b.len() == k && b.len() < kl && c == real[k] {
                    continue;
                }
                b.push(c);
            }
            (String::from_utf8(b).unwrap(), k, len)
        })
        .collect()
}

/// Spearman's ρ between `k` and the latency *within each key length*, pooled: in each
/// group of one length, both series become ranks centred on the group's mean and scaled
/// by its size, and ρ is the correlation of those pooled quantile deviations. The
/// attacker picks the length, so a length-dependent cost (SHA-256 blocks, bytes parsed)
/// is no leak — and `k` depends on the length (a key cannot share more bytes than it
/// has), so any difference between lengths (in the median, and as a CI run showed, in
/// the spread or skew of the jitter) would otherwise show as a trend in `k`. Only an
/// order within one length can: that is what a prefix comparison produces. Under
/// independence ρ is ~N(0, 1/√N), as for plain Spearman.
fn rho_within_lengths(ks: &[f64], lat: &[f64], lens: &[usize]) -> f64 {
    let mut by_len: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (i, &l) in lens.iter().enumerate() {
        by_len.entry(l).or_default().push(i);
    }
    let (mut x, mut y) = (Vec::with_capacity(ks.len()), Vec::with_capacity(ks.len()));
    for idx in by_len.values().filter(|g| g.len() >= 2) {
        let n = idx.len() as f64;
        let centre = (n + 1.0) / 2.0;
        let rk = average_ranks(&idx.iter().map(|&i| ks[i]).collect::<Vec<_>>());
        let rt = average_ranks(&idx.iter().map(|&i| lat[i]).collect::<Vec<_>>());
        x.extend(rk.iter().map(|r| (r - centre) / n));
        y.extend(rt.iter().map(|r| (r - centre) / n));
    }
    pearson(&x, &y)
}

/// What the design can see: the smallest injected leak of `d` ns per shared byte (added
/// to the measured latencies) that pushes ρ to 0.05 — the test's sensitivity.
fn detectable_leak_ns(ks: &[f64], lat: &[f64], lens: &[usize]) -> f64 {
    let mut d = 0.001;
    while d < 1e7 {
        let y: Vec<f64> = lat.iter().zip(ks).map(|(t, k)| t + d * k).collect();
        if rho_within_lengths(ks, &y, lens) >= 0.05 {
            return d;
        }
        d *= 1.25;
    }
    f64::INFINITY
}

/// Times `f` on every key in-process: 16 calls a sample, `reps` samples a key, each
/// round in a fresh random order; returns each key's median time per call (ns). Every
/// key must be refused.
fn time_calls(keys: &[&str], reps: usize, rng: &mut Rng, f: impl Fn(&str) -> bool) -> Vec<f64> {
    let mut samples: Vec<Vec<f64>> = keys.iter().map(|_| Vec::with_capacity(reps)).collect();
    for _ in 0..reps {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        rng.shuffle(&mut order);
        for i in order {
            let k = std::hint::black_box(keys[i]);
            let t = Instant::now();
            for _ in 0..16 {
                assert!(!std::hint::black_box(f(k)), "a wrong key was accepted: {k}");
            }
            samples[i].push(t.elapsed().as_nanos() as f64 / 16.0);
        }
    }
    samples.iter_mut().map(|v| median(v)).collect()
}

/// A2: 10,000 wrong keys sharing 0…len(key) leading bytes with the configured key, at
/// varied lengths, on `/runtimes` (key-checked, not rate limited) over one keep-alive
/// loopback connection. Every key is sent 5 times, each round in a fresh random order
/// (so drift and neighbours' load cannot line up with `k`); a key's latency is the
/// median of its 5 (request written → whole response read). Every answer is 401; the
/// Spearman correlation between `k` and the latency within each length (see
/// `rho_within_lengths`) is |ρ| < 0.05. The same criterion holds for
/// `isobox::admission::keys::find` timed in-process. The statistic is checked to be
/// able to fail: exact values, ±1 for monotone series, a leak the size of the measured
/// jitter injected into the measured data is detected, and an early-exit byte-by-byte
/// comparison timed in-process the same way fails the criterion.
#[test]
fn test_a2_key_check_latency_has_no_prefix_trend() {
    const N: usize = 10_000;
    const REPS: usize = 5;
    let mut rng = Rng::seeded();
    eprintln!("A2: seed {:#x}", rng.0);
    check_spearman(&mut rng);
    let a = Adv::start("a2", &[]);
    let runs0 = a.counter("runsTotal");
    let keys = prefix_keys(&a.key, N, &mut rng);
    for (k, ..) in keys.iter().filter(|(k, ..)| k.len() >= 16).take(20) {
        a.add_secret(k);
    }
    let ks: Vec<f64> = keys.iter().map(|&(_, k, _)| k as f64).collect();
    let lens: Vec<usize> = keys.iter().map(|&(_, _, l)| l).collect();
    let reqs: Vec<Vec<u8>> = keys
        .iter()
        .map(|(k, ..)| {
            format!("GET /runtimes HTTP/1.1\r\nHost: x\r\nX-API-Key: {k}\r\n\r\n").into_bytes()
        })
        .collect();
    let s = TcpStream::connect(a.addr()).unwrap();
    s.set_nodelay(true).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut send = |req: &[u8]| -> (Duration, Resp) {
        let t0 = Instant::now();
        w.write_all(req).unwrap();
        let resp = read_response(&mut r, false).expect("A2: no response");
        (t0.elapsed(), resp)
    };
    for req in reqs.iter().take(2000) {
        send(req); // warm-up: connection, caches, the CPU's frequency
    }
    let t0 = Instant::now();
    let mut samples: Vec<Vec<f64>> = (0..N).map(|_| Vec::with_capacity(REPS)).collect();
    let mut bad = Vec::new();
    for _ in 0..REPS {
        let mut order: Vec<usize> = (0..N).collect();
        rng.shuffle(&mut order);
        for i in order {
            let (took, resp) = send(&reqs[i]);
            samples[i].push(took.as_nanos() as f64);
            if resp.status != 401 || resp.header("www-authenticate").is_none() {
                bad.push(format!("{} {}", resp.status, resp.text()));
            }
            a.scan(&resp.body, "A2 request");
        }
    }
    let wire_took = t0.elapsed();
    a.expect(bad.is_empty(), || {
        format!(
            "A2: {} of {} answers not 401 + WWW-Authenticate, e.g. {:?}",
            bad.len(),
            N * REPS,
            bad.first()
        )
    });
    let lat: Vec<f64> = samples.iter_mut().map(|v| median(v)).collect();
    let rho = rho_within_lengths(&ks, &lat, &lens);
    let raw = spearman(&ks, &lat);
    let same: Vec<usize> = (0..N).filter(|&i| lens[i] == a.key.len()).collect();
    let rho_same = spearman(
        &same.iter().map(|&i| ks[i]).collect::<Vec<_>>(),
        &same.iter().map(|&i| lat[i]).collect::<Vec<_>>(),
    );
    let mut sorted = lat.clone();
    let med = median(&mut sorted);
    let (p25, p75) = (sorted[N / 4], sorted[3 * N / 4]);
    let leak = detectable_leak_ns(&ks, &lat, &lens);
    eprintln!(
        "A2 HTTP: {} requests in {wire_took:?}; latency median {:.1} µs (IQR {:.1}–{:.1}); \
         ρ(k, latency) within lengths = {rho:+.4}, raw ρ(k, latency) = {raw:+.4}, \
         ρ among the {} same-length keys = {rho_same:+.4}; detectable: {leak:.1} ns per byte",
        N * REPS,
        med / 1e3,
        p25 / 1e3,
        p75 / 1e3,
        same.len()
    );
    a.expect(rho.abs() < 0.05, || {
        format!("A2: latency trends with the shared prefix over HTTP: Spearman ρ = {rho:+.4}")
    });
    // Power: a leak whose whole range (0 → len(key) bytes) is one interquartile range
    // of the measured jitter must be seen by this very pipeline.
    let d = (p75 - p25) / a.key.len() as f64;
    let injected: Vec<f64> = lat.iter().zip(&ks).map(|(t, k)| t + d * k).collect();
    let seen = rho_within_lengths(&ks, &injected, &lens);
    a.expect(seen >= 0.05, || {
        format!("A2: an injected leak of {d:.0} ns per byte gave only ρ = {seen:+.4}")
    });
    // In-process: `find` itself, with the configured key list the daemon builds.
    let configured = isobox::admission::keys::parse_list(&a.key);
    assert_eq!(configured.len(), 1);
    assert!(isobox::admission::keys::find(&configured, &a.key).is_some());
    let wrong: Vec<&str> = keys.iter().map(|(k, ..)| k.as_str()).collect();
    let t0 = Instant::now();
    let lat = time_calls(&wrong, REPS, &mut rng, |k| {
        isobox::admission::keys::find(std::hint::black_box(&configured), k).is_some()
    });
    let rho_fn = rho_within_lengths(&ks, &lat, &lens);
    eprintln!(
        "A2 find: {} samples of 16 calls in {:?}; {:.0} ns a call; ρ(k, time) within \
         lengths = {rho_fn:+.4}, raw ρ = {:+.4}; detectable: {:.3} ns per byte",
        N * REPS,
        t0.elapsed(),
        median(&mut lat.clone()),
        spearman(&ks, &lat),
        detectable_leak_ns(&ks, &lat, &lens)
    );
    a.expect(rho_fn.abs() < 0.05, || {
        format!("A2: keys::find's time trends with the shared prefix: Spearman ρ = {rho_fn:+.4}")
    });
    // Positive control, timed the same way: an early-exit byte-by-byte comparison of the
    // raw key (the leak A2 is about) must fail the same criterion.
    let real = a.key.as_bytes().to_vec();
    let lat = time_calls(&wrong, REPS, &mut rng, |k| {
        let (x, y) = (std::hint::black_box(real.as_slice()), k.as_bytes());
        for i in 0..x.len().min(y.len()) {
            if std::hint::black_box(x[i]) != y[i] {
                return false;
            }
        }
        x.len() == y.len()
    });
    let rho_leaky = rho_within_lengths(&ks, &lat, &lens);
    eprintln!("A2 positive control (early-exit comparison): ρ = {rho_leaky:+.4}");
    a.expect(rho_leaky >= 0.05, || {
        format!("A2: the timing cannot see an early-exit comparison: ρ = {rho_leaky:+.4}")
    });
    a.expect(a.counter("runsTotal") == runs0, || {
        "A2: a sandbox was started".into()
    });
    a.finish();
}

/// A3: two credentials in one request are refused as ambiguous in either order, never
/// "any valid one wins"; a key in the query string counts for nothing.
#[test]
fn test_a3_duplicate_credentials_are_ambiguous() {
    let a = Adv::start("a3", &[]);
    let key = a.key.clone();
    let runs0 = a.counter("runsTotal");
    let body = json!({"language": PY, "network": false, "code": "print(7)"}).to_string();
    let good_bearer = format!("Bearer {key}");
    let pairs: Vec<[(&str, &str); 2]> = vec![
        [
            ("Authorization", good_bearer.as_str()),
            ("Authorization", "Bearer wrong"),
        ],
        [
            ("Authorization", "Bearer wrong"),
            ("Authorization", good_bearer.as_str()),
        ],
        [("X-API-Key", key.as_str()), ("X-API-Key", "wrong")],
        [("X-API-Key", "wrong"), ("X-API-Key", key.as_str())],
        [
            ("X-API-Key", key.as_str()),
            ("Authorization", "Bearer wrong"),
        ],
        [
            ("Authorization", "Bearer wrong"),
            ("X-API-Key", key.as_str()),
        ],
    ];
    for hs in &pairs {
        for (m, p, b) in [
            ("POST", "/execute", body.as_bytes()),
            ("GET", "/runtimes", &b""[..]),
        ] {
            let r = a.req_raw(m, p, hs, b);
            a.expect(
                r.status == 400 && r.json()["error"] == "ambiguous_credentials",
                || format!("A3 {m} {p} with {hs:?}: {} {}", r.status, r.text()),
            );
        }
    }
    // Query-string keys are ignored: alone they are no credential, next to a valid
    // header they change nothing.
    for p in [
        format!("/runtimes?api_key={key}"),
        format!("/runtimes?key={key}&token={key}"),
    ] {
        let r = a.req_raw("GET", &p, &[], b"");
        a.expect(r.status == 401, || format!("A3 {p}: {}", r.status));
    }
    let r = a.req("GET", "/runtimes?api_key=wrong", &[], b"");
    a.expect(r.status == 200, || {
        format!("A3 valid header + wrong query key: {}", r.status)
    });
    a.expect(a.counter("runsTotal") == runs0, || {
        "A3: an ambiguous request spawned a sandbox".into()
    });
    a.finish();
}

/// Pipelines `reqs` on one keep-alive connection (in batches small enough for the
/// daemon's write buffer) and returns every response.
fn pipelined(a: &Adv, reqs: &[String], batch: usize) -> Vec<Resp> {
    let s = TcpStream::connect(a.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut out = Vec::new();
    for chunk in reqs.chunks(batch) {
        w.write_all(chunk.concat().as_bytes()).unwrap();
        for _ in chunk {
            let resp = read_response(&mut r, false).expect("pipelined response");
            a.scan(&resp.body, "pipelined request");
            out.push(resp);
        }
    }
    out
}

/// A5: 10,000 random keys are all 401 (on /runtimes, which is not rate limited); on
/// /execute the limiter answers 429 + Retry-After once the burst is spent, before any
/// key is even compared. No sandbox starts; no tried key reaches the log.
#[test]
fn test_a5_random_keys_all_401_then_rate_limited() {
    let a = Adv::start(
        "a5",
        &[("ISOBOX_RATE_PER_MIN", "600"), ("ISOBOX_RATE_BURST", "50")],
    );
    let runs0 = a.counter("runsTotal");
    let keys: Vec<String> = (0..10_000).map(|_| random_hex(16)).collect();
    for k in keys.iter().take(20) {
        a.add_secret(k);
    }
    let reqs: Vec<String> = keys
        .iter()
        .map(|k| format!("GET /runtimes HTTP/1.1\r\nHost: x\r\nX-API-Key: {k}\r\n\r\n"))
        .collect();
    let rs = pipelined(&a, &reqs, 200);
    let not401 = rs
        .iter()
        .filter(|r| r.status != 401 || r.header("www-authenticate").is_none())
        .count();
    a.expect(rs.len() == 10_000 && not401 == 0, || {
        format!(
            "A5: {} answers, {not401} not 401 + WWW-Authenticate",
            rs.len()
        )
    });
    let reqs: Vec<String> = keys[..300]
        .iter()
        .map(|k| format!("POST /execute HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {k}\r\n\r\n"))
        .collect();
    let rs = pipelined(&a, &reqs, 100);
    let s401 = rs.iter().filter(|r| r.status == 401).count();
    let s429: Vec<&Resp> = rs.iter().filter(|r| r.status == 429).collect();
    a.expect(s401 + s429.len() == rs.len(), || {
        "A5: a status other than 401/429".into()
    });
    a.expect((50..=60).contains(&s401) && rs[0].status == 401, || {
        format!("A5: {s401} requests reached the key check, burst is 50")
    });
    a.expect(
        s429.iter()
            .all(|r| r.json()["error"] == "rate_limited" && r.header("retry-after").is_some()),
        || "A5: a 429 without rate_limited/Retry-After".into(),
    );
    a.expect(a.counter("runsTotal") == runs0, || {
        "A5: a sandbox was started".into()
    });
    a.finish();
}

/// A6: without a trusted proxy, X-Forwarded-For is ignored: 1000 requests naming 1000
/// different clients are one client (429 after the burst), naming 127.0.0.2 changes
/// nothing, and the real 127.0.0.2 has its own, untouched bucket.
#[test]
fn test_a6_forwarded_for_untrusted_is_one_client() {
    let a = Adv::start(
        "a6",
        &[("ISOBOX_RATE_PER_MIN", "60"), ("ISOBOX_RATE_BURST", "10")],
    );
    std::thread::sleep(Duration::from_secs(2)); // the warm-up's token comes back
    let key = a.key.clone();
    let reqs: Vec<String> = (0..1000u32)
        .map(|i| format!("POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Forwarded-For: 1.2.{}.{}\r\n\r\n", i / 256, i % 256))
        .collect();
    let rs = pipelined(&a, &reqs, 200);
    let passed = rs.iter().filter(|r| r.status == 400).count();
    let limited = rs.iter().filter(|r| r.status == 429).count();
    a.expect(passed <= 12 && passed + limited == 1000, || {
        format!("A6: {passed} passed, {limited} limited of 1000 spoofed clients (burst 10)")
    });
    let r = a.req(
        "POST",
        "/execute",
        &[("X-Forwarded-For", "127.0.0.2")],
        b"{}",
    );
    a.expect(r.status == 429, || {
        format!(
            "A6: X-Forwarded-For: 127.0.0.2 from 127.0.0.1: {}",
            r.status
        )
    });
    let url = format!("http://{}/execute", a.addr());
    let kh = format!("X-API-Key: {key}");
    for i in 0..5 {
        let st = curl_from(
            "127.0.0.2",
            &url,
            &["-X", "POST", "-d", "{}", "-H", kh.as_str()],
        );
        a.expect(st == 400, || {
            format!("A6: request {i} from 127.0.0.2 got {st}, want 400 (own bucket)")
        });
    }
    std::thread::sleep(Duration::from_millis(1500)); // a token for I1's canary
    a.finish();
}

/// A7: 70,000 distinct clients through a trusted proxy (X-Forwarded-For), past the
/// limiter's 65,536-entry table: RSS grows by less than 50 MB (the case's own bound,
/// which replaces I3's 10 %), one IPv6 /64 is one bucket, and meanwhile the daemon still
/// answers /healthz within I1's 1 s.
#[test]
fn test_a7_forwarded_for_flood_bounded() {
    let a = Adv::start(
        "a7",
        &[
            ("ISOBOX_TRUSTED_PROXIES", "127.0.0.0/8"),
            ("ISOBOX_RATE_PER_MIN", "1"),
            ("ISOBOX_RATE_BURST", "3"),
        ],
    );
    let key = a.key.clone();
    let rss0 = rss_bytes(a.pid());
    let n = 70_000u32;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (rs, worst) = std::thread::scope(|s| {
        let probe = s.spawn(|| {
            let mut worst = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let t0 = Instant::now();
                let r = a.d.get("/healthz");
                assert_eq!(r.status, 200);
                worst = worst.max(t0.elapsed());
                std::thread::sleep(Duration::from_millis(50));
            }
            worst
        });
        let reqs: Vec<String> = (0..n)
            .map(|i| format!("POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Forwarded-For: 10.{}.{}.{}\r\n\r\n", (i >> 16) & 255, (i >> 8) & 255, i & 255))
            .collect();
        let rs = pipelined(&a, &reqs, 800);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        (rs, probe.join().unwrap())
    });
    let fresh = rs.iter().filter(|r| r.status == 400).count();
    a.expect(fresh == n as usize, || {
        format!("A7: {fresh} of {n} fresh clients admitted")
    });
    let grown = rss_bytes(a.pid()).saturating_sub(rss0);
    eprintln!(
        "A7: RSS +{} KiB for {n} clients; worst /healthz meanwhile {worst:?}",
        grown / 1024
    );
    a.expect(grown < 50 << 20, || {
        format!("A7: RSS grew {} KiB", grown / 1024)
    });
    let st = |xff: &str| {
        a.req("POST", "/execute", &[("X-Forwarded-For", xff)], b"")
            .status
    };
    let v6: Vec<u16> = [
        "2001:db8:0:1::1",
        "2001:db8:0:1::2",
        "2001:db8:0:1:ffff::3",
        "2001:db8:0:1::4",
    ]
    .iter()
    .map(|x| st(x))
    .collect();
    a.expect(v6 == [400, 400, 400, 429], || {
        format!("A7: one /64 (burst 3): {v6:?}")
    });
    a.expect(st("2001:db8:0:2::1") == 400, || {
        "A7: another /64 shares the bucket".into()
    });
    a.expect(worst < Duration::from_secs(1), || {
        format!("A7: /healthz took {worst:?} while the limiter table was full (each new client past 65,536 costs a full-table sweep on the event loop)")
    });
    a.finish_with(50 << 20);
}

/// A10: the sandbox's environment holds only the documented variables (PATH, LANG,
/// HOME) and the runtime's own; none of the daemon's variable names or values (keys,
/// planted secrets, host paths); the host canary is not reachable by path.
#[test]
fn test_a10_sandbox_environment_has_only_documented_variables() {
    let planted = format!("planted-{}", random_hex(12));
    let a = Adv::start(
        "a10",
        &[
            ("AWS_SECRET_ACCESS_KEY", planted.as_str()),
            ("ISOBOX_WORKERS", "3"),
        ],
    );
    a.add_secret(&planted);
    let canary_path = a.canary_file.display().to_string();
    let r = a.exec(
        &format!("import os, json\nprint(json.dumps(dict(os.environ)))\nprint(open('/proc/self/environ','rb').read())\nprint(open('/proc/1/environ','rb').read())\nprint(os.getcwd(), os.listdir('/'))\ntry: print(open({canary_path:?}).read())\nexcept OSError as e: print('canary', type(e).__name__)"),
        json!({}),
    );
    let out = run_of(&r)["stdout"].as_str().unwrap_or("").to_string();
    let env: serde_json::Map<String, Value> = out
        .lines()
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    // The runtime's own variables, from its descriptor.
    let desc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/runtimes/python-slim.toml"
    ))
    .unwrap();
    let mut allowed: HashSet<String> = ["PATH", "LANG", "HOME"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let env_block = desc
        .split("env = [")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap_or("");
    for item in env_block.split('"').skip(1).step_by(2) {
        if let Some((k, _)) = item.split_once('=') {
            allowed.insert(k.to_string());
        }
    }
    for k in env.keys() {
        a.expect(allowed.contains(k), || {
            format!("A10: undocumented variable {k} in the sandbox")
        });
    }
    a.expect(!env.is_empty(), || {
        format!("A10: no environment parsed from {r}")
    });
    let daemon_env = std::fs::read(format!("/proc/{}/environ", a.pid())).unwrap();
    for pair in daemon_env.split(|&b| b == 0).filter(|p| !p.is_empty()) {
        let pair = String::from_utf8_lossy(pair);
        let Some((k, v)) = pair.split_once('=') else {
            continue;
        };
        if allowed.contains(k) {
            continue;
        }
        a.expect(
            !out.contains(&format!("{k}=")) && !env.contains_key(k),
            || format!("A10: the daemon's variable {k} is visible in the sandbox"),
        );
        // Values: skip the documented ones (in the descriptor) and cargo's CARGO_* (set
        // by the test runner, e.g. CARGO_PKG_NAME=isobox, which names the rootfs's
        // own /.isobox directory too).
        if v.len() >= 6 && !desc.contains(v) && !k.starts_with("CARGO_") {
            a.expect(!out.contains(v), || {
                let at = out.find(v).unwrap_or(0);
                let mut lo = at.saturating_sub(60);
                while !out.is_char_boundary(lo) {
                    lo -= 1;
                }
                let mut hi = (at + v.len() + 60).min(out.len());
                while !out.is_char_boundary(hi) {
                    hi += 1;
                }
                let ctx = &out[lo..hi];
                format!("A10: the value of the daemon's {k} ({v:?}) is visible: ...{ctx}...")
            });
        }
    }
    let data_dir = a.d.data_dir.display().to_string();
    for host in [
        data_dir.as_str(),
        "/work/",
        "/root",
        env!("CARGO_MANIFEST_DIR"),
        "/run/isobox",
        "/var/lib/isobox",
    ] {
        a.expect(!out.contains(host), || {
            format!("A10: host path {host} visible in the sandbox")
        });
    }
    a.expect(
        out.contains("canary FileNotFoundError") || out.contains("canary PermissionError"),
        || format!("A10: the host canary path was readable: {r}"),
    );
    a.finish();
}

/// A11: invalid JSON, wrong types, 10 MB bodies (length-delimited and chunked), deep
/// nesting: 400/413 JSON errors with no stack trace, host path or secret; no stack
/// overflow (the daemon keeps serving); no sandbox.
#[test]
fn test_a11_malformed_bodies_get_clean_errors() {
    let a = Adv::start("a11", &[]);
    let key = a.key.clone();
    let canary = a.canary.clone();
    let data_dir = a.d.data_dir.display().to_string();
    let secrets = [key.as_str(), canary.as_str()];
    let runs0 = a.counter("runsTotal");
    let mut bodies: Vec<(String, Vec<u8>)> = vec![
        ("truncated".into(), b"{\"language\":".to_vec()),
        (
            "invalid UTF-8".into(),
            b"{\"language\":\"\xff\xfe\"}".to_vec(),
        ),
        ("NUL".into(), b"{\"language\":\"py\0\"}".to_vec()),
        ("array".into(), b"[]".to_vec()),
        (
            "huge number".into(),
            b"{\"language\":\"python-slim\",\"code\":\"1\",\"limits\":{\"pids\":1e999}}".to_vec(),
        ),
        (
            "deep objects".into(),
            format!("{}1{}", "{\"a\":".repeat(100_000), "}".repeat(100_000)).into_bytes(),
        ),
        ("deep arrays".into(), "[".repeat(100_000).into_bytes()),
        (
            "deep limits".into(),
            format!(
                "{{\"language\":\"python-slim\",\"code\":\"1\",\"limits\":{}1{}}}",
                "[".repeat(50_000),
                "]".repeat(50_000)
            )
            .into_bytes(),
        ),
    ];
    for (field, v) in [
        ("language", json!(5)),
        ("code", json!([])),
        ("files", json!("x")),
        ("files", json!([{"name": 5, "content": ""}])),
        ("args", json!("x")),
        ("stdin", json!(5)),
        ("limits", json!([])),
        ("network", json!("yes")),
        ("version", json!({})),
    ] {
        let mut b = json!({"language": PY, "code": "print(1)"});
        b[field] = v.clone();
        bodies.push((
            format!("wrong type {field}={v}"),
            b.to_string().into_bytes(),
        ));
    }
    for (label, body) in &bodies {
        // Raw: the daemon may refuse an oversized body before reading it.
        let mut req = format!(
            "POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        let (rs, _) = raw_send(a.addr(), &req, Duration::from_secs(10));
        let Some(r) = rs.into_iter().next() else {
            a.finding(format!("A11 {label}: no response"));
            continue;
        };
        a.scan(&r.body, label);
        a.expect(r.status == 400, || {
            format!("A11 {label}: {} {}", r.status, r.text())
        });
        let j: Option<Value> = serde_json::from_slice(&r.body).ok();
        a.expect(j.as_ref().is_some_and(|j| j["error"].is_string()), || {
            format!("A11 {label}: not a JSON error: {}", r.text())
        });
        if let Some(leak) = leaky(&r.text(), &secrets, &data_dir) {
            a.finding(format!("A11 {label}: {leak}"));
        }
    }
    // 10 MB: length-delimited and chunked on /execute, length-delimited elsewhere.
    let ten = vec![b'x'; 10 << 20];
    let mut cl = format!(
        "POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: {}\r\n\r\n",
        ten.len()
    )
    .into_bytes();
    cl.extend_from_slice(&ten);
    let mut chunked = format!("POST /execute HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
    for c in ten.chunks(1 << 20) {
        chunked.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        chunked.extend_from_slice(c);
        chunked.extend_from_slice(b"\r\n");
    }
    chunked.extend_from_slice(b"0\r\n\r\n");
    let mut other = format!(
        "GET /runtimes HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nContent-Length: {}\r\n\r\n",
        ten.len()
    )
    .into_bytes();
    other.extend_from_slice(&ten);
    for (label, bytes, want) in [
        ("10 MB /execute", cl, 400u16),
        ("10 MB chunked /execute", chunked, 400),
        ("10 MB /runtimes", other, 413),
    ] {
        let (rs, closed) = raw_send(a.addr(), &bytes, Duration::from_secs(10));
        let text = rs.first().map(|r| r.text()).unwrap_or_default();
        a.expect(rs.len() == 1 && rs[0].status == want && closed, || {
            format!(
                "A11 {label}: {:?} closed={closed} {text}",
                rs.iter().map(|r| r.status).collect::<Vec<_>>()
            )
        });
        if let Some(leak) = leaky(&text, &secrets, &data_dir) {
            a.finding(format!("A11 {label}: {leak}"));
        }
    }
    a.expect(a.counter("runsTotal") == runs0, || {
        "A11: a malformed body started a run".into()
    });
    a.finish();
}

/// Sends `reqs` one at a time over keep-alive connections, opening a new one whenever
/// the daemon answers `Connection: close` (it does after refusing a request whose body
/// it did not read, e.g. a 429), and returns every response.
fn one_by_one(a: &Adv, reqs: &[String]) -> Vec<Resp> {
    let mut out = Vec::new();
    let mut conn: Option<(TcpStream, BufReader<TcpStream>)> = None;
    for req in reqs {
        let (w, r) = conn.get_or_insert_with(|| {
            let s = TcpStream::connect(a.addr()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            (s.try_clone().unwrap(), BufReader::new(s))
        });
        w.write_all(req.as_bytes()).unwrap();
        let resp = read_response(r, false).expect("one-by-one response");
        a.scan(&resp.body, "one-by-one request");
        if resp
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"))
        {
            conn = None;
        }
        out.push(resp);
    }
    out
}

/// Creates a filesystem session with the harness's key (its answer scanned for the
/// canary like every other).
fn a5_session(a: &Adv) -> Session {
    let r = a.req(
        "POST",
        "/v1/sessions",
        &[("Content-Type", "application/json")],
        json!({"runtime": PY}).to_string().as_bytes(),
    );
    assert_eq!(r.status, 201, "create a session: {}", r.text());
    Session::from_created(r.json())
}

/// Every `n`-character window of every run of base64url characters in `text`: the
/// strings a token could appear as (a token is a whole run, or part of a longer one).
fn base64url_windows(text: &str, n: usize) -> HashSet<&str> {
    let b = text.as_bytes();
    let is_b64 = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
    let mut out = HashSet::new();
    let mut i = 0;
    while i < b.len() {
        if !is_b64(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && is_b64(b[i]) {
            i += 1;
        }
        if i - start >= n {
            for s in start..=i - n {
                out.insert(&text[s..s + n]);
            }
        }
    }
    out
}

/// A5 with capability tokens: 10,000 random tokens (43 base64url characters, like the
/// real ones) against one real session. On the file API (not rate limited) every one
/// is 401 `invalid_session_token` and no file content comes back; on the session's
/// exec route (rate limited) the burst gets 401 and the rest 429 `rate_limited` +
/// Retry-After; no sandbox starts; the real token still works and the session is
/// unchanged; no tried token and no real token reaches the log. The entropy audit: two
/// sessions' tokens are distinct and decode to 32 bytes (256 bits), and the state store
/// holds the token's SHA-256, never the token.
#[test]
fn test_a5_random_session_tokens_all_401_then_rate_limited() {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let a = Adv::start(
        "a5tok",
        &[("ISOBOX_RATE_PER_MIN", "600"), ("ISOBOX_RATE_BURST", "50")],
    );
    let key = a.key.clone();
    let data_dir = a.d.data_dir.display().to_string();
    // Two sessions; the first gets a file.
    let Session { id, token, .. } = a5_session(&a);
    let Session {
        id: id2,
        token: token2,
        ..
    } = a5_session(&a);
    let created = Instant::now();
    a.add_secret(&token);
    a.add_secret(&token2);
    let content = format!("a5-session-file-{}", random_hex(16));
    a.add_secret(&content);
    let file = format!("/v1/sessions/{id}/fs?path=notes/secret.txt");
    let listing = format!("/v1/sessions/{id}/fs?path=notes");
    let r = a.req(
        "PUT",
        &file,
        &[("X-Session-Token", token.as_str())],
        content.as_bytes(),
    );
    assert_eq!(r.status, 200, "upload: {}", r.text());
    let list0 = a.req("GET", &listing, &[("X-Session-Token", token.as_str())], b"");
    assert_eq!(list0.status, 200, "listing: {}", list0.text());
    let list0 = list0.json();

    // (5) The entropy audit, as far as a client can see it.
    for (i, t) in [(&id, &token), (&id2, &token2)] {
        let raw = b64.decode(t.as_bytes());
        a.expect(
            t.len() == 43
                && t.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
                && raw.as_ref().is_ok_and(|r| r.len() == 32),
            || format!("A5: session {i}'s token {t:?} is not 43 base64url chars of 32 bytes"),
        );
        a.expect(
            i.len() == 32
                && i.bytes()
                    .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)),
            || format!("A5: session id {i:?} is not 32 lowercase hex chars"),
        );
    }
    a.expect(token != token2 && id != id2, || {
        "A5: two sessions share a token or an id".into()
    });
    // Stored only as its SHA-256: the state store has the digest, never the token.
    let digest = sha256_hex(token.as_bytes());
    let mut state = Vec::new();
    for e in std::fs::read_dir(a.d.data_dir.join("state"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if e.metadata()
            .is_ok_and(|m| m.is_file() && m.len() < 256 << 20)
        {
            state.extend(std::fs::read(e.path()).unwrap_or_default());
        }
    }
    a.expect(
        !state.is_empty() && contains(&state, digest.as_bytes()),
        || "A5: the state store does not hold the token's SHA-256".into(),
    );
    a.expect(!contains(&state, token.as_bytes()), || {
        "A5: the state store holds the raw capability token".into()
    });

    // Random tokens, the real ones' format.
    let mut bytes = vec![0u8; 10_000 * 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut bytes)
        .unwrap();
    let tokens: Vec<String> = bytes
        .chunks(32)
        .map(|c| b64.encode(c))
        .filter(|t| *t != token && *t != token2)
        .collect();
    assert!(tokens.iter().all(|t| t.len() == 43));
    for t in tokens.iter().take(20) {
        a.add_secret(t);
    }
    let runs0 = a.counter("runsTotal");

    // (1) The file API, not rate limited: every random token is 401.
    let want =
        json!({"error": "invalid_session_token", "detail": "missing or wrong X-Session-Token"});
    let reqs: Vec<String> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let path = if i % 2 == 0 { &file } else { &listing };
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Session-Token: {t}\r\n\r\n")
        })
        .collect();
    let t0 = Instant::now();
    let rs = pipelined(&a, &reqs, 200);
    let fs_took = t0.elapsed();
    let bad: Vec<String> = rs
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            let text = r.text();
            r.status != 401
                || serde_json::from_slice::<Value>(&r.body).ok().as_ref() != Some(&want)
                || text.contains(&content)
                || leaky(&text, &[&token, &token2, &key], &data_dir).is_some()
        })
        .map(|(i, r)| format!("#{i}: {} {}", r.status, r.text()))
        .collect();
    a.expect(rs.len() == tokens.len() && bad.is_empty(), || {
        format!(
            "A5: {} answers to {} random tokens on the file API, {} not a plain 401 invalid_session_token; e.g. {:?}",
            rs.len(),
            tokens.len(),
            bad.len(),
            &bad[..bad.len().min(5)]
        )
    });
    eprintln!(
        "A5: {} random tokens on the file API in {fs_took:?}",
        rs.len()
    );

    // (2) The exec route, rate limited: the burst reaches the token check, then 429.
    // Three bucket tokens went to the warm-up and the creates; at 10/s they are back.
    std::thread::sleep(Duration::from_millis(500).saturating_sub(created.elapsed()));
    let body = json!({"code": format!("print({:?})", content), "network": false}).to_string();
    let exec = format!("/v1/sessions/{id}/exec");
    let reqs: Vec<String> = tokens[..300]
        .iter()
        .map(|t| {
            format!(
                "POST {exec} HTTP/1.1\r\nHost: x\r\nX-API-Key: {key}\r\nX-Session-Token: {t}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
        })
        .collect();
    let t0 = Instant::now();
    let rs = one_by_one(&a, &reqs);
    let exec_took = t0.elapsed();
    // The bucket refills at 10/s while the requests go out.
    let max401 = 50 + (exec_took.as_secs_f64() * 10.0).ceil() as usize + 1;
    let s401: Vec<&Resp> = rs.iter().filter(|r| r.status == 401).collect();
    let s429: Vec<&Resp> = rs.iter().filter(|r| r.status == 429).collect();
    eprintln!(
        "A5: {} random tokens on exec in {exec_took:?}: {} × 401, {} × 429",
        rs.len(),
        s401.len(),
        s429.len()
    );
    a.expect(
        rs.len() == 300 && s401.len() + s429.len() == rs.len(),
        || {
            let other: Vec<String> = rs
                .iter()
                .filter(|r| r.status != 401 && r.status != 429)
                .take(5)
                .map(|r| format!("{} {}", r.status, r.text()))
                .collect();
            format!(
                "A5 exec: {} answers, statuses other than 401/429: {other:?}",
                rs.len()
            )
        },
    );
    a.expect(
        (50..=max401).contains(&s401.len()) && rs.iter().take(50).all(|r| r.status == 401),
        || {
            format!(
                "A5 exec: {} random tokens reached the token check (burst 50, at most {max401} with the refill), first 50: {:?}",
                s401.len(),
                rs.iter().take(50).map(|r| r.status).collect::<Vec<_>>()
            )
        },
    );
    a.expect(s401.iter().all(|r| r.json() == want), || {
        "A5 exec: a 401 that is not invalid_session_token".into()
    });
    a.expect(
        s429.iter().all(|r| {
            r.json()["error"] == "rate_limited"
                && r.header("retry-after")
                    .is_some_and(|v| v.parse::<u64>().is_ok_and(|s| s >= 1))
        }),
        || "A5 exec: a 429 without rate_limited / Retry-After".into(),
    );
    a.expect(
        rs.iter().all(|r| !contains(&r.body, content.as_bytes())),
        || "A5 exec: the file's content came back".into(),
    );
    a.expect(a.counter("runsTotal") == runs0, || {
        "A5: a random session token started a sandbox".into()
    });

    // (3) The real token still works, and the session is as it was.
    let r = a.req("GET", &file, &[("X-Session-Token", token.as_str())], b"");
    a.expect(r.status == 200 && r.body == content.as_bytes(), || {
        format!(
            "A5: the real token after the attack: {} {}",
            r.status,
            r.text()
        )
    });
    let r = a.req("GET", &listing, &[("X-Session-Token", token.as_str())], b"");
    a.expect(r.status == 200 && r.json() == list0, || {
        format!(
            "A5: the listing changed: {} {} (was {list0})",
            r.status,
            r.text()
        )
    });
    let r = a.req(
        "GET",
        &format!("/v1/sessions/{id2}/fs?path="),
        &[("X-Session-Token", token2.as_str())],
        b"",
    );
    a.expect(r.status == 200, || {
        format!(
            "A5: the second session after the attack: {} {}",
            r.status,
            r.text()
        )
    });

    // (4) No tried token in the log (the real ones and 20 tried are `finish`'s secrets).
    let log = a.d.log();
    let seen = base64url_windows(&log, 43);
    let logged = tokens.iter().filter(|t| seen.contains(t.as_str())).count();
    a.expect(logged == 0, || {
        format!("I6: {logged} of the tried session tokens are in the daemon log")
    });
    a.finish();
}
