//! Raw sockets: bytes written as they are, responses read until the daemon closes.

use crate::common::{read_response, Resp};
use std::io::{BufReader, Cursor, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// Reads until the peer closes (true) or `wait` passes (false).
pub fn read_until_close(s: &mut TcpStream, wait: Duration) -> (Vec<u8>, bool) {
    let deadline = Instant::now() + wait;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return (buf, false);
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut chunk) {
            Ok(0) => return (buf, true),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return (buf, true),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return (buf, false),
        }
    }
}

pub fn parse_all(buf: Vec<u8>) -> Vec<Resp> {
    let mut r = BufReader::new(Cursor::new(buf));
    let mut out = Vec::new();
    while let Some(resp) = read_response(&mut r, false) {
        out.push(resp);
    }
    out
}

/// Writes `bytes` from a second thread (errors ignored: the daemon may close early) and
/// reads until the daemon closes or `wait` passes. Returns the responses and whether the
/// daemon closed the connection.
pub fn raw_send(addr: SocketAddr, bytes: &[u8], wait: Duration) -> (Vec<Resp>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut w = s.try_clone().unwrap();
    let data = bytes.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = w.write_all(&data);
    });
    let (buf, closed) = read_until_close(&mut s, wait);
    let _ = s.shutdown(std::net::Shutdown::Both);
    let _ = writer.join();
    (parse_all(buf), closed)
}

/// HTTP status of one request sent by curl from another loopback source address.
pub fn curl_from(source: &str, url: &str, extra: &[&str]) -> u16 {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5"])
        .args(["--interface", source])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}
