//! Filtered egress ("network": true) against a fake internet: each test creates its own
//! pair of network namespaces (tests/common/fakenet.rs), runs isoboxd inside the
//! "harness" one, whose only uplink leads to "fakenet", and checks what a user would:
//! the public stand-ins are reachable, nothing denied is (a connection logged by a denied
//! fake host fails the case), the report (`run.network`, `warning`, `egress` in
//! /readyz) is honest, tampering with the firewall is noticed and repaired, and nothing
//! is left behind. No traffic ever leaves the namespaces the test created.

mod common;
#[path = "common/fakenet.rs"]
mod fakenet;

use common::session::Session;
use common::sse::Stream;
use common::{in_netns, merged, Daemon};
use fakenet::{
    sh, try_sh, FakeNet, Hit, DNS, HARNESS_UPLINK, PUBLIC, PUBLIC2, PUBLIC_BODY, SECRET_BODY, SMTP,
};
use serde_json::{json, Map, Value};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

const WARNING: &str =
    "network requested but currently unavailable (egress firewall not verified); ran with network OFF";

/// Python helpers every probe script starts with. `probe({name: (fn, *args)})` runs the
/// cases concurrently and prints one `RESULT {json}` line: "OK ..." when a TCP connect
/// succeeded (then what the peer sent) or a UDP answer arrived, "ERR ..." otherwise.
const PRELUDE: &str = r#"
import socket, json, time, concurrent.futures as _cf
def _err(e): return 'ERR ' + type(e).__name__ + ': ' + str(e)
def tcp(h, p, send=b'', t=2.0):
    try:
        s = socket.create_connection((h, p), t)
    except Exception as e:
        return _err(e)
    out = b''
    try:
        s.settimeout(t)
        if send: s.sendall(send)
        while len(out) < 4096:
            d = s.recv(4096)
            if not d: break
            out += d
    except Exception as e:
        pass
    finally:
        s.close()
    return 'OK ' + out.decode('latin1')
def http(h, p=80, path='/'):
    return tcp(h, p, ('GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' % (path, h)).encode())
def urlopen(url):
    import urllib.request
    try:
        return 'OK ' + urllib.request.urlopen(url, timeout=3).read().decode('latin1')
    except Exception as e:
        return _err(e)
def dnsq(name, qid=0x1234):
    q = qid.to_bytes(2, 'big') + b'\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00'
    for l in name.split('.'): q += bytes([len(l)]) + l.encode()
    return q + b'\x00\x00\x01\x00\x01'
def udp(h, p, payload=b'probe', t=2.0, bcast=False):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(t)
    try:
        if bcast: s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        s.sendto(payload, (h, p))
        d, a = s.recvfrom(2048)
        return 'OK ' + a[0] + ' ' + d.hex()
    except Exception as e:
        return _err(e)
    finally:
        s.close()
def dns(server, name): return udp(server, 53, dnsq(name))
def resolve(name):
    try: return 'OK ' + socket.gethostbyname(name)
    except Exception as e: return _err(e)
def myaddr():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(('198.51.100.7', 9)); return s.getsockname()[0]
    except Exception as e: return _err(e)
    finally: s.close()
def me():
    a = myaddr()
    return a if a.startswith('ERR') else 'OK ' + a
def probe(cases):
    with _cf.ThreadPoolExecutor(max(1, min(64, len(cases)))) as ex:
        futs = {k: ex.submit(c[0], *c[1:]) for k, c in cases.items()}
        res = {k: f.result() for k, f in futs.items()}
    print('RESULT ' + json.dumps(res, sort_keys=True), flush=True)
"#;

// ---------------------------------------------------------------------------------------
// Harness helpers
// ---------------------------------------------------------------------------------------

/// The fake internet plus a daemon in its harness namespace, egress verified (unless
/// `env` turns it off).
fn setup(env: &[(&str, &str)]) -> (FakeNet, Daemon) {
    let fake = FakeNet::new();
    let mut e = vec![("ISOBOX_NET_DNS", DNS)];
    e.extend_from_slice(env);
    let d = Daemon::start_in_netns(&fake.harness, &e);
    // nsenter execs: the child's pid is isoboxd's own.
    let exe = std::fs::read_link(format!("/proc/{}/exe", d.pid())).unwrap();
    assert!(
        exe.to_string_lossy().ends_with("isoboxd"),
        "pid() is isoboxd: {}",
        exe.display()
    );
    d.wait_ready();
    (fake, d)
}

fn table(d: &Daemon) -> String {
    d.instance.replace('-', "_")
}

/// The `egress` object of /readyz (asserting /readyz is 200 and carries it).
fn egress(d: &Daemon, path: &str) -> Value {
    let r = d.get(path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    let v = r.json();
    assert!(v["egress"].is_object(), "{path} has no egress object: {v}");
    v["egress"].clone()
}

/// Polls /readyz until egress is in `state`; returns how long it took.
fn wait_egress(d: &Daemon, state: &str, within: Duration) -> Duration {
    let t0 = Instant::now();
    loop {
        let e = egress(d, "/readyz");
        if e["state"] == state {
            return t0.elapsed();
        }
        assert!(
            t0.elapsed() < within,
            "egress never became {state} within {within:?}: {e}\nlog:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `PRELUDE + code` in `language: python` with `extra` merged into the body;
/// returns the response and the `RESULT` map.
fn run(d: &Daemon, code: &str, extra: Value) -> (Value, Map<String, Value>) {
    let r = d.execute(merged(
        json!({"language": "python", "code": format!("{PRELUDE}\n{code}")}),
        extra,
    ));
    let res = result_of(&r);
    (r, res)
}

fn result_of(r: &Value) -> Map<String, Value> {
    let out = r["run"]["stdout"].as_str().unwrap_or("");
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line: {r}"));
    serde_json::from_str::<Value>(line)
        .unwrap()
        .as_object()
        .unwrap()
        .clone()
}

fn ok(res: &Map<String, Value>, k: &str) -> bool {
    res[k].as_str().unwrap().starts_with("OK")
}

/// Asserts every named probe failed, and no secret came back.
fn assert_all_err(res: &Map<String, Value>, keys: &[String], ctx: &Value) {
    let reached: Vec<String> = keys
        .iter()
        .filter(|k| ok(res, k))
        .map(|k| format!("{k} => {}", res[k.as_str()]))
        .collect();
    assert!(
        reached.is_empty(),
        "denied destinations reached: {reached:#?}\nrun: {ctx}"
    );
    assert!(
        !ctx.to_string().contains(SECRET_BODY),
        "secret leaked: {ctx}"
    );
}

fn assert_no_denied_hits(fake: &FakeNet, d: &Daemon) {
    let hits: Vec<Hit> = fake.denied_hits();
    assert!(
        hits.is_empty(),
        "denied fake hosts logged connections: {hits:#?}\nlog:\n{}",
        d.log()
    );
}

/// Runs the command in the harness namespace, asserting success.
fn harness(fake: &FakeNet, args: &[&str]) -> String {
    let (ok, out) = fake.in_harness(args);
    assert!(ok, "{args:?} in {}: {out}", fake.harness);
    out
}

fn nft_table_exists(fake: &FakeNet, d: &Daemon) -> bool {
    fake.in_harness(&["nft", "list", "table", "inet", &table(d)])
        .0
}

fn poll(what: &str, within: Duration, mut f: impl FnMut() -> Result<(), String>) {
    let t0 = Instant::now();
    loop {
        match f() {
            Ok(()) => return,
            Err(e) => assert!(t0.elapsed() < within, "{what} (after {within:?}): {e}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The end of every egress test: nothing of the runs is left (runsc, cgroups, the
/// per-run netns files, veths), and on stop the daemon's nft table goes too.
fn finish(fake: FakeNet, d: Daemon, egress_on: bool) {
    d.assert_clean();
    // The brief put them under /run/isobox/<instance>/netns; the daemon keeps them under
    // <data dir>/net/ns. Check both, and any nsfs mount naming the instance.
    let nsdirs = [
        std::path::PathBuf::from(format!("/run/isobox/{}/netns", d.instance)),
        d.data_dir.join("net/ns"),
    ];
    poll(
        "per-run netns files removed",
        Duration::from_secs(10),
        || {
            let mut left: Vec<String> = nsdirs
                .iter()
                .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
                .map(|e| e.path().display().to_string())
                .collect();
            left.extend(nsfs_mounts(&d.instance));
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    );
    let run_dir = std::path::PathBuf::from(format!("/run/isobox/{}", d.instance));
    poll(
        "no mounts left under the run dir",
        Duration::from_secs(10),
        || {
            let left = common::mounts_under(&run_dir);
            if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            }
        },
    );
    poll("per-run veths removed", Duration::from_secs(10), || {
        let links = fake.harness_links();
        if links.iter().any(|l| l.starts_with("ib")) {
            Err(format!("{links:?}"))
        } else {
            Ok(())
        }
    });
    assert_eq!(
        nft_table_exists(&fake, &d),
        egress_on,
        "nft table inet {} present while running",
        table(&d)
    );
    let (name, instance) = (table(&d), d.instance.clone());
    d.stop();
    let (exists, out) = fake.in_harness(&["nft", "list", "table", "inet", &name]);
    assert!(!exists, "nft table inet {name} left after stop: {out}");
    let links = fake.harness_links();
    assert_eq!(
        links,
        vec!["lo", "uplink0"],
        "links left in the harness netns"
    );
    assert!(
        !std::path::Path::new(&format!("/run/isobox/{instance}")).exists(),
        "state dir left"
    );
    drop(fake);
}

/// Mount points of network namespace files (nsfs) whose path names the instance.
fn nsfs_mounts(instance: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mp = left.split(' ').nth(4)?;
            (right.split(' ').next() == Some("nsfs") && mp.contains(instance))
                .then(|| format!("nsfs mount {mp}"))
        })
        .collect()
}

/// From a thread in `ns`: TCP connect (2 s), send, read until close.
fn tcp_from(ns: &str, addr: &str, send: &'static [u8]) -> Result<String, String> {
    let addr: SocketAddr = addr.parse().unwrap();
    in_netns(ns, move || {
        let mut s =
            TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        s.write_all(send).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        Ok(String::from_utf8_lossy(&out).into_owned())
    })
}

/// From a thread in `ns`: one UDP datagram, the answer (2 s).
fn udp_from(ns: &str, addr: &str, payload: Vec<u8>) -> Result<Vec<u8>, String> {
    let addr: SocketAddr = addr.parse().unwrap();
    in_netns(ns, move || {
        let any: SocketAddr = if addr.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        let u = UdpSocket::bind(any).map_err(|e| e.to_string())?;
        u.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        u.send_to(&payload, addr).map_err(|e| e.to_string())?;
        let mut buf = [0u8; 1500];
        let (n, _) = u.recv_from(&mut buf).map_err(|e| e.to_string())?;
        Ok(buf[..n].to_vec())
    })
}

fn dns_query(name: &str) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for l in name.split('.') {
        q.push(l.len() as u8);
        q.extend_from_slice(l.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

// ---------------------------------------------------------------------------------------
// The fake internet itself (no daemon)
// ---------------------------------------------------------------------------------------

#[test]
fn test_fake_internet_reachable_from_harness_and_logged() {
    let fake = FakeNet::new();
    let (h, f) = (fake.harness.clone(), fake.fakenet.clone());
    // Public stand-ins answer HTTP; the request is logged with the uplink as source.
    for host in [PUBLIC, PUBLIC2] {
        let body = tcp_from(&h, &format!("{host}:80"), b"GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(body.contains(PUBLIC_BODY), "{host}: {body}");
    }
    let banner = tcp_from(&h, &format!("{PUBLIC}:443"), b"").unwrap();
    assert!(banner.starts_with("fake-tls"), "{banner}");
    let hits = fake.hits_to(PUBLIC);
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert!(hits
        .iter()
        .all(|h| h.peer.ip() == std::net::IpAddr::V4(HARNESS_UPLINK) && h.ns == "fakenet"));
    // The fake resolver answers from its map.
    let a = udp_from(&h, &format!("{DNS}:53"), dns_query("public.test")).unwrap();
    assert_eq!(&a[a.len() - 4..], &[198, 51, 100, 7], "{a:?}");
    let a = udp_from(&h, &format!("{DNS}:53"), dns_query("rebind.test")).unwrap();
    assert_eq!(&a[a.len() - 4..], &[10, 0, 0, 1], "{a:?}");
    let a = udp_from(&h, &format!("{DNS}:53"), dns_query("nx.test")).unwrap();
    assert_eq!(a[3] & 0x0f, 3, "NXDOMAIN");
    assert!(fake
        .hits_to(DNS)
        .iter()
        .any(|h| h.detail == "public.test type 1"));
    // Every denied fake host exists (so a failure from a sandbox is the firewall's
    // doing) and logs what reaches it; the same for SMTP and v6.
    fake.clear();
    for a in fakenet::DENIED_V4 {
        let body = tcp_from(&h, &format!("{a}:80"), b"GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(body.contains(SECRET_BODY), "{a}: {body}");
        assert!(
            udp_from(&h, &format!("{a}:53"), dns_query("public.test")).is_ok(),
            "{a}"
        );
    }
    for p in [25, 465, 587] {
        let b = tcp_from(&h, &format!("{SMTP}:{p}"), b"").unwrap();
        assert!(b.starts_with("220 "), "{b}");
    }
    let b = tcp_from(&h, "[2001:db8::7]:443", b"").unwrap();
    assert!(b.starts_with("fake-tls-v6"), "{b}");
    assert_eq!(
        fake.denied_hits().len(),
        fakenet::DENIED_V4.len() * 2 + 3 + 1,
        "{:#?}",
        fake.denied_hits()
    );
    // The harness namespace's own listeners log too (as seen from fakenet).
    fake.clear();
    let b = tcp_from(
        &f,
        &format!("{HARNESS_UPLINK}:{}", fake.host_port),
        b"GET / HTTP/1.0\r\n\r\n",
    )
    .unwrap();
    assert!(b.contains(SECRET_BODY));
    assert!(udp_from(
        &f,
        &format!("{HARNESS_UPLINK}:53"),
        dns_query("public.test")
    )
    .is_ok());
    let hits = fake.hits();
    assert_eq!(hits.len(), 2, "{hits:?}");
    assert!(hits.iter().all(|h| h.ns == "harness"));
    // ... over IPv6 too (the listeners are dual-stack).
    let b = tcp_from(
        &f,
        &format!("[2001:db8:ff::2]:{}", fake.host_port),
        b"GET / HTTP/1.0\r\n\r\n",
    )
    .unwrap();
    assert!(b.contains(SECRET_BODY));
    assert_eq!(fake.hits().len(), 3);
    // What the test publishes, the public stand-in serves.
    fake.publish("/v6-target", "fe80::1");
    let b = tcp_from(
        &h,
        &format!("{PUBLIC}:80"),
        b"GET /v6-target HTTP/1.0\r\n\r\n",
    )
    .unwrap();
    assert!(b.ends_with("\r\n\r\nfe80::1"), "{b}");
    // External tools run in the harness netns through nsenter (as the daemon will).
    let out = harness(
        &fake,
        &["curl", "-s", "-m", "3", &format!("http://{PUBLIC}/")],
    );
    assert_eq!(out, PUBLIC_BODY);
    // The harness netns has only the uplink and loopback, and one default route.
    assert_eq!(fake.harness_links(), vec!["lo", "uplink0"]);
    let routes = harness(&fake, &["ip", "-4", "route", "show", "default"]);
    assert_eq!(
        routes.trim(),
        "default via 192.0.2.1 dev uplink0",
        "{routes}"
    );
    // Both namespaces are gone after drop.
    drop(fake);
    for ns in [h, f] {
        assert!(
            !std::path::Path::new(&format!("/run/netns/{ns}")).exists(),
            "{ns} left"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Against the daemon
// ---------------------------------------------------------------------------------------

fn is_sandbox_addr(a: &str) -> bool {
    match a.parse::<Ipv4Addr>() {
        Ok(ip) => {
            let o = ip.octets();
            o[0] == 10 && o[1] == 200 && o[3] % 4 == 2
        }
        Err(_) => false,
    }
}

/// N10 (positive control) by address and by name, the resolver, N11 (names resolving to
/// denied addresses), and `"network": false` (no network at all, no warning).
#[test]
fn test_public_reachable_by_ip_and_name_and_network_false_is_offline() {
    let (fake, d) = setup(&[]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    assert!(egress(&d, "/readyz").get("reason").is_none());
    assert_eq!(egress(&d, "/healthz")["state"], "verified");
    fake.clear();
    // The resolvers' file is bound over the runtime's tree's own, which stays as it was
    // (the tree itself may be the run's root: `sandbox::bundle::mount_points_in`).
    let etc = std::path::Path::new("/var/lib/isobox/rootfs/python/etc");
    let stamp = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        let m = p.symlink_metadata().unwrap();
        (
            m.mode(),
            m.len(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec(),
        )
    };
    let tree_before = (
        stamp(etc),
        stamp(&etc.join("resolv.conf")),
        std::fs::read(etc.join("resolv.conf")).unwrap(),
    );
    let code = r#"
print('RESOLV ' + json.dumps(open('/etc/resolv.conf').read()))
probe({
    'tcp443': (tcp, '198.51.100.7', 443),
    'http80': (http, '198.51.100.7'),
    'http_public2': (http, '203.0.113.9'),
    'urllib': (urlopen, 'http://198.51.100.7/'),
    'resolve_public': (resolve, 'public.test'),
    'url_by_name': (urlopen, 'http://public.test/'),
    'resolve_meta': (resolve, 'meta.evil.test'),
    'resolve_rebind': (resolve, 'rebind.test'),
    'url_meta': (urlopen, 'http://meta.evil.test/latest/meta-data/'),
    'url_rebind': (urlopen, 'http://rebind.test/'),
    'me': (me,),
})
"#;
    let (r, res) = run(&d, code, json!({}));
    assert_eq!(r["run"]["exitCode"], 0, "{r}");
    assert_eq!(
        r["run"]["network"],
        true,
        "network defaults to on: {r}\nlog:\n{}",
        d.log()
    );
    assert!(r.get("warning").is_none(), "{r}");
    for k in ["tcp443", "http80", "http_public2", "urllib", "url_by_name"] {
        assert!(ok(&res, k), "{k}: {res:#?}");
    }
    for k in ["http80", "http_public2", "urllib", "url_by_name"] {
        assert!(
            res[k].as_str().unwrap().contains(PUBLIC_BODY),
            "{k}: {res:#?}"
        );
    }
    assert_eq!(res["resolve_public"], "OK 198.51.100.7");
    assert_eq!(res["resolve_meta"], "OK 169.254.169.254");
    assert_eq!(res["resolve_rebind"], "OK 10.0.0.1");
    assert_all_err(&res, &["url_meta".into(), "url_rebind".into()], &r);
    let me = res["me"]
        .as_str()
        .unwrap()
        .trim_start_matches("OK ")
        .to_string();
    assert!(
        is_sandbox_addr(&me),
        "sandbox address {me} is .2 of a /30 in 10.200.0.0/16"
    );
    // resolv.conf names exactly the configured resolver.
    let stdout = r["run"]["stdout"].as_str().unwrap();
    let resolv: String = serde_json::from_str(
        stdout
            .lines()
            .find_map(|l| l.strip_prefix("RESOLV "))
            .unwrap(),
    )
    .unwrap();
    let ns: Vec<&str> = resolv
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .map(str::trim)
        .collect();
    assert_eq!(ns, vec![DNS], "resolv.conf: {resolv:?}");
    assert_eq!(
        (
            stamp(etc),
            stamp(&etc.join("resolv.conf")),
            std::fs::read(etc.join("resolv.conf")).unwrap()
        ),
        tree_before
    );
    // What the fake hosts saw: masqueraded connections from the harness uplink, the
    // resolver asked for every name, and no denied host reached.
    let public = fake.hits_to(PUBLIC);
    assert!(public.len() >= 4, "{public:#?}");
    for h in public.iter().chain(fake.hits_to(PUBLIC2).iter()) {
        assert_eq!(
            h.peer.ip(),
            std::net::IpAddr::V4(HARNESS_UPLINK),
            "masquerade: {h:?}"
        );
    }
    let asked: Vec<String> = fake.hits_to(DNS).iter().map(|h| h.detail.clone()).collect();
    for name in ["public.test", "meta.evil.test", "rebind.test"] {
        assert!(
            asked.contains(&format!("{name} type 1")),
            "{name}: {asked:?}"
        );
    }
    assert_no_denied_hits(&fake, &d);

    // "network": false: nothing is reachable, nothing logged, no warning.
    fake.clear();
    let code = r#"
probe({
    'tcp443': (tcp, '198.51.100.7', 443),
    'http80': (http, '198.51.100.7'),
    'resolve_public': (resolve, 'public.test'),
    'dns': (dns, '198.51.100.53', 'public.test'),
    'me': (me,),
})
"#;
    let (r, res) = run(&d, code, json!({"network": false}));
    assert_eq!(r["run"]["exitCode"], 0, "{r}");
    assert_eq!(r["run"]["network"], false, "{r}");
    assert!(
        r.get("warning").is_none(),
        "no warning when network is not asked: {r}"
    );
    let keys: Vec<String> = res.keys().cloned().collect();
    assert_all_err(&res, &keys, &r);
    let hits = fake.hits();
    assert!(
        hits.is_empty(),
        "an offline run reached the fake net: {hits:#?}"
    );
    // An explicit "network": true is the default's twin.
    let (r, res) = run(
        &d,
        "probe({'http80': (http, '198.51.100.7')})",
        json!({"network": true}),
    );
    assert_eq!(r["run"]["network"], true, "{r}");
    assert!(r.get("warning").is_none(), "{r}");
    assert!(
        res["http80"].as_str().unwrap().contains(PUBLIC_BODY),
        "{res:?}"
    );
    finish(fake, d, true);
}

/// Issue 28: a networked cold run on its runtime's root image has no gofer either. Its
/// loader binds the daemon's resolvers over the image's `/etc/resolv.conf` (read-only,
/// as the tree's bind from the host was), gives up what it needed for that before the
/// program's files, and the program reaches what it may by address and by name, as the
/// sandbox user with no capability, its workspace holding only its own files.
#[test]
fn test_a_networked_run_on_the_root_image_has_no_gofer_and_the_daemons_resolvers() {
    let (fake, d) = setup(&[("ISOBOX_WARM_POOL", "off")]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    // The tree's first run that could use its image asks for it (made once a host, then
    // shared by every daemon); runs use the tree until it is ready.
    let t = Instant::now();
    loop {
        let r = d.execute(json!({"language": "python", "code": "print(1)"}));
        assert_eq!(
            (r["run"]["stdout"].as_str(), r["run"]["network"].as_bool()),
            (Some("1\n"), Some(true)),
            "{r}"
        );
        let h = d.get("/healthz").json();
        let state = &h["rootImages"]["trees"]["python"]["state"];
        if state == "ready" {
            break;
        }
        assert_eq!(state, "building", "{h}");
        assert!(t.elapsed() < Duration::from_secs(240), "{h}\n{}", d.log());
        std::thread::sleep(Duration::from_millis(300));
    }
    fake.clear();
    let code = format!(
        "{PRELUDE}\n{}",
        r#"
import errno, os
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
print('STATUS ' + json.dumps({k: st[k] for k in ('Uid', 'Gid', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd')}))
print('RESOLV ' + json.dumps(open('/etc/resolv.conf').read()))
print('LS ' + json.dumps(sorted(os.listdir('.'))) + ' ' + open('data/in.txt').read())
print('MOUNT ' + ' '.join(l.split()[5] for l in open('/proc/self/mountinfo') if l.split()[4] == '/etc/resolv.conf'))
def tried(f):
    try:
        f(); return 'ok'
    except OSError as e:
        return 'refused' if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.EBUSY, errno.EXDEV) else errno.errorcode[e.errno]
print('TRIED', tried(lambda: open('/etc/resolv.conf', 'a')), tried(lambda: os.unlink('/etc/resolv.conf')),
      tried(lambda: os.rename('/etc/resolv.conf', '/etc/r')), tried(lambda: os.rename('/etc/resolv.conf', '/tmp/r')),
      tried(lambda: open('mine', 'w').write('m')))
probe({
    'http80': (http, '198.51.100.7'),
    'resolve_public': (resolve, 'public.test'),
    'url_by_name': (urlopen, 'http://public.test/'),
    'meta': (http, '169.254.169.254'),
})
time.sleep(1)
"#
    );
    let body = json!({"language": "python", "code": code,
        "files": [{"name": "data/in.txt", "content": "in"}]});
    let common::Watched {
        result: r,
        config,
        procs,
        host_procs,
    } = common::watched_run(&d, &body);
    assert!(!procs.iter().any(|p| p.contains("gofer")), "{procs:?}");
    // The loader's CAP_SYS_ADMIN is gVisor's alone: on the host the sandbox process
    // and its stubs are nobody with no capability (runsc without directfs).
    common::assert_no_host_privilege(&host_procs);
    assert!(
        config["annotations"]["dev.gvisor.spec.rootfs.source"]
            .as_str()
            .is_some_and(|i| i.contains("/python.") && i.ends_with(".erofs")),
        "{config}"
    );
    // No mount from the host: the resolvers come in the loader's archive.
    assert_eq!(
        common::spec_mounts(&config),
        [
            ("/proc", "proc"),
            ("/tmp", "tmpfs"),
            ("/workspace", "tmpfs")
        ],
        "{config}"
    );
    assert!(
        config["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "network" && n["path"].is_string()),
        "the run's own namespace: {config}"
    );
    // Inside gVisor only the loader holds CAP_SYS_ADMIN (for the bind), given up
    // before the files.
    assert_eq!(
        config["process"]["capabilities"]["bounding"],
        json!(["CAP_SETGID", "CAP_SETPCAP", "CAP_SETUID", "CAP_SYS_ADMIN"]),
        "{config}"
    );
    assert_eq!(
        (
            r["run"]["exitCode"].as_i64(),
            r["run"]["network"].as_bool(),
            r["run"]["stderr"].as_str()
        ),
        (Some(0), Some(true), Some("")),
        "{r}"
    );
    assert!(r.get("warning").is_none(), "{r}");
    let out = r["run"]["stdout"].as_str().unwrap();
    let line = |p: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(p))
            .unwrap_or_else(|| panic!("no {p}line: {r}"))
            .to_string()
    };
    let nobody = "65534\t65534\t65534\t65534";
    let zero = "0000000000000000";
    assert_eq!(
        serde_json::from_str::<Value>(&line("STATUS ")).unwrap(),
        json!({"Uid": nobody, "Gid": nobody, "CapInh": zero, "CapPrm": zero, "CapEff": zero, "CapBnd": zero}),
        "{r}"
    );
    // Byte for byte the file a run on the tree has bound from the host.
    let want = std::fs::read_to_string(d.data_dir.join("net/resolv.conf")).unwrap();
    assert!(want.contains(&format!("nameserver {DNS}\n")), "{want}");
    assert_eq!(
        serde_json::from_str::<String>(&line("RESOLV ")).unwrap(),
        want,
        "{r}"
    );
    assert_eq!(line("LS "), r#"["data", "main.py"] in"#, "{r}");
    // Mounted read-only (gVisor shows ro and noexec of the flags asked for).
    let opts = line("MOUNT ");
    assert!(
        opts.split(',').any(|o| o == "ro") && opts.split(',').any(|o| o == "noexec"),
        "{r}"
    );
    assert_eq!(line("TRIED "), "refused refused refused refused ok", "{r}");
    let res = result_of(&r);
    assert!(
        res["http80"].as_str().unwrap().contains(PUBLIC_BODY)
            && res["url_by_name"].as_str().unwrap().contains(PUBLIC_BODY),
        "{res:?}"
    );
    assert_eq!(res["resolve_public"], "OK 198.51.100.7", "{res:?}");
    assert_all_err(&res, &["meta".into()], &r);
    let asked: Vec<String> = fake.hits_to(DNS).iter().map(|h| h.detail.clone()).collect();
    assert!(
        asked.contains(&"public.test type 1".to_string()),
        "{asked:?}"
    );
    assert_no_denied_hits(&fake, &d);
    finish(fake, d, true);
}

/// N1, N2, N3 (metadata, link-local, private and CGNAT ranges, to their far ends), N4
/// (the daemon's host through the gateway and the uplink), N8 (IPv6 and v4-mapped), N9
/// (SMTP), N12 (the gateway's DNS), all in one run beside the positive control.
#[test]
fn test_denied_destinations_fail_and_no_fake_host_sees_them() {
    let (fake, d) = setup(&[]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    fake.clear();
    let denied: Vec<String> = fakenet::DENIED_V4
        .iter()
        .map(|s| format!("'{s}'"))
        .collect();
    let code = format!(
        r#"
me = myaddr()
o = [int(x) for x in me.split('.')]
gw = '%d.%d.%d.%d' % (o[0], o[1], o[2], o[3] - 1)
print('ME', me, 'GW', gw)
DP, HP, UP = {dp}, {hp}, '{up}'
cases = {{}}
for h in [{denied}]:
    cases['N3 tcp80 ' + h] = (http, h)
    cases['N3 udp53 ' + h] = (dns, h, 'public.test')
cases['N1 urllib metadata'] = (urlopen, 'http://169.254.169.254/latest/meta-data/')
cases['N4 gw daemon port'] = (http, gw, DP, '/healthz')
cases['N4 gw host tcp'] = (http, gw, HP)
cases['N4 gw host udp'] = (udp, gw, HP)
cases['N4 uplink daemon port'] = (http, UP, DP, '/healthz')
cases['N4 uplink host tcp'] = (http, UP, HP)
cases['N4 uplink host udp'] = (udp, UP, HP)
cases['N4 own loopback daemon port'] = (http, '127.0.0.1', DP, '/healthz')
cases['N8 v6 443'] = (tcp, '2001:db8::7', 443)
cases['N8 v6 80'] = (http, '2001:db8::7', 80)
cases['N8 v4-mapped metadata'] = (http, '::ffff:169.254.169.254', 80)
for p in (25, 465, 587):
    cases['N9 smtp %d' % p] = (tcp, '198.51.100.25', p)
cases['N12 gw dns udp'] = (dns, gw, 'public.test')
cases['N12 gw dns tcp'] = (tcp, gw, 53)
cases['N12 uplink dns udp'] = (dns, UP, 'public.test')
cases['allowed http'] = (http, '198.51.100.7')
cases['allowed dns'] = (dns, '198.51.100.53', 'public.test')
probe(cases)
"#,
        dp = d.addr.port(),
        hp = fake.host_port,
        up = HARNESS_UPLINK,
        denied = denied.join(", "),
    );
    let t0 = Instant::now();
    let (r, res) = run(&d, &code, json!({"limits": {"pids": 256}}));
    eprintln!("denied-destinations run took {:?}", t0.elapsed());
    assert_eq!(r["run"]["exitCode"], 0, "{r}");
    assert_eq!(r["run"]["network"], true, "{r}\nlog:\n{}", d.log());
    assert!(r.get("warning").is_none(), "{r}");
    assert!(
        res["allowed http"].as_str().unwrap().contains(PUBLIC_BODY),
        "positive control in the same run: {res:#?}"
    );
    assert!(
        ok(&res, "allowed dns"),
        "configured resolver answers: {res:#?}"
    );
    let denied_keys: Vec<String> = res
        .keys()
        .filter(|k| !k.starts_with("allowed"))
        .cloned()
        .collect();
    assert!(denied_keys.len() > 40, "{denied_keys:?}");
    assert_all_err(&res, &denied_keys, &r);
    assert_eq!(fake.hits_to(SMTP).len(), 0, "fake SMTP logged a connection");
    assert_no_denied_hits(&fake, &d);
    assert!(!fake.hits_to(PUBLIC).is_empty());

    // N4/N8 over IPv6 link-local: the sandbox's interface has an fe80:: address, and so
    // has the host end of its veth (the kernel adds both). The sandbox cannot guess the
    // latter (it derives from a MAC), so the test reads it in the harness netns once the
    // run is up and hands it over through the public stand-in. Limited power: with the
    // daemon's input chain turned to accept (a mutation tried by hand), gVisor's
    // neighbour discovery towards the host still failed in most runs, so this probe
    // mainly guards against a future where it does not.
    fake.clear();
    let code = format!(
        r#"
import urllib.request
ifname = [n for i, n in socket.if_nameindex() if n != 'lo'][0]
scope = socket.if_nametoindex(ifname)
ll = None
end = time.time() + 15
while ll is None and time.time() < end:
    try:
        b = urllib.request.urlopen('http://198.51.100.7/v6-target', timeout=2).read().decode()
        if b != 'fake-public-ok': ll = b
    except Exception:
        pass
    time.sleep(0.2)
print('LL', ll, ifname, flush=True)
def tcp6(a, p, t=2.0):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); s.settimeout(t)
    try:
        s.connect((a, p, 0, scope))
        s.sendall(b'GET / HTTP/1.0\r\n\r\n')
        return 'OK ' + s.recv(4096).decode('latin1')
    except Exception as e:
        return _err(e)
    finally:
        s.close()
def udp6(a, p, payload, t=2.0):
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM); s.settimeout(t)
    try:
        s.sendto(payload, (a, p, 0, scope))
        return 'OK ' + s.recvfrom(2048)[0].hex()
    except Exception as e:
        return _err(e)
    finally:
        s.close()
cases = {{}}
if ll and ll != 'none':
    cases['v6 ll host tcp'] = (tcp6, ll, {hp})
    cases['v6 ll host udp'] = (udp6, ll, {hp}, b'v6-probe')
    cases['v6 ll dns udp'] = (udp6, ll, 53, dnsq('public.test'))
    cases['v6 ll dns tcp'] = (tcp6, ll, 53)
    cases['v6 ll daemon port'] = (tcp6, ll, {dp})
probe(cases)
"#,
        hp = fake.host_port,
        dp = d.addr.port(),
    );
    let (r, res) = std::thread::scope(|s| {
        let h = s.spawn(|| run(&d, &code, json!({})));
        let ll = host_link_local(&fake);
        eprintln!("host end of the run's veth: {ll}");
        fake.publish("/v6-target", &ll);
        h.join().unwrap()
    });
    assert_eq!(r["run"]["network"], true, "{r}");
    let out = r["run"]["stdout"].as_str().unwrap();
    // The daemon turns IPv6 off on both ends of the veth: the host end has no
    // link-local address to probe (the probes above stay for a daemon that would not).
    assert!(out.starts_with("LL none"), "IPv6 left on the host end: {r}");
    assert!(res.is_empty(), "{res:?}");
    let keys: Vec<String> = res.keys().cloned().collect();
    assert_all_err(&res, &keys, &r);
    assert_no_denied_hits(&fake, &d);
    finish(fake, d, true);
}

/// The link-local address of the host end of the (only) per-run veth in the harness
/// netns, once DAD is done (a tentative address drops everything, which would make a
/// probe fail for the wrong reason); "none" if the link has no IPv6 at all.
fn host_link_local(fake: &FakeNet) -> String {
    let t0 = Instant::now();
    let mut link_seen: Option<Instant> = None;
    loop {
        let (_, out) = try_sh(&[
            "ip",
            "-n",
            &fake.harness,
            "-6",
            "-o",
            "addr",
            "show",
            "scope",
            "link",
        ]);
        let links = fake.harness_links();
        if link_seen.is_none() && links.iter().any(|l| l.starts_with("ib")) {
            link_seen = Some(Instant::now());
        }
        for l in out.lines() {
            // "3: ibxxxx@if2    inet6 fe80::.../64 scope link \       valid_lft ..."
            let mut f = l.split_whitespace();
            let dev = f.nth(1).unwrap_or("").split('@').next().unwrap_or("");
            if !dev.starts_with("ib") || l.contains("tentative") {
                continue;
            }
            if let Some(a) = l.split_whitespace().skip_while(|w| *w != "inet6").nth(1) {
                return a.split('/').next().unwrap().to_string();
            }
        }
        if let Some(seen) = link_seen {
            if !out.lines().any(|l| {
                l.split_whitespace()
                    .nth(1)
                    .is_some_and(|d| d.starts_with("ib"))
            }) && seen.elapsed() > Duration::from_secs(3)
            {
                return "none".into();
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "no per-run veth with a usable fe80 address: {out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// N6: a sandbox cannot reach another one (its listening address, its gateway, UDP,
/// broadcasts), while both have working egress.
#[test]
fn test_sandboxes_cannot_reach_each_other() {
    let (fake, d) = setup(&[]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    fake.clear();
    let window = 12;
    let a_code = format!(
        r#"
import select
me = myaddr()
t = socket.create_server(('0.0.0.0', 8000)); t.setblocking(False)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
u.bind(('0.0.0.0', 8000)); u.setblocking(False)
# The listener works: the sandbox reaches itself.
c = socket.create_connection((me, 8000), 2); time.sleep(0.2)
print('SELF', t.accept()[1][0], flush=True); c.close()
print('ADDR ' + me, flush=True)
got = []
end = time.time() + {window}
while time.time() < end:
    r, _, _ = select.select([t, u], [], [], 0.2)
    for s in r:
        try:
            if s is t:
                c, a = t.accept(); got.append(['tcp', a[0]]); c.close()
            else:
                data, a = u.recvfrom(256); got.append(['udp', a[0], data.decode('latin1')])
        except BlockingIOError:
            pass
print('GOT ' + json.dumps(got), flush=True)
"#
    );
    let mut a = Stream::execute(
        &d,
        &json!({"language": "python", "code": format!("{PRELUDE}\n{a_code}"),
                "limits": {"wallTimeMs": 20000}}),
    );
    let a_ip = a.wait_line("ADDR ");
    let t_addr = Instant::now();
    assert!(is_sandbox_addr(&a_ip), "A's address {a_ip}: {}", a.stdout);
    // While A runs, its namespace and veth exist (so the cleanup checks in `finish` are
    // not vacuous).
    assert!(
        !nsfs_mounts(&d.instance).is_empty(),
        "no nsfs mount for a running sandbox; mounts:\n{}",
        std::fs::read_to_string("/proc/self/mountinfo").unwrap()
    );
    assert!(
        fake.harness_links().iter().any(|l| l.starts_with("ib")),
        "{:?}",
        fake.harness_links()
    );
    let b_code = format!(
        r#"
a = '{a_ip}'
o = [int(x) for x in a.split('.')]
gw_a = '%d.%d.%d.%d' % (o[0], o[1], o[2], o[3] - 1)
bc_a = '%d.%d.%d.%d' % (o[0], o[1], o[2], o[3] | 3)
probe({{
    'tcp A': (tcp, a, 8000),
    'udp A': (udp, a, 8000, b'udp-from-b'),
    'broadcast': (udp, '255.255.255.255', 8000, b'bcast-from-b', 2.0, True),
    'subnet broadcast of A': (udp, bc_a, 8000, b'sbcast-from-b', 2.0, True),
    'tcp A gateway': (tcp, gw_a, 8000),
    'allowed http': (http, '198.51.100.7'),
    'me': (me,),
}})
"#
    );
    let (rb, res) = run(&d, &b_code, json!({}));
    let b_took = t_addr.elapsed();
    let ra = a.finish();
    assert_eq!(ra["run"]["network"], true, "{ra}");
    assert_eq!(rb["run"]["network"], true, "{rb}");
    assert!(
        b_took < Duration::from_secs(window - 2),
        "B finished {b_took:?} after A listened; A only listens {window} s"
    );
    let a_out = ra["run"]["stdout"].as_str().unwrap();
    assert!(
        a_out.contains(&format!("SELF {a_ip}\n")),
        "A's listener works: {ra}"
    );
    let got = a_out
        .lines()
        .find_map(|l| l.strip_prefix("GOT "))
        .unwrap_or_else(|| panic!("A did not report: {ra}"));
    assert_eq!(got, "[]", "A received something from B: {got}\nB: {rb}");
    let b_ip = res["me"].as_str().unwrap().trim_start_matches("OK ");
    assert!(is_sandbox_addr(b_ip) && b_ip != a_ip, "B {b_ip}, A {a_ip}");
    assert!(
        res["allowed http"].as_str().unwrap().contains(PUBLIC_BODY),
        "{res:#?}"
    );
    let keys: Vec<String> = ["tcp A", "tcp A gateway"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_all_err(&res, &keys, &rb);
    assert_no_denied_hits(&fake, &d);
    finish(fake, d, true);
}

/// Deleting the daemon's nft table behind its back: noticed at once (not at the next
/// periodic check, which is an hour away here), runs go offline with the warning,
/// /readyz says why, and SIGHUP restores filtered egress.
#[test]
fn test_deleted_table_is_noticed_and_sighup_restores() {
    let (fake, d) = setup(&[("ISOBOX_EGRESS_VERIFY_SEC", "3600")]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    let probe_public =
        "probe({'http80': (http, '198.51.100.7'), 'tcp443': (tcp, '198.51.100.7', 443)})";
    let (r, res) = run(&d, probe_public, json!({}));
    assert_eq!(r["run"]["network"], true, "{r}");
    assert!(ok(&res, "http80") && ok(&res, "tcp443"), "{res:?}");

    harness(&fake, &["nft", "delete", "table", "inet", &table(&d)]);
    let took = wait_egress(&d, "unverified", Duration::from_secs(10));
    eprintln!("table deletion noticed after {took:?}");
    let e = egress(&d, "/readyz");
    eprintln!("/readyz egress after the deletion: {e}");
    assert!(
        e["reason"].as_str().is_some_and(|s| !s.is_empty()),
        "unverified carries a reason: {e}"
    );
    assert_eq!(egress(&d, "/healthz")["state"], "unverified");
    fake.clear();
    let (r, res) = run(&d, probe_public, json!({}));
    assert_eq!(r["run"]["exitCode"], 0, "{r}");
    assert_eq!(r["run"]["network"], false, "{r}");
    assert_eq!(r["warning"], WARNING, "{r}");
    let keys: Vec<String> = res.keys().cloned().collect();
    assert_all_err(&res, &keys, &r);
    assert!(fake.hits().is_empty(), "{:#?}", fake.hits());
    // Still nothing after a moment: the daemon does not repair on its own before the
    // periodic check (an hour here); only SIGHUP does.
    assert_eq!(egress(&d, "/readyz")["state"], "unverified");

    let out = std::process::Command::new("kill")
        .args(["-HUP", &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(out.success());
    let took = wait_egress(&d, "verified", Duration::from_secs(10));
    eprintln!("SIGHUP restored egress after {took:?}");
    assert!(egress(&d, "/readyz").get("reason").is_none());
    assert!(nft_table_exists(&fake, &d), "table is back");
    let (r, res) = run(&d, probe_public, json!({}));
    assert_eq!(r["run"]["network"], true, "{r}\nlog:\n{}", d.log());
    assert!(r.get("warning").is_none(), "{r}");
    assert!(
        res["http80"].as_str().unwrap().contains(PUBLIC_BODY),
        "{res:?}"
    );
    // A dormant table keeps its rules in the dump but filters nothing: not verified.
    let t = table(&d);
    harness(
        &fake,
        &["nft", &format!("add table inet {t} {{ flags dormant; }}")],
    );
    wait_egress(&d, "unverified", Duration::from_secs(10));
    let e = egress(&d, "/readyz");
    assert!(
        e["reason"].as_str().unwrap_or("").contains("dormant"),
        "{e}"
    );
    let (r, _) = run(&d, probe_public, json!({}));
    assert_eq!(r["run"]["network"], false, "{r}");
    assert_eq!(r["warning"], WARNING, "{r}");
    let kill = std::process::Command::new("kill")
        .args(["-HUP", &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    wait_egress(&d, "verified", Duration::from_secs(10));
    assert_no_denied_hits(&fake, &d);
    finish(fake, d, true);
}

/// `ISOBOX_EGRESS=off`: no firewall is programmed, /readyz says "off", and a run that
/// asks for network runs offline with the warning.
#[test]
fn test_egress_off_runs_offline_with_warning_and_programs_nothing() {
    let (fake, d) = setup(&[("ISOBOX_EGRESS", "off")]);
    let e = egress(&d, "/readyz");
    assert_eq!(e["state"], "off", "{e}");
    assert!(e.get("reason").is_none(), "{e}");
    assert!(!nft_table_exists(&fake, &d));
    let (r, res) = run(&d, "probe({'http80': (http, '198.51.100.7')})", json!({}));
    assert_eq!(r["run"]["network"], false, "{r}");
    assert_eq!(r["warning"], WARNING, "{r}");
    assert!(!ok(&res, "http80"), "{res:?}");
    assert!(fake.hits().is_empty(), "{:#?}", fake.hits());
    finish(fake, d, false);
}

/// A run that already has filtered egress when the table disappears goes offline at
/// once (its link is deleted): it is never left with unfiltered network. N15 in the
/// same daemon: raw and packet sockets are refused inside a networked sandbox.
#[test]
fn test_running_sandbox_cut_off_when_table_goes_and_raw_sockets_refused() {
    let (fake, d) = setup(&[("ISOBOX_EGRESS_VERIFY_SEC", "3600")]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    let raw = r#"
import errno
out = {}
for name, args in [('packet', (socket.AF_PACKET, socket.SOCK_RAW, 0)),
                   ('raw icmp', (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)),
                   ('raw tcp', (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))]:
    try:
        socket.socket(*args).close(); out[name] = 'OK created'
    except Exception as e:
        out[name] = _err(e)
print('RESULT ' + json.dumps(out), flush=True)
"#;
    let (r, res) = run(&d, raw, json!({}));
    assert_eq!(r["run"]["network"], true, "{r}");
    for (k, v) in &res {
        let v = v.as_str().unwrap();
        assert!(
            v.contains("PermissionError") || v.contains("Operation not permitted"),
            "N15 {k}: {v}\n{r}"
        );
    }

    // Connects every 0.2 s and says what happened, until told the table is gone.
    let code = r#"
import os
for i in range(150):
    r = tcp('198.51.100.7', 443, t=0.5)
    print('TRY %d %s' % (i, r.split(':')[0].strip()), flush=True)
    time.sleep(0.2)
"#;
    let mut s = Stream::execute(
        &d,
        &json!({"language": "python", "code": format!("{PRELUDE}\n{code}"),
                "limits": {"wallTimeMs": 60000}}),
    );
    s.wait_line("TRY 1 OK");
    harness(&fake, &["nft", "delete", "table", "inet", &table(&d)]);
    wait_egress(&d, "unverified", Duration::from_secs(10));
    // Attempts already under way at the cut may end either way; every one that starts
    // two attempts later must fail, for as long as we watch (8 more).
    let at_cut = s.stdout.lines().filter(|l| l.starts_with("TRY")).count();
    s.wait_line(&format!("TRY {} ", at_cut + 10));
    let after: Vec<&str> = s
        .stdout
        .lines()
        .filter(|l| l.starts_with("TRY"))
        .skip(at_cut + 2)
        .collect();
    assert!(after.len() >= 8, "{}", s.stdout);
    assert!(
        after.iter().all(|l| l.contains(" ERR")),
        "attempts after the table went still connected: {after:?}\nlog:\n{}",
        d.log()
    );
    let kill = std::process::Command::new("kill")
        .args(["-HUP", &d.pid().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    wait_egress(&d, "verified", Duration::from_secs(10));
    drop(s);
    assert_no_denied_hits(&fake, &d);
    finish(fake, d, true);
}

/// S2 for egress: `kill -9` with a networked run in flight leaves its namespace, veth,
/// table and the data dir's bind mount; a restart of the same instance sweeps them,
/// and its firewall is verified before it answers anything (the ready line comes after
/// programming), so the first run after the restart has filtered egress.
#[test]
fn test_crash_leftovers_swept_and_rules_verified_before_first_run() {
    let instance = format!("isobox-egc{}", std::process::id());
    let (fake, mut d) = setup(&[("ISOBOX_INSTANCE", instance.as_str())]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    let mut s = Stream::execute(
        &d,
        &json!({"language": "python",
                "code": format!("{PRELUDE}\nprint('UP', tcp('198.51.100.7', 443)[:2], flush=True)\ntime.sleep(60)"),
                "limits": {"wallTimeMs": 60000}}),
    );
    assert_eq!(s.wait_line("UP "), "OK");
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    drop(s);
    // What the crash left: the run's namespace file, its veth, the table, the bind mount.
    let ns_dir = d.data_dir.join("net/ns");
    let left_ns = std::fs::read_dir(&ns_dir).map(|r| r.count()).unwrap_or(0);
    assert_eq!(left_ns, 1, "the crash left the run's namespace");
    assert!(
        fake.harness_links().iter().any(|l| l.starts_with("ib")),
        "{:?}",
        fake.harness_links()
    );
    assert!(nft_table_exists(&fake, &d));
    assert!(is_mount_point(&d.data_dir), "the data dir's bind mount");
    let data_dir = d.data_dir.clone();
    // Not dropped: the harness's Drop would delete the data dir.
    std::mem::forget(d);

    let d = Daemon::start_in_netns(
        &fake.harness,
        &[
            ("ISOBOX_NET_DNS", DNS),
            ("ISOBOX_INSTANCE", instance.as_str()),
        ],
    );
    assert_eq!(d.data_dir, data_dir);
    // The first thing asked: egress is already verified.
    assert_eq!(egress(&d, "/healthz")["state"], "verified", "{}", d.log());
    assert_eq!(
        std::fs::read_dir(&ns_dir).map(|r| r.count()).unwrap_or(0),
        0,
        "the crashed run's namespace was swept"
    );
    assert!(
        !fake.harness_links().iter().any(|l| l.starts_with("ib")),
        "{:?}",
        fake.harness_links()
    );
    d.wait_ready();
    fake.clear();
    let (r, res) = run(&d, "probe({'http80': (http, '198.51.100.7')})", json!({}));
    assert_eq!(r["run"]["network"], true, "{r}");
    assert!(ok(&res, "http80"), "{res:?}");
    assert_no_denied_hits(&fake, &d);
    finish(fake, d, true);
    assert!(!is_mount_point(&data_dir), "bind mount left after stop");
    assert!(common::mounts_under(&data_dir).is_empty());
}

fn is_mount_point(p: &std::path::Path) -> bool {
    let want = p.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// A minimal pure-Python wheel (`kpkg`, `X = 41`), built with the host's zipfile.
fn tiny_wheel() -> Vec<u8> {
    let path = std::env::temp_dir().join(format!("kpkg-{}.whl", std::process::id()));
    let script = r#"
import sys, zipfile
files = {
    'kpkg/__init__.py': 'X = 41\n',
    'kpkg-1.0.dist-info/METADATA': 'Metadata-Version: 2.1\nName: kpkg\nVersion: 1.0\n',
    'kpkg-1.0.dist-info/WHEEL': 'Wheel-Version: 1.0\nGenerator: isobox-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n',
}
files['kpkg-1.0.dist-info/RECORD'] = ''.join(n + ',,\n' for n in list(files) + ['kpkg-1.0.dist-info/RECORD'])
with zipfile.ZipFile(sys.argv[1], 'w') as z:
    for n, c in files.items():
        z.writestr(n, c)
"#;
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    b
}

#[test]
fn test_kernel_network_is_fixed_at_create_and_pip_install_works() {
    let (fake, d) = setup(&[]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    fake.publish_bytes("/kpkg-1.0-py3-none-any.whl", &tiny_wheel());
    fake.clear();
    let fetch = "import urllib.request\ntry:\n    print('GOT', urllib.request.urlopen('http://198.51.100.7/', timeout=3).read().decode().strip())\nexcept Exception as e:\n    print('ERR', type(e).__name__)";
    // Network on (the default): the public stand-in answers; a step's own
    // `"network": false` does not change the kernel's network.
    let on = Session::create(&d, &json!({"runtime": "python", "type": "kernel"}));
    assert_eq!(on.created["type"], "kernel");
    for step_network in [json!(true), json!(false)] {
        let v = on.step_with(&d, &json!({"code": fetch, "network": step_network}));
        assert_eq!(
            v["run"]["stdout"],
            format!("GOT {}\n", PUBLIC_BODY.trim()),
            "{v}\nlog:\n{}",
            d.log()
        );
        assert_eq!(v["run"]["network"], true, "{v}");
        assert!(v.get("warning").is_none(), "{v}");
    }
    // Still filtered: metadata and SMTP are not reachable.
    let v = on.step_with(&d, &json!({"code": "import socket\nfor a in [('169.254.169.254', 80), ('198.51.100.7', 25)]:\n    try:\n        socket.create_connection(a, timeout=2); print('OPEN', a)\n    except OSError:\n        print('blocked')"}));
    assert_eq!(v["run"]["stdout"], "blocked\nblocked\n", "{v}");
    // pip install --user from the fake host; it imports in the next step.
    let v = on.step_with(&d, &json!({"code": "import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', 'install', '--user', '--no-deps', 'http://198.51.100.7/kpkg-1.0-py3-none-any.whl'], capture_output=True, text=True)\nprint(r.returncode)\nprint(r.stdout[-300:], r.stderr[-600:], file=sys.stderr)", "limits": {"wallTimeMs": 60000}}));
    assert_eq!(v["run"]["stdout"], "0\n", "{v}");
    let v = on.step_with(
        &d,
        &json!({"code": "import kpkg, sys; print(kpkg.X + 1, kpkg.__file__.replace('%d.%d' % sys.version_info[:2], 'X.Y'))"}),
    );
    assert_eq!(
        v["run"]["stdout"], "42 /workspace/.local/lib/pythonX.Y/site-packages/kpkg/__init__.py\n",
        "{v}"
    );
    // Network off at create: nothing is reached, even when a step asks; no warning.
    let off = Session::kernel(&d);
    let v = off.step_with(&d, &json!({"code": fetch, "network": true}));
    assert!(
        v["run"]["stdout"].as_str().unwrap().starts_with("ERR"),
        "{v}"
    );
    assert_eq!(v["run"]["network"], false, "{v}");
    assert!(v.get("warning").is_none(), "{v}");
    for s in [&on, &off] {
        let r = s.delete(&d);
        assert_eq!(r.status, 204, "{}", r.text());
    }
    assert_no_denied_hits(&fake, &d);
    finish(fake, d, true);
}

fn warm_pool(d: &Daemon) -> Value {
    d.get("/healthz").json()["warmPool"].clone()
}

fn wait_pools(d: &Daemon, keys: &[&str]) {
    poll("warm pools full", Duration::from_secs(60), || {
        let p = warm_pool(d);
        if keys
            .iter()
            .all(|k| p["runtimes"][*k]["ready"] == p["runtimes"][*k]["target"])
        {
            Ok(())
        } else {
            Err(p.to_string())
        }
    });
}

#[test]
fn test_warm_pool_networked_sandboxes_are_filtered_and_never_stale() {
    let (fake, d) = setup(&[
        ("ISOBOX_WARM_POOL", "python-slim=1"),
        ("ISOBOX_EGRESS_VERIFY_SEC", "3600"),
    ]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    wait_pools(&d, &["python-slim", "python-slim+net"]);
    // Once the tree's image is ready, the networked pooled sandbox boots on it with no
    // gofer: isobox-start binds its resolvers, then execs the harness as the user,
    // with no frame (`--boot`); on the host, nobody with no capability.
    let t = Instant::now();
    while d.get("/healthz").json()["rootImages"]["trees"]["python-slim"]["state"] != "ready" {
        assert!(t.elapsed() < Duration::from_secs(240), "{}", d.log());
        d.execute(json!({"language": "python-slim", "network": false, "code": "print(1)"}));
        std::thread::sleep(Duration::from_millis(300));
    }
    let pooled_net = || {
        std::fs::read_dir(d.data_dir.join("runs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|b| {
                b.file_name()
                    .is_some_and(|n| n.to_string_lossy().contains("-w"))
            })
            .filter_map(|b| {
                let c: Value =
                    serde_json::from_slice(&std::fs::read(b.join("config.json")).ok()?).ok()?;
                let networked = c["linux"]["namespaces"]
                    .as_array()?
                    .iter()
                    .any(|n| n["type"] == "network" && n["path"].is_string());
                (networked && c["annotations"].is_object()).then_some((b, c))
            })
            .next()
    };
    // The sandboxes booted before the image was ready use the tree; take them until
    // one on the image is ready.
    let (bundle, config) = loop {
        wait_pools(&d, &["python-slim+net"]);
        if let Some(found) = pooled_net() {
            break found;
        }
        assert!(t.elapsed() < Duration::from_secs(240), "{}", d.log());
        d.execute(json!({"language": "python-slim", "network": true, "code": "print(1)"}));
    };
    assert_eq!(
        config["process"]["args"].as_array().unwrap()[..3],
        ["/opt/isobox/start", "--boot", "65534"],
        "{config}"
    );
    assert!(
        config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["type"] != "bind"),
        "{config}"
    );
    let procs = common::processes_naming(&bundle);
    assert!(
        procs.iter().any(|p| p == "runsc-sandbox") && !procs.iter().any(|p| p.contains("gofer")),
        "{procs:?}"
    );
    common::assert_no_host_privilege(&common::sandbox_host_processes(&bundle));
    // A networked request served from a pooled sandbox on the image (its root is
    // erofs: the pool's front one is, once the tree's have been taken): the daemon's
    // resolvers, what the loader dropped to, a public host by name, nothing of the
    // loader on stderr.
    let h = warm_pool(&d)["hits"].as_u64().unwrap();
    let code = r#"
import errno, json, os, urllib.request
st = dict(l.split(':\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\t' in l)
try:
    os.fstat(3); fd3 = 'open'
except OSError as e:
    fd3 = errno.errorcode[e.errno]
print(json.dumps([open('/etc/resolv.conf').read(), [st[k] for k in ('Uid', 'Gid', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd')],
                  os.getgroups(), [l.split()[2] for l in open('/proc/self/mounts') if l.split()[1] == '/'], fd3]))
print(urllib.request.urlopen('http://public.test/', timeout=3).read().decode().strip())
"#;
    let r = d.execute(json!({"language": "python-slim", "network": true, "code": code}));
    assert_eq!(warm_pool(&d)["hits"].as_u64().unwrap(), h + 1, "{r}");
    let resolv = std::fs::read_to_string(d.data_dir.join("net/resolv.conf")).unwrap();
    let (nobody, none) = ("65534\t65534\t65534\t65534", "0000000000000000");
    let seen = json!([
        resolv,
        [nobody, nobody, none, none, none, none],
        [],
        ["erofs"],
        "EBADF"
    ]);
    let out = r["run"]["stdout"].as_str().unwrap_or_default();
    let mut lines = out.lines();
    let first: Value = serde_json::from_str(lines.next().unwrap_or_default()).unwrap_or_default();
    assert_eq!(
        (
            first,
            lines.next(),
            lines.next(),
            r["run"]["stderr"].as_str(),
            r["run"]["network"].as_bool()
        ),
        (seen, Some(PUBLIC_BODY.trim()), None, Some(""), Some(true)),
        "{r}"
    );
    wait_pools(&d, &["python-slim", "python-slim+net"]);
    let fetch = json!({"language": "python-slim", "code": "import urllib.request\ntry:\n    print('GOT', urllib.request.urlopen('http://198.51.100.7/', timeout=3).read().decode().strip())\nexcept Exception as e:\n    print('ERR', type(e).__name__)"});
    let with_net = |net: bool| {
        let mut b = fetch.clone();
        b["network"] = json!(net);
        b
    };
    // A networked request takes a networked pooled sandbox: filtered egress works.
    let h0 = warm_pool(&d)["hits"].as_u64().unwrap();
    let r = d.execute(with_net(true));
    assert_eq!(
        r["run"]["stdout"],
        format!("GOT {}\n", PUBLIC_BODY.trim()),
        "{r}"
    );
    assert_eq!(r["run"]["network"], true, "{r}");
    assert_eq!(warm_pool(&d)["hits"].as_u64().unwrap(), h0 + 1);
    // Still filtered from a pooled sandbox: metadata and SMTP blocked.
    wait_pools(&d, &["python-slim+net"]);
    let r = d.execute(json!({"language": "python-slim", "network": true, "code": "import socket\nfor a in [('169.254.169.254', 80), ('198.51.100.7', 25)]:\n    try:\n        socket.create_connection(a, timeout=2); print('OPEN', a)\n    except OSError:\n        print('blocked')"}));
    assert_eq!(r["run"]["stdout"], "blocked\nblocked\n", "{r}");
    // An offline request takes an offline one: nothing is reached.
    wait_pools(&d, &["python-slim", "python-slim+net"]);
    let h1 = warm_pool(&d)["hits"].as_u64().unwrap();
    let r = d.execute(with_net(false));
    assert_eq!(r["run"]["stdout"], "ERR URLError\n", "{r}");
    assert_eq!(r["run"]["network"], false, "{r}");
    assert_eq!(warm_pool(&d)["hits"].as_u64().unwrap(), h1 + 1);
    // The table goes: pooled networked sandboxes lose their links; after the repair
    // they are stale and never handed out (the run gets a fresh, working network).
    wait_pools(&d, &["python-slim", "python-slim+net"]);
    harness(&fake, &["nft", "delete", "table", "inet", &table(&d)]);
    wait_egress(&d, "unverified", Duration::from_secs(10));
    let r = d.execute(with_net(true));
    assert_eq!(r["run"]["network"], false, "{r}");
    assert_eq!(r["warning"], WARNING, "{r}");
    let out = std::process::Command::new("kill")
        .args(["-HUP", &d.pid().to_string()])
        .output()
        .unwrap();
    assert!(out.status.success());
    wait_egress(&d, "verified", Duration::from_secs(10));
    // The cut sandbox was discarded and the pool refilled with a working one.
    wait_pools(&d, &["python-slim+net"]);
    let h2 = warm_pool(&d)["hits"].as_u64().unwrap();
    let r = d.execute(with_net(true));
    assert_eq!(
        warm_pool(&d)["hits"].as_u64().unwrap(),
        h2 + 1,
        "served warm"
    );
    assert_eq!(
        r["run"]["stdout"],
        format!("GOT {}\n", PUBLIC_BODY.trim()),
        "{r}\nlog:\n{}",
        d.log()
    );
    assert_eq!(r["run"]["network"], true, "{r}");
    assert_no_denied_hits(&fake, &d);
    d.assert_clean_except_pool();
    // finish() checks links and namespaces; pooled sandboxes hold some until stop.
    let (name, instance) = (table(&d), d.instance.clone());
    d.stop();
    let (exists, out) = fake.in_harness(&["nft", "list", "table", "inet", &name]);
    assert!(!exists, "nft table inet {name} left after stop: {out}");
    assert_eq!(fake.harness_links(), vec!["lo", "uplink0"], "links left");
    assert!(nsfs_mounts(&instance).is_empty(), "namespaces left");
    drop(fake);
}

/// Test-only servers on the fake public host, for N14: tcp 9100 accepts and holds every
/// connection (counting them), udp 9101 counts the bytes it receives, tcp 9102 sends
/// as fast as it may to whoever connects. All stop with the returned guard.
struct N14Servers {
    accepted: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    udp_bytes: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl N14Servers {
    fn start(fake: &FakeNet) -> N14Servers {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::sync::Arc;
        let (hold, udp, source) = in_netns(&fake.fakenet, || {
            (
                std::net::TcpListener::bind((PUBLIC, 9100)).unwrap(),
                UdpSocket::bind((PUBLIC, 9101)).unwrap(),
                std::net::TcpListener::bind((PUBLIC, 9102)).unwrap(),
            )
        });
        let accepted = Arc::new(AtomicUsize::new(0));
        let udp_bytes = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        hold.set_nonblocking(true).unwrap();
        let (a, st) = (Arc::clone(&accepted), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || {
            let mut held = Vec::new();
            while !st.load(Ordering::SeqCst) {
                match hold.accept() {
                    Ok((s, _)) => {
                        a.fetch_add(1, Ordering::SeqCst);
                        held.push(s);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
        udp.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let (b, st) = (Arc::clone(&udp_bytes), Arc::clone(&stop));
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while !st.load(Ordering::SeqCst) {
                if let Ok((n, _)) = udp.recv_from(&mut buf) {
                    b.fetch_add(n, Ordering::SeqCst);
                }
            }
        }));
        source.set_nonblocking(true).unwrap();
        let st = Arc::clone(&stop);
        threads.push(std::thread::spawn(move || {
            let chunk = vec![b'd'; 65536];
            while !st.load(Ordering::SeqCst) {
                let Ok((mut s, _)) = source.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                s.set_nonblocking(false).unwrap();
                s.set_write_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                while !st.load(Ordering::SeqCst) {
                    match s.write(&chunk) {
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                        Err(_) => break,
                    }
                }
            }
        }));
        N14Servers {
            accepted,
            udp_bytes,
            stop,
            threads,
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for N14Servers {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The host's conntrack entries in the harness namespace (where the daemon forwards).
fn conntrack_count(fake: &FakeNet) -> usize {
    in_netns(&fake.harness, || {
        std::fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count")
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    })
}

/// N14: per-sandbox connection and bandwidth limits. With `ISOBOX_EGRESS_MAX_CONNS=16`,
/// a sandbox opening 64 connections gets exactly 16 and a flood of 900 more attempts
/// leaves the host's conntrack table near 16; meanwhile another sandbox has its own 16
/// and fetches over HTTP (N10). With `ISOBOX_EGRESS_RATE` at 128 KiB/s, a UDP blast
/// delivers no more than the rate plus one second's bucket, while the sandbox sent far
/// more, and a download is held to the rate too. The firewall stays verified.
#[test]
fn test_n14_connection_and_bandwidth_limits_per_sandbox() {
    const RATE: usize = 131_072;
    let rate = RATE.to_string();
    let (fake, d) = setup(&[
        ("ISOBOX_EGRESS_MAX_CONNS", "16"),
        ("ISOBOX_EGRESS_RATE", &rate),
    ]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    let servers = N14Servers::start(&fake);
    let ct_before = conntrack_count(&fake);
    let hold = |n: usize, then: &str| {
        format!(
            r#"
socks = []
for i in range({n}):
    s = socket.socket(); s.setblocking(False)
    s.connect_ex(('{PUBLIC}', 9100)); socks.append(s)
time.sleep(3)
n = 0
for s in socks:
    try:
        s.getpeername(); n += 1
    except OSError:
        pass
print('CONNECTED', n, flush=True)
{then}
"#
        )
    };
    let a_then = r#"
tried = 0
try:
    for i in range(900):
        t = socket.socket(); t.setblocking(False)
        t.connect_ex(('198.51.100.7', 20000 + i)); socks.append(t); tried += 1
except OSError as e:
    print('FLOOD STOPPED', tried, e, flush=True)
time.sleep(1)
print('FLOODED', tried, flush=True)
time.sleep(10)
"#;
    let mut a = Stream::execute(
        &d,
        &json!({"language": "python", "code": format!("{PRELUDE}\n{}", hold(64, a_then)),
                "network": true, "limits": {"wallTimeMs": 30000}}),
    );
    assert_eq!(a.wait_line("CONNECTED "), "16", "{}", a.stdout);
    assert_eq!(servers.accepted(), 16, "the server accepted");
    assert_eq!(a.wait_line("FLOODED "), "900", "{}", a.stdout);
    let ct = conntrack_count(&fake);
    assert!(
        ct <= ct_before + 16 + 8,
        "conntrack holds {ct} entries after a flood of 900 attempts (before: {ct_before})"
    );
    // Another sandbox has its own budget while A holds all of its own: 15 held, and
    // the 16th is an HTTP fetch.
    let (rb, res) = run(
        &d,
        &format!("{}\nprobe({{'http': (http, '{PUBLIC}')}})", hold(15, "")),
        json!({"network": true}),
    );
    assert!(
        rb["run"]["stdout"]
            .as_str()
            .unwrap()
            .contains("CONNECTED 15\n"),
        "{rb}"
    );
    assert!(res["http"].as_str().unwrap().contains(PUBLIC_BODY), "{rb}");
    assert_eq!(servers.accepted(), 31, "A's 16 and B's 15");
    // A's connections are tracked while it holds them; once it ends they are forgotten
    // (the server still holds its ends open: left alone, conntrack would keep them as
    // established for days).
    let held = conntrack_count(&fake);
    assert!(held >= ct_before + 16, "A holds 16, conntrack has {held}");
    let ra = a.finish();
    assert_eq!(ra["run"]["network"], true, "{ra}");
    assert_eq!(ra["run"]["exitCode"], 0, "{ra}");
    poll(
        "conntrack forgets the finished runs' connections",
        Duration::from_secs(5),
        || {
            let n = conntrack_count(&fake);
            if n <= ct_before + 4 {
                Ok(())
            } else {
                Err(format!("{n} entries, {ct_before} before the runs"))
            }
        },
    );

    // Bandwidth, both ways.
    let (rc, res) = run(
        &d,
        &format!(
            r#"
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.setblocking(False)
payload = b'x' * 1400
sent = 0
end = time.time() + 2
while time.time() < end:
    try:
        u.sendto(payload, ('{PUBLIC}', 9101)); sent += len(payload)
    except OSError:
        time.sleep(0.001)
print('UDP', sent, flush=True)
s = socket.create_connection(('{PUBLIC}', 9102), 3)
s.settimeout(0.5)
got, t0 = 0, time.time()
while time.time() - t0 < 3:
    try:
        d = s.recv(65536)
    except socket.timeout:
        continue
    if not d:
        break
    got += len(d)
took = time.time() - t0
s.close()
time.sleep(0.5)
print('RESULT ' + json.dumps({{'sent': sent, 'got': got, 'took': took}}), flush=True)
"#
        ),
        json!({"network": true, "limits": {"wallTimeMs": 20000}}),
    );
    assert_eq!(rc["run"]["exitCode"], 0, "{rc}");
    let sent = res["sent"].as_u64().unwrap() as usize;
    let got = res["got"].as_u64().unwrap() as usize;
    let took = res["took"].as_f64().unwrap();
    let received = servers.udp_bytes.load(std::sync::atomic::Ordering::SeqCst);
    // Two seconds at the rate plus the bucket (one second's worth), 10 % for headers
    // (the rate counts IP and UDP headers too, the receiver counts payload) and timing.
    let up_bound = RATE * 3 * 11 / 10;
    assert!(
        received <= up_bound,
        "UDP delivered {received} bytes in 2 s at {RATE} B/s (bound {up_bound})"
    );
    assert!(
        received >= RATE / 2,
        "UDP delivered only {received} bytes: the limit should pass the rate"
    );
    assert!(
        sent >= 2 * up_bound,
        "the sandbox sent only {sent} bytes, too little to show the limit ({up_bound})"
    );
    let down_bound = (RATE as f64 * (took + 1.0) * 1.1) as usize;
    assert!(
        got <= down_bound,
        "downloaded {got} bytes in {took:.2} s at {RATE} B/s (bound {down_bound})"
    );
    assert!(
        got >= RATE / 2,
        "downloaded only {got} bytes in {took:.2} s"
    );
    eprintln!("N14: udp sent {sent} delivered {received}; tcp down {got} in {took:.2} s");
    assert_eq!(egress(&d, "/readyz")["state"], "verified");
    drop(servers);
    assert_no_denied_hits(&fake, &d);
    finish(fake, d, true);
}

/// The conntrack sweep touches only what is isobox's: a flow from an address inside
/// the default pool that is not a sandbox's (another network using 10.200/16 on this
/// host) survives a daemon's start and stop with egress off. (With egress on, such an
/// address makes the pool overlap a host network, and egress stays unverified.)
#[test]
fn test_foreign_conntrack_entries_in_the_pool_range_survive() {
    let fake = FakeNet::new();
    let foreign = "10.200.77.5";
    harness(
        &fake,
        &["ip", "addr", "add", &format!("{foreign}/32"), "dev", "lo"],
    );
    // Connection tracking is on in a namespace only once something uses it.
    harness(&fake, &["nft", "add", "table", "inet", "isobox_test_ct"]);
    harness(
        &fake,
        &[
            "nft",
            "add chain inet isobox_test_ct out { type filter hook output priority 0 ; }",
        ],
    );
    harness(
        &fake,
        &[
            "nft",
            "add rule inet isobox_test_ct out ct state new counter",
        ],
    );
    let tracked = |fake: &FakeNet| -> bool {
        let ns = fake.harness.clone();
        in_netns(&ns, || {
            std::fs::read_to_string("/proc/thread-self/net/nf_conntrack")
                .unwrap_or_default()
                .lines()
                .any(|l| l.contains("src=10.200.77.5 ") && l.contains("dport=9 "))
        })
    };
    in_netns(&fake.harness, move || {
        let u = UdpSocket::bind((foreign, 0)).unwrap();
        u.send_to(b"x", (PUBLIC, 9)).unwrap();
    });
    assert!(tracked(&fake), "the test's own flow is not tracked");
    let d = Daemon::start_in_netns(
        &fake.harness,
        &[("ISOBOX_EGRESS", "off"), ("ISOBOX_NET_DNS", DNS)],
    );
    d.wait_ready();
    let r = d.execute(json!({"language": "python-slim", "code": "print(1)", "network": false}));
    assert_eq!(r["run"]["stdout"], "1\n", "{r}");
    d.stop();
    assert!(
        tracked(&fake),
        "a daemon's start or stop deleted a conntrack entry that was not isobox's"
    );
    harness(&fake, &["nft", "delete", "table", "inet", "isobox_test_ct"]);
}

/// Issue 26 item 4: isobox turns IPv4 forwarding on for its sandboxes; it must not make
/// the host a router for anyone else. A network behind the harness (10.99.0.2, in a
/// namespace of this test's own, reached only through the harness) stands for a
/// container bridge or a peered network; fakenet routes to it through the harness.
/// With forwarding off before the daemon (its `auto`), the daemon's table drops that
/// traffic, also after a restart (forwarding is on by then, and known to be isobox's);
/// with forwarding already on by someone else, `auto` leaves it alone and says so.
#[test]
fn test_forwarding_for_others_only_where_the_host_forwarded_already() {
    let fake = FakeNet::new();
    let (h, f) = (fake.harness.clone(), fake.fakenet.clone());
    let inner = format!("{h}n");
    sh(&["ip", "netns", "add", &inner]);
    struct DelNs(String);
    impl Drop for DelNs {
        fn drop(&mut self) {
            let _ = try_sh(&["ip", "netns", "del", &self.0]);
        }
    }
    let _inner_guard = DelNs(inner.clone());
    sh(&[
        "ip", "-n", &h, "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns",
        &inner,
    ]);
    sh(&["ip", "-n", &h, "addr", "add", "10.99.0.1/30", "dev", "lan0"]);
    sh(&["ip", "-n", &h, "link", "set", "lan0", "up"]);
    sh(&[
        "ip",
        "-n",
        &inner,
        "addr",
        "add",
        "10.99.0.2/30",
        "dev",
        "eth0",
    ]);
    sh(&["ip", "-n", &inner, "link", "set", "eth0", "up"]);
    sh(&["ip", "-n", &inner, "link", "set", "lo", "up"]);
    sh(&[
        "ip",
        "-n",
        &inner,
        "route",
        "add",
        "default",
        "via",
        "10.99.0.1",
    ]);
    sh(&[
        "ip",
        "-n",
        &f,
        "route",
        "add",
        "10.99.0.0/30",
        "via",
        "192.0.2.2",
    ]);
    let listener = in_netns(&inner, || {
        std::net::TcpListener::bind("10.99.0.2:0").expect("bind behind the harness")
    });
    let to = listener.local_addr().unwrap();
    // A connection from the fake internet to the network behind the harness.
    let reach = |f: &str| -> bool {
        in_netns(f, move || {
            std::net::TcpStream::connect_timeout(&to, Duration::from_millis(1500)).is_ok()
        })
    };
    let fwd = |v: &str| {
        let v = v.to_string();
        in_netns(&h, move || {
            std::fs::write("/proc/sys/net/ipv4/ip_forward", v).unwrap()
        })
    };
    let marker = {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(format!("/run/netns/{h}")).unwrap().ino();
        std::path::PathBuf::from(format!("/run/isobox/ip_forward-by-isobox.{ino}"))
    };
    let _ = std::fs::remove_file(&marker);
    // The control: with forwarding on and no isobox, the harness routes it.
    fwd("1");
    assert!(reach(&f), "the topology routes when the harness forwards");
    fwd("0");
    assert!(!reach(&f));

    // Forwarding off before the daemon: isobox turns it on, and drops others' traffic.
    let d = Daemon::start_in_netns(&h, &[("ISOBOX_NET_DNS", DNS)]);
    d.wait_ready();
    wait_egress(&d, "verified", Duration::from_secs(10));
    assert!(
        marker.exists(),
        "the daemon notes that forwarding is its own doing"
    );
    assert!(!reach(&f), "others' traffic is not routed through the host");
    let (_, res) = run(
        &d,
        &format!("probe({{'pub': (http, '{PUBLIC}')}})"),
        json!({}),
    );
    assert!(
        ok(&res, "pub"),
        "sandboxes still reach the internet: {res:?}"
    );
    d.stop();
    // A restart finds forwarding on, and knows it as isobox's.
    let d = Daemon::start_in_netns(&h, &[("ISOBOX_NET_DNS", DNS)]);
    d.wait_ready();
    wait_egress(&d, "verified", Duration::from_secs(10));
    assert!(!reach(&f), "still dropped after a restart");
    assert!(!d.log().contains("was already on"), "{}", d.log());
    d.stop();

    // Forwarding on by someone else: `auto` keeps out of it, and says so.
    let _ = std::fs::remove_file(&marker);
    fwd("1");
    let d = Daemon::start_in_netns(&h, &[("ISOBOX_NET_DNS", DNS)]);
    d.wait_ready();
    wait_egress(&d, "verified", Duration::from_secs(10));
    assert!(reach(&f), "the host's own routing is left alone");
    assert!(
        d.log().contains("IPv4 forwarding was already on"),
        "{}",
        d.log()
    );
    d.stop();
    // ... unless the operator asks.
    let d = Daemon::start_in_netns(
        &h,
        &[
            ("ISOBOX_NET_DNS", DNS),
            ("ISOBOX_EGRESS_FORWARD_OTHERS", "drop"),
        ],
    );
    d.wait_ready();
    wait_egress(&d, "verified", Duration::from_secs(10));
    assert!(!reach(&f), "ISOBOX_EGRESS_FORWARD_OTHERS=drop drops it");
    d.stop();
    let _ = std::fs::remove_file(&marker);
}

/// Issue 26 item 8: the deny list is one interval set an operator reads as addresses
/// (`nft list table` prints `ip daddr @denied drop` and the ranges), and its elements
/// are verified like the rules: flushing them is noticed, and the repair puts them back.
#[test]
fn test_deny_list_is_one_readable_set_and_a_flush_is_noticed() {
    let (fake, d) = setup(&[("ISOBOX_EGRESS_VERIFY_SEC", "1")]);
    wait_egress(&d, "verified", Duration::from_secs(30));
    let t = table(&d);
    let list = || harness(&fake, &["nft", "list", "table", "inet", &t]);
    let shown = list();
    assert!(shown.contains("ip daddr @denied drop"), "{shown}");
    for range in [
        "10.0.0.0/8",
        "169.254.0.0/16",
        "100.64.0.0/10",
        "168.63.129.16",
        "224.0.0.0/3",
    ] {
        assert!(
            shown.contains(range),
            "{range} is shown as an address:\n{shown}"
        );
    }
    assert!(
        !shown.contains("@nh,128,32"),
        "no raw payload matches:\n{shown}"
    );
    let (ok, out) = fake.in_harness(&["nft", "flush", "set", "inet", &t, "denied"]);
    assert!(ok, "{out}");
    wait_egress(&d, "unverified", Duration::from_secs(5));
    // The periodic check programs it again (ISOBOX_EGRESS_VERIFY_SEC=1).
    wait_egress(&d, "verified", Duration::from_secs(10));
    assert!(
        d.log().contains("set denied holds 0 elements"),
        "{}",
        d.log()
    );
    assert!(list().contains("10.0.0.0/8"), "the elements are back");
}
