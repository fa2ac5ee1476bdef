//! The eryx face (`/eryx`): `eryx-api.md`, field for field, at its own base path, so a
//! client written for that document works with base URL `http://HOST:8090/eryx`. Thin,
//! as every face: it parses and checks requests into runs for the WebAssembly engine
//! (`wasm`, a jailed worker process) and shapes their answers. Its errors are that
//! document's: `{"error": {"code": "...", "message": "..."}}`.
//!
//! Built so far: `POST /v1/execute` (Python in WebAssembly, compute units, time, fuel
//! and memory limits, per-tenant concurrency), the `/v1/stream` WebSocket with
//! callbacks (`daemon::eryx` drives it), and sessions (`/v1/sessions`: Python state
//! kept between runs, in LMDB, across restarts; `daemon::eryx_sessions`), and uploaded
//! environments (`/v1/environments`: packages unpacked and imported into a snapshot of
//! their own by a jailed build; `form` reads the upload, `daemon::eryx_envs` keeps
//! them).

pub mod form;

use crate::admission::Class;
use crate::http::{Request, Response};
use crate::router::{RouteError, Row};
use serde_json::{json, Value};

/// The face's base path.
pub const BASE: &str = "/eryx";

/// Largest `POST /v1/execute` body (the code and its fields).
pub const EXECUTE_BODY_BYTES: usize = 1 << 20;

/// `{"error": {"code", "message"}}` with `status`.
pub fn error(status: u16, code: &str, message: &str) -> Response {
    Response::json(
        status,
        &json!({ "error": { "code": code, "message": message } }),
    )
}

/// Largest WebSocket message on `/v1/stream` (an `execute` with its code, a
/// `callback_response` with its result).
pub const STREAM_MESSAGE_BYTES: usize = 4 << 20;

/// Callbacks one `execute` may list.
pub const MAX_LISTED_CALLBACKS: usize = 100;

/// Largest `POST /v1/sessions` body (`environment` and `ttl_secs`).
pub const SESSION_BODY_BYTES: usize = 4 << 10;

/// A session's idle time before it expires when its create does not say (the
/// document: an hour).
pub const SESSION_TTL_SECS: u64 = 3600;

/// The longest `ttl_secs` a session may ask for (the document: a day).
pub const MAX_SESSION_TTL_SECS: u64 = 86_400;

/// The environment every tenant has: the standard library only.
pub const DEFAULT_ENVIRONMENT: &str = "python";

/// Which route a request is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `POST /v1/execute`
    Execute,
    /// `GET /v1/stream` (a WebSocket)
    Stream,
    /// `POST /v1/sessions`
    Sessions,
    /// `DELETE /v1/sessions/{id}`
    Session,
    /// `POST /v1/sessions/{id}/execute`
    SessionExecute,
    /// `POST`, `GET /v1/environments`
    Environments,
    /// `GET`, `DELETE /v1/environments/{name}`
    Environment,
}

/// Everything the face says about one route.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Which route.
    pub id: Route,
    /// Its path pattern after `/eryx` (the `route` label of `/metrics`).
    pub pattern: &'static str,
    /// Largest body accepted.
    pub body_cap: usize,
    /// How admission treats it.
    pub class: Class,
}

impl Spec {
    /// The answer to a body over the cap.
    pub fn over_cap(&self) -> Response {
        error(
            413,
            "invalid_request",
            &format!("The request body is over {} KiB", self.body_cap / 1024),
        )
    }
}

/// Every route of the face. Runs start engines: a key whenever keys are configured
/// (as the WBX face), and the request rate per org, which every request of the face
/// spends (the document: "each API request … counts as one"; "requests without a
/// valid key are rate limited per IP address instead"): [`Class::Tenant`].
/// The WebSocket's upgrade counts as one request, as the document says; each
/// `execute` on it counts again (`Admission::charge_tenant`).
pub static ROUTES: &[Row<Spec>] = &[
    Row {
        pattern: "/v1/execute",
        methods: &["POST"],
        route: Spec {
            id: Route::Execute,
            pattern: "/v1/execute",
            body_cap: EXECUTE_BODY_BYTES,
            class: Class::Tenant,
        },
    },
    Row {
        pattern: "/v1/stream",
        methods: &["GET", "HEAD"],
        route: Spec {
            id: Route::Stream,
            pattern: "/v1/stream",
            body_cap: 0,
            class: Class::Tenant,
        },
    },
    Row {
        pattern: "/v1/sessions",
        methods: &["POST"],
        route: Spec {
            id: Route::Sessions,
            pattern: "/v1/sessions",
            body_cap: SESSION_BODY_BYTES,
            class: Class::Tenant,
        },
    },
    Row {
        pattern: "/v1/sessions/{id}",
        methods: &["DELETE"],
        route: Spec {
            id: Route::Session,
            pattern: "/v1/sessions/{id}",
            body_cap: 0,
            class: Class::Tenant,
        },
    },
    Row {
        pattern: "/v1/sessions/{id}/execute",
        methods: &["POST"],
        route: Spec {
            id: Route::SessionExecute,
            pattern: "/v1/sessions/{id}/execute",
            body_cap: EXECUTE_BODY_BYTES,
            class: Class::Tenant,
        },
    },
    // A POST's body is streamed to a file as it arrives (`daemon::eryx_envs`), never
    // held; its cap is the form's.
    Row {
        pattern: "/v1/environments",
        methods: &["GET", "HEAD", "POST"],
        route: Spec {
            id: Route::Environments,
            pattern: "/v1/environments",
            body_cap: 0,
            class: Class::Tenant,
        },
    },
    Row {
        pattern: "/v1/environments/{name}",
        methods: &["GET", "HEAD", "DELETE"],
        route: Spec {
            id: Route::Environment,
            pattern: "/v1/environments/{name}",
            body_cap: 0,
            class: Class::Tenant,
        },
    },
];

/// The row for `method` and `path` (without the base), and its parameters.
///
/// # Errors
/// 404 or 405 in the face's shape.
pub fn resolve(method: &str, path: &str) -> Result<(&'static Spec, crate::http::Params), Response> {
    crate::router::resolve(ROUTES, method, path)
        .map(|(row, params)| (&row.route, params))
        .map_err(|e| match e {
            RouteError::NotFound => error(404, "not_found", "No such endpoint"),
            RouteError::MethodNotAllowed(allow) => error(
                405,
                "invalid_request",
                &format!("Method not allowed; this endpoint answers {allow}"),
            )
            .with_header("Allow", allow),
        })
}

/// Every path of the face as OpenAPI writes it (with the base), with its methods.
pub fn paths() -> Vec<(String, String)> {
    crate::router::paths(ROUTES)
        .into_iter()
        .map(|(p, m)| (format!("{BASE}{p}"), m.join(", ")))
        .collect()
}

/// An answer made in the isobox face's error shape (admission's, the HTTP layer's) in
/// this face's, with the document's codes; `authorization` is the request's header, to
/// tell a missing key from a malformed or a wrong one. Headers (`Retry-After`) are
/// kept; any other response passes unchanged.
pub fn reshape(resp: Response, authorization: Option<&str>) -> Response {
    if resp.status < 400 {
        return resp;
    }
    let Ok(v) = serde_json::from_slice::<Value>(&resp.body) else {
        return resp;
    };
    let Some(code) = v["error"].as_str() else {
        return resp;
    };
    let detail = v["detail"].as_str().unwrap_or("");
    let (code, message) = match (resp.status, code) {
        (401, _) => match authorization {
            None => ("missing_auth", "Missing Authorization header".to_string()),
            Some(a)
                if !a
                    .split_once(' ')
                    .is_some_and(|(s, t)| s.eq_ignore_ascii_case("bearer") && !t.is_empty()) =>
            {
                (
                    "invalid_auth",
                    "The Authorization header must use the Bearer scheme".to_string(),
                )
            }
            Some(_) => ("invalid_key", "Invalid API key".to_string()),
        },
        (429, _) => (
            "rate_limit_exceeded",
            "Too many requests; retry after the Retry-After seconds".to_string(),
        ),
        (404, _) => ("not_found", "No such endpoint".to_string()),
        (503, _) => (
            "unavailable",
            detail_or(detail, "At capacity; retry shortly"),
        ),
        (500..=599, _) => ("internal_error", detail_or(detail, "Internal error")),
        (_, c) => ("invalid_request", detail_or(detail, &c.replace('_', " "))),
    };
    let mut out = error(resp.status, code, &message);
    out.headers.extend(
        resp.headers
            .into_iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case("content-type")),
    );
    out
}

fn detail_or(detail: &str, or: &str) -> String {
    if detail.is_empty() {
        or.to_string()
    } else {
        detail.to_string()
    }
}

/// A tenant's limits on one run (the settings).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time per run, ms.
    pub timeout_ms: u64,
    /// Compute units per run.
    pub fuel: u64,
}

/// A checked `POST /v1/execute` (or a WebSocket `execute`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execute {
    /// The code.
    pub code: String,
    /// Time limit, ms (the request's, never above the tenant's).
    pub timeout_ms: u64,
    /// Compute units (the request's, never above the tenant's).
    pub fuel: u64,
    /// Callbacks the code may call (WebSocket only).
    pub callbacks: Vec<String>,
    /// The environment the request names, if it names one (checked by
    /// [`Execute::check_environment`]: what is valid depends on the session).
    pub environment: Option<String>,
    /// The session the run is in (the WebSocket's `session_id`; over HTTP, the path's).
    pub session_id: Option<String>,
    /// The uploaded environment it runs in, once the daemon found it ready.
    pub env: Option<crate::wasm::EnvPaths>,
}

impl Execute {
    /// Whether the environment named fits a session that runs in `session_env`: it may
    /// only repeat the session's (else 422). Whether an environment exists and is
    /// ready is the daemon's to say.
    ///
    /// # Errors
    /// The refusal, in the document's codes.
    pub fn check_environment(&self, session_env: &str) -> Result<(), Rejection> {
        let Some(e) = self.environment.as_deref() else {
            return Ok(());
        };
        let shown: String = e.chars().take(64).collect();
        if e == session_env {
            return Ok(());
        }
        Err(Rejection::new(
            422,
            "invalid_request",
            format!("This session runs in environment {session_env:?}; a run in it cannot name another ({shown:?})"),
        ))
    }

    /// The environment this run names (`python` when it names none).
    pub fn environment_name(&self) -> &str {
        self.environment.as_deref().unwrap_or(DEFAULT_ENVIRONMENT)
    }
}

/// Why a request is refused: its status, the document's code and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// HTTP status.
    pub status: u16,
    /// The document's code.
    pub code: &'static str,
    /// What is wrong.
    pub message: String,
}

impl Rejection {
    /// A refusal with `status`, `code` and `message`.
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Rejection {
        Rejection {
            status,
            code,
            message: message.into(),
        }
    }

    /// Why the engine gave a run no answer: `503 unavailable` or `500 internal_error`.
    pub fn of_failure(f: &crate::wasm::Failure) -> Rejection {
        match f {
            crate::wasm::Failure::Unavailable(m) => Rejection::new(503, "unavailable", m.clone()),
            crate::wasm::Failure::Crashed(_) | crate::wasm::Failure::Lost(_) => {
                Rejection::new(500, "internal_error", f.to_string())
            }
        }
    }

    /// As an HTTP answer.
    pub fn response(&self) -> Response {
        error(self.status, self.code, &self.message)
    }

    /// As a WebSocket `error` message (the document's `type` and `message`, and the
    /// code the HTTP face would give).
    pub fn message(&self) -> String {
        ws_error(self.code, &self.message)
    }
}

/// A WebSocket `{"type": "error", "code", "message"}`.
pub fn ws_error(code: &str, message: &str) -> String {
    json!({"type": "error", "code": code, "message": message}).to_string()
}

/// Parses and checks an execute request (a session's or not: the daemon checks the
/// environment it names against the session's, and whether it exists and is ready).
///
/// # Errors
/// 415 when not sent as JSON, 400 when the body is no JSON object, 422 when a field is
/// missing or wrong: all `invalid_request`, as the document says.
pub fn parse_execute(req: &Request, limits: Limits) -> Result<Execute, Response> {
    let o = json_object(req)?;
    parse_fields(&o, limits).map_err(|r| r.response())
}

/// The body of a JSON request that may also be empty: its object, or none.
fn optional_object(req: &Request) -> Result<Option<serde_json::Map<String, Value>>, Response> {
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    json_object(req).map(Some)
}

/// The body of a JSON request: sent as `application/json` (else 415), a JSON object
/// (else 400).
fn json_object(req: &Request) -> Result<serde_json::Map<String, Value>, Response> {
    let ct = req.head.header("content-type").unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        return Err(error(
            415,
            "invalid_request",
            "Send the body as Content-Type: application/json",
        ));
    }
    match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(error(
            400,
            "invalid_request",
            "The body must be a JSON object",
        )),
        Err(e) => Err(error(
            400,
            "invalid_request",
            &format!("The body is not JSON: {e}"),
        )),
    }
}

/// A checked `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSession {
    /// The environment its runs use.
    pub environment: String,
    /// Idle time after its last run before it expires.
    pub ttl_secs: u64,
}

/// Parses and checks a session create: no body, or `{"environment", "ttl_secs"}`.
///
/// # Errors
/// 415/400 for a body that is not a JSON object, 422 for a wrong field, 404 for an
/// environment that does not exist.
pub fn parse_new_session(req: &Request) -> Result<NewSession, Response> {
    let Some(o) = optional_object(req)? else {
        return Ok(NewSession {
            environment: DEFAULT_ENVIRONMENT.into(),
            ttl_secs: SESSION_TTL_SECS,
        });
    };
    let environment = match o.get("environment") {
        None | Some(Value::Null) => DEFAULT_ENVIRONMENT.to_string(),
        // Whether it exists is the daemon's to say (404).
        Some(Value::String(e)) => e.clone(),
        Some(_) => {
            return Err(error(
                422,
                "invalid_request",
                "`environment` must be a string",
            ))
        }
    };
    let ttl_secs = match positive(&o, "ttl_secs").map_err(|r| r.response())? {
        None => SESSION_TTL_SECS,
        Some(t) if t <= MAX_SESSION_TTL_SECS => t,
        Some(_) => {
            return Err(error(
                422,
                "invalid_request",
                &format!("`ttl_secs` can be at most {MAX_SESSION_TTL_SECS} (a day)"),
            ))
        }
    };
    Ok(NewSession {
        environment,
        ttl_secs,
    })
}

/// A session's id: a random (version 4) UUID, as the document shows them.
pub fn new_session_id() -> Option<String> {
    let mut b = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b).ok()?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Some(format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    ))
}

/// A time as the document writes it: RFC 3339 in UTC, to the second.
pub fn timestamp(ms: u64) -> String {
    let t = crate::api::sessions::rfc3339(ms);
    format!("{}Z", &t[..19])
}

/// A session as `POST /v1/sessions` answers it.
pub fn session_json(id: &str, environment: &str, ttl_secs: u64, expires_at_ms: u64) -> Value {
    json!({
        "id": id,
        "environment": environment,
        "ttl_secs": ttl_secs,
        "expires_at": timestamp(expires_at_ms),
    })
}

/// The answer for a session that is not the tenant's, has expired, or never was.
pub fn no_session(id: &str) -> Rejection {
    let shown: String = id.chars().take(64).collect();
    Rejection::new(404, "not_found", format!("No such session: {shown}"))
}

/// Checks a WebSocket `execute` message (its `type` already read): the fields of
/// `POST /v1/execute`, `callbacks` and `session_id`.
///
/// # Errors
/// What is wrong, as [`parse_execute`] would say it.
pub fn parse_stream_execute(
    o: &serde_json::Map<String, Value>,
    limits: Limits,
) -> Result<Execute, Rejection> {
    let mut ex = parse_fields(o, limits)?;
    match o.get("session_id") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => ex.session_id = Some(s.clone()),
        Some(_) => {
            return Err(Rejection::new(
                422,
                "invalid_request",
                "`session_id` must be a string",
            ))
        }
    }
    let listed = match o.get("callbacks") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(Rejection::new(
                422,
                "invalid_request",
                "`callbacks` must be an array of {\"name\", \"description\"}",
            ))
        }
    };
    if listed.len() > MAX_LISTED_CALLBACKS {
        return Err(Rejection::new(
            422,
            "invalid_request",
            format!("At most {MAX_LISTED_CALLBACKS} callbacks can be listed"),
        ));
    }
    for cb in listed {
        let name = match cb.get("name") {
            Some(Value::String(n)) => n,
            _ => {
                return Err(Rejection::new(
                    422,
                    "invalid_request",
                    "Each callback needs a `name` (a string)",
                ))
            }
        };
        if !matches!(
            cb.get("description"),
            None | Some(Value::Null | Value::String(_))
        ) {
            return Err(Rejection::new(
                422,
                "invalid_request",
                "A callback's `description` must be a string",
            ));
        }
        if !is_identifier(name) {
            let shown: String = name.chars().take(64).collect();
            return Err(Rejection::new(
                422,
                "invalid_request",
                format!("Callback name {shown:?} is not a Python identifier (letters, digits and _, up to 64, not a keyword, not __dunder__)"),
            ));
        }
        if ex.callbacks.contains(name) {
            return Err(Rejection::new(
                422,
                "invalid_request",
                format!("Callback {name} is listed twice"),
            ));
        }
        ex.callbacks.push(name.clone());
    }
    Ok(ex)
}

/// A name Python code can call: an ASCII identifier that is no keyword.
fn is_identifier(name: &str) -> bool {
    const KEYWORDS: &[&str] = &[
        "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
        "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
        "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise", "return",
        "try", "while", "with", "yield",
    ];
    let mut chars = name.chars();
    name.len() <= 64
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&name)
        // `__builtins__` and its kind are Python's own.
        && !(name.len() > 4 && name.starts_with("__") && name.ends_with("__"))
}

/// The fields both kinds of execute share.
fn parse_fields(o: &serde_json::Map<String, Value>, limits: Limits) -> Result<Execute, Rejection> {
    let code = match o.get("code") {
        Some(Value::String(c)) => c.clone(),
        Some(_) => {
            return Err(Rejection::new(
                422,
                "invalid_request",
                "`code` must be a string",
            ))
        }
        None => return Err(Rejection::new(422, "invalid_request", "`code` is required")),
    };
    let environment = match o.get("environment") {
        None | Some(Value::Null) => None,
        Some(Value::String(e)) => Some(e.clone()),
        Some(_) => {
            return Err(Rejection::new(
                422,
                "invalid_request",
                "`environment` must be a string",
            ))
        }
    };
    let timeout_ms = positive(o, "timeout_secs")?.map_or(limits.timeout_ms, |s| {
        s.saturating_mul(1000).min(limits.timeout_ms)
    });
    let fuel = positive(o, "fuel_limit")?.map_or(limits.fuel, |f| f.min(limits.fuel));
    Ok(Execute {
        code,
        timeout_ms,
        fuel,
        callbacks: Vec::new(),
        environment,
        session_id: None,
        env: None,
    })
}

/// Field `name` as a positive integer, if present: JSON's integers, `20` and `20.0`
/// alike (JSON Schema's reading), one past u64 counted as u64's largest (every use
/// caps it far lower); `null` counts as absent.
fn positive(o: &serde_json::Map<String, Value>, name: &str) -> Result<Option<u64>, Rejection> {
    match o.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(n) => match n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.is_finite() && f.fract() == 0.0 && *f >= 1.0)
                // `as` saturates: 1e300 is u64::MAX.
                .map(|f| f as u64)
        }) {
            Some(n) if n > 0 => Ok(Some(n)),
            _ => Err(Rejection::new(
                422,
                "invalid_request",
                format!("`{name}` must be a positive integer"),
            )),
        },
    }
}

/// The largest message sent to a WebSocket client: what the `websockets` package,
/// which the document's example client uses, takes by default (`max_size`, 1 MiB);
/// past it that client closes the connection (1009).
pub const WS_MESSAGE_BYTES: usize = 1 << 20;

/// What a stream cut to fit a message ends with.
const WS_CUT_NOTE: &str =
    "\n[output cut to fit a 1 MiB WebSocket message; POST /v1/execute returns it whole]\n";

/// The bytes `c` takes in a JSON string (serde_json's escapes).
fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if c < ' ' => 6,
        c => c.len_utf8(),
    }
}

/// The longest start of `s` that takes at most `room` bytes in a JSON string, and
/// whether that is all of it.
fn json_prefix(s: &str, room: usize) -> (&str, bool) {
    let mut used = 0;
    for (i, c) in s.char_indices() {
        used += json_char_len(c);
        if used > room {
            return (&s[..i], false);
        }
    }
    (s, true)
}

/// A run's `completed` message for a WebSocket client, within [`WS_MESSAGE_BYTES`]:
/// when its output would not fit, `stdout` and `stderr` are cut (each keeping at
/// least half the room, or all it needs) and say so.
pub fn ws_completed(a: &crate::wasm::RunAnswer) -> String {
    let mut v = run_json(a);
    v["type"] = json!("completed");
    let whole = v.to_string();
    if whole.len() <= WS_MESSAGE_BYTES {
        return whole;
    }
    v["stdout"] = json!("");
    v["stderr"] = json!("");
    let note = WS_CUT_NOTE.chars().map(json_char_len).sum::<usize>();
    let room = WS_MESSAGE_BYTES.saturating_sub(v.to_string().len() + 2 * note);
    let need = |s: &str| s.chars().map(json_char_len).sum::<usize>();
    let (out_need, err_need) = (need(&a.stdout), need(&a.stderr));
    let err_room = err_need.min(room / 2).max(room.saturating_sub(out_need));
    let out_room = room.saturating_sub(err_room.min(err_need));
    for (key, text, r) in [
        ("stdout", &a.stdout, out_room),
        ("stderr", &a.stderr, err_room),
    ] {
        let (kept, all) = json_prefix(text, r);
        v[key] = json!(if all {
            kept.to_string()
        } else {
            format!("{kept}{WS_CUT_NOTE}")
        });
    }
    v.to_string()
}

/// A finished run as the document's response: `stdout`, `stderr`, `compute_units`,
/// `status`, and `error` when it did not succeed.
pub fn run_json(a: &crate::wasm::RunAnswer) -> Value {
    let mut v = json!({
        "stdout": a.stdout,
        "stderr": a.stderr,
        "compute_units": a.compute_units,
        "status": a.status,
    });
    if a.status != "success" {
        v["error"] = json!(a.error.clone().unwrap_or_default());
    }
    if !a.unsaved_variables.is_empty() {
        v["unsaved_variables"] = json!(a.unsaved_variables);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_completed_message_fits_what_the_documents_client_takes() {
        let answer = |out: String, err: String| crate::wasm::RunAnswer {
            status: "success".into(),
            stdout: out,
            stderr: err,
            compute_units: 7,
            error: None,
            state: None,
            unsaved_variables: Vec::new(),
        };
        // Small: as run_json, whole.
        let a = answer("hi\n".into(), String::new());
        let m: Value = serde_json::from_str(&ws_completed(&a)).unwrap();
        assert_eq!(m["stdout"], "hi\n");
        assert_eq!(m["type"], "completed");
        // At the bound: whole; one byte more: cut, and said so.
        let base = ws_completed(&answer(String::new(), String::new())).len();
        let fits = "x".repeat(WS_MESSAGE_BYTES - base);
        assert_eq!(
            ws_completed(&answer(fits.clone(), String::new())).len(),
            WS_MESSAGE_BYTES
        );
        let over = ws_completed(&answer(format!("{fits}y"), String::new()));
        assert!(over.len() <= WS_MESSAGE_BYTES, "{}", over.len());
        let m: Value = serde_json::from_str(&over).unwrap();
        assert!(m["stdout"].as_str().unwrap().ends_with(WS_CUT_NOTE));
        // Output that grows when escaped (control bytes are six), many-byte
        // characters, both streams: within the bound, each keeps its share.
        for (out, err) in [
            ("\u{1}".repeat(1 << 20), "é".repeat(300_000)),
            ("✓".repeat(1 << 20), "e".repeat(10)),
            ("\"".repeat(600_000), "\n".repeat(600_000)),
        ] {
            let msg = ws_completed(&answer(out.clone(), err.clone()));
            assert!(msg.len() <= WS_MESSAGE_BYTES, "{}", msg.len());
            let m: Value = serde_json::from_str(&msg).unwrap();
            let (o, e) = (m["stdout"].as_str().unwrap(), m["stderr"].as_str().unwrap());
            assert!(out.starts_with(o.trim_end_matches(WS_CUT_NOTE)));
            assert!(err.starts_with(e.trim_end_matches(WS_CUT_NOTE)));
            assert!(
                msg.len() > WS_MESSAGE_BYTES - 256,
                "room left unused: {}",
                msg.len()
            );
            if err.len() < 100 {
                assert_eq!(e, err, "a short stream is kept whole");
            }
        }
    }

    fn req(ct: &str, body: &str) -> Request {
        let head = format!("POST /v1/execute HTTP/1.1\r\nHost: x\r\nContent-Type: {ct}\r\n\r\n");
        Request {
            head: crate::http::parse::parse_head(head.as_bytes()).unwrap(),
            body: body.as_bytes().to_vec(),
            tenant: "t".into(),
            params: Default::default(),
        }
    }

    const L: Limits = Limits {
        timeout_ms: 30_000,
        fuel: 1_000_000,
    };

    fn code_of(r: Response) -> (u16, String) {
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
        (r.status, v["error"]["code"].as_str().unwrap().to_string())
    }

    #[test]
    fn test_execute_requests_are_checked_and_capped() {
        let e = parse_execute(&req("application/json", r#"{"code": "print(1)"}"#), L).unwrap();
        assert_eq!((e.timeout_ms, e.fuel), (30_000, 1_000_000));
        let e = parse_execute(
            &req(
                "application/json; charset=utf-8",
                r#"{"code": "x", "timeout_secs": 2, "fuel_limit": 5, "environment": "python"}"#,
            ),
            L,
        )
        .unwrap();
        assert_eq!((e.timeout_ms, e.fuel), (2_000, 5));
        // A request may lower its limits, never raise them.
        let e = parse_execute(
            &req(
                "application/json",
                r#"{"code": "x", "timeout_secs": 3.0, "fuel_limit": null, "environment": null}"#,
            ),
            L,
        )
        .unwrap();
        assert_eq!((e.timeout_ms, e.fuel), (3_000, 1_000_000));
        let e = parse_execute(
            &req(
                "application/json",
                r#"{"code": "x", "timeout_secs": 31, "fuel_limit": 1000001}"#,
            ),
            L,
        )
        .unwrap();
        assert_eq!((e.timeout_ms, e.fuel), (30_000, 1_000_000));
        // An integer past u64 is still a positive integer: capped like any other.
        let e = parse_execute(
            &req(
                "application/json",
                r#"{"code": "x", "timeout_secs": 740590284250017374928896, "fuel_limit": 1e300}"#,
            ),
            L,
        )
        .unwrap();
        assert_eq!((e.timeout_ms, e.fuel), (30_000, 1_000_000));
        for (ct, body, want) in [
            ("text/plain", r#"{"code": "x"}"#, (415, "invalid_request")),
            ("application/json", "{", (400, "invalid_request")),
            ("application/json", "[1]", (400, "invalid_request")),
            ("application/json", "{}", (422, "invalid_request")),
            (
                "application/json",
                r#"{"code": 1}"#,
                (422, "invalid_request"),
            ),
            (
                "application/json",
                r#"{"code": "x", "timeout_secs": 0}"#,
                (422, "invalid_request"),
            ),
            (
                "application/json",
                r#"{"code": "x", "fuel_limit": -1}"#,
                (422, "invalid_request"),
            ),
            (
                "application/json",
                r#"{"code": "x", "fuel_limit": 1.5}"#,
                (422, "invalid_request"),
            ),
            (
                "application/json",
                r#"{"code": "x", "environment": 3}"#,
                (422, "invalid_request"),
            ),
        ] {
            let r = parse_execute(&req(ct, body), L).unwrap_err();
            assert_eq!(code_of(r), (want.0, want.1.to_string()), "{ct} {body}");
        }
        // Whether an environment exists is the daemon's to say (404, or 409 while it
        // builds): the face only reads its name.
        let ex = parse_execute(
            &req(
                "application/json",
                r#"{"code": "x", "environment": "nope"}"#,
            ),
            L,
        )
        .unwrap();
        assert_eq!(ex.environment_name(), "nope");
        let ex = parse_execute(&req("application/json", r#"{"code": "x"}"#), L).unwrap();
        assert_eq!(ex.environment_name(), "python");
    }

    #[test]
    fn test_admission_answers_take_this_faces_codes() {
        let r401 = || Response::error(401, "unauthorized", None);
        assert_eq!(code_of(reshape(r401(), None)), (401, "missing_auth".into()));
        assert_eq!(
            code_of(reshape(r401(), Some("Basic abc"))),
            (401, "invalid_auth".into())
        );
        assert_eq!(
            code_of(reshape(r401(), Some("Bearer eryx_wrong"))),
            (401, "invalid_key".into())
        );
        let r = reshape(
            Response::error(429, "rate_limited", None).with_header("Retry-After", "7"),
            None,
        );
        assert!(r
            .headers
            .iter()
            .any(|(n, v)| *n == "Retry-After" && v == "7"));
        assert_eq!(code_of(r), (429, "rate_limit_exceeded".into()));
        let (r, _) = (resolve("GET", "/v1/execute").unwrap_err(), ());
        assert_eq!(code_of(r), (405, "invalid_request".into()));
        assert_eq!(
            code_of(resolve("POST", "/v1/nothing").unwrap_err()),
            (404, "not_found".into())
        );
    }
}
