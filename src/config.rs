//! Configuration: `ISOBOX_*` environment variables, overridden by command-line flags.
//!
//! Loaded once in `main` and passed down by reference. Every setting is one field of
//! `Args`: its attribute holds its flag, its variable and its default, its doc comment
//! is its line in `isoboxd --help`. clap reads the command line and the environment (a
//! flag beats its variable, which beats the default); [`Config::load`] moves the parsed
//! values into [`Config`] and checks them with [`Config::validate`].
//!
//! It stays one file: the settings, their conversion into `Config` and their checks are
//! one list read top to bottom, each setting written once.

use std::ffi::{OsStr, OsString};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use clap::builder::TypedValueParser;
use clap::{CommandFactory, FromArgMatches};

/// A configuration error, naming the setting.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value did not parse or is out of range.
    #[error("invalid value {value:?} for {name}: {why}")]
    Invalid {
        /// The flag or variable.
        name: String,
        /// What was given.
        value: String,
        /// Why it was refused.
        why: String,
    },
    /// What clap refused (an unknown flag, a missing value, a value that does not
    /// parse, named with its flag and its variable), or the `--help` or `--version` it
    /// answers: [`clap::Error::exit`] prints either where it belongs and exits with
    /// its code (2 for an error, 0 for help and version).
    #[error("{}", .0.to_string().trim_end())]
    Args(#[from] clap::Error),
}

/// Every setting isoboxd reads: its flag (from the field's name), its `ISOBOX_*`
/// variable, its default, and its `--help` line (the doc comment).
///
/// Each field's `Value` parser makes all of its value, so that clap's own readings of
/// a field's type do not apply: `std::option::Option`, `std::vec::Vec` and
/// `std::primitive::bool` are spelled out because clap would take a bare `Option` for
/// a setting that may be absent, a `Vec` for a flag given once per item and a `bool`
/// for a flag without a value. A setting without a default has `default_value = ""`
/// (hidden in `--help`, whose line says what unset means): whether from a flag, the
/// environment or the default, the empty value is the default, as it always was.
#[derive(clap::Parser)]
#[command(
    name = "isoboxd",
    version = crate::VERSION,
    about = "run untrusted code in gVisor sandboxes over HTTP",
    // Not the doc comment above, which is for this file's readers.
    long_about = None,
    after_help = "Every flag can also be set by its environment variable; flags win.\n\n`isoboxd check [FLAGS]` prints what is missing or wrong on this host with these settings (runsc, cgroups, runtimes, nftables, forwarding, disk, the listening address), changing nothing, and exits 1 when the daemon could not serve.",
    next_line_help = true,
    // As before: a repeated flag's last value wins.
    args_override_self = true
)]
struct Args {
    /// address to listen on (port 0 picks a free one)
    #[arg(long, env = "ISOBOX_LISTEN", help_heading = "Server", default_value = "127.0.0.1:8090", value_parser = Value(parsed::<SocketAddr>))]
    listen: SocketAddr,
    /// state directory (runs, LMDB, workspaces)
    #[arg(long, env = "ISOBOX_DATA_DIR", help_heading = "Server", default_value = "/var/lib/isobox", value_parser = Value(path))]
    data_dir: PathBuf,
    /// where `make runtimes` builds the runtimes' root filesystems
    #[arg(long, env = "ISOBOX_ROOTFS_DIR", help_heading = "Sandboxes and runtimes", default_value = "/var/lib/isobox/rootfs", value_parser = Value(path))]
    rootfs_dir: PathBuf,
    /// make each runtime's tree an EROFS image (with mkfs.erofs) that cold one-off runs mount as their root, without a gofer
    #[arg(long, env = "ISOBOX_ROOT_IMAGES", help_heading = "Sandboxes and runtimes", value_name = "on|off", default_value = "on", value_parser = Value(on_off))]
    root_images: std::primitive::bool,
    /// where the runtimes' EROFS images are kept (shared by every daemon of the host)
    #[arg(long, env = "ISOBOX_IMAGE_DIR", help_heading = "Sandboxes and runtimes", default_value = "/var/lib/isobox/images", value_parser = Value(path))]
    image_dir: PathBuf,
    /// directory of runtime descriptors (*.toml); default: the ones built into the binary
    #[arg(long, env = "ISOBOX_RUNTIMES_DIR", help_heading = "Sandboxes and runtimes", default_value = "", hide_default_value = true, value_parser = Value(optional_path))]
    runtimes_dir: std::option::Option<PathBuf>,
    /// name for this daemon's cgroups, runsc root and containers; must start with `isobox`
    #[arg(long, env = "ISOBOX_INSTANCE", help_heading = "Server", default_value = "isobox", value_parser = Value(text))]
    instance: String,
    /// path of the runsc binary
    #[arg(long, env = "ISOBOX_RUNSC", help_heading = "Sandboxes and runtimes", default_value = "/usr/bin/runsc", value_parser = Value(path))]
    runsc: PathBuf,
    /// gVisor platform: ptrace (the default), systrap (faster for system calls, but a
    /// run out of memory ends without the OOM kill the result reports: bench/README.md),
    /// or kvm (needs /dev/kvm)
    #[arg(long, env = "ISOBOX_PLATFORM", help_heading = "Sandboxes and runtimes", default_value = "ptrace", value_parser = Value(text))]
    platform: String,
    /// log level: error, warn, info, debug, trace
    #[arg(long, env = "ISOBOX_LOG", help_heading = "Server", default_value = "info", value_parser = Value(text))]
    log: String,
    /// log line format: `text` (a timestamp, the level, the module, the message) or
    /// `json` (one object per line: ts, level, target, msg)
    #[arg(long, env = "ISOBOX_LOG_FORMAT", help_heading = "Server", value_name = "text|json", default_value = "text", value_parser = Value(log_format))]
    log_format: std::primitive::bool,
    /// worker threads for blocking work
    #[arg(long, env = "ISOBOX_WORKERS", help_heading = "Server", default_value = "4", value_parser = Value(parsed::<usize>))]
    workers: usize,
    /// open connections beyond this are answered 503 and closed
    #[arg(long, env = "ISOBOX_MAX_CONNECTIONS", help_heading = "Connections", default_value = "1024", value_parser = Value(parsed::<usize>))]
    max_connections: usize,
    /// open connections from one address (IPv6: one /64) beyond this are answered 503 and closed
    #[arg(long, env = "ISOBOX_MAX_CONNECTIONS_PER_IP", help_heading = "Connections", default_value = "256", value_parser = Value(parsed::<usize>))]
    max_connections_per_ip: usize,
    /// an idle keep-alive connection is closed after this
    #[arg(long, env = "ISOBOX_IDLE_TIMEOUT_MS", help_heading = "Connections", default_value = "60000", value_parser = Value(parsed::<u64>))]
    idle_timeout_ms: u64,
    /// a request head must arrive within this (slowloris guard)
    #[arg(long, env = "ISOBOX_HEAD_TIMEOUT_MS", help_heading = "Connections", default_value = "10000", value_parser = Value(parsed::<u64>))]
    head_timeout_ms: u64,
    /// executions at once; the next gets 429 capacity
    #[arg(long, env = "ISOBOX_MAX_CONCURRENT", help_heading = "Sandboxes and runtimes", default_value = "4", value_parser = Value(parsed::<usize>))]
    max_concurrent: usize,
    /// memory cap of the protective cgroup slice holding every sandbox (default: half of
    /// host memory)
    #[arg(long, env = "ISOBOX_SLICE_MEMORY_BYTES", help_heading = "Sandboxes and runtimes", default_value = "", hide_default_value = true, value_parser = Value(optional::<u64>))]
    slice_memory_bytes: std::option::Option<u64>,
    /// time limit of the build step of compiled runtimes (go, rust, typescript)
    #[arg(long, env = "ISOBOX_COMPILE_TIMEOUT_MS", help_heading = "Sandboxes and runtimes", default_value = "30000", value_parser = Value(parsed::<u64>))]
    compile_timeout_ms: u64,
    /// interval of `: keep-alive` comments on silent SSE streams
    #[arg(long, env = "ISOBOX_SSE_KEEPALIVE_MS", help_heading = "Connections", default_value = "10000", value_parser = Value(parsed::<u64>))]
    sse_keepalive_ms: u64,
    /// bytes of recorded run events (streamed and detached runs) kept for clients that
    /// reconnect; past it, the records of ended runs go, oldest first
    #[arg(long, env = "ISOBOX_RUN_RETAIN_BYTES", help_heading = "Connections", default_value = "67108864", value_parser = Value(parsed::<usize>))]
    run_retain_bytes: usize,
    /// seconds a streamed or detached run's record is kept after the run ended
    #[arg(long, env = "ISOBOX_RUN_RETAIN_S", help_heading = "Connections", default_value = "600", value_parser = Value(parsed::<u64>))]
    run_retain_s: u64,
    /// 0: do not confine the reactor thread with its seccomp allowlist (for debugging
    /// only; the sandboxes are confined either way)
    #[arg(long, env = "ISOBOX_SECCOMP", help_heading = "Server", value_name = "0|1", default_value = "1", value_parser = Value(zero_one))]
    seccomp: std::primitive::bool,
    /// comma-separated API keys; with keys, requests need X-API-Key or Authorization:
    /// Bearer (default: none, an open API)
    #[arg(long, env = "ISOBOX_API_KEYS", help_heading = "API keys and rate limits", default_value = "", hide_default_value = true, value_parser = Value(secret))]
    api_keys: std::option::Option<Secret>,
    /// file with one API key per line, re-read on SIGHUP (default: none)
    #[arg(long, env = "ISOBOX_API_KEYS_FILE", help_heading = "API keys and rate limits", default_value = "", hide_default_value = true, value_parser = Value(optional_path))]
    api_keys_file: std::option::Option<PathBuf>,
    /// 1: refuse to start without API keys; keys required everywhere even with
    /// --memory-require-key
    #[arg(long, env = "ISOBOX_REQUIRE_AUTH", help_heading = "API keys and rate limits", value_name = "0|1", default_value = "0", value_parser = Value(zero_one))]
    require_auth: std::primitive::bool,
    /// 1: with keys, require them only on /v1/memory, /v1/volumes and POST /v1/agent (the
    /// public demo's setup)
    #[arg(long, env = "ISOBOX_MEMORY_REQUIRE_KEY", help_heading = "API keys and rate limits", value_name = "0|1", default_value = "0", value_parser = Value(zero_one))]
    memory_require_key: std::primitive::bool,
    /// refill of each client's token bucket, requests a minute; the bucket is spent by
    /// exactly POST /execute, POST /v1/sessions, POST /v1/sessions/{id}/exec, POST
    /// /v1/volumes, POST /wbx/v1/sandboxes, POST /wbx/v1/jobs, POST
    /// /wbx/v1/jobs/{id}/retry and POST /wbx/v1/batches (empty: 429 rate_limited; the
    /// eryx face has a bucket per tenant instead: ISOBOX_ERYX_RATE_PER_MIN)
    #[arg(long, env = "ISOBOX_RATE_PER_MIN", help_heading = "API keys and rate limits", default_value = "30", value_parser = Value(parsed::<u32>))]
    rate_per_min: u32,
    /// size of each client's token bucket (the requests it may make at once after a pause)
    #[arg(long, env = "ISOBOX_RATE_BURST", help_heading = "API keys and rate limits", default_value = "10", value_parser = Value(parsed::<u32>))]
    rate_burst: u32,
    /// key a scraper off this host presents to GET /metrics (Authorization: Bearer),
    /// at least 16 characters; clients on this host need none (default: none, /metrics
    /// is served to this host only)
    #[arg(long, env = "ISOBOX_METRICS_KEY", help_heading = "API keys and rate limits", default_value = "", hide_default_value = true, value_parser = Value(metrics_key))]
    metrics_key: std::option::Option<Secret>,
    /// comma-separated CIDRs whose X-Forwarded-For is believed (default: none)
    #[arg(long, env = "ISOBOX_TRUSTED_PROXIES", help_heading = "API keys and rate limits", default_value = "", hide_default_value = true, value_parser = Value(proxies))]
    trusted_proxies: std::vec::Vec<crate::admission::Cidr>,
    /// disk quota of each session's /workspace (its own filesystem)
    #[arg(long, env = "ISOBOX_SESSION_QUOTA_BYTES", help_heading = "Sessions, volumes and storage", default_value = "536870912", value_parser = Value(parsed::<u64>))]
    session_quota_bytes: u64,
    /// sessions that may exist at once (429 too_many_sessions above)
    #[arg(long, env = "ISOBOX_MAX_SESSIONS", help_heading = "Sessions, volumes and storage", default_value = "1000", value_parser = Value(parsed::<usize>))]
    max_sessions: usize,
    /// sessions one tenant (API key) may have at once, within ISOBOX_MAX_SESSIONS (429
    /// too_many_sessions above)
    #[arg(long, env = "ISOBOX_MAX_SESSIONS_PER_TENANT", help_heading = "Sessions, volumes and storage", default_value = "100", value_parser = Value(parsed::<usize>))]
    max_sessions_per_tenant: usize,
    /// disk all session workspaces may really use together (507 storage_full above)
    #[arg(long, env = "ISOBOX_STORAGE_MAX_BYTES", help_heading = "Sessions, volumes and storage", default_value = "34359738368", value_parser = Value(parsed::<u64>))]
    storage_max_bytes: u64,
    /// free disk kept on the data dir's filesystem (507 storage_full below)
    #[arg(long, env = "ISOBOX_STORAGE_RESERVE_BYTES", help_heading = "Sessions, volumes and storage", default_value = "2147483648", value_parser = Value(parsed::<u64>))]
    storage_reserve_bytes: u64,
    /// largest ttlSec a session may ask for (larger values are clamped)
    #[arg(long, env = "ISOBOX_SESSION_TTL_MAX_SEC", help_heading = "Sessions, volumes and storage", default_value = "604800", value_parser = Value(parsed::<u64>))]
    session_ttl_max_sec: u64,
    /// disk quota of each volume (its own filesystem, mounted at /memory)
    #[arg(long, env = "ISOBOX_VOLUME_QUOTA_BYTES", help_heading = "Sessions, volumes and storage", default_value = "536870912", value_parser = Value(parsed::<u64>))]
    volume_quota_bytes: u64,
    /// volumes that may exist at once (429 too_many_volumes above)
    #[arg(long, env = "ISOBOX_MAX_VOLUMES", help_heading = "Sessions, volumes and storage", default_value = "1000", value_parser = Value(parsed::<usize>))]
    max_volumes: usize,
    /// volumes one tenant (API key) may have at once, within ISOBOX_MAX_VOLUMES (429
    /// too_many_volumes above)
    #[arg(long, env = "ISOBOX_MAX_VOLUMES_PER_TENANT", help_heading = "Sessions, volumes and storage", default_value = "100", value_parser = Value(parsed::<usize>))]
    max_volumes_per_tenant: usize,
    /// `on`: runs asking for network get filtered egress (public internet only) while the
    /// firewall is verified; `off`: every run is offline
    #[arg(long, env = "ISOBOX_EGRESS", help_heading = "Network", value_name = "on|off", default_value = "on", value_parser = Value(on_off))]
    egress: std::primitive::bool,
    /// private IPv4 range the sandboxes' links are numbered from (a /30 each); must not
    /// overlap the host's networks
    #[arg(long, env = "ISOBOX_NET_POOL", help_heading = "Network", default_value = "10.200.0.0/16", value_parser = Value(parsed::<crate::netfilter::Cidr>))]
    net_pool: crate::netfilter::Cidr,
    /// resolvers written to the sandbox's /etc/resolv.conf (public addresses: private ones
    /// are blocked)
    #[arg(long, env = "ISOBOX_NET_DNS", help_heading = "Network", default_value = "1.1.1.1,8.8.8.8", value_parser = Value(list::<Ipv4Addr>))]
    net_dns: std::vec::Vec<Ipv4Addr>,
    /// extra IPv4 ranges sandboxes may not reach (comma-separated CIDRs), beside the
    /// built-in private and special ranges (default: none)
    #[arg(long, env = "ISOBOX_EGRESS_DENY", help_heading = "Network", default_value = "", hide_default_value = true, value_parser = Value(list::<crate::netfilter::Cidr>))]
    egress_deny: std::vec::Vec<crate::netfilter::Cidr>,
    /// how often the firewall is read back and, when it is found wrong, programmed again
    #[arg(long, env = "ISOBOX_EGRESS_VERIFY_SEC", help_heading = "Network", default_value = "10", value_parser = Value(parsed::<u64>))]
    egress_verify_sec: u64,
    /// connections one networked sandbox may have open at once (conntrack entries, TCP,
    /// UDP and ICMP alike); a new one beyond it is dropped (1-65536)
    #[arg(long, env = "ISOBOX_EGRESS_MAX_CONNS", help_heading = "Network", default_value = "256", value_parser = Value(parsed::<u32>))]
    egress_max_conns: u32,
    /// bytes per second one networked sandbox may send, and separately receive (100 Mbit/s
    /// by default); packets beyond it are dropped, bursts of up to a second's worth pass
    /// (65536-10000000000)
    #[arg(long, env = "ISOBOX_EGRESS_RATE", help_heading = "Network", default_value = "12500000", value_parser = Value(parsed::<u64>))]
    egress_rate: u64,
    /// what isobox's table does with forwarded traffic that is neither from nor to a
    /// sandbox link: `drop`, `keep` (the host's own firewall decides), or `auto`: drop
    /// when isobox turned IPv4 forwarding on, keep when the host forwarded already
    #[arg(long, env = "ISOBOX_EGRESS_FORWARD_OTHERS", help_heading = "Network", default_value = "auto", value_parser = Value(forward_others))]
    egress_forward_others: crate::netfilter::ForwardOthers,
    /// sandboxes booted ahead of time per runtime, `name=N` comma-separated (Python,
    /// JavaScript, Ruby and the compiled runtimes; `off` disables): each serves one
    /// /execute with the runtime's default memory and pids (offline, or with filtered
    /// egress from the `<runtime>+net` pool)
    #[arg(long, env = "ISOBOX_WARM_POOL", help_heading = "Sandboxes and runtimes", default_value = "python=2,python-slim=1,javascript=1", value_parser = Value(warm_pool))]
    warm_pool: std::vec::Vec<(String, usize)>,
    /// the most sandboxes a runtime's pool grows to when its runs come in bursts,
    /// `name=N` as for ISOBOX_WARM_POOL (a runtime not named, or named with less, stays
    /// at its ISOBOX_WARM_POOL size)
    #[arg(long, env = "ISOBOX_WARM_POOL_MAX", help_heading = "Sandboxes and runtimes", default_value = "python=4,python-slim=2,javascript=2", value_parser = Value(warm_pool))]
    warm_pool_max: std::vec::Vec<(String, usize)>,
    /// share of the host's CPUs, in percent (0 to 100), that refills may average over a
    /// minute for pools to grow past their ISOBOX_WARM_POOL sizes (0: pools never grow)
    #[arg(long, env = "ISOBOX_WARM_POOL_CPU", help_heading = "Sandboxes and runtimes", default_value = "25", value_parser = Value(percent))]
    warm_pool_cpu: u8,
    /// how far back, in seconds (5 to 3600), a pool's bursts and its refills' CPU count:
    /// a burst keeps a pool large this long, and a pool idle this long gives back what
    /// it holds above its ISOBOX_WARM_POOL size
    #[arg(long, env = "ISOBOX_WARM_POOL_WINDOW_SEC", help_heading = "Sandboxes and runtimes", default_value = "60", value_parser = Value(window_secs))]
    warm_pool_window_sec: u64,
    /// live-kernel sessions that may run at once (429 too_many_kernels above; 0 disables
    /// kernel sessions)
    #[arg(long, env = "ISOBOX_KERNELS_MAX", help_heading = "Kernel sessions", default_value = "4", value_parser = Value(parsed::<usize>))]
    kernels_max: usize,
    /// a kernel with no step for this long is ended (its session's files stay until the
    /// session's TTL)
    #[arg(long, env = "ISOBOX_KERNEL_IDLE_SEC", help_heading = "Kernel sessions", default_value = "1800", value_parser = Value(parsed::<u64>))]
    kernel_idle_sec: u64,
    /// live kernels one client address may hold (default: half of ISOBOX_KERNELS_MAX,
    /// rounded up)
    #[arg(long, env = "ISOBOX_KERNELS_PER_CLIENT", help_heading = "Kernel sessions", default_value = "", hide_default_value = true, value_parser = Value(optional::<usize>))]
    kernels_per_client: std::option::Option<usize>,
    /// live kernels one API key may hold, from any address (default: half of
    /// ISOBOX_KERNELS_MAX, rounded up; without keys everyone is one tenant and only the
    /// per-client cap applies)
    #[arg(long, env = "ISOBOX_KERNELS_PER_TENANT", help_heading = "Kernel sessions", default_value = "", hide_default_value = true, value_parser = Value(optional::<usize>))]
    kernels_per_tenant: std::option::Option<usize>,
    /// when every kernel slot is taken, the kernel idle longest is ended to make room for
    /// a new one, if it has been idle at least this long
    #[arg(long, env = "ISOBOX_KERNEL_EVICT_IDLE_SEC", help_heading = "Kernel sessions", default_value = "120", value_parser = Value(parsed::<u64>))]
    kernel_evict_idle_sec: u64,
    /// OpenAI-compatible endpoint of the server-side agent, e.g. https://api.openai.com/v1
    /// (POST {base}/chat/completions); unset: /v1/agent is off
    #[arg(long, env = "ISOBOX_AI_BASE", help_heading = "Server-side agent", default_value = "", hide_default_value = true, value_parser = Value(ai_base))]
    ai_base: std::option::Option<String>,
    /// the upstream's key, sent as Authorization: Bearer (never logged, never sent to a
    /// client; prefer the environment to the flag)
    #[arg(long, env = "ISOBOX_AI_KEY", help_heading = "Server-side agent", default_value = "", hide_default_value = true, value_parser = Value(ai_key))]
    ai_key: std::option::Option<Secret>,
    /// the model the agent asks for (required with ISOBOX_AI_BASE)
    #[arg(long, env = "ISOBOX_AI_MODEL", help_heading = "Server-side agent", default_value = "", hide_default_value = true, value_parser = Value(trimmed))]
    ai_model: String,
    /// model calls per agent loop at most (a request's maxIters is clamped to it)
    #[arg(long, env = "ISOBOX_AI_MAX_ITERS", help_heading = "Server-side agent", default_value = "8", value_parser = Value(parsed::<u32>))]
    ai_max_iters: u32,
    /// agent loops a client address may start per minute (429 rate_limited above)
    #[arg(long, env = "ISOBOX_AI_RATE_PER_MIN", help_heading = "Server-side agent", default_value = "6", value_parser = Value(parsed::<u32>))]
    ai_rate_per_min: u32,
    /// offer the agent the server-side web_search tool (on or off)
    #[arg(long, env = "ISOBOX_AI_SEARCH", help_heading = "Server-side agent", value_name = "on|off", default_value = "on", value_parser = Value(on_off))]
    ai_search: std::primitive::bool,
    /// where web_search asks (DuckDuckGo's HTML results; GET ?q=)
    #[arg(long, env = "ISOBOX_AI_SEARCH_URL", help_heading = "Server-side agent", default_value = "https://html.duckduckgo.com/html/", value_parser = Value(trimmed))]
    ai_search_url: String,
    /// longest silence of the agent's upstream before the loop ends with upstream_error
    #[arg(long, env = "ISOBOX_AI_TIMEOUT_SEC", help_heading = "Server-side agent", default_value = "120", value_parser = Value(parsed::<u64>))]
    ai_timeout_sec: u64,
    /// wall time of the agent's run_python steps (past it the kernel ends, as any kernel
    /// step's wall time does)
    #[arg(long, env = "ISOBOX_AI_PYTHON_WALL_SEC", help_heading = "Server-side agent", default_value = "60", value_parser = Value(parsed::<u64>))]
    ai_python_wall_sec: u64,
    /// wall time of the agent's run_shell commands (then killed in place: exit 124, the
    /// kernel survives)
    #[arg(long, env = "ISOBOX_AI_SHELL_WALL_SEC", help_heading = "Server-side agent", default_value = "180", value_parser = Value(parsed::<u64>))]
    ai_shell_wall_sec: u64,
    /// on SIGTERM, running executions get this long before they are killed
    #[arg(long, env = "ISOBOX_SHUTDOWN_GRACE_MS", help_heading = "Server", default_value = "10000", value_parser = Value(parsed::<u64>))]
    shutdown_grace_ms: u64,
    /// long-lived sandboxes (/wbx) a tenant may have at once (429 above; 0: none)
    #[arg(long, env = "ISOBOX_WBX_MAX_SANDBOXES", help_heading = "WBX face (/wbx)", default_value = "8", value_parser = Value(parsed::<usize>))]
    wbx_max_sandboxes: usize,
    /// vCPUs of a tenant's long-lived sandboxes together (each has 2)
    #[arg(long, env = "ISOBOX_WBX_MAX_VCPU", help_heading = "WBX face (/wbx)", default_value = "16", value_parser = Value(parsed::<u32>))]
    wbx_max_vcpu: u32,
    /// memory of a tenant's long-lived sandboxes together, MiB (each has 512)
    #[arg(long, env = "ISOBOX_WBX_MAX_MEMORY_MB", help_heading = "WBX face (/wbx)", default_value = "4096", value_parser = Value(parsed::<u64>))]
    wbx_max_memory_mb: u64,
    /// long-lived sandboxes on this server at once, all tenants together (429 "no free
    /// capacity" above)
    #[arg(long, env = "ISOBOX_WBX_MAX_TOTAL", help_heading = "WBX face (/wbx)", default_value = "16", value_parser = Value(parsed::<usize>))]
    wbx_max_total: usize,
    /// longest lifetime of a long-lived sandbox, seconds (a larger timeout_s is capped)
    #[arg(long, env = "ISOBOX_WBX_MAX_TIMEOUT_S", help_heading = "WBX face (/wbx)", default_value = "86400", value_parser = Value(parsed::<u64>))]
    wbx_max_timeout_s: u64,
    /// background jobs (/wbx/v1/jobs) running at once, all tenants together; the rest
    /// wait in the queue, in the order they were accepted
    #[arg(long, env = "ISOBOX_WBX_JOBS_RUNNING", help_heading = "WBX face (/wbx)", default_value = "2", value_parser = Value(parsed::<usize>))]
    wbx_jobs_running: usize,
    /// unfinished jobs (queued or running) a tenant may have at once (429 above)
    #[arg(long, env = "ISOBOX_WBX_JOBS_PER_TENANT", help_heading = "WBX face (/wbx)", default_value = "1000", value_parser = Value(parsed::<usize>))]
    wbx_jobs_per_tenant: usize,
    /// longest time limit of a job, seconds (a larger timeout_s is refused with 400)
    #[arg(long, env = "ISOBOX_WBX_JOB_MAX_TIMEOUT_S", help_heading = "WBX face (/wbx)", default_value = "86400", value_parser = Value(parsed::<u64>))]
    wbx_job_max_timeout_s: u64,
    /// a job's log keeps this many MiB of its output; the rest is counted and dropped
    #[arg(long, env = "ISOBOX_WBX_JOB_LOG_MB", help_heading = "WBX face (/wbx)", default_value = "64", value_parser = Value(parsed::<u64>))]
    wbx_job_log_mb: u64,
    /// finished jobs, their logs and result files are kept this long, seconds (at least
    /// a day: a job's webhook goes with it, and its retries take 21 hours)
    #[arg(long, env = "ISOBOX_WBX_JOB_RETENTION_S", help_heading = "WBX face (/wbx)", default_value = "604800", value_parser = Value(retention_secs))]
    wbx_job_retention_s: u64,
    /// result files one job may save
    #[arg(long, env = "ISOBOX_WBX_ARTIFACT_FILES", help_heading = "WBX face (/wbx)", default_value = "100", value_parser = Value(parsed::<usize>))]
    wbx_artifact_files: usize,
    /// largest result file, MB (10^6 bytes)
    #[arg(long, env = "ISOBOX_WBX_ARTIFACT_FILE_MB", help_heading = "WBX face (/wbx)", default_value = "100", value_parser = Value(parsed::<u64>))]
    wbx_artifact_file_mb: u64,
    /// result files of one job together, MB
    #[arg(long, env = "ISOBOX_WBX_ARTIFACT_JOB_MB", help_heading = "WBX face (/wbx)", default_value = "512", value_parser = Value(parsed::<u64>))]
    wbx_artifact_job_mb: u64,
    /// stored result files of one tenant together, MB
    #[arg(long, env = "ISOBOX_WBX_ARTIFACT_TENANT_MB", help_heading = "WBX face (/wbx)", default_value = "5000", value_parser = Value(parsed::<u64>))]
    wbx_artifact_tenant_mb: u64,
    /// finished jobs' records (and webhook events) of one tenant together in the
    /// daemon's store, MB (the store holds 4 GiB for everything)
    #[arg(long, env = "ISOBOX_WBX_JOB_RECORDS_TENANT_MB", help_heading = "WBX face (/wbx)", default_value = "256", value_parser = Value(parsed::<u64>))]
    wbx_job_records_tenant_mb: u64,
    /// job webhooks: on, or off (a webhook_url is then refused with 400, and no
    /// delivery is made)
    #[arg(long, env = "ISOBOX_WBX_WEBHOOKS", help_heading = "WBX face (/wbx)", value_name = "on|off", default_value = "on", value_parser = Value(on_off))]
    wbx_webhooks: std::primitive::bool,
    /// webhooks may also go to http:// on loopback (127.0.0.1, ::1, localhost): for
    /// tests and local use; otherwise only public https:// targets
    #[arg(long, env = "ISOBOX_WBX_WEBHOOK_LOOPBACK", help_heading = "WBX face (/wbx)", value_name = "0|1", default_value = "0", value_parser = Value(zero_one))]
    wbx_webhook_loopback: std::primitive::bool,
    /// the billing currency of job costs (three capital letters)
    #[arg(long, env = "ISOBOX_WBX_CURRENCY", help_heading = "WBX face (/wbx)", default_value = "EUR", value_parser = Value(currency))]
    wbx_currency: String,
    /// price of one vCPU for one second of a job's run time, in the currency (a
    /// decimal string; 0: free)
    #[arg(long, env = "ISOBOX_WBX_PRICE_VCPU_S", help_heading = "WBX face (/wbx)", default_value = "0", value_parser = Value(money))]
    wbx_price_vcpu_s: crate::jobs::Money,
    /// price of one GB of memory for one second of a job's run time
    #[arg(long, env = "ISOBOX_WBX_PRICE_GB_S", help_heading = "WBX face (/wbx)", default_value = "0", value_parser = Value(money))]
    wbx_price_gb_s: crate::jobs::Money,
    /// the compute classes this server offers, comma-separated (economy, balanced,
    /// performance, memory, dedicated; economy always); another is 403
    #[arg(long, env = "ISOBOX_WBX_COMPUTE_CLASSES", help_heading = "WBX face (/wbx)", default_value = "economy,balanced,performance,memory", value_parser = Value(compute_classes))]
    wbx_compute_classes: ClassList,
    /// a class's own prices, `class=<per vCPU-second>/<per GB-second>` comma-separated
    /// (e.g. `performance=0.00002/0.000003`); a class not named has
    /// ISOBOX_WBX_PRICE_VCPU_S and ISOBOX_WBX_PRICE_GB_S
    #[arg(long, env = "ISOBOX_WBX_CLASS_PRICES", help_heading = "WBX face (/wbx)", default_value = "", hide_default_value = true, value_parser = Value(class_prices))]
    wbx_class_prices: ClassPrices,
    /// domain of sandboxes' public URLs: `<port>-<id>.<domain>` (with `:port` when the
    /// URLs need one; default: localhost and the listening port, which needs no DNS)
    #[arg(long, env = "ISOBOX_PUBLIC_DOMAIN", help_heading = "WBX face (/wbx)", default_value = "", hide_default_value = true, value_parser = Value(public_domain))]
    public_domain: String,
    /// scheme of public URLs: http, or https behind a TLS front (cookies get Secure)
    #[arg(long, env = "ISOBOX_PUBLIC_SCHEME", help_heading = "WBX face (/wbx)", default_value = "http", value_parser = Value(public_scheme))]
    public_scheme: String,
    /// ready long-lived sandboxes kept booted per template, `template=N,…` (`off`: none);
    /// a create of that template with network full takes one (`"warm": true`)
    #[arg(long, env = "ISOBOX_WBX_WARM_POOL", help_heading = "WBX face (/wbx)", default_value = "base=1", value_parser = Value(warm_pool))]
    wbx_warm_pool: std::vec::Vec<(String, usize)>,
    /// the WebAssembly worker binary, isobox-wasm, that runs the eryx face's Python
    /// (default: beside isoboxd's own executable, else /usr/libexec/isobox/isobox-wasm;
    /// `off`: no eryx face, every /eryx request answers 503)
    #[arg(
        long,
        env = "ISOBOX_WASM_WORKER",
        help_heading = "eryx face (/eryx)",
        default_value = "",
        hide_default_value = true
    )]
    wasm_worker: std::string::String,
    /// where the worker keeps its pre-compiled Python snapshot (~60 MB, made once per
    /// eryx version and CPU, ~20 s) and the standard library it reads
    #[arg(
        long,
        env = "ISOBOX_WASM_CACHE_DIR",
        help_heading = "eryx face (/eryx)",
        default_value = "/var/cache/isobox/wasm"
    )]
    wasm_cache_dir: PathBuf,
    /// worker processes, of one engine thread each: the runs that execute in parallel,
    /// all tenants together
    #[arg(long, env = "ISOBOX_WASM_THREADS", help_heading = "eryx face (/eryx)", default_value = "2", value_parser = Value(parsed::<usize>))]
    wasm_threads: usize,
    /// the workers' memory cap, MiB, shared equally: each worker process's cgroup gets
    /// this divided by ISOBOX_WASM_THREADS (its runs' memory is inside it)
    #[arg(long, env = "ISOBOX_WASM_WORKER_MEMORY_MB", help_heading = "eryx face (/eryx)", default_value = "1024", value_parser = Value(parsed::<u64>))]
    wasm_worker_memory_mb: u64,
    /// runs one tenant may have going at once (429 concurrency_limit above)
    #[arg(long, env = "ISOBOX_ERYX_CONCURRENCY", help_heading = "eryx face (/eryx)", default_value = "5", value_parser = Value(parsed::<usize>))]
    eryx_concurrency: usize,
    /// a run's time limit, seconds (a request may ask for less)
    #[arg(long, env = "ISOBOX_ERYX_TIMEOUT_S", help_heading = "eryx face (/eryx)", default_value = "30", value_parser = Value(parsed::<u64>))]
    eryx_timeout_s: u64,
    /// a run's compute units (WebAssembly instructions; a request may ask for fewer)
    #[arg(long, env = "ISOBOX_ERYX_FUEL_LIMIT", help_heading = "eryx face (/eryx)", default_value = "20000000000", value_parser = Value(parsed::<u64>))]
    eryx_fuel_limit: u64,
    /// a run's memory, MiB (past it Python raises MemoryError)
    #[arg(long, env = "ISOBOX_ERYX_MEMORY_MB", help_heading = "eryx face (/eryx)", default_value = "64", value_parser = Value(parsed::<u64>))]
    eryx_memory_mb: u64,
    /// how long one callback call on the eryx WebSocket waits for the client's answer,
    /// ms (past it the call raises RuntimeError in Python)
    #[arg(long, env = "ISOBOX_ERYX_CALLBACK_TIMEOUT_MS", help_heading = "eryx face (/eryx)", default_value = "30000", value_parser = Value(parsed::<u64>))]
    eryx_callback_timeout_ms: u64,
    /// refill of each tenant's token bucket on the eryx face (/eryx), requests a
    /// minute: every request there spends it, from whatever address (requests without
    /// a valid key spend their client address's bucket instead); 1 to 1000000
    #[arg(long, env = "ISOBOX_ERYX_RATE_PER_MIN", help_heading = "eryx face (/eryx)", default_value = "600", value_parser = Value(parsed::<u32>))]
    eryx_rate_per_min: u32,
    /// size of each tenant's token bucket on the eryx face (1 to 100000)
    #[arg(long, env = "ISOBOX_ERYX_RATE_BURST", help_heading = "eryx face (/eryx)", default_value = "100", value_parser = Value(parsed::<u32>))]
    eryx_rate_burst: u32,
    /// unexpired sessions one tenant may have on the eryx face (429 session_limit
    /// above; 1 to 10000)
    #[arg(long, env = "ISOBOX_ERYX_SESSIONS", help_heading = "eryx face (/eryx)", default_value = "50", value_parser = Value(parsed::<usize>))]
    eryx_sessions: usize,
    /// uploaded environments one tenant may have on the eryx face (429
    /// environment_limit above; 1 to 1000)
    #[arg(long, env = "ISOBOX_ERYX_ENVIRONMENTS", help_heading = "eryx face (/eryx)", default_value = "10", value_parser = Value(parsed::<usize>))]
    eryx_environments: usize,
    /// seconds an environment's build may take before it is stopped and failed (30 to
    /// 3600)
    #[arg(long, env = "ISOBOX_ERYX_BUILD_TIMEOUT_S", help_heading = "eryx face (/eryx)", default_value = "600", value_parser = Value(parsed::<u64>))]
    eryx_build_timeout_s: u64,
    /// memory an environment's build may use, MiB (512 to 65536)
    #[arg(long, env = "ISOBOX_ERYX_BUILD_MEMORY_MB", help_heading = "eryx face (/eryx)", default_value = "2048", value_parser = Value(parsed::<u64>))]
    eryx_build_memory_mb: u64,
    /// the isobox-init binary long-lived sandboxes run as their init (default: beside
    /// isoboxd's own executable, else /usr/libexec/isobox/isobox-init)
    #[arg(long, env = "ISOBOX_INIT", help_heading = "Sandboxes and runtimes", default_value = "", hide_default_value = true, value_parser = Value(optional_path))]
    init: std::option::Option<PathBuf>,
}

pub use crate::secret::Secret;

/// The daemon's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Admission settings (keys, rate limits, proxies).
    pub admission: crate::admission::AdmissionConfig,
    /// Listen address.
    pub listen: SocketAddr,
    /// State directory.
    pub data_dir: PathBuf,
    /// Root filesystems directory.
    pub rootfs_dir: PathBuf,
    /// Whether cold one-off runs may have their runtime's EROFS image as root.
    pub root_images: bool,
    /// Where the runtimes' EROFS images are kept.
    pub image_dir: PathBuf,
    /// Runtime descriptors directory; `None` uses the embedded ones.
    pub runtimes_dir: Option<PathBuf>,
    /// Instance name (prefix of everything this daemon creates).
    pub instance: String,
    /// runsc binary.
    pub runsc: PathBuf,
    /// gVisor platform.
    pub platform: String,
    /// Log level.
    pub log_level: String,
    /// Log lines as JSON objects (`ISOBOX_LOG_FORMAT=json`) instead of text.
    pub log_json: bool,
    /// Worker threads.
    pub workers: usize,
    /// Connection cap.
    pub max_connections: usize,
    /// Connection cap per client address.
    pub max_connections_per_ip: usize,
    /// Keep-alive idle timeout.
    pub idle_timeout_ms: u64,
    /// Head deadline.
    pub head_timeout_ms: u64,
    /// Concurrent executions.
    pub max_concurrent: usize,
    /// Slice memory cap.
    pub slice_memory_bytes: u64,
    /// Shutdown grace.
    pub shutdown_grace_ms: u64,
    /// Build-step time limit.
    pub compile_timeout_ms: u64,
    /// SSE keep-alive comment interval.
    pub sse_keepalive_ms: u64,
    /// Bytes of run records kept (the ended runs' records go first).
    pub run_retain_bytes: usize,
    /// How long an ended run's record is kept.
    pub run_retain_s: u64,
    /// Confine the reactor thread with seccomp.
    pub seccomp: bool,
    /// Session settings.
    pub sessions: SessionConfig,
    /// Egress settings.
    pub egress: crate::netfilter::EgressConfig,
    /// Live kernels at once (0: kernel sessions disabled).
    pub kernels_max: usize,
    /// Warm pool size per runtime name (as given; resolved against the runtimes later).
    pub warm_pool: Vec<(String, usize)>,
    /// The most each runtime's pool grows to (as given).
    pub warm_pool_max: Vec<(String, usize)>,
    /// Percent of the host's CPUs refills may average for pools to grow.
    pub warm_pool_cpu: u8,
    /// How far back a pool's bursts and refills count (seconds).
    pub warm_pool_window_sec: u64,
    /// Idle time after which a kernel is ended.
    pub kernel_idle_sec: u64,
    /// Live kernels one client address may hold.
    pub kernels_per_client: usize,
    /// Live kernels one tenant (API key) may hold.
    pub kernels_per_tenant: usize,
    /// Idle time after which a kernel may be ended to make room when the pool is full.
    pub kernel_evict_idle_sec: u64,
    /// The server-side agent.
    pub ai: AiConfig,
    /// The WBX face's per-tenant limits.
    pub wbx: WbxLimits,
    /// The `isobox-init` binary (long-lived sandboxes' init).
    pub init: PathBuf,
    /// The eryx face and its WebAssembly worker.
    pub eryx: EryxConfig,
    /// Public URLs of sandboxes' ports.
    pub public: PublicUrls,
}

/// Where sandboxes' public URLs live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrls {
    /// `http` or `https`.
    pub scheme: String,
    /// The domain, lower case, without a port (empty: `localhost`).
    pub domain: String,
    /// The port URLs carry (`None`: the scheme's own; `Some(0)`: the listening port,
    /// known once bound).
    pub port: Option<u16>,
}

/// Settings of the server-side agent (`/v1/agent`).
#[derive(Debug, Clone)]
pub struct AiConfig {
    /// The OpenAI-compatible upstream, without a trailing `/` (`None`: the agent is off).
    pub base: Option<String>,
    /// Its key, sent as `Authorization: Bearer` (never logged, never sent to a client).
    pub key: Option<Secret>,
    /// The model asked for.
    pub model: String,
    /// Ceiling of a request's `maxIters` (and its default).
    pub max_iters: u32,
    /// Loop starts per client address per minute.
    pub rate_per_min: u32,
    /// Offer the server-side `web_search` tool.
    pub search: bool,
    /// Where `web_search` asks (DuckDuckGo's HTML endpoint).
    pub search_url: String,
    /// Longest silence of the upstream before the loop fails with `upstream_error`.
    pub timeout_sec: u64,
    /// Wall time of a `run_python` step.
    pub python_wall_sec: u64,
    /// Wall time of a `run_shell` command (then killed in place: exit 124).
    pub shell_wall_sec: u64,
}

/// Settings of filesystem sessions.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Disk quota of each workspace.
    pub quota_bytes: u64,
    /// Most sessions at once.
    pub max_sessions: usize,
    /// Most sessions of one tenant at once.
    pub max_sessions_per_tenant: usize,
    /// Ceiling on the disk all workspaces really use.
    pub storage_max_bytes: u64,
    /// Free disk to keep on the data dir's filesystem.
    pub storage_reserve_bytes: u64,
    /// Largest TTL (seconds).
    pub ttl_max_sec: u64,
    /// Disk quota of each volume.
    pub volume_quota_bytes: u64,
    /// Most volumes at once.
    pub max_volumes: usize,
    /// Most volumes of one tenant at once.
    pub max_volumes_per_tenant: usize,
}

impl Config {
    /// Reads the environment, then applies `args` (without argv\[0\]).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad setting; [`ConfigError::Args`] also when
    /// `args` ask for `--help` or `--version`.
    pub fn load<I, T>(args: I) -> Result<Config, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let argv =
            std::iter::once(OsString::from("isoboxd")).chain(args.into_iter().map(Into::into));
        let matches = command().try_get_matches_from(argv)?;
        let a = Args::from_arg_matches(&matches)?;
        let cfg = Config {
            admission: crate::admission::AdmissionConfig {
                api_keys: a.api_keys,
                api_keys_file: a.api_keys_file,
                require_auth: a.require_auth,
                memory_require_key: a.memory_require_key,
                rate_per_min: a.rate_per_min,
                rate_burst: a.rate_burst,
                trusted_proxies: a.trusted_proxies,
                ai_rate_per_min: a.ai_rate_per_min,
                metrics_key: a.metrics_key,
                tenant_rate_per_min: a.eryx_rate_per_min,
                tenant_rate_burst: a.eryx_rate_burst,
            },
            listen: a.listen,
            data_dir: a.data_dir,
            rootfs_dir: a.rootfs_dir,
            root_images: a.root_images,
            image_dir: a.image_dir,
            runtimes_dir: a.runtimes_dir,
            instance: a.instance,
            runsc: a.runsc,
            platform: a.platform,
            log_level: a.log,
            log_json: a.log_format,
            workers: a.workers,
            max_connections: a.max_connections,
            max_connections_per_ip: a.max_connections_per_ip,
            idle_timeout_ms: a.idle_timeout_ms,
            head_timeout_ms: a.head_timeout_ms,
            max_concurrent: a.max_concurrent,
            slice_memory_bytes: a
                .slice_memory_bytes
                .unwrap_or_else(|| crate::sys::host_memory_bytes() / 2),
            shutdown_grace_ms: a.shutdown_grace_ms,
            compile_timeout_ms: a.compile_timeout_ms,
            sse_keepalive_ms: a.sse_keepalive_ms,
            run_retain_bytes: a.run_retain_bytes,
            run_retain_s: a.run_retain_s,
            seccomp: a.seccomp,
            sessions: SessionConfig {
                quota_bytes: a.session_quota_bytes,
                max_sessions: a.max_sessions,
                max_sessions_per_tenant: a.max_sessions_per_tenant,
                storage_max_bytes: a.storage_max_bytes,
                storage_reserve_bytes: a.storage_reserve_bytes,
                ttl_max_sec: a.session_ttl_max_sec,
                volume_quota_bytes: a.volume_quota_bytes,
                max_volumes: a.max_volumes,
                max_volumes_per_tenant: a.max_volumes_per_tenant,
            },
            egress: crate::netfilter::EgressConfig {
                enabled: a.egress,
                pool: a.net_pool,
                dns: a.net_dns,
                deny: a.egress_deny.clone(),
                verify_sec: a.egress_verify_sec,
                max_conns: a.egress_max_conns,
                rate_bytes: a.egress_rate,
                forward_others: a.egress_forward_others,
            },
            kernels_max: a.kernels_max,
            warm_pool: a.warm_pool,
            warm_pool_max: a.warm_pool_max,
            warm_pool_cpu: a.warm_pool_cpu,
            warm_pool_window_sec: a.warm_pool_window_sec,
            kernel_idle_sec: a.kernel_idle_sec,
            kernels_per_client: a.kernels_per_client.unwrap_or(a.kernels_max.div_ceil(2)),
            kernels_per_tenant: a.kernels_per_tenant.unwrap_or(a.kernels_max.div_ceil(2)),
            kernel_evict_idle_sec: a.kernel_evict_idle_sec,
            ai: AiConfig {
                base: a.ai_base,
                key: a.ai_key,
                model: a.ai_model,
                max_iters: a.ai_max_iters,
                rate_per_min: a.ai_rate_per_min,
                search: a.ai_search,
                search_url: a.ai_search_url,
                timeout_sec: a.ai_timeout_sec,
                python_wall_sec: a.ai_python_wall_sec,
                shell_wall_sec: a.ai_shell_wall_sec,
            },
            wbx: WbxLimits {
                max_sandboxes: a.wbx_max_sandboxes,
                max_vcpu: a.wbx_max_vcpu,
                max_mem_mb: a.wbx_max_memory_mb,
                max_timeout_s: a.wbx_max_timeout_s,
                warm_pool: a.wbx_warm_pool,
                max_total: a.wbx_max_total,
                jobs: WbxJobs {
                    running: a.wbx_jobs_running,
                    per_tenant: a.wbx_jobs_per_tenant,
                    max_timeout_s: a.wbx_job_max_timeout_s,
                    log_bytes: a.wbx_job_log_mb << 20,
                    retention_s: a.wbx_job_retention_s,
                    artifact_files: a.wbx_artifact_files,
                    artifact_file_bytes: a.wbx_artifact_file_mb * 1_000_000,
                    artifact_job_bytes: a.wbx_artifact_job_mb * 1_000_000,
                    artifact_tenant_bytes: a.wbx_artifact_tenant_mb * 1_000_000,
                    records_tenant_bytes: a.wbx_job_records_tenant_mb * 1_000_000,
                    currency: a.wbx_currency,
                    price_vcpu_s: a.wbx_price_vcpu_s,
                    price_gb_s: a.wbx_price_gb_s,
                    classes: a.wbx_compute_classes,
                    class_prices: a.wbx_class_prices,
                    webhook_loopback: a.wbx_webhook_loopback,
                    webhook_deny: a.egress_deny.clone(),
                    webhooks: a.wbx_webhooks,
                    wasi: false,
                },
            },
            public: {
                let (domain, port) = match a.public_domain.rsplit_once(':') {
                    _ if a.public_domain.is_empty() => ("localhost".to_string(), Some(0)),
                    Some((d, p)) => (d.to_string(), p.parse().ok()),
                    None => (a.public_domain.clone(), None),
                };
                PublicUrls {
                    scheme: a.public_scheme,
                    domain,
                    port,
                }
            },
            // Beside the daemon (a build tree), else where the Debian package puts it.
            init: a.init.unwrap_or_else(|| {
                std::env::current_exe()
                    .ok()
                    .and_then(|e| e.parent().map(|d| d.join("isobox-init")))
                    .filter(|p| p.exists())
                    .unwrap_or_else(|| PathBuf::from("/usr/libexec/isobox/isobox-init"))
            }),
            eryx: EryxConfig {
                worker: match a.wasm_worker.as_str() {
                    "off" => None,
                    "" => Some(
                        std::env::current_exe()
                            .ok()
                            .and_then(|e| e.parent().map(|d| d.join("isobox-wasm")))
                            .filter(|p| p.exists())
                            .unwrap_or_else(|| PathBuf::from("/usr/libexec/isobox/isobox-wasm")),
                    ),
                    p => Some(PathBuf::from(p)),
                },
                cache_dir: a.wasm_cache_dir,
                threads: a.wasm_threads,
                worker_memory_bytes: a.wasm_worker_memory_mb << 20,
                concurrency: a.eryx_concurrency,
                timeout_ms: a.eryx_timeout_s.saturating_mul(1000),
                fuel_limit: a.eryx_fuel_limit,
                memory_bytes: a.eryx_memory_mb << 20,
                callback_timeout_ms: a.eryx_callback_timeout_ms,
                sessions: a.eryx_sessions,
                environments: a.eryx_environments,
                build_timeout_ms: a.eryx_build_timeout_s.saturating_mul(1000),
                build_memory_bytes: a.eryx_build_memory_mb << 20,
            },
        };
        let mut cfg = cfg;
        // WebAssembly jobs run on the eryx face's worker binary.
        cfg.wbx.jobs.wasi = cfg.eryx.worker.as_ref().is_some_and(|p| p.is_file());
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks ranges and names.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the setting.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let inst_ok = self.instance.starts_with("isobox")
            && self.instance.len() <= 40
            && self
                .instance
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-');
        if !inst_ok {
            return Err(invalid(
                "ISOBOX_INSTANCE",
                &self.instance,
                "must start with `isobox`, at most 40 of [a-z0-9-]",
            ));
        }
        let e = &self.eryx;
        if !(1..=64).contains(&e.threads) {
            return Err(invalid(
                "ISOBOX_WASM_THREADS",
                &e.threads.to_string(),
                "1 to 64",
            ));
        }
        if !(16..=1 << 20).contains(&(e.memory_bytes >> 20)) {
            return Err(invalid(
                "ISOBOX_ERYX_MEMORY_MB",
                &(e.memory_bytes >> 20).to_string(),
                "16 to 1048576",
            ));
        }
        if !(1..=10_000).contains(&e.sessions) {
            return Err(invalid(
                "ISOBOX_ERYX_SESSIONS",
                &e.sessions.to_string(),
                "1 to 10000",
            ));
        }
        if !(1..=1000).contains(&e.environments) {
            return Err(invalid(
                "ISOBOX_ERYX_ENVIRONMENTS",
                &e.environments.to_string(),
                "1 to 1000",
            ));
        }
        if !(30_000..=3_600_000).contains(&e.build_timeout_ms) {
            return Err(invalid(
                "ISOBOX_ERYX_BUILD_TIMEOUT_S",
                &(e.build_timeout_ms / 1000).to_string(),
                "30 to 3600",
            ));
        }
        if !((512 << 20)..=(65536 << 20)).contains(&e.build_memory_bytes) {
            return Err(invalid(
                "ISOBOX_ERYX_BUILD_MEMORY_MB",
                &(e.build_memory_bytes >> 20).to_string(),
                "512 to 65536",
            ));
        }
        if !(100..=600_000).contains(&e.callback_timeout_ms) {
            return Err(invalid(
                "ISOBOX_ERYX_CALLBACK_TIMEOUT_MS",
                &e.callback_timeout_ms.to_string(),
                "100 to 600000",
            ));
        }
        // Each worker process gets an equal share, and needs a run's memory and the
        // engine's own (~128 MiB) in it.
        if e.worker_memory_bytes / (e.threads as u64) < e.memory_bytes + (128 << 20) {
            return Err(invalid(
                "ISOBOX_WASM_WORKER_MEMORY_MB",
                &(e.worker_memory_bytes >> 20).to_string(),
                "at least (ISOBOX_ERYX_MEMORY_MB + 128) x ISOBOX_WASM_THREADS (each worker process's share holds a run and the engine's own)",
            ));
        }
        if e.timeout_ms == 0 || e.fuel_limit == 0 || e.concurrency == 0 {
            return Err(invalid(
                "ISOBOX_ERYX_TIMEOUT_S, ISOBOX_ERYX_FUEL_LIMIT and ISOBOX_ERYX_CONCURRENCY",
                "0",
                "at least 1",
            ));
        }
        let j = &self.wbx.jobs;
        if j.running == 0
            || j.per_tenant == 0
            || j.max_timeout_s == 0
            || j.log_bytes == 0
            || j.artifact_file_bytes == 0
            || j.records_tenant_bytes == 0
        {
            return Err(invalid(
                "ISOBOX_WBX_JOBS_RUNNING, ISOBOX_WBX_JOBS_PER_TENANT, ISOBOX_WBX_JOB_MAX_TIMEOUT_S, ISOBOX_WBX_JOB_LOG_MB, ISOBOX_WBX_ARTIFACT_FILE_MB and ISOBOX_WBX_JOB_RECORDS_TENANT_MB",
                "0",
                "at least 1",
            ));
        }
        if self.wbx.max_timeout_s == 0 {
            return Err(invalid(
                "ISOBOX_WBX_MAX_TIMEOUT_S",
                "0",
                "at least 1 second",
            ));
        }
        if !["ptrace", "kvm", "systrap"].contains(&self.platform.as_str()) {
            return Err(invalid(
                "ISOBOX_PLATFORM",
                &self.platform,
                "one of ptrace, kvm, systrap",
            ));
        }
        let s = &self.sessions;
        if !(16 << 20..=1 << 40).contains(&s.quota_bytes) {
            return Err(invalid(
                "ISOBOX_SESSION_QUOTA_BYTES",
                &s.quota_bytes.to_string(),
                "between 16 MiB and 1 TiB",
            ));
        }
        if !(16 << 20..=1 << 40).contains(&s.volume_quota_bytes) {
            return Err(invalid(
                "ISOBOX_VOLUME_QUOTA_BYTES",
                &s.volume_quota_bytes.to_string(),
                "between 16 MiB and 1 TiB",
            ));
        }
        if !(1..=1_000_000).contains(&s.max_volumes) {
            return Err(invalid(
                "ISOBOX_MAX_VOLUMES",
                &s.max_volumes.to_string(),
                "between 1 and 1000000",
            ));
        }
        if !(1..=1_000_000).contains(&s.max_sessions) {
            return Err(invalid(
                "ISOBOX_MAX_SESSIONS",
                &s.max_sessions.to_string(),
                "between 1 and 1000000",
            ));
        }
        if !(1..=1_000_000).contains(&s.max_sessions_per_tenant) {
            return Err(invalid(
                "ISOBOX_MAX_SESSIONS_PER_TENANT",
                &s.max_sessions_per_tenant.to_string(),
                "between 1 and 1000000",
            ));
        }
        if !(1..=1_000_000).contains(&s.max_volumes_per_tenant) {
            return Err(invalid(
                "ISOBOX_MAX_VOLUMES_PER_TENANT",
                &s.max_volumes_per_tenant.to_string(),
                "between 1 and 1000000",
            ));
        }
        if !(1..=366 * 86_400).contains(&s.ttl_max_sec) {
            return Err(invalid(
                "ISOBOX_SESSION_TTL_MAX_SEC",
                &s.ttl_max_sec.to_string(),
                "between 1 and 31622400",
            ));
        }
        let e = &self.egress;
        if !(16..=30).contains(&e.pool.prefix_len()) {
            return Err(invalid(
                "ISOBOX_NET_POOL",
                &e.pool.to_string(),
                "a prefix between /16 and /30 (a /30 per sandbox)",
            ));
        }
        if e.dns.is_empty() || e.dns.len() > 3 {
            return Err(invalid("ISOBOX_NET_DNS", "", "1 to 3 resolvers"));
        }
        if let Some(ip) = e.dns.iter().find(|ip| crate::netfilter::is_denied(**ip)) {
            return Err(invalid(
                "ISOBOX_NET_DNS",
                &ip.to_string(),
                "a private or special address, which sandboxes may not reach; use a public resolver",
            ));
        }
        if !(1..=86_400).contains(&e.verify_sec) {
            return Err(invalid(
                "ISOBOX_EGRESS_VERIFY_SEC",
                &e.verify_sec.to_string(),
                "between 1 and 86400",
            ));
        }
        if !(1..=65_536).contains(&e.max_conns) {
            return Err(invalid(
                "ISOBOX_EGRESS_MAX_CONNS",
                &e.max_conns.to_string(),
                "between 1 and 65536",
            ));
        }
        // A second's worth must hold one whole offloaded (64 KiB) packet.
        if !(65_536..=10_000_000_000).contains(&e.rate_bytes) {
            return Err(invalid(
                "ISOBOX_EGRESS_RATE",
                &e.rate_bytes.to_string(),
                "bytes per second between 65536 and 10000000000",
            ));
        }
        if self.kernels_max > 256 {
            return Err(invalid(
                "ISOBOX_KERNELS_MAX",
                &self.kernels_max.to_string(),
                "between 0 and 256",
            ));
        }
        self.ai.validate()?;
        if !(1..=7 * 86_400).contains(&self.kernel_idle_sec) {
            return Err(invalid(
                "ISOBOX_KERNEL_IDLE_SEC",
                &self.kernel_idle_sec.to_string(),
                "between 1 and 604800",
            ));
        }
        for (name, v) in [
            ("ISOBOX_KERNELS_PER_CLIENT", self.kernels_per_client),
            ("ISOBOX_KERNELS_PER_TENANT", self.kernels_per_tenant),
        ] {
            if self.kernels_max > 0 && !(1..=self.kernels_max).contains(&v) {
                return Err(invalid(
                    name,
                    &v.to_string(),
                    "between 1 and ISOBOX_KERNELS_MAX",
                ));
            }
        }
        if !(1..=7 * 86_400).contains(&self.kernel_evict_idle_sec) {
            return Err(invalid(
                "ISOBOX_KERNEL_EVICT_IDLE_SEC",
                &self.kernel_evict_idle_sec.to_string(),
                "between 1 and 604800",
            ));
        }
        if !(1..=64).contains(&self.workers) {
            return Err(invalid(
                "ISOBOX_WORKERS",
                &self.workers.to_string(),
                "between 1 and 64",
            ));
        }
        if self.admission.rate_burst == 0
            || self.admission.rate_burst > 100_000
            || self.admission.rate_per_min > 1_000_000
        {
            return Err(invalid(
                "ISOBOX_RATE_BURST/ISOBOX_RATE_PER_MIN",
                "",
                "burst between 1 and 100000, rate at most 1000000",
            ));
        }
        if !(1..=1_000_000).contains(&self.admission.tenant_rate_per_min) {
            return Err(invalid(
                "ISOBOX_ERYX_RATE_PER_MIN",
                &self.admission.tenant_rate_per_min.to_string(),
                "1 to 1000000",
            ));
        }
        if !(1..=100_000).contains(&self.admission.tenant_rate_burst) {
            return Err(invalid(
                "ISOBOX_ERYX_RATE_BURST",
                &self.admission.tenant_rate_burst.to_string(),
                "1 to 100000",
            ));
        }
        if !(1..=1_000_000).contains(&self.max_connections) {
            return Err(invalid(
                "ISOBOX_MAX_CONNECTIONS",
                &self.max_connections.to_string(),
                "between 1 and 1000000",
            ));
        }
        if self.max_connections_per_ip == 0 {
            return Err(invalid("ISOBOX_MAX_CONNECTIONS_PER_IP", "0", "at least 1"));
        }
        if !(1..=1024).contains(&self.max_concurrent) {
            return Err(invalid(
                "ISOBOX_MAX_CONCURRENT",
                &self.max_concurrent.to_string(),
                "between 1 and 1024",
            ));
        }
        if self.idle_timeout_ms < 100 || self.head_timeout_ms < 100 {
            return Err(invalid(
                "ISOBOX_IDLE_TIMEOUT_MS/ISOBOX_HEAD_TIMEOUT_MS",
                "",
                "at least 100",
            ));
        }
        if !(1000..=600_000).contains(&self.compile_timeout_ms) {
            return Err(invalid(
                "ISOBOX_COMPILE_TIMEOUT_MS",
                &self.compile_timeout_ms.to_string(),
                "between 1000 and 600000",
            ));
        }
        if !(100..=600_000).contains(&self.sse_keepalive_ms) {
            return Err(invalid(
                "ISOBOX_SSE_KEEPALIVE_MS",
                &self.sse_keepalive_ms.to_string(),
                "between 100 and 600000",
            ));
        }
        if !(64 << 10..=1 << 34).contains(&self.run_retain_bytes) {
            return Err(invalid(
                "ISOBOX_RUN_RETAIN_BYTES",
                &self.run_retain_bytes.to_string(),
                "between 65536 (64 KiB) and 17179869184 (16 GiB)",
            ));
        }
        if !(1..=86_400).contains(&self.run_retain_s) {
            return Err(invalid(
                "ISOBOX_RUN_RETAIN_S",
                &self.run_retain_s.to_string(),
                "between 1 and 86400",
            ));
        }
        if self.slice_memory_bytes < 64 << 20 {
            return Err(invalid(
                "ISOBOX_SLICE_MEMORY_BYTES",
                &self.slice_memory_bytes.to_string(),
                "at least 64 MiB",
            ));
        }
        if !self.data_dir.is_absolute() || !self.rootfs_dir.is_absolute() {
            return Err(invalid(
                "ISOBOX_DATA_DIR/ISOBOX_ROOTFS_DIR",
                "",
                "must be absolute paths",
            ));
        }
        if !self.image_dir.is_absolute() {
            return Err(invalid("ISOBOX_IMAGE_DIR", "", "must be an absolute path"));
        }
        Ok(())
    }

    /// The text of `isoboxd --help`.
    pub fn help() -> String {
        command().render_help().to_string()
    }
}

/// The command line clap parses: [`Args`], with what holds for every setting.
fn command() -> clap::Command {
    Args::command().mut_args(|a| {
        // As before: the word after a flag is its value, even when it starts with `-`.
        // `--help` shows each setting's variable but never its value (keys are secrets).
        a.allow_hyphen_values(true).hide_env_values(true)
    })
}

fn invalid(name: &str, value: &str, why: &str) -> ConfigError {
    ConfigError::Invalid {
        name: name.into(),
        value: value.into(),
        why: why.into(),
    }
}

/// How one setting's value is parsed: `self.0` turns the text into the field's value
/// or says why not. The empty text stands for the setting's default (as `get` did in
/// the loader this replaces), and a refusal names the value with both the flag and
/// the variable, since it cannot tell which of the two gave it.
#[derive(Clone)]
struct Value<T>(fn(&str) -> Result<T, String>);

impl<T: Clone + Send + Sync + 'static> TypedValueParser for Value<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let name = match arg {
            Some(a) => match (a.get_long(), a.get_env()) {
                (Some(flag), Some(env)) => format!("--{flag} ({})", env.to_string_lossy()),
                (Some(flag), None) => format!("--{flag}"),
                _ => a.get_id().to_string(),
            },
            None => "a setting".into(),
        };
        let refuse = |why: String| {
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{why}\n"))
                .with_cmd(cmd)
        };
        // Not shown: it could be a key.
        let text = value
            .to_str()
            .ok_or_else(|| refuse(format!("invalid value for {name}: not UTF-8")))?;
        let text = match text {
            "" => arg
                .and_then(|a| a.get_default_values().first())
                .and_then(|d| d.to_str())
                .unwrap_or(""),
            t => t,
        };
        // A key's value is never echoed, not even a wrong one.
        let secret = arg
            .and_then(|a| a.get_env())
            .is_some_and(|e| e.to_string_lossy().contains("KEY"));
        (self.0)(text).map_err(|why| {
            if secret {
                refuse(format!("invalid value for {name}: {why}"))
            } else {
                refuse(format!("invalid value {text:?} for {name}: {why}"))
            }
        })
    }
}

/// A number, an address, a range: what `FromStr` reads, surrounding blanks ignored.
fn parsed<T: std::str::FromStr>(s: &str) -> Result<T, String>
where
    T::Err: std::fmt::Display,
{
    s.trim().parse().map_err(|e: T::Err| e.to_string())
}

/// A percentage: a whole number from 0 to 100.
fn percent(s: &str) -> Result<u8, String> {
    parsed::<u8>(s)
        .ok()
        .filter(|p| *p <= 100)
        .ok_or_else(|| format!("{:?}: a whole percentage from 0 to 100", s.trim()))
}

/// The warm pool's window: 5 s to an hour.
fn window_secs(s: &str) -> Result<u64, String> {
    parsed::<u64>(s)
        .ok()
        .filter(|n| (5..=3600).contains(n))
        .ok_or_else(|| format!("{:?}: seconds from 5 to 3600", s.trim()))
}

/// Least `ISOBOX_WBX_JOB_RETENTION_S`: a finished job's webhook event is removed with
/// the job, so the job must outlive every retry (the webhooks' schedule, 21 h).
pub const MIN_JOB_RETENTION_S: u64 = 86_400;

fn retention_secs(s: &str) -> Result<u64, String> {
    parsed::<u64>(s)
        .ok()
        .filter(|n| *n >= MIN_JOB_RETENTION_S)
        .ok_or_else(|| {
            format!(
                "{:?}: at least {MIN_JOB_RETENTION_S} seconds (a day: a finished job's webhook retries take 21 hours, and its event goes with the job)",
                s.trim()
            )
        })
}

/// A currency code: three capital letters.
fn currency(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.len() == 3 && s.bytes().all(|b| b.is_ascii_uppercase()) {
        Ok(s.to_string())
    } else {
        Err("a currency code of three capital letters, like EUR".into())
    }
}

/// Offered classes (a name clap does not read as "repeat the flag").
type ClassList = Vec<&'static str>;
/// Classes' own prices, likewise.
type ClassPrices = Vec<ClassPrice>;

/// A class's own prices (`ISOBOX_WBX_CLASS_PRICES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassPrice {
    /// The class.
    pub class: &'static str,
    /// Per vCPU-second.
    pub vcpu_s: crate::jobs::Money,
    /// Per GB-second.
    pub gb_s: crate::jobs::Money,
}

/// A class's name as the table writes it.
fn class_name(s: &str) -> Result<&'static str, String> {
    crate::jobs::compute::class(s)
        .filter(|_| !s.is_empty())
        .map(|c| c.name)
        .ok_or_else(|| {
            format!(
                "unknown compute class {s:?}; one of {}",
                crate::jobs::compute::names()
            )
        })
}

/// The offered classes: known names, no repeats, economy among them.
fn compute_classes(s: &str) -> Result<Vec<&'static str>, String> {
    let mut out: Vec<&'static str> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let c = class_name(part)?;
        if out.contains(&c) {
            return Err(format!("{c} is named twice"));
        }
        out.push(c);
    }
    if !out.contains(&crate::jobs::compute::DEFAULT) {
        return Err(format!(
            "{} must be offered: it is the class of every request that names none",
            crate::jobs::compute::DEFAULT
        ));
    }
    Ok(out)
}

/// `class=<vCPU-second>/<GB-second>,…`.
fn class_prices(s: &str) -> Result<Vec<ClassPrice>, String> {
    let mut out: Vec<ClassPrice> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || {
            format!("{part:?}: write class=<per vCPU-second>/<per GB-second>, like performance=0.00002/0.000003")
        };
        let (name, prices) = part.split_once('=').ok_or_else(bad)?;
        let (v, g) = prices.split_once('/').ok_or_else(bad)?;
        let class = class_name(name.trim())?;
        if out.iter().any(|p| p.class == class) {
            return Err(format!("{class} is priced twice"));
        }
        out.push(ClassPrice {
            class,
            vcpu_s: money(v)?,
            gb_s: money(g)?,
        });
    }
    Ok(out)
}

/// A price: a non-negative decimal string.
fn money(s: &str) -> Result<crate::jobs::Money, String> {
    crate::jobs::Money::parse(s.trim())
}

/// [`parsed`], or `None` for the empty text (no default).
fn optional<T: std::str::FromStr>(s: &str) -> Result<Option<T>, String>
where
    T::Err: std::fmt::Display,
{
    match s {
        "" => Ok(None),
        s => parsed(s).map(Some),
    }
}

/// The text as given.
fn text(s: &str) -> Result<String, String> {
    Ok(s.to_string())
}

/// A DNS domain of letters, digits, hyphens and dots, with an optional `:port`.
fn public_domain(s: &str) -> Result<String, String> {
    let s = s.trim().trim_end_matches('.').to_ascii_lowercase();
    if s.is_empty() {
        return Ok(s);
    }
    let (d, port) = match s.rsplit_once(':') {
        Some((d, p)) => (d, Some(p)),
        None => (s.as_str(), None),
    };
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
    };
    if d.len() > 200 || !d.split('.').all(label_ok) {
        return Err("a domain like sandboxes.example.com (letters, digits, hyphens, dots), optionally with :port".into());
    }
    if let Some(p) = port {
        if !p.parse::<u16>().is_ok_and(|p| p > 0) {
            return Err("the port after the domain must be 1-65535".into());
        }
    }
    Ok(s)
}

/// `auto`, `drop` or `keep`.
fn forward_others(s: &str) -> Result<crate::netfilter::ForwardOthers, String> {
    use crate::netfilter::ForwardOthers as F;
    match s.trim() {
        "auto" => Ok(F::Auto),
        "drop" => Ok(F::Drop),
        "keep" => Ok(F::Keep),
        _ => Err("auto, drop or keep".into()),
    }
}

/// `http` or `https`.
fn public_scheme(s: &str) -> Result<String, String> {
    match s.trim() {
        "http" | "https" => Ok(s.trim().to_string()),
        _ => Err("http or https".into()),
    }
}

/// The text without surrounding blanks.
fn trimmed(s: &str) -> Result<String, String> {
    Ok(s.trim().to_string())
}

/// A path as given.
fn path(s: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(s))
}

/// A path, or `None` for the empty text.
fn optional_path(s: &str) -> Result<Option<PathBuf>, String> {
    Ok(Some(s).filter(|s| !s.is_empty()).map(PathBuf::from))
}

/// API keys as given, or `None` for the empty text.
fn secret(s: &str) -> Result<Option<Secret>, String> {
    Ok(Some(s)
        .filter(|s| !s.is_empty())
        .map(|s| Secret::new(s.to_string())))
}

/// The metrics key: none when empty, else at least 16 characters with no blank.
fn metrics_key(s: &str) -> Result<Option<Secret>, String> {
    if s.is_empty() {
        return Ok(None);
    }
    if s.len() < 16 || s.chars().any(char::is_whitespace) {
        return Err("a key of at least 16 characters, without blanks".into());
    }
    Ok(Some(Secret::new(s.to_string())))
}

/// The agent's key without surrounding blanks, or `None` for blanks alone.
fn ai_key(s: &str) -> Result<Option<Secret>, String> {
    Ok(Some(s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| Secret::new(s.to_string())))
}

/// The agent's upstream without surrounding blanks and trailing `/`, or `None` (off).
fn ai_base(s: &str) -> Result<Option<String>, String> {
    Ok(Some(s.trim().trim_end_matches('/'))
        .filter(|s| !s.is_empty())
        .map(str::to_string))
}

/// `0`/`false` or `1`/`true`, exactly.
fn zero_one(s: &str) -> Result<bool, String> {
    match s {
        "0" | "false" => Ok(false),
        "1" | "true" => Ok(true),
        _ => Err("0 or 1".into()),
    }
}

/// `text` (false) or `json` (true): the log line format.
fn log_format(s: &str) -> Result<bool, String> {
    match s.trim() {
        "text" => Ok(false),
        "json" => Ok(true),
        _ => Err("text or json".into()),
    }
}

/// `on`/`1`/`true` or `off`/`0`/`false`, surrounding blanks ignored.
fn on_off(s: &str) -> Result<bool, String> {
    match s.trim() {
        "on" | "1" | "true" => Ok(true),
        "off" | "0" | "false" => Ok(false),
        _ => Err("on or off".into()),
    }
}

/// A comma-separated list, each item parsed; empty items are skipped.
fn list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, String>
where
    T::Err: std::fmt::Display,
{
    s.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|i| i.parse().map_err(|e: T::Err| format!("{i:?}: {e}")))
        .collect()
}

/// The trusted proxies: comma-separated CIDRs or addresses, v4 or v6.
fn proxies(s: &str) -> Result<Vec<crate::admission::Cidr>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| crate::admission::Cidr::parse(c).map_err(|e| e.to_string()))
        .collect()
}

/// `name=N,name=N` (`off` or `0`: none).
fn warm_pool(v: &str) -> Result<Vec<(String, usize)>, String> {
    let v = v.trim();
    if v.is_empty() || v == "off" || v == "0" {
        return Ok(Vec::new());
    }
    let mut out: Vec<(String, usize)> = Vec::new();
    for item in v.split(',') {
        let (name, n) = item
            .split_once('=')
            .map(|(a, b)| (a.trim(), b.trim()))
            .ok_or_else(|| format!("{item:?}: name=N pairs, e.g. python=2"))?;
        let n: usize = n
            .parse()
            .ok()
            .filter(|n| *n <= 16)
            .ok_or_else(|| format!("{item:?}: a size from 0 to 16"))?;
        if name.is_empty() || out.iter().any(|(x, _)| x == name) {
            return Err(format!("{item:?}: each runtime once"));
        }
        out.push((name.to_string(), n));
    }
    Ok(out)
}

impl AiConfig {
    /// Whether `/v1/agent` runs loops.
    pub fn enabled(&self) -> bool {
        self.base.is_some()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let url_ok = |u: &str| {
            (u.starts_with("http://") || u.starts_with("https://"))
                && u.len() <= 2048
                && !u.bytes().any(|b| b <= b' ' || b == 0x7f)
        };
        if let Some(base) = &self.base {
            if !url_ok(base) {
                return Err(invalid(
                    "ISOBOX_AI_BASE",
                    base,
                    "an http:// or https:// URL (e.g. https://api.openai.com/v1)",
                ));
            }
            if self.model.is_empty() {
                return Err(invalid(
                    "ISOBOX_AI_MODEL",
                    "",
                    "the model to ask for is required when ISOBOX_AI_BASE is set",
                ));
            }
        }
        if !url_ok(&self.search_url) {
            return Err(invalid(
                "ISOBOX_AI_SEARCH_URL",
                &self.search_url,
                "an http:// or https:// URL",
            ));
        }
        for (name, v, lo, hi) in [
            ("ISOBOX_AI_MAX_ITERS", u64::from(self.max_iters), 1, 64),
            (
                "ISOBOX_AI_RATE_PER_MIN",
                u64::from(self.rate_per_min),
                1,
                100_000,
            ),
            ("ISOBOX_AI_TIMEOUT_SEC", self.timeout_sec, 1, 3600),
            ("ISOBOX_AI_PYTHON_WALL_SEC", self.python_wall_sec, 1, 3600),
            ("ISOBOX_AI_SHELL_WALL_SEC", self.shell_wall_sec, 1, 3600),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(invalid(
                    name,
                    &v.to_string(),
                    &format!("between {lo} and {hi}"),
                ));
            }
        }
        Ok(())
    }
}

/// The WBX face's limits (per tenant, for one box by default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WbxLimits {
    /// Sandboxes a tenant may have at once.
    pub max_sandboxes: usize,
    /// vCPUs of all of a tenant's sandboxes together.
    pub max_vcpu: u32,
    /// Memory of all of a tenant's sandboxes together, MiB.
    pub max_mem_mb: u64,
    /// Longest lifetime a sandbox may be given, seconds (`timeout_s` is capped to it).
    pub max_timeout_s: u64,
    /// Ready sandboxes kept per template (template name, count).
    pub warm_pool: Vec<(String, usize)>,
    /// Sandboxes on this server at once, all tenants together.
    pub max_total: usize,
    /// Background jobs.
    pub jobs: WbxJobs,
}

/// Background jobs' settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WbxJobs {
    /// Jobs running at once, all tenants together.
    pub running: usize,
    /// Unfinished jobs per tenant.
    pub per_tenant: usize,
    /// Longest time limit, seconds.
    pub max_timeout_s: u64,
    /// Bytes of output a job's log keeps.
    pub log_bytes: u64,
    /// How long finished jobs are kept, seconds.
    pub retention_s: u64,
    /// Result files per job.
    pub artifact_files: usize,
    /// Largest result file, bytes.
    pub artifact_file_bytes: u64,
    /// Result files of one job, bytes.
    pub artifact_job_bytes: u64,
    /// Stored result files of one tenant, bytes.
    pub artifact_tenant_bytes: u64,
    /// Bytes of finished jobs' records (and their webhook events) one tenant may keep in
    /// the store (`ISOBOX_WBX_JOB_RECORDS_TENANT_MB`); past it a submit is 429.
    pub records_tenant_bytes: u64,
    /// Billing currency.
    pub currency: String,
    /// Price of a vCPU-second.
    pub price_vcpu_s: crate::jobs::Money,
    /// Price of a GB-second.
    pub price_gb_s: crate::jobs::Money,
    /// The compute classes offered (economy among them).
    pub classes: Vec<&'static str>,
    /// Classes' own prices (the others have `price_vcpu_s` and `price_gb_s`).
    pub class_prices: Vec<ClassPrice>,
    /// Webhooks may go to loopback `http://`.
    pub webhook_loopback: bool,
    /// WebAssembly jobs can run (the worker binary is configured).
    pub wasi: bool,
    /// The operator's denied ranges (`ISOBOX_EGRESS_DENY`), for webhook targets too.
    pub webhook_deny: Vec<crate::netfilter::Cidr>,
    /// Webhooks are on.
    pub webhooks: bool,
}

/// The eryx face (`/eryx`) and its WebAssembly worker.
#[derive(Debug, Clone)]
pub struct EryxConfig {
    /// The worker binary (`None`: the face is off).
    pub worker: Option<PathBuf>,
    /// The worker's snapshot cache.
    pub cache_dir: PathBuf,
    /// Worker processes (one engine thread each): the runs that execute in parallel.
    pub threads: usize,
    /// The workers' memory cap, bytes, shared equally among them.
    pub worker_memory_bytes: u64,
    /// Runs one tenant may have going at once.
    pub concurrency: usize,
    /// A run's time limit, ms.
    pub timeout_ms: u64,
    /// A run's compute units.
    pub fuel_limit: u64,
    /// A run's memory, bytes.
    pub memory_bytes: u64,
    /// How long a callback call waits for its answer, ms.
    pub callback_timeout_ms: u64,
    /// Unexpired sessions one tenant may have.
    pub sessions: usize,
    /// Uploaded environments one tenant may have.
    pub environments: usize,
    /// How long one environment's build may take, ms.
    pub build_timeout_ms: u64,
    /// The memory one environment's build may use, bytes.
    pub build_memory_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by every test that loads: some set `ISOBOX_*` variables, which clap reads.
    static ENV: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn lock() -> std::sync::MutexGuard<'static, ()> {
        ENV.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn load(args: &[&str]) -> Result<Config, ConfigError> {
        let _env = lock();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Config::load(&args)
    }

    /// Runs `f` with the variables `env` set (`None`: unset), then puts them back.
    fn with_env<R>(env: &[(&str, Option<&str>)], f: impl FnOnce() -> R) -> R {
        let _env = lock();
        let saved: Vec<_> = env.iter().map(|(k, _)| (*k, std::env::var_os(k))).collect();
        for (k, v) in env {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
        let r = f();
        for (k, v) in saved {
            match v {
                Some(v) => std::env::set_var(k, v),
                None => std::env::remove_var(k),
            }
        }
        r
    }

    /// [`Config::load`] of `args` under `env`.
    fn load_env(env: &[(&str, Option<&str>)], args: &[&str]) -> Result<Config, ConfigError> {
        with_env(env, || Config::load(args.iter().copied()))
    }

    /// Every flag and its variable, as isoboxd has always named them.
    const NAMES: &[(&str, &str)] = &[
        ("--listen", "ISOBOX_LISTEN"),
        ("--data-dir", "ISOBOX_DATA_DIR"),
        ("--rootfs-dir", "ISOBOX_ROOTFS_DIR"),
        ("--root-images", "ISOBOX_ROOT_IMAGES"),
        ("--image-dir", "ISOBOX_IMAGE_DIR"),
        ("--runtimes-dir", "ISOBOX_RUNTIMES_DIR"),
        ("--instance", "ISOBOX_INSTANCE"),
        ("--runsc", "ISOBOX_RUNSC"),
        ("--platform", "ISOBOX_PLATFORM"),
        ("--log", "ISOBOX_LOG"),
        ("--log-format", "ISOBOX_LOG_FORMAT"),
        ("--workers", "ISOBOX_WORKERS"),
        ("--max-connections", "ISOBOX_MAX_CONNECTIONS"),
        ("--max-connections-per-ip", "ISOBOX_MAX_CONNECTIONS_PER_IP"),
        ("--idle-timeout-ms", "ISOBOX_IDLE_TIMEOUT_MS"),
        ("--head-timeout-ms", "ISOBOX_HEAD_TIMEOUT_MS"),
        ("--max-concurrent", "ISOBOX_MAX_CONCURRENT"),
        ("--slice-memory-bytes", "ISOBOX_SLICE_MEMORY_BYTES"),
        ("--compile-timeout-ms", "ISOBOX_COMPILE_TIMEOUT_MS"),
        ("--sse-keepalive-ms", "ISOBOX_SSE_KEEPALIVE_MS"),
        ("--run-retain-bytes", "ISOBOX_RUN_RETAIN_BYTES"),
        ("--run-retain-s", "ISOBOX_RUN_RETAIN_S"),
        ("--seccomp", "ISOBOX_SECCOMP"),
        ("--api-keys", "ISOBOX_API_KEYS"),
        ("--api-keys-file", "ISOBOX_API_KEYS_FILE"),
        ("--require-auth", "ISOBOX_REQUIRE_AUTH"),
        ("--memory-require-key", "ISOBOX_MEMORY_REQUIRE_KEY"),
        ("--rate-per-min", "ISOBOX_RATE_PER_MIN"),
        ("--rate-burst", "ISOBOX_RATE_BURST"),
        ("--metrics-key", "ISOBOX_METRICS_KEY"),
        ("--trusted-proxies", "ISOBOX_TRUSTED_PROXIES"),
        ("--session-quota-bytes", "ISOBOX_SESSION_QUOTA_BYTES"),
        ("--max-sessions", "ISOBOX_MAX_SESSIONS"),
        (
            "--max-sessions-per-tenant",
            "ISOBOX_MAX_SESSIONS_PER_TENANT",
        ),
        ("--storage-max-bytes", "ISOBOX_STORAGE_MAX_BYTES"),
        ("--storage-reserve-bytes", "ISOBOX_STORAGE_RESERVE_BYTES"),
        ("--session-ttl-max-sec", "ISOBOX_SESSION_TTL_MAX_SEC"),
        ("--volume-quota-bytes", "ISOBOX_VOLUME_QUOTA_BYTES"),
        ("--max-volumes", "ISOBOX_MAX_VOLUMES"),
        ("--max-volumes-per-tenant", "ISOBOX_MAX_VOLUMES_PER_TENANT"),
        ("--egress", "ISOBOX_EGRESS"),
        ("--net-pool", "ISOBOX_NET_POOL"),
        ("--net-dns", "ISOBOX_NET_DNS"),
        ("--egress-deny", "ISOBOX_EGRESS_DENY"),
        ("--egress-verify-sec", "ISOBOX_EGRESS_VERIFY_SEC"),
        ("--egress-max-conns", "ISOBOX_EGRESS_MAX_CONNS"),
        ("--egress-rate", "ISOBOX_EGRESS_RATE"),
        ("--egress-forward-others", "ISOBOX_EGRESS_FORWARD_OTHERS"),
        ("--warm-pool", "ISOBOX_WARM_POOL"),
        ("--warm-pool-max", "ISOBOX_WARM_POOL_MAX"),
        ("--warm-pool-cpu", "ISOBOX_WARM_POOL_CPU"),
        ("--warm-pool-window-sec", "ISOBOX_WARM_POOL_WINDOW_SEC"),
        ("--kernels-max", "ISOBOX_KERNELS_MAX"),
        ("--kernel-idle-sec", "ISOBOX_KERNEL_IDLE_SEC"),
        ("--kernels-per-client", "ISOBOX_KERNELS_PER_CLIENT"),
        ("--kernels-per-tenant", "ISOBOX_KERNELS_PER_TENANT"),
        ("--kernel-evict-idle-sec", "ISOBOX_KERNEL_EVICT_IDLE_SEC"),
        ("--ai-base", "ISOBOX_AI_BASE"),
        ("--ai-key", "ISOBOX_AI_KEY"),
        ("--ai-model", "ISOBOX_AI_MODEL"),
        ("--ai-max-iters", "ISOBOX_AI_MAX_ITERS"),
        ("--ai-rate-per-min", "ISOBOX_AI_RATE_PER_MIN"),
        ("--ai-search", "ISOBOX_AI_SEARCH"),
        ("--ai-search-url", "ISOBOX_AI_SEARCH_URL"),
        ("--ai-timeout-sec", "ISOBOX_AI_TIMEOUT_SEC"),
        ("--ai-python-wall-sec", "ISOBOX_AI_PYTHON_WALL_SEC"),
        ("--ai-shell-wall-sec", "ISOBOX_AI_SHELL_WALL_SEC"),
        ("--shutdown-grace-ms", "ISOBOX_SHUTDOWN_GRACE_MS"),
        ("--wbx-max-sandboxes", "ISOBOX_WBX_MAX_SANDBOXES"),
        ("--wbx-max-vcpu", "ISOBOX_WBX_MAX_VCPU"),
        ("--wbx-max-memory-mb", "ISOBOX_WBX_MAX_MEMORY_MB"),
        ("--wbx-max-total", "ISOBOX_WBX_MAX_TOTAL"),
        ("--wbx-max-timeout-s", "ISOBOX_WBX_MAX_TIMEOUT_S"),
        ("--wbx-warm-pool", "ISOBOX_WBX_WARM_POOL"),
        ("--wbx-jobs-running", "ISOBOX_WBX_JOBS_RUNNING"),
        ("--wbx-jobs-per-tenant", "ISOBOX_WBX_JOBS_PER_TENANT"),
        ("--wbx-job-max-timeout-s", "ISOBOX_WBX_JOB_MAX_TIMEOUT_S"),
        ("--wbx-job-log-mb", "ISOBOX_WBX_JOB_LOG_MB"),
        ("--wbx-job-retention-s", "ISOBOX_WBX_JOB_RETENTION_S"),
        ("--wbx-artifact-files", "ISOBOX_WBX_ARTIFACT_FILES"),
        ("--wbx-artifact-file-mb", "ISOBOX_WBX_ARTIFACT_FILE_MB"),
        ("--wbx-artifact-job-mb", "ISOBOX_WBX_ARTIFACT_JOB_MB"),
        ("--wbx-artifact-tenant-mb", "ISOBOX_WBX_ARTIFACT_TENANT_MB"),
        (
            "--wbx-job-records-tenant-mb",
            "ISOBOX_WBX_JOB_RECORDS_TENANT_MB",
        ),
        ("--wbx-currency", "ISOBOX_WBX_CURRENCY"),
        ("--wbx-price-vcpu-s", "ISOBOX_WBX_PRICE_VCPU_S"),
        ("--wbx-price-gb-s", "ISOBOX_WBX_PRICE_GB_S"),
        ("--wbx-compute-classes", "ISOBOX_WBX_COMPUTE_CLASSES"),
        ("--wbx-class-prices", "ISOBOX_WBX_CLASS_PRICES"),
        ("--wbx-webhook-loopback", "ISOBOX_WBX_WEBHOOK_LOOPBACK"),
        ("--wbx-webhooks", "ISOBOX_WBX_WEBHOOKS"),
        ("--public-domain", "ISOBOX_PUBLIC_DOMAIN"),
        ("--public-scheme", "ISOBOX_PUBLIC_SCHEME"),
        ("--init", "ISOBOX_INIT"),
        ("--wasm-worker", "ISOBOX_WASM_WORKER"),
        ("--wasm-cache-dir", "ISOBOX_WASM_CACHE_DIR"),
        ("--wasm-threads", "ISOBOX_WASM_THREADS"),
        ("--wasm-worker-memory-mb", "ISOBOX_WASM_WORKER_MEMORY_MB"),
        ("--eryx-concurrency", "ISOBOX_ERYX_CONCURRENCY"),
        ("--eryx-timeout-s", "ISOBOX_ERYX_TIMEOUT_S"),
        ("--eryx-fuel-limit", "ISOBOX_ERYX_FUEL_LIMIT"),
        ("--eryx-memory-mb", "ISOBOX_ERYX_MEMORY_MB"),
        (
            "--eryx-callback-timeout-ms",
            "ISOBOX_ERYX_CALLBACK_TIMEOUT_MS",
        ),
        ("--eryx-sessions", "ISOBOX_ERYX_SESSIONS"),
        ("--eryx-environments", "ISOBOX_ERYX_ENVIRONMENTS"),
        ("--eryx-build-timeout-s", "ISOBOX_ERYX_BUILD_TIMEOUT_S"),
        ("--eryx-build-memory-mb", "ISOBOX_ERYX_BUILD_MEMORY_MB"),
        ("--eryx-rate-per-min", "ISOBOX_ERYX_RATE_PER_MIN"),
        ("--eryx-rate-burst", "ISOBOX_ERYX_RATE_BURST"),
    ];

    #[test]
    fn egress_limits_have_defaults_and_bounds() {
        // Run under whatever ISOBOX_* the environment has; flags override it.
        let c = load(&["--egress-max-conns", "256", "--egress-rate", "12500000"]).unwrap();
        assert_eq!((c.egress.max_conns, c.egress.rate_bytes), (256, 12_500_000));
        for (v, ok) in [("0", false), ("1", true), ("65536", true), ("65537", false)] {
            let r = load(&["--egress-max-conns", v]);
            assert_eq!(r.is_ok(), ok, "max conns {v}: {r:?}");
        }
        for (v, ok) in [
            ("65535", false),
            ("65536", true),
            ("10000000000", true),
            ("10000000001", false),
            ("-1", false),
            ("1e6", false),
        ] {
            let r = load(&["--egress-rate", v]);
            assert_eq!(r.is_ok(), ok, "rate {v}: {r:?}");
            if let Err(e) = r {
                assert!(e.to_string().contains("ISOBOX_EGRESS_RATE"), "{e}");
            }
        }
    }

    #[test]
    fn a_flag_beats_its_variable_which_beats_the_default() {
        let workers = |env: Option<&str>, args: &[&str]| {
            load_env(&[("ISOBOX_WORKERS", env)], args).unwrap().workers
        };
        assert_eq!(workers(None, &[]), 4);
        assert_eq!(workers(Some("7"), &[]), 7);
        assert_eq!(workers(Some("7"), &["--workers", "9"]), 9);
        assert_eq!(workers(None, &["--workers=9"]), 9);
        // A repeated flag: the last one wins, as before.
        assert_eq!(workers(Some("7"), &["--workers", "2", "--workers", "3"]), 3);
        // An empty value is the default, from either side.
        assert_eq!(workers(Some(""), &[]), 4);
        assert_eq!(workers(Some("7"), &["--workers="]), 4);
        // Lists and strings the same way.
        let env = [
            ("ISOBOX_NET_DNS", Some("9.9.9.9")),
            ("ISOBOX_INSTANCE", Some("isobox-env")),
            ("ISOBOX_WARM_POOL", None),
        ];
        let c = load_env(&env, &[]).unwrap();
        assert_eq!(c.egress.dns, vec![Ipv4Addr::new(9, 9, 9, 9)]);
        assert_eq!(c.instance, "isobox-env");
        let pool = |v: &[(&str, usize)]| -> Vec<(String, usize)> {
            v.iter().map(|(n, k)| (n.to_string(), *k)).collect()
        };
        assert_eq!(
            c.warm_pool,
            pool(&[("python", 2), ("python-slim", 1), ("javascript", 1)])
        );
        assert_eq!(
            c.warm_pool_max,
            pool(&[("python", 4), ("python-slim", 2), ("javascript", 2)])
        );
        assert_eq!((c.warm_pool_cpu, c.warm_pool_window_sec), (25, 60));
        // (setting, value, what it reads as, or None: refused)
        for (k, v, ok) in [
            ("ISOBOX_WARM_POOL_WINDOW_SEC", "4", None),
            ("ISOBOX_WARM_POOL_WINDOW_SEC", "5", Some(5)),
            ("ISOBOX_WARM_POOL_WINDOW_SEC", "3600", Some(3600)),
            ("ISOBOX_WARM_POOL_WINDOW_SEC", "3601", None),
            ("ISOBOX_WARM_POOL_CPU", "0", Some(0)),
            ("ISOBOX_WARM_POOL_CPU", "100", Some(100)),
            ("ISOBOX_WARM_POOL_CPU", "101", None),
            ("ISOBOX_WARM_POOL_CPU", "-1", None),
            ("ISOBOX_WARM_POOL_CPU", "x", None),
            ("ISOBOX_WBX_JOB_RETENTION_S", "0", None),
            ("ISOBOX_WBX_JOB_RETENTION_S", "86399", None),
            ("ISOBOX_WBX_JOB_RETENTION_S", "86400", Some(86_400)),
            ("ISOBOX_WBX_JOB_RETENTION_S", "86401", Some(86_401)),
        ] {
            let got = load_env(&[(k, Some(v))], &[]).ok().map(|c| match k {
                "ISOBOX_WARM_POOL_CPU" => u64::from(c.warm_pool_cpu),
                "ISOBOX_WBX_JOB_RETENTION_S" => c.wbx.jobs.retention_s,
                _ => c.warm_pool_window_sec,
            });
            assert_eq!(got, ok, "{k}={v}");
        }
        let c = load_env(
            &env,
            &["--net-dns", "1.0.0.1, 8.8.4.4", "--instance", "isobox-flag"],
        )
        .unwrap();
        assert_eq!(
            c.egress.dns,
            vec![Ipv4Addr::new(1, 0, 0, 1), Ipv4Addr::new(8, 8, 4, 4)]
        );
        assert_eq!(c.instance, "isobox-flag");
        let c = load_env(
            &[("ISOBOX_WARM_POOL", Some("off"))],
            &["--warm-pool", "ruby=3"],
        )
        .unwrap();
        assert_eq!(c.warm_pool, pool(&[("ruby", 3)]));
        assert_eq!(
            load_env(&[("ISOBOX_WARM_POOL", Some("off"))], &[])
                .unwrap()
                .warm_pool,
            []
        );
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let unset: Vec<(&str, Option<&str>)> = NAMES.iter().map(|(_, e)| (*e, None)).collect();
        let c = load_env(&unset, &[]).unwrap();
        assert_eq!(c.listen, "127.0.0.1:8090".parse::<SocketAddr>().unwrap());
        assert_eq!(c.data_dir, PathBuf::from("/var/lib/isobox"));
        assert_eq!(c.rootfs_dir, PathBuf::from("/var/lib/isobox/rootfs"));
        assert_eq!(c.runtimes_dir, None);
        assert_eq!(
            (c.instance.as_str(), c.platform.as_str()),
            ("isobox", "ptrace")
        );
        assert_eq!(c.runsc, PathBuf::from("/usr/bin/runsc"));
        assert_eq!(c.log_level, "info");
        assert!(!c.log_json);
        assert_eq!(
            (c.workers, c.max_connections, c.max_connections_per_ip),
            (4, 1024, 256)
        );
        assert_eq!((c.idle_timeout_ms, c.head_timeout_ms), (60_000, 10_000));
        assert_eq!(c.max_concurrent, 4);
        assert_eq!(c.slice_memory_bytes, crate::sys::host_memory_bytes() / 2);
        assert_eq!((c.compile_timeout_ms, c.sse_keepalive_ms), (30_000, 10_000));
        assert_eq!((c.run_retain_bytes, c.run_retain_s), (64 << 20, 600));
        assert_eq!(c.shutdown_grace_ms, 10_000);
        assert!(c.seccomp);
        let a = &c.admission;
        assert!(a.api_keys.is_none() && a.api_keys_file.is_none());
        assert!(!a.require_auth && !a.memory_require_key);
        assert_eq!(
            (a.rate_per_min, a.rate_burst, a.ai_rate_per_min),
            (30, 10, 6)
        );
        assert!(a.trusted_proxies.is_empty());
        let s = &c.sessions;
        assert_eq!(
            (s.quota_bytes, s.volume_quota_bytes),
            (512 << 20, 512 << 20)
        );
        assert_eq!((s.max_sessions, s.max_volumes), (1000, 1000));
        assert_eq!(
            (s.storage_max_bytes, s.storage_reserve_bytes),
            (32 << 30, 2 << 30)
        );
        assert_eq!(s.ttl_max_sec, 7 * 86_400);
        let e = &c.egress;
        assert!(e.enabled);
        assert_eq!(e.pool, crate::netfilter::Cidr::DEFAULT_POOL);
        assert_eq!(
            e.dns,
            vec![Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::new(8, 8, 8, 8)]
        );
        assert!(e.deny.is_empty());
        assert_eq!(
            (e.verify_sec, e.max_conns, e.rate_bytes),
            (10, 256, 12_500_000)
        );
        assert_eq!(c.warm_pool.len(), 3);
        assert_eq!((c.kernels_max, c.kernel_idle_sec), (4, 1800));
        let ai = &c.ai;
        assert!(ai.base.is_none() && ai.key.is_none() && ai.model.is_empty());
        assert_eq!((ai.max_iters, ai.rate_per_min), (8, 6));
        assert!(ai.search);
        assert_eq!(ai.search_url, "https://html.duckduckgo.com/html/");
        assert_eq!(
            (ai.timeout_sec, ai.python_wall_sec, ai.shell_wall_sec),
            (120, 60, 180)
        );
    }

    #[test]
    fn seccomp_is_on_unless_set_to_0() {
        assert!(load_env(&[("ISOBOX_SECCOMP", None)], &[]).unwrap().seccomp);
        assert!(
            !load_env(&[("ISOBOX_SECCOMP", Some("0"))], &[])
                .unwrap()
                .seccomp
        );
        assert!(
            load_env(&[("ISOBOX_SECCOMP", Some("0"))], &["--seccomp", "1"])
                .unwrap()
                .seccomp
        );
    }

    #[test]
    fn log_format_is_text_or_json() {
        let json = load_env(&[("ISOBOX_LOG_FORMAT", Some("json"))], &[]).unwrap();
        assert!(json.log_json);
        let text = load_env(
            &[("ISOBOX_LOG_FORMAT", Some("json"))],
            &["--log-format", "text"],
        );
        assert!(!text.unwrap().log_json);
    }

    #[test]
    fn an_invalid_variable_is_refused_by_name() {
        for (var, value) in [
            ("ISOBOX_LISTEN", "nope"),
            ("ISOBOX_WORKERS", "four"),
            ("ISOBOX_EGRESS", "maybe"),
            ("ISOBOX_REQUIRE_AUTH", "yes"),
            ("ISOBOX_SECCOMP", "off"),
            ("ISOBOX_NET_DNS", "1.1.1.1,resolver"),
            ("ISOBOX_TRUSTED_PROXIES", "10.0.0.0/99"),
            ("ISOBOX_WARM_POOL", "python=99"),
            ("ISOBOX_SLICE_MEMORY_BYTES", "lots"),
            ("ISOBOX_LOG_FORMAT", "yaml"),
        ] {
            let e = load_env(&[(var, Some(value))], &[]).unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, ConfigError::Args(_)), "{var}: {msg}");
            assert!(msg.contains(var) && msg.contains(value), "{var}: {msg}");
        }
        // Range checks name the variable too, and take their bounds.
        let e = load_env(&[("ISOBOX_WORKERS", Some("65"))], &[]).unwrap_err();
        assert!(e.to_string().contains("ISOBOX_WORKERS"), "{e}");
        for (var, below, at_low, at_high, above) in [
            (
                "ISOBOX_RUN_RETAIN_BYTES",
                "65535",
                "65536",
                "17179869184",
                "17179869185",
            ),
            ("ISOBOX_RUN_RETAIN_S", "0", "1", "86400", "86401"),
        ] {
            for bad in [below, above] {
                let e = load_env(&[(var, Some(bad))], &[]).unwrap_err();
                assert!(e.to_string().contains(var), "{var}={bad}: {e}");
            }
            for good in [at_low, at_high] {
                assert!(load_env(&[(var, Some(good))], &[]).is_ok(), "{var}={good}");
            }
        }
    }

    #[test]
    fn compute_classes_and_their_prices() {
        let c = load_env(&[], &[]).unwrap();
        assert_eq!(
            c.wbx.jobs.classes,
            ["economy", "balanced", "performance", "memory"]
        );
        assert!(c.wbx.jobs.class_prices.is_empty());
        let c = load_env(
            &[
                ("ISOBOX_WBX_COMPUTE_CLASSES", Some(" economy , dedicated ")),
                (
                    "ISOBOX_WBX_CLASS_PRICES",
                    Some("dedicated=0.0001/0.00002, economy=0/0"),
                ),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.wbx.jobs.classes, ["economy", "dedicated"]);
        let m = |s: &str| crate::jobs::Money::parse(s).unwrap();
        assert_eq!(
            c.wbx.jobs.class_prices,
            [
                ClassPrice {
                    class: "dedicated",
                    vcpu_s: m("0.0001"),
                    gb_s: m("0.00002")
                },
                ClassPrice {
                    class: "economy",
                    vcpu_s: m("0"),
                    gb_s: m("0")
                },
            ]
        );
        for (var, bad, why) in [
            (
                "ISOBOX_WBX_COMPUTE_CLASSES",
                "balanced,memory",
                "economy must be offered",
            ),
            (
                "ISOBOX_WBX_COMPUTE_CLASSES",
                "economy,turbo",
                "unknown compute class",
            ),
            (
                "ISOBOX_WBX_COMPUTE_CLASSES",
                "economy,economy",
                "named twice",
            ),
            (
                "ISOBOX_WBX_CLASS_PRICES",
                "memory=0.1",
                "class=<per vCPU-second>",
            ),
            (
                "ISOBOX_WBX_CLASS_PRICES",
                "memory:0.1/0.2",
                "class=<per vCPU-second>",
            ),
            (
                "ISOBOX_WBX_CLASS_PRICES",
                "turbo=0.1/0.2",
                "unknown compute class",
            ),
            ("ISOBOX_WBX_CLASS_PRICES", "memory=-1/0", "is not an amount"),
            (
                "ISOBOX_WBX_CLASS_PRICES",
                "memory=1/0,memory=2/0",
                "priced twice",
            ),
        ] {
            let e = load_env(&[(var, Some(bad))], &[]).unwrap_err().to_string();
            assert!(e.contains(var) && e.contains(why), "{var}={bad}: {e}");
        }
    }

    #[test]
    fn spellings_accepted_as_before() {
        for (v, on) in [
            ("on", true),
            ("1", true),
            ("true", true),
            (" off ", false),
            ("0", false),
            ("false", false),
        ] {
            let c = load_env(
                &[("ISOBOX_EGRESS", Some(v)), ("ISOBOX_AI_SEARCH", Some(v))],
                &[],
            )
            .unwrap();
            assert_eq!((c.egress.enabled, c.ai.search), (on, on), "{v:?}");
        }
        for (v, on) in [("1", true), ("true", true), ("0", false), ("false", false)] {
            let c = load(&["--require-auth", v, "--memory-require-key", v]).unwrap();
            assert_eq!(
                (c.admission.require_auth, c.admission.memory_require_key),
                (on, on),
                "{v:?}"
            );
        }
        assert!(load(&["--require-auth", "on"]).is_err());
        let c = load_env(
            &[
                ("ISOBOX_AI_BASE", Some(" http://127.0.0.1:9/v1/ ")),
                ("ISOBOX_AI_MODEL", Some(" m ")),
            ],
            &[
                "--trusted-proxies",
                "127.0.0.1, ::1/128,",
                "--egress-deny",
                "192.0.2.0/24",
            ],
        )
        .unwrap();
        assert_eq!(c.ai.base.as_deref(), Some("http://127.0.0.1:9/v1"));
        assert_eq!(c.ai.model, "m");
        assert_eq!(c.admission.trusted_proxies.len(), 2);
        assert_eq!(c.egress.deny, vec!["192.0.2.0/24".parse().unwrap()]);
    }

    #[test]
    fn an_unknown_flag_is_refused_without_its_value() {
        for args in [
            &["--no-such-flag"][..],
            &["--ai-kye=sk-do-not-print"],
            &["stray"],
        ] {
            match load(args) {
                Err(ConfigError::Args(e)) => {
                    assert_eq!(e.kind(), clap::error::ErrorKind::UnknownArgument, "{e}");
                    assert!(!e.to_string().contains("sk-do-not"), "{e}");
                }
                r => panic!("{args:?}: {:?}", r.map(|_| ())),
            }
        }
        match load(&["--listen"]) {
            Err(ConfigError::Args(e)) => assert!(e.to_string().contains("--listen"), "{e}"),
            r => panic!("{:?}", r.map(|_| ())),
        }
    }

    #[test]
    fn help_lists_every_setting_with_its_variable_and_version_is_the_build() {
        let secret = [("ISOBOX_AI_KEY", Some("sk-env-secret"))];
        let help = with_env(&secret, Config::help);
        // What `--help` prints, as `-h` does.
        for h in ["--help", "-h"] {
            match load_env(&secret, &[h]) {
                Err(ConfigError::Args(e)) => {
                    assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
                    assert_eq!(e.to_string(), help);
                }
                r => panic!("{:?}", r.map(|_| ())),
            }
        }
        assert!(
            help.starts_with("run untrusted code in gVisor sandboxes over HTTP\n"),
            "{help}"
        );
        let lines: Vec<&str> = help.lines().collect();
        for (flag, env) in NAMES {
            let at = lines
                .iter()
                .position(|l| l.trim_start().starts_with(&format!("{flag} <")))
                .unwrap_or_else(|| panic!("{flag} missing:\n{help}"));
            assert!(
                lines[at + 1].contains(&format!("[env: {env}]")),
                "{flag}: {}",
                lines[at + 1]
            );
        }
        assert!(help.contains("[default: 127.0.0.1:8090]"), "{help}");
        assert!(!help.contains("sk-env-secret"), "{help}");
        // Every setting there is is in NAMES.
        let flags = lines
            .iter()
            .filter(|l| l.trim_start().starts_with("--"))
            .count();
        assert_eq!(flags, NAMES.len(), "{help}");
        match load(&["--version"]) {
            Err(ConfigError::Args(e)) => {
                assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion);
                assert_eq!(
                    e.to_string().trim_end(),
                    format!("isoboxd {}", crate::VERSION)
                );
            }
            r => panic!("{:?}", r.map(|_| ())),
        }
        // `-V` too (issue 27).
        match load(&["-V"]) {
            Err(ConfigError::Args(e)) => {
                assert_eq!(e.kind(), clap::error::ErrorKind::DisplayVersion);
            }
            r => panic!("{:?}", r.map(|_| ())),
        }
    }

    #[test]
    fn help_is_grouped_by_topic_and_says_what_each_value_takes() {
        let help = with_env(&[], Config::help);
        let lines: Vec<&str> = help.lines().collect();
        let heading = |h: &str| {
            lines
                .iter()
                .position(|l| *l == format!("{h}:"))
                .unwrap_or_else(|| panic!("no heading {h}:\n{help}"))
        };
        // Each setting sits under its topic's heading.
        for (h, flag) in [
            ("Server", "--listen <LISTEN>"),
            ("Connections", "--idle-timeout-ms <IDLE_TIMEOUT_MS>"),
            ("API keys and rate limits", "--rate-per-min <RATE_PER_MIN>"),
            ("Sandboxes and runtimes", "--runsc <RUNSC>"),
            (
                "Sessions, volumes and storage",
                "--max-sessions <MAX_SESSIONS>",
            ),
            (
                "Kernel sessions",
                "--kernels-per-client <KERNELS_PER_CLIENT>",
            ),
            ("Network", "--egress <on|off>"),
            ("Server-side agent", "--ai-model <AI_MODEL>"),
            ("WBX face (/wbx)", "--wbx-max-sandboxes <WBX_MAX_SANDBOXES>"),
        ] {
            let at = lines
                .iter()
                .position(|l| l.trim_start() == flag)
                .unwrap_or_else(|| panic!("no {flag}:\n{help}"));
            let under = lines[..at]
                .iter()
                .rposition(|l| !l.starts_with(' ') && l.ends_with(':'))
                .unwrap();
            assert_eq!(under, heading(h), "{flag} is not under {h}:\n{help}");
        }
        // Switches say which values they take; no setting shows an empty default.
        for flag in [
            "--seccomp <0|1>",
            "--require-auth <0|1>",
            "--memory-require-key <0|1>",
            "--ai-search <on|off>",
        ] {
            assert!(
                lines.iter().any(|l| l.trim_start() == flag),
                "{flag}:\n{help}"
            );
        }
        assert!(!help.contains("[default: ]"), "{help}");
    }

    #[test]
    fn eryx_limits_at_below_and_above_their_bounds() {
        let c = load(&[]).unwrap();
        assert_eq!(
            (
                c.eryx.threads,
                c.eryx.concurrency,
                c.eryx.timeout_ms,
                c.eryx.memory_bytes
            ),
            (2, 5, 30_000, 64 << 20)
        );
        assert_eq!(c.eryx.worker_memory_bytes, 1024 << 20);
        assert_eq!(c.eryx.callback_timeout_ms, 30_000);
        assert_eq!(c.eryx.sessions, 50);
        for n in [1, 10_000] {
            let c = load(&["--eryx-sessions", &n.to_string()]).unwrap();
            assert_eq!(c.eryx.sessions, n);
        }
        let a = &load(&[]).unwrap().admission;
        assert_eq!((a.tenant_rate_per_min, a.tenant_rate_burst), (600, 100));
        for (rate, burst) in [(1, 1), (1_000_000, 100_000)] {
            let c = load(&[
                "--eryx-rate-per-min",
                &rate.to_string(),
                "--eryx-rate-burst",
                &burst.to_string(),
            ])
            .unwrap();
            assert_eq!(
                (
                    c.admission.tenant_rate_per_min,
                    c.admission.tenant_rate_burst
                ),
                (rate, burst)
            );
        }
        assert_eq!(
            c.eryx.cache_dir,
            std::path::PathBuf::from("/var/cache/isobox/wasm")
        );
        assert!(load(&["--wasm-worker", "off"])
            .unwrap()
            .eryx
            .worker
            .is_none());
        for ok in [
            &["--wasm-threads", "1"][..],
            &["--wasm-threads", "64", "--wasm-worker-memory-mb", "12288"],
            &["--eryx-memory-mb", "16"],
            &["--wasm-worker-memory-mb", "384"],
            &["--eryx-callback-timeout-ms", "100"],
            &["--eryx-callback-timeout-ms", "600000"],
            &[
                "--eryx-timeout-s",
                "1",
                "--eryx-fuel-limit",
                "1",
                "--eryx-concurrency",
                "1",
            ],
        ] {
            assert!(load(ok).is_ok(), "{ok:?}");
        }
        for (bad, name) in [
            (&["--wasm-threads", "0"][..], "ISOBOX_WASM_THREADS"),
            (&["--wasm-threads", "65"], "ISOBOX_WASM_THREADS"),
            (&["--eryx-memory-mb", "15"], "ISOBOX_ERYX_MEMORY_MB"),
            (
                &["--eryx-callback-timeout-ms", "99"],
                "ISOBOX_ERYX_CALLBACK_TIMEOUT_MS",
            ),
            (
                &["--eryx-callback-timeout-ms", "600001"],
                "ISOBOX_ERYX_CALLBACK_TIMEOUT_MS",
            ),
            (
                &["--wasm-worker-memory-mb", "383"],
                "ISOBOX_WASM_WORKER_MEMORY_MB",
            ),
            (
                &["--wasm-threads", "64", "--wasm-worker-memory-mb", "12287"],
                "ISOBOX_WASM_WORKER_MEMORY_MB",
            ),
            (&["--eryx-timeout-s", "0"], "ISOBOX_ERYX_TIMEOUT_S"),
            (&["--eryx-fuel-limit", "0"], "ISOBOX_ERYX_FUEL_LIMIT"),
            (&["--eryx-concurrency", "0"], "ISOBOX_ERYX_CONCURRENCY"),
            (&["--eryx-sessions", "0"], "ISOBOX_ERYX_SESSIONS"),
            (&["--eryx-sessions", "10001"], "ISOBOX_ERYX_SESSIONS"),
            (&["--eryx-environments", "0"], "ISOBOX_ERYX_ENVIRONMENTS"),
            (&["--eryx-environments", "1001"], "ISOBOX_ERYX_ENVIRONMENTS"),
            (
                &["--eryx-build-timeout-s", "29"],
                "ISOBOX_ERYX_BUILD_TIMEOUT_S",
            ),
            (
                &["--eryx-build-timeout-s", "3601"],
                "ISOBOX_ERYX_BUILD_TIMEOUT_S",
            ),
            (
                &["--eryx-build-memory-mb", "511"],
                "ISOBOX_ERYX_BUILD_MEMORY_MB",
            ),
            (
                &["--eryx-build-memory-mb", "65537"],
                "ISOBOX_ERYX_BUILD_MEMORY_MB",
            ),
            (&["--eryx-rate-per-min", "0"], "ISOBOX_ERYX_RATE_PER_MIN"),
            (
                &["--eryx-rate-per-min", "1000001"],
                "ISOBOX_ERYX_RATE_PER_MIN",
            ),
            (&["--eryx-rate-burst", "0"], "ISOBOX_ERYX_RATE_BURST"),
            (&["--eryx-rate-burst", "100001"], "ISOBOX_ERYX_RATE_BURST"),
        ] {
            let e = load(bad).unwrap_err().to_string();
            assert!(e.contains(name), "{bad:?}: {e}");
        }
    }

    #[test]
    fn metrics_key_at_below_and_above_its_length_and_never_echoed() {
        let key = |v: &str| load(&["--metrics-key", v]).map(|c| c.admission.metrics_key.is_some());
        assert!(matches!(key(&"k".repeat(16)), Ok(true)));
        assert!(matches!(key(&"k".repeat(17)), Ok(true)));
        match key(&"s".repeat(15)) {
            Err(ConfigError::Args(e)) => {
                let text = e.to_string();
                assert!(text.contains("at least 16 characters"), "{text}");
                assert!(!text.contains(&"s".repeat(15)), "{text}");
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
        assert!(key("sixteen chars ok").is_err(), "blanks are refused");
        assert!(matches!(
            load(&[]).map(|c| c.admission.metrics_key.is_none()),
            Ok(true)
        ));
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let c = load(&[
            "--ai-key",
            "sk-flag-secret",
            "--api-keys",
            "k-inline-secret",
            "--ai-base",
            "http://127.0.0.1:9/v1",
            "--ai-model",
            "m",
        ])
        .unwrap();
        assert_eq!(
            c.ai.key.as_ref().map(Secret::expose),
            Some("sk-flag-secret")
        );
        let dbg = format!("{c:?}");
        assert!(
            !dbg.contains("sk-flag-secret") && !dbg.contains("k-inline-secret"),
            "{dbg}"
        );
    }
}
