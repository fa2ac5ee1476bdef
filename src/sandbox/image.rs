//! Root filesystem images: each runtime's tree as an EROFS image, which runsc mounts
//! inside gVisor as a cold one-off run's root, so that run has no gofer.
//!
//! A run whose every mount is gVisor's own (tmpfs, proc) and whose root is an EROFS
//! image needs no gofer process at all (runsc 2024's goferless mode): a Go process's
//! start and end fewer per run, about 15 % of a cold python `print(1)`'s CPU on the
//! ptrace platform (`bench/README.md`). Such a run's `/workspace` is a tmpfs of
//! gVisor's, and its files reach it through `isobox-start --unpack` (`start.c`), which
//! runsc starts from a host file (`--exec-fd`) with the files on fd 3 (`--pass-fd`) in
//! the archive [`archive`] writes. It writes them as the host workspace has them, drops
//! to the sandbox user with no capability left, and execs the program.
//!
//! An image is made once per tree, in the background, the first time a run could use
//! it ([`RootImages::for_run`]): `mkfs.erofs` (Debian's erofs-utils) into
//! `ISOBOX_IMAGE_DIR` (root's alone: an image holds every file of its tree), named by
//! the tree's name and a key over the tree's path, its stamp (`.isobox/stamp`: its
//! contents and the file itself, written anew by every build of the tree) and the image
//! format.
//! Then one real sandbox on it must print a file back as the sandbox user with no
//! capability (the caller's probe), and only then does a marker beside the image
//! (`<image>.<runsc>.ok`, one per runsc binary: its path, size and mtime) let runs use
//! it: every daemon of the host with that runsc, at once, without building or probing
//! again. One builder per image at a time
//! (an `flock` on the tree's lock file); the others keep using the tree until it is
//! ready. Until then, and whenever no image can be used (no `mkfs.erofs`, a tree
//! without a stamp, a failed build or probe), runs use the tree as before. A tree
//! rebuilt under a running daemon is seen by its next run (one `stat` of the stamp a
//! run, and one of its image) and gets a new image; the builder then removes the images
//! of that tree's older stamps.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The image format: a new one makes new images (part of every key). EROFS without
/// tail-packed inline data (gVisor 20240729 fails to load a binary from such an image:
/// "bad address"), every file's own mtime (Python checks its `.pyc` against it), and
/// nothing of the tree's `/workspace` but the directory (a run's workspace is mounted
/// over it).
const FORMAT: &str = "erofs-v1 -Enoinline_data --preserve-mtime --exclude-regex=^workspace/.";

/// How long a daemon waits before it looks again for an image another daemon builds.
const RECHECK: Duration = Duration::from_secs(1);

/// Where a tree's image stands, as `/healthz` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum ImageState {
    /// Runs use it.
    Ready,
    /// Being made (here or by another daemon); runs use the tree meanwhile.
    Building,
    /// Not used until the tree changes or the daemon restarts; runs use the tree.
    Off {
        /// Why.
        reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StampId {
    dev: u64,
    ino: u64,
    mtime_ns: i128,
    size: u64,
}

impl StampId {
    /// Its identity in keys and markers: not the device number, which some filesystems
    /// change at every mount.
    fn text(self) -> String {
        format!("{}:{}:{}", self.ino, self.mtime_ns, self.size)
    }
}

#[derive(Debug)]
enum State {
    Unknown,
    Ready(PathBuf),
    Pending(Instant),
    Off(String),
}

#[derive(Debug)]
struct Tree {
    stamp: Option<StampId>,
    state: State,
    /// A build thread of this daemon is running for it.
    building: bool,
}

/// What [`RootImages::for_run`] says about a run's tree.
#[derive(Debug)]
pub enum ForRun {
    /// Use this image.
    Ready(PathBuf),
    /// Use the tree.
    Tree,
    /// Use the tree, and make its image: call [`RootImages::build`] with this, off the
    /// caller's thread.
    Build(BuildTicket),
}

/// A build to do ([`RootImages::build`]).
#[derive(Debug)]
pub struct BuildTicket {
    tree: PathBuf,
    image: PathBuf,
    stamp: StampId,
}

impl BuildTicket {
    /// The image to make.
    pub fn image(&self) -> &Path {
        &self.image
    }
}

/// The images of the runtimes' trees, shared by the daemon's workers.
#[derive(Debug)]
pub struct RootImages {
    dir: PathBuf,
    mkfs: PathBuf,
    /// The runsc binary the images' probes ran with (its path, size and mtime) and the
    /// loader's digest.
    runsc_id: String,
    trees: Mutex<HashMap<PathBuf, Tree>>,
    /// Build threads running.
    busy: std::sync::atomic::AtomicUsize,
    /// The daemon is stopping: no new build, a running `mkfs.erofs` is killed, no probe.
    stopping: std::sync::atomic::AtomicBool,
}

/// A build thread's share of [`RootImages`]'s `busy` count, given back when dropped.
#[derive(Debug)]
pub struct Busy(std::sync::Arc<RootImages>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0
            .busy
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl RootImages {
    /// Counts a build thread as running until the returned guard is dropped.
    pub fn busy(self: &std::sync::Arc<Self>) -> Busy {
        self.busy.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Busy(std::sync::Arc::clone(self))
    }

    /// The daemon is stopping: no build starts, a running one ends at its next step.
    pub fn stop(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// No build thread is running.
    pub fn idle(&self) -> bool {
        self.busy.load(std::sync::atomic::Ordering::SeqCst) == 0
    }

    fn stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Images in `dir`, made with `mkfs` (an `mkfs.erofs`), for runs of `runsc` with the
    /// loader `loader` (`isobox-start`: a marker is for one runsc and one loader). `None`
    /// (the reason logged) when `mkfs` is not there: every run uses its tree.
    pub fn new(dir: PathBuf, mkfs: PathBuf, runsc: &Path, loader: &[u8]) -> Option<Self> {
        if !mkfs.is_file() {
            log::info!(
                "no {} (Debian's erofs-utils): cold runs use their runtime's tree with a gofer, never an image",
                mkfs.display()
            );
            return None;
        }
        Some(Self {
            dir,
            mkfs,
            runsc_id: format!(
                "{} loader {}",
                file_id(runsc),
                &crate::jobs::sha256_hex(loader)[..16]
            ),
            trees: Mutex::new(HashMap::new()),
            busy: std::sync::atomic::AtomicUsize::new(0),
            stopping: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Whether a run on `tree` may have its image as root now. One `stat` of the tree's
    /// stamp when the image is known; when it is not, also a read of the stamp and a
    /// look for the image and its marker (at most once a [`RECHECK`] while another
    /// daemon builds it).
    pub fn for_run(&self, tree: &Path) -> ForRun {
        let Some(stamp) = stamp_id(tree) else {
            return ForRun::Tree;
        };
        if self.stopping() {
            return ForRun::Tree;
        }
        let mut trees = self
            .trees
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let t = trees.entry(tree.to_path_buf()).or_insert(Tree {
            stamp: None,
            state: State::Unknown,
            building: false,
        });
        if t.stamp != Some(stamp) {
            t.stamp = Some(stamp);
            t.state = State::Unknown;
        }
        match &t.state {
            // Still there (another daemon of an older tree may remove it, or an operator
            // the whole directory): else looked for, and made, again.
            State::Ready(p) if p.is_file() => return ForRun::Ready(p.clone()),
            State::Ready(_) => t.state = State::Unknown,
            State::Off(_) => return ForRun::Tree,
            State::Pending(since) if since.elapsed() < RECHECK => return ForRun::Tree,
            State::Pending(_) | State::Unknown => {}
        }
        let Some(image) = self.image_path(tree, stamp) else {
            t.state = State::Off("its stamp cannot be read".into());
            return ForRun::Tree;
        };
        if self.marked(&image) {
            t.state = State::Ready(image.clone());
            return ForRun::Ready(image);
        }
        t.state = State::Pending(Instant::now());
        if t.building {
            return ForRun::Tree;
        }
        t.building = true;
        ForRun::Build(BuildTicket {
            tree: tree.to_path_buf(),
            image,
            stamp,
        })
    }

    /// Makes the ticket's image unless another daemon is making it, probes it with
    /// `probe` (a real sandbox on it), and marks it usable; removes the images of the
    /// tree's older stamps. Blocks for as long as `mkfs.erofs` takes (seconds for a
    /// large tree): call it on a thread of its own. A failure turns the tree's image
    /// off in this daemon (logged).
    pub fn build(&self, ticket: BuildTicket, probe: impl FnOnce(&Path) -> Result<(), String>) {
        // The tree's state is settled however this ends, a panic included.
        struct Settle<'a> {
            images: &'a RootImages,
            ticket: &'a BuildTicket,
            result: Option<Result<bool, String>>,
        }
        impl Drop for Settle<'_> {
            fn drop(&mut self) {
                let result = self
                    .result
                    .take()
                    .unwrap_or_else(|| Err("its build panicked".into()));
                self.images.settle(self.ticket, result);
            }
        }
        let mut settle = Settle {
            images: self,
            ticket: &ticket,
            result: None,
        };
        settle.result = Some(self.build_locked(&ticket, probe));
    }

    fn settle(&self, ticket: &BuildTicket, result: Result<bool, String>) {
        let mut trees = self
            .trees
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(t) = trees.get_mut(&ticket.tree) {
            t.building = false;
            if t.stamp == Some(ticket.stamp) {
                t.state = match result {
                    // Ready once marked; another daemon's build is looked at again later.
                    Ok(true) => State::Ready(ticket.image.clone()),
                    Ok(false) => State::Pending(Instant::now()),
                    Err(why) => {
                        log::warn!(
                            "root image of {}: {why}; its runs use the tree",
                            ticket.tree.display()
                        );
                        State::Off(why)
                    }
                };
            }
        }
    }

    /// A build of `tree` that will not run after all (its thread could not start): the
    /// next run looks again.
    pub fn abandon(&self, tree: &Path) {
        let mut trees = self
            .trees
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(t) = trees.get_mut(tree) {
            t.building = false;
            t.state = State::Unknown;
        }
    }

    /// `Ok(true)`: the image is ready; `Ok(false)`: another daemon is making it.
    fn build_locked(
        &self,
        ticket: &BuildTicket,
        probe: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<bool, String> {
        use std::os::unix::fs::DirBuilderExt;
        let name = tree_name(&ticket.tree);
        use std::os::unix::fs::PermissionsExt;
        // Root's alone: an image holds every file of its tree, the unreadable ones too.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .and_then(|()| {
                std::fs::set_permissions(&self.dir, std::fs::Permissions::from_mode(0o700))
            })
            .map_err(|e| format!("making {}: {e}", self.dir.display()))?;
        let lock_path = self.dir.join(format!(".{name}.lock"));
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("opening {}: {e}", lock_path.display()))?;
        if !crate::sys::try_lock_exclusive(&lock).map_err(|e| format!("locking: {e}"))? {
            return Ok(false);
        }
        if self.marked(&ticket.image) {
            return Ok(true);
        }
        self.remove_dead_builds(&name);
        if !ticket.image.is_file() {
            let tmp = self.dir.join(format!(
                ".{}.{}.tmp",
                file_name(&ticket.image),
                std::process::id()
            ));
            let made = self.mkfs(&ticket.tree, &tmp).and_then(|()| {
                // The tree was not rebuilt meanwhile (its files could be of both builds).
                if stamp_id(&ticket.tree) != Some(ticket.stamp) {
                    return Err(String::new());
                }
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
                    .and_then(|()| std::fs::File::open(&tmp))
                    .and_then(|f| f.sync_all())
                    .and_then(|()| std::fs::rename(&tmp, &ticket.image))
                    .map_err(|e| format!("keeping {}: {e}", tmp.display()))
            });
            match made {
                Ok(()) => {}
                // Rebuilt under it: the next run asks for the new tree's image.
                Err(e) if e.is_empty() => {
                    let _ = std::fs::remove_file(&tmp);
                    return Ok(false);
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
            }
        }
        if self.stopping() {
            return Ok(false);
        }
        if let Err(e) = probe(&ticket.image) {
            // Another runsc or loader may have passed it: theirs stays usable.
            if markers_of(&ticket.image).is_empty() {
                let _ = std::fs::remove_file(&ticket.image);
            }
            return Err(format!("its probe failed: {e}"));
        }
        // The tree was not rebuilt meanwhile (else its next run asks for its new image,
        // and this one, of the older stamp, must neither be marked nor remove that one).
        if stamp_id(&ticket.tree) != Some(ticket.stamp) {
            return Ok(false);
        }
        let marker = marker_path(&ticket.image, &self.runsc_id);
        let tmp = self.dir.join(format!(
            ".{}.{}.tmp",
            file_name(&marker),
            std::process::id()
        ));
        let marked = std::fs::File::create(&tmp)
            .and_then(|mut f| {
                f.write_all(self.marker_text(&ticket.tree, ticket.stamp).as_bytes())?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, &marker));
        if let Err(e) = marked {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!("marking {}: {e}", ticket.image.display()));
        }
        self.remove_older(&ticket.tree, ticket.stamp);
        log::info!(
            "root image of {} ready: {}",
            ticket.tree.display(),
            ticket.image.display()
        );
        Ok(true)
    }

    fn mkfs(&self, tree: &Path, out: &Path) -> Result<(), String> {
        let mut cmd = std::process::Command::new(&self.mkfs);
        cmd.arg("--quiet")
            .arg("-Enoinline_data")
            .arg("--preserve-mtime")
            .arg("--exclude-regex=^workspace/.")
            .arg(out)
            .arg(tree)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("running {}: {e}", self.mkfs.display()))?;
        // Its stderr, read meanwhile (a full pipe would stall it).
        let mut stderr = child.stderr.take();
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            if let Some(e) = stderr.as_mut() {
                let _ = std::io::Read::read_to_string(e, &mut text);
            }
            text
        });
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break Ok(st),
                Ok(None) if self.stopping() => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break Err("the daemon is stopping".to_string());
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => break Err(format!("waiting for {}: {e}", self.mkfs.display())),
            }
        };
        let text = reader.join().unwrap_or_default();
        match status? {
            st if st.success() => Ok(()),
            st => Err(format!(
                "{} exited {st}: {}",
                self.mkfs.display(),
                text.trim().chars().take(400).collect::<String>()
            )),
        }
    }

    /// The image of `tree` as it is now (its stamp `id`): `<name>.<key>.erofs`. The key
    /// covers the stamp's contents and the file itself (a forced rebuild of the same
    /// inputs writes the same contents, but a new file).
    fn image_path(&self, tree: &Path, id: StampId) -> Option<PathBuf> {
        let stamp = std::fs::read(tree.join(".isobox/stamp")).ok()?;
        let mut keyed = Vec::new();
        keyed.extend_from_slice(FORMAT.as_bytes());
        keyed.push(0);
        keyed.extend_from_slice(tree.as_os_str().as_encoded_bytes());
        keyed.push(0);
        keyed.extend_from_slice(&stamp);
        keyed.push(0);
        keyed.extend_from_slice(id.text().as_bytes());
        let key = crate::jobs::sha256_hex(&keyed);
        Some(
            self.dir
                .join(format!("{}.{}.erofs", tree_name(tree), &key[..20])),
        )
    }

    fn marker_text(&self, tree: &Path, stamp: StampId) -> String {
        format!(
            "runsc {}\ntree {}\nstamp {}\n",
            self.runsc_id,
            tree.display(),
            stamp.text()
        )
    }

    /// Whether `image` is there with a marker that this runsc probed it.
    fn marked(&self, image: &Path) -> bool {
        let Ok(text) = std::fs::read_to_string(marker_path(image, &self.runsc_id)) else {
            return false;
        };
        image.is_file() && text.lines().next() == Some(&format!("runsc {}", self.runsc_id))
    }

    /// Removes the temporary files of `name`'s builds whose process is gone
    /// (`.<name>.<20 hex>.erofs[.<12 hex>.ok].<pid>.tmp`).
    fn remove_dead_builds(&self, name: &str) {
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let f = e.file_name();
            let f = f.to_string_lossy();
            let Some(rest) = f.strip_prefix(&format!(".{name}.")) else {
                continue;
            };
            let rest_bytes = rest.as_bytes();
            let ours = rest_bytes.len() > 20
                && rest_bytes[..20].iter().all(u8::is_ascii_hexdigit)
                && rest_bytes[20..].starts_with(b".erofs.");
            let Some(pid) = rest
                .strip_suffix(".tmp")
                .and_then(|r| r.rsplit('.').next())
                .and_then(|p| p.parse::<u32>().ok())
                .filter(|_| ours)
            else {
                continue;
            };
            if !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// Removes the images (and markers) of `tree`'s older stamps, which no run can use
    /// again (a daemon with the tree as it is now keys it anew); images of this stamp in
    /// another format (another isoboxd's) stay.
    fn remove_older(&self, tree: &Path, stamp: StampId) {
        let name = tree_name(tree);
        let (this_tree, this_stamp) = (
            format!("tree {}", tree.display()),
            format!("stamp {}", stamp.text()),
        );
        for e in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            let path = e.path();
            let f = e.file_name();
            let f = f.to_string_lossy();
            if !f.starts_with(&format!("{name}.")) || !f.ends_with(".erofs") {
                continue;
            }
            // Only an image of this very tree (another rootfs directory may have a tree
            // of the same name); an unmarked one is a failed or foreign build.
            let markers = markers_of(&path);
            let older = markers.iter().any(|m| {
                std::fs::read_to_string(m).is_ok_and(|t| {
                    let mut lines = t.lines().skip(1);
                    lines.next() == Some(this_tree.as_str())
                        && lines.next() != Some(this_stamp.as_str())
                })
            });
            if older {
                for m in markers {
                    let _ = std::fs::remove_file(m);
                }
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// Every tree this daemon has looked at, by name, and where its image stands.
    pub fn states(&self) -> std::collections::BTreeMap<String, ImageState> {
        let trees = self
            .trees
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        trees
            .iter()
            .map(|(tree, t)| {
                let s = match &t.state {
                    State::Ready(_) => ImageState::Ready,
                    State::Pending(_) | State::Unknown => ImageState::Building,
                    State::Off(why) => ImageState::Off {
                        reason: why.clone(),
                    },
                };
                (tree_name(tree), s)
            })
            .collect()
    }

    /// The images' directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn stamp_id(tree: &Path) -> Option<StampId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(tree.join(".isobox/stamp")).ok()?;
    Some(StampId {
        dev: m.dev(),
        ino: m.ino(),
        mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        size: m.len(),
    })
}

fn file_id(p: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(p) {
        Ok(m) => format!(
            "{} {} {}.{}",
            p.display(),
            m.len(),
            m.mtime(),
            m.mtime_nsec()
        ),
        Err(_) => p.display().to_string(),
    }
}

fn tree_name(tree: &Path) -> String {
    tree.file_name()
        .map_or_else(|| "root".into(), |n| n.to_string_lossy().into_owned())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The marker that the runsc of `runsc_id` ran `image`: `<image>.<hash of the id>.ok`
/// (one per runsc binary, so daemons of different runscs never overwrite each other's).
fn marker_path(image: &Path, runsc_id: &str) -> PathBuf {
    let mut s = image.as_os_str().to_owned();
    s.push(format!(
        ".{}.ok",
        &crate::jobs::sha256_hex(runsc_id.as_bytes())[..12]
    ));
    PathBuf::from(s)
}

/// Every marker of `image`, whichever runsc wrote it.
fn markers_of(image: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (image.parent(), image.file_name()) else {
        return Vec::new();
    };
    let prefix = format!("{}.", name.to_string_lossy());
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            let f = e.file_name();
            let f = f.to_string_lossy();
            f.strip_prefix(&prefix)
                .is_some_and(|rest| rest.ends_with(".ok") && !rest.contains('/'))
        })
        .map(|e| e.path())
        .collect()
}

/// The most a networked run's `/etc/resolv.conf` in the archive may hold.
pub const MAX_RESOLV_CONF: usize = 4096;

/// The workspace archive `isobox-start --unpack` reads (`start.c`): `ISOBOXW1`; a
/// networked run's `/etc/resolv.conf` first (`r`, u16le size, bytes), which the loader
/// binds read-only over the image's own; each directory (`d`, u16le length, path)
/// before what is in it, each file (`f`, u16le length, path, u64le size, bytes), then
/// a 0.
///
/// # Errors
/// A name that is not a plain relative path (empty, absolute, a `.` or `..` or empty
/// component, a NUL) or longer than 4095 bytes, two entries at one path, or a
/// resolv.conf over [`MAX_RESOLV_CONF`].
pub fn archive(resolv_conf: Option<&[u8]>, files: &[(String, Vec<u8>)]) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity(
        64 + resolv_conf.map_or(0, <[u8]>::len)
            + files
                .iter()
                .map(|(n, c)| n.len() + c.len() + 11)
                .sum::<usize>(),
    );
    out.extend_from_slice(b"ISOBOXW1");
    if let Some(conf) = resolv_conf {
        if conf.len() > MAX_RESOLV_CONF {
            return Err(format!(
                "a resolv.conf of {} bytes (at most {MAX_RESOLV_CONF})",
                conf.len()
            ));
        }
        out.push(b'r');
        out.extend_from_slice(&(conf.len() as u16).to_le_bytes());
        out.extend_from_slice(conf);
    }
    let mut dirs = std::collections::HashSet::new();
    let mut names = std::collections::HashSet::new();
    let entry = |out: &mut Vec<u8>, kind: u8, path: &str| {
        out.push(kind);
        out.extend_from_slice(&(path.len() as u16).to_le_bytes());
        out.extend_from_slice(path.as_bytes());
    };
    for (name, content) in files {
        let plain = !name.is_empty()
            && name.len() < 4096
            && !name.starts_with('/')
            && !name.contains('\0')
            && name
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !plain {
            return Err(format!("{name:?} is not a plain relative path"));
        }
        for (i, _) in name.match_indices('/') {
            let dir = &name[..i];
            if names.contains(dir) {
                return Err(format!("{dir:?} is both a file and a directory"));
            }
            if dirs.insert(dir.to_string()) {
                entry(&mut out, b'd', dir);
            }
        }
        if dirs.contains(name.as_str()) || !names.insert(name.clone()) {
            return Err(format!("{name:?} is given twice"));
        }
        entry(&mut out, b'f', name);
        out.extend_from_slice(&(content.len() as u64).to_le_bytes());
        out.extend_from_slice(content);
    }
    out.push(0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_archive_lists_directories_before_their_files_once() {
        let a = archive(
            None,
            &[
                ("main.py".into(), b"print(1)".to_vec()),
                ("data/in.txt".into(), b"in".to_vec()),
                ("data/sub/x".into(), Vec::new()),
            ],
        )
        .unwrap();
        let mut want = b"ISOBOXW1".to_vec();
        want.extend_from_slice(b"f\x07\x00main.py\x08\x00\x00\x00\x00\x00\x00\x00print(1)");
        want.extend_from_slice(b"d\x04\x00data");
        want.extend_from_slice(b"f\x0b\x00data/in.txt\x02\x00\x00\x00\x00\x00\x00\x00in");
        want.extend_from_slice(b"d\x08\x00data/sub");
        want.extend_from_slice(b"f\x0a\x00data/sub/x\x00\x00\x00\x00\x00\x00\x00\x00");
        want.push(0);
        assert_eq!(a, want);
        // A networked run's resolv.conf goes first, whatever the files.
        let a = archive(
            Some(b"nameserver 192.0.2.1\n"),
            &[("m".into(), b"x".to_vec())],
        )
        .unwrap();
        let mut want = b"ISOBOXW1r\x15\x00nameserver 192.0.2.1\n".to_vec();
        want.extend_from_slice(b"f\x01\x00m\x01\x00\x00\x00\x00\x00\x00\x00x");
        want.push(0);
        assert_eq!(a, want);
        assert_eq!(archive(Some(b""), &[]).unwrap(), b"ISOBOXW1r\x00\x00\x00");
    }

    #[test]
    fn test_archive_refuses_what_is_not_a_plain_relative_path() {
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a/.",
            "a/",
            "a\0b",
        ] {
            assert!(
                archive(None, &[(bad.into(), Vec::new())]).is_err(),
                "{bad:?}"
            );
        }
        assert!(archive(None, &[("x".repeat(4095), Vec::new())]).is_ok());
        assert!(archive(None, &[("x".repeat(4096), Vec::new())]).is_err());
        let twice =
            |a: &str, b: &str| archive(None, &[(a.into(), Vec::new()), (b.into(), Vec::new())]);
        assert!(twice("a", "a").is_err());
        assert!(twice("a", "a/b").is_err());
        assert!(twice("a/b", "a").is_err());
        // resolv.conf: below, at and above its bound.
        for (n, ok) in [
            (MAX_RESOLV_CONF - 1, true),
            (MAX_RESOLV_CONF, true),
            (MAX_RESOLV_CONF + 1, false),
        ] {
            assert_eq!(archive(Some(&vec![b'#'; n]), &[]).is_ok(), ok, "{n}");
        }
    }

    fn third_image(imgs: &RootImages, tree: &Path) -> PathBuf {
        match imgs.for_run(tree) {
            ForRun::Ready(p) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn test_an_image_is_used_once_marked_for_this_runsc_and_a_new_stamp_wants_another() {
        let base = std::env::temp_dir().join(format!("isobox-image-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let tree = base.join("rootfs/py");
        std::fs::create_dir_all(tree.join(".isobox")).unwrap();
        std::fs::write(tree.join(".isobox/stamp"), "one\n").unwrap();
        // Any existing file stands for mkfs.erofs: the build below is never run.
        let runsc = base.join("runsc");
        std::fs::write(&runsc, "x").unwrap();
        let imgs = RootImages::new(base.join("images"), runsc.clone(), &runsc, b"l").unwrap();
        // No stamp: the tree.
        assert!(matches!(
            imgs.for_run(&base.join("rootfs/none")),
            ForRun::Tree
        ));
        // First look: build it; a second look meanwhile: the tree, no second build.
        let ForRun::Build(t) = imgs.for_run(&tree) else {
            panic!("no build")
        };
        assert!(matches!(imgs.for_run(&tree), ForRun::Tree));
        assert_eq!(imgs.states()["py"], ImageState::Building);
        // Made by hand (as mkfs would), then a probe that fails: off, image removed.
        std::fs::create_dir_all(base.join("images")).unwrap();
        std::fs::write(t.image(), "image").unwrap();
        let first = t.image().to_path_buf();
        imgs.build(t, |_| Err("no".into()));
        assert!(!first.exists());
        assert!(matches!(imgs.for_run(&tree), ForRun::Tree));
        assert!(matches!(imgs.states()["py"], ImageState::Off { .. }));
        // A new stamp: a new key, a new build; this time the probe passes.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(tree.join(".isobox/stamp"), "two\n").unwrap();
        let ForRun::Build(t) = imgs.for_run(&tree) else {
            panic!("no build")
        };
        assert_ne!(t.image(), first.as_path());
        std::fs::write(t.image(), "image").unwrap();
        let second = t.image().to_path_buf();
        imgs.build(t, |img| {
            assert!(img.is_file());
            Ok(())
        });
        match imgs.for_run(&tree) {
            ForRun::Ready(p) => assert_eq!(p, second),
            other => panic!("{other:?}"),
        }
        // Another daemon with the same runsc uses it at once; one with another runsc
        // would probe it again.
        let other = RootImages::new(base.join("images"), runsc.clone(), &runsc, b"l").unwrap();
        assert!(matches!(other.for_run(&tree), ForRun::Ready(_)));
        let runsc2 = base.join("runsc2");
        std::fs::write(&runsc2, "yy").unwrap();
        let third = RootImages::new(base.join("images"), runsc.clone(), &runsc2, b"l").unwrap();
        assert!(matches!(third.for_run(&tree), ForRun::Build(_)));
        // A third stamp's image, once ready, takes the second's place on disk.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(tree.join(".isobox/stamp"), "three\n").unwrap();
        let ForRun::Build(t) = imgs.for_run(&tree) else {
            panic!("no build")
        };
        std::fs::write(t.image(), "image").unwrap();
        imgs.build(t, |_| Ok(()));
        assert!(!second.exists());
        assert!(markers_of(&second).is_empty());
        let third_img = third_image(&imgs, &tree);
        assert_eq!(markers_of(&third_img).len(), 1);
        // Another runsc's probe of it fails: the image stays for the runsc that passed.
        let other2 = RootImages::new(base.join("images"), runsc.clone(), &runsc2, b"l").unwrap();
        let ForRun::Build(t) = other2.for_run(&tree) else {
            panic!("no build")
        };
        other2.build(t, |_| Err("no".into()));
        assert!(third_img.is_file());
        assert!(matches!(imgs.for_run(&tree), ForRun::Ready(_)));
        // A forced rebuild writes the same stamp anew: another image.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::remove_file(tree.join(".isobox/stamp")).unwrap();
        std::fs::write(tree.join(".isobox/stamp"), "three\n").unwrap();
        let ForRun::Build(t) = imgs.for_run(&tree) else {
            panic!("no build")
        };
        assert_ne!(t.image(), third_img.as_path());
        // That image made: used; removed under the daemon: looked for again, not used.
        std::fs::write(t.image(), "image").unwrap();
        imgs.build(t, |_| Ok(()));
        let fourth = third_image(&imgs, &tree);
        std::fs::remove_file(&fourth).unwrap();
        assert!(matches!(imgs.for_run(&tree), ForRun::Build(_)));
        // Temporary files: a dead build's go, a live one's, another tree's and odd
        // names stay (no panic on a name cut inside a character).
        let dir = base.join("images");
        let dead = dir.join(format!(".py.{}.erofs.4294967295.tmp", "a".repeat(20)));
        let live = dir.join(format!(
            ".py.{}.erofs.{}.tmp",
            "b".repeat(20),
            std::process::id()
        ));
        let other = dir.join(format!(".py.x.{}.erofs.4294967295.tmp", "c".repeat(20)));
        let odd = dir.join(".py.aéééééééééé.lock");
        for f in [&dead, &live, &other, &odd] {
            std::fs::write(f, "").unwrap();
        }
        imgs.remove_dead_builds("py");
        assert!(!dead.exists() && live.exists() && other.exists() && odd.exists());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
