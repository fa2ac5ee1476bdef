//! W: WebSockets (tests/ADVERSARIAL.md, section W): the frames, floods and slow readers
//! the protocol tests do not send, on the eryx stream (`/eryx/v1/stream`). A process's
//! terminal shares its frame decoder and pump (`daemon/eryx.rs::ws_pump`).

use crate::common::RawWs;
use crate::harness::Adv;
use crate::host::{proc_stat, rss_bytes};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const STREAM: &str = "/eryx/v1/stream";

/// The eryx stream's message cap (4 MiB).
const CAP: usize = 4 << 20;

fn open(a: &Adv) -> RawWs {
    RawWs::open(
        a.addr(),
        STREAM,
        &format!("Authorization: Bearer {}\r\n", a.key),
    )
}

/// A masked client frame.
fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
    RawWs::frame(first, payload, false)
}

/// The daemon's CPU seconds so far (USER_HZ 100).
fn cpu(pid: u32) -> f64 {
    proc_stat(pid).map_or(0.0, |s| s.3 as f64 / 100.0)
}

/// Samples the daemon's RSS every 20 ms until stopped: the most it grew over `base`.
struct Peak {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    t: Option<std::thread::JoinHandle<()>>,
}

impl Peak {
    fn start(pid: u32) -> Peak {
        let base = rss_bytes(pid);
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (s, p) = (Arc::clone(&stop), Arc::clone(&peak));
        let t = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(rss_bytes(pid).saturating_sub(base), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Peak {
            stop,
            peak,
            t: Some(t),
        }
    }

    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.t.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// W3 (a 64-bit length of 2^63−1), W4 (10,000 unfinished 64 KiB fragments), W5 (a
/// ping of 126 bytes, a fragmented ping, a flood of pings from a client that never
/// reads its pongs) and W8's WebSocket half (a run that floods its output to a client
/// that reads slowly): each refused or bounded, the daemon's memory flat, and the
/// daemon serving other clients throughout.
#[test]
fn test_w3_w4_w5_w8_websocket_frames_floods_and_slow_readers() {
    // The write stall bound is the idle timeout: 3 s instead of 60.
    let mut a = Adv::start("w", &[("ISOBOX_IDLE_TIMEOUT_MS", "3000")]);
    let pid = a.pid();
    // The WebAssembly workers' sockets open with the first eryx run: the baselines
    // (fds, RSS) are taken again after one.
    let bearer = format!("Bearer {}", a.key);
    let r = a.req(
        "POST",
        "/eryx/v1/execute",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", bearer.as_str()),
        ],
        br#"{"code": "print(1)"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    a.rebaseline();

    // W3: closed with 1009 from the header alone, nothing allocated.
    let peak = Peak::start(pid);
    let mut c = open(&a);
    let t0 = Instant::now();
    let mut f = vec![0x82, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
    f.extend_from_slice(&[1, 2, 3, 4]);
    c.s.write_all(&f).unwrap();
    let code = c.close_code();
    let took = t0.elapsed();
    c.ends();
    let grown = peak.stop();
    eprintln!(
        "W3: close {code:?} after {took:?}, RSS +{} KiB",
        grown / 1024
    );
    a.expect(code == Some(1009) && took < Duration::from_secs(2), || {
        format!("W3: a 2^63-1 length got close {code:?} after {took:?}, not 1009 at once")
    });
    a.expect(grown < 1 << 20, || {
        format!("W3: RSS grew by {} KiB", grown / 1024)
    });

    // W4: fragments count together; 1009 once they pass the cap, the rest never read.
    let peak = Peak::start(pid);
    let mut c = open(&a);
    let mut w = c.s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let piece = vec![b'a'; 64 << 10];
    let writer = std::thread::spawn(move || {
        let (first, next) = (frame(0x02, &piece), frame(0x00, &piece));
        for i in 0..10_000usize {
            if w.write_all(if i == 0 { &first } else { &next }).is_err() {
                return i;
            }
        }
        10_000
    });
    let code = c.close_code();
    c.ends();
    drop(c);
    let sent = writer.join().unwrap();
    let grown = peak.stop();
    eprintln!(
        "W4: close {code:?}; the client got {sent} fragments out; RSS +{} KiB",
        grown / 1024
    );
    a.expect(code == Some(1009), || {
        format!("W4: 10,000 × 64 KiB fragments got close {code:?}, not 1009")
    });
    a.expect(sent < 10_000, || {
        "W4: the server read all 10,000 fragments (640 MB) of a message over its cap".into()
    });
    // The message's buffer grows by doubling up to the cap, and the allocator keeps the
    // capacities it outgrew for reuse: twice the cap, the read-ahead, 4 MiB of slack.
    let bound = (2 * CAP + (64 << 10) + (4 << 20)) as u64;
    a.expect(grown <= bound, || {
        format!(
            "W4: RSS grew by {} KiB (bound {} KiB)",
            grown / 1024,
            bound / 1024
        )
    });

    // W5: invalid pings are protocol errors.
    for (what, bytes) in [
        ("a 126-byte ping", frame(0x89, &[b'p'; 126])),
        ("a fragmented ping", frame(0x09, b"ping")),
    ] {
        let mut c = open(&a);
        c.s.write_all(&bytes).unwrap();
        let code = c.close_code();
        c.ends();
        a.expect(code == Some(1002), || {
            format!("W5: {what} got close {code:?}, not 1002")
        });
    }

    // W5: a flood of pings from a client that never reads its pongs. The server stops
    // reading once its pongs wait unread and drops the client at the write stall bound;
    // meanwhile it serves others; its memory stays flat and its CPU finite.
    let peak = Peak::start(pid);
    let cpu0 = cpu(pid);
    let c = open(&a);
    let mut w = c.s.try_clone().unwrap();
    w.set_write_timeout(Some(Duration::from_secs(60))).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&done);
    let flood = std::thread::spawn(move || {
        // 1000 pings a write, as fast as the socket takes them.
        let burst: Vec<u8> = (0..1000).flat_map(|_| frame(0x89, b"ping")).collect();
        let t0 = Instant::now();
        let mut pings = 0u64;
        while w.write_all(&burst).is_ok() {
            pings += 1000;
            if t0.elapsed() > Duration::from_secs(60) {
                break;
            }
        }
        flag.store(true, Ordering::Relaxed);
        (pings, t0.elapsed())
    });
    let t0 = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut probes = Vec::new();
    while !done.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(65) {
        let t = Instant::now();
        let h = a.d.get("/healthz");
        probes.push((t0.elapsed().as_millis(), t.elapsed().as_millis()));
        slowest = slowest.max(t.elapsed());
        a.expect(h.status == 200, || {
            format!("W5 flood: /healthz {}", h.status)
        });
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("W5 flood: /healthz (at ms, took ms): {probes:?}");
    let (pings, lasted) = flood.join().unwrap();
    drop(c);
    let used = cpu(pid) - cpu0;
    let grown = peak.stop();
    eprintln!(
        "W5 flood: {pings} pings in {lasted:?} before the server dropped the client; daemon CPU {used:.2} s; /healthz at worst {slowest:?}; RSS +{} KiB",
        grown / 1024
    );
    a.expect(lasted < Duration::from_secs(30), || {
        format!("W5 flood: the non-reading client was not dropped within 30 s ({lasted:?})")
    });
    a.expect(slowest < Duration::from_secs(1), || {
        format!("W5 flood: /healthz took {slowest:?} during the flood")
    });
    a.expect(used < lasted.as_secs_f64(), || {
        format!("W5 flood: the daemon used {used:.2} CPU-s in {lasted:?}")
    });
    a.expect(grown < 2 << 20, || {
        format!("W5 flood: RSS grew by {} KiB", grown / 1024)
    });

    // W8: a run that prints without end, its client not reading: the run ends at its
    // time limit, and `completed` — the last message, its output empty as for any run
    // that did not succeed — comes when the client reads.
    let peak = Peak::start(pid);
    let mut c = open(&a);
    let run = |c: &mut RawWs, code: &str, timeout: u64| {
        let msg = json!({"type": "execute", "code": code, "timeout_secs": timeout});
        c.send(0x81, msg.to_string().as_bytes(), false);
    };
    run(&mut c, "while True:\n    print('x' * 1000)", 3);
    std::thread::sleep(Duration::from_secs(5));
    let (op, p) = c.recv().expect("completed");
    let v: Value = serde_json::from_slice(&p).unwrap();
    a.expect(
        op == 1 && v["type"] == "completed" && v["status"] == "timeout" && v["stdout"] == "",
        || format!("W8: an endless print got {v}"),
    );
    // A run that prints 5 MB and ends: `completed` holds the output cut at 1 Mi
    // characters with the truncation line; the client takes it 1 KiB at a time at
    // first, then at once.
    run(&mut c, "for _ in range(5000):\n    print('x' * 1000)", 30);
    std::thread::sleep(Duration::from_secs(2));
    let mut got = Vec::new();
    let mut b = [0u8; 1024];
    for _ in 0..20 {
        let n = c.s.read(&mut b).unwrap();
        got.extend_from_slice(&b[..n]);
        std::thread::sleep(Duration::from_millis(100));
    }
    // One text frame with a 64-bit length: read to its end.
    a.expect(
        got.first() == Some(&0x81) && got.get(1) == Some(&127),
        || format!("W8: the answer starts {:?}", &got[..got.len().min(10)]),
    );
    let end = got.get(2..10).map_or(0, |l| {
        10 + u64::from_be_bytes(l.try_into().unwrap()) as usize
    });
    let mut chunk = vec![0u8; 1 << 16];
    while got.len() < end {
        match c.s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
        }
    }
    a.expect(got.len() >= end, || {
        format!(
            "W8: the connection ended {} bytes into a frame of {end}",
            got.len()
        )
    });
    // `completed` is the last message: after it, nothing but the idle close (1001,
    // ISOBOX_IDLE_TIMEOUT_MS after the run).
    let mut after = got.split_off(end.min(got.len()));
    c.s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    while after.len() < 4 {
        match c.s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => after.extend_from_slice(&chunk[..n]),
        }
    }
    a.expect(
        after.is_empty() || (after[0] == 0x88 && after.get(2..4) == Some(&[0x03, 0xe9][..])),
        || {
            format!(
                "W8: after `completed` came {:?}",
                &after[..after.len().min(16)]
            )
        },
    );
    let v: Value = serde_json::from_slice(&got[10.min(got.len())..]).unwrap_or(Value::Null);
    let out = v["stdout"].as_str().unwrap_or_default();
    a.expect(
        v["status"] == "success"
            && got.len() - 10 <= 1 << 20
            && out.len() > 1_000_000
            && out.ends_with(
                "\n[output cut to fit a 1 MiB WebSocket message; POST /v1/execute returns it whole]\n",
            ),
        || {
            format!(
                "W8: a 5 MB print got status {} and {} characters of stdout ending {:?}",
                v["status"],
                out.len(),
                &out[out.len().saturating_sub(60)..]
            )
        },
    );
    drop(c);
    let grown = peak.stop();
    eprintln!("W8: RSS +{} KiB", grown / 1024);
    // The answer (1 MiB of output as JSON) queued for the slow reader, twice over for
    // its encoding, and 4 MiB of slack.
    a.expect(grown < 8 << 20, || {
        format!("W8: RSS grew by {} KiB", grown / 1024)
    });
    a.finish();
}
