//! `POST /v1/environments`: the multipart form (RFC 7578), read from the file the body
//! was streamed to, a bounded buffer at a time. Package parts are copied to their own
//! files as they are read; text fields are held (a few KiB at most). Everything is
//! bounded: the parts, each part's head, each text field, the packages' bytes in all.

use super::Rejection;
use std::io::{Read, Write};
use std::path::Path;

/// Bytes of all packages of one environment (the document: "up to 50 MB in all").
pub const PACKAGES_BYTES: u64 = 50 << 20;
/// Bytes of a whole upload: the packages and the form around them.
pub const BODY_BYTES: u64 = PACKAGES_BYTES + (1 << 20);
/// Packages of one environment.
pub const MAX_PACKAGES: usize = 100;
/// Modules one environment imports at its build.
pub const MAX_IMPORTS: usize = 64;
/// Parts of one form.
const MAX_PARTS: usize = 200;
/// Bytes of one part's head.
const MAX_PART_HEAD: usize = 8 << 10;
/// Bytes of a text field (`name`, `imports`).
const MAX_TEXT: usize = 4 << 10;
/// Bytes of a package's file name.
const MAX_FILE_NAME: usize = 255;

/// The checked form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvForm {
    /// The environment's name.
    pub name: String,
    /// Modules to import at its build.
    pub imports: Vec<String>,
    /// The packages' names as uploaded, in order; package `i` is stored as
    /// `{i:03}{ext}` (`.whl`, `.tar.gz` or `.tgz`) in the packages directory.
    pub packages: Vec<String>,
}

/// The multipart boundary of a `Content-Type`.
///
/// # Errors
/// 415 when the body is not `multipart/form-data` with a boundary.
pub fn boundary(content_type: Option<&str>) -> Result<String, Rejection> {
    let refuse = || {
        Rejection::new(
            415,
            "invalid_request",
            "Send the environment as a multipart form (Content-Type: multipart/form-data)",
        )
    };
    let ct = content_type.ok_or_else(refuse)?;
    let (mime, params) = header_params(ct);
    if !mime.eq_ignore_ascii_case("multipart/form-data") {
        return Err(refuse());
    }
    for (k, v) in params {
        if k.eq_ignore_ascii_case("boundary") {
            // RFC 2046: 1 to 70 characters.
            if v.is_empty() || v.len() > 70 || v.bytes().any(|b| b.is_ascii_control()) {
                return Err(Rejection::new(
                    400,
                    "invalid_request",
                    "The multipart boundary must be 1 to 70 characters",
                ));
            }
            return Ok(v);
        }
    }
    Err(refuse())
}

fn bad(msg: impl Into<String>) -> Rejection {
    Rejection::new(400, "invalid_request", msg)
}

fn invalid(msg: impl Into<String>) -> Rejection {
    Rejection::new(422, "invalid_request", msg)
}

/// The answer to packages over [`PACKAGES_BYTES`] (the document's words).
pub fn too_large() -> Rejection {
    Rejection::new(413, "invalid_request", "Packages can be up to 50 MB in all")
}

/// A buffered reader that finds delimiters across reads.
struct Scan<R> {
    r: R,
    buf: Vec<u8>,
    eof: bool,
}

impl<R: Read> Scan<R> {
    fn fill(&mut self) -> std::io::Result<bool> {
        if self.eof {
            return Ok(false);
        }
        let mut chunk = [0u8; 64 << 10];
        let n = self.r.read(&mut chunk)?;
        if n == 0 {
            self.eof = true;
            return Ok(false);
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(true)
    }

    /// Moves bytes up to `delim` to `out` (at most `max` of them, else `Err(None)`),
    /// consumes the delimiter; `Ok(false)` when the input ends first.
    fn until(
        &mut self,
        delim: &[u8],
        out: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
        max: u64,
    ) -> Result<bool, Option<std::io::Error>> {
        let finder = memchr::memmem::Finder::new(delim);
        let mut moved = 0u64;
        loop {
            if let Some(i) = finder.find(&self.buf) {
                moved += i as u64;
                if moved > max {
                    return Err(None);
                }
                out(&self.buf[..i]).map_err(Some)?;
                self.buf.drain(..i + delim.len());
                return Ok(true);
            }
            // Keep what could be the start of the delimiter.
            let keep = delim.len().saturating_sub(1).min(self.buf.len());
            let give = self.buf.len() - keep;
            moved += give as u64;
            if moved > max {
                return Err(None);
            }
            out(&self.buf[..give]).map_err(Some)?;
            self.buf.drain(..give);
            if !self.fill().map_err(Some)? {
                return Ok(false);
            }
        }
    }

    /// The next `n` bytes, if the input has them.
    fn peek(&mut self, n: usize) -> std::io::Result<Option<&[u8]>> {
        while self.buf.len() < n {
            if !self.fill()? {
                return Ok(None);
            }
        }
        Ok(Some(&self.buf[..n]))
    }
}

/// A header value's first token and its `; key=value` parameters, values quoted or
/// not (a quoted value may hold `;` and `\"`).
fn header_params(v: &str) -> (String, Vec<(String, String)>) {
    let mut out = Vec::new();
    let mut chars = v.chars().peekable();
    let mut first = String::new();
    while let Some(&c) = chars.peek() {
        if c == ';' {
            break;
        }
        first.push(c);
        chars.next();
    }
    while chars.next() == Some(';') {
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' || c == ';' {
                break;
            }
            key.push(c);
            chars.next();
        }
        let mut val = String::new();
        if chars.peek() == Some(&'=') {
            chars.next();
            while chars.peek() == Some(&' ') {
                chars.next();
            }
            if chars.peek() == Some(&'"') {
                chars.next();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        // `\"` is a quote; any other backslash is itself (browsers
                        // send Windows paths as they are).
                        '\\' if chars.peek() == Some(&'"') => {
                            val.push('"');
                            chars.next();
                        }
                        c => val.push(c),
                    }
                }
                // Up to the next parameter.
                while chars.peek().is_some_and(|c| *c != ';') {
                    chars.next();
                }
            } else {
                while let Some(&c) = chars.peek() {
                    if c == ';' {
                        break;
                    }
                    val.push(c);
                    chars.next();
                }
                val = val.trim().to_string();
            }
        }
        out.push((key.trim().to_string(), val));
    }
    (first.trim().to_string(), out)
}

/// One part's head: its field name and, for a file, its file name.
fn part_head(head: &[u8]) -> Result<(String, Option<String>), Rejection> {
    let text = std::str::from_utf8(head).map_err(|_| bad("A form part's head is not UTF-8"))?;
    let mut disposition = None;
    for line in text.split("\r\n") {
        if let Some((k, v)) = line.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-disposition") {
                disposition = Some(v.trim().to_string());
            }
        }
    }
    let d = disposition.ok_or_else(|| bad("A form part has no Content-Disposition"))?;
    let (kind, params) = header_params(&d);
    if !kind.eq_ignore_ascii_case("form-data") {
        return Err(bad("A form part is not form-data"));
    }
    let (mut name, mut filename) = (None, None);
    for (k, v) in params {
        match k.to_ascii_lowercase().as_str() {
            "name" => name = Some(v),
            "filename" => filename = Some(v),
            _ => {}
        }
    }
    let name = name.ok_or_else(|| bad("A form part has no field name"))?;
    Ok((name, filename))
}

/// A package's stored suffix, from the name it was uploaded as.
fn package_ext(file: &str) -> Option<&'static str> {
    let lower = file.to_ascii_lowercase();
    [".whl", ".tar.gz", ".tgz"]
        .into_iter()
        .find(|e| lower.ends_with(e) && lower.len() > e.len())
}

/// Reads the form from `body` (whose boundary is `boundary`), writing each package
/// to `packages` (a directory that exists).
///
/// # Errors
/// 400 for a malformed form, 413 for packages over 50 MB, 422 for a missing or wrong
/// field, 500 when a package could not be written.
pub fn read(body: impl Read, boundary: &str, packages: &Path) -> Result<EnvForm, Rejection> {
    let io = |e: std::io::Error| {
        if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
            return Rejection::new(
                503,
                "unavailable",
                "The server has no room for the upload now; retry later",
            );
        }
        log::error!("eryx environment: reading its upload: {e}");
        Rejection::new(500, "internal_error", "The upload could not be stored")
    };
    let mut s = Scan {
        r: body,
        buf: Vec::new(),
        eof: false,
    };
    let first = format!("--{boundary}");
    let delim = format!("\r\n--{boundary}");
    // The preamble (ignored, bounded) up to the first boundary.
    match s.until(first.as_bytes(), &mut |_| Ok(()), MAX_PART_HEAD as u64) {
        Ok(true) => {}
        Ok(false) | Err(None) => {
            return Err(bad("The body is not a multipart form with its boundary"))
        }
        Err(Some(e)) => return Err(io(e)),
    }
    let (mut name, mut imports, mut files) = (None::<String>, None::<String>, Vec::new());
    let mut package_bytes = 0u64;
    for part in 0.. {
        // After a boundary: `--` ends the form, CRLF starts a part.
        match s.peek(2).map_err(io)? {
            Some(b"--") => break,
            Some(b"\r\n") => {
                s.buf.drain(..2);
            }
            _ => return Err(bad("The multipart form is cut short or malformed")),
        }
        if part >= MAX_PARTS {
            return Err(bad(format!("A form may have at most {MAX_PARTS} parts")));
        }
        let mut head = Vec::new();
        match s.until(
            b"\r\n\r\n",
            &mut |b| {
                head.extend_from_slice(b);
                Ok(())
            },
            MAX_PART_HEAD as u64,
        ) {
            Ok(true) => {}
            Ok(false) => return Err(bad("The multipart form is cut short")),
            Err(None) => return Err(bad("A form part's head is too long")),
            Err(Some(e)) => return Err(io(e)),
        }
        let (field, filename) = part_head(&head)?;
        match field.as_str() {
            "package" => {
                // A file part: with a file name (empty for a file input left empty).
                let Some(filename) = filename else {
                    return Err(invalid(
                        "package is a file field: each part needs a filename",
                    ));
                };
                // As a browser sends it for a file input left empty: skipped.
                let base = filename
                    .rsplit(['/', '\\'])
                    .next()
                    .unwrap_or_default()
                    .to_string();
                let mut sink: Option<std::fs::File> = None;
                let mut ext = None;
                if !base.is_empty() {
                    if base.len() > MAX_FILE_NAME || base.chars().any(char::is_control) {
                        return Err(invalid(format!(
                            "A package's file name must be at most {MAX_FILE_NAME} bytes, without control characters"
                        )));
                    }
                    let e = package_ext(&base).ok_or_else(|| {
                        invalid(format!(
                            "Package {base:?} is not a .whl, .tar.gz or .tgz file"
                        ))
                    })?;
                    if files.len() >= MAX_PACKAGES {
                        return Err(invalid(format!(
                            "An environment may have at most {MAX_PACKAGES} packages"
                        )));
                    }
                    let path = packages.join(format!("{:03}{e}", files.len()));
                    sink = Some(std::fs::File::create(&path).map_err(io)?);
                    ext = Some(e);
                }
                let room = PACKAGES_BYTES - package_bytes;
                let mut n = 0u64;
                let r = s.until(
                    delim.as_bytes(),
                    &mut |b| {
                        n += b.len() as u64;
                        match sink.as_mut() {
                            Some(f) => f.write_all(b),
                            None => Ok(()),
                        }
                    },
                    room,
                );
                match r {
                    Ok(true) => {}
                    Ok(false) => return Err(bad("The multipart form is cut short")),
                    Err(None) => return Err(too_large()),
                    Err(Some(e)) => return Err(io(e)),
                }
                if ext.is_some() {
                    package_bytes += n;
                    files.push(base);
                }
            }
            "name" | "imports" => {
                if filename.is_some() {
                    return Err(invalid(format!("{field} is a text field, not a file")));
                }
                let mut v = Vec::new();
                match s.until(
                    delim.as_bytes(),
                    &mut |b| {
                        v.extend_from_slice(b);
                        Ok(())
                    },
                    MAX_TEXT as u64,
                ) {
                    Ok(true) => {}
                    Ok(false) => return Err(bad("The multipart form is cut short")),
                    Err(None) => return Err(invalid(format!("{field} is over {MAX_TEXT} bytes"))),
                    Err(Some(e)) => return Err(io(e)),
                }
                let v =
                    String::from_utf8(v).map_err(|_| invalid(format!("{field} is not UTF-8")))?;
                let slot = if field == "name" {
                    &mut name
                } else {
                    &mut imports
                };
                if slot.is_some() {
                    return Err(invalid(format!("{field} is given twice")));
                }
                *slot = Some(v);
            }
            other => {
                let shown: String = other.chars().take(64).collect();
                return Err(invalid(format!(
                    "Unknown form field {shown:?}: the fields are name, imports and package"
                )));
            }
        }
    }
    let name = name.ok_or_else(|| invalid("name is required"))?;
    check_name(&name)?;
    let imports = parse_imports(imports.as_deref().unwrap_or_default())?;
    Ok(EnvForm {
        name,
        imports,
        packages: files,
    })
}

/// The document's name rule: up to 63 lowercase letters, digits and dashes; `python`
/// and names starting `python-` are taken.
///
/// # Errors
/// 422 naming the rule.
pub fn check_name(name: &str) -> Result<(), Rejection> {
    let shown: String = name.chars().take(64).collect();
    if name.is_empty()
        || name.len() > 63
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(invalid(format!(
            "name {shown:?} must be 1 to 63 lowercase letters, digits and dashes"
        )));
    }
    if name == super::DEFAULT_ENVIRONMENT || name.starts_with("python-") {
        return Err(invalid(format!(
            "name {shown:?} is taken: python and names starting python- are the server's"
        )));
    }
    Ok(())
}

/// `imports`: module names separated by spaces or commas.
///
/// # Errors
/// 422 for a name that is not a module's, or too many.
pub fn parse_imports(text: &str) -> Result<Vec<String>, Rejection> {
    let mut out: Vec<String> = Vec::new();
    for m in text.split(|c: char| c == ',' || c.is_whitespace()) {
        if m.is_empty() {
            continue;
        }
        if !is_module_name(m) {
            let shown: String = m.chars().take(64).collect();
            return Err(invalid(format!("imports: {shown:?} is not a module name")));
        }
        if is_reserved(m) {
            return Err(invalid(format!(
                "imports: {m:?} is reserved (names starting _isobox_ are the server's own)"
            )));
        }
        if !out.iter().any(|o| o == m) {
            out.push(m.to_string());
        }
    }
    if out.len() > MAX_IMPORTS {
        return Err(invalid(format!(
            "imports may name at most {MAX_IMPORTS} modules"
        )));
    }
    Ok(out)
}

pub use crate::wasm::modname::{is_module_name, is_reserved};

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("isobox-form-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn form(parts: &[(&str, Option<&str>, &[u8])]) -> Vec<u8> {
        let mut b = b"preamble\r\n".to_vec();
        for (name, file, body) in parts {
            b.extend_from_slice(b"--XyZ\r\n");
            match file {
                Some(f) => b.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{f}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
                ),
                None => b.extend_from_slice(
                    format!("Content-Disposition: form-data; name=\"{name}\"\r\n\r\n").as_bytes(),
                ),
            }
            b.extend_from_slice(body);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(b"--XyZ--\r\n");
        b
    }

    #[test]
    fn test_a_form_gives_its_fields_and_package_files_byte_for_byte() {
        let d = dir("ok");
        // A package holding the delimiter's near misses (a client picks a boundary its
        // content does not hold: `CRLF--XyZ` itself never appears).
        let pkg: Vec<u8> = b"PK\x03\x04\r\n--XyY\r\n-\r\n-XyZ--XyZ\n--XyZ\r\n-".repeat(5000);
        let body = form(&[
            ("name", None, b"templating"),
            ("imports", None, b"jinja2, markupsafe  xml.etree"),
            ("package", Some("jinja2-3.1.4-py3-none-any.whl"), &pkg),
            ("package", Some(""), b""),
            ("package", Some("C:\\fakepath\\m.tar.gz"), b"gz"),
        ]);
        // Read in small pieces, as a file read would split it anywhere.
        struct Slow<'a>(&'a [u8]);
        impl Read for Slow<'_> {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                let n = self.0.len().min(out.len()).min(7);
                out[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let f = read(Slow(&body), "XyZ", &d).unwrap();
        assert_eq!(f.name, "templating");
        assert_eq!(f.imports, ["jinja2", "markupsafe", "xml.etree"]);
        assert_eq!(f.packages, ["jinja2-3.1.4-py3-none-any.whl", "m.tar.gz"]);
        assert_eq!(std::fs::read(d.join("000.whl")).unwrap(), pkg);
        assert_eq!(std::fs::read(d.join("001.tar.gz")).unwrap(), b"gz");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn test_bad_forms_get_the_documents_codes() {
        let d = dir("bad");
        let code = |body: &[u8]| {
            read(body, "XyZ", &d)
                .map(|_| 0)
                .unwrap_or_else(|r| r.status)
        };
        assert_eq!(code(&form(&[("imports", None, b"x")])), 422); // no name
        assert_eq!(code(&form(&[("name", None, b"Bad_Name")])), 422);
        assert_eq!(code(&form(&[("name", None, b"python")])), 422);
        assert_eq!(code(&form(&[("name", None, b"python-x")])), 422);
        assert_eq!(
            code(&form(&[("name", None, b"a"), ("name", None, b"b")])),
            422
        );
        assert_eq!(
            code(&form(&[("name", None, b"a"), ("other", None, b"b")])),
            422
        );
        assert_eq!(
            code(&form(&[
                ("name", None, b"a"),
                ("package", Some("x.zip"), b"z")
            ])),
            422
        );
        assert_eq!(
            code(&form(&[
                ("name", None, b"a"),
                ("imports", None, b"os; evil()")
            ])),
            422
        );
        assert_eq!(code(b"no boundary at all"), 400);
        let mut cut = form(&[("name", None, b"a")]);
        cut.truncate(cut.len() - 12);
        assert_eq!(code(&cut), 400);
        // 63 characters is a name, 64 is not.
        assert_eq!(code(&form(&[("name", None, "a".repeat(63).as_bytes())])), 0);
        assert_eq!(
            code(&form(&[("name", None, "a".repeat(64).as_bytes())])),
            422
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn test_packages_at_and_over_fifty_megabytes() {
        let d = dir("cap");
        let at = vec![7u8; PACKAGES_BYTES as usize];
        let body = form(&[("name", None, b"a"), ("package", Some("a.whl"), &at)]);
        assert!(read(&body[..], "XyZ", &d).is_ok());
        let half = vec![7u8; (PACKAGES_BYTES / 2) as usize + 1];
        let body = form(&[
            ("name", None, b"a"),
            ("package", Some("a.whl"), &half),
            ("package", Some("b.whl"), &half),
        ]);
        assert_eq!(read(&body[..], "XyZ", &d).unwrap_err().status, 413);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn test_quoted_parameters_may_hold_semicolons_and_quotes() {
        let (kind, p) =
            header_params(r#"form-data; name="package"; filename="a;b \"c\".whl"; x=1"#);
        assert_eq!(kind, "form-data");
        assert_eq!(
            p,
            [
                ("name".to_string(), "package".to_string()),
                ("filename".to_string(), r#"a;b "c".whl"#.to_string()),
                ("x".to_string(), "1".to_string())
            ]
        );
        let d = dir("quoted");
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\na\r\n--XyZ\r\nContent-Disposition: form-data; name=\"package\"; filename=\"x;y.whl\"\r\n\r\nPK\r\n--XyZ--";
        assert_eq!(read(&body[..], "XyZ", &d).unwrap().packages, ["x;y.whl"]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn test_boundaries_and_module_names() {
        assert_eq!(
            boundary(Some("multipart/form-data; boundary=abc")).unwrap(),
            "abc"
        );
        assert_eq!(
            boundary(Some("Multipart/Form-Data; boundary=\"a b\"")).unwrap(),
            "a b"
        );
        assert_eq!(boundary(Some("application/json")).unwrap_err().status, 415);
        assert_eq!(boundary(None).unwrap_err().status, 415);
        assert_eq!(
            boundary(Some("multipart/form-data")).unwrap_err().status,
            415
        );
        let long = format!("multipart/form-data; boundary={}", "b".repeat(71));
        assert_eq!(boundary(Some(&long)).unwrap_err().status, 400);
        assert!(is_module_name("xml.etree") && is_module_name("_x1"));
        assert!(is_reserved("_isobox_run_paths") && is_reserved("_isobox_x.y"));
        assert!(!is_reserved("isobox") && !is_reserved("x._isobox_y") && !is_reserved("_isobo"));
        assert!(parse_imports("jinja2 _isobox_relocate_site").is_err());
        assert!(!is_module_name("1x") && !is_module_name("a..b") && !is_module_name("a b"));
    }
}
