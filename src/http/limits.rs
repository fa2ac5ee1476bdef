//! Every bound of the HTTP layer, named.

/// A request head (request line + headers) larger than this is answered 431.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// A request target longer than this is answered 414.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// More header fields than this is answered 431.
pub const MAX_HEADERS: usize = 100;
/// Body cap of `POST /execute` (the spec's 256 KiB; over it: 400 invalid_json).
pub const EXECUTE_BODY_BYTES: usize = 256 * 1024;
/// Body cap of every route the spec says nothing about (over it: 413).
pub const DEFAULT_BODY_BYTES: usize = 64 * 1024;
/// Bodies whose route takes more than this are "large" (WBX jobs with a WebAssembly
/// module, batches): held whole in memory until parsed, so all of them together are
/// bounded by [`LARGE_BODIES_BUDGET`].
pub const LARGE_BODY_BYTES: usize = 2 * 1024 * 1024;
/// Caps of the large bodies being read at once, all connections together (four of the
/// largest, 17 MiB job bodies); past it a new one is refused with 503 and
/// `Retry-After: 1` before any of it is read.
pub const LARGE_BODIES_BUDGET: usize = 72 * 1024 * 1024;
/// A chunk-size line's extension longer than this is a 400.
pub const MAX_CHUNK_EXT_BYTES: usize = 4 * 1024;
/// Trailer section bytes allowed after the last chunk.
pub const MAX_TRAILER_BYTES: usize = 16 * 1024;
/// Bytes read ahead of the request being served (pipelined requests wait here).
pub const MAX_READ_AHEAD_BYTES: usize = 64 * 1024;
/// Bytes queued for a client before the daemon stops producing more for it.
pub const MAX_WRITE_BUFFER_BYTES: usize = 256 * 1024;
/// Body cap of `PUT /v1/sessions/{id}/fs` (the spec's 16 MiB; streamed to disk, never
/// held whole).
pub const UPLOAD_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Body cap of `PUT /v1/memory/{namespace}/{key}`: the largest value (1 MiB).
pub const KV_VALUE_BODY_BYTES: usize = 1024 * 1024;
/// Body cap of `POST /v1/agent` (the spec's 1 MiB: the whole conversation so far).
pub const AGENT_BODY_BYTES: usize = 1024 * 1024;
