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

/// The runtimes "installed" for the targets that resolve them.
pub const INSTALLED: [&str; 2] = ["python-slim", "python"];

/// Writes `path` atomically (parallel `-jobs` workers share the dir).
fn put(path: &std::path::Path, contents: &[u8], mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, contents).expect("write rootfs file");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).expect("chmod");
    std::fs::rename(&tmp, path).expect("rename rootfs file");
}

/// The embedded runtime descriptors, self-checked against a throw-away rootfs dir
/// made once per process in which only [`INSTALLED`] are (python 3.11.2).
pub fn runtimes() -> &'static isobox::runtimes::Runtimes {
    static RT: std::sync::OnceLock<isobox::runtimes::Runtimes> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        let dir = std::env::temp_dir().join("isobox-fuzz-rootfs");
        for name in INSTALLED {
            let root = dir.join(name);
            std::fs::create_dir_all(root.join(".isobox")).expect("mkdir .isobox");
            std::fs::create_dir_all(root.join("usr/bin")).expect("mkdir usr/bin");
            put(&root.join(".isobox/versions"), b"python=3.11.2\n", 0o644);
            put(&root.join("usr/bin/python3"), b"#!/bin/sh\nexit 0\n", 0o755);
        }
        let rt = isobox::runtimes::Runtimes::load(None, &dir).expect("embedded runtimes load");
        for name in INSTALLED {
            let r = rt
                .resolve(name)
                .unwrap_or_else(|| panic!("{name} not installed in {}", dir.display()));
            assert_eq!(r.version.as_deref(), Some("3.11.2"));
        }
        rt
    })
}

/// The WBX jobs' limits the `wbx_job` and `wbx_batch` targets submit against: the
/// daemon's defaults, with a price so that quotes are computed.
pub fn wbx_jobs() -> isobox::config::WbxJobs {
    isobox::config::WbxJobs {
        running: 2,
        per_tenant: 1000,
        max_timeout_s: 86_400,
        log_bytes: 64 << 20,
        retention_s: 604_800,
        artifact_files: 100,
        artifact_file_bytes: 100_000_000,
        artifact_job_bytes: 512_000_000,
        artifact_tenant_bytes: 5_000_000_000,
        records_tenant_bytes: 256_000_000,
        currency: "EUR".into(),
        price_vcpu_s: isobox::jobs::Money(1_000_000),
        price_gb_s: isobox::jobs::Money(0),
        classes: vec!["economy", "balanced", "performance", "memory"],
        class_prices: Vec::new(),
        webhook_loopback: false,
        webhook_deny: Vec::new(),
        webhooks: true,
        wasi: true,
    }
}
