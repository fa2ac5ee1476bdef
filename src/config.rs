//! Configuration: `ISOBOX_*` environment variables, overridden by command-line flags.
//!
//! Loaded once in `main` and passed down by reference. Every setting is listed in
//! [`SETTINGS`], which also renders `isoboxd --help`.

use std::net::SocketAddr;
use std::path::PathBuf;

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
    /// An unknown flag.
    #[error("unknown flag {0} (see --help)")]
    UnknownFlag(String),
}

/// One setting: flag, environment variable, default, meaning.
pub struct Setting {
    /// `--flag`.
    pub flag: &'static str,
    /// `ISOBOX_*`.
    pub env: &'static str,
    /// Default shown in `--help`.
    pub default: &'static str,
    /// What it does.
    pub help: &'static str,
}

/// Every setting isoboxd reads.
pub const SETTINGS: &[Setting] = &[
    Setting {
        flag: "--listen",
        env: "ISOBOX_LISTEN",
        default: "127.0.0.1:8090",
        help: "address to listen on (port 0 picks a free one)",
    },
    Setting {
        flag: "--data-dir",
        env: "ISOBOX_DATA_DIR",
        default: "/var/lib/isobox",
        help: "state directory (runs, LMDB, workspaces)",
    },
    Setting {
        flag: "--rootfs-dir",
        env: "ISOBOX_ROOTFS_DIR",
        default: "/var/lib/isobox/rootfs",
        help: "where `make runtimes` builds the runtimes' root filesystems",
    },
    Setting {
        flag: "--runtimes-dir",
        env: "ISOBOX_RUNTIMES_DIR",
        default: "(embedded)",
        help: "directory of runtime descriptors (*.toml); default: the ones built into the binary",
    },
    Setting {
        flag: "--instance",
        env: "ISOBOX_INSTANCE",
        default: "isobox",
        help: "name for this daemon's cgroups, runsc root and containers; must start with `isobox`",
    },
    Setting {
        flag: "--runsc",
        env: "ISOBOX_RUNSC",
        default: "/usr/bin/runsc",
        help: "path of the runsc binary",
    },
    Setting {
        flag: "--platform",
        env: "ISOBOX_PLATFORM",
        default: "ptrace",
        help: "gVisor platform (ptrace works everywhere; kvm needs /dev/kvm)",
    },
    Setting {
        flag: "--log",
        env: "ISOBOX_LOG",
        default: "info",
        help: "log level: error, warn, info, debug, trace",
    },
    Setting {
        flag: "--workers",
        env: "ISOBOX_WORKERS",
        default: "4",
        help: "worker threads for blocking work",
    },
    Setting {
        flag: "--max-connections",
        env: "ISOBOX_MAX_CONNECTIONS",
        default: "1024",
        help: "open connections beyond this are answered 503 and closed",
    },
    Setting {
        flag: "--max-connections-per-ip",
        env: "ISOBOX_MAX_CONNECTIONS_PER_IP",
        default: "256",
        help: "open connections from one address (IPv6: one /64) beyond this are answered 503 and closed",
    },
    Setting {
        flag: "--idle-timeout-ms",
        env: "ISOBOX_IDLE_TIMEOUT_MS",
        default: "60000",
        help: "an idle keep-alive connection is closed after this",
    },
    Setting {
        flag: "--head-timeout-ms",
        env: "ISOBOX_HEAD_TIMEOUT_MS",
        default: "10000",
        help: "a request head must arrive within this (slowloris guard)",
    },
    Setting {
        flag: "--max-concurrent",
        env: "ISOBOX_MAX_CONCURRENT",
        default: "4",
        help: "executions at once; the next gets 429 capacity",
    },
    Setting {
        flag: "--slice-memory-bytes",
        env: "ISOBOX_SLICE_MEMORY_BYTES",
        default: "(half of host memory)",
        help: "memory cap of the protective cgroup slice holding every sandbox",
    },
    Setting {
        flag: "--compile-timeout-ms",
        env: "ISOBOX_COMPILE_TIMEOUT_MS",
        default: "30000",
        help: "time limit of the build step of compiled runtimes (go, rust, typescript)",
    },
    Setting {
        flag: "--sse-keepalive-ms",
        env: "ISOBOX_SSE_KEEPALIVE_MS",
        default: "10000",
        help: "interval of `: keep-alive` comments on silent SSE streams",
    },
    Setting {
        flag: "--api-keys",
        env: "ISOBOX_API_KEYS",
        default: "(none: open API)",
        help:
            "comma-separated API keys; with keys, requests need X-API-Key or Authorization: Bearer",
    },
    Setting {
        flag: "--api-keys-file",
        env: "ISOBOX_API_KEYS_FILE",
        default: "(none)",
        help: "file with one API key per line, re-read on SIGHUP",
    },
    Setting {
        flag: "--require-auth",
        env: "ISOBOX_REQUIRE_AUTH",
        default: "0",
        help: "1: refuse to start without API keys; keys required everywhere even with --memory-require-key",
    },
    Setting {
        flag: "--memory-require-key",
        env: "ISOBOX_MEMORY_REQUIRE_KEY",
        default: "0",
        help: "1: with keys, require them only on /v1/memory, /v1/volumes and POST /v1/agent (the public demo's setup)",
    },
    Setting {
        flag: "--rate-per-min",
        env: "ISOBOX_RATE_PER_MIN",
        default: "30",
        help: "per-client /execute requests per minute (token bucket refill)",
    },
    Setting {
        flag: "--rate-burst",
        env: "ISOBOX_RATE_BURST",
        default: "10",
        help: "per-client token bucket size",
    },
    Setting {
        flag: "--trusted-proxies",
        env: "ISOBOX_TRUSTED_PROXIES",
        default: "(none)",
        help: "comma-separated CIDRs whose X-Forwarded-For is believed",
    },
    Setting {
        flag: "--session-quota-bytes",
        env: "ISOBOX_SESSION_QUOTA_BYTES",
        default: "536870912",
        help: "disk quota of each session's /workspace (its own filesystem)",
    },
    Setting {
        flag: "--max-sessions",
        env: "ISOBOX_MAX_SESSIONS",
        default: "1000",
        help: "sessions that may exist at once (429 too_many_sessions above)",
    },
    Setting {
        flag: "--storage-max-bytes",
        env: "ISOBOX_STORAGE_MAX_BYTES",
        default: "34359738368",
        help: "disk all session workspaces may really use together (507 storage_full above)",
    },
    Setting {
        flag: "--storage-reserve-bytes",
        env: "ISOBOX_STORAGE_RESERVE_BYTES",
        default: "2147483648",
        help: "free disk kept on the data dir's filesystem (507 storage_full below)",
    },
    Setting {
        flag: "--session-ttl-max-sec",
        env: "ISOBOX_SESSION_TTL_MAX_SEC",
        default: "604800",
        help: "largest ttlSec a session may ask for (larger values are clamped)",
    },
    Setting {
        flag: "--volume-quota-bytes",
        env: "ISOBOX_VOLUME_QUOTA_BYTES",
        default: "536870912",
        help: "disk quota of each volume (its own filesystem, mounted at /memory)",
    },
    Setting {
        flag: "--max-volumes",
        env: "ISOBOX_MAX_VOLUMES",
        default: "1000",
        help: "volumes that may exist at once (429 too_many_volumes above)",
    },
    Setting {
        flag: "--egress",
        env: "ISOBOX_EGRESS",
        default: "on",
        help: "`on`: runs asking for network get filtered egress (public internet only) while the firewall is verified; `off`: every run is offline",
    },
    Setting {
        flag: "--net-pool",
        env: "ISOBOX_NET_POOL",
        default: "10.200.0.0/16",
        help: "private IPv4 range the sandboxes' links are numbered from (a /30 each); must not overlap the host's networks",
    },
    Setting {
        flag: "--net-dns",
        env: "ISOBOX_NET_DNS",
        default: "1.1.1.1,8.8.8.8",
        help: "resolvers written to the sandbox's /etc/resolv.conf (public addresses: private ones are blocked)",
    },
    Setting {
        flag: "--egress-deny",
        env: "ISOBOX_EGRESS_DENY",
        default: "",
        help: "extra IPv4 ranges sandboxes may not reach (comma-separated CIDRs), beside the built-in private and special ranges",
    },
    Setting {
        flag: "--egress-verify-sec",
        env: "ISOBOX_EGRESS_VERIFY_SEC",
        default: "10",
        help: "how often the firewall is read back and, when it is found wrong, programmed again",
    },
    Setting {
        flag: "--egress-max-conns",
        env: "ISOBOX_EGRESS_MAX_CONNS",
        default: "256",
        help: "connections one networked sandbox may have open at once (conntrack entries, TCP, UDP and ICMP alike); a new one beyond it is dropped (1-65536)",
    },
    Setting {
        flag: "--egress-rate",
        env: "ISOBOX_EGRESS_RATE",
        default: "12500000",
        help: "bytes per second one networked sandbox may send, and separately receive (100 Mbit/s by default); packets beyond it are dropped, bursts of up to a second's worth pass (65536-10000000000)",
    },
    Setting {
        flag: "--warm-pool",
        env: "ISOBOX_WARM_POOL",
        default: "python=2,python-slim=1,javascript=1",
        help: "sandboxes booted ahead of time per runtime, `name=N` comma-separated (Python, JavaScript, Ruby and the compiled runtimes; empty or `off` disables): each serves one /execute with the runtime's default memory and pids (offline, or with filtered egress from the `<runtime>+net` pool)",
    },
    Setting {
        flag: "--kernels-max",
        env: "ISOBOX_KERNELS_MAX",
        default: "4",
        help: "live-kernel sessions that may run at once (429 too_many_kernels above; 0 disables kernel sessions)",
    },
    Setting {
        flag: "--kernel-idle-sec",
        env: "ISOBOX_KERNEL_IDLE_SEC",
        default: "1800",
        help: "a kernel with no step for this long is ended (its session's files stay until the session's TTL)",
    },
    Setting {
        flag: "--ai-base",
        env: "ISOBOX_AI_BASE",
        default: "",
        help: "OpenAI-compatible endpoint of the server-side agent, e.g. https://api.openai.com/v1 (POST {base}/chat/completions); unset: /v1/agent is off",
    },
    Setting {
        flag: "--ai-key",
        env: "ISOBOX_AI_KEY",
        default: "",
        help: "the upstream's key, sent as Authorization: Bearer (never logged, never sent to a client; prefer the environment to the flag)",
    },
    Setting {
        flag: "--ai-model",
        env: "ISOBOX_AI_MODEL",
        default: "",
        help: "the model the agent asks for (required with ISOBOX_AI_BASE)",
    },
    Setting {
        flag: "--ai-max-iters",
        env: "ISOBOX_AI_MAX_ITERS",
        default: "8",
        help: "model calls per agent loop at most (a request's maxIters is clamped to it)",
    },
    Setting {
        flag: "--ai-rate-per-min",
        env: "ISOBOX_AI_RATE_PER_MIN",
        default: "6",
        help: "agent loops a client address may start per minute (429 rate_limited above)",
    },
    Setting {
        flag: "--ai-search",
        env: "ISOBOX_AI_SEARCH",
        default: "on",
        help: "offer the agent the server-side web_search tool (on or off)",
    },
    Setting {
        flag: "--ai-search-url",
        env: "ISOBOX_AI_SEARCH_URL",
        default: "https://html.duckduckgo.com/html/",
        help: "where web_search asks (DuckDuckGo's HTML results; GET ?q=)",
    },
    Setting {
        flag: "--ai-timeout-sec",
        env: "ISOBOX_AI_TIMEOUT_SEC",
        default: "120",
        help: "longest silence of the agent's upstream before the loop ends with upstream_error",
    },
    Setting {
        flag: "--ai-python-wall-sec",
        env: "ISOBOX_AI_PYTHON_WALL_SEC",
        default: "60",
        help: "wall time of the agent's run_python steps (past it the kernel ends, as any kernel step's wall time does)",
    },
    Setting {
        flag: "--ai-shell-wall-sec",
        env: "ISOBOX_AI_SHELL_WALL_SEC",
        default: "180",
        help: "wall time of the agent's run_shell commands (then killed in place: exit 124, the kernel survives)",
    },
    Setting {
        flag: "--shutdown-grace-ms",
        env: "ISOBOX_SHUTDOWN_GRACE_MS",
        default: "10000",
        help: "on SIGTERM, running executions get this long before they are killed",
    },
];

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
    /// Idle time after which a kernel is ended.
    pub kernel_idle_sec: u64,
    /// The server-side agent.
    pub ai: AiConfig,
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
}

impl Config {
    /// Reads the environment, then applies `args` (without argv\[0\]).
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad setting.
    pub fn load(args: &[String]) -> Result<Config, ConfigError> {
        let mut values: Vec<Option<String>> =
            SETTINGS.iter().map(|s| std::env::var(s.env).ok()).collect();
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) => (f, Some(v.to_string())),
                None => (arg.as_str(), None),
            };
            let idx = SETTINGS
                .iter()
                .position(|s| s.flag == flag)
                // Only the flag's name: a mistyped `--ai-kye=sk-...` must not print the key.
                .ok_or_else(|| {
                    ConfigError::UnknownFlag(arg.split('=').next().unwrap_or("").to_string())
                })?;
            let value = match inline {
                Some(v) => v,
                None => {
                    i += 1;
                    args.get(i)
                        .cloned()
                        .ok_or_else(|| invalid(flag, "", "missing value"))?
                }
            };
            values[idx] = Some(value);
            i += 1;
        }
        let get = |name: &str| -> Option<String> {
            let idx = SETTINGS.iter().position(|s| s.env == name)?;
            values[idx].clone().filter(|v| !v.is_empty())
        };
        let data_dir =
            PathBuf::from(get("ISOBOX_DATA_DIR").unwrap_or_else(|| "/var/lib/isobox".into()));
        let trusted = match get("ISOBOX_TRUSTED_PROXIES") {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(crate::admission::Cidr::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid("ISOBOX_TRUSTED_PROXIES", &list, &e.to_string()))?,
        };
        let flag = |name: &str| -> Result<bool, ConfigError> {
            match get(name).as_deref() {
                None | Some("0") | Some("false") => Ok(false),
                Some("1") | Some("true") => Ok(true),
                Some(v) => Err(invalid(name, v, "0 or 1")),
            }
        };
        let admission = crate::admission::AdmissionConfig {
            api_keys: get("ISOBOX_API_KEYS").map(Secret::new),
            api_keys_file: get("ISOBOX_API_KEYS_FILE").map(PathBuf::from),
            require_auth: flag("ISOBOX_REQUIRE_AUTH")?,
            memory_require_key: flag("ISOBOX_MEMORY_REQUIRE_KEY")?,
            rate_per_min: parse_or("ISOBOX_RATE_PER_MIN", get("ISOBOX_RATE_PER_MIN"), 30)?,
            rate_burst: parse_or("ISOBOX_RATE_BURST", get("ISOBOX_RATE_BURST"), 10)?,
            trusted_proxies: trusted,
            ai_rate_per_min: parse_or("ISOBOX_AI_RATE_PER_MIN", get("ISOBOX_AI_RATE_PER_MIN"), 6)?,
        };
        let ai_rate_per_min = admission.ai_rate_per_min;
        let cfg = Config {
            admission,
            listen: parse_or(
                "ISOBOX_LISTEN",
                get("ISOBOX_LISTEN"),
                "127.0.0.1:8090".parse().expect("constant address parses"),
            )?,
            rootfs_dir: get("ISOBOX_ROOTFS_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/var/lib/isobox/rootfs")),
            data_dir,
            runtimes_dir: get("ISOBOX_RUNTIMES_DIR").map(PathBuf::from),
            instance: get("ISOBOX_INSTANCE").unwrap_or_else(|| "isobox".into()),
            runsc: PathBuf::from(get("ISOBOX_RUNSC").unwrap_or_else(|| "/usr/bin/runsc".into())),
            platform: get("ISOBOX_PLATFORM").unwrap_or_else(|| "ptrace".into()),
            log_level: get("ISOBOX_LOG").unwrap_or_else(|| "info".into()),
            workers: parse_or("ISOBOX_WORKERS", get("ISOBOX_WORKERS"), 4)?,
            max_connections: parse_or(
                "ISOBOX_MAX_CONNECTIONS",
                get("ISOBOX_MAX_CONNECTIONS"),
                1024,
            )?,
            max_connections_per_ip: parse_or(
                "ISOBOX_MAX_CONNECTIONS_PER_IP",
                get("ISOBOX_MAX_CONNECTIONS_PER_IP"),
                256,
            )?,
            idle_timeout_ms: parse_or(
                "ISOBOX_IDLE_TIMEOUT_MS",
                get("ISOBOX_IDLE_TIMEOUT_MS"),
                60_000,
            )?,
            head_timeout_ms: parse_or(
                "ISOBOX_HEAD_TIMEOUT_MS",
                get("ISOBOX_HEAD_TIMEOUT_MS"),
                10_000,
            )?,
            max_concurrent: parse_or("ISOBOX_MAX_CONCURRENT", get("ISOBOX_MAX_CONCURRENT"), 4)?,
            slice_memory_bytes: parse_or(
                "ISOBOX_SLICE_MEMORY_BYTES",
                get("ISOBOX_SLICE_MEMORY_BYTES"),
                crate::sys::host_memory_bytes() / 2,
            )?,
            seccomp: !matches!(get("ISOBOX_SECCOMP").as_deref(), Some("0") | Some("false")),
            sse_keepalive_ms: parse_or(
                "ISOBOX_SSE_KEEPALIVE_MS",
                get("ISOBOX_SSE_KEEPALIVE_MS"),
                10_000,
            )?,
            compile_timeout_ms: parse_or(
                "ISOBOX_COMPILE_TIMEOUT_MS",
                get("ISOBOX_COMPILE_TIMEOUT_MS"),
                30_000,
            )?,
            shutdown_grace_ms: parse_or(
                "ISOBOX_SHUTDOWN_GRACE_MS",
                get("ISOBOX_SHUTDOWN_GRACE_MS"),
                10_000,
            )?,
            sessions: SessionConfig {
                quota_bytes: parse_or(
                    "ISOBOX_SESSION_QUOTA_BYTES",
                    get("ISOBOX_SESSION_QUOTA_BYTES"),
                    512 << 20,
                )?,
                max_sessions: parse_or("ISOBOX_MAX_SESSIONS", get("ISOBOX_MAX_SESSIONS"), 1000)?,
                storage_max_bytes: parse_or(
                    "ISOBOX_STORAGE_MAX_BYTES",
                    get("ISOBOX_STORAGE_MAX_BYTES"),
                    32 << 30,
                )?,
                storage_reserve_bytes: parse_or(
                    "ISOBOX_STORAGE_RESERVE_BYTES",
                    get("ISOBOX_STORAGE_RESERVE_BYTES"),
                    2 << 30,
                )?,
                ttl_max_sec: parse_or(
                    "ISOBOX_SESSION_TTL_MAX_SEC",
                    get("ISOBOX_SESSION_TTL_MAX_SEC"),
                    7 * 86_400,
                )?,
                volume_quota_bytes: parse_or(
                    "ISOBOX_VOLUME_QUOTA_BYTES",
                    get("ISOBOX_VOLUME_QUOTA_BYTES"),
                    512 << 20,
                )?,
                max_volumes: parse_or("ISOBOX_MAX_VOLUMES", get("ISOBOX_MAX_VOLUMES"), 1000)?,
            },
            egress: crate::netfilter::EgressConfig {
                enabled: match get("ISOBOX_EGRESS").as_deref().map(str::trim) {
                    None | Some("on" | "1" | "true") => true,
                    Some("off" | "0" | "false") => false,
                    Some(v) => return Err(invalid("ISOBOX_EGRESS", v, "on or off")),
                },
                pool: parse_or(
                    "ISOBOX_NET_POOL",
                    get("ISOBOX_NET_POOL"),
                    crate::netfilter::Cidr::DEFAULT_POOL,
                )?,
                dns: parse_list("ISOBOX_NET_DNS", get("ISOBOX_NET_DNS"), "1.1.1.1,8.8.8.8")?,
                deny: parse_list("ISOBOX_EGRESS_DENY", get("ISOBOX_EGRESS_DENY"), "")?,
                verify_sec: parse_or(
                    "ISOBOX_EGRESS_VERIFY_SEC",
                    get("ISOBOX_EGRESS_VERIFY_SEC"),
                    10,
                )?,
                max_conns: parse_or(
                    "ISOBOX_EGRESS_MAX_CONNS",
                    get("ISOBOX_EGRESS_MAX_CONNS"),
                    256,
                )?,
                rate_bytes: parse_or("ISOBOX_EGRESS_RATE", get("ISOBOX_EGRESS_RATE"), 12_500_000)?,
            },
            kernels_max: parse_or("ISOBOX_KERNELS_MAX", get("ISOBOX_KERNELS_MAX"), 4)?,
            warm_pool: parse_warm_pool(
                get("ISOBOX_WARM_POOL")
                    .as_deref()
                    .unwrap_or("python=2,python-slim=1,javascript=1"),
            )?,
            kernel_idle_sec: parse_or(
                "ISOBOX_KERNEL_IDLE_SEC",
                get("ISOBOX_KERNEL_IDLE_SEC"),
                1800,
            )?,
            ai: AiConfig {
                base: get("ISOBOX_AI_BASE")
                    .map(|b| b.trim().trim_end_matches('/').to_string())
                    .filter(|b| !b.is_empty()),
                key: get("ISOBOX_AI_KEY")
                    .filter(|k| !k.trim().is_empty())
                    .map(|k| Secret::new(k.trim().to_string())),
                model: get("ISOBOX_AI_MODEL")
                    .map(|m| m.trim().to_string())
                    .unwrap_or_default(),
                max_iters: parse_or("ISOBOX_AI_MAX_ITERS", get("ISOBOX_AI_MAX_ITERS"), 8)?,
                rate_per_min: ai_rate_per_min,
                search: match get("ISOBOX_AI_SEARCH").as_deref().map(str::trim) {
                    None | Some("on" | "1" | "true") => true,
                    Some("off" | "0" | "false") => false,
                    Some(v) => return Err(invalid("ISOBOX_AI_SEARCH", v, "on or off")),
                },
                search_url: get("ISOBOX_AI_SEARCH_URL")
                    .map(|u| u.trim().to_string())
                    .unwrap_or_else(|| "https://html.duckduckgo.com/html/".into()),
                timeout_sec: parse_or("ISOBOX_AI_TIMEOUT_SEC", get("ISOBOX_AI_TIMEOUT_SEC"), 120)?,
                python_wall_sec: parse_or(
                    "ISOBOX_AI_PYTHON_WALL_SEC",
                    get("ISOBOX_AI_PYTHON_WALL_SEC"),
                    60,
                )?,
                shell_wall_sec: parse_or(
                    "ISOBOX_AI_SHELL_WALL_SEC",
                    get("ISOBOX_AI_SHELL_WALL_SEC"),
                    180,
                )?,
            },
        };
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
        Ok(())
    }

    /// The text of `isoboxd --help`.
    pub fn help() -> String {
        let mut s = String::from("isoboxd: run untrusted code in gVisor sandboxes over HTTP\n\nusage: isoboxd [FLAGS]\n\nEvery flag can also be set by its environment variable; flags win.\n\n");
        for st in SETTINGS {
            s.push_str(&format!(
                "  {:<22} {:<27} {}\n  {:<22} {:<27} default: {}\n",
                st.flag, st.env, st.help, "", "", st.default
            ));
        }
        s
    }
}

fn invalid(name: &str, value: &str, why: &str) -> ConfigError {
    ConfigError::Invalid {
        name: name.into(),
        value: value.into(),
        why: why.into(),
    }
}

/// A comma-separated list, each item parsed; empty items are skipped.
fn parse_list<T: std::str::FromStr>(
    name: &str,
    v: Option<String>,
    default: &str,
) -> Result<Vec<T>, ConfigError>
where
    T::Err: std::fmt::Display,
{
    let s = v.unwrap_or_else(|| default.to_string());
    s.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|i| {
            i.parse()
                .map_err(|e: T::Err| invalid(name, i, &e.to_string()))
        })
        .collect()
}

/// `name=N,name=N` (empty or `off`: none).
fn parse_warm_pool(v: &str) -> Result<Vec<(String, usize)>, ConfigError> {
    let v = v.trim();
    if v.is_empty() || v == "off" || v == "0" {
        return Ok(Vec::new());
    }
    let mut out: Vec<(String, usize)> = Vec::new();
    for item in v.split(',') {
        let (name, n) = item
            .split_once('=')
            .map(|(a, b)| (a.trim(), b.trim()))
            .ok_or_else(|| invalid("ISOBOX_WARM_POOL", item, "name=N pairs, e.g. python=2"))?;
        let n: usize = n
            .parse()
            .ok()
            .filter(|n| *n <= 16)
            .ok_or_else(|| invalid("ISOBOX_WARM_POOL", item, "a size from 0 to 16"))?;
        if name.is_empty() || out.iter().any(|(x, _)| x == name) {
            return Err(invalid("ISOBOX_WARM_POOL", item, "each runtime once"));
        }
        out.push((name.to_string(), n));
    }
    Ok(out)
}

fn parse_or<T: std::str::FromStr>(
    name: &str,
    v: Option<String>,
    default: T,
) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    match v {
        None => Ok(default),
        Some(s) => s
            .trim()
            .parse()
            .map_err(|e: T::Err| invalid(name, &s, &e.to_string())),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str]) -> Result<Config, ConfigError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Config::load(&args)
    }

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
}
