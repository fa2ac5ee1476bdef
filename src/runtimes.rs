//! Runtime descriptors: `runtimes/*.toml`, one per language (see runtimes/README.md).
//!
//! Loaded once at startup, from the binary (embedded at build time) or from
//! `ISOBOX_RUNTIMES_DIR`. A broken descriptor stops startup with a message naming the
//! file and line. Whether a runtime is *installed* is decided by a self-check of its
//! root filesystem: the tree exists, its build stamp and version line are present, and
//! every binary the descriptor runs exists in it.

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
    /// The root filesystem tree under the rootfs dir.
    pub rootfs: String,
    /// Key of the version line in `<rootfs>/.isobox/versions`.
    pub version_key: String,
    /// Whether a build step runs before the program.
    #[serde(default)]
    pub compiled: bool,
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
}

impl Runtime {
    /// Whether a request's `version` selects this runtime: its real version, or one of
    /// its [`Descriptor::version_forms`].
    pub fn accepts_version(&self, v: &str) -> bool {
        self.version.as_deref() == Some(v)
            || self
                .desc
                .version_forms
                .iter()
                .any(|f| version_form_matches(f, v))
    }

    /// Installed and self-checked.
    pub fn is_installed(&self) -> bool {
        self.missing.is_none() && self.version.is_some()
    }
}

/// Whether `v` is of `form`, where `*` stands for one or more digits and dots and every
/// other character for itself.
fn version_form_matches(form: &str, v: &str) -> bool {
    let Some((pre, post)) = form.split_once('*') else {
        return form == v;
    };
    v.len() > pre.len() + post.len()
        && v.starts_with(pre)
        && v.ends_with(post)
        && v[pre.len()..v.len() - post.len()]
            .bytes()
            .all(|b| b.is_ascii_digit() || b == b'.')
}

/// All runtimes, with name and alias resolution.
#[derive(Debug, Clone, Default)]
pub struct Runtimes {
    list: Vec<Runtime>,
    by_name: BTreeMap<String, usize>,
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
            let rootfs_path = rootfs_dir.join(&desc.rootfs);
            let (version, missing) = self_check(&desc, &rootfs_path);
            let idx = rts.list.len();
            for name in std::iter::once(&desc.language).chain(desc.aliases.iter()) {
                if rts.by_name.insert(name.clone(), idx).is_some() {
                    return Err(RuntimeError::Invalid {
                        file: file.clone(),
                        message: format!("name {name:?} is used by two runtimes"),
                    });
                }
            }
            rts.list.push(Runtime {
                desc,
                version,
                rootfs_path,
                missing,
            });
        }
        Ok(rts)
    }

    /// Resolves a name or alias to an installed runtime's index.
    pub fn resolve(&self, name: &str) -> Option<&Runtime> {
        self.by_name
            .get(name)
            .map(|&i| &self.list[i])
            .filter(|r| r.is_installed())
    }

    /// Every runtime, installed or not.
    pub fn all(&self) -> &[Runtime] {
        &self.list
    }

    /// The installed runtimes.
    pub fn installed(&self) -> impl Iterator<Item = &Runtime> {
        self.list.iter().filter(|r| r.is_installed())
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
    if desc.rootfs.is_empty() || desc.rootfs.contains('/') || desc.rootfs.starts_with('.') {
        return bad("`rootfs` must be a plain directory name");
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
