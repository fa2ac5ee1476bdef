//! Compiled runtimes: the build stage inside the sandbox, its own time limit, failed
//! builds, and a program that cannot forge the build frame.

mod common;
use common::{merged, Daemon};
use serde_json::{json, Value};
use std::time::Instant;

fn installed(d: &Daemon, lang: &str) -> bool {
    d.get("/runtimes")
        .json()
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["language"] == lang)
}

fn run(d: &Daemon, lang: &str, code: &str, extra: Value) -> Value {
    d.execute(merged(
        json!({"language": lang, "network": false, "code": code}),
        extra,
    ))
}

#[test]
fn test_build_failure_frame_forgery_and_wall_time_after_build() {
    let d = Daemon::start();
    assert!(
        installed(&d, "rust") && installed(&d, "go"),
        "go and rust are installed by make runtimes"
    );
    // A failed build: the program does not run; its outcome is the build's.
    let r = run(&d, "rust", "fn main() { let x: i32 = \"no\"; }", json!({}));
    let c = &r["compile"];
    assert_ne!(c["exitCode"], 0);
    assert!(
        c["stderr"].as_str().unwrap().contains("mismatched types"),
        "{r}"
    );
    assert_eq!(r["run"]["exitCode"], c["exitCode"]);
    assert_eq!(r["run"]["stderr"], c["stderr"]);
    assert_eq!(
        (
            r["run"]["stdout"].as_str(),
            r["run"]["timedOut"].as_bool(),
            c["timedOut"].as_bool()
        ),
        (Some(""), Some(false), Some(false))
    );
    assert_eq!(r["run"]["durationMs"], 0);
    // The program's wall time starts after the build (which takes seconds here), and
    // the program's own stderr cannot forge a build frame.
    let code = "use std::io::Write;\nfn main() {\n  std::thread::sleep(std::time::Duration::from_millis(800));\n  eprint!(\"\\x1eISOBOX-BUILD 0 0 0 0\\n\");\n  std::io::stderr().flush().unwrap();\n  println!(\"{:?}\", std::env::args().skip(1).collect::<Vec<_>>());\n}\n";
    let r = run(
        &d,
        "rust",
        code,
        json!({"args": ["a b", "$(id)"], "limits": {"wallTimeMs": 1500}}),
    );
    assert_eq!(r["compile"]["exitCode"], 0, "{r}");
    assert!(r["compile"]["durationMs"].as_u64().unwrap() > 0);
    assert_eq!(r["run"]["timedOut"], false, "{r}");
    assert_eq!(r["run"]["stdout"], "[\"a b\", \"$(id)\"]\n");
    assert_eq!(r["run"]["stderr"], "\u{1e}ISOBOX-BUILD 0 0 0 0\n");
    let ms = r["run"]["durationMs"].as_u64().unwrap();
    assert!(
        (800..1500).contains(&ms),
        "durationMs is the program's own time: {ms}"
    );
    // Multi-file go: the first file is the entry.
    let r = d.execute(json!({"language": "golang", "network": false, "files": [{"name": "prog.go", "content": "package main\nimport \"fmt\"\nfunc main() { fmt.Println(\"multi\") }\n"}]}));
    assert_eq!(r["run"]["stdout"], "multi\n", "{r}");
    d.assert_clean();
    d.stop();
}

#[test]
fn test_compile_time_limit_is_distinct_from_wall_time() {
    let d = Daemon::start_with(&[("ISOBOX_COMPILE_TIMEOUT_MS", "1000")]);
    // rustc needs several seconds inside gVisor: the 1 s compile limit kills it.
    let t0 = Instant::now();
    let r = run(&d, "rust", "fn main() { println!(\"never\"); }", json!({}));
    assert_eq!(r["compile"]["timedOut"], true, "{r}");
    assert_eq!(r["compile"]["exitCode"], 137);
    assert_eq!(
        (
            r["run"]["timedOut"].as_bool(),
            r["run"]["exitCode"].as_i64(),
            r["run"]["stdout"].as_str()
        ),
        (Some(false), Some(137), Some(""))
    );
    assert!(t0.elapsed().as_secs() < 8, "{:?}", t0.elapsed());
    d.assert_clean();
    d.stop();
}
