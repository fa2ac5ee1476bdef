//! `GET /llms.txt` and `GET /openapi.yaml`: the API as it exists, built into the binary.

/// Our own description of the API, in the spec's llms.txt format.
pub const LLMS_TXT: &str = include_str!("../../docs/llms.txt");

/// OpenAPI 3.1 for every route the router knows.
pub const OPENAPI_YAML: &str = include_str!("../../docs/openapi.yaml");
