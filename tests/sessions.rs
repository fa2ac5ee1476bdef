//! Filesystem sessions and the file API against the real daemon: real runsc, real
//! loop-mounted workspaces, real LMDB.

mod common;

use common::session::Session;
use common::{sha256_hex, Daemon};
use serde_json::{json, Value};
use std::io::{BufReader, Write};
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// A filesystem session, created with the checks every create here makes.
fn create(d: &Daemon, body: Value) -> Session {
    let s = Session::create(d, &body);
    let v = &s.created;
    assert_eq!(v["type"], "filesystem");
    assert!(v["createdAt"].as_str().unwrap().ends_with('Z'), "{v}");
    assert_eq!(s.id.len(), 32, "{v}");
    assert!(s.token.len() >= 40, "{v}");
    s
}

/// An offline step that must be answered 200.
fn exec_ok(d: &Daemon, s: &Session, code: &str) -> Value {
    s.step_with(d, &json!({"code": code, "network": false}))
}

#[test]
fn test_spec_two_steps_files_and_delete() {
    let d = Daemon::start();
    d.wait_ready();
    let s = create(&d, json!({"runtime": "python"}));
    // The spec's example: step 1 writes, step 2 (a separate sandbox) reads.
    let v = exec_ok(&d, &s, "open(\"/workspace/x.txt\",\"w\").write(\"42\")");
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    assert_eq!(v["language"], "python");
    let v = exec_ok(&d, &s, "print(open(\"/workspace/x.txt\").read())");
    assert_eq!(v["run"]["stdout"], "42\n", "{v}");
    // The working directory is the workspace.
    let v = exec_ok(
        &d,
        &s,
        "import os; print(os.getcwd()); print(open('x.txt').read())",
    );
    assert_eq!(v["run"]["stdout"], "/workspace\n42\n", "{v}");
    // Download what the code produced.
    let r = s.fs(&d, "GET", "path=x.txt", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.body, b"42");
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    let cd = r.header("content-disposition").unwrap();
    assert!(
        cd.starts_with("attachment;") && cd.contains("filename=\"x.txt\""),
        "{cd}"
    );
    // HEAD gives the length without the body.
    let r = s.fs(&d, "HEAD", "path=x.txt", b"");
    assert_eq!((r.status, r.header("content-length")), (200, Some("2")));
    // Listing of the root.
    let r = s.fs(&d, "GET", "path=", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let l = r.json();
    assert_eq!(l["dir"], true);
    let names: Vec<&str> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"x.txt"), "{l}");
    assert!(!names.contains(&"lost+found"), "{l}");
    let x = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "x.txt")
        .unwrap();
    assert_eq!(
        (x["size"].as_u64(), x["dir"].as_bool()),
        (Some(2), Some(false))
    );
    assert!(x["modTime"].as_str().unwrap().ends_with('Z'));
    // A binary placed in the workspace runs there (the workspace is not noexec).
    let v = exec_ok(
        &d,
        &s,
        "import os,shutil,subprocess\n\
         shutil.copy('/bin/echo','e'); os.chmod('e',0o755)\n\
         print(subprocess.run(['./e','bin-ran'],capture_output=True,text=True).stdout, end='')",
    );
    assert_eq!(v["run"]["stdout"], "bin-ran\n", "{v}");
    // language, if given, must be the session's.
    let r = s.exec(&d, &json!({"language": "ruby", "code": "puts 1"}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"], "invalid_json");
    let r = s.exec(
        &d,
        &json!({"language": "python", "code": "print(1)", "network": false}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Delete a file, then the session.
    assert_eq!(s.fs(&d, "DELETE", "path=x.txt", b"").status, 204);
    assert_eq!(s.fs(&d, "GET", "path=x.txt", b"").status, 404);
    assert_eq!(s.delete(&d).status, 204);
    let r = s.exec(&d, &json!({"code": "print(1)"}));
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"], "session_not_found");
    assert_eq!(s.delete(&d).status, 404);
    assert!(
        std::fs::read_dir(d.data_dir.join("sessions"))
            .unwrap()
            .count()
            == 0,
        "workspace left after delete"
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_upload_read_by_code_and_zip_download() {
    let d = Daemon::start();
    d.wait_ready();
    let s = create(&d, json!({"runtime": "python-slim"}));
    // Upload (with 100-continue) into a new subdirectory.
    let body: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
    let mut c = d.connect();
    write!(
        c,
        "PUT /v1/sessions/{}/fs?path=data/in.bin HTTP/1.1\r\nHost: t\r\nX-Session-Token: {}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        s.id, s.token, body.len()
    )
    .unwrap();
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut r, &mut line).unwrap();
    assert!(line.starts_with("HTTP/1.1 100 Continue"), "{line}");
    std::io::BufRead::read_line(&mut r, &mut line).unwrap();
    c.write_all(&body).unwrap();
    let up = common::read_response(&mut r, false).unwrap();
    assert_eq!(up.status, 200, "{}", up.text());
    assert_eq!(up.json(), json!({"path": "/data/in.bin", "bytes": 700_000}));
    // Code reads it and writes a tree.
    let v = exec_ok(
        &d,
        &s,
        "import hashlib,os\n\
         b=open('data/in.bin','rb').read(); print(len(b), hashlib.sha256(b).hexdigest())\n\
         os.makedirs('out/deep', exist_ok=True)\n\
         open('out/a.txt','w').write('alpha')\n\
         open('out/deep/b.txt','w').write('beta'*1000)\n\
         os.symlink('/etc/passwd', 'out/link')",
    );
    let want = format!("700000 {}\n", sha256_hex(&body));
    assert_eq!(v["run"]["stdout"], want.as_str(), "{v}");
    // Chunked upload.
    let mut c = d.connect();
    write!(
        c,
        "PUT /v1/sessions/{}/fs?path=out/c.txt HTTP/1.1\r\nHost: t\r\nX-Session-Token: {}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        s.id, s.token
    )
    .unwrap();
    let up = common::read_response(&mut BufReader::new(c), false).unwrap();
    assert_eq!(up.json(), json!({"path": "/out/c.txt", "bytes": 11}));
    // Zip of the tree, unpacked by Python's zipfile.
    let r = s.fs(&d, "GET", "path=out&format=zip", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/zip"));
    assert!(r.header("content-disposition").unwrap().contains("out.zip"));
    let zpath = d.data_dir.join("test-out.zip");
    std::fs::write(&zpath, &r.body).unwrap();
    let check = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import sys,zipfile,json\n\
             z=zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None\n\
             print(json.dumps({n: z.read(n).decode() for n in z.namelist() if not n.endswith('/')}))",
        )
        .arg(&zpath)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let files: Value = serde_json::from_slice(&check.stdout).unwrap();
    assert_eq!(
        files,
        json!({"a.txt": "alpha", "deep/b.txt": "beta".repeat(1000), "c.txt": "hello world"}),
        "symlinks are left out of archives"
    );
    // A zip of a file is a 400; an unknown format too.
    assert_eq!(
        s.fs(&d, "GET", "path=out/a.txt&format=zip", b"").status,
        400
    );
    assert_eq!(s.fs(&d, "GET", "path=out&format=tar", b"").status, 400);
    // Deleting a subtree.
    assert_eq!(s.fs(&d, "DELETE", "path=out", b"").status, 204);
    assert_eq!(s.fs(&d, "GET", "path=out", b"").status, 404);
    // Uploading onto a directory is refused.
    let r = s.fs(&d, "PUT", "path=data", b"x");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (400, Some("invalid_path"))
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_paths_are_confined() {
    let d = Daemon::start();
    d.wait_ready();
    let s = create(&d, json!({"runtime": "python-slim"}));
    let canary = d.data_dir.join("canary");
    std::fs::write(&canary, "host-canary-secret").unwrap();
    let v = exec_ok(
        &d,
        &s,
        &format!(
            "import os\n\
             os.symlink('/etc', 'etc-link')\n\
             os.symlink('{}', 'canary-link')\n\
             os.symlink('../../../../../../../../etc/passwd', 'rel-link')\n\
             os.makedirs('sub', exist_ok=True); open('sub/ok.txt','w').write('inside')\n\
             os.symlink('sub/ok.txt', 'good-link')\n\
             os.mkfifo('fifo')",
            canary.display()
        ),
    );
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    let host_bytes = ["root:x:0", "host-canary-secret"];
    let refused = |q: &str, want: u16| {
        let r = s.fs(&d, "GET", q, b"");
        assert_eq!(r.status, want, "{q}: {}", r.text());
        for h in host_bytes {
            assert!(!r.text().contains(h), "{q} leaked host content");
        }
    };
    // Traversal is collapsed inside the workspace: nothing of the host is reachable.
    refused("path=../../../../etc/passwd", 404);
    refused("path=%2e%2e%2f%2e%2e%2fetc%2fpasswd", 404);
    refused("path=/etc/passwd", 404);
    refused("path=sub/../../../etc/passwd", 404);
    // Links leaving the workspace are refused, whatever their form.
    refused("path=etc-link/passwd", 400);
    refused("path=canary-link", 400);
    refused("path=rel-link", 400);
    refused("path=etc-link&format=zip", 400);
    // A FIFO is not served (and does not hang the daemon). gVisor keeps named pipes
    // in the sandbox, so the host may not even see one: 400 or 404.
    let r = s.fs(&d, "GET", "path=fifo", b"");
    assert!(matches!(r.status, 400 | 404), "{}", r.text());
    refused("path=x%00y", 400);
    refused("path=%zz", 400);
    // An in-tree link works.
    let r = s.fs(&d, "GET", "path=good-link", b"");
    assert_eq!((r.status, r.body.as_slice()), (200, b"inside".as_slice()));
    // Writes and deletes through links that leave are refused too; the canary stays.
    let r = s.fs(&d, "PUT", "path=etc-link/evil", b"x");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(
        s.fs(&d, "DELETE", "path=etc-link/hostname", b"").status,
        400
    );
    // Deleting the link itself removes the link, not its target.
    assert_eq!(s.fs(&d, "DELETE", "path=canary-link", b"").status, 204);
    assert_eq!(
        std::fs::read_to_string(&canary).unwrap(),
        "host-canary-secret"
    );
    assert!(std::path::Path::new("/etc/passwd").exists());
    // The root itself cannot be deleted through the file API.
    assert_eq!(s.fs(&d, "DELETE", "path=", b"").status, 400);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_quota_by_code_and_by_upload() {
    let d = Daemon::start_with(&[("ISOBOX_SESSION_QUOTA_BYTES", &(16 * MIB).to_string())]);
    d.wait_ready();
    let s = create(&d, json!({"runtime": "python-slim"}));
    // Code writing past the quota gets ENOSPC inside the sandbox.
    let v = exec_ok(
        &d,
        &s,
        "import errno\n\
         f=open('big','wb')\n\
         try:\n    [f.write(b'x'*(1<<20)) for _ in range(40)]; f.close(); print('no error')\n\
         except OSError as e:\n    print('errno', e.errno == errno.ENOSPC)",
    );
    assert_eq!(v["run"]["stdout"], "errno True\n", "{v}");
    // With the workspace full, an upload is refused: by its length up front (before
    // any body byte is read, so the client may see its write fail)...
    let mut c = d.connect();
    write!(
        c,
        "PUT /v1/sessions/{}/fs?path=more HTTP/1.1\r\nHost: t\r\nX-Session-Token: {}\r\nContent-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        s.id, s.token, 4 * MIB
    )
    .unwrap();
    // Refused before any `100 Continue`: the client never sends the body.
    let r = common::read_response(&mut BufReader::new(c), false).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"], "quota_exceeded");
    // ...and, chunked, when the disk says so; the partial file is removed.
    assert_eq!(s.fs(&d, "DELETE", "path=big", b"").status, 204);
    let v = exec_ok(&d, &s, "open('fill','wb').write(b'z'*(12<<20))");
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    let mut c = d.connect();
    write!(
        c,
        "PUT /v1/sessions/{}/fs?path=chunked HTTP/1.1\r\nHost: t\r\nX-Session-Token: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
        s.id, s.token
    )
    .unwrap();
    let chunk = vec![b'c'; 256 * 1024];
    for _ in 0..32 {
        if write!(c, "{:x}\r\n", chunk.len()).is_err()
            || c.write_all(&chunk).is_err()
            || c.write_all(b"\r\n").is_err()
        {
            break;
        }
    }
    let _ = c.write_all(b"0\r\n\r\n");
    let r = common::read_response(&mut BufReader::new(c), false).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"], "quota_exceeded");
    let l = s.fs(&d, "GET", "path=", b"").json();
    let names: Vec<&str> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        vec!["fill", "main.py"],
        "no partial upload left: {l}"
    );
    // The upload cap: 16 MiB accepted size-wise, above it 413 before any body.
    let mut c = d.connect();
    write!(
        c,
        "PUT /v1/sessions/{}/fs?path=huge HTTP/1.1\r\nHost: t\r\nX-Session-Token: {}\r\nContent-Length: 16777217\r\nExpect: 100-continue\r\n\r\n",
        s.id, s.token
    )
    .unwrap();
    let r = common::read_response(&mut BufReader::new(c), false).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"], "payload_too_large");
    // A sparse file larger than the quota (issue 26, item 2): not sent as terabytes of
    // zeros, for GET and HEAD alike, nor zipped; one exactly at the quota is served.
    let v = exec_ok(
        &d,
        &s,
        &format!(
            "import os\nos.mkdir('holes')\nopen('holes/tb','wb').truncate(1<<33)\nopen('at','wb').truncate({})\nopen('above','wb').truncate({})",
            16 * MIB,
            16 * MIB + 1
        ),
    );
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    for (method, path) in [("GET", "holes/tb"), ("HEAD", "holes/tb"), ("GET", "above")] {
        let r = s.fs(&d, method, &format!("path={path}"), b"");
        assert_eq!(r.status, 413, "{method} {path}: {}", r.text());
        assert!(
            r.header("content-length")
                .is_none_or(|l| l.parse::<u64>().unwrap() < 4096),
            "{method} {path}"
        );
        if method == "GET" {
            assert_eq!(r.json()["error"], "quota_exceeded");
            assert!(
                r.json()["detail"].as_str().unwrap().contains("sparse"),
                "{}",
                r.text()
            );
        }
    }
    let r = s.fs(&d, "GET", "path=at", b"");
    assert_eq!((r.status, r.body.len()), (200, 16 * MIB));
    assert!(r.body.iter().all(|&b| b == 0));
    let r = s.fs(&d, "GET", "path=holes&format=zip", b"");
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"], "archive_too_large");
    d.assert_clean();
    d.stop();
}

#[test]
fn test_tokens_tenants_and_limits() {
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", "key-one,key-two"),
        ("ISOBOX_REQUIRE_AUTH", "1"),
        ("ISOBOX_MAX_SESSIONS", "2"),
    ]);
    d.wait_ready();
    let post = |key: &str, body: Value| {
        d.request(
            "POST",
            "/v1/sessions",
            &[("X-API-Key", key)],
            body.to_string().as_bytes(),
        )
    };
    let r = post("key-one", json!({"runtime": "python-slim", "ttlSec": 60}));
    assert_eq!(r.status, 201, "{}", r.text());
    let v = r.json();
    assert_eq!(v["ttlSec"], 60);
    let (id, token) = (v["id"].as_str().unwrap(), v["token"].as_str().unwrap());
    let get = |key: &str, tok: Option<&str>| {
        let mut h = vec![("X-API-Key", key)];
        if let Some(t) = tok {
            h.push(("X-Session-Token", t));
        }
        d.request("GET", &format!("/v1/sessions/{id}/fs?path="), &h, b"")
    };
    assert_eq!(get("key-one", Some(token)).status, 200);
    let r = get("key-one", None);
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (401, Some("invalid_session_token"))
    );
    let wrong = format!("{}x", &token[..token.len() - 1]);
    assert_eq!(get("key-one", Some(&wrong)).status, 401);
    // Another tenant's key: 404, never a hint, even with the right token.
    let r = get("key-two", Some(token));
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (404, Some("session_not_found"))
    );
    // No key at all: the API key check comes first.
    assert_eq!(
        d.request("GET", &format!("/v1/sessions/{id}/fs"), &[], b"")
            .status,
        401
    );
    // Unknown and malformed ids.
    let r = d.request(
        "GET",
        &format!("/v1/sessions/{}/fs", "0".repeat(32)),
        &[("X-API-Key", "key-one"), ("X-Session-Token", token)],
        b"",
    );
    assert_eq!(r.status, 404);
    // Bad create bodies, each a 400 naming the field.
    for (body, code) in [
        (json!({}), "runtime_required"),
        (json!({"runtime": "cobol"}), "unknown_language"),
        (json!({"runtime": "python", "ttlSec": 0}), "invalid_json"),
        (json!({"runtime": "python", "ttlSec": -5}), "invalid_json"),
        (json!({"runtime": "python", "ttlSec": 1.5}), "invalid_json"),
        (json!({"runtime": "python", "ttlSec": "60"}), "invalid_json"),
        (json!({"runtime": "python", "bogus": 1}), "invalid_json"),
        (json!({"runtime": "python", "type": "vm"}), "invalid_json"),
        // Kernels run Python only (tests/kernels.rs has the rest).
        (json!({"runtime": "ruby", "type": "kernel"}), "invalid_json"),
    ] {
        let r = post("key-one", body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"], code, "{body}");
    }
    // ttlSec above the ceiling is clamped (default ceiling 7 days).
    let r = post(
        "key-two",
        json!({"runtime": "python-slim", "ttlSec": 99_999_999}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["ttlSec"], 604_800);
    // The session count is capped (2 here).
    let r = post("key-two", json!({"runtime": "python-slim"}));
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (429, Some("too_many_sessions"))
    );
    // I6: neither the capability token nor the keys reach the log.
    let log = d.log();
    assert!(
        !log.contains(token) && !log.contains("key-one"),
        "secret in log"
    );
    d.assert_clean();
    d.stop();
}

#[test]
fn test_storage_ceiling_busy_step_and_ttl() {
    let d = Daemon::start_with(&[("ISOBOX_STORAGE_MAX_BYTES", "1")]);
    d.wait_ready();
    let s = create(&d, json!({"runtime": "python-slim", "ttlSec": 3}));
    // The first workspace already uses more than the 1-byte ceiling.
    let r = d.post_json("/v1/sessions", &json!({"runtime": "python-slim"}));
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (507, Some("storage_full"))
    );
    // Two steps at once in one session: the second is a 409.
    let slow = std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            s.exec(
                &d,
                &json!({"code": "import time; time.sleep(3); print('slow')", "network": false}),
            )
        });
        std::thread::sleep(Duration::from_millis(1500));
        let r = s.exec(&d, &json!({"code": "print(1)", "network": false}));
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (409, Some("session_busy")),
            "{}",
            r.text()
        );
        // Ending the session while a step runs is refused too.
        let r = s.delete(&d);
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (409, Some("session_busy"))
        );
        h.join().unwrap()
    });
    assert_eq!(slow.json()["run"]["stdout"], "slow\n");
    // Idle past its TTL (3 s from the last use): reaped, workspace deleted. Watched
    // on disk, since every call on the session would count as a use.
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_dir(d.data_dir.join("sessions"))
        .unwrap()
        .count()
        > 0
    {
        assert!(Instant::now() < deadline, "never reaped\n{}", d.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    let r = s.fs(&d, "HEAD", "path=main.py", b"");
    assert_eq!(r.status, 404);
    assert!(d.log().contains("idle past its ttl"), "{}", d.log());
    d.assert_clean();
    d.stop();
}

#[test]
fn test_sessions_survive_restart_and_crash() {
    let mut d = Daemon::start();
    d.wait_ready();
    let s = create(&d, json!({"runtime": "python-slim"}));
    exec_ok(&d, &s, "open('keep.txt','w').write('kept')");
    let lost = create(&d, json!({"runtime": "python-slim"}));
    // A graceful restart keeps the session and its files.
    let instance = d.instance.clone();
    d.stop_keep_data();
    // A workspace that vanished while the daemon was down is reported, not crashed on.
    std::fs::remove_file(d.data_dir.join("sessions").join(&lost.id).join("ws.img")).unwrap();
    let mut d = Daemon::start_with(&[("ISOBOX_INSTANCE", instance.as_str())]);
    d.wait_ready();
    let v = exec_ok(&d, &s, "print(open('keep.txt').read())");
    assert_eq!(v["run"]["stdout"], "kept\n");
    assert!(
        d.log()
            .contains(&format!("session {}: workspace image missing", lost.id)),
        "{}",
        d.log()
    );
    assert_eq!(lost.fs(&d, "GET", "path=", b"").status, 404);
    // A crash (SIGKILL) with the workspace mounted: the next start unmounts it, drops
    // half-created workspaces, and the session still works.
    assert!(
        !common::mounts_under(&d.data_dir).is_empty(),
        "workspace mounted while in use"
    );
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let orphan = d.data_dir.join("sessions").join("ab".repeat(16));
    let partial = d
        .data_dir
        .join("sessions")
        .join(format!("{}.partial", "cd".repeat(16)));
    std::fs::create_dir_all(orphan.join("mnt")).unwrap();
    std::fs::create_dir_all(&partial).unwrap();
    let not_ours = d.data_dir.join("sessions").join("keep-me");
    std::fs::create_dir_all(&not_ours).unwrap();
    // Not dropped: the harness's Drop would delete the data dir.
    std::mem::forget(d);
    let d = Daemon::start_with(&[("ISOBOX_INSTANCE", instance.as_str())]);
    d.wait_ready();
    assert!(!orphan.exists() && !partial.exists(), "swept");
    assert!(
        not_ours.exists(),
        "the sweep removes only isobox's own names"
    );
    std::fs::remove_dir(&not_ours).unwrap();
    let v = exec_ok(&d, &s, "print(open('keep.txt').read())");
    assert_eq!(v["run"]["stdout"], "kept\n");
    d.assert_clean();
    d.stop();
}

#[test]
fn test_streamed_step() {
    let d = Daemon::start();
    d.wait_ready();
    let s = create(&d, json!({"runtime": "python-slim"}));
    let r = s.request(
        &d,
        "POST",
        "/exec",
        &[("Accept", "text/event-stream")],
        json!({"code": "print('a'); open('s.txt','w').write('x')", "network": false})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.status, 200);
    let t = r.text();
    assert!(
        t.contains("event: stdout") && t.contains("event: done"),
        "{t}"
    );
    assert_eq!(s.fs(&d, "GET", "path=s.txt", b"").body, b"x");
    d.assert_clean();
    d.stop();
}

#[test]
fn test_odd_names_and_parallel_uploads() {
    let d = Daemon::start_with(&[("ISOBOX_SESSION_QUOTA_BYTES", &(16 * MIB).to_string())]);
    d.wait_ready();
    let s = create(&d, json!({"runtime": "python-slim"}));
    // F8: names the sandbox makes are listed as valid JSON and fetchable by their name.
    let v = exec_ok(
        &d,
        &s,
        "import os\n\
         for n in ['a\\nb', 'q\"uote', 'back\\\\slash', '..foo', '-rf', 'x'*255, 'sp ace+plus']:\n    open(n,'w').write('N:'+n)\n\
         open(os.fsencode('\\udcff\\udcfe'), 'w').write('raw')",
    );
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    let l = s.fs(&d, "GET", "path=", b"").json();
    let entries = l["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 9, "{l}");
    for e in entries {
        let name = e["name"].as_str().unwrap();
        if name == "main.py" {
            continue;
        }
        let q = match e["nameEncoded"].as_str() {
            Some(enc) => enc.to_string(),
            None => pct(name.as_bytes()),
        };
        let r = s.fs(&d, "GET", &format!("path={q}"), b"");
        assert_eq!(r.status, 200, "{name:?}: {}", r.text());
        if e["nameEncoded"].is_null() {
            assert_eq!(r.text(), format!("N:{name}"));
        } else {
            assert_eq!(r.text(), "raw");
            assert_eq!(e["nameEncoded"], "%FF%FE");
        }
    }
    let r = s.fs(&d, "GET", "path=&format=zip", b"");
    assert_eq!(r.status, 200);
    let zpath = d.data_dir.join("odd.zip");
    std::fs::write(&zpath, &r.body).unwrap();
    let ok = std::process::Command::new("python3")
        .args(["-c", "import sys,zipfile; z=zipfile.ZipFile(sys.argv[1]); assert z.testzip() is None; n=z.namelist(); assert len(n)==8 and not any(chr(92) in x for x in n), n"])
        .arg(&zpath)
        .status()
        .unwrap();
    assert!(ok.success());
    // F9: parallel uploads, each 6 MiB, into a 16 MiB workspace: only what fits is
    // stored, the rest are 413, and no partial file remains.
    for e in entries {
        let q = e["nameEncoded"].as_str().map_or_else(
            || pct(e["name"].as_str().unwrap().as_bytes()),
            str::to_string,
        );
        assert_eq!(s.fs(&d, "DELETE", &format!("path={q}"), b"").status, 204);
    }
    let results: Vec<u16> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..12)
            .map(|i| {
                let (d, s) = (&d, &s);
                sc.spawn(move || {
                    let mut c = d.connect();
                    write!(
                        c,
                        "PUT /v1/sessions/{}/fs?path=p{i} HTTP/1.1\r\nHost: t\r\nX-Session-Token: {}\r\nTransfer-Encoding: chunked\r\n\r\n",
                        s.id, s.token
                    )
                    .unwrap();
                    let chunk = vec![b'p'; 512 * 1024];
                    for _ in 0..12 {
                        if write!(c, "{:x}\r\n", chunk.len()).is_err()
                            || c.write_all(&chunk).is_err()
                            || c.write_all(b"\r\n").is_err()
                        {
                            break;
                        }
                    }
                    let _ = c.write_all(b"0\r\n\r\n");
                    common::read_response(&mut BufReader::new(c), false).map_or(0, |r| r.status)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let stored = results.iter().filter(|&&s| s == 200).count();
    assert!(
        results.iter().all(|s| matches!(s, 200 | 413)),
        "{results:?}"
    );
    // At most two fit. Interleaved streams can also fill the quota between them so
    // that none completes (each then fails and its partial file is removed): zero is
    // a legitimate outcome, and was seen under load.
    assert!(stored <= 2, "{results:?}");
    let l = s.fs(&d, "GET", "path=", b"").json();
    let sizes: Vec<u64> = l["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["size"].as_u64().unwrap())
        .collect();
    assert_eq!(
        sizes,
        vec![6 * MIB as u64; stored],
        "no partial uploads: {l}"
    );
    d.assert_clean();
    d.stop();
}

fn pct(b: &[u8]) -> String {
    b.iter()
        .map(|&c| {
            if c.is_ascii_alphanumeric() {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

/// Issue 26 item 5: one key cannot take every session or volume. Per tenant at most
/// `ISOBOX_MAX_SESSIONS_PER_TENANT` sessions and `ISOBOX_MAX_VOLUMES_PER_TENANT` volumes
/// (below and at the cap: 201; above: 429 naming the setting), within the global caps
/// (which keep their own message); another key is unaffected by the first one's cap,
/// and a delete frees a place.
#[test]
fn test_per_tenant_session_and_volume_caps() {
    let d = Daemon::start_with(&[
        ("ISOBOX_API_KEYS", "key-one,key-two"),
        ("ISOBOX_REQUIRE_AUTH", "1"),
        ("ISOBOX_MAX_SESSIONS", "3"),
        ("ISOBOX_MAX_SESSIONS_PER_TENANT", "2"),
        ("ISOBOX_MAX_VOLUMES", "2"),
        ("ISOBOX_MAX_VOLUMES_PER_TENANT", "1"),
    ]);
    d.wait_ready();
    let post = |key: &str, path: &str, body: Value| {
        d.request(
            "POST",
            path,
            &[("X-API-Key", key)],
            body.to_string().as_bytes(),
        )
    };
    let session = |key: &str| post(key, "/v1/sessions", json!({"runtime": "python-slim"}));
    let detail = |r: &common::Resp| r.json()["detail"].as_str().unwrap_or_default().to_string();
    let one_a = session("key-one");
    assert_eq!(one_a.status, 201, "below the cap: {}", one_a.text());
    let one_b = session("key-one");
    assert_eq!(one_b.status, 201, "at the cap: {}", one_b.text());
    let r = session("key-one");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (429, Some("too_many_sessions")),
        "{}",
        r.text()
    );
    assert!(
        detail(&r).contains("ISOBOX_MAX_SESSIONS_PER_TENANT"),
        "{}",
        r.text()
    );
    // Another key is not held by the first one's cap; the global cap (3) still applies.
    assert_eq!(session("key-two").status, 201);
    let r = session("key-two");
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(detail(&r).contains("(ISOBOX_MAX_SESSIONS)"), "{}", r.text());
    // A delete frees a place for its tenant.
    let v = one_a.json();
    let r = d.request(
        "DELETE",
        &format!("/v1/sessions/{}", v["id"].as_str().unwrap()),
        &[
            ("X-API-Key", "key-one"),
            ("X-Session-Token", v["token"].as_str().unwrap()),
        ],
        b"",
    );
    assert!(r.status == 200 || r.status == 204, "{}", r.text());
    assert_eq!(session("key-one").status, 201);

    let volume = |key: &str| post(key, "/v1/volumes", json!({"name": "mem"}));
    let r = volume("key-one");
    assert_eq!(r.status, 201, "at the cap: {}", r.text());
    let r = volume("key-one");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (429, Some("too_many_volumes")),
        "{}",
        r.text()
    );
    assert!(
        detail(&r).contains("ISOBOX_MAX_VOLUMES_PER_TENANT"),
        "{}",
        r.text()
    );
    assert_eq!(volume("key-two").status, 201, "another key has its own");
    d.stop();
}

/// Issue 26 item 1: a zip's entry names are bounded together (8 MiB), checked before
/// the download starts. 600 hard links to one empty file at the bottom of 63 levels
/// of 255-byte directory names take a few KiB of disk and ~9.7 MiB of names: refused
/// with 413 naming the cap; the same tree with 400 links (~6.5 MiB of names) is
/// served, every name in it whole.
#[test]
fn test_zip_names_are_bounded_before_the_download_starts() {
    let d = Daemon::start();
    d.wait_ready();
    let s = Session::create(&d, &json!({"runtime": "python-slim"}));
    let mk = |links: usize| {
        format!(
            r#"
import os, shutil
os.chdir("/workspace")
shutil.rmtree("deep", ignore_errors=True)
os.mkdir("deep"); os.chdir("deep")
for i in range(63):
    n = ("%02d" % i) + "d" * 253
    os.mkdir(n); os.chdir(n)
open("f", "w").close()
for i in range({links}):
    os.link("f", "l%04d" % i)
print("made", flush=True)
"#
        )
    };
    let r = s.step(&d, &mk(600));
    assert!(
        r["run"]["stdout"].as_str().unwrap_or("").contains("made"),
        "{r}"
    );
    let r = s.fs(&d, "GET", "path=deep&format=zip", b"");
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.json()["error"], "archive_too_large");
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("8 MiB of entry names"),
        "{}",
        r.text()
    );
    let r = s.step(&d, &mk(400));
    assert!(
        r["run"]["stdout"].as_str().unwrap_or("").contains("made"),
        "{r}"
    );
    let r = s.fs(&d, "GET", "path=deep&format=zip", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    // Central directory: 63 directories + f + 400 links.
    let eocd = &r.body[r.body.len() - 22..];
    assert_eq!(&eocd[..4], b"PK\x05\x06");
    assert_eq!(u16::from_le_bytes([eocd[10], eocd[11]]), 63 + 1 + 400);
    d.stop();
}
