//! `cargo bench --bench store`: the LMDB session registry (`isobox::store`) with
//! 10 000 sessions at rest, side by side with two references in the same run.
//!
//! 1. Inserts: N records (default 10 000), each `Store::insert_session` its own committed
//!    (fsynced) transaction, as the daemon's `POST /v1/sessions` does. Reference: the
//!    naive durable alternative, one small JSON file per record written and `fsync`ed
//!    (`File::sync_all`; the directory is not fsynced, so the reference is if anything
//!    cheaper than a crash-safe one), in alternating blocks of 100 with the LMDB
//!    inserts; and, for scale only, a `Mutex<HashMap>` insert.
//! 2. Lookups: M random ids (default 100 000) through `Store::session` (read
//!    transaction + JSON decode, what every `/v1/sessions/{id}/*` call does to
//!    authorise). Reference: `Mutex<HashMap<String, Vec<u8>>>` holding the same JSON
//!    bytes, get + decode (same work minus the storage) and get + copy of the bytes.
//!    Throughput comes from an uninstrumented pass, latencies from a second pass that
//!    times every call.
//! 3. `Store::sessions()` (the full scan the daemon's upkeep does every minute) and
//!    `Store::session_count()`.
//!
//! Knobs (environment): `STORE_SESSIONS` (10000), `STORE_LOOKUPS` (100000),
//! `STORE_SCANS` (20), `TMPDIR` (where the two temporary directories go; they are
//! removed at the end). heed forbids opening one LMDB directory twice in a process, so
//! the store is opened exactly once.

use isobox::store::{SessionRecord, Store};
use std::collections::HashMap;
use std::hint::black_box;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// splitmix64: reproducible ids and lookup order without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Removes a directory tree when dropped (also on an early `?` return).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> std::io::Result<TempDir> {
        let p =
            std::env::temp_dir().join(format!("isobox-store-bench-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p)?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Nearest-rank percentile of sorted samples (as the Python load scripts do).
fn pct(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64) * q / 100.0).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

struct Row {
    op: &'static str,
    backend: &'static str,
    ops_per_s: f64,
    p50: Duration,
    p99: Duration,
}

impl Row {
    fn new(
        op: &'static str,
        backend: &'static str,
        n: usize,
        wall: Duration,
        mut lat: Vec<Duration>,
    ) -> Row {
        lat.sort_unstable();
        Row {
            op,
            backend,
            ops_per_s: n as f64 / wall.as_secs_f64(),
            p50: pct(&lat, 50.0),
            p99: pct(&lat, 99.0),
        }
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn record(rng: &mut Rng, now_ms: u64) -> SessionRecord {
    SessionRecord {
        tenant: "public".into(),
        token_sha256: format!(
            "{:016x}{:016x}{:016x}{:016x}",
            rng.next(),
            rng.next(),
            rng.next(),
            rng.next()
        ),
        runtime: "python-slim".into(),
        kind: "filesystem".into(),
        created_at_ms: now_ms,
        ttl_sec: 86_400,
        last_used_ms: now_ms,
        quota_bytes: 512 << 20,
        volume_id: None,
        network: None,
        version: None,
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n = env_usize("STORE_SESSIONS", 10_000).max(1);
    let m = env_usize("STORE_LOOKUPS", 100_000).max(1);
    let scans = env_usize("STORE_SCANS", 20).max(1);

    let mut rng = Rng(0x1505_b0c5);
    let now_ms = 1_796_054_399_000;
    // Ids as the daemon makes them: 16 random bytes, hex.
    let recs: Vec<(String, SessionRecord)> = (0..n)
        .map(|_| {
            let id = format!("{:016x}{:016x}", rng.next(), rng.next());
            let rec = record(&mut rng, now_ms);
            (id, rec)
        })
        .collect();
    let order: Vec<usize> = (0..m).map(|_| (rng.next() % n as u64) as usize).collect();

    let lmdb_dir = TempDir::new("lmdb")?;
    let json_dir = TempDir::new("json")?;
    println!(
        "== store: {n} sessions, {m} random lookups; LMDB and JSON files in {}; load average {}",
        std::env::temp_dir().display(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let mut rows = Vec::new();

    // --- inserts: LMDB and JSON files in alternating blocks of 100 records, so drift
    // in the disk's background load (other work fsyncing) hits both alike ----------------
    let store = Store::open(&lmdb_dir.0)?;
    let (mut lat_lmdb, mut lat_json) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut wall_lmdb, mut wall_json) = (Duration::ZERO, Duration::ZERO);
    for (block, chunk) in recs.chunks(100).enumerate() {
        for pass in 0..2 {
            let t0 = Instant::now();
            if (block + pass) % 2 == 0 {
                for (id, rec) in chunk {
                    let t = Instant::now();
                    let fresh = store.insert_session(id, rec)?;
                    lat_lmdb.push(t.elapsed());
                    assert!(fresh, "duplicate id {id}");
                }
                wall_lmdb += t0.elapsed();
            } else {
                for (id, rec) in chunk {
                    let t = Instant::now();
                    let bytes = serde_json::to_vec(rec)?;
                    let mut f = std::fs::File::create(json_dir.0.join(format!("{id}.json")))?;
                    f.write_all(&bytes)?;
                    f.sync_all()?;
                    lat_json.push(t.elapsed());
                }
                wall_json += t0.elapsed();
            }
        }
    }
    rows.push(Row::new(
        "insert, 1 txn each",
        "LMDB Store",
        n,
        wall_lmdb,
        lat_lmdb,
    ));
    rows.push(Row::new(
        "insert",
        "JSON file + fsync",
        n,
        wall_json,
        lat_json,
    ));

    let map: Mutex<HashMap<String, Vec<u8>>> = Mutex::new(HashMap::new());
    let mut lat = Vec::with_capacity(n);
    let t0 = Instant::now();
    for (id, rec) in &recs {
        let t = Instant::now();
        let bytes = serde_json::to_vec(rec)?;
        map.lock().unwrap().insert(id.clone(), bytes);
        lat.push(t.elapsed());
    }
    rows.push(Row::new(
        "insert",
        "Mutex<HashMap> (memory)",
        n,
        t0.elapsed(),
        lat,
    ));

    // --- lookups: one uninstrumented pass for ops/s, one timed per call ----------------
    let lookup_lmdb = |i: usize| -> Result<SessionRecord, Box<dyn std::error::Error>> {
        let (id, _) = &recs[i];
        Ok(store.session(id)?.ok_or("missing session")?)
    };
    let lookup_map_decode = |i: usize| -> Result<SessionRecord, Box<dyn std::error::Error>> {
        let (id, _) = &recs[i];
        let g = map.lock().unwrap();
        let b = g.get(id.as_str()).ok_or("missing session")?;
        Ok(serde_json::from_slice(b)?)
    };
    let lookup_map_bytes = |i: usize| -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let (id, _) = &recs[i];
        let g = map.lock().unwrap();
        Ok(g.get(id.as_str()).ok_or("missing session")?.clone())
    };
    // Correctness once, outside the timing.
    for &i in order.iter().take(100) {
        assert_eq!(lookup_lmdb(i)?, recs[i].1);
        assert_eq!(lookup_map_decode(i)?, recs[i].1);
    }
    macro_rules! lookups {
        ($label:expr, $f:expr) => {{
            let t0 = Instant::now();
            for &i in &order {
                black_box($f(black_box(i))?);
            }
            let wall = t0.elapsed();
            let mut lat = Vec::with_capacity(m);
            for &i in &order {
                let t = Instant::now();
                black_box($f(black_box(i))?);
                lat.push(t.elapsed());
            }
            rows.push(Row::new("lookup", $label, m, wall, lat));
        }};
    }
    lookups!("LMDB Store::session", lookup_lmdb);
    lookups!("Mutex<HashMap> get+decode", lookup_map_decode);
    lookups!("Mutex<HashMap> get+copy", lookup_map_bytes);

    // --- full scan and count ---------------------------------------------------------------
    let mut scan = Vec::with_capacity(scans);
    for _ in 0..scans {
        let t = Instant::now();
        let all = black_box(store.sessions()?);
        scan.push(t.elapsed());
        assert_eq!(all.len(), n);
    }
    scan.sort_unstable();
    let mut count = Vec::with_capacity(1000);
    for _ in 0..1000 {
        let t = Instant::now();
        let c = black_box(store.session_count()?);
        count.push(t.elapsed());
        assert_eq!(c, n as u64);
    }
    count.sort_unstable();

    // --- report ------------------------------------------------------------------------------
    println!(
        "{:<19} {:<26} {:>12} {:>10} {:>10}",
        "op", "backend", "ops/s", "p50 µs", "p99 µs"
    );
    for r in &rows {
        println!(
            "{:<19} {:<26} {:>12.0} {:>10.2} {:>10.2}",
            r.op,
            r.backend,
            r.ops_per_s,
            us(r.p50),
            us(r.p99)
        );
    }
    println!(
        "{:<19} {:<26} {:>12} {:>10.2} {:>10.2}   ({scans} scans of {n}; min {:.2} ms)",
        "sessions() scan",
        "LMDB Store (ms, not µs)",
        "",
        us(pct(&scan, 50.0)) / 1000.0,
        us(pct(&scan, 99.0)) / 1000.0,
        us(scan[0]) / 1000.0
    );
    println!(
        "{:<19} {:<26} {:>12} {:>10.2} {:>10.2}   (1000 calls)",
        "session_count()",
        "LMDB Store",
        "",
        us(pct(&count, 50.0)),
        us(pct(&count, 99.0))
    );
    let ratio = |a: &Row, b: &Row| {
        format!(
            "ops/s {:.2}x, p50 {:.2}x, p99 {:.2}x",
            a.ops_per_s / b.ops_per_s,
            us(a.p50) / us(b.p50),
            us(a.p99) / us(b.p99)
        )
    };
    println!("ratios (same run):");
    println!(
        "  insert  LMDB / JSON file + fsync:          {}",
        ratio(&rows[0], &rows[1])
    );
    println!(
        "  lookup  LMDB / Mutex<HashMap> get+decode:  {}",
        ratio(&rows[3], &rows[4])
    );
    println!(
        "  lookup  LMDB / Mutex<HashMap> get+copy:    {}",
        ratio(&rows[3], &rows[5])
    );
    println!(
        "on disk: LMDB {:.1} MiB (data.mdb + lock.mdb), JSON files {:.1} MiB of content in {n} files",
        dir_bytes(&lmdb_dir.0) as f64 / (1 << 20) as f64,
        dir_bytes(&json_dir.0) as f64 / (1 << 20) as f64
    );
    drop(store);
    Ok(())
}
