//! Live-kernel sessions against the real daemon: one long-lived gVisor sandbox per
//! session running our harness, real cgroups, real LMDB, talked to over HTTP.

mod common;

use base64::Engine;
use common::session::Session;
use common::Daemon;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

/// A kernel session, with the checks every create here makes.
fn create(d: &Daemon, body: Value) -> Session {
    let s = Session::create(d, &body);
    let v = &s.created;
    assert_eq!(v["type"], "kernel", "{v}");
    assert_eq!(v["runtime"], "python", "{v}");
    s
}

fn kernels_used(d: &Daemon) -> u64 {
    d.get("/healthz").json()["kernels"]["used"]
        .as_u64()
        .unwrap()
}

fn wait_kernels_used(d: &Daemon, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while kernels_used(d) != n {
        assert!(
            Instant::now() < deadline,
            "kernels used never became {n}: {}",
            d.get("/healthz").text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Decodes a PNG artifact and checks it is a PNG with a sane header; returns (w, h).
fn png_size(a: &Value) -> (u32, u32) {
    assert_eq!(a["type"], "image/png", "{a}");
    let b = base64::engine::general_purpose::STANDARD
        .decode(a["dataB64"].as_str().unwrap())
        .expect("dataB64 is base64");
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&b[12..16], b"IHDR");
    let w = u32::from_be_bytes(b[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(b[20..24].try_into().unwrap());
    assert!(b.ends_with(b"IEND\xaeB`\x82"), "PNG ends with IEND");
    (w, h)
}

#[test]
fn test_state_persists_exit_codes_and_the_kernel_survives() {
    let d = Daemon::start();
    d.wait_ready();
    assert_eq!(
        d.get("/healthz").json()["kernels"],
        json!({"used": 0, "max": 4})
    );
    let s = create(&d, json!({"runtime": "python", "type": "kernel"}));
    assert_eq!(kernels_used(&d), 1);
    // The spec's example: `arr` persists from one step to the next.
    let v = s.step(&d, "import numpy as np; arr = np.arange(10)");
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    assert_eq!(v["run"]["stdout"], "", "{v}");
    assert!(v.get("artifacts").is_none(), "no artifacts, no key: {v}");
    assert_eq!(v["language"], "python");
    assert_eq!(v["backend"], "gvisor");
    let v = s.step(&d, "print(arr.sum())");
    assert_eq!(v["run"]["stdout"], "45\n", "{v}");
    assert!(v["run"]["durationMs"].as_u64().unwrap() < 1000, "{v}");
    // Egress is off in tests: asked for by default, not applied, and said so.
    assert_eq!(v["run"]["network"], false);
    assert!(
        v["warning"].as_str().unwrap().contains("network OFF"),
        "{v}"
    );
    // An exception: exit 1, the traceback on stderr (the harness's frames cut), and
    // earlier variables are still there.
    let v = s.step(&d, "x = 7\ndef f():\n    return 1/0\nf()");
    assert_eq!(v["run"]["exitCode"], 1, "{v}");
    let err = v["run"]["stderr"].as_str().unwrap();
    assert!(
        err.starts_with("Traceback (most recent call last):\n  File \"<step 3>\""),
        "{err}"
    );
    assert!(err.contains("ZeroDivisionError: division by zero"), "{err}");
    assert!(!err.contains("harness") && !err.contains("_step"), "{err}");
    let v = s.step(&d, "print(x, arr[3], f.__name__)");
    assert_eq!(v["run"]["stdout"], "7 3 f\n", "{v}");
    // A syntax error is an exception too.
    let v = s.step(&d, "def (:");
    assert_eq!(v["run"]["exitCode"], 1, "{v}");
    assert!(
        v["run"]["stderr"].as_str().unwrap().contains("SyntaxError"),
        "{v}"
    );
    // sys.exit(n) reports n, exit() 0, sys.exit("msg") 1 with the message; the kernel lives.
    let v = s.step(
        &d,
        "import sys\nprint('before')\nsys.exit(3)\nprint('after')",
    );
    assert_eq!(v["run"]["exitCode"], 3, "{v}");
    assert_eq!(v["run"]["stdout"], "before\n", "{v}");
    assert_eq!(s.step(&d, "exit()")["run"]["exitCode"], 0);
    let v = s.step(&d, "sys.exit('bye')");
    assert_eq!(v["run"]["exitCode"], 1, "{v}");
    assert_eq!(v["run"]["stderr"], "bye\n", "{v}");
    let v = s.step(&d, "print(x + 1)");
    assert_eq!(v["run"]["stdout"], "8\n", "{v}");
    // A trailing bare expression's value is shown, like a REPL; None is not.
    assert_eq!(s.step(&d, "x * 6")["run"]["stdout"], "42\n");
    assert_eq!(s.step(&d, "None")["run"]["stdout"], "");
    // Steps work in /workspace, as the non-root sandbox user, on a read-only root.
    let v = s.step(&d, "import os\nprint(os.getcwd(), os.getuid() != 0)\nopen('/workspace/k.txt','w').write('hi')\ntry:\n    open('/etc/x','w')\nexcept OSError as e:\n    print('read-only', e.errno in (13, 30))");
    assert_eq!(
        v["run"]["stdout"], "/workspace True\nread-only True\n",
        "{v}"
    );
    let r = s.fs(&d, "GET", "path=k.txt", b"");
    assert_eq!((r.status, r.body.as_slice()), (200, b"hi".as_slice()));
    // Files given with a step land in the workspace; the code is not written there.
    let v = s.exec(&d, &json!({"code": "print(open('data/in.txt').read())", "files": [{"name": "data/in.txt", "content": "from a file"}]}));
    assert_eq!(v.json()["run"]["stdout"], "from a file\n", "{}", v.text());
    let v = s.step(&d, "import os; print(sorted(os.listdir('.')))");
    assert_eq!(v["run"]["stdout"], "['data', 'k.txt']\n", "{v}");
    // Output caps apply per step.
    let v = s
        .exec(
            &d,
            &json!({"code": "print('y' * 5000)", "limits": {"outputBytes": 1024}}),
        )
        .json();
    assert_eq!(v["run"]["stdout"], "y".repeat(1024), "{v}");
    assert_eq!(v["run"]["truncated"], true, "{v}");
    let v = s.step(&d, "print('z')");
    assert_eq!(v["run"]["truncated"], false, "{v}");
    assert_eq!(v["run"]["stdout"], "z\n", "{v}");
    let r = s.delete(&d);
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(kernels_used(&d), 0);
    let r = s.exec(&d, &json!({"code": "1"}));
    assert_eq!(r.status, 404, "{}", r.text());
    d.assert_clean();
    d.stop();
}

#[test]
fn test_artifacts_figures_html_and_caps() {
    let d = Daemon::start();
    d.wait_ready();
    let s = Session::kernel(&d);
    // A figure and a DataFrame: the figure as PNG, the DataFrame's HTML.
    let v = s.step(&d, "import matplotlib.pyplot as plt\nimport pandas as pd\nplt.plot([1, 3, 2])\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})");
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    assert_eq!(v["run"]["stdout"], "", "{v}");
    let arts = v["artifacts"].as_array().unwrap();
    assert_eq!(arts.len(), 2, "{v}");
    assert_eq!(png_size(&arts[0]), (640, 480));
    assert_eq!(arts[1]["type"], "text/html");
    let html = arts[1]["data"].as_str().unwrap();
    assert!(
        html.contains("<table") && html.contains("<td>x</td>"),
        "{html}"
    );
    assert_eq!(v["run"]["truncated"], false);
    // Captured figures are closed: the next step has none.
    let v = s.step(&d, "print(len(plt.get_fignums()))");
    assert_eq!(v["run"]["stdout"], "0\n", "{v}");
    assert!(v.get("artifacts").is_none(), "{v}");
    // At the cap (8 figures): all kept. Above it (9): 8 kept, truncated set.
    let v = s.step(&d, "for i in range(8):\n    plt.figure(); plt.plot([i, 0])");
    assert_eq!(v["artifacts"].as_array().unwrap().len(), 8, "{v}");
    assert_eq!(v["run"]["truncated"], false);
    let v = s.step(&d, "for i in range(9):\n    plt.figure(); plt.plot([i, 0])");
    let arts = v["artifacts"].as_array().unwrap();
    assert_eq!(arts.len(), 8);
    for a in arts {
        png_size(a);
    }
    assert_eq!(v["run"]["truncated"], true);
    assert_eq!(v["run"]["exitCode"], 0);
    assert_eq!(s.step(&d, "len(plt.get_fignums())")["run"]["stdout"], "0\n");
    // _repr_png_ of a trailing expression; HTML just under and just over 2 MiB.
    let v = s.step(&d, "import io\nclass P:\n    def _repr_png_(self):\n        f = plt.figure(figsize=(1, 1)); b = io.BytesIO(); f.savefig(b, format='png'); plt.close(f); return b.getvalue()\nP()");
    let arts = v["artifacts"].as_array().unwrap();
    assert_eq!(arts.len(), 1, "{v}");
    assert_eq!(png_size(&arts[0]), (100, 100));
    let v = s.step(&d, "class H:\n    def __init__(self, n): self.n = n\n    def _repr_html_(self): return 'a' * self.n\nH(2 * 1024 * 1024)");
    assert_eq!(v["artifacts"][0]["data"].as_str().unwrap().len(), 2 << 20);
    assert_eq!(v["run"]["truncated"], false);
    let v = s.step(&d, "H(2 * 1024 * 1024 + 1)");
    assert!(v.get("artifacts").is_none(), "{}", &v.to_string()[..200]);
    assert_eq!(v["run"]["truncated"], true);
    // Capture never breaks a step: a broken _repr_html_ and a figure that cannot be
    // drawn still give exit 0, with what could be captured.
    let v = s.step(
        &d,
        "class B:\n    def _repr_html_(self): raise RuntimeError('no')\nprint('ran')\nB()",
    );
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    assert!(
        v["run"]["stdout"].as_str().unwrap().starts_with("ran\n"),
        "{v}"
    );
    assert!(s.delete(&d).status == 204);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_user_code_cannot_forge_frames_or_break_the_channel() {
    let d = Daemon::start();
    d.wait_ready();
    let s = Session::kernel(&d);
    // A step prints a well-formed frame (length prefix + done JSON) to stdout and
    // stderr: it is output, nothing more.
    let fake = r#"import os, struct, json
f = json.dumps({"ev": "done", "exit": 99, "truncated": True}).encode()
os.write(1, struct.pack('>I', len(f)) + f)
os.write(2, struct.pack('>I', len(f)) + f)
print()
print('real end')"#;
    let v = s.step(&d, fake);
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    assert!(
        v["run"]["stdout"]
            .as_str()
            .unwrap()
            .ends_with("\nreal end\n"),
        "{v}"
    );
    assert!(
        v["run"]["stderr"]
            .as_str()
            .unwrap()
            .contains("\"exit\": 99"),
        "{v}"
    );
    assert_eq!(v["run"]["truncated"], false);
    // stdin is not the channel: reading it gets EOF at once.
    let v = s.step(&d, "import sys\nprint(repr(sys.stdin.read()))");
    assert_eq!(v["run"]["stdout"], "''\n", "{v}");
    // Closing fd 1 and 2 (and sys.stdout) breaks only that step's output.
    let v = s.step(
        &d,
        "import os, sys\nsys.stdout.close()\nos.close(1)\nos.close(2)\nlost = 1",
    );
    assert_eq!(v["run"]["exitCode"], 0, "{v}");
    let v = s.step(
        &d,
        "import sys\nprint('out again', lost)\nprint('err again', file=sys.stderr)",
    );
    assert_eq!(v["run"]["stdout"], "out again 1\n", "{v}");
    assert_eq!(v["run"]["stderr"], "err again\n", "{v}");
    // Redirected sys.stdout is put back for the next step.
    s.step(&d, "import io, sys\nsys.stdout = io.StringIO()");
    assert_eq!(s.step(&d, "print('back')")["run"]["stdout"], "back\n");
    // A background thread printing between steps: the next step gets its own output.
    s.step(&d, "import threading, time\nstop = False\ndef chatter():\n    while not stop:\n        print('bg'); time.sleep(0.01)\nt = threading.Thread(target=chatter); t.start()");
    std::thread::sleep(Duration::from_millis(300));
    let v = s.step(&d, "stop = True\nt.join()\nprint('mine')");
    assert!(
        v["run"]["stdout"].as_str().unwrap().ends_with("mine\n"),
        "{v}"
    );
    // Two steps at once: the second gets 409 session_busy.
    let addr_s = s.clone();
    let d2 = &d;
    std::thread::scope(|sc| {
        let h = sc.spawn(|| addr_s.step(d2, "import time; time.sleep(1.5); print('slow')"));
        std::thread::sleep(Duration::from_millis(500));
        let r = s.exec(d2, &json!({"code": "print(1)"}));
        assert_eq!(r.status, 409, "{}", r.text());
        assert_eq!(r.json()["error"], "session_busy");
        // A refused step does not touch the workspace the running one uses.
        let r = s.exec(
            d2,
            &json!({"code": "print(1)", "files": [{"name": "refused.txt", "content": "x"}]}),
        );
        assert_eq!(r.status, 409, "{}", r.text());
        // Deleting a session whose kernel runs a step: 409 too.
        assert_eq!(s.delete(d2).status, 409);
        assert_eq!(h.join().unwrap()["run"]["stdout"], "slow\n");
    });
    let v = s.step(
        &d,
        "import os; print(os.path.exists('/workspace/refused.txt'))",
    );
    assert_eq!(v["run"]["stdout"], "False\n", "{v}");
    // A file that cannot be placed refuses the step (400) and frees the kernel.
    s.step(&d, "import os; os.makedirs('adir', exist_ok=True)");
    let r = s.exec(
        &d,
        &json!({"code": "print('ran')", "files": [{"name": "adir", "content": "x"}]}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"], "invalid_path");
    // A streaming client that stops reading and leaves does not cost the kernel: the
    // step's output is still drained, the step ends, the kernel lives.
    {
        let body = json!({"code": "for i in range(20000):\n    print('x' * 200)\nprint('end')", "limits": {"wallTimeMs": 20000}}).to_string();
        let mut c = d.connect();
        write!(
            c,
            "POST /v1/sessions/{}/exec?stream=1 HTTP/1.1\r\nHost: t\r\nX-Session-Token: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            s.id, s.token, body.len()
        )
        .unwrap();
        let mut first = [0u8; 256];
        let _ = c.read(&mut first).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        drop(c);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = s.exec(&d, &json!({"code": "print('after the leaver')"}));
        if r.status == 200 {
            assert_eq!(
                r.json()["run"]["stdout"],
                "after the leaver\n",
                "{}",
                r.text()
            );
            break;
        }
        assert_eq!(r.status, 409, "{}", r.text());
        assert!(Instant::now() < deadline, "the left step never ended");
        std::thread::sleep(Duration::from_millis(200));
    }
    // A kernel step has no stdin or args; a bad session type, a non-Python kernel and
    // `network` on a filesystem session are refused.
    for (body, code) in [
        (json!({"code": "1", "stdin": "x"}), "invalid_json"),
        (json!({"code": "1", "args": ["a"]}), "invalid_json"),
    ] {
        let r = s.exec(&d, &body);
        assert_eq!(
            (r.status, r.json()["error"].clone()),
            (400, json!(code)),
            "{}",
            r.text()
        );
    }
    for body in [
        json!({"runtime": "javascript", "type": "kernel"}),
        json!({"runtime": "python", "type": "repl"}),
        json!({"runtime": "python", "type": "kernel", "network": "no"}),
    ] {
        let r = d.post_json("/v1/sessions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.json()["error"], "invalid_json", "{body}");
    }
    assert_eq!(s.step(&d, "print('alive')")["run"]["stdout"], "alive\n");
    // Two deletes at once: one ends the kernel and deletes (204), the other is told
    // (409 while it is being deleted, or 404 once it is gone); both are answered.
    let statuses: Vec<u16> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2).map(|_| sc.spawn(|| s.delete(&d).status)).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.contains(&204), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| [204, 404, 409].contains(s)),
        "{statuses:?}"
    );
    assert_eq!(s.delete(&d).status, 404);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_wall_time_ends_the_kernel_and_the_next_call_says_so() {
    let d = Daemon::start();
    d.wait_ready();
    let s = Session::kernel(&d);
    s.step(&d, "open('keep.txt', 'w').write('kept')");
    // Just under the wall time: fine, and the kernel lives.
    let v = s.exec(&d, &json!({"code": "import time; time.sleep(0.5); print('in time')", "limits": {"wallTimeMs": 3000}}))
    .json();
    assert_eq!(v["run"]["stdout"], "in time\n", "{v}");
    let t0 = Instant::now();
    let v = s.exec(&d, &json!({"code": "print('start', flush=True)\nimport time; time.sleep(1e9)", "limits": {"wallTimeMs": 1000}}))
    .json();
    assert_eq!(v["run"]["exitCode"], 137, "{v}");
    assert_eq!(v["run"]["timedOut"], true, "{v}");
    assert_eq!(v["run"]["oomKilled"], false, "{v}");
    assert_eq!(v["run"]["stdout"], "start\n", "{v}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    let r = s.exec(&d, &json!({"code": "print(1)"}));
    assert_eq!(r.status, 410, "{}", r.text());
    assert_eq!(r.json()["error"], "kernel_dead");
    let detail = r.json()["detail"].as_str().unwrap().to_string();
    assert!(detail.contains("wall time (1000 ms)"), "{detail}");
    // Asked as a stream, the refusal comes before any SSE head: the same 410 and body.
    for (rest, accept) in [("/exec?stream=1", "*/*"), ("/exec", "text/event-stream")] {
        let r = s.request(
            &d,
            "POST",
            rest,
            &[("Content-Type", "application/json"), ("Accept", accept)],
            json!({"code": "print(1)"}).to_string().as_bytes(),
        );
        assert_eq!(r.status, 410, "{rest} {accept}: {}", r.text());
        assert_eq!(r.json()["error"], "kernel_dead", "{}", r.text());
        assert!(
            r.json()["detail"]
                .as_str()
                .unwrap()
                .contains("wall time (1000 ms)"),
            "{}",
            r.text()
        );
    }
    wait_kernels_used(&d, 0);
    // Its files stay readable; the session can be deleted.
    let r = s.fs(&d, "GET", "path=keep.txt", b"");
    assert_eq!((r.status, r.body.as_slice()), (200, b"kept".as_slice()));
    d.assert_clean();
    assert_eq!(s.delete(&d).status, 204);
    d.stop();
}

#[test]
fn test_memory_cap_covers_the_kernels_whole_life() {
    let d = Daemon::start();
    d.wait_ready();
    let s = Session::kernel(&d);
    // 64 MiB a step, kept across steps: the 384 MiB cap ends it within a few steps.
    s.step(&d, "keep = []");
    let mut last = Value::Null;
    for _ in 0..12 {
        let r = s.exec(&d, &json!({"code": "keep.append(bytearray(64 * 1024 * 1024)); print(len(keep))", "limits": {"wallTimeMs": 20000}}));
        if r.status != 200 {
            last = json!({"status": r.status, "body": r.json()});
            break;
        }
        last = r.json();
        if last["run"]["exitCode"] != 0 {
            break;
        }
    }
    assert_eq!(last["run"]["oomKilled"], true, "{last}\nlog:\n{}", d.log());
    assert_eq!(last["run"]["exitCode"], 137, "{last}");
    assert_eq!(last["run"]["timedOut"], false, "{last}");
    let r = s.exec(&d, &json!({"code": "print(1)"}));
    assert_eq!(r.status, 410, "{}", r.text());
    assert!(
        r.json()["detail"].as_str().unwrap().contains("memory"),
        "{}",
        r.text()
    );
    assert_eq!(s.delete(&d).status, 204);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_pool_cap_idle_reaping_and_disabled() {
    let d = Daemon::start_with(&[("ISOBOX_KERNELS_MAX", "1"), ("ISOBOX_KERNEL_IDLE_SEC", "2")]);
    d.wait_ready();
    let a = Session::kernel(&d);
    assert_eq!(
        d.get("/healthz").json()["kernels"],
        json!({"used": 1, "max": 1})
    );
    // Past the cap: 429, with Retry-After; filesystem sessions are not kernels.
    let r = d.post_json(
        "/v1/sessions",
        &json!({"runtime": "python", "type": "kernel"}),
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"], "too_many_kernels");
    assert!(r.header("retry-after").is_some());
    let r = d.post_json("/v1/sessions", &json!({"runtime": "python"}));
    assert_eq!(r.status, 201, "{}", r.text());
    // Steps keep it alive past its idle limit...
    for _ in 0..4 {
        a.step(&d, "pass");
        std::thread::sleep(Duration::from_millis(700));
    }
    assert_eq!(kernels_used(&d), 1);
    // ...and idleness ends it, freeing the slot.
    wait_kernels_used(&d, 0);
    let r = a.exec(&d, &json!({"code": "1"}));
    assert_eq!(r.status, 410, "{}", r.text());
    assert!(
        r.json()["detail"].as_str().unwrap().contains("idle"),
        "{}",
        r.text()
    );
    let b = Session::kernel(&d);
    assert_eq!(b.step(&d, "print('b')")["run"]["stdout"], "b\n");
    assert_eq!(a.delete(&d).status, 204);
    assert_eq!(b.delete(&d).status, 204);
    d.assert_clean();
    d.stop();
    let d = Daemon::start_with(&[("ISOBOX_KERNELS_MAX", "0")]);
    d.wait_ready();
    assert!(d.get("/healthz").json().get("kernels").is_none());
    let r = d.post_json(
        "/v1/sessions",
        &json!({"runtime": "python", "type": "kernel"}),
    );
    assert_eq!(r.status, 501, "{}", r.text());
    assert_eq!(r.json()["error"], "kernels_disabled");
    d.stop();
}

/// A kernel create from client address `ip` (behind the trusted loopback proxy).
fn create_from(d: &Daemon, ip: &str) -> common::Resp {
    d.request(
        "POST",
        "/v1/sessions",
        &[("X-Forwarded-For", ip)],
        json!({"runtime": "python", "type": "kernel", "network": false})
            .to_string()
            .as_bytes(),
    )
}

#[test]
fn test_kernels_cannot_be_hoarded() {
    // Two slots, one per client; a kernel idle 2 s makes room when the pool is full.
    let d = Daemon::start_with(&[
        ("ISOBOX_KERNELS_MAX", "2"),
        ("ISOBOX_KERNEL_EVICT_IDLE_SEC", "2"),
        ("ISOBOX_TRUSTED_PROXIES", "127.0.0.1/32"),
    ]);
    d.wait_ready();
    let r = create_from(&d, "198.51.100.1");
    assert_eq!(r.status, 201, "{}", r.text());
    let a = Session::from_created(r.json());
    // Client 1's second kernel is over its share, though a slot is free.
    let r = create_from(&d, "198.51.100.1");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"], "too_many_kernels");
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("ISOBOX_KERNELS_PER_CLIENT"),
        "{}",
        r.text()
    );
    assert!(r.header("retry-after").is_some());
    assert_eq!(kernels_used(&d), 1);
    let r = create_from(&d, "198.51.100.2");
    assert_eq!(r.status, 201, "{}", r.text());
    let b = Session::from_created(r.json());
    // Full, and nobody idle for 2 s yet: a third client waits.
    let r = create_from(&d, "198.51.100.3");
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(r.json()["error"], "too_many_kernels");
    // a stays idle; b keeps working. Past 2 s the longest idle (a) makes room.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(2300) {
        assert_eq!(b.step(&d, "print(1)")["run"]["stdout"], "1\n");
        std::thread::sleep(Duration::from_millis(300));
    }
    let r = create_from(&d, "198.51.100.3");
    assert_eq!(r.status, 201, "{}", r.text());
    let c = Session::from_created(r.json());
    assert_eq!(c.step(&d, "print('c')")["run"]["stdout"], "c\n");
    assert_eq!(b.step(&d, "print('b')")["run"]["stdout"], "b\n");
    let r = a.exec(&d, &json!({"code": "1"}));
    assert_eq!(r.status, 410, "{}", r.text());
    assert_eq!(r.json()["error"], "kernel_dead");
    assert!(
        r.json()["detail"]
            .as_str()
            .unwrap()
            .contains("to make room"),
        "{}",
        r.text()
    );
    wait_kernels_used(&d, 2);
    for s in [&a, &b, &c] {
        assert_eq!(s.delete(&d).status, 204);
    }
    d.assert_clean();
    d.stop();
}

#[test]
fn test_streaming_user_site_volume_and_restart() {
    let mut d = Daemon::start();
    d.wait_ready();
    let vol = d.post_json("/v1/volumes", &json!({"name": "kmem"}));
    assert_eq!(vol.status, 201, "{}", vol.text());
    let vid = vol.json()["id"].as_str().unwrap().to_string();
    let s = create(
        &d,
        json!({"runtime": "python", "type": "kernel", "network": false, "volumeId": vid}),
    );
    // SSE: output arrives while the step runs, then `done` with the artifacts.
    let body = json!({"code": "import time\nprint('first', flush=True)\ntime.sleep(1.0)\nprint('second')\nimport matplotlib.pyplot as plt\n_ = plt.plot([1])"});
    let t0 = Instant::now();
    let mut st = s.stream(&d, &body);
    let (mut first_at, mut done_at) = (None, None);
    while st.more() {
        if first_at.is_none() && st.stdout.contains("first\n") {
            first_at = Some(t0.elapsed());
        }
        if done_at.is_none() && st.done.is_some() {
            done_at = Some(t0.elapsed());
        }
    }
    let (first_at, done_at) = (first_at.expect(&st.text), done_at.expect(&st.text));
    assert!(
        done_at >= first_at + Duration::from_millis(800),
        "{first_at:?} {done_at:?}"
    );
    let done = st.done.expect("done");
    assert_eq!(done["run"]["stdout"], "first\nsecond\n", "{done}");
    assert_eq!(done["artifacts"].as_array().unwrap().len(), 1, "{done}");
    png_size(&done["artifacts"][0]);
    // HOME and the user site live in /workspace: a package installed there (here by
    // hand, as `pip install --user` would) imports in the next step without a restart.
    let v = s.step(&d, "import os, site\nprint(os.environ['HOME'], os.environ['PYTHONUSERBASE'])\nd = site.getusersitepackages()\nos.makedirs(d)\n_ = open(os.path.join(d, 'kmod.py'), 'w').write('X = 41')");
    assert_eq!(v["run"]["stdout"], "/workspace /workspace/.local\n", "{v}");
    let v = s.step(&d, "import kmod; print(kmod.X + 1)");
    assert_eq!(v["run"]["stdout"], "42\n", "{v}");
    let v = s.step(&d, "import subprocess, sys\nr = subprocess.run([sys.executable, '-m', 'pip', '--version'], capture_output=True, text=True)\nprint(r.returncode, r.stdout.split()[0])");
    assert_eq!(v["run"]["stdout"], "0 pip\n", "{v}");
    // The attached volume is at /memory.
    s.step(&d, "open('/memory/note.txt', 'w').write('remember')");
    // A restart ends every kernel; the session and its files remain, and the next
    // step says the kernel is gone.
    let instance = d.instance.clone();
    d.stop_keep_data();
    let d = Daemon::start_with(&[("ISOBOX_INSTANCE", instance.as_str())]);
    d.wait_ready();
    let r = s.exec(&d, &json!({"code": "print(1)"}));
    assert_eq!(r.status, 410, "{}", r.text());
    assert!(
        r.json()["detail"].as_str().unwrap().contains("restarted"),
        "{}",
        r.text()
    );
    assert_eq!(s.delete(&d).status, 204);
    // The volume was released with the session and kept its file.
    let f = create(
        &d,
        json!({"runtime": "python", "type": "kernel", "network": false, "volumeId": vid}),
    );
    assert_eq!(
        f.step(&d, "print(open('/memory/note.txt').read())")["run"]["stdout"],
        "remember\n"
    );
    assert_eq!(f.delete(&d).status, 204);
    d.assert_clean();
    d.stop();
}

#[test]
fn test_writing_to_the_harness_channel_ends_only_that_kernel() {
    let d = Daemon::start_with(&[
        ("ISOBOX_KERNELS_MAX", "3"),
        ("ISOBOX_KERNELS_PER_CLIENT", "3"),
    ]);
    d.wait_ready();
    // The channel is a socket among the kernel's fds; code that finds it and writes to
    // it breaks the protocol: its own kernel is ended, nothing else.
    let find = "import os, stat, struct\nctl = []\nfor fd in range(3, 64):\n    try:\n        if stat.S_ISSOCK(os.fstat(fd).st_mode):\n            ctl.append(fd)\n    except OSError:\n        pass\nassert ctl, 'no socket fd'\n";
    let cases = [
        ("oversized", "os.write(ctl[0], struct.pack('>I', 0xFFFFFFF0))\nimport time; time.sleep(5)"),
        ("ready", "f = b'{\"ev\":\"ready\"}'\nos.write(ctl[0], struct.pack('>I', len(f)) + f)\nimport time; time.sleep(5)"),
        ("garbage", "f = b'not json at all'\nos.write(ctl[0], struct.pack('>I', len(f)) + f)\nimport time; time.sleep(5)"),
    ];
    let bystander = Session::kernel(&d);
    bystander.step(&d, "y = 5");
    let mut sessions = Vec::new();
    for (name, code) in cases {
        let s = Session::kernel(&d);
        let t0 = Instant::now();
        let v = s
            .exec(
                &d,
                &json!({"code": format!("{find}{code}"), "limits": {"wallTimeMs": 20000}}),
            )
            .json();
        assert_eq!(v["run"]["exitCode"], 137, "{name}: {v}");
        assert_eq!(v["run"]["timedOut"], false, "{name}: {v}");
        assert!(
            t0.elapsed() < Duration::from_secs(4),
            "{name}: ended at once, not at the sleep's end"
        );
        let r = s.exec(&d, &json!({"code": "1"}));
        assert_eq!(r.status, 410, "{name}: {}", r.text());
        assert!(
            r.json()["detail"].as_str().unwrap().contains("protocol"),
            "{name}: {}",
            r.text()
        );
        sessions.push(s);
    }
    // Daemon and the other kernel are unaffected.
    assert_eq!(bystander.step(&d, "print(y)")["run"]["stdout"], "5\n");
    for s in sessions.iter().chain([&bystander]) {
        assert_eq!(s.delete(&d).status, 204);
    }
    d.assert_clean();
    d.stop();
}

#[test]
fn test_kill_9_with_kernels_then_restart_sweeps_them() {
    let instance = format!("isobox-kern{}", std::process::id());
    let env = [("ISOBOX_INSTANCE", instance.as_str())];
    let mut d = Daemon::start_with(&env);
    d.wait_ready();
    let idle = Session::kernel(&d);
    idle.step(&d, "x = 1");
    let busy = Session::kernel(&d);
    // One kernel mid-step when the daemon dies.
    let (id, token, addr) = (busy.id.clone(), busy.token.clone(), d.addr);
    let h = std::thread::spawn(move || {
        let mut c = std::net::TcpStream::connect(addr).unwrap();
        let body = json!({"code": "import time; time.sleep(30)", "limits": {"wallTimeMs": 60000}})
            .to_string();
        write!(
            c,
            "POST /v1/sessions/{id}/exec HTTP/1.1\r\nHost: t\r\nX-Session-Token: {token}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut buf = Vec::new();
        let _ = c.read_to_end(&mut buf);
        buf
    });
    std::thread::sleep(Duration::from_millis(800));
    let old: Vec<String> = d
        .leftovers()
        .into_iter()
        .filter(|l| l.starts_with("container "))
        .collect();
    assert_eq!(old.len(), 2, "two kernels running: {old:?}");
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    // The in-flight client sees its connection closed, with no answer.
    assert!(h.join().unwrap().is_empty());
    let d = Daemon::start_with(&env);
    d.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let left = d.leftovers();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not swept after the restart: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Both sessions survive without their kernels, and say why; slots are free.
    for s in [&idle, &busy] {
        let r = s.exec(&d, &json!({"code": "print(1)"}));
        assert_eq!(r.status, 410, "{}", r.text());
        assert!(
            r.json()["detail"].as_str().unwrap().contains("restarted"),
            "{}",
            r.text()
        );
    }
    assert_eq!(kernels_used(&d), 0);
    let fresh = Session::kernel(&d);
    assert_eq!(fresh.step(&d, "print(2)")["run"]["stdout"], "2\n");
    for s in [&idle, &busy, &fresh] {
        assert_eq!(s.delete(&d).status, 204);
    }
    d.assert_clean();
    d.stop();
}
