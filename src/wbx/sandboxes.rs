//! Sandboxes and commands of the WBX face: each request parsed and checked into an
//! [`Op`], and the sandbox object and command results shaped as the document writes
//! them.

use super::error;
use crate::http::{Request, Response};
use crate::runtimes::{Runtime, Runtimes};
use std::collections::BTreeMap;

/// The face's settings (per tenant, for one box by default): kept with the rest of
/// the configuration, which knows no face.
pub use crate::config::WbxLimits as Limits;

/// vCPUs of every sandbox.
pub const VCPU: u32 = 2;
/// Memory of every sandbox, MiB (its processes and its writable root together).
pub const MEM_MB: u64 = 512;
/// Lifetime when `timeout_s` is not given.
pub const DEFAULT_TIMEOUT_S: u64 = 300;
/// A command's time limit when `timeout_ms` is not given (0 means none).
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 60_000;
/// Output kept per stream of a command (more sets `truncated`).
pub const EXEC_OUTPUT_BYTES: usize = 1 << 20;
/// Environment variables one request may set, and one sandbox may have (on top of
/// its template's).
pub const MAX_ENV: usize = 128;
/// Largest environment value.
const MAX_ENV_VALUE_BYTES: usize = 32 << 10;
/// A sandbox's own variables together (names and values, as `execve` takes them:
/// every command's environment, beside its arguments, within the kernel's bound).
pub const MAX_SANDBOX_ENV_BYTES: usize = 512 << 10;

/// The bytes each variable of `env` takes in a command's environment (`NAME=value`
/// and its NUL), by name.
pub fn env_sizes(env: &[(String, String)]) -> BTreeMap<String, usize> {
    env.iter()
        .map(|(k, v)| (k.clone(), k.len() + v.len() + 2))
        .collect()
}
/// Metadata labels one sandbox may carry, and their sizes.
const MAX_METADATA: usize = 32;
const MAX_METADATA_KEY_BYTES: usize = 64;
const MAX_METADATA_VALUE_BYTES: usize = 512;
/// Largest command line: one argument of `/bin/sh -c`, which the kernel (gVisor's too)
/// takes up to 128 KiB with its NUL (`MAX_ARG_STRLEN`; a longer one could not start).
pub const MAX_CMD_BYTES: usize = (128 << 10) - 1;

/// The template every sandbox gets when none is named.
pub const DEFAULT_TEMPLATE: &str = "base";

/// The templates: `base` (the `python` runtime's tree: CPython with its data and web
/// libraries, pip, Node.js with npm, and curl, wget, git, jq, ripgrep, unzip), then one per installed
/// language, named as the runtime is, on its default version. (name, runtime, description).
pub fn templates(runtimes: &Runtimes) -> Vec<(String, Runtime, String)> {
    let mut out = Vec::new();
    if let Some(py) = runtimes.resolve("python") {
        out.push((
            DEFAULT_TEMPLATE.to_string(),
            py.clone(),
            "Python 3 with numpy, pandas, matplotlib, requests, pip; Node.js with npm; and curl, wget, git, jq, ripgrep".to_string(),
        ));
    }
    for r in runtimes.languages() {
        out.push((
            r.desc.language.clone(),
            r.clone(),
            format!(
                "the {} runtime's tree ({} {})",
                r.desc.language,
                r.desc.version_key,
                r.version.as_deref().unwrap_or("?")
            ),
        ));
    }
    out
}

/// `GET /v1/templates`.
pub fn templates_json(runtimes: &Runtimes) -> Response {
    let list: Vec<serde_json::Value> = templates(runtimes)
        .into_iter()
        .map(|(name, _, description)| {
            serde_json::json!({"name": name, "description": description, "vcpu": VCPU, "mem_mb": MEM_MB})
        })
        .collect();
    Response::json(200, &serde_json::json!({ "templates": list }))
}

/// A sandbox's network, as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Net {
    /// The public internet only (the daemon's filtered egress).
    Full,
    /// No network at all.
    None,
    /// Only what the allowlist lets through (within the public internet).
    Allowlist(std::sync::Arc<crate::netfilter::policy::Allowlist>),
}

impl Net {
    /// The document's name of it.
    pub fn name(&self) -> &'static str {
        match self {
            Net::Full => "full",
            Net::None => "none",
            Net::Allowlist(_) => "allowlist",
        }
    }

    /// The allowlist, in mode allowlist.
    pub fn allowlist(&self) -> Option<std::sync::Arc<crate::netfilter::policy::Allowlist>> {
        match self {
            Net::Allowlist(a) => Some(std::sync::Arc::clone(a)),
            _ => None,
        }
    }
}

/// `network.allow` or `network.block`: a list of strings.
fn string_list(
    n: &serde_json::Map<String, serde_json::Value>,
    k: &str,
) -> Result<Vec<String>, Response> {
    match n.get(k) {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    error(
                        400,
                        &format!(
                            "network.{k}: a list of strings (domains, IPv4 addresses or ranges)"
                        ),
                    )
                })
            })
            .collect(),
        Some(_) => Err(error(
            400,
            &format!("network.{k}: a list of strings (domains, IPv4 addresses or ranges)"),
        )),
    }
}

/// A sandbox to create.
#[derive(Debug, Clone)]
pub struct Create {
    /// The template's name.
    pub template: String,
    /// Its tree.
    pub runtime: Runtime,
    /// Lifetime, capped.
    pub timeout_s: u64,
    /// Environment of every process.
    pub env: Vec<(String, String)>,
    /// The client's labels.
    pub metadata: BTreeMap<String, String>,
    /// Its network.
    pub network: Net,
    /// The compute class asked for (`None`: the tenant's default; whether it is
    /// offered is the daemon's to say).
    pub compute_class: Option<&'static super::compute::Class>,
}

/// A command to run.
#[derive(Debug, Clone, PartialEq)]
pub struct Exec {
    /// Run by `/bin/sh -c`.
    pub cmd: String,
    /// Working directory (default: the user's home).
    pub cwd: Option<String>,
    /// Variables on top of the sandbox's.
    pub env: Vec<(String, String)>,
    /// Time limit, ms (0: none).
    pub timeout_ms: u64,
    /// Its stdin, whole.
    pub stdin: Option<String>,
}

/// What a request asks of the sandboxes.
#[derive(Debug)]
pub enum Op {
    /// `POST /v1/sandboxes`.
    Create(Box<Create>),
    /// `GET /v1/sandboxes`.
    List,
    /// `GET /v1/sandboxes/{id}`.
    Get(String),
    /// `DELETE /v1/sandboxes/{id}`.
    Delete(String),
    /// `POST /v1/sandboxes/{id}/timeout`.
    Timeout(String, u64),
    /// `POST /v1/sandboxes/{id}/pause`.
    Pause(String),
    /// `POST /v1/sandboxes/{id}/resume`.
    Resume(String),
    /// `GET /v1/sandboxes/{id}/metrics`.
    Metrics(String),
    /// `GET /v1/sandboxes/{id}/url?port=`.
    Url(String, u16),
    /// `POST /v1/sandboxes/{id}/exec` (or `/exec/stream`: NDJSON).
    Exec {
        /// The sandbox.
        id: String,
        /// The command.
        exec: Box<Exec>,
        /// NDJSON events as it runs.
        stream: bool,
    },
    /// `POST /v1/sandboxes/{id}/env`.
    Env(String, Vec<(String, String)>),
    /// A background process's endpoint: the sandbox and what is asked.
    Proc(String, super::processes::ProcOp),
    /// A file operation (`fs/…`) in the sandbox.
    Fs(String, crate::sandbox::wire::FsCall),
    /// `GET …/fs/watch?path=&recursive=`: a stream of changes.
    FsWatch {
        /// The sandbox.
        id: String,
        /// The directory.
        path: Vec<u8>,
        /// Its subdirectories too.
        recursive: bool,
    },
    /// `GET`/`HEAD …/files?path=`: a download.
    FileGet {
        /// The sandbox.
        id: String,
        /// The file.
        path: Vec<u8>,
        /// `HEAD`: the head alone.
        head_only: bool,
    },
}

/// A sandbox id as this daemon makes them: `sb_` and 24 lowercase hex digits. Anything
/// else is no sandbox (404, as for one that is gone).
pub fn valid_id(id: &str) -> bool {
    id.strip_prefix("sb_")
        .is_some_and(|h| h.len() == 24 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// The 404 for a sandbox that does not exist, is gone, or is another tenant's.
pub fn not_found() -> Response {
    error(404, "sandbox not found")
}

/// A request body's fields: a JSON object (an empty body is `{}`), with only the
/// fields the endpoint takes. Each field is then read with a message that names it.
pub(super) struct Fields(pub(super) serde_json::Map<String, serde_json::Value>);

impl Fields {
    pub(super) fn of(req: &Request, known: &[&str]) -> Result<Fields, Response> {
        let map = crate::http::json::parse_object(&req.body, true)
            .map_err(|why| error(400, &format!("invalid request body: {why}")))?;
        if let Some(k) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(error(
                400,
                &format!(
                    "invalid request body: unknown field `{k}`; this endpoint takes {}",
                    known.join(", ")
                ),
            ));
        }
        Ok(Fields(map))
    }

    /// A field that is absent or null.
    pub(super) fn absent(&self, name: &str) -> bool {
        self.0.get(name).is_none_or(serde_json::Value::is_null)
    }

    pub(super) fn string(&self, name: &str) -> Result<Option<String>, Response> {
        if self.absent(name) {
            return Ok(None);
        }
        match &self.0[name] {
            serde_json::Value::String(s) => Ok(Some(s.clone())),
            _ => Err(error(400, &format!("{name}: must be a string"))),
        }
    }

    pub(super) fn whole(&self, name: &str, what: &str) -> Result<Option<u64>, Response> {
        if self.absent(name) {
            return Ok(None);
        }
        self.0[name]
            .as_u64()
            .map(Some)
            .ok_or_else(|| error(400, &format!("{name}: must be {what}")))
    }

    pub(super) fn strings(&self, name: &str) -> Result<Option<BTreeMap<String, String>>, Response> {
        if self.absent(name) {
            return Ok(None);
        }
        let bad = || {
            error(
                400,
                &format!("{name}: must be an object whose values are strings"),
            )
        };
        let serde_json::Value::Object(m) = &self.0[name] else {
            return Err(bad());
        };
        m.iter()
            .map(|(k, v)| {
                v.as_str()
                    .map(|s| (k.clone(), s.to_string()))
                    .ok_or_else(bad)
            })
            .collect::<Result<BTreeMap<_, _>, _>>()
            .map(Some)
    }
}

pub(super) fn env_vars(
    v: Option<BTreeMap<String, String>>,
) -> Result<Vec<(String, String)>, Response> {
    let v = v.unwrap_or_default();
    if v.len() > MAX_ENV {
        return Err(error(400, &format!("env: at most {MAX_ENV} variables")));
    }
    let mut out = Vec::new();
    for (k, val) in v {
        let ok_name = k
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && k.len() <= 256;
        if !ok_name {
            return Err(error(
                400,
                &format!("env: {k:?} is not a variable name (letters, digits and _, not starting with a digit)"),
            ));
        }
        if !within(&val, MAX_ENV_VALUE_BYTES, MAX_ENV_VALUE_BYTES / 4) || val.contains('\0') {
            return Err(error(
                400,
                &format!("env: the value of {k} must be at most {MAX_ENV_VALUE_BYTES} bytes (ASCII up to {MAX_ENV_VALUE_BYTES} characters, or any UTF-8 up to {}), without NUL", MAX_ENV_VALUE_BYTES / 4),
            ));
        }
        out.push((k, val));
    }
    Ok(out)
}

/// `network` as the document has it: absent or null is mode full.
///
/// # Errors
/// 400 naming what is wrong.
pub fn network(v: Option<&serde_json::Value>) -> Result<Net, Response> {
    Ok(match v.filter(|v| !v.is_null()) {
        None => Net::Full,
        Some(serde_json::Value::Object(n)) => {
            if let Some(k) = n
                .keys()
                .find(|k| !["mode", "allow", "block"].contains(&k.as_str()))
            {
                return Err(error(
                    400,
                    &format!("network: unknown field `{k}`; it takes mode, allow, block"),
                ));
            }
            let mode = n.get("mode").and_then(|m| m.as_str()).unwrap_or("");
            match mode {
                "full" | "none" if n.contains_key("allow") || n.contains_key("block") => {
                    return Err(error(
                        400,
                        "network.allow and network.block apply to mode allowlist only",
                    ))
                }
                "full" => Net::Full,
                "none" => Net::None,
                "allowlist" => {
                    let (allow, block) = (string_list(n, "allow")?, string_list(n, "block")?);
                    let denied: Vec<crate::netfilter::Cidr> = crate::netfilter::DENIED
                        .iter()
                        .filter_map(|s| s.parse().ok())
                        .collect();
                    let a = crate::netfilter::policy::Allowlist::parse(&allow, &block, &denied)
                        .map_err(|e| error(400, &e))?;
                    Net::Allowlist(std::sync::Arc::new(a))
                }
                other => {
                    return Err(error(
                        400,
                        &format!("network.mode: {other:?} is not one of full, none, allowlist"),
                    ))
                }
            }
        }
        Some(_) => {
            return Err(error(
                400,
                "network: must be an object like {\"mode\": \"full\"}",
            ))
        }
    })
}

/// `POST /v1/sandboxes`.
pub fn create(req: &Request, runtimes: &Runtimes, limits: &Limits) -> Result<Op, Response> {
    let f = Fields::of(
        req,
        &[
            "template",
            "timeout_s",
            "env",
            "metadata",
            "network",
            "compute_class",
        ],
    )?;
    let name = f
        .string("template")?
        .unwrap_or_else(|| DEFAULT_TEMPLATE.to_string());
    let Some((template, runtime, _)) = templates(runtimes).into_iter().find(|(n, _, _)| *n == name)
    else {
        return Err(error(
            400,
            &format!("template: unknown template {name:?}; GET /v1/templates lists them"),
        ));
    };
    let timeout_s = match f.whole("timeout_s", "a whole number of seconds, at least 1")? {
        Some(0) => return Err(error(400, "timeout_s: must be at least 1")),
        Some(t) => t.min(limits.max_timeout_s),
        None => DEFAULT_TIMEOUT_S.min(limits.max_timeout_s),
    };
    let env = env_vars(f.strings("env")?)?;
    let metadata = f.strings("metadata")?.unwrap_or_default();
    if metadata.len() > MAX_METADATA {
        return Err(error(
            400,
            &format!("metadata: at most {MAX_METADATA} labels"),
        ));
    }
    for (k, v) in &metadata {
        if k.is_empty()
            || !within(k, MAX_METADATA_KEY_BYTES, MAX_METADATA_KEY_BYTES / 4)
            || !within(v, MAX_METADATA_VALUE_BYTES, MAX_METADATA_VALUE_BYTES / 4)
        {
            return Err(error(
                400,
                &format!("metadata: keys of 1 to {MAX_METADATA_KEY_BYTES} bytes, values of at most {MAX_METADATA_VALUE_BYTES} (ASCII up to that many characters, or any UTF-8 up to a quarter of it)"),
            ));
        }
    }
    let network = network(f.0.get("network"))?;
    let compute_class = super::compute::field(f.0.get("compute_class"))?;
    Ok(Op::Create(Box::new(Create {
        template,
        runtime,
        timeout_s,
        env,
        metadata,
        network,
        compute_class,
    })))
}

/// `POST /v1/sandboxes/{id}/timeout`.
pub fn timeout(req: &Request, id: String, limits: &Limits) -> Result<Op, Response> {
    let f = Fields::of(req, &["timeout_s"])?;
    match f.whole("timeout_s", "a whole number of seconds, at least 1")? {
        None => Err(error(400, "timeout_s: required")),
        Some(0) => Err(error(400, "timeout_s: must be at least 1")),
        Some(t) => Ok(Op::Timeout(id, t.min(limits.max_timeout_s))),
    }
}

/// A request whose body, if any, must be an empty JSON object (`pause`, `resume`).
/// `GET …/url?port=`: the port, 1–65535.
pub fn url(req: &Request, id: String) -> Result<Op, Response> {
    match req.head.query_param("port") {
        None => Err(error(400, "port: required, e.g. ?port=8000")),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Ok(Op::Url(id, n)),
            _ => Err(error(
                400,
                &format!(
                    "port: must be a port number from 1 to 65535, not {:?}",
                    p.chars().take(16).collect::<String>()
                ),
            )),
        },
    }
}

/// A request that takes no fields.
pub fn no_fields(req: &Request, op: Op) -> Result<Op, Response> {
    Fields::of(req, &[])?;
    Ok(op)
}

/// A command line (required, `/bin/sh -c`'s) and its working directory (absolute).
pub(super) fn cmd_and_cwd(f: &Fields) -> Result<(String, Option<String>), Response> {
    let cmd = match f.string("cmd")? {
        None => return Err(error(400, "cmd: required")),
        Some(c) if c.trim().is_empty() => return Err(error(400, "cmd: must not be empty")),
        Some(c) if c.len() > MAX_CMD_BYTES || c.contains('\0') => {
            return Err(error(
                400,
                &format!("cmd: at most {MAX_CMD_BYTES} bytes, without NUL"),
            ))
        }
        Some(c) => c,
    };
    let cwd = f.string("cwd")?;
    if let Some(cwd) = &cwd {
        if !cwd.starts_with('/') || cwd.contains('\0') || !within(cwd, 4096, 1023) {
            return Err(error(
                400,
                "cwd: must be an absolute path of at most 4096 bytes (ASCII up to 4096 characters, or any UTF-8 up to 1023), without NUL",
            ));
        }
    }
    Ok((cmd, cwd))
}

/// Whether `s` is within a byte limit as the OpenAPI document states it exactly in
/// characters (JSON Schema counts characters, not bytes): ASCII up to `ascii`
/// characters, or any UTF-8 up to `any` (a quarter: no character takes more than 4
/// bytes, so both stay within `ascii` bytes). One rule for the server and the document,
/// so a request is refused exactly when the document calls it invalid.
fn within(s: &str, ascii: usize, any: usize) -> bool {
    if s.is_ascii() {
        s.len() <= ascii
    } else {
        s.chars().count() <= any
    }
}

/// `POST /v1/sandboxes/{id}/exec` and `/exec/stream`.
pub fn exec(req: &Request, id: String, stream: bool) -> Result<Op, Response> {
    let f = Fields::of(req, &["cmd", "cwd", "env", "timeout_ms", "stdin"])?;
    let (cmd, cwd) = cmd_and_cwd(&f)?;
    let timeout_ms = f
        .whole("timeout_ms", "a whole number of milliseconds (0: no limit)")?
        .unwrap_or(DEFAULT_EXEC_TIMEOUT_MS);
    Ok(Op::Exec {
        id,
        exec: Box::new(Exec {
            cmd,
            cwd,
            env: env_vars(f.strings("env")?)?,
            timeout_ms,
            stdin: f.string("stdin")?,
        }),
        stream,
    })
}

/// What the document's sandbox object holds.
pub struct View<'a> {
    /// Its id.
    pub id: &'a str,
    /// Its template.
    pub template: &'a str,
    /// `starting`, `running`, `paused` or `ending`.
    pub state: &'a str,
    /// Created, Unix ms.
    pub created_ms: u64,
    /// Expires, Unix ms.
    pub expires_ms: u64,
    /// Labels.
    pub metadata: &'a BTreeMap<String, String>,
    /// Network mode.
    pub network: Net,
    /// Start time, ms.
    pub start_ms: u64,
    /// Served from a pool of ready sandboxes.
    pub warm: bool,
    /// Its compute class.
    pub class: &'static super::compute::Class,
}

/// The sandbox object.
pub fn sandbox_json(v: &View<'_>) -> serde_json::Value {
    serde_json::json!({
        "id": v.id,
        "template": v.template,
        "state": v.state,
        "compute_class": v.class.name,
        "vcpu": v.class.vcpu,
        "mem_mb": v.class.mem_mb,
        "created_at": super::timestamp(v.created_ms),
        "expires_at": super::timestamp(v.expires_ms),
        "metadata": v.metadata,
        "network": v.network.name(),
        "info": {"start_ms": v.start_ms, "warm": v.warm},
    })
}

/// A command's result, as `exec` answers it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ExecResult {
    /// Its exit code (128 + the signal that ended it).
    pub exit_code: i32,
    /// Its stdout, at most [`EXEC_OUTPUT_BYTES`].
    pub stdout: String,
    /// Its stderr, likewise.
    pub stderr: String,
    /// From start to exit.
    pub duration_ms: u64,
    /// Killed at `timeout_ms`.
    pub timed_out: bool,
    /// Output past the cap was dropped.
    pub truncated: bool,
}

/// `GET …/metrics`: what the sandbox uses, from its host cgroup (gVisor's own
/// processes and its in-memory root included in memory) and, while it runs, the disk
/// its processes see (`null` while paused).
pub fn metrics_json(
    class: &super::compute::Class,
    u: &crate::cgroup::Usage,
    created_ms: u64,
    now_ms: u64,
    disk: &serde_json::Value,
) -> serde_json::Value {
    let mib = |b: u64| (b as f64 / f64::from(1u32 << 20) * 10.0).round() / 10.0;
    let alive_ns = now_ms.saturating_sub(created_ms).max(1) as f64 * 1e6;
    let pct = u.cpu_ns as f64 / (alive_ns * f64::from(class.vcpu)) * 100.0;
    let fs = |name: &str, i: usize| disk[name][i].as_u64().map(mib);
    serde_json::json!({
        "cpu_used_ms": u.cpu_ns / 1_000_000,
        "cpu_avg_pct": (pct * 10.0).round() / 10.0,
        "vcpu": class.vcpu,
        "mem_used_mb": mib(u.memory_bytes),
        "mem_mb": class.mem_mb,
        "tasks": u.tasks,
        "disk_used_mb": fs("root", 0),
        "disk_total_mb": fs("root", 1),
        "tmp_used_mb": fs("tmp", 0),
        "tmp_total_mb": fs("tmp", 1),
    })
}

/// One NDJSON line of `exec/stream`.
pub fn event_line(v: &serde_json::Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::Params;

    fn req(body: &str) -> Request {
        Request {
            head: crate::http::parse::parse_head(b"POST / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap(),
            body: body.as_bytes().to_vec(),
            tenant: "t".into(),
            params: Params::default(),
        }
    }

    #[test]
    fn test_ids() {
        assert!(valid_id("sb_0123456789abcdef01234567"));
        for bad in [
            "sb_0123456789ABCDEF01234567",
            "sb_123",
            "xx_0123456789abcdef01234567",
            "sb_0123456789abcdef0123456/",
        ] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn test_exec_bodies() {
        let Ok(Op::Exec {
            exec: e, stream, ..
        }) = exec(
            &req(r#"{"cmd":"echo hi","timeout_ms":0,"env":{"A_1":"x"}}"#),
            "sb".into(),
            true,
        )
        else {
            panic!()
        };
        assert!(stream);
        assert_eq!(
            (e.timeout_ms, e.env.clone()),
            (0, vec![("A_1".into(), "x".into())])
        );
        let msg = |b: &str| {
            let r = exec(&req(b), "sb".into(), false).unwrap_err();
            assert_eq!(r.status, 400, "{b}");
            serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["error"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert!(msg("{}").contains("cmd: required"));
        assert!(msg(r#"{"cmd":"  "}"#).contains("must not be empty"));
        assert!(msg(r#"{"cmd":"x","cwd":"rel"}"#).contains("cwd"));
        assert!(msg(r#"{"cmd":"x","env":{"1A":"x"}}"#).contains("not a variable name"));
        assert!(msg(r#"{"cmd":"x","bogus":1}"#).contains(
            "unknown field `bogus`; this endpoint takes cmd, cwd, env, timeout_ms, stdin"
        ));
        assert!(msg(r#"["x"]"#).contains("must be a JSON object"));
        assert!(msg("{x").contains("not valid JSON"));
        assert_eq!(
            msg(r#"{"cmd":"x","timeout_ms":-1}"#),
            "timeout_ms: must be a whole number of milliseconds (0: no limit)"
        );
        assert_eq!(
            msg(r#"{"cmd":"x","timeout_ms":1.5}"#),
            "timeout_ms: must be a whole number of milliseconds (0: no limit)"
        );
        assert_eq!(msg(r#"{"cmd":5}"#), "cmd: must be a string");
        assert_eq!(
            msg(r#"{"cmd":"x","env":{"A":1}}"#),
            "env: must be an object whose values are strings"
        );
        // Byte limits as the document states them in characters, at and past each
        // bound: ASCII up to the limit, any UTF-8 up to a quarter of it.
        let cwd = |c: String| serde_json::json!({"cmd": "x", "cwd": c}).to_string();
        assert!(exec(
            &req(&cwd(format!("/{}", "a".repeat(4095)))),
            "sb".into(),
            false
        )
        .is_ok());
        assert!(msg(&cwd(format!("/{}", "a".repeat(4096)))).contains("cwd"));
        assert!(exec(
            &req(&cwd(format!("/{}", "é".repeat(1022)))),
            "sb".into(),
            false
        )
        .is_ok());
        assert!(msg(&cwd(format!("/{}", "é".repeat(1023)))).contains("cwd"));
        let env = |v: String| serde_json::json!({"cmd": "x", "env": {"A": v}}).to_string();
        assert!(exec(&req(&env("é".repeat(8192))), "sb".into(), false).is_ok());
        assert!(msg(&env("é".repeat(8193))).contains("env: the value of A"));
        assert!(exec(&req(&env("a".repeat(32768))), "sb".into(), false).is_ok());
        assert!(msg(&env("a".repeat(32769))).contains("env: the value of A"));
    }

    #[test]
    fn test_within_counts_characters_as_the_document_does() {
        assert!(within(&"a".repeat(64), 64, 16));
        assert!(!within(&"a".repeat(65), 64, 16));
        assert!(within(&"é".repeat(16), 64, 16));
        // 17 two-byte characters are 34 bytes, under 64, but past what the document
        // allows for non-ASCII text: refused, as the document says.
        assert!(!within(&"é".repeat(17), 64, 16));
        assert!(!within(&format!("{}é", "a".repeat(16)), 64, 16));
        assert!(within("", 64, 16));
    }
}
