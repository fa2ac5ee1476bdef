//! Netlink sockets and network namespaces: the raw calls behind `netfilter`.
//!
//! Message encoding is safe code in `netfilter::nl`; this file only opens, binds,
//! sends, receives, and moves threads between network namespaces.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// `NETLINK_ROUTE`: links, addresses, routes.
pub const NETLINK_ROUTE: i32 = libc::NETLINK_ROUTE;
/// `NETLINK_NETFILTER`: nftables.
pub const NETLINK_NETFILTER: i32 = libc::NETLINK_NETFILTER;

/// A bound netlink socket (kernel-assigned port id), close-on-exec.
#[derive(Debug)]
pub struct NlSocket {
    fd: OwnedFd,
}

impl NlSocket {
    /// Opens and binds a netlink socket of `protocol` in the calling thread's network
    /// namespace, with a receive timeout so a kernel that never answers cannot hang us.
    ///
    /// # Errors
    /// `socket`, `bind` or `setsockopt` failures.
    pub fn open(protocol: i32, timeout: Duration) -> io::Result<NlSocket> {
        let raw = crate::syscall!(socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol
        ))?;
        // SAFETY: the kernel just returned this fd; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero sockaddr_nl is valid (pid 0 = kernel assigns, no groups).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        crate::syscall!(bind(
            fd.as_raw_fd(),
            std::ptr::from_ref(&addr).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t
        ))?;
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: libc::suseconds_t::from(timeout.subsec_micros()),
        };
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)?;
        // Dumps of a large ruleset need room; ENOBUFS would lose messages.
        let rcvbuf: libc::c_int = 1 << 20;
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &rcvbuf)?;
        let on: libc::c_int = 1;
        // Extended acks carry the kernel's error string; best effort.
        let _ = setsockopt(&fd, libc::SOL_NETLINK, libc::NETLINK_EXT_ACK, &on);
        Ok(NlSocket { fd })
    }

    /// Joins multicast `group` (e.g. `NFNLGRP_NFTABLES`) to hear about changes.
    ///
    /// # Errors
    /// `setsockopt` failures.
    pub fn add_membership(&self, group: u32) -> io::Result<()> {
        setsockopt(
            &self.fd,
            libc::SOL_NETLINK,
            libc::NETLINK_ADD_MEMBERSHIP,
            &group,
        )
    }

    /// Sends one datagram to the kernel.
    ///
    /// # Errors
    /// `sendto` failures, or a short send.
    pub fn send(&self, buf: &[u8]) -> io::Result<()> {
        // SAFETY: an all-zero sockaddr_nl addresses the kernel (pid 0).
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        let n = crate::syscall!(sendto(
            self.fd.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            0,
            std::ptr::from_ref(&addr).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t
        ))?;
        if usize::try_from(n).ok() != Some(buf.len()) {
            return Err(io::Error::other("short netlink send"));
        }
        Ok(())
    }

    /// Receives one datagram (several messages) into `buf`; `Ok(0)` never happens on
    /// netlink. Times out with `WouldBlock` after the socket's timeout.
    ///
    /// # Errors
    /// `recv` failures (`ENOBUFS` when the kernel dropped messages).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let n = crate::syscall!(recv(
            self.fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0
        ))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// The underlying fd (for registering with the event loop).
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }
}

fn setsockopt<T>(fd: &OwnedFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    crate::syscall!(setsockopt(
        fd.as_raw_fd(),
        level,
        name,
        std::ptr::from_ref(value).cast(),
        std::mem::size_of::<T>() as libc::socklen_t
    ))?;
    Ok(())
}

/// Opens the calling thread's network namespace (`/proc/thread-self/ns/net`).
///
/// # Errors
/// `open` failures.
pub fn open_thread_netns() -> io::Result<OwnedFd> {
    open_path(c"/proc/thread-self/ns/net")
}

/// Opens a namespace file (e.g. a bind-mounted netns).
///
/// # Errors
/// `open` failures.
pub fn open_netns(path: &Path) -> io::Result<OwnedFd> {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    open_path(&c)
}

fn open_path(path: &CStr) -> io::Result<OwnedFd> {
    let raw = crate::syscall!(open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC))?;
    // SAFETY: the kernel just returned this fd; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Moves the calling thread into a fresh network namespace.
///
/// # Errors
/// `unshare` failures (`EPERM` without `CAP_SYS_ADMIN`).
pub fn unshare_netns() -> io::Result<()> {
    crate::syscall!(unshare(libc::CLONE_NEWNET))?;
    Ok(())
}

/// Moves the calling thread into the network namespace `ns`.
///
/// # Errors
/// `setns` failures.
pub fn setns_net(ns: &OwnedFd) -> io::Result<()> {
    crate::syscall!(setns(ns.as_raw_fd(), libc::CLONE_NEWNET))?;
    Ok(())
}

/// Bind-mounts `src` onto `dst` (both must exist).
///
/// # Errors
/// `mount` failures.
pub fn bind_mount(src: &Path, dst: &Path) -> io::Result<()> {
    let s = cpath(src)?;
    let d = cpath(dst)?;
    crate::syscall!(mount(
        s.as_ptr(),
        d.as_ptr(),
        std::ptr::null(),
        libc::MS_BIND,
        std::ptr::null()
    ))?;
    Ok(())
}

/// Marks the mount at `path` shared (`MS_SHARED`), so unmounts below it reach the
/// copies in namespaces that are its slaves.
///
/// # Errors
/// `mount` failures (`EINVAL` when `path` is not a mount point).
pub fn make_shared(path: &Path) -> io::Result<()> {
    let p = cpath(path)?;
    crate::syscall!(mount(
        std::ptr::null(),
        p.as_ptr(),
        std::ptr::null(),
        libc::MS_SHARED,
        std::ptr::null()
    ))?;
    Ok(())
}

fn cpath(path: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// For a `runsc` child that sets up a netstack from a network namespace: a private
/// mount namespace, a slave of the host's (so unmounts of shared mounts reach it), with
/// an empty read-only tmpfs over `/proc/sys/net`.
///
/// Debian 12's own runsc (2022; not re-checked on the pinned 2024 one) refuses a
/// namespace in which `/proc/sys/net/core/rmem_default` exists, taking it for the host's; since Linux 6.x that file exists in every network
/// namespace. `/proc/sys/net` itself is one directory shared by all namespaces, so
/// covering it hides the file in whichever namespace runsc has joined.
///
/// Async-signal-safe: meant for `pre_exec` (syscalls on static strings only).
///
/// # Errors
/// `unshare` or `mount` failures.
pub fn hide_proc_sys_net_in_child() -> io::Result<()> {
    crate::syscall!(unshare(libc::CLONE_NEWNS))?;
    crate::syscall!(mount(
        std::ptr::null(),
        c"/".as_ptr(),
        std::ptr::null(),
        libc::MS_REC | libc::MS_SLAVE,
        std::ptr::null()
    ))?;
    crate::syscall!(mount(
        c"tmpfs".as_ptr(),
        c"/proc/sys/net".as_ptr(),
        c"tmpfs".as_ptr(),
        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        c"size=4k,mode=555".as_ptr().cast()
    ))?;
    Ok(())
}
