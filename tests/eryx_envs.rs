//! The eryx face's uploaded environments (`/eryx/v1/environments`, eryx-api.md,
//! *Environments*), on the real daemon, the real jailed builder and worker: the
//! document's example run unchanged with curl (jinja2 and markupsafe wheels from PyPI,
//! `make test-wheels`); `409 environment_not_ready` while building; runs and sessions
//! in an environment; an environment kept across a restart and rebuilt when it was
//! built for another snapshot; delete; builds that fail (native Linux code, a failing
//! import, a package escaping its directory, one that is not a wheel, a build past its
//! time); the form's bounds (50 MB of packages at and above, the body's cap) and
//! rules; the per-tenant limit (429 `environment_limit`); nothing left behind; packages
//! with extension modules compiled for WebAssembly (`make test-wasm-ext`).

mod common;
use common::{Daemon, Resp};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

const WHEELS: &str = "/var/cache/isobox-tools/wheels";

/// One part of a form: field, file name (a file part) and content.
type Part<'a> = (&'a str, Option<&'a str>, Vec<u8>);

/// A multipart form: its Content-Type and body.
fn form(parts: &[Part]) -> (String, Vec<u8>) {
    let b = "isoboxTestBoundary7f3a";
    let mut body = Vec::new();
    for (name, file, content) in parts {
        body.extend_from_slice(format!("--{b}\r\n").as_bytes());
        let disp = match file {
            Some(f) => format!(
                "Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            ),
            None => format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n"),
        };
        body.extend_from_slice(disp.as_bytes());
        body.extend_from_slice(content);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{b}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={b}"), body)
}

fn upload(d: &Daemon, parts: &[Part]) -> Resp {
    let (ct, body) = form(parts);
    d.request(
        "POST",
        "/eryx/v1/environments",
        &[("Content-Type", ct.as_str())],
        &body,
    )
}

fn run(d: &Daemon, env: &str, code: &str) -> Resp {
    d.request(
        "POST",
        "/eryx/v1/execute",
        &[("Content-Type", "application/json")],
        json!({"code": code, "environment": env})
            .to_string()
            .as_bytes(),
    )
}

/// A run that must succeed: its stdout.
fn ok(d: &Daemon, env: &str, code: &str) -> String {
    let r = run(d, env, code);
    assert_eq!(r.status, 200, "{}\nlog:\n{}", r.text(), d.log());
    let v = r.json();
    assert_eq!(v["status"], "success", "{code}: {v}");
    v["stdout"].as_str().unwrap().to_string()
}

/// `{"error": {"code", "message"}}` and nothing else: status, code, message.
fn refusal(r: &Resp) -> (u16, String, String) {
    let v = r.json();
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
    assert_eq!(v["error"].as_object().map(|o| o.len()), Some(2), "{v}");
    (
        r.status,
        v["error"]["code"].as_str().unwrap().to_string(),
        v["error"]["message"].as_str().unwrap().to_string(),
    )
}

/// The environment once its build ended (`ready` or `failed`).
fn built(d: &Daemon, name: &str) -> Value {
    let t0 = Instant::now();
    loop {
        let r = d.get(&format!("/eryx/v1/environments/{name}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        if v["status"] != "building" {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "{name} still building: {v}\nlog:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Uploads environment `env` with one package (`file`, `content`) and `imports`, and
/// waits for its build: the environment as it ended.
fn build_one(d: &Daemon, env: &str, imports: &str, file: &str, content: Vec<u8>) -> Value {
    let r = upload(
        d,
        &[
            ("name", None, env.as_bytes().to_vec()),
            ("imports", None, imports.as_bytes().to_vec()),
            ("package", Some(file), content),
        ],
    );
    assert_eq!(r.status, 202, "{}", r.text());
    built(d, env)
}

/// An environment as the API shows it: exactly the document's fields (and `error`
/// when failed).
fn check_fields(v: &Value) {
    let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want = vec![
        "created_at",
        "id",
        "imports",
        "name",
        "packages",
        "status",
        "updated_at",
    ];
    if v["status"] == "failed" {
        want.insert(1, "error");
    }
    assert_eq!(keys, want, "{v}");
    let at = v["created_at"].as_str().unwrap();
    assert_eq!((at.len(), &at[10..11], &at[19..]), (20, "T", "Z"), "{v}");
}

fn wheel(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(WHEELS).join(name))
        .unwrap_or_else(|e| panic!("{WHEELS}/{name}: {e} (make test-wheels makes it)"))
}

/// An archive with `entries` (name, content), made by Python's own modules: `make`
/// writes them into `f`, a file object, and the archive comes back on stdout (no file,
/// so tests running side by side cannot meet).
fn archive(make: &str, entries: &[(&str, &str)]) -> Vec<u8> {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import io, json, sys, tarfile, zipfile\nf = io.BytesIO()\nentries = json.loads(sys.argv[1])\n{make}\nsys.stdout.buffer.write(f.getvalue())"
        ))
        .arg(serde_json::to_string(&entries).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// A zip file (a wheel's format) with `entries`.
fn zip(entries: &[(&str, &str)]) -> Vec<u8> {
    archive(
        "with zipfile.ZipFile(f, 'w') as z:\n    for n, c in entries:\n        z.writestr(n, c)",
        entries,
    )
}

/// A gzipped tar file with `entries`.
fn targz(entries: &[(&str, &str)]) -> Vec<u8> {
    archive(
        "with tarfile.open(fileobj=f, mode='w:gz') as t:\n    for n, c in entries:\n        b = c.encode()\n        i = tarfile.TarInfo(n)\n        i.size = len(b)\n        t.addfile(i, io.BytesIO(b))",
        entries,
    )
}

/// The environments' directories under the daemon's data directory.
fn env_dirs(d: &Daemon) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d.data_dir.join("eryx-envs"))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The document's upload and its run, as the document writes them (only the base URL
/// differs), run by curl in a directory holding the two wheels.
const DOC_UPLOAD: &str = r#"curl -X POST https://api.dev.eryx.run/v1/environments -H "Authorization: Bearer $ERYX_API_KEY" \
  -F name=templating -F imports=jinja2 \
  -F package=@jinja2-3.1.4-py3-none-any.whl -F package=@markupsafe-3.0.2-py3-none-any.whl"#;
const DOC_RUN: &str = r#"curl -X POST https://api.dev.eryx.run/v1/execute -H "Authorization: Bearer $ERYX_API_KEY" \
  -H "Content-Type: application/json" \
  -d '{"code": "from markupsafe import escape\nprint(escape(\"<b>hi</b>\"))", "environment": "templating"}'"#;

fn doc_curl(d: &Daemon, snippet: &str, key: &str) -> Value {
    let seed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/seeds/eryx-api.md");
    if let Ok(doc) = std::fs::read_to_string(&seed) {
        assert!(
            doc.contains(snippet),
            "the snippet is no longer the document's"
        );
    }
    let base = format!("http://{}/eryx", d.addr);
    let cmd = snippet.replace("https://api.dev.eryx.run", &base);
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cmd} -sS"))
        .current_dir(WHEELS)
        .env("ERYX_API_KEY", key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stdout)))
}

#[test]
fn test_the_documents_environment_runs_lives_across_restarts_and_is_rebuilt_when_stale() {
    const KEY: &str = "eryx_env_key";
    let mut d = Daemon::start_with(&[("ISOBOX_API_KEYS", KEY)]);
    d.wait_ready();
    let auth = format!("Bearer {KEY}");
    let h = |ct: &str| {
        vec![
            ("Authorization", auth.clone()),
            ("Content-Type", ct.to_string()),
        ]
    };
    let req = |d: &Daemon, method: &str, path: &str, ct: &str, body: &[u8]| {
        let hs = h(ct);
        let hs: Vec<(&str, &str)> = hs.iter().map(|(n, v)| (*n, v.as_str())).collect();
        d.request(method, path, &hs, body)
    };
    // The document's upload, unchanged: 202, building, its fields exactly.
    let v = doc_curl(&d, DOC_UPLOAD, KEY);
    check_fields(&v);
    assert_eq!(v["name"], "templating");
    assert_eq!(v["status"], "building");
    assert_eq!(v["imports"], json!(["jinja2"]));
    assert_eq!(
        v["packages"],
        json!([
            "jinja2-3.1.4-py3-none-any.whl",
            "markupsafe-3.0.2-py3-none-any.whl"
        ])
    );
    let id = v["id"].as_str().unwrap().to_string();
    // The build sees the standard library (the cache) and its packages read-only and
    // writes only its build directory; nothing else of the daemon's data.
    let t0 = Instant::now();
    let build = loop {
        if let Some(pid) =
            common::instance_processes_with(&d.instance, "isobox-wasm build ").first()
        {
            break *pid;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no build seen\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let env_dir = d.data_dir.join("eryx-envs").join(&id);
    common::assert_jailed_mounts(
        build,
        &[
            ("/var/cache/isobox/wasm".into(), "ro,nosuid,nodev,noexec"),
            (
                env_dir.join("packages").display().to_string(),
                "ro,nosuid,nodev,noexec",
            ),
            (
                env_dir.join("build").display().to_string(),
                "rw,nosuid,nodev,noexec",
            ),
        ],
    );
    // While it builds, runs in it are refused.
    let code = r#"{"code": "print(1)", "environment": "templating"}"#;
    let r = req(
        &d,
        "POST",
        "/eryx/v1/execute",
        "application/json",
        code.as_bytes(),
    );
    let (status, c, m) = refusal(&r);
    assert_eq!((status, c.as_str()), (409, "environment_not_ready"), "{m}");
    // Without a key: 401, as every route.
    let r = d.get("/eryx/v1/environments");
    assert_eq!(refusal(&r).1, "missing_auth");
    // Ready, then the document's run, unchanged.
    let t0 = Instant::now();
    let v = loop {
        let r = req(
            &d,
            "GET",
            "/eryx/v1/environments/templating",
            "application/json",
            b"",
        );
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        if v["status"] != "building" {
            break v;
        }
        assert!(t0.elapsed() < Duration::from_secs(300), "{v}\n{}", d.log());
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(v["status"], "ready", "{v}\nlog:\n{}", d.log());
    check_fields(&v);
    // What the build wrote is root's and read-only (no worker or later build can
    // change a snapshot that runs load).
    {
        use std::os::unix::fs::MetadataExt;
        let build = d.data_dir.join("eryx-envs").join(&id).join("build");
        let mut seen = 0;
        let mut stack = vec![build];
        while let Some(p) = stack.pop() {
            let m = std::fs::symlink_metadata(&p).unwrap();
            assert_eq!((m.uid(), m.gid()), (0, 0), "{}", p.display());
            let want = if m.is_dir() { 0o555 } else { 0o444 };
            assert_eq!(m.mode() & 0o7777, want, "{}", p.display());
            if m.is_dir() {
                stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            }
            seen += 1;
        }
        assert!(seen > 20, "{seen}");
    }
    let out = doc_curl(&d, DOC_RUN, KEY);
    assert_eq!(out["status"], "success", "{out}");
    assert_eq!(out["stdout"], "&lt;b&gt;hi&lt;/b&gt;\n", "{out}");
    // jinja2 was imported at the build (in the snapshot); it renders; the same code
    // uses the same compute units every time.
    let render = json!({"environment": "templating", "code": "import sys\npre = 'jinja2' in sys.modules\nimport jinja2\nprint(pre, jinja2.Template('Hello {{ n }}!').render(n='<Ada>'))"}).to_string();
    let runs: Vec<Value> = (0..2)
        .map(|_| {
            req(
                &d,
                "POST",
                "/eryx/v1/execute",
                "application/json",
                render.as_bytes(),
            )
            .json()
        })
        .collect();
    assert_eq!(runs[0]["stdout"], "True Hello <Ada>!\n", "{}", runs[0]);
    assert_eq!(runs[0]["compute_units"], runs[1]["compute_units"]);
    // What the build imported and what it did not are both found where runs see the
    // packages: a submodule imported only now, and a package's data file.
    let probe = json!({"environment": "templating", "code": "import importlib.resources, jinja2.nativetypes\nprint(importlib.resources.files('jinja2').joinpath('py.typed').is_file(), jinja2.__file__, jinja2.nativetypes.__file__)"}).to_string();
    let v = req(
        &d,
        "POST",
        "/eryx/v1/execute",
        "application/json",
        probe.as_bytes(),
    )
    .json();
    assert_eq!(
        v["stdout"],
        "True /site-packages-0/jinja2/__init__.py /site-packages-0/jinja2/nativetypes.py\n",
        "{v}"
    );
    // The standard environment has none of it.
    let r = req(
        &d,
        "POST",
        "/eryx/v1/execute",
        "application/json",
        br#"{"code": "import jinja2"}"#,
    );
    let v = r.json();
    assert_eq!(v["status"], "error", "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("ModuleNotFoundError"),
        "{v}"
    );
    // A session in the environment keeps its state; a run in it naming another is 422.
    let r = req(
        &d,
        "POST",
        "/eryx/v1/sessions",
        "application/json",
        br#"{"environment": "templating"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let sid = r.json()["id"].as_str().unwrap().to_string();
    let step = |d: &Daemon, body: Value| {
        req(
            d,
            "POST",
            &format!("/eryx/v1/sessions/{sid}/execute"),
            "application/json",
            body.to_string().as_bytes(),
        )
    };
    let v = step(
        &d,
        json!({"code": "from markupsafe import Markup\nm = Markup('<i>a</i>')"}),
    )
    .json();
    assert_eq!(v["status"], "success", "{v}");
    let v = step(
        &d,
        json!({"code": "print(m + '<b>')", "environment": "templating"}),
    )
    .json();
    assert_eq!(v["stdout"], "<i>a</i>&lt;b&gt;\n", "{v}");
    let r = step(&d, json!({"code": "print(1)", "environment": "python"}));
    assert_eq!(refusal(&r).0, 422);
    // A session in an environment that does not exist: 404.
    let r = req(
        &d,
        "POST",
        "/eryx/v1/sessions",
        "application/json",
        br#"{"environment": "nope"}"#,
    );
    assert_eq!(refusal(&r).1, "not_found");
    // The same name again: 409 conflict.
    let (ct, body) = form(&[("name", None, b"templating".to_vec())]);
    let r = req(&d, "POST", "/eryx/v1/environments", &ct, &body);
    let (status, c, _) = refusal(&r);
    assert_eq!((status, c.as_str()), (409, "conflict"));
    // Listed.
    let r = req(&d, "GET", "/eryx/v1/environments", "application/json", b"");
    let list = r.json();
    let list = list["environments"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["id"], id.as_str());
    // Durable: a restart keeps it ready, and its session.
    d.stop_keep_data();
    let mut d = Daemon::start_with(&[
        ("ISOBOX_INSTANCE", &d.instance.clone()),
        ("ISOBOX_API_KEYS", KEY),
    ]);
    d.wait_ready();
    let v = step(
        &d,
        json!({"code": "import jinja2\nprint(m, jinja2.__version__)"}),
    )
    .json();
    assert_eq!(v["stdout"], "<i>a</i> 3.1.4\n", "{v}\nlog:\n{}", d.log());
    // Built for another snapshot (as after an upgrade of eryx, or on another CPU): the
    // next use rebuilds it, and gets 409 meanwhile.
    d.stop_keep_data();
    {
        let store = isobox::store::Store::open(&d.data_dir.join("state")).unwrap();
        let (_, mut rec) = store
            .eryx_envs()
            .unwrap()
            .into_iter()
            .find(|(i, _)| *i == id)
            .unwrap();
        rec.snapshot = Some("python-eryx0.4.0-0000000000000000.cwasm".into());
        let (tx, rx) = std::sync::mpsc::channel();
        store.put_eryx_env_then(&id, &rec, false, move |r| tx.send(r.unwrap()).unwrap());
        assert!(rx.recv().unwrap());
    }
    let d = Daemon::start_with(&[
        ("ISOBOX_INSTANCE", &d.instance.clone()),
        ("ISOBOX_API_KEYS", KEY),
    ]);
    d.wait_ready();
    let r = req(
        &d,
        "POST",
        "/eryx/v1/execute",
        "application/json",
        code.as_bytes(),
    );
    let (status, c, m) = refusal(&r);
    assert_eq!((status, c.as_str()), (409, "environment_not_ready"));
    assert!(m.contains("rebuilt"), "{m}");
    let t0 = Instant::now();
    loop {
        let r = req(
            &d,
            "GET",
            "/eryx/v1/environments/templating",
            "application/json",
            b"",
        );
        if r.json()["status"] == "ready" {
            break;
        }
        assert_eq!(r.json()["status"], "building", "{}", r.text());
        assert!(t0.elapsed() < Duration::from_secs(300), "{}", d.log());
        std::thread::sleep(Duration::from_millis(250));
    }
    let r = req(
        &d,
        "POST",
        "/eryx/v1/execute",
        "application/json",
        code.as_bytes(),
    );
    assert_eq!(r.json()["stdout"], "1\n", "{}", r.text());
    // Deleted: 204, then gone for every route, and its directory with it.
    assert_eq!(env_dirs(&d), std::slice::from_ref(&id));
    let r = req(
        &d,
        "DELETE",
        "/eryx/v1/environments/templating",
        "application/json",
        b"",
    );
    assert_eq!(r.status, 204, "{}", r.text());
    let r = req(
        &d,
        "GET",
        "/eryx/v1/environments/templating",
        "application/json",
        b"",
    );
    assert_eq!(refusal(&r).1, "not_found");
    let r = req(
        &d,
        "POST",
        "/eryx/v1/execute",
        "application/json",
        code.as_bytes(),
    );
    assert_eq!(refusal(&r).1, "not_found");
    let r = req(
        &d,
        "DELETE",
        "/eryx/v1/environments/templating",
        "application/json",
        b"",
    );
    assert_eq!(refusal(&r).1, "not_found");
    let t0 = Instant::now();
    while !env_dirs(&d).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", env_dirs(&d));
        std::thread::sleep(Duration::from_millis(50));
    }
    d.stop();
}

/// A name of 63 characters is one; a .tgz of a site-packages tree (as wasi-wheels ships
/// them) is installed as it is, and runs import from it. (A daemon of its own with the
/// default build time: the daemon below allows 30 s, the least there is, which a build
/// on a busy 2-core host can pass.)
#[test]
fn test_a_site_packages_tree_under_the_longest_name() {
    let d = Daemon::start();
    d.wait_ready();
    // A data directory no other user may pass: the build (uid 65533) and the workers
    // (65532) are given the environments in mount namespaces of their own, not through
    // the host's path.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&d.data_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let long = "a".repeat(63);
    let tree = targz(&[("tmod/__init__.py", "x = 6 * 7\n")]);
    let v = build_one(&d, &long, "", "tmod-tree.tgz", tree);
    assert_eq!(v["status"], "ready", "{v}");
    assert_eq!(ok(&d, &long, "import tmod\nprint(tmod.x)"), "42\n");
    d.stop();
}

/// Wheels with WebAssembly extension modules, compiled from C by `make test-wasm-ext`
/// (tests/wasm-ext).
const WASM_EXT: &str = "/var/cache/isobox-tools/wasm-ext";

fn wasm_wheel(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(WASM_EXT).join(name))
        .unwrap_or_else(|e| panic!("{WASM_EXT}/{name}: {e} (make test-wasm-ext makes it)"))
}

/// A package with extension modules compiled for wasm32-wasi: linked into the
/// environment's Python, one imported at the build and one only by a run (inside a
/// package, with the stable-ABI suffix); their C code runs, raises Python's errors, and
/// its instructions are compute units, the same on every run and stopped by the limit;
/// a session keeps the module across steps and a restart. Refused clearly: a module for
/// another CPython, WebAssembly cut short, a library with a memory of its own, one whose
/// export clashes with CPython's, one that is no Python module.
#[test]
fn test_webassembly_extension_modules_link_import_and_run() {
    let mut d = Daemon::start_with(&[("ISOBOX_ERYX_ENVIRONMENTS", "20")]);
    d.wait_ready();
    let whl = "isobox_wasmext-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl";
    let v = build_one(&d, "wasmext", "isobox_wasmext", whl, wasm_wheel(whl));
    check_fields(&v);
    assert_eq!(v["status"], "ready", "{v}\nlog:\n{}", d.log());
    assert_eq!(v["packages"], json!([whl]));
    // FNV-1a 64 of "hello" is a430d84680aabd0b; of nothing, its offset basis.
    assert_eq!(
        ok(
            &d,
            "wasmext",
            "import isobox_wasmext as m\nprint(m.add(2, 40), m.compiled_for, m.__file__, hex(m.fnv1a(b'hello')))\nprint(m.__spec__.origin == m.__loader__.path == m.__file__)"
        ),
        "42 wasm32-wasi /site-packages-0/isobox_wasmext.cpython-314-wasm32-wasi.so 0xa430d84680aabd0b\nTrue\n"
    );
    assert_eq!(
        ok(
            &d,
            "wasmext",
            "import sys\nprint('wasmpkg' in sys.modules)\nimport wasmpkg\nprint(wasmpkg.add(-5, 3), wasmpkg._speed.__file__, hex(wasmpkg.fnv1a(b'')))"
        ),
        "False\n-2 /site-packages-0/wasmpkg/_speed.abi3.so 0xcbf29ce484222325\n"
    );
    // The C code's errors are Python's.
    let v = run(&d, "wasmext", "import isobox_wasmext as m\nm.add(1)").json();
    assert_eq!(v["status"], "error", "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains("line 2") && e.ends_with("TypeError: add() takes exactly 2 arguments\n"),
        "{e}"
    );
    let v = run(&d, "wasmext", "import wasmpkg\nwasmpkg.fnv1a('text')").json();
    assert!(v["error"].as_str().unwrap().contains("TypeError"), "{v}");
    // Its instructions count: a megabyte hashed costs millions of units more than
    // nothing, exactly as much on every run; a limit below stops it.
    let hash = |n: u32, fuel: Option<u64>| -> Value {
        let mut body = json!({"environment": "wasmext",
            "code": format!("import isobox_wasmext as m\nd = b'x' * {n}\nprint(m.fnv1a(d))")});
        if let Some(f) = fuel {
            body["fuel_limit"] = json!(f);
        }
        let r = d.post_json("/eryx/v1/execute", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let (none, mb, again) = (hash(0, None), hash(1 << 20, None), hash(1 << 20, None));
    assert_eq!(mb["stdout"], "9181027699964125989\n", "{mb}");
    let units = |v: &Value| v["compute_units"].as_u64().unwrap();
    assert_eq!(units(&mb), units(&again), "{mb} {again}");
    assert!(units(&mb) > units(&none) + 4_000_000, "{none} {mb}");
    // (Checked at the engine's own granularity, as in tests/eryx.rs: 1 % short stops
    // it inside the C loop.)
    let short = units(&mb) / 100 * 99;
    let limited = hash(1 << 20, Some(short));
    assert_eq!(limited["status"], "resource_limit", "{limited}");
    assert!(
        units(&limited) <= short && units(&limited) + 10_000 >= short,
        "{limited}"
    );
    let exact = hash(1 << 20, Some(units(&mb)));
    assert_eq!(exact["stdout"], mb["stdout"], "{exact}");
    // A session keeps the module and what it computed, across steps and a restart.
    let r = d.post_json("/eryx/v1/sessions", &json!({"environment": "wasmext"}));
    assert_eq!(r.status, 201, "{}", r.text());
    let sid = r.json()["id"].as_str().unwrap().to_string();
    let step = |d: &Daemon, code: &str| -> Value {
        let r = d.post_json(
            &format!("/eryx/v1/sessions/{sid}/execute"),
            &json!({"code": code}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let v = step(&d, "import wasmpkg\nh = wasmpkg.fnv1a(b'abc')");
    assert_eq!(v["status"], "success", "{v}");
    let v = step(&d, "print(hex(h), wasmpkg.add(h % 1000, 1))");
    assert_eq!(v["stdout"], "0xe71fa2190541574b 932\n", "{v}");
    d.stop_keep_data();
    let instance = d.instance.clone();
    let d = Daemon::start_with(&[("ISOBOX_INSTANCE", instance.as_str())]);
    d.wait_ready();
    let v = step(&d, "print(wasmpkg.add(h % 1000, 2), wasmpkg.compiled_for)");
    assert_eq!(v["stdout"], "933 wasm32-wasi\n", "{v}\nlog:\n{}", d.log());

    // Built for CPython 3.13: refused at the build, naming the file and why.
    let whl = "oldabi-1.0-cp313-cp313-wasi_0_0_0_wasm32.whl";
    let v = build_one(&d, "oldabi", "", whl, wasm_wheel(whl));
    check_fields(&v);
    assert_eq!(
        v["error"],
        format!("{whl}: oldabi.cpython-313-wasm32-wasi.so is an extension module built for another Python (cpython-313-wasm32-wasi): this Python is CPython 3.14 for wasm32-wasi (cpython-314-wasm32-wasi or abi3)"),
        "{v}"
    );
    // Checked before linking, each failing the build with the file named as the
    // package has it: WebAssembly cut short; a library with a memory of its own (its
    // code would not be bound by the run's memory cap); one exporting a function of
    // CPython's with another signature.
    for (env, why) in [
        ("broken", "broken.cpython-314-wasm32-wasi.so is not valid WebAssembly: "),
        (
            "ownmem",
            "ownmem.cpython-314-wasm32-wasi.so defines a memory of its own: extension modules use the shared env.memory, which a run's memory cap bounds",
        ),
        (
            "clash",
            "clash.cpython-314-wasm32-wasi.so exports PyLong_FromLong with another signature than libpython3.14.so does: the libraries of one environment share one namespace",
        ),
    ] {
        let whl = format!("{env}-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl");
        let v = build_one(&d, env, "", &whl, wasm_wheel(&whl));
        check_fields(&v);
        let e = v["error"].as_str().unwrap();
        assert!(e.starts_with(why) && !e.contains("site-packages"), "{env}: {e}");
        assert_eq!(refusal(&run(&d, env, "print(1)")).1, "environment_not_ready");
    }
    // A shared library that defines no Python module: its import fails the build with
    // Python's own error.
    let whl = "noinit-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl";
    let v = build_one(&d, "noinit", "noinit", whl, wasm_wheel(whl));
    let e = v["error"].as_str().unwrap();
    assert!(
        e.starts_with("Importing noinit failed:")
            && e.contains("ImportError: dynamic module does not define module export function (PyInit_noinit)"),
        "{e}"
    );
    // One under the wheel's .data/platlib is installed and linked like the others.
    let whl = "platlib-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl";
    let v = build_one(&d, "platlib", "platmod", whl, wasm_wheel(whl));
    assert_eq!(v["status"], "ready", "{v}");
    assert_eq!(
        ok(
            &d,
            "platlib",
            "import platmod\nprint(platmod.add(1, 1), platmod.__file__)"
        ),
        "2 /site-packages-0/platmod.cpython-314-wasm32-wasi.so\n"
    );
    // 256 extension modules at most: at the bound it builds and runs, one over fails.
    let whl = "many256-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl";
    let v = build_one(&d, "many256", "", whl, wasm_wheel(whl));
    assert_eq!(v["status"], "ready", "{v}");
    let v = run(&d, "many256", "import m255").json();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("does not define module export function (PyInit_m255)"),
        "{v}"
    );
    let whl = "many257-1.0-cp314-cp314-wasi_0_0_0_wasm32.whl";
    let v = build_one(&d, "many257", "", whl, wasm_wheel(whl));
    assert_eq!(
        v["error"],
        format!("{whl}: the packages hold over 256 WebAssembly extension modules"),
        "{v}"
    );
    // isobox's own helper names are not a tenant's: refused in `imports` (422) and
    // at the top of a package.
    let (ct, body) = form(&[
        ("name", None, b"reserved".to_vec()),
        ("imports", None, b"jinja2 _isobox_relocate_site".to_vec()),
    ]);
    let r = d.request(
        "POST",
        "/eryx/v1/environments",
        &[("Content-Type", ct.as_str())],
        &body,
    );
    let (status, _, m) = refusal(&r);
    assert_eq!(status, 422, "{m}");
    assert!(m.contains("\"_isobox_relocate_site\" is reserved"), "{m}");
    let mine = zip(&[("_isobox_run_paths.py", "print('mine')\n")]);
    let v = build_one(&d, "reserved", "", "mine-1.0-py3-none-any.whl", mine);
    assert_eq!(
        v["error"],
        "the packages hold _isobox_run_paths.py at their top: names starting _isobox_ are the server's own",
        "{v}"
    );
    // Deleted: its files go with it.
    for env in [
        "wasmext", "oldabi", "broken", "ownmem", "clash", "noinit", "platlib", "many256",
        "many257", "reserved",
    ] {
        let r = d.request("DELETE", &format!("/eryx/v1/environments/{env}"), &[], b"");
        assert_eq!(r.status, 204, "{env}: {}", r.text());
    }
    let t0 = Instant::now();
    while !env_dirs(&d).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", env_dirs(&d));
        std::thread::sleep(Duration::from_millis(50));
    }
    d.stop();
}

#[test]
fn test_failed_builds_bad_forms_bounds_and_the_limit() {
    let d = Daemon::start_with(&[
        ("ISOBOX_ERYX_ENVIRONMENTS", "5"),
        ("ISOBOX_ERYX_BUILD_TIMEOUT_S", "30"),
    ]);
    d.wait_ready();
    let name = |n: &str| ("name", None, n.as_bytes().to_vec());
    // Native code for Linux: failed, and why.
    let native = "MarkupSafe-3.0.2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl";
    let r = upload(
        &d,
        &[
            name("native"),
            ("package", Some(native), wheel(&format!("native/{native}"))),
            // A file input left empty, as a browser sends it: skipped.
            ("package", Some(""), Vec::new()),
        ],
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["packages"], json!([native]));
    let v = built(&d, "native");
    check_fields(&v);
    assert_eq!(v["status"], "failed", "{v}");
    let e = v["error"].as_str().unwrap();
    assert!(
        e.contains(native)
            && e.contains("_speedups.cpython-311-x86_64-linux-gnu.so is native code for Linux"),
        "{e}"
    );
    let r = run(&d, "native", "print(1)");
    let (status, c, m) = refusal(&r);
    assert_eq!((status, c.as_str()), (409, "environment_not_ready"));
    assert!(m.contains("failed to build"), "{m}");
    // An import that fails: its traceback.
    let bad = zip(&[(
        "badpkg/__init__.py",
        "x = 1\nraise ValueError('boom at import')\n",
    )]);
    let v = build_one(
        &d,
        "badimport",
        "badpkg",
        "badpkg-1.0-py3-none-any.whl",
        bad,
    );
    let e = v["error"].as_str().unwrap();
    assert!(
        e.starts_with("Importing badpkg failed:")
            && e.contains("/site-packages/badpkg/__init__.py\", line 2")
            && e.contains("ValueError: boom at import"),
        "{e}"
    );
    // A package that reaches outside its directory, and one that is no wheel.
    let evil = zip(&[("../../evil.py", "x = 1\n")]);
    let v = build_one(&d, "escape", "", "evil-1.0-py3-none-any.whl", evil);
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("points outside its package"),
        "{v}"
    );
    let v = build_one(
        &d,
        "notzip",
        "",
        "x-1.0-py3-none-any.whl",
        b"not a zip".to_vec(),
    );
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("not a readable wheel"),
        "{v}"
    );
    // A source archive is not installable code; a .tar.gz of a site-packages tree is
    // (its module imports at the build).
    let sdist = targz(&[
        ("pkg-1.0/PKG-INFO", "Metadata-Version: 2.1\nName: pkg\n"),
        ("pkg-1.0/pkg/__init__.py", "x = 1\n"),
    ]);
    let v = build_one(&d, "sdist", "", "pkg-1.0.tar.gz", sdist);
    assert!(
        v["error"].as_str().unwrap().contains("a source archive"),
        "{v}"
    );
    let r = d.request("DELETE", "/eryx/v1/environments/sdist", &[], b"");
    assert_eq!(r.status, 204);
    // A build past its time (an import that never ends): stopped, failed, and the
    // builder goes on with the next.
    let forever = zip(&[("forever/__init__.py", "while True:\n    pass\n")]);
    let v = build_one(
        &d,
        "forever",
        "forever",
        "forever-1.0-py3-none-any.whl",
        forever,
    );
    assert_eq!(
        v["error"], "The build took longer than 30 s and was stopped",
        "{v}"
    );
    // Five environments: the sixth is refused (429 environment_limit) at its head,
    // before its body is read; one deleted makes room.
    let r = upload(&d, &[name("sixth")]);
    let (status, c, m) = refusal(&r);
    assert_eq!((status, c.as_str()), (429, "environment_limit"));
    assert_eq!(m, "Your org already has 5 environments (limit: 5)");
    let r = d.request("DELETE", "/eryx/v1/environments/notzip", &[], b"");
    assert_eq!(r.status, 204);
    // An upload in flight counts from its head: with four environments and one upload
    // still sending, another upload is the sixth (429); once the first client leaves,
    // there is room again.
    let mut slow = d.connect();
    std::io::Write::write_all(
        &mut slow,
        b"POST /eryx/v1/environments HTTP/1.1\r\nHost: t\r\nContent-Type: multipart/form-data; boundary=x\r\nContent-Length: 100000\r\n\r\n--x\r\n",
    )
    .unwrap();
    let t0 = Instant::now();
    loop {
        let r = upload(&d, &[name("sixth")]);
        if r.status == 429 {
            assert_eq!(
                refusal(&r).2,
                "Your org already has 5 environments (limit: 5)"
            );
            break;
        }
        // Not counted yet (its head not read): this one took the fifth place.
        assert_eq!(r.status, 202, "{}", r.text());
        let r = d.request("DELETE", "/eryx/v1/environments/sixth", &[], b"");
        assert_eq!(r.status, 204);
        assert!(t0.elapsed() < Duration::from_secs(10));
    }
    drop(slow);
    let t0 = Instant::now();
    while upload(&d, &[name("a"), ("color", None, b"x".to_vec())]).status == 429 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the upload that left still counts"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Packages of exactly 50 MB in all are taken (this one is no wheel: it fails to
    // build); one byte more is 413 with the document's message.
    let half = vec![b'x'; 25 << 20];
    let r = upload(
        &d,
        &[
            name("big"),
            ("package", Some("a.whl"), half.clone()),
            ("package", Some("b.whl"), half.clone()),
        ],
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(built(&d, "big")["status"], "failed");
    let r = d.request("DELETE", "/eryx/v1/environments/big", &[], b"");
    assert_eq!(r.status, 204);
    let mut over = half.clone();
    over.push(b'x');
    let r = upload(
        &d,
        &[
            name("big"),
            ("package", Some("a.whl"), half),
            ("package", Some("b.whl"), over),
        ],
    );
    let (status, c, m) = refusal(&r);
    assert_eq!(
        (status, c.as_str(), m.as_str()),
        (413, "invalid_request", "Packages can be up to 50 MB in all")
    );
    // A body declared over the form's cap: 413 before it is sent.
    let mut s = d.connect();
    std::io::Write::write_all(
        &mut s,
        b"POST /eryx/v1/environments HTTP/1.1\r\nHost: t\r\nContent-Type: multipart/form-data; boundary=x\r\nContent-Length: 53477377\r\n\r\n",
    )
    .unwrap();
    let r = common::read_response(&mut std::io::BufReader::new(s), false).unwrap();
    assert_eq!(refusal(&r).0, 413);
    // Bad forms, each in the document's shape.
    let cases: Vec<(Vec<Part>, u16)> = vec![
        (vec![("imports", None, b"x".to_vec())], 422),
        (vec![name("Bad_Name")], 422),
        (vec![name("python")], 422),
        (vec![name("python-extra")], 422),
        (vec![name(&"a".repeat(64))], 422),
        (vec![name("a"), name("b")], 422),
        (vec![name("a"), ("color", None, b"red".to_vec())], 422),
        (
            vec![name("a"), ("package", Some("x.zip"), b"z".to_vec())],
            422,
        ),
        (
            vec![name("a"), ("imports", None, b"os; evil()".to_vec())],
            422,
        ),
    ];
    for (parts, want) in cases {
        let r = upload(&d, &parts);
        let (status, c, m) = refusal(&r);
        assert_eq!(
            (status, c.as_str()),
            (want, "invalid_request"),
            "{parts:?}: {m}\n{}",
            d.get("/eryx/v1/environments").text()
        );
    }
    let r = d.request(
        "POST",
        "/eryx/v1/environments",
        &[("Content-Type", "application/json")],
        b"{}",
    );
    assert_eq!(refusal(&r).0, 415);
    let r = d.request(
        "POST",
        "/eryx/v1/environments",
        &[("Content-Type", "multipart/form-data; boundary=x")],
        b"garbage without a boundary",
    );
    assert_eq!(refusal(&r).0, 400);
    // Everything refused or deleted left no directory; the daemon still serves.
    let names: Vec<String> = d.get("/eryx/v1/environments").json()["environments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    let mut ids = names.clone();
    ids.sort();
    let t0 = Instant::now();
    while env_dirs(&d) != ids {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{:?} vs {ids:?}",
            env_dirs(&d)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(ok(&d, "python", "print('still here')"), "still here\n");
    // Deleted during its build: the build is killed at once (it would spin for 30 s),
    // its files go, and the builder takes the next.
    let r = d.request("DELETE", "/eryx/v1/environments/native", &[], b"");
    assert_eq!(r.status, 204);
    let spin = zip(&[("spin/__init__.py", "while True:\n    pass\n")]);
    let spinning = |d: &Daemon, env: &str| {
        let r = upload(
            d,
            &[
                name(env),
                ("imports", None, b"spin".to_vec()),
                ("package", Some("spin-1.0-py3-none-any.whl"), spin.clone()),
            ],
        );
        assert_eq!(r.status, 202, "{}", r.text());
        r.json()["id"].as_str().unwrap().to_string()
    };
    let before = env_dirs(&d).len();
    spinning(&d, "spinning");
    std::thread::sleep(Duration::from_secs(2));
    let r = d.request("DELETE", "/eryx/v1/environments/spinning", &[], b"");
    assert_eq!(r.status, 204);
    let t0 = Instant::now();
    while env_dirs(&d).len() != before {
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", env_dirs(&d));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(d.log().contains("cancelled (deleted)"), "{}", d.log());
    // A daemon stopped during a build kills it and leaves no cgroup (`stop` checks the
    // instance's slice is gone in every controller).
    spinning(&d, "spinning");
    std::thread::sleep(Duration::from_secs(3));
    let log = std::sync::Arc::clone(&d.log);
    let t0 = Instant::now();
    d.stop();
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    let t0 = Instant::now();
    while !log
        .lock()
        .unwrap()
        .contains("a build was stopped with the daemon")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{}",
            log.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
