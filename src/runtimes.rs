//! Runtime descriptors: `runtimes/*.toml`, one per language (see runtimes/README.md).
//!
//! Loaded once at startup, from the binary (embedded at build time) or from
//! `ISOBOX_RUNTIMES_DIR`. A broken descriptor stops startup with a message naming the
//! file and line. Whether a runtime is *installed* is decided by a self-check of its
//! root filesystem: the tree exists, its build stamp and version line are present, and
//! every binary the descriptor runs exists in it.
//!
//! A language may have several versions: its descriptor's `rootfs` is the default
//! (Debian stable's), and each tree of `extra_rootfs` (the same descriptor on a newer
//! Debian) is another version, listed and pinned by the version found in that tree.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

include!(concat!(env!("OUT_DIR"), "/embedded_runtimes.rs"));

/// Why the descriptors could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A descriptor did not parse; the message names file, line and column.
    #[error("{file}:{line}:{col}: {message}")]
    Parse {
        /// File name.
        file: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        col: usize,
        /// What is wrong.
        message: String,
    },
    /// A descriptor parsed but is inconsistent.
    #[error("{file}: {message}")]
    Invalid {
        /// File name.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The descriptors directory could not be read.
    #[error("cannot read runtimes directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Default limits of a runtime (the spec's per-language defaults).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DefaultLimits {
    /// Memory for the program, bytes.
    pub memory_bytes: u64,
    /// CPUs.
    pub cpus: f64,
    /// Wall time, ms.
    pub wall_time_ms: u64,
}

/// One runtime descriptor as written in its file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    /// Canonical language name.
    pub language: String,
    /// Other accepted names.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Version strings accepted beside the real one, as written by clients of the seed
    /// document (`3.14-agent`, `node-26`): `*` stands for one or more digits and dots.
    /// They select this runtime; the response says the version that actually ran.
    #[serde(default)]
    pub version_forms: Vec<String>,
    /// The root filesystem tree under the rootfs dir: the default version.
    pub rootfs: String,
    /// Trees of further versions of this language, the same descriptor run on each
    /// (built only when the operator asks `make runtimes` for them).
    #[serde(default)]
    pub extra_rootfs: Vec<String>,
    /// Key of the version line in `<rootfs>/.isobox/versions`.
    pub version_key: String,
    /// Whether a build step runs before the program.
    #[serde(default)]
    pub compiled: bool,
    /// Whether the root filesystem is writable, into an overlay in the run's own memory
    /// (discarded with it), instead of read-only: go's prebuilt build cache in the tree
    /// takes the run's own entries there.
    #[serde(default)]
    pub writable_root: bool,
    /// Name `code` is written as.
    pub source_file: String,
    /// Build argv (compiled runtimes).
    #[serde(default)]
    pub build: Vec<String>,
    /// Run argv; the request's args are appended.
    pub run: Vec<String>,
    /// Environment of the program.
    #[serde(default)]
    pub env: Vec<String>,
    /// Default limits.
    pub limits: DefaultLimits,
}

/// A loaded runtime plus what the self-check found.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// The descriptor.
    pub desc: Descriptor,
    /// The real version read from the rootfs, when installed.
    pub version: Option<String>,
    /// Absolute path of its root filesystem.
    pub rootfs_path: PathBuf,
    /// Why it is not installed, when it is not.
    pub missing: Option<String>,
    /// Whether this is its language's default version (the descriptor's `rootfs`).
    pub default: bool,
}

impl Runtime {
    /// Installed and self-checked.
    pub fn is_installed(&self) -> bool {
        self.missing.is_none() && self.version.is_some()
    }
}

/// When `v` is of `form`, where `*` stands for one or more digits and dots and every
/// other character for itself: the version number it carries, the `*` with the digits
/// and dots around it in the form (`3.14` of `3.14-agent` for `3.*-agent`, `3.14.5` for
/// `3.*`, `26` of `node-26`; for a form without `*`, its leading digits: `3` of
/// `3-alpine`).
fn version_form_digits<'a>(form: &str, v: &'a str) -> Option<&'a str> {
    let numeric = |c: char| c.is_ascii_digit() || c == '.';
    let Some((pre, post)) = form.split_once('*') else {
        let n = v.find(|c: char| !numeric(c)).unwrap_or(v.len());
        return (form == v).then_some(&v[..n]);
    };
    let star = v
        .strip_prefix(pre)
        .and_then(|rest| rest.strip_suffix(post))
        .filter(|d| !d.is_empty())?;
    if !star.chars().all(numeric) {
        return None;
    }
    let head = pre.len() - pre.trim_end_matches(numeric).len();
    let tail = post.len() - post.trim_start_matches(numeric).len();
    Some(&v[pre.len() - head..v.len() - post.len() + tail])
}

#[cfg(test)]
fn version_form_matches(form: &str, v: &str) -> bool {
    version_form_digits(form, v).is_some()
}

/// Whether `version` is `prefix` or starts with it followed by a dot (`3.14` names
/// `3.14.7`, not `3.140`).
fn names(prefix: &str, version: &str) -> bool {
    !prefix.is_empty()
        && version
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

fn ver(r: &Runtime) -> String {
    r.version.clone().unwrap_or_default()
}

/// The newest of `rs` by version number.
fn newest(rs: Vec<&Runtime>) -> Option<&Runtime> {
    rs.into_iter().max_by_key(|r| numeric(&ver(r)))
}

/// A version's numeric components, for ordering (`1.85.1` < `1.97.0`).
fn numeric(version: &str) -> Vec<u64> {
    version
        .split('.')
        .map(|c| {
            let digits: String = c.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap_or(0)
        })
        .collect()
}

/// All runtimes, with name and alias resolution.
#[derive(Debug, Clone, Default)]
pub struct Runtimes {
    list: Vec<Runtime>,
    /// A name or alias to its language's versions, the default first.
    by_name: BTreeMap<String, Vec<usize>>,
}

impl Runtimes {
    /// Loads descriptors (from `dir`, or the embedded ones) and self-checks each against `rootfs_dir`.
    ///
    /// # Errors
    /// [`RuntimeError`] naming the file (and line) at fault.
    pub fn load(dir: Option<&Path>, rootfs_dir: &Path) -> Result<Runtimes, RuntimeError> {
        let mut sources: Vec<(String, String)> = Vec::new();
        match dir {
            None => sources.extend(
                EMBEDDED_RUNTIMES
                    .iter()
                    .map(|(n, c)| (n.to_string(), c.to_string())),
            ),
            Some(d) => {
                let rd = std::fs::read_dir(d).map_err(|source| RuntimeError::Dir {
                    path: d.into(),
                    source,
                })?;
                let mut paths: Vec<PathBuf> = rd
                    .filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                    .collect();
                paths.sort();
                for p in paths {
                    let text = std::fs::read_to_string(&p).map_err(|source| RuntimeError::Dir {
                        path: p.clone(),
                        source,
                    })?;
                    sources.push((p.display().to_string(), text));
                }
            }
        }
        let mut rts = Runtimes::default();
        for (file, text) in sources {
            let desc = parse_descriptor(&file, &text)?;
            let first = rts.list.len();
            let trees: Vec<String> = std::iter::once(&desc.rootfs)
                .chain(&desc.extra_rootfs)
                .cloned()
                .collect();
            for (i, tree) in trees.iter().enumerate() {
                let rootfs_path = rootfs_dir.join(tree);
                let (version, missing) = self_check(&desc, &rootfs_path);
                rts.list.push(Runtime {
                    desc: desc.clone(),
                    version,
                    rootfs_path,
                    missing,
                    default: i == 0,
                });
            }
            // Two trees of one language holding the same version: the newer Debian
            // brought nothing new; only the default is offered.
            for i in first + 1..rts.list.len() {
                let v = &rts.list[i].version;
                if v.is_some() && (first..i).any(|j| rts.list[j].version == *v) {
                    rts.list[i].missing = Some(format!(
                        "same version as another tree of {} ({})",
                        desc.language,
                        v.as_deref().unwrap_or("")
                    ));
                }
            }
            let versions: Vec<usize> = (first..rts.list.len()).collect();
            for name in std::iter::once(&desc.language).chain(desc.aliases.iter()) {
                if rts.by_name.insert(name.clone(), versions.clone()).is_some() {
                    return Err(RuntimeError::Invalid {
                        file: file.clone(),
                        message: format!("name {name:?} is used by two runtimes"),
                    });
                }
            }
        }
        Ok(rts)
    }

    /// The installed versions of a name or alias, the default first.
    pub fn versions(&self, name: &str) -> impl Iterator<Item = &Runtime> {
        self.by_name
            .get(name)
            .into_iter()
            .flatten()
            .map(|&i| &self.list[i])
            .filter(|r| r.is_installed())
    }

    /// The installed versions of `name`, quoted and comma-separated (`"3.13.5",
    /// "3.14.8"`), for an `unknown_version`'s detail.
    pub fn versions_listed(&self, name: &str) -> String {
        let quoted: Vec<String> = self
            .versions(name)
            .map(|r| format!("{:?}", r.version.as_deref().unwrap_or("")))
            .collect();
        quoted.join(", ")
    }

    /// Whether `r` is what [`Runtimes::resolve`] gives for its language: the version a
    /// request without one runs, and the one warm pools hold.
    pub fn is_default(&self, r: &Runtime) -> bool {
        self.resolve(&r.desc.language)
            .is_some_and(|d| d.rootfs_path == r.rootfs_path)
    }

    /// Resolves a name or alias to its installed default version (or, when that tree is
    /// not built, the first installed other one).
    pub fn resolve(&self, name: &str) -> Option<&Runtime> {
        self.versions(name).next()
    }

    /// The installed version of `name` that a request's `version` string selects, or
    /// `None` when it names none (see runtimes/README.md, "Versions"):
    /// - the exact version (`3.13.5`);
    /// - a prefix at a dot, the newest version it names (`3.14` and `3` give `3.14.7`
    ///   when 3.13.5 and 3.14.7 are installed);
    /// - one of the descriptor's `version_forms`, as clients of the seed document write
    ///   them (`3.14-agent`, `node-26`): the version its digits name, the default
    ///   among several, else the newest; its digits shortened at dots until they name
    ///   one (`3.14.5` gives 3.14.7); the default when they name none.
    pub fn pick(&self, name: &str, version: &str) -> Option<&Runtime> {
        let all: Vec<&Runtime> = self.versions(name).collect();
        let default = *all.first()?;
        if version.is_empty() {
            return Some(default);
        }
        if let Some(r) = self.pick_named(name, version) {
            return Some(r);
        }
        let mut digits = default
            .desc
            .version_forms
            .iter()
            .find_map(|f| version_form_digits(f, version))?;
        loop {
            let named: Vec<&Runtime> = all
                .iter()
                .copied()
                .filter(|r| names(digits, &ver(r)))
                .collect();
            if named.iter().any(|r| r.default) {
                return Some(default);
            }
            if !named.is_empty() {
                return newest(named);
            }
            match digits.rfind('.') {
                Some(dot) => digits = &digits[..dot],
                None => return Some(default),
            }
        }
    }

    /// Every runtime, installed or not.
    pub fn all(&self) -> &[Runtime] {
        &self.list
    }

    /// The installed version of `name` that `version` names as a version number: the
    /// exact one, else the newest a prefix at a dot names (steps 1 and 2 of
    /// [`Runtimes::pick`]; no client form).
    pub fn pick_named(&self, name: &str, version: &str) -> Option<&Runtime> {
        let all: Vec<&Runtime> = self.versions(name).collect();
        if let Some(r) = all.iter().find(|r| r.version.as_deref() == Some(version)) {
            return Some(r);
        }
        newest(
            all.into_iter()
                .filter(|r| names(version, &ver(r)))
                .collect(),
        )
    }

    /// The installed runtimes, every version.
    pub fn installed(&self) -> impl Iterator<Item = &Runtime> {
        self.list.iter().filter(|r| r.is_installed())
    }

    /// The installed runtimes, one per language: its default version (see
    /// [`Runtimes::resolve`]).
    pub fn languages(&self) -> impl Iterator<Item = &Runtime> {
        let mut seen = std::collections::BTreeSet::new();
        self.installed()
            .filter(move |r| seen.insert(r.desc.language.clone()))
    }
}

fn parse_descriptor(file: &str, text: &str) -> Result<Descriptor, RuntimeError> {
    let desc: Descriptor = toml::from_str(text).map_err(|e| {
        let (line, col) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
        RuntimeError::Parse {
            file: file.to_string(),
            line,
            col,
            message: e.message().to_string(),
        }
    })?;
    let bad = |m: &str| {
        Err(RuntimeError::Invalid {
            file: file.to_string(),
            message: m.to_string(),
        })
    };
    if desc.run.is_empty() || !desc.run[0].starts_with('/') {
        return bad("`run` must start with an absolute path");
    }
    if desc.compiled == desc.build.is_empty() {
        return bad("`compiled = true` needs a `build` command, and only then");
    }
    if !desc.build.is_empty() && !desc.build[0].starts_with('/') {
        return bad("`build` must start with an absolute path");
    }
    if desc.source_file.is_empty() || desc.source_file.contains('/') {
        return bad("`source_file` must be a plain file name");
    }
    for tree in std::iter::once(&desc.rootfs).chain(&desc.extra_rootfs) {
        if tree.is_empty() || tree.contains('/') || tree.starts_with('.') {
            return bad("`rootfs` and `extra_rootfs` must be plain directory names");
        }
    }
    let mut trees: Vec<&String> = std::iter::once(&desc.rootfs)
        .chain(&desc.extra_rootfs)
        .collect();
    trees.sort();
    if trees.windows(2).any(|w| w[0] == w[1]) {
        return bad("a tree is named twice in `rootfs` and `extra_rootfs`");
    }
    if desc.limits.memory_bytes == 0 || desc.limits.cpus <= 0.0 || desc.limits.wall_time_ms == 0 {
        return bad("default limits must be positive");
    }
    Ok(desc)
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Checks that a runtime's tree is built and holds its binaries; returns (version, why missing).
fn self_check(desc: &Descriptor, rootfs: &Path) -> (Option<String>, Option<String>) {
    let versions = match std::fs::read_to_string(rootfs.join(".isobox/versions")) {
        Ok(v) => v,
        Err(_) => {
            return (
                None,
                Some(format!(
                    "root filesystem {} not built (run `make runtimes`)",
                    rootfs.display()
                )),
            )
        }
    };
    let version = versions
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{}=", desc.version_key)))
        .map(|v| v.trim().to_string());
    let Some(version) = version.filter(|v| !v.is_empty()) else {
        return (
            None,
            Some(format!(
                "no `{}` line in {}/.isobox/versions",
                desc.version_key,
                rootfs.display()
            )),
        );
    };
    // A compiled program's binary is made by the build, in the sandbox's /tmp.
    let made_by_build = |b: &&String| b.starts_with("/tmp/") || b.starts_with("/workspace/");
    for bin in [desc.run.first(), desc.build.first()]
        .into_iter()
        .flatten()
        .filter(|b| !made_by_build(b))
    {
        let rel = bin.trim_start_matches('/');
        // symlink_metadata on the tree's own path: links inside the tree are resolved by
        // the sandbox, so only existence is checked here.
        if std::fs::symlink_metadata(rootfs.join(rel)).is_err() {
            return (
                None,
                Some(format!("{bin} missing from {}", rootfs.display())),
            );
        }
    }
    (Some(version), None)
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_forms_take_digits_and_dots_only() {
        use super::version_form_matches as m;
        assert!(m("*-agent", "3.14-agent"));
        assert!(m("*-agent", "3-agent"));
        assert!(!m("*-agent", "-agent"));
        assert!(!m("*-agent", "3.14x-agent"));
        assert!(m("node-*", "node-26"));
        assert!(!m("node-*", "node-"));
        assert!(!m("node-*", "deno-26"));
        assert!(m("3-alpine", "3-alpine"));
        assert!(!m("3-alpine", "3.1-alpine"));
        assert!(m("3.*", "3.14.5"));
        assert!(!m("3.*", "2.7"));
    }

    use super::*;

    #[test]
    fn test_broken_descriptor_names_file_and_line() {
        let text = "language = \"x\"\naliases = [\nrootfs = 3\n";
        let e = parse_descriptor("x.toml", text).unwrap_err().to_string();
        assert!(e.starts_with("x.toml:3:"), "{e}");
    }

    #[test]
    fn test_unknown_field_rejected() {
        let text = "language=\"x\"\nrootfs=\"r\"\nversion_key=\"x\"\nsource_file=\"m\"\nrun=[\"/x\"]\nbogus=1\n[limits]\nmemory_bytes=1\ncpus=1.0\nwall_time_ms=1\n";
        let e = parse_descriptor("x.toml", text).unwrap_err().to_string();
        assert!(e.contains("x.toml:6:"), "{e}");
    }

    /// A language `py` (alias `p`) with these versions, the first the default.
    fn langs(versions: &[&str]) -> Runtimes {
        let text = "language=\"py\"\naliases=[\"p\"]\nversion_forms=[\"*-agent\", \"3-alpine\"]\nrootfs=\"r\"\nversion_key=\"python\"\nsource_file=\"m\"\nrun=[\"/x\"]\n[limits]\nmemory_bytes=1\ncpus=1.0\nwall_time_ms=1\n";
        let desc = parse_descriptor("py.toml", text).unwrap();
        let mut rts = Runtimes::default();
        for (i, v) in versions.iter().enumerate() {
            rts.list.push(Runtime {
                desc: desc.clone(),
                version: Some(v.to_string()),
                rootfs_path: PathBuf::from(format!("/t/{i}")),
                missing: None,
                default: i == 0,
            });
        }
        let all: Vec<usize> = (0..versions.len()).collect();
        rts.by_name.insert("py".into(), all.clone());
        rts.by_name.insert("p".into(), all);
        rts
    }

    #[test]
    fn test_a_form_gives_the_version_number_it_carries() {
        use super::version_form_digits as d;
        assert_eq!(d("3.*-agent", "3.14-agent"), Some("3.14"));
        assert_eq!(d("3.*", "3.14.5"), Some("3.14.5"));
        assert_eq!(d("*", "26.1"), Some("26.1"));
        assert_eq!(d("node-*", "node-26"), Some("26"));
        assert_eq!(d("1.*-warm", "1.24-warm"), Some("1.24"));
        assert_eq!(d("1.*-alpine", "1.97-alpine"), Some("1.97"));
        assert_eq!(d("3-alpine", "3-alpine"), Some("3"));
        assert_eq!(d("3-alpine", "3.3-alpine"), None);
        assert_eq!(d("3.*", "3."), None);
        assert_eq!(d("3.*", "3.x"), None);
        assert_eq!(d("node-*", "deno-26"), None);
    }

    #[test]
    fn test_a_version_string_picks_the_version_it_names() {
        let rts = langs(&["3.13.5", "3.14.7", "3.12.1"]);
        let pick = |v: &str| rts.pick("py", v).map(|r| r.version.clone().unwrap());
        let some = |v: &str| Some(v.to_string());
        // Nothing asked: the default; the exact version; a prefix at a dot, the newest.
        assert_eq!(pick(""), some("3.13.5"));
        assert_eq!(pick("3.14.7"), some("3.14.7"));
        assert_eq!(pick("3.12.1"), some("3.12.1"));
        assert_eq!(pick("3.14"), some("3.14.7"));
        assert_eq!(pick("3"), some("3.14.7"));
        assert_eq!(pick("3.1"), None, "3.1 is not a prefix of 3.13.5 at a dot");
        assert_eq!(pick("3.14.9"), None);
        assert_eq!(pick("2.7"), None);
        assert_eq!(pick("3.14."), None);
        // A client's form: the version its digits name; shortened at dots; the default
        // when they name none or name it among others.
        assert_eq!(pick("3.14-agent"), some("3.14.7"));
        assert_eq!(pick("3.14.5-agent"), some("3.14.7"));
        assert_eq!(pick("3.13-agent"), some("3.13.5"));
        assert_eq!(pick("3-agent"), some("3.13.5"));
        assert_eq!(pick("26-agent"), some("3.13.5"));
        assert_eq!(pick("3-alpine"), some("3.13.5"));
        assert_eq!(pick("-agent"), None);
        assert_eq!(pick("x-agent"), None);
        // Aliases see the same versions; unknown names none.
        assert_eq!(
            rts.pick("p", "3.14").unwrap().version.as_deref(),
            Some("3.14.7")
        );
        assert!(rts.pick("ruby", "").is_none());
        // Newest is numeric, not textual.
        let rts = langs(&["1.85.1", "1.9.0", "1.100.2"]);
        assert_eq!(
            rts.pick("py", "1").unwrap().version.as_deref(),
            Some("1.100.2")
        );
    }

    #[test]
    fn test_an_uninstalled_default_leaves_the_others() {
        let mut rts = langs(&["3.13.5", "3.14.7"]);
        rts.list[0].missing = Some("not built".into());
        assert_eq!(
            rts.resolve("py").unwrap().version.as_deref(),
            Some("3.14.7")
        );
        assert_eq!(rts.pick("py", "3.13.5").map(|r| r.default), None);
        assert_eq!(
            rts.pick("py", "3-agent").unwrap().version.as_deref(),
            Some("3.14.7")
        );
        assert_eq!(rts.languages().count(), 1);
    }

    #[test]
    fn test_a_tree_named_twice_is_refused() {
        let text = "language=\"x\"\nrootfs=\"r\"\nextra_rootfs=[\"r2\", \"r\"]\nversion_key=\"x\"\nsource_file=\"m\"\nrun=[\"/x\"]\n[limits]\nmemory_bytes=1\ncpus=1.0\nwall_time_ms=1\n";
        let e = parse_descriptor("x.toml", text).unwrap_err().to_string();
        assert!(e.contains("named twice"), "{e}");
        let text = text.replace("\"r2\", \"r\"", "\"../r\"");
        let e = parse_descriptor("x.toml", &text).unwrap_err().to_string();
        assert!(e.contains("plain directory names"), "{e}");
    }

    #[test]
    fn test_embedded_descriptors_parse() {
        for (file, text) in EMBEDDED_RUNTIMES {
            parse_descriptor(file, text).unwrap();
        }
        assert!(
            EMBEDDED_RUNTIMES.len() >= 7,
            "all seven runtimes are described"
        );
    }
}
