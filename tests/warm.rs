//! The warm pool against the real daemon: pooled gVisor sandboxes with the interpreter
//! already started, each serving one `/execute`; results compared with the cold path
//! of a second daemon without a pool.

mod common;

use common::sse::Stream;
use common::Daemon;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const POOL: &str = "python-slim=2";

fn warm_daemon(pool: &str) -> Daemon {
    let d = Daemon::start_with(&[("ISOBOX_WARM_POOL", pool)]);
    d.wait_ready();
    d
}

fn pool(d: &Daemon) -> Value {
    d.get("/healthz").json()["warmPool"].clone()
}

/// Waits until the python-slim pool holds `n` ready sandboxes.
fn wait_ready(d: &Daemon, n: u64) {
    wait_ready_of(d, "python-slim", n)
}

/// Waits until `runtime`'s pool holds at least `n` ready sandboxes (a pool of 1 that
/// saw two runs within a second may have grown to 2: `pool_size`).
fn wait_ready_of(d: &Daemon, runtime: &str, n: u64) {
    wait_pool(
        d,
        &format!("pool never reached {n}"),
        Duration::from_secs(60),
        |p| p["runtimes"][runtime]["ready"].as_u64() >= Some(n),
    );
}

fn hits(d: &Daemon) -> u64 {
    pool(d)["hits"].as_u64().unwrap()
}

/// The result without what legitimately differs (durations).
fn comparable(mut v: Value) -> Value {
    v["run"].as_object_mut().unwrap().remove("durationMs");
    if let Some(c) = v.get_mut("compile").and_then(Value::as_object_mut) {
        c.remove("durationMs");
    }
    v
}

/// Runs each case on `warm` (served by its full `runtime` pool of `n`) and on `cold`,
/// and asserts the two results are the same but for durations.
fn same_warm_and_cold(
    warm: &Daemon,
    cold: &Daemon,
    runtime: &str,
    n: u64,
    cases: &[(&str, Value)],
) {
    for (name, body) in cases {
        wait_ready_of(warm, runtime, n);
        let before = hits(warm);
        let w = warm.execute(body.clone());
        assert_eq!(hits(warm), before + 1, "{name}: served warm");
        let c = cold.execute(body.clone());
        assert_eq!(
            comparable(w.clone()),
            comparable(c.clone()),
            "{name}:\nwarm {w}\ncold {c}"
        );
    }
}

#[test]
fn test_warm_and_cold_give_the_same_result() {
    let warm = warm_daemon(POOL);
    let cold = Daemon::start();
    cold.wait_ready();
    assert!(cold.get("/healthz").json().get("warmPool").is_none());
    let cases = [
        (
            "success with files, stdin and args",
            json!({"language": "python-slim", "code": "import sys, os\nimport helper\nprint(sys.argv, __name__, __file__ == os.path.abspath('main.py'))\nprint(helper.X, input(), sys.stdin.read())\nprint(sorted(os.listdir('.')), os.getcwd(), os.getuid())\ntry:\n    open('helper.py', 'a')\nexcept OSError as e:\n    print('read-only', e.errno in (13, 30))", "files": [{"name": "helper.py", "content": "X = 'from helper'"}, {"name": "data/in.txt", "content": "x"}], "stdin": "line one\nrest\n", "args": ["a", "b c"], "network": false}),
        ),
        (
            "exception",
            json!({"language": "python-slim", "code": "def f():\n    raise ValueError('bad')\nf()", "network": false}),
        ),
        (
            "syntax error",
            json!({"language": "python-slim", "code": "def (:", "network": false}),
        ),
        (
            "sys.exit and threads joined at exit",
            json!({"language": "python-slim", "code": "import sys, threading, time, atexit\natexit.register(lambda: print('atexit ran'))\nt = threading.Thread(target=lambda: (time.sleep(0.3), print('thread done')))\nt.start()\nsys.exit(3)", "network": false}),
        ),
        (
            "exit with a message",
            json!({"language": "python-slim", "code": "raise SystemExit('goodbye')", "network": false}),
        ),
        (
            "timeout",
            json!({"language": "python-slim", "code": "print('start', flush=True)\nwhile True: pass", "limits": {"wallTimeMs": 700}, "network": false}),
        ),
        (
            "oom",
            json!({"language": "python-slim", "code": "x = []\nwhile True: x.append(bytearray(16 << 20))", "network": false}),
        ),
        (
            "truncation",
            json!({"language": "python-slim", "code": "import sys\nprint('y' * 5000)\nprint('e' * 3000, file=sys.stderr)", "limits": {"outputBytes": 1024}, "network": false}),
        ),
        (
            "network asked for while egress is off",
            json!({"language": "python-slim", "code": "print(1)"}),
        ),
        // The exit report (a warm run is answered when the harness reports the status,
        // before the sandbox's teardown) must not lose or change anything. (Teardown
        // output is delayed where it can be, so a report sent too early loses it.)
        (
            "large output written just before the end",
            json!({"language": "python-slim", "code": "import sys\nsys.stdout.write('o' * 300000)\nsys.stderr.write('e' * 200000)\nprint('end')", "network": false}),
        ),
        (
            "finalisers and atexit at shutdown",
            json!({"language": "python-slim", "code": "import atexit\nclass A:\n    def __init__(self, n): self.n = n\n    def __del__(self): print('del', self.n)\na = A('a')\n_b = A('_b')\natexit.register(print, 'atexit ran')\nprint('main done')", "network": false}),
        ),
        (
            "stdin closed by the program",
            json!({"language": "python-slim", "code": "import sys\nsys.stdin.close()\nprint('closed')", "stdin": "unread", "network": false}),
        ),
        (
            "os._exit",
            json!({"language": "python-slim", "code": "import os\nprint('x', flush=True)\nos._exit(4)", "network": false}),
        ),
        (
            "a daemon thread still running at the end",
            json!({"language": "python-slim", "code": "import threading, time\nthreading.Thread(target=lambda: time.sleep(10), daemon=True).start()\nprint('main done')", "network": false}),
        ),
        (
            "exit status above 255",
            json!({"language": "python-slim", "code": "import sys\nsys.exit(300)", "network": false}),
        ),
        (
            "negative exit status",
            json!({"language": "python-slim", "code": "import sys\nsys.exit(-1)", "network": false}),
        ),
        (
            "KeyboardInterrupt",
            json!({"language": "python-slim", "code": "raise KeyboardInterrupt", "network": false}),
        ),
        (
            "a forked child's exit is not the program's",
            json!({"language": "python-slim", "code": "import os, sys\npid = os.fork()\nif pid == 0:\n    print('child', flush=True)\n    sys.exit(0)\nos.waitpid(pid, 0)\nprint('parent')\nsys.exit(3)", "network": false}),
        ),
        (
            "a finaliser that reads a global",
            json!({"language": "python-slim", "code": "import time\nname = 'world'\nclass A:\n    def __del__(self):\n        time.sleep(0.3)\n        print('bye', name)\na = A()\nimport json\njson.keep = A()", "network": false}),
        ),
        (
            "a suspended generator and a coroutine never awaited",
            json!({"language": "python-slim", "code": "import time\ndef g():\n    try:\n        yield 1\n    finally:\n        time.sleep(0.3)\n        print('gen closed')\nx = g()\nnext(x)\nasync def c():\n    pass\ny = c()\nprint('main done')", "network": false}),
        ),
        // What the harness imported for itself is gone from sys.modules before the
        // program runs: it finds what a cold interpreter has.
        (
            "the modules a program finds imported",
            json!({"language": "python-slim", "code": "import sys\nprint(sorted(sys.modules))", "network": false}),
        ),
        (
            "non-ASCII names and arguments, an empty argument, binary and empty files",
            json!({"language": "python-slim", "code": "import os, sys\nprint(sys.argv[1:], sorted(os.listdir('d\u{e9}')), open('d\u{e9}/b\u{fc}.bin', 'rb').read(), open('empty.txt').read() == '')", "files": [{"name": "d\u{e9}/b\u{fc}.bin", "content": "AP8K", "encoding": "base64"}, {"name": "empty.txt", "content": ""}], "args": ["\u{fc}n\u{ef}", "", "\u{1f600}"], "network": false}),
        ),
        (
            "a file object left open",
            json!({"language": "python-slim", "code": "f = open(1, 'w', closefd=False)\nf.write('buffered\\n')\nl = [f]\nl.append(l)\nprint('first')", "network": false}),
        ),
    ];
    same_warm_and_cold(&warm, &cold, "python-slim", 2, &cases);
    // The cases above really ran.
    let ok = warm.execute(cases[0].1.clone());
    assert_eq!(
        ok["run"]["stdout"],
        "['main.py', 'a', 'b c'] __main__ True\nfrom helper line one rest\n\n['data', 'helper.py', 'main.py'] /workspace 65534\nread-only True\n",
        "{ok}"
    );
    // Streaming: the same chunks and the same done event.
    let body = json!({"language": "python-slim", "code": "import sys, time\nfor i in range(3):\n    print(i, flush=True); print('e', i, file=sys.stderr, flush=True); time.sleep(0.1)\nsys.exit(2)", "network": false});
    wait_ready(&warm, 2);
    let before = hits(&warm);
    let (wo, we, wd) = Stream::execute(&warm, &body).outputs();
    assert_eq!(hits(&warm), before + 1);
    let (co, ce, cd) = Stream::execute(&cold, &body).outputs();
    assert_eq!((wo.as_str(), we.as_str()), ("0\n1\n2\n", "e 0\ne 1\ne 2\n"));
    assert_eq!((wo, we), (co, ce));
    assert_eq!(comparable(wd), comparable(cd));
    warm.assert_clean_except_pool();
    cold.assert_clean();
    warm.stop();
    cold.stop();
}

#[test]
fn test_requests_a_pool_cannot_honour_start_cold() {
    let d = warm_daemon(POOL);
    wait_ready(&d, 2);
    for body in [
        // Not the runtime's default memory or pids: the pool booted with those.
        json!({"language": "python-slim", "code": "print(1)", "limits": {"memoryBytes": 100_000_000}, "network": false}),
        json!({"language": "python-slim", "code": "print(1)", "limits": {"pids": 8}, "network": false}),
        // A runtime with no pool on this daemon.
        json!({"language": "ruby", "code": "puts 1", "network": false}),
    ] {
        let v = d.execute(body.clone());
        assert_eq!(v["run"]["exitCode"], 0, "{body}: {v}");
        assert_eq!(v["run"]["stdout"], "1\n", "{body}: {v}");
    }
    let p = pool(&d);
    assert_eq!(
        (p["hits"].as_u64(), p["misses"].as_u64()),
        (Some(0), Some(0)),
        "{p}"
    );
    // A pooled run honours a different CPU quota and wall time (written at claim).
    let v = d.execute(json!({"language": "python-slim", "code": "print(1)", "limits": {"cpus": 0.5, "wallTimeMs": 3000}, "network": false}));
    assert_eq!(v["run"]["stdout"], "1\n", "{v}");
    assert_eq!(pool(&d)["hits"], 1);
    d.stop();
}

#[test]
fn test_never_handed_out_twice_burst_drains_and_refills() {
    let d = warm_daemon(POOL);
    wait_ready(&d, 2);
    // Each run leaves marks; a sandbox handed out twice would find them.
    let code = "import os\nseen = [p for p in ('/tmp/mark', '/workspace/mark') if os.path.exists(p)]\nopen('/tmp/mark', 'w').write('x')\nopen('/workspace/mark', 'w').write('x')\nprint('seen', seen)";
    for _ in 0..4 {
        wait_ready(&d, 2);
        let v = d.execute(json!({"language": "python-slim", "code": code, "network": false}));
        assert_eq!(v["run"]["stdout"], "seen []\n", "{v}");
    }
    assert_eq!(hits(&d), 4);
    // A burst of 4 at once drains the pool of 2: at least 2 hits and a cold start.
    wait_ready(&d, 2);
    let before = pool(&d);
    let results: Vec<Value> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                sc.spawn(|| {
                    d.execute(json!({"language": "python-slim", "code": code, "network": false}))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for v in &results {
        assert_eq!(v["run"]["stdout"], "seen []\n", "{v}");
    }
    let after = pool(&d);
    let dh = after["hits"].as_u64().unwrap() - before["hits"].as_u64().unwrap();
    let dm = after["misses"].as_u64().unwrap() - before["misses"].as_u64().unwrap();
    assert_eq!(dh + dm, 4, "{after}");
    assert!(
        dh >= 2 && dm >= 1,
        "the burst drained the pool: {before} -> {after}"
    );
    // ...and it refills in the background.
    wait_ready(&d, 2);
    let p = pool(&d);
    assert_eq!(p["failures"], 0, "{p}");
    assert_eq!(
        p["refills"].as_u64().unwrap(),
        2 + p["hits"].as_u64().unwrap(),
        "{p}"
    );
    // What the refills cost, from each sandbox's cgroup: tens of milliseconds of CPU
    // to a few seconds each, never nothing.
    let per = p["refillCpuSeconds"].as_f64().unwrap() / p["refills"].as_f64().unwrap();
    assert!((0.01..5.0).contains(&per), "{p}");
    d.assert_clean_except_pool();
    d.stop();
}

/// Runs `n` python-slim `print(1)` at once; (hits, misses) they made.
fn burst(d: &Daemon, n: usize) -> (u64, u64) {
    let before = pool(d);
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n)
            .map(|_| {
                sc.spawn(|| {
                    d.execute(
                        json!({"language": "python-slim", "code": "print(1)", "network": false}),
                    )
                })
            })
            .collect();
        for h in hs {
            let v = h.join().unwrap();
            assert_eq!(v["run"]["stdout"], "1\n", "{v}");
        }
    });
    let after = pool(d);
    let delta = |k: &str| after[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    (delta("hits"), delta("misses"))
}

/// Polls `/healthz` until `ok` holds for the warm pool (bounded).
fn wait_pool(d: &Daemon, what: &str, within: Duration, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let p = pool(d);
        if ok(&p) {
            return p;
        }
        assert!(Instant::now() < deadline, "{what}: {p}\nlog:\n{}", d.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pool grows to the bursts it sees, up to its max, so the next burst of the same
/// size is served warm; a pool left idle for a window goes back to its min; with no
/// CPU budget it never grows.
#[test]
fn test_the_pool_grows_to_a_burst_and_shrinks_when_idle() {
    let d = Daemon::start_with(&[
        ("ISOBOX_WARM_POOL", "python-slim=1"),
        ("ISOBOX_WARM_POOL_MAX", "python-slim=3"),
        ("ISOBOX_WARM_POOL_CPU", "100"),
        ("ISOBOX_WARM_POOL_WINDOW_SEC", "20"),
    ]);
    d.wait_ready();
    wait_ready(&d, 1);
    let p = pool(&d);
    let rt = &p["runtimes"]["python-slim"];
    assert_eq!(
        (&rt["target"], &rt["min"], &rt["max"], &rt["arrivals"]),
        (&json!(1), &json!(1), &json!(3), &json!(0)),
        "{p}"
    );
    assert_eq!(p["growth"], true, "{p}");
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    assert_eq!(
        p["refillCpuBudget"].as_f64(),
        Some(cpus),
        "100 % of {cpus} CPUs: {p}"
    );
    // A burst of 4 against a pool of 1: one warm, three cold; the pool grows to 3
    // (its max, not 4) and refills to it.
    let (hits, misses) = burst(&d, 4);
    assert_eq!((hits, misses), (1, 3));
    let p = wait_pool(
        &d,
        "the pool grew to its max",
        Duration::from_secs(60),
        |p| p["runtimes"]["python-slim"]["ready"] == 3,
    );
    assert_eq!(p["runtimes"]["python-slim"]["target"], 3, "{p}");
    assert_eq!(p["runtimes"]["python-slim"]["arrivals"], 4, "{p}");
    assert!(p["refillCpuLastMinute"].as_f64().unwrap() > 0.0, "{p}");
    // The same burst of 3 again: every run warm.
    assert_eq!(burst(&d, 3), (3, 0), "{}", d.log());
    let m = d.get("/metrics").text();
    for line in [
        "isobox_warm_pool_min{runtime=\"python-slim\"} 1",
        "isobox_warm_pool_max{runtime=\"python-slim\"} 3",
        "isobox_warm_pool_growth 1",
    ] {
        assert!(m.lines().any(|l| l == line), "{line} in\n{m}");
    }
    // Idle for the window (20 s: the refills and the second burst above must fit in
    // it on a busy host): the burst no longer counts, the pool gives back what it
    // holds above its min.
    let p = wait_pool(
        &d,
        "the pool shrank to its min",
        Duration::from_secs(60),
        |p| {
            let rt = &p["runtimes"]["python-slim"];
            rt["target"] == 1 && rt["ready"] == 1 && rt["arrivals"] == 0
        },
    );
    assert!(p["shrunk"].as_u64().unwrap() >= 2, "{p}");
    d.assert_clean_except_pool();
    let deadline = Instant::now() + Duration::from_secs(20);
    while d.pool_containers().len() != 1 {
        assert!(
            Instant::now() < deadline,
            "given back, yet still there: {:?} {p}",
            d.pool_containers()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    d.stop();

    // No budget: the pool stays at its min whatever arrives.
    let d = Daemon::start_with(&[
        ("ISOBOX_WARM_POOL", "python-slim=1"),
        ("ISOBOX_WARM_POOL_MAX", "python-slim=3"),
        ("ISOBOX_WARM_POOL_CPU", "0"),
    ]);
    d.wait_ready();
    wait_ready(&d, 1);
    assert_eq!(burst(&d, 3), (1, 2));
    let p = wait_pool(&d, "refilled", Duration::from_secs(60), |p| {
        p["runtimes"]["python-slim"]["ready"] == 1
    });
    assert_eq!(p["growth"], false, "{p}");
    assert_eq!(p["runtimes"]["python-slim"]["target"], 1, "{p}");
    assert_eq!(p["runtimes"]["python-slim"]["arrivals"], 3, "{p}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(pool(&d)["refills"], p["refills"], "no boot past the min");
    d.stop();
}

#[test]
fn test_pool_removed_at_shutdown_and_swept_after_a_crash() {
    let instance = format!("isobox-warm{}", std::process::id());
    let env = [
        ("ISOBOX_WARM_POOL", POOL),
        ("ISOBOX_INSTANCE", instance.as_str()),
    ];
    let mut d = Daemon::start_with(&env);
    d.wait_ready();
    wait_ready(&d, 2);
    let old = d.pool_containers();
    assert_eq!(old.len(), 2, "{old:?}");
    // kill -9: the pooled sandboxes are orphans now.
    let mut child = d.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let d = Daemon::start_with(&env);
    d.wait_ready();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let now = d.pool_containers();
        if !now.iter().any(|c| old.contains(c)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "old pool not swept: {old:?} in {now:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The new instance fills its own pool, and a clean stop removes it (stop() checks
    // the slice and the runsc root are gone).
    wait_ready(&d, 2);
    assert_eq!(d.pool_containers().len(), 2);
    d.stop();
}

#[test]
fn test_javascript_warm_and_cold_give_the_same_result() {
    let warm = warm_daemon("javascript=1");
    let cold = Daemon::start();
    cold.wait_ready();
    let cases = [
        (
            "success with files, stdin and args",
            json!({"language": "javascript", "code": "const h = require('./helper');\nconsole.log(process.argv.slice(2), require.main === module, __filename, h.X);\nconsole.log(require('fs').readdirSync('.').sort(), process.cwd(), process.getuid());\ntry { require('fs').appendFileSync('helper.js', 'x'); } catch (e) { console.log('read-only', e.code === 'EROFS' || e.code === 'EACCES'); }\nlet d = ''; process.stdin.on('data', c => d += c); process.stdin.on('end', () => console.log('stdin', JSON.stringify(d)));", "files": [{"name": "helper.js", "content": "exports.X = 'from helper';"}], "stdin": "line one\nrest\n", "args": ["a", "b c"], "network": false}),
        ),
        (
            "uncaught exception",
            json!({"language": "javascript", "code": "function f() { throw new Error('bad'); }\nf();", "network": false}),
        ),
        (
            "exit code",
            json!({"language": "javascript", "code": "console.log('bye'); process.exit(3);", "network": false}),
        ),
        (
            "timeout",
            json!({"language": "javascript", "code": "console.log('start'); while (true) {}", "limits": {"wallTimeMs": 1500}, "network": false}),
        ),
        (
            "truncation",
            json!({"language": "javascript", "code": "console.log('y'.repeat(5000)); console.error('e'.repeat(3000));", "limits": {"outputBytes": 1024}, "network": false}),
        ),
        // The exit report (see test_exit_report_answers_before_teardown).
        (
            "large output written just before the end",
            json!({"language": "javascript", "code": "process.stdout.write('o'.repeat(300000)); process.stderr.write('e'.repeat(200000)); console.log('end');", "network": false}),
        ),
        (
            "exit listeners and process.exitCode",
            json!({"language": "javascript", "code": "process.on('exit', (c) => { console.log('exit', c); process.exitCode = 300; });\nsetTimeout(() => console.log('timer'), 50);\nprocess.exitCode = 4;", "network": false}),
        ),
        (
            "unhandled rejection",
            json!({"language": "javascript", "code": "process.on('exit', (c) => console.log('exit', c));\nPromise.reject(new Error('nope'));", "network": false}),
        ),
        (
            "an exit listener unsets process.exitCode",
            json!({"language": "javascript", "code": "process.on('exit', () => { process.exitCode = undefined; });\nprocess.exitCode = 4;", "network": false}),
        ),
        (
            "'exit' emitted by the program",
            json!({"language": "javascript", "code": "process.emit('exit', 0);\nsetTimeout(() => { console.log('later'); process.exitCode = 3; }, 200);", "network": false}),
        ),
        (
            "process.emit wrapped by the program (as signal-exit does)",
            json!({"language": "javascript", "code": "const orig = process.emit;\nprocess.emit = function (ev, ...a) { const r = orig.call(this, ev, ...a); if (ev === 'exit') { console.log('after exit'); process.exitCode = 5; } return r; };\nconsole.log('main');", "network": false}),
        ),
        (
            "worker thread and forked child",
            json!({"language": "javascript", "code": "const { Worker } = require('worker_threads');\nnew Worker(\"console.log('in worker')\", { eval: true }).on('exit', () => {\n  require('child_process').fork('child.js').on('exit', (c) => console.log('child exit', c));\n});", "files": [{"name": "child.js", "content": "console.log('child ran', process.execArgv.length);"}], "network": false}),
        ),
        (
            "process.exit with no code after an error was handled",
            json!({"language": "javascript", "code": "process.on('uncaughtException', (e) => { console.log('handled', e.message); process.exit(); });\nthrow new Error('x');", "network": false}),
        ),
    ];
    same_warm_and_cold(&warm, &cold, "javascript", 1, &cases);
    let ok = warm.execute(cases[0].1.clone());
    assert_eq!(
        ok["run"]["stdout"],
        "[ 'a', 'b c' ] true /workspace/main.js from helper\n[ 'helper.js', 'main.js' ] /workspace 65534\nread-only true\nstdin \"line one\\nrest\\n\"\n",
        "{ok}"
    );
    warm.assert_clean_except_pool();
    cold.assert_clean();
    warm.stop();
    cold.stop();
}

#[test]
fn test_ruby_warm_and_cold_give_the_same_result() {
    let warm = warm_daemon("ruby=1");
    let cold = Daemon::start();
    cold.wait_ready();
    let cases = [
        (
            "success with files, stdin and args",
            json!({"language": "ruby", "code": "require_relative 'helper'\nputs ARGV.inspect, $0, __FILE__ == File.expand_path('main.rb'), H\nputs Dir.children('.').sort.inspect, Dir.pwd, Process.uid\nbegin\n  File.open('helper.rb', 'a') { |f| f.write('x') }\nrescue SystemCallError => e\n  puts \"read-only #{e.is_a?(Errno::EROFS) || e.is_a?(Errno::EACCES)}\"\nend\nputs \"stdin #{$stdin.read.inspect}\"", "files": [{"name": "helper.rb", "content": "H = 'from helper'"}], "stdin": "line one\nrest\n", "args": ["a", "b c"], "network": false}),
        ),
        (
            "uncaught exception",
            json!({"language": "ruby", "code": "def f\n  raise ArgumentError, 'bad'\nend\nf", "network": false}),
        ),
        (
            "syntax error",
            json!({"language": "ruby", "code": "def (", "network": false}),
        ),
        (
            "exit code and at_exit",
            json!({"language": "ruby", "code": "at_exit { puts 'at_exit ran' }\nputs 'bye'\nexit 3", "network": false}),
        ),
        (
            "timeout",
            json!({"language": "ruby", "code": "puts 'start'\nloop {}", "limits": {"wallTimeMs": 1500}, "network": false}),
        ),
        (
            "truncation",
            json!({"language": "ruby", "code": "puts 'y' * 5000\nwarn 'e' * 3000", "limits": {"outputBytes": 1024}, "network": false}),
        ),
    ];
    same_warm_and_cold(&warm, &cold, "ruby", 1, &cases);
    let ok = warm.execute(cases[0].1.clone());
    assert_eq!(
        ok["run"]["stdout"],
        "[\"a\", \"b c\"]\n/workspace/main.rb\ntrue\nfrom helper\n[\"helper.rb\", \"main.rb\"]\n/workspace\n65534\nread-only true\nstdin \"line one\\nrest\\n\"\n",
        "{ok}"
    );
    // Streaming is the cold path's too.
    wait_ready_of(&warm, "ruby", 1);
    let body = json!({"language": "ruby", "code": "3.times { |i| puts i; warn \"e#{i}\"; sleep 0.1 }\nexit 2", "network": false});
    let (wo, we, wd) = Stream::execute(&warm, &body).outputs();
    let (co, ce, cd) = Stream::execute(&cold, &body).outputs();
    assert_eq!((wo.as_str(), we.as_str()), ("0\n1\n2\n", "e0\ne1\ne2\n"));
    assert_eq!((wo, we), (co, ce));
    assert_eq!(comparable(wd), comparable(cd));
    warm.assert_clean_except_pool();
    cold.assert_clean();
    warm.stop();
    cold.stop();
}

/// A claimed Python sandbox is answered when its harness reports the exit status, not
/// when the sandbox has been torn down; whenever the status is not known exactly, the
/// run ends the cold way. Either way nothing is left behind.
#[test]
fn test_exit_report_answers_before_teardown() {
    let d = Daemon::start_with(&[("ISOBOX_WARM_POOL", "python-slim=1")]);
    d.wait_ready();
    let reports = |d: &Daemon| pool(d)["exitReports"].as_u64().unwrap();
    // (program, reported, exit code, stdout)
    let cases = [
        ("print(1)", true, 0, "1\n"),
        ("import sys\nprint('x')\nsys.exit(5)", true, 5, "x\n"),
        // What dies quietly does not stop the report: in-memory files, generators
        // never started.
        ("import io\nb = io.StringIO('s')\ng = (i for i in range(3))\nprint(b.read())", true, 0, "s\n"),
        // Not known exactly: the cold way.
        ("import os\nprint('x', flush=True)\nos._exit(4)", false, 4, "x\n"),
        ("import threading, time\nthreading.Thread(target=lambda: time.sleep(10), daemon=True).start()\nprint('y')", false, 0, "y\n"),
        // Bytes on its stdin socket that are not the harness's frame: ignored (the
        // channel is closed; on a cold run fd 0 is a pipe's reading end anyway).
        ("import os, sys\nos.write(0, b'\\x00\\x00\\x00\\x02{}junk')\nsys.exit(3)", false, 3, ""),
        // A program that forges the frame only ends its own run early: the answer is
        // what it claimed, and its sandbox is killed (the clean check below).
        ("import os, struct, time\nprint('forged', flush=True)\nb = b'{\"ev\":\"exit\",\"code\":0}'\nos.write(0, struct.pack('>I', len(b)) + b)\ntime.sleep(30)", true, 0, "forged\n"),
    ];
    for (code, reported, exit, stdout) in cases {
        wait_ready(&d, 1);
        let (h, r) = (hits(&d), reports(&d));
        let v = d.execute(json!({"language": "python-slim", "code": code, "limits": {"wallTimeMs": 20000}, "network": false}));
        assert_eq!(hits(&d), h + 1, "{code}: served warm");
        assert_eq!(reports(&d), r + u64::from(reported), "{code}: {v}");
        assert_eq!(v["run"]["exitCode"], exit, "{code}: {v}");
        assert_eq!(v["run"]["stdout"], stdout, "{code}: {v}");
        assert_eq!(v["run"]["timedOut"], false, "{code}: {v}");
        // Far from the 20 s wall time: the forged run did not wait for its sleep.
        assert!(
            v["run"]["durationMs"].as_u64().unwrap() < 5000,
            "{code}: {v}"
        );
    }
    // The sandboxes, the forger's included, are gone.
    d.assert_clean_except_pool();
    let p = pool(&d);
    assert_eq!(p["failures"], 0, "{p}");
    d.stop();
    // node reports after every 'exit' listener, except when an uncaught exception is
    // still to be printed.
    let d = Daemon::start_with(&[("ISOBOX_WARM_POOL", "javascript=1")]);
    d.wait_ready();
    for (code, reported, exit, stderr_has) in [
        ("console.log(1)", true, 0, ""),
        ("process.exitCode = 7", true, 7, ""),
        // An exception the program handles: an ordinary exit after it.
        ("process.on('uncaughtException', () => { process.exitCode = 2; });\nthrow new Error('handled');", true, 2, ""),
        ("throw new Error('late')", false, 1, "Error: late"),
    ] {
        wait_ready_of(&d, "javascript", 1);
        let r = reports(&d);
        let v = d.execute(json!({"language": "javascript", "code": code, "network": false}));
        assert_eq!(reports(&d), r + u64::from(reported), "{code}: {v}");
        assert_eq!(v["run"]["exitCode"], exit, "{code}: {v}");
        assert!(
            v["run"]["stderr"].as_str().unwrap().contains(stderr_has),
            "{code}: {v}"
        );
    }
    d.assert_clean_except_pool();
    d.stop();
}

/// Compiled runtimes: the pooled sandbox's harness writes the files and execs the cold
/// path's own build wrapper, so the build, its frame and the program are the cold
/// path's (the program is PID 1 either way).
#[test]
fn test_compiled_warm_and_cold_give_the_same_result() {
    let warm = warm_daemon("go=1,rust=1,typescript=1");
    let cold = Daemon::start();
    cold.wait_ready();
    let go = [
        (
            "success with files, stdin, args and an exit code",
            json!({"language": "go", "code": "package main\nimport (\"bufio\"; \"fmt\"; \"os\")\nfunc main() {\n\ts := bufio.NewScanner(os.Stdin)\n\ts.Scan()\n\tb, err := os.ReadFile(\"data/in.txt\")\n\tfmt.Println(os.Args[1:], s.Text(), helper(), string(b), err, os.Getpid())\n\t_, err = os.OpenFile(\"helper.go\", os.O_WRONLY, 0)\n\tfmt.Println(\"read-only\", err != nil)\n\tos.Exit(3)\n}", "files": [{"name": "helper.go", "content": "package main\nfunc helper() string { return \"from helper\" }"}, {"name": "data/in.txt", "content": "x"}], "stdin": "line one\nrest\n", "args": ["a", "b c"], "network": false}),
        ),
        (
            "build error",
            json!({"language": "go", "code": "package main\nfunc main() { x := }", "network": false}),
        ),
        (
            "timeout",
            json!({"language": "go", "code": "package main\nimport \"fmt\"\nfunc main() { fmt.Println(\"start\"); for {} }", "limits": {"wallTimeMs": 1500}, "network": false}),
        ),
    ];
    same_warm_and_cold(&warm, &cold, "go", 1, &go);
    let ok = warm.execute(go[0].1.clone());
    assert_eq!(
        (ok["run"]["stdout"].as_str(), ok["run"]["exitCode"].as_i64()),
        (
            Some("[a b c] line one from helper x <nil> 1\nread-only true\n"),
            Some(3)
        ),
        "{ok}"
    );
    let rust = [(
        "success with stdin and args",
        json!({"language": "rust", "code": "use std::io::Read;\nfn main() {\n    let mut s = String::new();\n    std::io::stdin().read_to_string(&mut s).unwrap();\n    println!(\"{:?} {:?} {}\", std::env::args().skip(1).collect::<Vec<_>>(), s, std::process::id());\n}", "stdin": "in\n", "args": ["x"], "network": false}),
    )];
    same_warm_and_cold(&warm, &cold, "rust", 1, &rust);
    let ts = [
        (
            "success",
            json!({"language": "typescript", "code": "const x: number = 1;\nconsole.log(x, process.argv.slice(2), process.pid);", "args": ["a"], "network": false}),
        ),
        (
            "type error",
            json!({"language": "typescript", "code": "const x: number = 's';", "network": false}),
        ),
    ];
    same_warm_and_cold(&warm, &cold, "typescript", 1, &ts);
    warm.assert_clean_except_pool();
    cold.assert_clean();
    warm.stop();
    cold.stop();
}
