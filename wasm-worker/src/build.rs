//! `isobox-wasm build`: an eryx environment's snapshot. The daemon starts it jailed as
//! the worker is (its own cgroup with a memory cap, no network, no new privileges), as
//! a user of its own (not the workers'), kills it past its time, and reads one JSON
//! line from its stdout: `{"snapshot": FILE}` or `{"error": WHY}`.
//!
//! The uploaded packages (`.whl` zip files, `.tar.gz`/`.tgz` archives) are unpacked here,
//! never in the daemon, into `OUT/site-packages`, within bounds: no entry outside the
//! directory (absolute paths, `..`, links, devices are refused), at most
//! [`MAX_FILES`] files, [`MAX_DIRS`] directories and [`MAX_BYTES`] bytes unpacked in
//! all. A source archive (`PKG-INFO` one level down) is refused: it is not installed
//! code. A library with native
//! code for Linux, macOS or Windows fails the build with a clear error. Extension
//! modules built for WebAssembly (`NAME.cpython-314-wasm32-wasi.so`, `NAME.abi3.so`:
//! shared libraries with a `dylink.0` section, as wasi-sdk makes them) are linked into
//! the environment's Python (eryx's late linking), under the path runs import them
//! from; one built for another CPython fails the build. Then Python is
//! pre-initialised with the site-packages mounted and the environment's imports run
//! (a failing import fails the build with its traceback), and compiled: the snapshot
//! `OUT/<name>` has the same name the standard snapshot has, so a daemon knows an
//! environment built by an older eryx or on another CPU from its name.

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};

/// Files unpacked from all of an environment's packages.
pub const MAX_FILES: usize = 20_000;
/// Directories made for all of an environment's packages (explicit or implied by a
/// file's path).
pub const MAX_DIRS: usize = 20_000;
/// Bytes unpacked from all of an environment's packages.
pub const MAX_BYTES: u64 = 512 << 20;
/// Directory levels of one unpacked path.
const MAX_DEPTH: usize = 32;
/// Bytes of one unpacked path.
const MAX_PATH: usize = 1024;
/// WebAssembly extension modules of one environment (each becomes a module instance
/// of its own in the linked Python; numpy has about 20, scipy over 100).
pub const MAX_EXTENSIONS: usize = 256;
/// Where runs see the environment's site-packages (eryx's session executor mounts them
/// there); the path an extension module is opened by.
const RUN_SITE: &str = "/site-packages-0";

/// Unpacks into `site`, within the bounds, counting what all packages use.
struct Unpacker {
    site: PathBuf,
    files: usize,
    bytes: u64,
    /// Directories made so far (relative to `site`).
    dirs: std::collections::HashSet<PathBuf>,
    /// WebAssembly extension modules unpacked (relative to `site`; a later package
    /// may have written the same path again: checked once all are unpacked).
    extensions: std::collections::BTreeSet<PathBuf>,
}

impl Unpacker {
    /// `path` as the user should read it: relative to site-packages (never the host's
    /// layout).
    fn shown(&self, path: &Path) -> String {
        path.strip_prefix(&self.site)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// Makes directory `dir` (under `site`) and its parents, each counted once.
    fn mkdirs(&mut self, dir: &Path) -> Result<(), String> {
        let rel = dir.strip_prefix(&self.site).unwrap_or(dir).to_path_buf();
        let mut at = PathBuf::new();
        for c in rel.components() {
            at.push(c);
            if self.dirs.contains(&at) {
                continue;
            }
            if self.dirs.len() >= MAX_DIRS {
                return Err(format!("the packages make over {MAX_DIRS} directories"));
            }
            let full = self.site.join(&at);
            match std::fs::create_dir(&full) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && full.is_dir() => {}
                Err(e) => return Err(format!("{}: {e}", self.shown(&full))),
            }
            self.dirs.insert(at.clone());
        }
        Ok(())
    }

    /// Copies one file's bytes within the bounds, then refuses native code and notes a
    /// WebAssembly extension module.
    fn file(&mut self, path: &Path, from: &mut impl Read) -> Result<(), String> {
        self.files += 1;
        if self.files > MAX_FILES {
            return Err(format!("the packages hold over {MAX_FILES} files"));
        }
        if let Some(parent) = path.parent() {
            self.mkdirs(parent)?;
        }
        let shown = self.shown(path);
        let mut f = std::fs::File::create(path).map_err(|e| format!("{shown}: {e}"))?;
        let room = MAX_BYTES - self.bytes;
        let mut limited = from.take(room + 1);
        let mut head = [0u8; 4];
        let mut got = 0;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = limited
                .read(&mut buf)
                .map_err(|e| format!("reading {shown}: {e}"))?;
            if n == 0 {
                break;
            }
            if got < 4 {
                let k = (4 - got).min(n);
                head[got..got + k].copy_from_slice(&buf[..k]);
            }
            got += n;
            self.bytes += n as u64;
            if self.bytes > MAX_BYTES {
                return Err(format!(
                    "the packages unpack to over {} MiB",
                    MAX_BYTES >> 20
                ));
            }
            f.write_all(&buf[..n])
                .map_err(|e| format!("{shown}: {e}"))?;
        }
        if native_code(path, &head[..got.min(4)])? {
            let rel = path.strip_prefix(&self.site).unwrap_or(path).to_path_buf();
            self.extensions.insert(rel);
            if self.extensions.len() > MAX_EXTENSIONS {
                return Err(format!(
                    "the packages hold over {MAX_EXTENSIONS} WebAssembly extension modules"
                ));
            }
        }
        Ok(())
    }

    /// The WebAssembly extension modules as the linker takes them: named by the path
    /// runs open them by, in path order, each checked ([`check_library`]) and none
    /// exporting a function another library exports with another signature (the
    /// linker would abort). A path a later package wrote over with something else is
    /// no longer one.
    fn extensions(&self) -> Result<Vec<eryx_runtime::linker::NativeExtension>, String> {
        let mut out = Vec::new();
        let mut exported: std::collections::HashMap<String, (wasmparser::FuncType, String)> =
            std::collections::HashMap::new();
        for rel in &self.extensions {
            let shown = rel.display().to_string();
            let bytes = std::fs::read(self.site.join(rel)).map_err(|e| format!("{shown}: {e}"))?;
            if !bytes.starts_with(b"\0asm") {
                continue;
            }
            if out.is_empty() {
                base_exports(&mut exported)?;
            }
            for (f, ty) in check_library(&shown, &bytes, false)? {
                match exported.get(&f) {
                    Some((other, by)) if *other != ty => {
                        return Err(format!(
                            "{shown} exports {f} with another signature than {by} does: the libraries of one environment share one namespace"
                        ))
                    }
                    Some(_) => {}
                    None => {
                        exported.insert(f, (ty, shown.clone()));
                    }
                }
            }
            let name = format!("{RUN_SITE}/{shown}");
            out.push(eryx_runtime::linker::NativeExtension::new(name, bytes));
        }
        Ok(out)
    }
}

/// Builds the environment whose packages are the files of `packages` (named
/// `NN.whl`, `NN.tar.gz` or `NN.tgz`, unpacked in name order; `names` are the names
/// they were uploaded as, for errors) into `out`; the snapshot's file name.
pub fn build(
    rt: &tokio::runtime::Runtime,
    lib: &Path,
    packages: &Path,
    names: &[String],
    out: &Path,
    imports: &[String],
    snapshot_name: &str,
) -> Result<String, String> {
    let site = out.join("site-packages");
    std::fs::create_dir_all(&site).map_err(|e| format!("site-packages: {e}"))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(packages)
        .map_err(|e| format!("the packages: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let mut up = Unpacker {
        site: site.clone(),
        files: 0,
        bytes: 0,
        dirs: std::collections::HashSet::new(),
        extensions: std::collections::BTreeSet::new(),
    };
    for (i, f) in files.iter().enumerate() {
        let shown = names
            .get(i)
            .cloned()
            .unwrap_or_else(|| f.display().to_string());
        let file_name = f.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let r = if file_name.ends_with(".whl") {
            unpack_wheel(f, &mut up)
        } else if file_name.ends_with(".tar.gz") || file_name.ends_with(".tgz") {
            unpack_tar_gz(f, &mut up)
        } else {
            Err("not a .whl, .tar.gz or .tgz file".into())
        };
        r.map_err(|e| format!("{shown}: {e}"))?;
    }
    for m in imports {
        if !crate::modname::is_module_name(m) || crate::modname::is_reserved(m) {
            return Err(format!("{m:?} is not a module name a package may give"));
        }
    }
    let extensions = up.extensions()?;
    // With extension modules, the build opens them by the paths runs use (first);
    // the relocation runs last, after the environment's imports.
    let mut helpers = vec![(RELOCATE, RELOCATE_PY)];
    let mut all: Vec<&str> = Vec::new();
    if !extensions.is_empty() {
        helpers.push((RUN_PATHS, RUN_PATHS_PY));
        all.push(RUN_PATHS);
    }
    if let Some(own) = std::fs::read_dir(&site)
        .map_err(|e| format!("site-packages: {e}"))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| crate::modname::is_reserved(n))
    {
        return Err(format!(
            "the packages hold {own} at their top: names starting _isobox_ are the server's own"
        ));
    }
    for (name, code) in &helpers {
        std::fs::write(site.join(format!("{name}.py")), code)
            .map_err(|e| format!("site-packages: {e}"))?;
    }
    all.extend_from_slice(crate::PREIMPORTS);
    all.extend(imports.iter().map(String::as_str));
    all.push(RELOCATE);
    let initialised = rt.block_on(eryx::preinit::pre_initialize(
        lib,
        Some(&site),
        &all,
        &extensions,
    ));
    for (name, _) in &helpers {
        std::fs::remove_file(site.join(format!("{name}.py")))
            .map_err(|e| format!("site-packages: {e}"))?;
    }
    let component = initialised.map_err(|e| {
        let e = format!("{e:#}");
        match e.split_once("Failed to link component with extensions: ") {
            // The linker names a library by the path runs open it by: shown as the
            // package's own path.
            Some((_, why)) => bounded(format!(
                "Linking the WebAssembly extension modules failed: {}\n",
                why.trim_end().replace(&format!("{RUN_SITE}/"), "")
            )),
            None => import_error(&e, imports),
        }
    })?;
    let compiled = eryx::PythonExecutor::precompile(&component)
        .map_err(|e| format!("compiling the snapshot: {e}"))?;
    let path = out.join(snapshot_name);
    std::fs::write(&path, &compiled).map_err(|e| format!("writing the snapshot: {e}"))?;
    Ok(snapshot_name.to_string())
}

/// The module that moves what the snapshot knows of site-packages to where runs see
/// it. eryx pre-initialises with the packages at `/site-packages`, but its session
/// executor (every run goes through one) mounts them at `/site-packages-0`: without
/// this, `sys.path` would name a directory runs do not have, and a package imported at
/// the build would look for its submodules and data files there.
const RELOCATE: &str = "_isobox_relocate_site";

/// The module that has the build open extension modules by the paths runs import them
/// from. The linked Python's `dlopen` finds a library by the exact name it was linked
/// under, and the build sees site-packages at `/site-packages`, runs at
/// `/site-packages-0`: the libraries are linked under the run's paths (so an import in
/// a run finds them), and while the build imports, this maps the path it opens.
/// [`RELOCATE`] puts the original back.
const RUN_PATHS: &str = "_isobox_run_paths";

/// Its code.
const RUN_PATHS_PY: &str = r#"import _imp, importlib.machinery
OLD, NEW = "/site-packages/", "/site-packages-0/"
original = _imp.create_dynamic
def create_dynamic(spec, *rest):
    origin = spec.origin
    if isinstance(origin, str) and origin.startswith(OLD):
        spec = importlib.machinery.ModuleSpec(spec.name, spec.loader, origin=NEW + origin[len(OLD):])
    return original(spec, *rest)
_imp.create_dynamic = create_dynamic
"#;

/// Its code: every path under `/site-packages` in `sys.path`, the importer cache and
/// the imported modules (`__file__`, `__cached__`, `__path__`, their specs and
/// loaders) is moved under `/site-packages-0`. (It stays in `sys.modules`: the import
/// system needs it there to finish its import; its file is gone before any run.)
const RELOCATE_PY: &str = r#"import sys
OLD, NEW = "/site-packages", "/site-packages-0"
if "_isobox_run_paths" in sys.modules:
    import _imp
    _imp.create_dynamic = sys.modules["_isobox_run_paths"].original
    del sys.modules["_isobox_run_paths"]
def _fix(p):
    if isinstance(p, str) and (p == OLD or p.startswith(OLD + "/")):
        return NEW + p[len(OLD):]
    return p
sys.path[:] = [_fix(p) for p in sys.path]
for _k in [k for k in sys.path_importer_cache if _fix(k) != k]:
    del sys.path_importer_cache[_k]
for _m in list(sys.modules.values()):
    _d = getattr(_m, "__dict__", None)
    if not isinstance(_d, dict):
        continue
    for _a in ("__file__", "__cached__"):
        if isinstance(_d.get(_a), str):
            _d[_a] = _fix(_d[_a])
    _p = _d.get("__path__")
    if isinstance(_p, list):
        _p[:] = [_fix(x) for x in _p]
    elif _p is not None and isinstance(getattr(_p, "_path", None), list):
        _p._path[:] = [_fix(x) for x in _p._path]
    _s = _d.get("__spec__")
    if _s is not None:
        try:
            _s.origin = _fix(_s.origin)
            if isinstance(_s.submodule_search_locations, list):
                _s.submodule_search_locations[:] = [_fix(x) for x in _s.submodule_search_locations]
            if isinstance(getattr(_s, "_cached", None), str):
                _s._cached = _fix(_s._cached)
        except Exception:
            pass
    _l = _d.get("__loader__")
    if _l is not None and isinstance(getattr(_l, "path", None), str):
        try:
            _l.path = _fix(_l.path)
        except Exception:
            pass
"#;

/// The pre-initialisation's error as the user should read it: the traceback of the
/// import that failed, without eryx's wrapping.
fn import_error(e: &str, imports: &[String]) -> String {
    let body = e
        .split_once("Pre-init import execution failed: ")
        .map_or(e, |(_, rest)| rest);
    let body = body
        .split_once("\nImport code:")
        .map_or(body, |(tb, _)| tb)
        .trim_end();
    let what = if imports.is_empty() {
        "Starting Python with these packages failed".to_string()
    } else {
        format!("Importing {} failed", imports.join(", "))
    };
    bounded(format!("{what}:\n{body}\n"))
}

/// A build's error, cut at 64 KiB.
fn bounded(mut s: String) -> String {
    if s.len() > 64 << 10 {
        let mut end = 64 << 10;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("\n[cut]\n");
    }
    s
}

/// Where an archive's entry `name` goes under `site`, or `None` for entries that are
/// not installed (a wheel's scripts, headers and data).
fn target(site: &Path, name: &str, wheel: bool) -> Result<Option<PathBuf>, String> {
    if name.len() > MAX_PATH {
        return Err(format!("an entry's name is over {MAX_PATH} bytes"));
    }
    if name.contains('\\') || name.contains('\0') {
        return Err(format!(
            "the entry {name:?} has a backslash or a NUL in its name"
        ));
    }
    let mut parts: Vec<&str> = Vec::new();
    for c in Path::new(name).components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str().unwrap_or_default()),
            Component::CurDir => {}
            _ => return Err(format!("the entry {name:?} points outside its package")),
        }
    }
    // A wheel's `NAME.data/purelib/…` and `…/platlib/…` go to site-packages; its
    // other `.data` directories are not for a sandbox without files or commands.
    if wheel && parts.first().is_some_and(|p| p.ends_with(".data")) {
        match parts.get(1) {
            Some(&"purelib") | Some(&"platlib") => {
                parts.drain(..2);
            }
            _ => return Ok(None),
        }
    }
    if parts.is_empty() {
        return Ok(None);
    }
    if parts.len() > MAX_DEPTH {
        return Err(format!(
            "the entry {name:?} is over {MAX_DEPTH} levels deep"
        ));
    }
    Ok(Some(
        parts.iter().fold(site.to_path_buf(), |p, c| p.join(c)),
    ))
}

/// Refuses a library of native code, which Python in WebAssembly cannot load; whether
/// the file is an extension module built for WebAssembly (for this CPython).
fn native_code(path: &Path, head: &[u8]) -> Result<bool, String> {
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let library = name.ends_with(".so")
        || name.contains(".so.")
        || name.ends_with(".pyd")
        || name.ends_with(".dylib");
    if !library {
        return Ok(false);
    }
    let kind = match head {
        [0x7f, b'E', b'L', b'F'] => "native code for Linux",
        [0xcf, 0xfa, 0xed, 0xfe] | [0xce, 0xfa, 0xed, 0xfe] | [0xca, 0xfe, 0xba, 0xbe] => {
            "native code for macOS"
        }
        [b'M', b'Z', ..] => "native code for Windows",
        [0, b'a', b's', b'm'] => return wasm_extension(name),
        _ => return Ok(false),
    };
    Err(format!(
        "{name} is {kind}, which Python in WebAssembly cannot load: packages must be pure Python"
    ))
}

/// Whether WebAssembly library `name` is an extension module this Python imports
/// (`.cpython-314-wasm32-wasi.so`, `.abi3.so`, `.so`, its `EXTENSION_SUFFIXES`); one
/// tagged for another CPython fails the build rather than an import later.
fn wasm_extension(name: &str) -> Result<bool, String> {
    if !name.ends_with(".so") {
        // A `.pyd` or `.dylib`: nothing imports it here.
        return Ok(false);
    }
    let tag = name.rsplit('.').nth(1).unwrap_or_default();
    if let Some(version) = tag.strip_prefix("cpython-") {
        if version != "314-wasm32-wasi" {
            return Err(format!(
                "{name} is an extension module built for another Python (cpython-{version}): this Python is CPython 3.14 for wasm32-wasi (cpython-314-wasm32-wasi or abi3)"
            ));
        }
    }
    Ok(true)
}

/// Table entries a library may import (the shared function table); the runs' limiter
/// bounds its growth too.
pub const MAX_TABLE_ELEMENTS: u64 = 1 << 20;

/// Checks extension module `name` (`bytes`, WebAssembly) before it is linked: a core
/// module with a `dylink.0` section (a shared library, as wasi-sdk builds one with
/// `-fPIC -shared`) that defines no memory and no table of its own and imports only the
/// shared ones (`env.memory`, `env.__indirect_function_table`): so its code works in the
/// one linear memory a run's cap bounds. Returns its exported functions and their
/// types. With `trusted` (eryx's own libraries) only the exports are read.
fn check_library(
    name: &str,
    bytes: &[u8],
    trusted: bool,
) -> Result<Vec<(String, wasmparser::FuncType)>, String> {
    use wasmparser::{CompositeInnerType, Encoding, ExternalKind, Parser, Payload, TypeRef};
    let bad = |e: wasmparser::BinaryReaderError| format!("{name} is not valid WebAssembly: {e}");
    let mut dylink = false;
    let mut types: Vec<Option<wasmparser::FuncType>> = Vec::new();
    let mut funcs: Vec<u32> = Vec::new();
    let mut exports: Vec<(String, u32)> = Vec::new();
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(bad)? {
            Payload::Version {
                encoding: Encoding::Component,
                ..
            } => {
                return Err(format!(
                    "{name} is a WebAssembly component, not a shared library of a module"
                ))
            }
            Payload::CustomSection(c) if c.name() == "dylink.0" => dylink = true,
            Payload::TypeSection(r) => {
                for group in r {
                    for t in group.map_err(bad)?.into_types() {
                        types.push(match t.composite_type.inner {
                            CompositeInnerType::Func(f) => Some(f),
                            _ => None,
                        });
                    }
                }
            }
            Payload::ImportSection(r) => {
                for i in r {
                    let i = i.map_err(bad)?;
                    let shared = match i.ty {
                        TypeRef::Func(t) => {
                            funcs.push(t);
                            true
                        }
                        TypeRef::Memory(_) => i.module == "env" && i.name == "memory",
                        TypeRef::Table(t) => {
                            i.module == "env"
                                && i.name == "__indirect_function_table"
                                && t.initial <= MAX_TABLE_ELEMENTS
                        }
                        _ => true,
                    };
                    if !shared && !trusted {
                        return Err(format!(
                            "{name} imports a memory or table other than the shared ones ({}.{}): extension modules use env.memory and env.__indirect_function_table",
                            i.module, i.name
                        ));
                    }
                }
            }
            Payload::FunctionSection(r) => {
                for f in r {
                    funcs.push(f.map_err(bad)?);
                }
            }
            Payload::MemorySection(r) if r.count() > 0 && !trusted => {
                return Err(format!(
                    "{name} defines a memory of its own: extension modules use the shared env.memory, which a run's memory cap bounds"
                ))
            }
            Payload::TableSection(r) if r.count() > 0 && !trusted => {
                return Err(format!(
                    "{name} defines a table of its own: extension modules use the shared env.__indirect_function_table"
                ))
            }
            Payload::ExportSection(r) => {
                for e in r {
                    let e = e.map_err(bad)?;
                    if e.kind == ExternalKind::Func {
                        exports.push((e.name.to_string(), e.index));
                    }
                }
            }
            _ => {}
        }
    }
    if !dylink && !trusted {
        return Err(format!(
            "{name} is WebAssembly but not a shared library (no dylink.0 section): build extension modules as wasi-sdk does (-fPIC -shared)"
        ));
    }
    exports
        .into_iter()
        .map(|(f, i)| {
            let ty = funcs
                .get(i as usize)
                .and_then(|t| types.get(*t as usize).cloned().flatten())
                .ok_or_else(|| {
                    format!("{name} is not valid WebAssembly: export {f} has no function type")
                })?;
            Ok((f, ty))
        })
        .collect()
}

/// The functions the base libraries (libc, libpython, eryx's runtime…) export, for the
/// clash check.
fn base_exports(
    into: &mut std::collections::HashMap<String, (wasmparser::FuncType, String)>,
) -> Result<(), String> {
    use eryx_runtime::linker::base_libraries as b;
    for (lib, z) in [
        ("libc.so", b::LIBC),
        ("libc++.so", b::LIBCXX),
        ("libc++abi.so", b::LIBCXXABI),
        ("libpython3.14.so", b::LIBPYTHON),
        ("libwasi-emulated-mman.so", b::LIBWASI_EMULATED_MMAN),
        (
            "libwasi-emulated-process-clocks.so",
            b::LIBWASI_EMULATED_PROCESS_CLOCKS,
        ),
        ("libwasi-emulated-getpid.so", b::LIBWASI_EMULATED_GETPID),
        ("libwasi-emulated-signal.so", b::LIBWASI_EMULATED_SIGNAL),
        ("liberyx_runtime.so", b::LIBERYX_RUNTIME),
        ("liberyx_bindings.so", b::LIBERYX_BINDINGS),
    ] {
        let bytes = zstd::decode_all(z).map_err(|e| format!("{lib}: {e}"))?;
        for (f, ty) in check_library(lib, &bytes, true)? {
            into.entry(f).or_insert((ty, lib.to_string()));
        }
    }
    Ok(())
}

/// Unpacks a wheel (a zip file).
fn unpack_wheel(file: &Path, up: &mut Unpacker) -> Result<(), String> {
    let f = std::fs::File::open(file).map_err(|e| e.to_string())?;
    let mut zip = zip::ZipArchive::new(std::io::BufReader::new(f))
        .map_err(|e| format!("not a readable wheel (zip): {e}"))?;
    if zip.len() > MAX_FILES + MAX_DIRS {
        return Err(format!("over {} entries", MAX_FILES + MAX_DIRS));
    }
    for i in 0..zip.len() {
        let mut entry = zip.by_index(i).map_err(|e| format!("entry {i}: {e}"))?;
        let name = entry.name().to_string();
        if entry.unix_mode().is_some_and(|m| m & 0o170000 == 0o120000) {
            return Err(format!("the entry {name:?} is a symbolic link"));
        }
        let Some(path) = target(&up.site, &name, true)? else {
            continue;
        };
        if entry.is_dir() {
            up.mkdirs(&path)?;
            continue;
        }
        up.file(&path, &mut entry)?;
    }
    Ok(())
}

/// Unpacks a gzipped tar archive (the layout of wasi-wheels: the packages' own
/// directories at its top). A source archive (`NAME-VERSION/PKG-INFO`) is refused.
fn unpack_tar_gz(file: &Path, up: &mut Unpacker) -> Result<(), String> {
    let f = std::fs::File::open(file).map_err(|e| e.to_string())?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(std::io::BufReader::new(f)));
    let entries = tar
        .entries()
        .map_err(|e| format!("not a readable .tar.gz: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("not a readable .tar.gz: {e}"))?;
        let name = entry
            .path()
            .map_err(|e| format!("an entry's name: {e}"))?
            .to_string_lossy()
            .into_owned();
        let kind = entry.header().entry_type();
        let parts: Vec<&str> = name
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        if parts.len() == 2 && parts[1] == "PKG-INFO" {
            return Err(format!(
                "a source archive ({name} at its top), not installable code: upload the package's wheel (.whl)"
            ));
        }
        let Some(path) = target(&up.site, &name, false)? else {
            continue;
        };
        if kind.is_dir() {
            up.mkdirs(&path)?;
        } else if kind.is_file() {
            up.file(&path, &mut entry)?;
        } else if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
            continue;
        } else {
            return Err(format!(
                "the entry {name:?} is not a file or a directory (links and devices are refused)"
            ));
        }
    }
    Ok(())
}
