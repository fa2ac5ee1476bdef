//! `GET /llms.txt` and `GET /openapi.yaml`: the API as it exists, built into the binary.

/// Our own description of the API, in the spec's llms.txt format.
pub const LLMS_TXT: &str = include_str!("../../docs/llms.txt");

/// OpenAPI 3.1 for every route the router knows.
pub const OPENAPI_YAML: &str = include_str!("../../docs/openapi.yaml");

/// `GET /llms.txt`.
pub fn llms_txt() -> crate::http::Response {
    crate::http::Response::bytes(
        200,
        "text/plain; charset=utf-8",
        LLMS_TXT.as_bytes().to_vec(),
    )
}

/// `GET /openapi.yaml`.
pub fn openapi_yaml() -> crate::http::Response {
    crate::http::Response::bytes(200, "application/yaml", OPENAPI_YAML.as_bytes().to_vec())
}

/// The web UI: one self-contained page (no CDN; works offline).
pub const UI_HTML: &str = include_str!("../../ui/index.html");

/// `GET /`: the UI, with a policy that lets it reach only this origin (and, for the
/// browser-direct chat, the model endpoint the user types in) and shows artifacts only
/// in sandboxed frames.
pub fn ui() -> crate::http::Response {
    crate::http::Response::bytes(200, "text/html; charset=utf-8", UI_HTML.as_bytes().to_vec())
        .with_header(
            "Content-Security-Policy",
            "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
             img-src data: blob:; connect-src *; frame-src blob: data:; \
             base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        )
        .with_header("X-Content-Type-Options", "nosniff")
        .with_header("Referrer-Policy", "no-referrer")
        .with_header("Cache-Control", "no-cache")
}
