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

/// The web UI: one page and its scripts, all built into the binary (no CDN; works
/// offline).
pub const UI_HTML: &str = include_str!("../../ui/index.html");

include!(concat!(env!("OUT_DIR"), "/ui_vendor.rs"));

/// The page's own scripts, then what `ui/vendor` fetched from npm at build time:
/// (name under `/ui/`, content type, bytes).
fn ui_files() -> impl Iterator<Item = (&'static str, &'static str, &'static [u8])> {
    const JS: &str = "text/javascript; charset=utf-8";
    [
        ("app.js", JS, include_bytes!("../../ui/app.js").as_slice()),
        (
            "console.js",
            JS,
            include_bytes!("../../ui/console.js").as_slice(),
        ),
    ]
    .into_iter()
    .chain(UI_VENDOR.iter().copied())
}

/// The policy of the page and its files: scripts only from this origin (no inline
/// script), connections anywhere (the browser-direct chat reaches the model endpoint the
/// user types in), artifacts only in sandboxed frames.
const UI_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
     img-src data: blob:; connect-src *; frame-src blob: data:; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

fn with_ui_headers(resp: crate::http::Response) -> crate::http::Response {
    resp.with_header("Content-Security-Policy", UI_CSP)
        .with_header("X-Content-Type-Options", "nosniff")
        .with_header("Referrer-Policy", "no-referrer")
        .with_header("Cache-Control", "no-cache")
}

/// `GET /`: the UI.
pub fn ui() -> crate::http::Response {
    with_ui_headers(crate::http::Response::bytes(
        200,
        "text/html; charset=utf-8",
        UI_HTML.as_bytes().to_vec(),
    ))
}

/// `GET /ui/{file}`: one of the page's scripts or styles; 404 for any other name (a
/// build without `make ui-vendor` has no terminal or editor files, and says so).
pub fn ui_file(name: &str) -> crate::http::Response {
    match ui_files().find(|(n, _, _)| *n == name) {
        Some((_, ctype, bytes)) => {
            with_ui_headers(crate::http::Response::bytes(200, ctype, bytes.to_vec()))
        }
        None if crate::api::docs::VENDOR_NAMES.contains(&name) => crate::http::Response::error(
            404,
            "not_found",
            Some(&format!(
                "{name} was not built into this isoboxd (run `make ui-vendor`, then build again)"
            )),
        ),
        None => crate::http::Response::error(404, "not_found", Some("no such UI file")),
    }
}

/// The vendored files' names, whether this build has them or not.
pub const VENDOR_NAMES: &[&str] = &["xterm.js", "xterm.css", "addon-fit.js", "editor.js"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_scripts_it_serves() {
        // Every script and stylesheet the page names is one /ui/ serves (or a vendored
        // one), and no script is inline.
        for name in [
            "app.js",
            "console.js",
            "xterm.js",
            "addon-fit.js",
            "xterm.css",
            "editor.js",
        ] {
            assert!(UI_HTML.contains(&format!("\"/ui/{name}\"")), "{name}");
            assert!(
                ui_files().any(|(n, _, _)| n == name) || VENDOR_NAMES.contains(&name),
                "{name}"
            );
        }
        assert!(!UI_HTML.contains("<script>"), "an inline script");
        assert_eq!(UI_HTML.matches("<script").count(), 5);
        assert_eq!(ui_file("app.js").status, 200);
        assert_eq!(ui_file("../index.html").status, 404);
        assert_eq!(ui_file("").status, 404);
    }
}
