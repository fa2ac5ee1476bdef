//! The WBX face (`/wbx`): `wbx-sandbox-api.txt`, field for field, at its own base path,
//! so a client written for that document works with base URL `http://HOST:8090/wbx`.
//! Thin, as every face: it parses and validates requests into operations
//! ([`sandboxes::Op`]) the daemon's long-lived sandboxes carry out, and shapes their
//! answers. Its errors are that document's: `{"error": "message"}`, the message naming
//! the parameter or the limit.
//!
//! Built so far: sandboxes (create, list, get, delete, timeout, pause, resume,
//! metrics), templates, commands (`exec`, `exec/stream`), background processes and
//! terminals (`process…`), `env`, files (`files?path=` transfer, `fs/list`,
//! `fs/stat`, `fs/mkdir`, `fs/move`, `fs/remove`, `fs/watch`), public URLs,
//! network allowlists, background jobs (`jobs`: with waiting, the log digest,
//! `job.finished` webhooks, `max_cost` and budgets), batches (`batches`) and compute
//! classes (`compute`). WASI jobs are absent (their fields are refused by name).

pub mod batches;
pub mod compute;
pub mod files;
pub mod jobs;
pub mod processes;
pub mod routes;
pub mod sandboxes;
pub mod terminal;

use crate::http::Response;

/// The face's base path.
pub const BASE: &str = "/wbx";

/// `{"error": message}` with `status`.
pub fn error(status: u16, message: &str) -> Response {
    Response::json(status, &serde_json::json!({ "error": message }))
}

/// An answer made in the isobox face's error shape (`{"error": code, "detail": …}`: the
/// HTTP layer and admission make those) in this face's: the detail, or the code in
/// words. Headers (`Retry-After`, `WWW-Authenticate`) are kept; any other response
/// passes unchanged.
pub fn reshape(resp: Response) -> Response {
    if resp.status < 400 {
        return resp;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&resp.body) else {
        return resp;
    };
    let Some(code) = v["error"].as_str() else {
        return resp;
    };
    let message = match (code, v["detail"].as_str()) {
        ("unauthorized", _) => "missing or invalid API key".to_string(),
        ("rate_limited", _) => "rate limit reached: too many requests from this client; retry after the Retry-After seconds".to_string(),
        ("not_found", _) => "no such endpoint".to_string(),
        ("method_not_allowed", _) => "method not allowed on this endpoint".to_string(),
        (_, Some(d)) => d.to_string(),
        (c, None) => c.replace('_', " "),
    };
    let mut out = error(resp.status, &message);
    out.headers.extend(
        resp.headers
            .into_iter()
            .filter(|(n, _)| !n.eq_ignore_ascii_case("content-type")),
    );
    out
}

/// RFC 3339 UTC to the second, as the document writes times, from Unix milliseconds.
pub fn timestamp(ms: u64) -> String {
    let t = jiff::civil::DateTime::constant(1970, 1, 1, 0, 0, 0, 0)
        .saturating_add(std::time::Duration::from_millis(ms));
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        t.month(),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_isobox_errors_take_this_faces_shape() {
        let r = reshape(
            Response::error(401, "unauthorized", None).with_header("WWW-Authenticate", "Bearer"),
        );
        assert_eq!(r.status, 401);
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": "missing or invalid API key"})
        );
        assert!(r
            .headers
            .iter()
            .any(|(n, v)| *n == "WWW-Authenticate" && v == "Bearer"));
        let r = reshape(Response::error(
            400,
            "bad_request",
            Some("HTTP/1.1 requires exactly one Host header"),
        ));
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["error"], "HTTP/1.1 requires exactly one Host header");
        assert_eq!(reshape(Response::no_content()).status, 204);
    }

    #[test]
    fn test_timestamps_are_rfc3339_seconds() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(timestamp(1_794_072_303_999), "2026-11-07T17:25:03Z");
    }
}
