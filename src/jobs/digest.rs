//! A job log's digest, for an agent that should not read the whole log: recognised
//! test results (pytest, go test, cargo test, Jest, Vitest, Mocha, PHPUnit, JUnit
//! through Maven or Gradle), the error lines
//! with context (a run of one line repeated collapsed to `line [×N]`), and the log's
//! end, within a character budget.
//!
//! Each parser is tested on real output of its framework (`tests/fixtures/logs`,
//! with the commands that produced it).

/// Failures listed per framework at most.
pub const MAX_FAILURES: usize = 50;
/// Characters of one failure's message at most.
const MAX_MESSAGE_CHARS: usize = 300;

pub use crate::store::jobs::{Failure, TestResults};

/// The log without terminal colour codes (`ESC [ … letter`) or carriage returns.
pub fn plain(log: &str) -> String {
    let mut out = String::with_capacity(log.len());
    let mut chars = log.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    // Parameters and intermediates, then one final byte.
                    for d in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&d) {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

fn clip(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() <= MAX_MESSAGE_CHARS {
        return s.to_string();
    }
    let mut t: String = s.chars().take(MAX_MESSAGE_CHARS).collect();
    t.push('…');
    t
}

/// `N word` pairs of a summary line (`1 failed, 3 passed`, `1 failed | 3 passed`).
fn counts(line: &str) -> Vec<(u64, String)> {
    let words: Vec<&str> = line
        .split(|c: char| c.is_whitespace() || c == ',' || c == '|' || c == '(' || c == ')')
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter_map(|w| Some((w[0].parse::<u64>().ok()?, w[1].to_ascii_lowercase())))
        .collect()
}

fn count_of(c: &[(u64, String)], words: &[&str]) -> u64 {
    c.iter()
        .filter(|(_, w)| words.contains(&w.as_str()))
        .fold(0u64, |a, (n, _)| a.saturating_add(*n))
}

/// `a + b + c`, never wrapping (counts come from untrusted text).
fn sum3(a: u64, b: u64, c: u64) -> u64 {
    a.saturating_add(b).saturating_add(c)
}

/// A file named in an `at … (file:line:col)` frame or a `file:line` reference.
fn file_in(line: &str) -> Option<String> {
    let inner = line
        .rsplit_once('(')
        .map_or(line, |(_, r)| r.trim_end_matches(')'));
    let path = inner.trim().split(':').next()?.trim();
    let ok =
        path.contains('.') && !path.contains(' ') && !path.starts_with("node:") && !path.is_empty();
    ok.then(|| path.trim_start_matches("./").to_string())
}

/// Every framework's results found in `log` (colours are ignored).
pub fn test_results(log: &str) -> Vec<TestResults> {
    let text = plain(log);
    let lines: Vec<&str> = text.lines().collect();
    [
        pytest,
        cargo_test,
        go_test,
        jest,
        vitest,
        mocha,
        phpunit,
        junit_maven,
        junit_gradle,
    ]
    .iter()
    .filter_map(|parse| parse(&lines))
    .collect()
}

fn pytest(lines: &[&str]) -> Option<TestResults> {
    let summary = lines.iter().rev().find(|l| {
        let t = l.trim();
        t.starts_with('=')
            && t.ends_with('=')
            && (t.contains(" passed") || t.contains(" failed") || t.contains(" error"))
            && t.contains(" in ")
    })?;
    let c = counts(summary);
    let passed = count_of(&c, &["passed", "xpassed"]);
    let failed = count_of(&c, &["failed", "error", "errors"]);
    let skipped = count_of(&c, &["skipped", "xfailed"]);
    let failures = lines
        .iter()
        .filter_map(|l| {
            let rest = l
                .strip_prefix("FAILED ")
                .or_else(|| l.strip_prefix("ERROR "))?;
            let (name, message) = rest.split_once(" - ").unwrap_or((rest, ""));
            let file = name.split("::").next().map(clip);
            Some(Failure {
                name: clip(name),
                file,
                message: clip(message),
            })
        })
        .take(MAX_FAILURES)
        .collect();
    Some(TestResults {
        framework: "pytest".into(),
        passed: Some(passed),
        failed,
        skipped,
        total: Some(sum3(passed, failed, skipped)),
        failures,
    })
}

fn cargo_test(lines: &[&str]) -> Option<TestResults> {
    let mut seen = false;
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for l in lines {
        if let Some(rest) = l.strip_prefix("test result: ") {
            seen = true;
            let c = counts(&rest.replace(';', " "));
            passed = count_of(&c, &["passed"]).saturating_add(passed);
            failed = count_of(&c, &["failed"]).saturating_add(failed);
            skipped = count_of(&c, &["ignored"]).saturating_add(skipped);
        }
    }
    if !seen {
        return None;
    }
    let mut failures = Vec::new();
    for l in lines {
        let Some(name) = l
            .strip_prefix("test ")
            .and_then(|r| r.strip_suffix(" ... FAILED"))
        else {
            continue;
        };
        // Its panic: `---- NAME stdout ----`, then `thread '…' panicked at FILE:L:C:`
        // and the message up to the backtrace or a note.
        let header = format!("---- {name} stdout ----");
        let mut file = None;
        let mut message = Vec::new();
        if let Some(start) = lines.iter().position(|x| *x == header) {
            let mut in_panic = false;
            for x in &lines[start + 1..] {
                if x.starts_with("---- ") || *x == "failures:" {
                    break;
                }
                if let Some(at) = x.split(" panicked at ").nth(1) {
                    file = at.split(':').next().map(clip);
                    in_panic = true;
                    continue;
                }
                if in_panic {
                    if x.is_empty() || x.starts_with("stack backtrace:") || x.starts_with("note:") {
                        break;
                    }
                    message.push(x.trim());
                }
            }
        }
        failures.push(Failure {
            name: clip(name),
            file,
            message: clip(&message.join(" ")),
        });
        if failures.len() == MAX_FAILURES {
            break;
        }
    }
    Some(TestResults {
        framework: "cargo test".into(),
        passed: Some(passed),
        failed,
        skipped,
        total: Some(sum3(passed, failed, skipped)),
        failures,
    })
}

fn go_test(lines: &[&str]) -> Option<TestResults> {
    let verbose = lines.iter().any(|l| l.starts_with("=== RUN"));
    let mut seen = false;
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    let mut current: Option<String> = None;
    let mut messages: std::collections::HashMap<String, Vec<String>> = Default::default();
    let mut failed_names: Vec<String> = Vec::new();
    for l in lines {
        let t = l.trim_start();
        if let Some(name) = t.strip_prefix("=== RUN") {
            current = Some(name.trim().to_string());
        } else if let Some(r) = t.strip_prefix("--- ") {
            let (verdict, rest) = r.split_once(": ").unwrap_or((r, ""));
            let name = rest.split(" (").next().unwrap_or("").trim().to_string();
            match verdict {
                "PASS" => passed += 1,
                "FAIL" => {
                    failed += 1;
                    if failed_names.len() < MAX_FAILURES {
                        failed_names.push(clip(&name));
                    }
                }
                "SKIP" => skipped += 1,
                _ => continue,
            }
            seen = true;
            current = Some(name);
        } else if l.starts_with("ok  \t") || l.starts_with("FAIL\t") {
            seen = true;
        } else if let (Some(cur), true) = (&current, l.starts_with("    ")) {
            // `    file_test.go:13: message` under its test.
            messages.entry(cur.clone()).or_default().push(t.to_string());
        }
    }
    if !seen {
        return None;
    }
    let failures = failed_names
        .into_iter()
        .take(MAX_FAILURES)
        .map(|name| {
            let msgs = messages.remove(&name).unwrap_or_default();
            let file = msgs
                .first()
                .and_then(|m| m.split(':').next())
                .filter(|f| f.ends_with(".go"))
                .map(clip);
            Failure {
                name,
                file,
                message: clip(&msgs.join(" ")),
            }
        })
        .collect();
    Some(TestResults {
        framework: "go test".into(),
        passed: verbose.then_some(passed),
        failed,
        skipped,
        total: verbose.then_some(sum3(passed, failed, skipped)),
        failures,
    })
}

fn jest(lines: &[&str]) -> Option<TestResults> {
    let summary = lines
        .iter()
        .rev()
        .find(|l| l.starts_with("Tests:") && l.contains(" total"))?;
    let c = counts(summary);
    let passed = count_of(&c, &["passed"]);
    let failed = count_of(&c, &["failed"]);
    let skipped = count_of(&c, &["skipped", "todo"]);
    let total = count_of(&c, &["total"]);
    let mut failures = Vec::new();
    let mut file: Option<String> = None;
    for (i, l) in lines.iter().enumerate() {
        if let Some(f) = l.strip_prefix("FAIL ") {
            file = Some(f.trim().trim_start_matches("./").to_string());
        }
        let Some(name) = l.trim_start().strip_prefix("● ") else {
            continue;
        };
        let rest = &lines[i + 1..];
        let message = rest
            .iter()
            .map(|x| x.trim())
            .find(|x| !x.is_empty())
            .unwrap_or("");
        let at = rest
            .iter()
            .take_while(|x| !x.trim_start().starts_with("● "))
            .find(|x| x.trim_start().starts_with("at "))
            .and_then(|x| file_in(x));
        failures.push(Failure {
            name: clip(name),
            file: at.or_else(|| file.clone()).map(|f| clip(&f)),
            message: clip(message),
        });
        if failures.len() == MAX_FAILURES {
            break;
        }
    }
    Some(TestResults {
        framework: "jest".into(),
        passed: Some(passed),
        failed,
        skipped,
        total: Some(total.max(sum3(passed, failed, skipped))),
        failures,
    })
}

fn vitest(lines: &[&str]) -> Option<TestResults> {
    let summary = lines.iter().rev().find(|l| {
        let t = l.trim_start();
        t.starts_with("Tests ") && t.trim_end().ends_with(')')
    })?;
    let c = counts(summary);
    let passed = count_of(&c, &["passed"]);
    let failed = count_of(&c, &["failed"]);
    let skipped = count_of(&c, &["skipped", "todo"]);
    let failures = lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let rest = l.trim_start().strip_prefix("FAIL ")?.trim();
            let (file, name) = rest.split_once(" > ")?;
            let message = lines[i + 1..]
                .iter()
                .map(|x| x.trim())
                .find(|x| !x.is_empty())
                .unwrap_or("");
            Some(Failure {
                name: clip(name),
                file: Some(clip(file)),
                message: clip(message),
            })
        })
        .take(MAX_FAILURES)
        .collect();
    Some(TestResults {
        framework: "vitest".into(),
        passed: Some(passed),
        failed,
        skipped,
        total: Some(sum3(passed, failed, skipped)),
        failures,
    })
}

fn mocha(lines: &[&str]) -> Option<TestResults> {
    // `  3 passing (5ms)`, `  1 failing`, `  2 pending`: the whole line.
    let number = |suffix: &str| {
        lines.iter().find_map(|l| {
            let t = l.trim();
            let (n, rest) = t.split_once(' ')?;
            let rest = rest.strip_prefix(suffix)?;
            let whole = rest.is_empty() || (rest.starts_with(" (") && rest.ends_with(')'));
            (whole && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .then(|| n.parse::<u64>().ok())
                .flatten()
        })
    };
    let passed = number("passing")?;
    let failed = number("failing").unwrap_or(0);
    let skipped = number("pending").unwrap_or(0);
    let mut failures = Vec::new();
    if let Some(start) = lines
        .iter()
        .position(|l| l.trim().ends_with(" failing") && l.trim().split(' ').count() == 2)
    {
        let rest = &lines[start + 1..];
        let mut i = 0;
        while i < rest.len() && failures.len() < MAX_FAILURES {
            let t = rest[i].trim();
            let numbered = t
                .split_once(") ")
                .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
            let Some((_, first)) = numbered else {
                i += 1;
                continue;
            };
            // The title runs over lines until one ends with `:`.
            let mut title = vec![first.trim_end_matches(':')];
            let mut j = i;
            while !rest[j].trim().ends_with(':') && j + 1 < rest.len() && title.len() < 8 {
                j += 1;
                title.push(rest[j].trim().trim_end_matches(':'));
            }
            let body = &rest[j + 1..];
            let message = body
                .iter()
                .map(|x| x.trim())
                .find(|x| !x.is_empty())
                .unwrap_or("");
            let file = body
                .iter()
                .take_while(|x| {
                    !x.trim().split_once(") ").is_some_and(|(n, _)| {
                        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                    })
                })
                .find(|x| x.trim_start().starts_with("at "))
                .and_then(|x| file_in(x));
            failures.push(Failure {
                name: clip(&title.join(" ")),
                file: file.map(|f| clip(&f)),
                message: clip(message),
            });
            i = j + 1;
        }
    }
    Some(TestResults {
        framework: "mocha".into(),
        passed: Some(passed),
        failed,
        skipped,
        total: Some(sum3(passed, failed, skipped)),
        failures,
    })
}

/// Whether a line reads as an error.
/// PHPUnit (9 and later): after its banner, the summary `OK (2 tests, 2 assertions)` or
/// `Tests: 5, Assertions: 4, Failures: 1, Skipped: 1.`, and the entries of its
/// `There was 1 failure:` / `There were 2 errors:` sections (`1) Class::method`, the
/// message, then `file:line`).
fn phpunit(lines: &[&str]) -> Option<TestResults> {
    let banner = lines
        .iter()
        .position(|l| l.starts_with("PHPUnit ") && l.contains(" by Sebastian Bergmann"))?;
    let rest = &lines[banner..];
    let summary = rest.iter().rev().map(|l| l.trim()).find(|t| {
        (t.starts_with("OK (") && t.ends_with(')') && t.contains(" test"))
            || (t.starts_with("Tests: ") && t.contains("Assertions: "))
    })?;
    let (total, failed, skipped) = if let Some(inner) = summary.strip_prefix("OK (") {
        let c = counts(inner);
        (count_of(&c, &["test", "tests"]), 0, 0)
    } else {
        let field = |name: &str| fields(summary, name);
        (
            field("Tests"),
            field("Failures").saturating_add(field("Errors")),
            field("Skipped").saturating_add(field("Incomplete")),
        )
    };
    let mut failures = Vec::new();
    let mut in_section = false;
    let mut i = 0;
    while i < rest.len() && failures.len() < MAX_FAILURES {
        let t = rest[i].trim();
        if t.starts_with("There was 1 ") || t.starts_with("There were ") {
            in_section = t.ends_with(" failure:")
                || t.ends_with(" failures:")
                || t.ends_with(" error:")
                || t.ends_with(" errors:");
        } else if t == "FAILURES!" || t == "ERRORS!" || t.starts_with("Tests: ") {
            in_section = false;
        } else if in_section {
            let entry = t.split_once(") ").filter(|(n, name)| {
                !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty()
            });
            if let Some((_, name)) = entry {
                // The message: the lines up to the first blank one; then the location.
                let mut message = Vec::new();
                let mut j = i + 1;
                while j < rest.len() && !rest[j].trim().is_empty() {
                    message.push(rest[j].trim());
                    j += 1;
                }
                let file = rest[j..]
                    .iter()
                    .map(|l| l.trim())
                    .find(|l| !l.is_empty())
                    .and_then(|l| {
                        let (path, line) = l.rsplit_once(':')?;
                        (line.bytes().all(|b| b.is_ascii_digit()) && !line.is_empty())
                            .then(|| path.to_string())
                    })
                    .map(|p| clip(&p));
                failures.push(Failure {
                    name: clip(name),
                    file,
                    message: clip(message.first().copied().unwrap_or("")),
                });
                i = j;
                continue;
            }
        }
        i += 1;
    }
    let passed = total.saturating_sub(failed).saturating_sub(skipped);
    Some(TestResults {
        framework: "phpunit".into(),
        passed: Some(passed),
        failed,
        skipped,
        total: Some(total),
        failures,
    })
}

/// `Key: N` fields of a summary line (`Tests run: 5, Failures: 1, …`), summed per key.
fn fields(line: &str, name: &str) -> u64 {
    line.trim()
        .trim_end_matches('.')
        .split(", ")
        .filter_map(|kv| kv.split_once(": "))
        .filter(|(k, _)| k.trim() == name)
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .fold(0u64, u64::saturating_add)
}

/// A Maven line without its level (`[INFO] `, `[ERROR] `, `[WARNING] `).
fn maven_text(line: &str) -> &str {
    for level in ["[INFO] ", "[ERROR] ", "[WARNING] "] {
        if let Some(rest) = line.strip_prefix(level) {
            return rest;
        }
    }
    line.strip_prefix("[INFO]")
        .or_else(|| line.strip_prefix("[ERROR]"))
        .unwrap_or(line)
}

/// JUnit as Maven's surefire reports it: each module's `Results:` block, with its
/// `Failures:` and `Errors:` entries (`Class.method:line message`) and its total
/// `Tests run: N, Failures: F, Errors: E, Skipped: S` (summed over the modules).
fn junit_maven(lines: &[&str]) -> Option<TestResults> {
    let (mut run, mut failed, mut skipped) = (0u64, 0u64, 0u64);
    let mut found = false;
    let mut in_results = false;
    let mut in_list = false;
    let mut failures = Vec::new();
    for l in lines {
        let t = maven_text(l);
        if t.trim() == "Results:" {
            in_results = true;
            in_list = false;
            continue;
        }
        if !in_results {
            continue;
        }
        if t.starts_with("Tests run: ") && !t.contains("Time elapsed") {
            run = run.saturating_add(fields(t, "Tests run"));
            failed = failed
                .saturating_add(fields(t, "Failures"))
                .saturating_add(fields(t, "Errors"));
            skipped = skipped.saturating_add(fields(t, "Skipped"));
            found = true;
            in_results = false;
        } else if matches!(t.trim(), "Failures:" | "Errors:") {
            in_list = true;
        } else if t.trim().ends_with(':') && !t.starts_with("  ") {
            // Another list (`Flakes:`, `Tests in error:`): not failures of this run.
            in_list = false;
        } else if in_list
            && t.starts_with("  ")
            && !t.trim().is_empty()
            && failures.len() < MAX_FAILURES
        {
            let entry = t.trim();
            let (at, message) = entry.split_once(' ').unwrap_or((entry, ""));
            let name = at.rsplit_once(':').map_or(at, |(n, line)| {
                if line.bytes().all(|b| b.is_ascii_digit()) {
                    n
                } else {
                    at
                }
            });
            failures.push(Failure {
                name: clip(name),
                file: None,
                message: clip(message),
            });
        }
    }
    if !found {
        return None;
    }
    Some(TestResults {
        framework: "junit".into(),
        passed: Some(run.saturating_sub(failed).saturating_sub(skipped)),
        failed,
        skipped,
        total: Some(run),
        failures,
    })
}

/// What a Gradle task line says of a test task (`:test`, `:module:test`, `> Task
/// :test`, often with what the test worker wrote to stderr glued to it): `None` for a
/// line that is no test task's (another task, `:test-utils:compileJava`,
/// `:testClasses`, or a test task that did not run: `UP-TO-DATE`, `NO-SOURCE`, …);
/// `Some(false)` for its header, `Some(true)` for its `FAILED` end.
fn gradle_test_task(line: &str) -> Option<bool> {
    let t = line.strip_prefix("> Task ").unwrap_or(line);
    if !t.starts_with(':') {
        return None;
    }
    let path_len = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '.')))
        .unwrap_or(t.len());
    let (path, after) = t.split_at(path_len);
    let name = path.rsplit(':').find(|s| !s.is_empty())?;
    let rest = name.strip_prefix("test")?;
    // `test`, or `test` with glued output (`:testWARNING: …`); a test task of its own
    // name (`:testIntegration`) counts as one; the java plugin's other `test…` tasks
    // and lower-case continuations (`:tests`, `:testing`) do not.
    let is_test = rest.is_empty()
        || (rest.starts_with(|c: char| c.is_ascii_uppercase())
            && !["Classes", "Compile", "Jar", "Results", "Fixtures"]
                .iter()
                .any(|other| rest.starts_with(other)));
    if !is_test || (path.ends_with(':') && rest.is_empty()) {
        return None;
    }
    match after.split_whitespace().next() {
        Some("UP-TO-DATE" | "NO-SOURCE" | "SKIPPED" | "FROM-CACHE") => None,
        Some("FAILED") => Some(true),
        _ => Some(false),
    }
}

/// JUnit as Gradle's console prints it: `Class > method FAILED` with the exception
/// and its place on the next, indented line, and `N tests completed, F failed[, S
/// skipped]` per test task (summed over a build's projects). A test task that
/// passes prints no counts: then only that none failed is known (`passed` and
/// `total` are `None`), and only when the build says `BUILD SUCCESSFUL`.
fn junit_gradle(lines: &[&str]) -> Option<TestResults> {
    let (mut run, mut failed, mut skipped) = (0u64, 0u64, 0u64);
    let (mut counts_seen, mut tasks, mut success) = (0usize, 0usize, false);
    let mut failures = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_end();
        if let Some(end) = gradle_test_task(t) {
            if !end {
                tasks += 1;
            }
        } else if t.starts_with("BUILD SUCCESSFUL") {
            success = true;
        } else if let Some(n) = t
            .split_once(" tests completed, ")
            .or_else(|| t.split_once(" test completed, "))
            .and_then(|(n, _)| n.parse::<u64>().ok())
        {
            let c = counts(t);
            run = run.saturating_add(n);
            failed = failed.saturating_add(count_of(&c, &["failed"]));
            skipped = skipped.saturating_add(count_of(&c, &["skipped"]));
            counts_seen += 1;
        } else if let Some(test) = t
            .strip_suffix(" FAILED")
            .filter(|_| !t.starts_with([' ', ':', '>']))
        {
            let Some((class, method)) = test.split_once(" > ") else {
                continue;
            };
            if failures.len() >= MAX_FAILURES || class.contains(' ') {
                continue;
            }
            let detail = lines
                .get(i + 1)
                .filter(|n| n.starts_with("    "))
                .map_or("", |n| n.trim());
            let (message, file) = match detail.rsplit_once(" at ") {
                Some((m, at)) => (m, at.rsplit_once(':').map(|(f, _)| f.to_string())),
                None => (detail, None),
            };
            failures.push(Failure {
                name: clip(&format!("{class}.{method}")),
                file: file.map(|f| clip(&f)),
                message: clip(message),
            });
        }
    }
    if counts_seen > 0 {
        // A test task that passed printed no counts: then the totals are not known.
        let all_counted = counts_seen >= tasks;
        return Some(TestResults {
            framework: "junit".into(),
            passed: all_counted.then(|| run.saturating_sub(failed).saturating_sub(skipped)),
            failed,
            skipped,
            total: all_counted.then_some(run),
            failures,
        });
    }
    (tasks > 0 && success && failures.is_empty()).then(|| TestResults {
        framework: "junit".into(),
        passed: None,
        failed: 0,
        skipped: 0,
        total: None,
        failures,
    })
}

fn is_error(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    let t = l.trim_start();
    [
        "error",
        "exception",
        "traceback",
        "panicked",
        "fatal",
        "failed",
        "failure",
    ]
    .iter()
    .any(|w| {
        l.match_indices(w).any(|(i, _)| {
            let before = l[..i].chars().next_back();
            let after = l[i + w.len()..].chars().next();
            !before.is_some_and(|c| c.is_ascii_alphanumeric())
                && !after.is_some_and(|c| c.is_ascii_alphanumeric() && c != 's')
        })
    }) || t.starts_with("e   ")
        || t.starts_with("fail ")
        || t.starts_with("--- fail")
        || t.starts_with("● ")
}

/// Consecutive equal lines as one, `line [×N]`.
fn collapse(lines: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let mut n = 1;
        while i + n < lines.len() && lines[i + n] == lines[i] {
            n += 1;
        }
        if n > 1 {
            out.push(format!("{} [×{n}]", lines[i]));
        } else {
            out.push(lines[i].to_string());
        }
        i += n;
    }
    out
}

/// The error lines with 2 lines before and 6 after, overlapping blocks merged and
/// repeated lines collapsed; blocks separated by `…`.
pub fn error_blocks(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if !is_error(l) {
            continue;
        }
        let (a, b) = (i.saturating_sub(2), (i + 7).min(lines.len()));
        match ranges.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => ranges.push((a, b)),
        }
    }
    ranges
        .iter()
        .map(|&(a, b)| collapse(&lines[a..b]).join("\n"))
        .collect::<Vec<_>>()
        .join("\n…\n")
}

fn chars_tail(s: &str, n: usize) -> String {
    let count = s.chars().count();
    s.chars().skip(count.saturating_sub(n)).collect()
}

fn chars_head(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// One line per framework and one per failure.
pub fn results_text(results: &[TestResults]) -> String {
    let mut out = String::new();
    for r in results {
        let n = |v: Option<u64>| v.map_or("?".to_string(), |v| v.to_string());
        out.push_str(&format!(
            "[wbx] tests ({}): {} passed, {} failed, {} total{}\n",
            r.framework,
            n(r.passed),
            r.failed,
            n(r.total),
            if r.passed.is_none() {
                " (run it with -v for counts)"
            } else {
                ""
            }
        ));
        for f in &r.failures {
            out.push_str(&format!("  FAILED {}", f.name));
            if !f.message.is_empty() {
                out.push_str(&format!(" – {}", f.message));
            }
            out.push('\n');
        }
    }
    out
}

/// `mode=summary`: test results, errors, then the log's end, within `max_chars`;
/// `mode=errors`: the error blocks only.
pub fn digest(log: &str, errors_only: bool, max_chars: usize) -> (String, Vec<TestResults>) {
    let text = plain(log);
    let results = test_results(&text);
    let errors = error_blocks(&text);
    if errors_only {
        let body = if errors.is_empty() {
            "[wbx] no error lines found".to_string()
        } else {
            errors
        };
        return (chars_head(&body, max_chars), results);
    }
    let tests = results_text(&results);
    let tests = chars_head(&tests, max_chars / 2);
    let mut out = tests.clone();
    let left = max_chars.saturating_sub(out.chars().count());
    if !errors.is_empty() {
        let head = "[wbx] errors:\n";
        let room = (left / 2).saturating_sub(head.len() + 1);
        out.push_str(head);
        out.push_str(&chars_head(&errors, room));
        out.push('\n');
    }
    let head = "[wbx] end of log:\n";
    let left = max_chars.saturating_sub(out.chars().count() + head.len());
    out.push_str(head);
    out.push_str(&chars_tail(&text, left));
    (out, results)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/tests/fixtures/logs/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    fn one(name: &str) -> TestResults {
        let r = test_results(&fixture(name));
        assert_eq!(r.len(), 1, "{name}: {r:?}");
        r.into_iter().next().unwrap()
    }

    #[test]
    fn test_pytest() {
        let r = one("pytest-fail.txt");
        assert_eq!(
            (r.framework.as_str(), r.passed, r.failed, r.total),
            ("pytest", Some(4), 1, Some(5))
        );
        assert_eq!(
            r.failures,
            [Failure {
                name: "tests/test_api.py::test_refund".into(),
                file: Some("tests/test_api.py".into()),
                message: "assert 400 == 200".into(),
            }]
        );
        let r = one("pytest-pass.txt");
        assert_eq!((r.passed, r.failed, r.total), (Some(2), 0, Some(2)));
        assert!(r.failures.is_empty());
    }

    #[test]
    fn test_cargo_test() {
        let r = one("cargo-fail.txt");
        assert_eq!(
            (r.framework.as_str(), r.passed, r.failed, r.total),
            ("cargo test", Some(2), 1, Some(3))
        );
        assert_eq!(r.failures.len(), 1);
        let f = &r.failures[0];
        assert_eq!(f.name, "tests::refund_large");
        assert_eq!(f.file.as_deref(), Some("src/lib.rs"));
        assert_eq!(
            f.message,
            "assertion `left == right` failed: a large refund is accepted left: 400 right: 200"
        );
        let r = one("cargo-pass.txt");
        // `2 filtered out` are not tests that ran, nor skipped ones.
        assert_eq!((r.passed, r.failed, r.skipped), (Some(1), 0, 0));
    }

    #[test]
    fn test_go_test() {
        for name in ["go-fail.txt", "go-fail-v.txt"] {
            let r = one(name);
            assert_eq!(r.framework, "go test");
            assert_eq!(r.failed, 1, "{name}");
            assert_eq!(
                r.failures,
                [Failure {
                    name: "TestRefund".into(),
                    file: Some("api_test.go".into()),
                    message: "api_test.go:13: Refund(500) = 400, want 200".into(),
                }],
                "{name}"
            );
        }
        let v = one("go-fail-v.txt");
        assert_eq!((v.passed, v.total), (Some(2), Some(3)));
        // Without -v, go test names only what failed.
        let q = one("go-fail.txt");
        assert_eq!((q.passed, q.total), (None, None));
        let p = one("go-pass-v.txt");
        assert_eq!((p.passed, p.failed), (Some(2), 0));
    }

    #[test]
    fn test_jest() {
        let r = one("jest-fail.txt");
        assert_eq!(
            (r.framework.as_str(), r.passed, r.failed, r.total),
            ("jest", Some(3), 1, Some(4))
        );
        assert_eq!(
            r.failures,
            [Failure {
                name: "refunds › a large refund".into(),
                file: Some("api.test.js".into()),
                message: "expect(received).toBe(expected) // Object.is equality".into(),
            }]
        );
        let r = one("jest-pass.txt");
        assert_eq!((r.passed, r.failed, r.total), (Some(1), 0, Some(1)));
    }

    #[test]
    fn test_vitest() {
        let r = one("vitest-fail.txt");
        assert_eq!(
            (r.framework.as_str(), r.passed, r.failed, r.total),
            ("vitest", Some(3), 1, Some(4))
        );
        assert_eq!(
            r.failures,
            [Failure {
                name: "refunds > a large refund".into(),
                file: Some("api.test.js".into()),
                message: "AssertionError: expected 400 to be 200 // Object.is equality".into(),
            }]
        );
        let r = one("vitest-pass.txt");
        assert_eq!((r.passed, r.failed), (Some(1), 0));
    }

    #[test]
    fn test_mocha() {
        let r = one("mocha-fail.txt");
        assert_eq!(
            (r.framework.as_str(), r.passed, r.failed, r.total),
            ("mocha", Some(3), 1, Some(4))
        );
        assert_eq!(
            r.failures,
            [Failure {
                name: "refunds a large refund".into(),
                file: Some("api.spec.js".into()),
                message: "AssertionError [ERR_ASSERTION]: Expected values to be strictly equal:"
                    .into(),
            }]
        );
        let r = one("mocha-pass.txt");
        assert_eq!((r.passed, r.failed), (Some(1), 0));
    }

    #[test]
    fn test_phpunit() {
        let r = one("phpunit-fail.txt");
        assert_eq!(
            (r.framework.as_str(), r.passed, r.failed, r.skipped, r.total),
            ("phpunit", Some(3), 1, 1, Some(5))
        );
        assert_eq!(
            r.failures,
            [Failure {
                name: "ApiTest::testLargeRefund".into(),
                file: Some("/tmp/phpproj/tests/ApiTest.php".into()),
                message: "Failed asserting that 400 is identical to 200.".into(),
            }]
        );
        let r = one("phpunit-pass.txt");
        assert_eq!(
            (r.passed, r.failed, r.skipped, r.total),
            (Some(2), 0, 0, Some(2))
        );
        assert!(r.failures.is_empty());
        let r = one("phpunit-skip.txt");
        assert_eq!(
            (r.passed, r.failed, r.skipped, r.total),
            (Some(1), 0, 1, Some(2))
        );
        let r = one("phpunit-error.txt");
        assert_eq!((r.passed, r.failed, r.total), (Some(1), 1, Some(2)));
        assert_eq!(r.failures[0].name, "ErrTest::testLookup");
        assert_eq!(
            r.failures[0].message,
            "Error: Call to undefined function lookup()"
        );
        assert_eq!(
            r.failures[0].file.as_deref(),
            Some("/tmp/phpproj/errs/ErrTest.php")
        );
        // The digest leads with them.
        let (text, _) = digest(&fixture("phpunit-fail.txt"), false, 2000);
        assert!(
            text.starts_with("[wbx] tests (phpunit): 3 passed, 1 failed, 5 total\n  FAILED ApiTest::testLargeRefund – Failed asserting that 400 is identical to 200.\n"),
            "{text}"
        );
    }

    #[test]
    fn test_junit_through_maven() {
        let r = one("junit-maven-fail.txt");
        assert_eq!(
            (r.framework.as_str(), r.passed, r.failed, r.skipped, r.total),
            ("junit", Some(3), 1, 1, Some(5))
        );
        assert_eq!(
            r.failures,
            [Failure {
                name: "RefundsTest.largeRefund".into(),
                file: None,
                message: "expected:<200> but was:<400>".into(),
            }]
        );
        let r = one("junit-maven-pass.txt");
        assert_eq!(
            (r.passed, r.failed, r.skipped, r.total),
            (Some(1), 0, 0, Some(1))
        );
        assert!(r.failures.is_empty());
        let r = one("junit-maven-error.txt");
        assert_eq!((r.passed, r.failed, r.total), (Some(1), 1, Some(2)));
        assert_eq!(r.failures[0].name, "ErrTest.lookup");
        assert!(
            r.failures[0]
                .message
                .starts_with("NullPointer Cannot invoke"),
            "{:?}",
            r.failures[0]
        );
    }

    #[test]
    fn test_junit_through_gradle() {
        let r = one("junit-gradle-fail.txt");
        assert_eq!(
            (r.framework.as_str(), r.passed, r.failed, r.skipped, r.total),
            ("junit", Some(3), 1, 1, Some(5))
        );
        assert_eq!(
            r.failures,
            [Failure {
                name: "shop.RefundsTest.largeRefund".into(),
                file: Some("RefundsTest.java".into()),
                message: "java.lang.AssertionError".into(),
            }]
        );
        let r = one("junit-gradle-error.txt");
        assert_eq!(
            (r.passed, r.failed, r.skipped, r.total),
            (Some(1), 1, 0, Some(2))
        );
        assert_eq!(
            (r.failures[0].name.as_str(), r.failures[0].message.as_str()),
            ("shop.ErrTest.lookup", "java.lang.NullPointerException")
        );
        // A passing test task prints no counts: that none failed is all it says.
        let r = one("junit-gradle-pass.txt");
        assert_eq!((r.passed, r.failed, r.skipped, r.total), (None, 0, 0, None));
        assert!(r.failures.is_empty());
    }

    #[test]
    fn test_a_gradle_failure_s_file_is_clipped_like_every_other_field() {
        // Found by a 30-minute fuzz run of job_log: the file after " at " was kept whole.
        let long = "F".repeat(5000);
        let log = format!(
            ":test\n\nApiTest > refunds FAILED\n    java.lang.AssertionError at {long}.java:42\n\n1 test completed, 1 failed\n:test FAILED\n"
        );
        let r = test_results(&log);
        let f = &r[0].failures[0];
        assert_eq!(f.name, "ApiTest.refunds");
        let file = f.file.as_deref().unwrap();
        assert!(
            file.chars().count() <= MAX_MESSAGE_CHARS + 1,
            "{}",
            file.len()
        );
        assert!(file.starts_with("FFF"), "{file}");
    }

    #[test]
    fn test_gradle_s_test_task_is_told_from_other_tasks_and_skipped_runs() {
        for (line, seen) in [
            (":test", Some(false)),
            (":test FAILED", Some(true)),
            (":testWARNING: A terminally deprecated method", Some(false)),
            ("> Task :api:test", Some(false)),
            (":api:test", Some(false)),
            (":tests:test", Some(false)),
            ("> Task :testing:test", Some(false)),
            (":testIntegration", Some(false)),
            (":testIntegration UP-TO-DATE", None),
            (":testClasses", None),
            (":testClasses UP-TO-DATE", None),
            (":test UP-TO-DATE", None),
            (":test NO-SOURCE", None),
            (":test FROM-CACHE", None),
            (":compileTestJava", None),
            (":test-utils:compileJava", None),
            (":test:compileJava", None),
            (":test-fixtures:jar", None),
            (":tests", None),
            ("the :test task", None),
            ("a b:test", None),
            (":", None),
            (":test:", None),
            ("> Task :", None),
        ] {
            assert_eq!(gradle_test_task(line), seen, "{line:?}");
        }
        // A build that succeeds without running its tests says nothing about them.
        let log = ":compileJava\n:test UP-TO-DATE\n\nBUILD SUCCESSFUL in 1s\n";
        assert!(test_results(log).is_empty());
        let log = ":test-utils:compileJava\n:test-utils:jar\n\nBUILD SUCCESSFUL in 1s\n";
        assert!(test_results(log).is_empty());
        // Nor does one whose test task failed before any test (no counts).
        let log = ":test\n:test FAILED\nFAILURE: Build failed with an exception.\n";
        assert!(test_results(log).is_empty());
        // Two projects, one failing, one passing (which prints no counts): the failures
        // and counts are the failing one's, and the totals are not known.
        let fail = fixture("junit-gradle-fail.txt");
        let log = format!(":core:test\n{}", fail.replace(":test", ":api:test"));
        let r = test_results(&log);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!(
            (r[0].passed, r[0].failed, r[0].skipped, r[0].total),
            (None, 1, 1, None)
        );
    }

    #[test]
    fn test_a_log_without_tests_has_none_and_text_alone_is_not_taken_for_one() {
        assert!(test_results("hello\nworld\n").is_empty());
        assert!(test_results("the test result was fine\n2 passing cars\n").is_empty());
    }

    #[test]
    fn test_digest_collapses_repeats_and_keeps_the_budget() {
        let mut log = String::from("starting\n");
        for _ in 0..200 {
            log.push_str("WARNING: retrying connection\n");
        }
        log.push_str(
            "Traceback (most recent call last):\n  File \"a.py\", line 3\nValueError: bad\n",
        );
        log.push_str(&fixture("pytest-fail.txt"));
        let (text, results) = digest(&log, false, 2000);
        assert!(text.chars().count() <= 2000, "{}", text.chars().count());
        assert!(
            text.starts_with("[wbx] tests (pytest): 4 passed, 1 failed, 5 total\n  FAILED tests/test_api.py::test_refund – assert 400 == 200\n"),
            "{text}"
        );
        assert!(text.contains("[wbx] errors:\n"), "{text}");
        assert!(text.contains("ValueError: bad"), "{text}");
        assert!(text.contains("[wbx] end of log:\n"), "{text}");
        assert!(
            text.ends_with("1 failed, 4 passed in 0.02s ==========================\n"),
            "{text}"
        );
        assert_eq!(results.len(), 1);
        let (errors, _) = digest(&log, true, 100_000);
        assert!(
            errors.contains("WARNING: retrying connection [×"),
            "{errors}"
        );
        assert!(!errors.contains("[wbx] end of log"), "{errors}");
        let (colour, _) = digest(&fixture("vitest-fail.txt"), false, 6000);
        assert!(!colour.contains('\u{1b}'), "{colour}");
    }
}
