//! Figures for `GET /metrics` that nothing else keeps: runs by runtime and outcome, run
//! and start latency histograms, HTTP requests by route and status, bytes in and out,
//! egress check failures, long-lived sandboxes live. All of it is updated on the reactor
//! thread (plain integers, no atomics), and rendered there in the Prometheus text
//! exposition format (version 0.0.4) by [`Text`].
//!
//! Every label value comes from a bounded set: runtime names from the loaded runtimes,
//! outcomes from [`RunOutcome`], routes from the faces' tables (their patterns, not the
//! request paths), methods from the table (or `other`), statuses from the three-digit
//! codes the daemon writes. A client cannot mint a new series.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

/// How a run ended, as `/metrics` counts it (first match wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RunOutcome {
    /// The client went away (or the daemon stopped) before the result.
    Cancelled,
    /// Killed by the wall-time cap.
    Timeout,
    /// Killed by the memory cap.
    Oom,
    /// Output cut at the output cap.
    Truncated,
    /// Exited non-zero (or its build failed).
    Error,
    /// Exited 0 with all its output.
    Ok,
    /// isobox failed it (the sandbox did not start).
    Failed,
}

impl RunOutcome {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            RunOutcome::Cancelled => "cancelled",
            RunOutcome::Timeout => "timeout",
            RunOutcome::Oom => "oom",
            RunOutcome::Truncated => "truncated",
            RunOutcome::Error => "error",
            RunOutcome::Ok => "ok",
            RunOutcome::Failed => "failed",
        }
    }

    /// The outcome of a run that produced a result.
    pub fn of(cancelled: bool, timed_out: bool, oom: bool, truncated: bool, exit: i32) -> Self {
        if cancelled {
            RunOutcome::Cancelled
        } else if timed_out {
            RunOutcome::Timeout
        } else if oom {
            RunOutcome::Oom
        } else if truncated {
            RunOutcome::Truncated
        } else if exit != 0 {
            RunOutcome::Error
        } else {
            RunOutcome::Ok
        }
    }
}

/// Upper bounds (seconds) of the latency histograms' buckets.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A cumulative histogram over [`LATENCY_BUCKETS`].
#[derive(Debug, Clone)]
pub struct Histogram {
    /// Observations at or below each bound (not cumulative; summed when rendered).
    counts: Vec<u64>,
    /// Observations above the last bound.
    over: u64,
    sum: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; LATENCY_BUCKETS.len()],
            over: 0,
            sum: 0.0,
        }
    }
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        self.sum += s;
        match LATENCY_BUCKETS.iter().position(|&b| s <= b) {
            Some(i) => self.counts[i] += 1,
            None => self.over += 1,
        }
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum::<u64>() + self.over
    }
}

/// The figures only `/metrics` reads.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Runs (and session and kernel steps) by (runtime, outcome).
    pub runs: BTreeMap<(String, RunOutcome), u64>,
    /// From a run's admission to its result, by runtime.
    pub run_seconds: BTreeMap<String, Histogram>,
    /// From a run's admission to its program's start (after the build, for compiled
    /// runtimes), by runtime.
    pub start_seconds: BTreeMap<String, Histogram>,
    /// Responses by (face, method, route pattern, status).
    pub http: BTreeMap<(&'static str, &'static str, &'static str, u16), u64>,
    /// Bytes read from clients' connections.
    pub bytes_in: u64,
    /// Bytes written to them.
    pub bytes_out: u64,
    /// Egress checks done (read back, and re-programmed when asked or found wrong).
    pub egress_checks: u64,
    /// Of which ended unverified (the table not as programmed, or forwarding off).
    pub egress_check_failures: u64,
    /// Long-lived sandboxes owned by a tenant, and booted in the WBX pool.
    pub sandboxes: (usize, usize),
    /// Run records kept (streamed and detached runs), and the bytes they count.
    pub records: (usize, usize),
}

impl Metrics {
    /// Counts a finished run of `runtime`.
    pub fn run(
        &mut self,
        runtime: &str,
        outcome: RunOutcome,
        total: Duration,
        start: Option<Duration>,
    ) {
        *self.runs.entry((runtime.to_string(), outcome)).or_insert(0) += 1;
        self.run_seconds
            .entry(runtime.to_string())
            .or_default()
            .observe(total);
        if let Some(s) = start {
            self.start_seconds
                .entry(runtime.to_string())
                .or_default()
                .observe(s);
        }
    }

    /// Counts a response head.
    pub fn response(
        &mut self,
        face: &'static str,
        method: &'static str,
        route: &'static str,
        status: u16,
    ) {
        *self.http.entry((face, method, route, status)).or_insert(0) += 1;
    }
}

/// A request method as a label: the standard ones as they are, anything else `other`.
pub fn method_label(m: &str) -> &'static str {
    match m {
        "GET" => "GET",
        "HEAD" => "HEAD",
        "POST" => "POST",
        "PUT" => "PUT",
        "DELETE" => "DELETE",
        "PATCH" => "PATCH",
        "OPTIONS" => "OPTIONS",
        _ => "other",
    }
}

/// The text exposition being written.
#[derive(Default)]
pub struct Text {
    out: String,
}

impl Text {
    /// Starts a family: its `# HELP` and `# TYPE` lines.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample line.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// The samples of one histogram (`_bucket`, `_sum`, `_count`) with `labels`.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) {
        let mut cum = 0;
        let bucket = format!("{name}_bucket");
        for (i, b) in LATENCY_BUCKETS.iter().enumerate() {
            cum += h.counts[i];
            let le = format!("{b}");
            let mut l = labels.to_vec();
            l.push(("le", &le));
            self.sample(&bucket, &l, cum);
        }
        let mut l = labels.to_vec();
        l.push(("le", "+Inf"));
        self.sample(&bucket, &l, cum + h.over);
        self.sample(&format!("{name}_sum"), labels, h.sum);
        self.sample(&format!("{name}_count"), labels, h.count());
    }

    /// The text.
    pub fn finish(self) -> String {
        self.out
    }
}

fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_outcome_precedence() {
        assert_eq!(
            RunOutcome::of(true, true, true, true, 1),
            RunOutcome::Cancelled
        );
        assert_eq!(
            RunOutcome::of(false, true, true, true, 1),
            RunOutcome::Timeout
        );
        assert_eq!(RunOutcome::of(false, false, true, true, 1), RunOutcome::Oom);
        assert_eq!(
            RunOutcome::of(false, false, false, true, 0),
            RunOutcome::Truncated
        );
        assert_eq!(
            RunOutcome::of(false, false, false, false, 3),
            RunOutcome::Error
        );
        assert_eq!(
            RunOutcome::of(false, false, false, false, 0),
            RunOutcome::Ok
        );
    }

    #[test]
    fn test_histogram_buckets_at_below_and_above_a_bound() {
        let mut h = Histogram::default();
        h.observe(Duration::from_millis(5)); // at 0.005
        h.observe(Duration::from_micros(4_999)); // below
        h.observe(Duration::from_micros(5_001)); // above: next bucket
        h.observe(Duration::from_secs(301)); // past the last bound
        let mut t = Text::default();
        t.histogram("x_seconds", &[("runtime", "py")], &h);
        let s = t.finish();
        assert!(
            s.contains("x_seconds_bucket{runtime=\"py\",le=\"0.005\"} 2\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{runtime=\"py\",le=\"0.01\"} 3\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{runtime=\"py\",le=\"300\"} 3\n"),
            "{s}"
        );
        assert!(
            s.contains("x_seconds_bucket{runtime=\"py\",le=\"+Inf\"} 4\n"),
            "{s}"
        );
        assert!(s.contains("x_seconds_count{runtime=\"py\"} 4\n"), "{s}");
    }

    #[test]
    fn test_labels_are_escaped_and_methods_bounded() {
        let mut t = Text::default();
        t.sample("m", &[("a", "q\"b\\c\nd")], 1);
        assert_eq!(t.finish(), "m{a=\"q\\\"b\\\\c\\nd\"} 1\n");
        assert_eq!(method_label("GET"), "GET");
        assert_eq!(method_label("BREW"), "other");
    }
}
