//! The init protocol: how the daemon and `isobox-init` (the init of a long-lived
//! sandbox, `src/bin/isobox-init/`) talk over the socket pair that is the sandbox's fd 0.
//! Sans-IO and shared by both sides: frames, their bounds, and the decoder.
//!
//! A frame is a 4-byte big-endian length, then that many bytes: a kind byte, a 4-byte
//! big-endian channel, and the payload. The channel says what the frame is about: a
//! call's id for `Call` and `Reply`, a process's id for `Output`, `Input` and `Exit`.
//! Calls and replies carry JSON; output and input carry raw bytes (no base64 on the hot
//! path). The first frame is init's `Hello`, with the protocol version it speaks; the
//! daemon refuses any other version. Either side that receives a frame it cannot parse,
//! a kind it does not know or a length over [`MAX_FRAME_BYTES`] ends the channel: for
//! the daemon that ends this one sandbox, nothing else.

use serde::{Deserialize, Serialize};

/// The protocol version both sides speak (2: background processes, their rings and
/// `Replay`; 6: output frames say where in their stream they are).
pub const VERSION: u32 = 6;
/// Largest frame body (kind, channel and payload).
pub const MAX_FRAME_BYTES: usize = (1 << 20) + 5;
/// Largest payload of one `Output` or `Input` frame (bigger data is split).
pub const MAX_DATA_BYTES: usize = 256 << 10;
/// Output kept per background process and stream for later attachment.
pub const RING_BYTES: usize = 1 << 20;
/// Pieces kept per ring and stream (a program writing a byte at a time, alternating
/// stdout and stderr, would otherwise make a million of them).
pub const RING_CHUNKS: usize = 8192;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// init → daemon, first: `{"version": N, "pid": P}`.
    Hello = 1,
    /// daemon → init: a [`Call`], channel = its id.
    Call = 2,
    /// init → daemon: the answer to call `channel`, JSON ([`Reply`]).
    Reply = 3,
    /// init → daemon: output of process `channel`: one stream byte ([`Stream`]), the
    /// stream's byte offset of the first byte (8 bytes, big-endian), bytes
    /// ([`output_payload`]).
    Output = 4,
    /// init → daemon: process `channel` ended, JSON ([`Exited`]).
    Exit = 5,
    /// daemon → init: bytes for process `channel`'s stdin; empty means end of input.
    Input = 6,
    /// init → daemon: a piece of what a background process's ring held, for the
    /// `Watch` call `channel` (before its reply): as `Output`.
    Replay = 7,
    /// File bytes of open file `channel` (the handle `FsCall::Open` answered): init →
    /// daemon for a read, within the credit `FileMore` gave, an empty one at its end;
    /// daemon → init for a write.
    FileData = 8,
    /// init → daemon: a change seen by watch `channel` (the handle `FsCall::Watch`
    /// answered), JSON ([`WatchEvent`]); an empty one: the watch ended (its directory
    /// is gone).
    FsEvent = 9,
}

impl Kind {
    fn of(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Call,
            3 => Kind::Reply,
            4 => Kind::Output,
            5 => Kind::Exit,
            6 => Kind::Input,
            7 => Kind::Replay,
            8 => Kind::FileData,
            9 => Kind::FsEvent,
            _ => return None,
        })
    }
}

/// Which output stream (the first payload byte of `Output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Stream {
    /// stdout (a terminal's output too).
    Stdout = 1,
    /// stderr.
    Stderr = 2,
}

/// Bytes of an `Output` or `Replay` payload before its data.
pub const OUTPUT_HEAD_BYTES: usize = 9;

/// Writes the head of an `Output` or `Replay` payload into `head`: the stream and the
/// stream's offset of the data's first byte.
pub fn output_head(head: &mut [u8; OUTPUT_HEAD_BYTES], stream: Stream, offset: u64) {
    head[0] = stream as u8;
    head[1..].copy_from_slice(&offset.to_be_bytes());
}

/// An `Output` or `Replay` payload: stream, offset, data.
pub fn output_payload(stream: Stream, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut head = [0u8; OUTPUT_HEAD_BYTES];
    output_head(&mut head, stream, offset);
    let mut v = Vec::with_capacity(OUTPUT_HEAD_BYTES + data.len());
    v.extend_from_slice(&head);
    v.extend_from_slice(data);
    v
}

/// Reads an `Output` or `Replay` payload: (stream, offset of the data's first byte in
/// its stream, data); `None` when it is too short.
pub fn parse_output(payload: &[u8]) -> Option<(Stream, u64, &[u8])> {
    if payload.len() < OUTPUT_HEAD_BYTES {
        return None;
    }
    let stream = if payload[0] == Stream::Stderr as u8 {
        Stream::Stderr
    } else {
        Stream::Stdout
    };
    let offset = u64::from_be_bytes(payload[1..OUTPUT_HEAD_BYTES].try_into().ok()?);
    Some((stream, offset, &payload[OUTPUT_HEAD_BYTES..]))
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it is.
    pub kind: Kind,
    /// What it is about.
    pub channel: u32,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// The channel broke its protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A length over the bound, or too short to hold kind and channel.
    #[error("frame length {0} outside 5..={MAX_FRAME_BYTES}")]
    Length(usize),
    /// A kind byte neither side defines.
    #[error("unknown frame kind {0}")]
    Kind(u8),
}

/// Appends one frame to `out`.
///
/// # Errors
/// [`WireError::Length`] (and nothing appended) when the payload is over the bound:
/// data is split at [`MAX_DATA_BYTES`], but a call built from a request (a command
/// line, its environment) can be too large, and is refused rather than sent.
pub fn encode(
    out: &mut Vec<u8>,
    kind: Kind,
    channel: u32,
    payload: &[u8],
) -> Result<(), WireError> {
    let len = payload.len() + 5;
    if len > MAX_FRAME_BYTES {
        return Err(WireError::Length(len));
    }
    out.extend_from_slice(&(len as u32).to_be_bytes());
    out.push(kind as u8);
    out.extend_from_slice(&channel.to_be_bytes());
    out.extend_from_slice(payload);
    Ok(())
}

/// Appends a JSON frame.
///
/// # Errors
/// As [`encode`]: the value serialises to more than a frame holds.
pub fn encode_json<T: Serialize>(
    out: &mut Vec<u8>,
    kind: Kind,
    channel: u32,
    value: &T,
) -> Result<(), WireError> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
    encode(out, kind, channel, &body)
}

/// Takes frames out of a byte stream. The buffer never holds more than one frame's
/// worth beyond what was decoded.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// INVARIANT: `start <= buf.len()`; bytes before it were decoded already.
    start: usize,
}

impl Decoder {
    /// Appends bytes read from the channel.
    pub fn push(&mut self, data: &[u8]) {
        if self.start > 0 && self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 64 << 10 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes buffered and not decoded.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// The next whole frame, if one is buffered.
    ///
    /// # Errors
    /// [`WireError`] at the first malformed frame (the channel is then done for).
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        let rest = &self.buf[self.start..];
        let Some(head) = rest.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if !(5..=MAX_FRAME_BYTES).contains(&len) {
            return Err(WireError::Length(len));
        }
        // The length is checked before the body arrives: a peer cannot make us buffer
        // more than one bounded frame.
        let Some(body) = rest.get(4..4 + len) else {
            return Ok(None);
        };
        let kind = Kind::of(body[0]).ok_or(WireError::Kind(body[0]))?;
        let channel = u32::from_be_bytes([body[1], body[2], body[3], body[4]]);
        let payload = body[5..].to_vec();
        self.start += 4 + len;
        Ok(Some(Frame {
            kind,
            channel,
            payload,
        }))
    }
}

/// `Hello`'s payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    /// Protocol version init speaks.
    pub version: u32,
    /// init's pid inside the sandbox.
    pub pid: u32,
}

/// A call from the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Call {
    /// Start `cmd` with `/bin/sh -c`; the reply is `{"pid": N}` (init's id of it).
    Spawn {
        /// The command line.
        cmd: String,
        /// Working directory (default: the user's home).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// Variables on top of the sandbox's.
        #[serde(default)]
        env: Vec<(String, String)>,
        /// Keep stdin open for `Input` frames (else it is empty at once).
        #[serde(default)]
        stdin: bool,
        /// A terminal of this size instead of pipes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pty: Option<(u16, u16)>,
        /// A background process: its output goes into a ring (the last
        /// [`RING_BYTES`] per stream), forwarded only while watched, and the ring is
        /// kept after its exit until `Forget`.
        #[serde(default)]
        background: bool,
    },
    /// Start forwarding a background process's output: first what its ring holds, as
    /// `Replay` frames on this call's channel, then the reply (`{"exited": null}`, or
    /// its [`Exited`] if it ended), then its output as it comes.
    Watch {
        /// init's id of the process.
        pid: u32,
    },
    /// Stop forwarding a background process's output (it goes on into the ring).
    Unwatch {
        /// init's id of the process.
        pid: u32,
    },
    /// Drop an ended background process's ring.
    Forget {
        /// init's id of the process.
        pid: u32,
    },
    /// Send a signal to a process's group.
    Signal {
        /// init's id of the process.
        pid: u32,
        /// The signal number.
        signal: i32,
    },
    /// Stop forwarding a process's output (its client is behind): its pipes fill and it
    /// blocks on them, while every other process's frames keep flowing.
    Hold {
        /// init's id of the process.
        pid: u32,
    },
    /// Forward a held process's output again.
    Release {
        /// init's id of the process.
        pid: u32,
    },
    /// Set a terminal's size.
    Resize {
        /// init's id of the process.
        pid: u32,
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// The disk the sandbox's processes see: used and total bytes of `/` and `/tmp`;
    /// the reply is `{"root": [used, total], "tmp": [used, total]}`.
    Disk {},
    /// Set the sandbox's environment for later processes (adds and replaces).
    Env {
        /// Variables.
        env: Vec<(String, String)>,
    },
    /// A file operation, carried out as the sandbox's user with the sandbox's view of
    /// paths (a relative path is relative to the user's home). Answered with
    /// [`Reply::Refused`] when the file system says no.
    Fs(FsCall),
    /// Let open file `handle` (being read) send `bytes` more.
    FileMore {
        /// The handle.
        handle: u32,
        /// Bytes.
        bytes: u64,
    },
    /// Open file `handle` (being written) is complete: put it in place (a rename as
    /// the user); reply [`FsEntry`].
    FileCommit {
        /// The handle.
        handle: u32,
    },
    /// Close open file `handle` (a write is abandoned and its temporary file removed).
    FileClose {
        /// The handle.
        handle: u32,
    },
    /// Stop watch `handle`.
    WatchEnd {
        /// The handle.
        handle: u32,
    },
}

/// A path or name on the wire: Linux's are bytes, not always UTF-8. A JSON string
/// when it is UTF-8 (every path in practice, and what a reader of a frame expects),
/// else an array of its bytes, so that no name is lost or made unreachable.
pub mod path_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Form {
        Text(String),
        Bytes(Vec<u8>),
    }

    /// Serializes `b` as a string, or as its bytes when it is not UTF-8.
    pub fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(b) {
            Ok(t) => t.serialize(s),
            Err(_) => b.serialize(s),
        }
    }

    /// Either form.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        Ok(match Form::deserialize(d)? {
            Form::Text(t) => t.into_bytes(),
            Form::Bytes(b) => b,
        })
    }

    /// The same for an optional one.
    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};

        /// `None` as null.
        pub fn serialize<S: Serializer>(b: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
            match b {
                Some(b) => super::serialize(b, s),
                None => s.serialize_none(),
            }
        }

        /// Null or either form.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
            Ok(Option::<super::Form>::deserialize(d)?.map(|f| match f {
                super::Form::Text(t) => t.into_bytes(),
                super::Form::Bytes(b) => b,
            }))
        }
    }
}

/// A file operation ([`Call::Fs`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fs", rename_all = "snake_case", deny_unknown_fields)]
pub enum FsCall {
    /// One entry, not following a last symlink: reply [`FsEntry`].
    Stat {
        /// The path.
        #[serde(with = "path_bytes")]
        path: Vec<u8>,
    },
    /// A directory's entries to `depth` levels (1 = its own), not following symlinks:
    /// reply `{"entries": [FsEntry], "truncated": bool}` (at most [`FS_LIST_ENTRIES`]).
    List {
        /// The directory.
        #[serde(with = "path_bytes")]
        path: Vec<u8>,
        /// Levels, 1..=5.
        depth: u8,
    },
    /// Make a directory (`parents`: and any missing above it; then an existing
    /// directory is fine).
    Mkdir {
        /// The directory.
        #[serde(with = "path_bytes")]
        path: Vec<u8>,
        /// As `mkdir -p`.
        parents: bool,
    },
    /// Rename `from` to `to` (`overwrite`: replacing what is there).
    Move {
        /// From.
        #[serde(with = "path_bytes")]
        from: Vec<u8>,
        /// To.
        #[serde(with = "path_bytes")]
        to: Vec<u8>,
        /// Replace an existing `to`.
        overwrite: bool,
    },
    /// Open a file: for reading (symlinks followed; a regular file only), the reply
    /// is `{"handle": H, "size": N}` and its bytes come as `FileData` on channel `H`
    /// as `FileMore` allows; for writing, a temporary file beside `path` (missing
    /// directories made), the reply `{"handle": H}`, then `FileData` to it and
    /// `FileCommit` or `FileClose`. The handle is the call's id.
    Open {
        /// The file.
        #[serde(with = "path_bytes")]
        path: Vec<u8>,
        /// For writing.
        write: bool,
    },
    /// Watch a directory (`recursive`: and every directory below it, those made
    /// later too) for changes; the reply is `{"handle": H}` (the call's id), then
    /// `FsEvent` frames on channel `H`.
    Watch {
        /// The directory.
        #[serde(with = "path_bytes")]
        path: Vec<u8>,
        /// Its subdirectories too.
        recursive: bool,
    },
    /// Remove a file, a symlink or a directory (`recursive`: with its contents; else
    /// only an empty one). `files_only`: refuse a directory (`DELETE …/files`).
    Remove {
        /// The path.
        #[serde(with = "path_bytes")]
        path: Vec<u8>,
        /// With its contents.
        recursive: bool,
        /// Refuse a directory.
        files_only: bool,
    },
}

/// A change a watch saw (`FsEvent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchEvent {
    /// `create`, `write`, `remove`, `rename`, or `overflow` (changes were lost).
    #[serde(rename = "type")]
    pub kind: String,
    /// The path it is about (after a rename: the new one; empty for `overflow`).
    #[serde(with = "path_bytes")]
    pub path: Vec<u8>,
    /// A rename's old path.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "path_bytes::option"
    )]
    pub from: Option<Vec<u8>>,
    /// It is about a directory.
    #[serde(default)]
    pub is_dir: bool,
}

/// Directories one watch may watch at once.
pub const MAX_WATCH_DIRS: usize = 4096;

/// Most entries one `FsCall::List` answers (the rest: `truncated`).
pub const FS_LIST_ENTRIES: usize = 5000;

/// One file system entry as init reports it; the face shapes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsEntry {
    /// Its absolute path.
    #[serde(with = "path_bytes")]
    pub path: Vec<u8>,
    /// `file`, `dir`, `symlink` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Bytes.
    pub size: u64,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Last modification, Unix milliseconds.
    pub mtime_ms: i64,
    /// A symlink's target.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "path_bytes::option"
    )]
    pub target: Option<Vec<u8>>,
}

/// A reply: `{"ok": …}` or `{"error": "…"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    /// The call's result.
    Ok(serde_json::Value),
    /// Why it failed, in words for the client.
    Error(String),
    /// A file operation the file system refused: the status the client gets (one of
    /// 400, 403, 404, 409, 413; the daemon maps anything else to 502) and why.
    Refused {
        /// HTTP status.
        status: u16,
        /// In words for the client, naming the path.
        message: String,
    },
}

/// `Exit`'s payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exited {
    /// The exit code, or 128 + the signal that ended it.
    pub code: i32,
    /// The signal that ended it, if one did.
    #[serde(default)]
    pub signal: Option<i32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_output_payloads_carry_stream_and_offset() {
        let p = output_payload(Stream::Stderr, (1 << 40) + 7, b"hi");
        assert_eq!(p.len(), OUTPUT_HEAD_BYTES + 2);
        assert_eq!(
            parse_output(&p),
            Some((Stream::Stderr, (1 << 40) + 7, &b"hi"[..]))
        );
        let p = output_payload(Stream::Stdout, 0, b"");
        assert_eq!(parse_output(&p), Some((Stream::Stdout, 0, &b""[..])));
        assert_eq!(parse_output(&p[..OUTPUT_HEAD_BYTES - 1]), None);
    }

    #[test]
    fn test_frames_round_trip_in_any_pieces() {
        let mut bytes = Vec::new();
        encode_json(
            &mut bytes,
            Kind::Hello,
            0,
            &Hello {
                version: VERSION,
                pid: 1,
            },
        )
        .unwrap();
        encode(&mut bytes, Kind::Output, 7, &[1, b'h', b'i']).unwrap();
        encode(&mut bytes, Kind::Input, 7, &[]).unwrap();
        // Over the bound: refused, nothing appended.
        let before = bytes.len();
        assert_eq!(
            encode(&mut bytes, Kind::Call, 1, &vec![0; MAX_FRAME_BYTES - 4]),
            Err(WireError::Length(MAX_FRAME_BYTES + 1))
        );
        assert!(encode(
            &mut Vec::new(),
            Kind::Call,
            1,
            &vec![0; MAX_FRAME_BYTES - 5]
        )
        .is_ok());
        assert_eq!(bytes.len(), before);
        for cut in 0..=bytes.len() {
            let mut d = Decoder::default();
            d.push(&bytes[..cut]);
            let mut got = Vec::new();
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            d.push(&bytes[cut..]);
            while let Some(f) = d.next_frame().unwrap() {
                got.push(f);
            }
            assert_eq!(got.len(), 3, "cut at {cut}");
            assert_eq!(got[1].kind, Kind::Output);
            assert_eq!(
                (got[1].channel, got[1].payload.as_slice()),
                (7, &[1, b'h', b'i'][..])
            );
            assert_eq!((got[2].kind, got[2].payload.len()), (Kind::Input, 0));
            let h: Hello = serde_json::from_slice(&got[0].payload).unwrap();
            assert_eq!(h.version, VERSION);
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn test_lengths_at_below_and_above_the_bound() {
        for (len, ok) in [
            (4usize, false),
            (5, true),
            (MAX_FRAME_BYTES, true),
            (MAX_FRAME_BYTES + 1, false),
        ] {
            let mut d = Decoder::default();
            d.push(&(len as u32).to_be_bytes());
            // The length alone decides: nothing of the body has come yet.
            match d.next_frame() {
                Ok(None) => assert!(ok, "{len}"),
                Err(WireError::Length(n)) => assert!(!ok && n == len, "{len}"),
                other => panic!("{len}: {other:?}"),
            }
        }
        let mut d = Decoder::default();
        d.push(&[0, 0, 0, 5, 200, 0, 0, 0, 0]);
        assert_eq!(d.next_frame(), Err(WireError::Kind(200)));
    }

    #[test]
    fn test_calls_are_strict_json() {
        let c: Call =
            serde_json::from_str(r#"{"op":"spawn","cmd":"echo hi","stdin":true}"#).unwrap();
        assert!(matches!(
            c,
            Call::Spawn {
                stdin: true,
                pty: None,
                ..
            }
        ));
        assert!(serde_json::from_str::<Call>(r#"{"op":"spawn","cmd":"x","bogus":1}"#).is_err());
        assert!(serde_json::from_str::<Call>(r#"{"op":"format_disk"}"#).is_err());
        let r: Reply = serde_json::from_str(r#"{"error":"no such process"}"#).unwrap();
        assert_eq!(r, Reply::Error("no such process".into()));
    }
}
