//! `POST /execute`: request decoding and validation into an [`ExecPlan`], and the
//! response object. Running the plan is the reactor's and the sandbox's business.

use super::{Action, App};
use crate::http::{Request, Response};
use crate::runtimes::Runtimes;
use crate::sandbox::limits::RequestedLimits;
use crate::sandbox::plan::{Artifact, CompileResult, ExecPlan, RunResult};
use base64::Engine;
use serde::{Deserialize, Serialize};

/// The spec's exact warning when network was requested but not applied.
pub const NETWORK_WARNING: &str = "network requested but currently unavailable (egress firewall not verified); ran with network OFF";

/// Most files one request may carry.
pub const MAX_FILES: usize = 64;
/// Longest file path (bytes).
pub const MAX_FILE_PATH_BYTES: usize = 255;
/// Most args.
pub const MAX_ARGS: usize = 256;
/// Most inputs in one request (`inputs`).
pub const MAX_INPUTS: usize = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    language: Option<String>,
    version: Option<String>,
    code: Option<String>,
    files: Option<Vec<FileIn>>,
    stdin: Option<String>,
    args: Option<Vec<String>>,
    limits: Option<RequestedLimits>,
    network: Option<bool>,
    detach: Option<bool>,
    inputs: Option<Vec<InputIn>>,
    #[serde(rename = "sharedSandbox")]
    shared_sandbox: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InputIn {
    stdin: Option<String>,
    args: Option<Vec<String>>,
}

/// One input of a many-input request: the program's stdin and args for one run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Input {
    /// Fed to stdin.
    pub stdin: Vec<u8>,
    /// Appended to the run argv.
    pub args: Vec<String>,
}

/// A decoded request: the plan, and how the client wants it run.
#[derive(Debug)]
pub struct Decoded {
    /// The validated plan (with `inputs`: its stdin and args are empty; each input
    /// brings its own).
    pub plan: ExecPlan,
    /// `"detach": true`.
    pub detach: bool,
    /// `inputs`: the same code once per input, in order.
    pub inputs: Option<Vec<Input>>,
    /// `"sharedSandbox": true` (with `inputs` only): every input in one sandbox, one
    /// after another, the build done once.
    pub shared: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileIn {
    name: String,
    content: String,
    encoding: Option<String>,
}

/// The 200 response of `/execute` (and the `done` event of a stream).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ExecuteResponse {
    /// Resolved language.
    pub language: String,
    /// Resolved version.
    pub version: String,
    /// Always `gvisor`.
    pub backend: &'static str,
    /// The run.
    pub run: RunResult,
    /// Compile stage, for compiled runtimes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile: Option<CompileResult>,
    /// Present only when network was requested but not applied.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<&'static str>,
    /// Rich outputs of a kernel step (figures, a trailing expression's HTML or PNG);
    /// omitted when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
}

impl ExecuteResponse {
    /// The body for a JSON response, its outputs escaped as the socket drains
    /// (`http/lazy.rs`): a client that stops reading holds the raw strings, not up to
    /// six times their size.
    pub fn into_lazy(mut self) -> crate::http::lazy::LazyBody {
        let mut d = crate::http::lazy::Deferred::new();
        self.defer(&mut d);
        d.body(&self)
    }

    /// Takes its large strings (outputs, artifacts) out into `d`, for a body that holds
    /// this response and is encoded lazily.
    pub fn defer(&mut self, d: &mut crate::http::lazy::Deferred) {
        d.take(&mut self.run.stdout);
        d.take(&mut self.run.stderr);
        if let Some(c) = self.compile.as_mut() {
            d.take(&mut c.stdout);
            d.take(&mut c.stderr);
        }
        for a in &mut self.artifacts {
            match a {
                Artifact::Png { data_b64 } => d.take(data_b64),
                Artifact::Html { data } => d.take(data),
            }
        }
    }
}

/// Files' base64: the standard alphabet, padded, and lenient about the unused bits of
/// the last character (as Python's `base64` and browsers' `atob` are: `"QQ=="` and
/// `"QR=="` are both `A`).
const FILE_BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
);

/// Words for the body's fields in its 400s (`http::json`).
const HINTS: crate::http::json::Hints = &[
    (
        "language",
        "a runtime name or alias such as \"python\" (see GET /runtimes)",
    ),
    ("version", "a version string (see GET /runtimes)"),
    ("code", "the program's source text, a string"),
    (
        "files",
        "a list of {\"name\", \"content\", \"encoding\"} objects",
    ),
    ("files[]", "an object {\"name\", \"content\", \"encoding\"}"),
    ("files[].name", "a relative file name, a string"),
    (
        "files[].content",
        "the file's content, a string (utf8, base64 or hex as encoding says)",
    ),
    ("files[].encoding", "\"utf8\", \"base64\" or \"hex\""),
    ("stdin", "a string"),
    ("args", "a list of strings"),
    ("args[]", "a string"),
    (
        "limits",
        "an object of limits (memoryBytes, cpus, pids, outputBytes, wallTimeMs)",
    ),
    ("limits.memoryBytes", "a number of bytes"),
    ("limits.cpus", "a number of CPUs (e.g. 0.5)"),
    ("limits.pids", "a number of processes"),
    ("limits.outputBytes", "a number of bytes"),
    ("limits.wallTimeMs", "a number of milliseconds"),
    ("network", "true or false"),
    (
        "inputs",
        "a list of {\"stdin\", \"args\"} objects, one run each (at most 64)",
    ),
    ("inputs[]", "an object {\"stdin\", \"args\"}"),
    ("inputs[].stdin", "a string"),
    ("inputs[].args", "a list of strings"),
    ("inputs[].args[]", "a string"),
    (
        "sharedSandbox",
        "true or false (with inputs: run them one after another in one sandbox)",
    ),
    (
        "detach",
        "true or false (true: answer 202 with the run's id at once)",
    ),
];

fn bad(code: &str, detail: impl AsRef<str>) -> Response {
    Response::error(400, code, Some(detail.as_ref()))
}

/// Whether the client asked for an SSE stream.
pub fn wants_stream(req: &Request) -> bool {
    let accept = req.head.header("accept").unwrap_or("");
    accept.split(',').any(|t| {
        t.trim()
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case("text/event-stream")
    }) || matches!(
        req.head.query_param("stream").as_deref(),
        Some("1") | Some("true")
    )
}

/// Decodes and validates; answers 400/429 itself or returns the plan to run.
pub fn handle(app: &mut App, req: &Request) -> Action {
    let d = match decode_with(&app.runtimes, &req.body, None, false, true) {
        Ok(p) => p,
        Err(resp) => return Action::Respond(resp),
    };
    if let Some(inputs) = d.inputs {
        return Action::ExecuteMany {
            plan: Box::new(d.plan),
            inputs,
            stream: wants_stream(req),
            shared: d.shared,
        };
    }
    Action::Execute {
        plan: Box::new(d.plan),
        delivery: super::Delivery::of(d.detach, req),
        tenant: req.tenant.clone(),
    }
}

/// Decodes a request body into a plan (public for fuzzing and tests).
///
/// # Errors
/// The 400 response the spec prescribes.
pub fn decode(runtimes: &Runtimes, body: &[u8]) -> Result<ExecPlan, Response> {
    decode_with(runtimes, body, None, false, true).map(|d| d.plan)
}

/// Decodes a session step: the `/execute` body minus `language` (which, if given
/// anyway, must name the session's runtime); and whether it asked to be detached. A
/// kernel session's step runs the kernel's (default) version.
///
/// # Errors
/// The 400 response.
pub fn decode_for_session(
    runtimes: &Runtimes,
    body: &[u8],
    runtime: &str,
    version: Option<&str>,
    kernel: bool,
    default_network: bool,
) -> Result<(ExecPlan, bool), Response> {
    let d = decode_with(
        runtimes,
        body,
        Some((runtime, version)),
        kernel,
        default_network,
    )?;
    if d.inputs.is_some() {
        return Err(bad(
            "invalid_json",
            "inputs: a session step runs once; send one step per input",
        ));
    }
    Ok((d.plan, d.detach))
}

fn decode_with(
    runtimes: &Runtimes,
    body: &[u8],
    session: Option<(&str, Option<&str>)>,
    kernel_session: bool,
    default_network: bool,
) -> Result<Decoded, Response> {
    let session_runtime = session.map(|(r, _)| r);
    let b: Body = super::decode_json(body, HINTS)?;
    if let Some(fixed) = session_runtime {
        let given = b.language.as_deref().map(str::trim).unwrap_or("");
        if !given.is_empty()
            && runtimes.resolve(given).map(|r| r.desc.language.as_str()) != Some(fixed)
        {
            return Err(bad(
                "invalid_json",
                format!(
                    "language: the session's runtime is {}; omit language",
                    serde_json::Value::from(fixed)
                ),
            ));
        }
    }
    let language = session_runtime
        .or(b.language.as_deref())
        .map(str::trim)
        .unwrap_or("");
    if language.is_empty() {
        return Err(Response::error(400, "language_required", None));
    }
    let runtime = runtimes.resolve(language).ok_or_else(|| {
        bad(
            "unknown_language",
            format!(
                "{} is not a known runtime; see GET /runtimes",
                serde_json::Value::from(language)
            ),
        )
    })?;
    // A session's steps run its version unless they name another; the version it was
    // created with is exact, so it names itself while its tree is built.
    let session_rt = match session.and_then(|(_, v)| v) {
        None => runtime,
        Some(v) => runtimes.pick_named(language, v).ok_or_else(|| {
            bad(
                "unknown_version",
                format!(
                    "the session runs {} {}, which is no longer installed; see GET /runtimes",
                    runtime.desc.language, v
                ),
            )
        })?,
    };
    let runtime = match b.version.as_deref().filter(|v| !v.is_empty()) {
        None => session_rt,
        Some(v) => runtimes.pick(language, v).ok_or_else(|| {
            let forms = &runtime.desc.version_forms;
            let also = if forms.is_empty() {
                String::new()
            } else {
                let quoted: Vec<String> = forms.iter().map(|f| format!("{f:?}")).collect();
                format!(
                    " (also accepted: {}, where * is digits and dots)",
                    quoted.join(", ")
                )
            };
            bad(
                "unknown_version",
                format!(
                    "{} is not a version of {}; it has {}{also}; see GET /runtimes",
                    serde_json::Value::from(v),
                    serde_json::Value::from(runtime.desc.language.as_str()),
                    runtimes.versions_listed(language),
                ),
            )
        })?,
    };
    // A kernel session's kernel runs the session's version: a step that names another
    // version number is refused; a client's form (`3.14-agent`, which seed clients send
    // on every request) is the kernel's.
    let runtime = match (kernel_session, session_rt) {
        (true, kernel) if kernel.rootfs_path != runtime.rootfs_path => {
            let v = b.version.as_deref().unwrap_or("");
            if runtimes.pick_named(language, v).is_some() {
                return Err(bad(
                    "unknown_version",
                    format!(
                        "version: kernel sessions run {} {}; omit version",
                        kernel.desc.language,
                        kernel.version.as_deref().unwrap_or("")
                    ),
                ));
            }
            kernel
        }
        _ => runtime,
    };
    if b.code.is_none() && b.files.as_ref().is_none_or(|f| f.is_empty()) {
        return Err(bad("no_source", "provide `code` or `files`"));
    }
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let code_given = b.code.is_some();
    if let Some(code) = b.code {
        files.push((runtime.desc.source_file.clone(), code.into_bytes()));
    }
    for (i, f) in b.files.unwrap_or_default().into_iter().enumerate() {
        validate_name(&f.name).map_err(|why| {
            bad(
                "invalid_file",
                format!(
                    "files[{i}] ({}): {why}",
                    serde_json::Value::from(f.name.as_str())
                ),
            )
        })?;
        let content = match f.encoding.as_deref().unwrap_or("utf8") {
            "utf8" | "utf-8" => f.content.into_bytes(),
            "base64" => FILE_BASE64.decode(f.content.trim_end()).map_err(|e| {
                bad(
                    "invalid_file",
                    format!(
                        "files[{i}] ({}): invalid base64: {e}",
                        serde_json::Value::from(f.name.as_str())
                    ),
                )
            })?,
            "hex" => decode_hex(f.content.trim()).ok_or_else(|| {
                bad(
                    "invalid_file",
                    format!(
                        "files[{i}] ({}): invalid hex",
                        serde_json::Value::from(f.name.as_str())
                    ),
                )
            })?,
            other => {
                return Err(bad(
                    "invalid_file",
                    format!(
                        "files[{i}] ({}): unknown encoding {}; use utf8, base64 or hex",
                        serde_json::Value::from(f.name.as_str()),
                        serde_json::Value::from(other)
                    ),
                ))
            }
        };
        files.push((f.name, content));
    }
    if files.len() > MAX_FILES {
        return Err(bad("invalid_file", format!("at most {MAX_FILES} files")));
    }
    check_collisions(&files).map_err(|d| bad("invalid_file", d))?;
    let entry = files[0].0.clone();
    let args = b.args.unwrap_or_default();
    if args.len() > MAX_ARGS {
        return Err(bad("invalid_json", format!("at most {MAX_ARGS} args")));
    }
    if args.iter().any(|a| a.contains('\0')) {
        return Err(bad("invalid_json", "args may not contain NUL"));
    }
    let detach = b.detach.unwrap_or(false);
    let shared = b.shared_sandbox.unwrap_or(false);
    if shared && b.inputs.is_none() {
        return Err(bad(
            "invalid_json",
            "sharedSandbox: only with inputs (it says how they share a sandbox)",
        ));
    }
    let inputs = match b.inputs {
        None => None,
        Some(list) => {
            if list.is_empty() || list.len() > MAX_INPUTS {
                return Err(bad(
                    "invalid_json",
                    format!("inputs: 1 to {MAX_INPUTS} inputs (it has {})", list.len()),
                ));
            }
            if b.stdin.is_some() || !args.is_empty() {
                return Err(bad(
                    "invalid_json",
                    "stdin/args: with inputs, each input gives its own stdin and args",
                ));
            }
            if detach {
                return Err(bad(
                    "invalid_json",
                    "detach: a request with inputs cannot be detached",
                ));
            }
            let mut out = Vec::with_capacity(list.len());
            for (i, inp) in list.into_iter().enumerate() {
                let args = inp.args.unwrap_or_default();
                if args.len() > MAX_ARGS {
                    return Err(bad(
                        "invalid_json",
                        format!("inputs[{i}].args: at most {MAX_ARGS} args"),
                    ));
                }
                if args.iter().any(|a| a.contains('\0')) {
                    return Err(bad(
                        "invalid_json",
                        format!("inputs[{i}].args may not contain NUL"),
                    ));
                }
                out.push(Input {
                    stdin: inp.stdin.unwrap_or_default().into_bytes(),
                    args,
                });
            }
            Some(out)
        }
    };
    let limits = b.limits.unwrap_or_default().resolve(&runtime.desc.limits);
    let plan = ExecPlan {
        runtime: runtime.clone(),
        files,
        entry,
        stdin: b.stdin.unwrap_or_default().into_bytes(),
        args,
        limits,
        network_requested: b.network.unwrap_or(default_network),
        allowlist: None,
        code_given,
        preload: None,
        workspace: None,
        long_lived: None,
        ro_binds: Vec::new(),
        signal_start: false,
        cpu_weight: None,
    };
    Ok(Decoded {
        plan,
        detach,
        inputs,
        shared,
    })
}

/// A file name is a relative path of plain components: no `..`, `.`, empty parts, NUL,
/// backslashes or absolute paths, and bounded in length.
pub fn validate_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty name");
    }
    if name.len() > MAX_FILE_PATH_BYTES {
        return Err("name longer than 255 bytes");
    }
    if name.starts_with('/') {
        return Err("absolute paths are not allowed");
    }
    if name.bytes().any(|c| c == 0 || c == b'\\' || c < 0x20) {
        return Err("NUL, control characters and backslashes are not allowed");
    }
    for part in name.split('/') {
        match part {
            "" => return Err("empty path component"),
            "." | ".." => return Err("`.` and `..` are not allowed"),
            _ => {}
        }
    }
    Ok(())
}

fn check_collisions(files: &[(String, Vec<u8>)]) -> Result<(), String> {
    for (i, (a, _)) in files.iter().enumerate() {
        for (b, _) in &files[..i] {
            if a == b {
                return Err(format!(
                    "{} given twice",
                    serde_json::Value::from(a.as_str())
                ));
            }
            let (short, long) = if a.len() < b.len() { (a, b) } else { (b, a) };
            if long.starts_with(short.as_str()) && long.as_bytes().get(short.len()) == Some(&b'/') {
                return Err(format!(
                    "{} is both a file and a directory",
                    serde_json::Value::from(short.as_str())
                ));
            }
        }
    }
    Ok(())
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    // from_str_radix alone would accept a sign ("+f").
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Builds the response for a finished run.
pub fn response(
    plan: &ExecPlan,
    run: RunResult,
    compile: Option<CompileResult>,
) -> ExecuteResponse {
    let warning = (plan.network_requested && !run.network).then_some(NETWORK_WARNING);
    ExecuteResponse {
        language: plan.runtime.desc.language.clone(),
        version: plan.runtime.version.clone().unwrap_or_default(),
        backend: "gvisor",
        run,
        compile,
        warning,
        artifacts: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names() {
        for ok in ["main.py", "pkg/mod.py", ".env", "a b.txt", "-rf"] {
            assert!(validate_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a\0b",
            "a\\b",
            "a/",
            &"x".repeat(256),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn test_collisions() {
        let f = |n: &str| (n.to_string(), Vec::new());
        assert!(check_collisions(&[f("a"), f("a")]).is_err());
        assert!(check_collisions(&[f("a"), f("a/b")]).is_err());
        assert!(check_collisions(&[f("a/b"), f("a")]).is_err());
        assert!(check_collisions(&[f("a"), f("ab"), f("a.b/c")]).is_ok());
    }

    #[test]
    fn test_file_base64_allows_the_last_characters_unused_bits() {
        assert_eq!(FILE_BASE64.decode("QQ==").unwrap(), b"A");
        assert_eq!(FILE_BASE64.decode("QR==").unwrap(), b"A");
        // Found by schemathesis: a schema-valid string the strict decoder refused.
        assert!(FILE_BASE64.decode("EI2X/o/ZyynBJ3JC06qDFZ6BzE==").is_ok());
        assert!(FILE_BASE64.decode("Q").is_err());
        assert!(FILE_BASE64.decode("Q===").is_err());
    }

    #[test]
    fn test_hex() {
        assert_eq!(decode_hex("48690a"), Some(b"Hi\n".to_vec()));
        assert_eq!(decode_hex("4"), None);
        assert_eq!(decode_hex("zz"), None);
        // Found by fuzzing (fuzz/regressions/execute_decode/hex-plus-sign).
        assert_eq!(decode_hex("+f"), None);
    }
}
