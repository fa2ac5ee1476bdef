//! The isobox face's route table: one row per route, holding its pattern, methods,
//! body cap, admission class and handler. The connection code resolves a request's
//! row with `router::resolve`, asks admission with the row's class, reads the body up
//! to the row's cap, and calls the row's handler with the path's parameters in
//! `Request::params`.

use super::{agent, docs, execute, health, memory, metrics, runs, sessions, volumes, Action, App};
use crate::admission::Class;
use crate::http::limits::{
    AGENT_BODY_BYTES, DEFAULT_BODY_BYTES, EXECUTE_BODY_BYTES, KV_VALUE_BODY_BYTES,
    UPLOAD_BODY_BYTES,
};
use crate::http::{Request, Response};
use crate::router::Row;

/// Which route a request is on (what the connection code and tests tell apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// `GET /`: the web UI.
    Ui,
    /// `GET /ui/{file}`: the UI's scripts and styles.
    UiFile,
    /// `GET /healthz`
    Healthz,
    /// `GET /readyz`
    Readyz,
    /// `GET /metrics`: Prometheus text.
    Metrics,
    /// `GET /runtimes`
    Runtimes,
    /// `GET /llms.txt`
    LlmsTxt,
    /// `GET /openapi.yaml`
    OpenApi,
    /// `POST /execute`
    Execute,
    /// `GET /v1/runs/{id}`: a recorded run's state and result.
    RunGet,
    /// `GET /v1/runs/{id}/events`: a recorded run's events, resumed.
    RunEvents,
    /// `POST /v1/runs/{id}/cancel`
    RunCancel,
    /// `POST /v1/sessions`
    SessionCreate,
    /// `DELETE /v1/sessions/{id}`
    Session,
    /// `POST /v1/sessions/{id}/exec`
    SessionExec,
    /// `GET /v1/sessions/{id}/fs`: a file or a directory (listing or zip).
    SessionFsGet,
    /// `PUT /v1/sessions/{id}/fs`: an upload, streamed to disk from its head on.
    SessionFsPut,
    /// `DELETE /v1/sessions/{id}/fs`
    SessionFsDelete,
    /// `GET /v1/memory/{namespace}`: list keys.
    MemoryList,
    /// `GET`, `PUT`, `DELETE /v1/memory/{namespace}/{key}` (the key may contain `/`).
    MemoryKey,
    /// `GET /v1/volumes`
    VolumeList,
    /// `POST /v1/volumes`
    VolumeCreate,
    /// `GET`, `DELETE /v1/volumes/{id}`
    Volume,
    /// `GET /v1/agent`: is the agent on, and with which model.
    AgentInfo,
    /// `POST /v1/agent`: the tool-calling loop.
    Agent,
}

/// A handler of a complete request.
pub type HandlerFn = fn(&mut App, &Request) -> Action;

/// What answers a route.
#[derive(Clone, Copy)]
pub enum Handler {
    /// Called with the whole request once its body is read.
    Request(HandlerFn),
    /// An upload: taken over at its head (`sessions::upload_begin`), the body streamed
    /// to disk as it arrives.
    Upload,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Handler::Request(_) => "Request",
            Handler::Upload => "Upload",
        })
    }
}

/// Everything the face says about one route.
#[derive(Debug, Clone, Copy)]
pub struct Spec {
    /// Which route.
    pub id: Route,
    /// Its path pattern (the `route` label of `/metrics`).
    pub pattern: &'static str,
    /// Largest body accepted.
    pub body_cap: usize,
    /// How admission treats it.
    pub class: Class,
    /// What answers it.
    pub handler: Handler,
}

impl Spec {
    /// The answer to a body over the cap.
    pub fn over_cap(&self) -> Response {
        match self.id {
            // The spec: a body over 256 KiB on /execute is `invalid_json`.
            Route::Execute | Route::SessionExec => {
                Response::error(400, "invalid_json", Some("request body exceeds 256 KiB"))
            }
            _ => Response::error(
                413,
                "payload_too_large",
                Some(&format!(
                    "request body exceeds {} KiB",
                    self.body_cap / 1024
                )),
            ),
        }
    }
}

const GET: &[&str] = &["GET", "HEAD"];
const POST: &[&str] = &["POST"];
const PUT: &[&str] = &["PUT"];
const DELETE: &[&str] = &["DELETE"];

const fn row(
    pattern: &'static str,
    methods: &'static [&'static str],
    id: Route,
    class: Class,
    body_cap: usize,
    handler: Handler,
) -> Row<Spec> {
    Row {
        pattern,
        methods,
        route: Spec {
            id,
            pattern,
            body_cap,
            class,
            handler,
        },
    }
}

use Class::{Agent, Keyed, Memory, MemoryStarts, Open, Starts};
use Handler::Request as H;

/// Every route of the isobox face, in the order `Allow` lists a path's methods. A path's
/// rows share the body cap it has always had, whatever the method (a body nobody reads
/// is read and dropped up to it).
#[rustfmt::skip]
pub static ROUTES: &[Row<Spec>] = &[
    row("/", GET, Route::Ui, Open, DEFAULT_BODY_BYTES, H(|_, _| Action::Respond(docs::ui()))),
    row("/ui/{file}", GET, Route::UiFile, Open, DEFAULT_BODY_BYTES, H(|_, req| Action::Respond(docs::ui_file(req.params.get("file").unwrap_or(""))))),
    row("/healthz", GET, Route::Healthz, Open, DEFAULT_BODY_BYTES, H(|app, _| Action::Respond(health::healthz(app)))),
    row("/readyz", GET, Route::Readyz, Open, DEFAULT_BODY_BYTES, H(|app, _| Action::Respond(health::readyz(app)))),
    row("/metrics", GET, Route::Metrics, Class::Metrics, DEFAULT_BODY_BYTES, H(|app, _| Action::Respond(metrics::metrics(app)))),
    row("/runtimes", GET, Route::Runtimes, Keyed, DEFAULT_BODY_BYTES, H(|app, _| Action::Respond(health::runtimes(app)))),
    row("/llms.txt", GET, Route::LlmsTxt, Open, DEFAULT_BODY_BYTES, H(|_, _| Action::Respond(docs::llms_txt()))),
    row("/openapi.yaml", GET, Route::OpenApi, Open, DEFAULT_BODY_BYTES, H(|_, _| Action::Respond(docs::openapi_yaml()))),
    row("/execute", POST, Route::Execute, Starts, EXECUTE_BODY_BYTES, H(execute::handle)),
    row("/v1/runs/{id}", GET, Route::RunGet, Keyed, DEFAULT_BODY_BYTES, H(runs::get)),
    row("/v1/runs/{id}/events", GET, Route::RunEvents, Keyed, DEFAULT_BODY_BYTES, H(runs::events)),
    row("/v1/runs/{id}/cancel", POST, Route::RunCancel, Keyed, DEFAULT_BODY_BYTES, H(runs::cancel)),
    row("/v1/sessions", POST, Route::SessionCreate, Starts, DEFAULT_BODY_BYTES, H(sessions::create)),
    row("/v1/sessions/{id}", DELETE, Route::Session, Keyed, DEFAULT_BODY_BYTES, H(sessions::delete)),
    row("/v1/sessions/{id}/exec", POST, Route::SessionExec, Starts, EXECUTE_BODY_BYTES, H(sessions::exec)),
    row("/v1/sessions/{id}/fs", GET, Route::SessionFsGet, Keyed, UPLOAD_BODY_BYTES, H(sessions::fs_get)),
    row("/v1/sessions/{id}/fs", PUT, Route::SessionFsPut, Keyed, UPLOAD_BODY_BYTES, Handler::Upload),
    row("/v1/sessions/{id}/fs", DELETE, Route::SessionFsDelete, Keyed, UPLOAD_BODY_BYTES, H(sessions::fs_delete)),
    row("/v1/memory/{namespace}", GET, Route::MemoryList, Memory, DEFAULT_BODY_BYTES, H(memory::list)),
    row("/v1/memory/{namespace}/{key*}", &["GET", "HEAD", "PUT", "DELETE"], Route::MemoryKey, Memory, KV_VALUE_BODY_BYTES, H(memory::key)),
    row("/v1/volumes", GET, Route::VolumeList, Memory, DEFAULT_BODY_BYTES, H(volumes::collection)),
    row("/v1/volumes", POST, Route::VolumeCreate, MemoryStarts, DEFAULT_BODY_BYTES, H(volumes::collection)),
    row("/v1/volumes/{id}", &["GET", "HEAD", "DELETE"], Route::Volume, Memory, DEFAULT_BODY_BYTES, H(volumes::item)),
    // `GET /v1/agent` is the spec's availability probe: no key.
    row("/v1/agent", GET, Route::AgentInfo, Open, AGENT_BODY_BYTES, H(agent::handle)),
    row("/v1/agent", POST, Route::Agent, Agent, AGENT_BODY_BYTES, H(agent::handle)),
];

/// Every path of the face as OpenAPI writes it (`{key}`, not `{key*}`) with its
/// methods as `Allow` lists them, for the OpenAPI coverage test and docs.
pub fn paths() -> Vec<(String, String)> {
    crate::router::paths(ROUTES)
        .into_iter()
        .map(|(p, m)| (p.replace("*}", "}"), m.join(", ")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::{resolve, RouteError};

    fn id(method: &str, path: &str) -> Result<Route, RouteError> {
        resolve(ROUTES, method, path).map(|(row, _)| row.route.id)
    }

    #[test]
    fn test_routes_and_methods() {
        assert_eq!(id("GET", "/healthz"), Ok(Route::Healthz));
        assert_eq!(id("HEAD", "/healthz"), Ok(Route::Healthz));
        assert_eq!(id("POST", "/execute"), Ok(Route::Execute));
        assert_eq!(
            id("GET", "/execute"),
            Err(RouteError::MethodNotAllowed("POST".into()))
        );
        assert_eq!(
            id("get", "/healthz"),
            Err(RouteError::MethodNotAllowed("GET, HEAD".into()))
        );
        assert_eq!(id("GET", "/nope"), Err(RouteError::NotFound));
        assert_eq!(id("GET", "/healthz/"), Err(RouteError::NotFound));
    }

    #[test]
    fn test_every_path_routes() {
        for (p, methods) in paths() {
            let p = p
                .replace("{id}", "0123abcd")
                .replace("{namespace}", "ns")
                .replace("{key}", "a/b");
            for m in methods.split(", ") {
                assert!(id(m, &p).is_ok(), "{m} {p}");
            }
        }
        assert!(paths().contains(&(
            "/v1/memory/{namespace}/{key}".to_string(),
            "GET, HEAD, PUT, DELETE".to_string()
        )));
    }

    #[test]
    fn test_allow_lists_are_those_of_before() {
        // The Allow values the face has always sent, one per path.
        for (path, allow) in [
            ("/", "GET, HEAD"),
            ("/execute", "POST"),
            ("/v1/sessions", "POST"),
            ("/v1/sessions/x", "DELETE"),
            ("/v1/sessions/x/exec", "POST"),
            ("/v1/sessions/x/fs", "GET, HEAD, PUT, DELETE"),
            ("/v1/memory/ns", "GET, HEAD"),
            ("/v1/memory/ns/k", "GET, HEAD, PUT, DELETE"),
            ("/v1/volumes", "GET, HEAD, POST"),
            ("/v1/volumes/v", "GET, HEAD, DELETE"),
            ("/v1/agent", "GET, HEAD, POST"),
        ] {
            assert_eq!(
                id("PATCH", path),
                Err(RouteError::MethodNotAllowed(allow.into())),
                "{path}"
            );
        }
    }

    #[test]
    fn test_session_and_memory_paths_carry_their_parameters() {
        let (row, p) = resolve(ROUTES, "PUT", "/v1/sessions/ab/fs").unwrap();
        assert_eq!(row.route.id, Route::SessionFsPut);
        assert_eq!(p.get("id"), Some("ab"));
        assert!(matches!(row.route.handler, Handler::Upload));
        assert_eq!(row.route.body_cap, UPLOAD_BODY_BYTES);
        let (row, p) = resolve(ROUTES, "GET", "/v1/memory/f/a/b").unwrap();
        assert_eq!(row.route.id, Route::MemoryKey);
        assert_eq!((p.get("namespace"), p.get("key")), (Some("f"), Some("a/b")));
        assert_eq!(
            id("GET", "/v1/sessions/ab"),
            Err(RouteError::MethodNotAllowed("DELETE".into()))
        );
        assert_eq!(id("GET", "/v1/sessions/"), Err(RouteError::NotFound));
        assert_eq!(id("GET", "/v1/volumes/v1/x"), Err(RouteError::NotFound));
        assert_eq!(
            id("PUT", "/v1/memory/f"),
            Err(RouteError::MethodNotAllowed("GET, HEAD".into()))
        );
    }

    #[test]
    fn test_classes_and_caps() {
        let spec = |m: &str, p: &str| resolve(ROUTES, m, p).unwrap().0.route;
        assert_eq!(spec("GET", "/v1/agent").class, Class::Open);
        assert_eq!(spec("POST", "/v1/agent").class, Class::Agent);
        assert_eq!(spec("POST", "/v1/volumes").class, Class::MemoryStarts);
        assert_eq!(spec("GET", "/v1/volumes").class, Class::Memory);
        assert_eq!(spec("POST", "/execute").body_cap, EXECUTE_BODY_BYTES);
        assert_eq!(spec("POST", "/execute").over_cap().status, 400);
        assert_eq!(spec("PUT", "/v1/memory/a/b").over_cap().status, 413);
        // Every method of a path has the path's cap, as before the table.
        for (m, p, cap) in [
            ("GET", "/v1/sessions/x/fs", UPLOAD_BODY_BYTES),
            ("DELETE", "/v1/sessions/x/fs", UPLOAD_BODY_BYTES),
            ("PUT", "/v1/sessions/x/fs", UPLOAD_BODY_BYTES),
            ("GET", "/v1/agent", AGENT_BODY_BYTES),
            ("POST", "/v1/agent", AGENT_BODY_BYTES),
            ("DELETE", "/v1/memory/a/b", KV_VALUE_BODY_BYTES),
            ("POST", "/v1/sessions/x/exec", EXECUTE_BODY_BYTES),
            ("GET", "/healthz", DEFAULT_BODY_BYTES),
            ("POST", "/v1/volumes", DEFAULT_BODY_BYTES),
        ] {
            assert_eq!(spec(m, p).body_cap, cap, "{m} {p}");
        }
    }
}
