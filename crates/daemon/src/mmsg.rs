//! `recvmmsg` with a fresh control-message buffer per message: the one
//! system call of the daemon that needs `unsafe` (the crate's only module
//! allowed it).
//!
//! Why not nix's `recvmmsg`: its preallocated headers are filled once, and
//! the kernel writes each message's control length back (0 for a datagram
//! that carried no control message); nix 0.31 never restores it, so after
//! one plain datagram a slot could no longer receive the `UDP_GRO` segment
//! size, and a GRO run in that slot would arrive with `MSG_CTRUNC` and no
//! way to cut it. Making nix's headers afresh per call works but allocates
//! on the data path. Here every header is rebuilt on the stack before each
//! call, from buffers this struct owns, so nothing is allocated.
//!
//! Safety argument, in one place: every pointer handed to the kernel points
//! into `bufs` (borrowed mutably for the call), `self.names` or
//! `self.cmsgs` (owned by `self`, borrowed mutably for the call), or the
//! stack arrays of this function, and each length is the length of what it
//! points to. After the call, only the first `n` headers the kernel
//! reported are read, their control messages through `CMSG_FIRSTHDR` and
//! `CMSG_NXTHDR`, which stay within `msg_controllen` as the kernel set it
//! (at most the buffer's length), and the `UDP_GRO` value is read unaligned.
#![allow(unsafe_code)]

use crate::BATCH;
use nix::errno::Errno;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, BorrowedFd};

/// Room for the control messages one datagram may carry (`UDP_GRO` needs
/// `CMSG_SPACE(4)` = 24 bytes).
const CMSG_CAP: usize = 64;

/// A control-message buffer aligned for `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_CAP]);

/// One received message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Received {
    /// Bytes in the buffer.
    pub(crate) len: usize,
    /// GRO segment size (0: the message is one datagram).
    pub(crate) seg: usize,
    /// The sender, when it is IPv4.
    pub(crate) from: Option<SocketAddr>,
}

/// The per-message buffers `recvmmsg` writes besides the data.
pub(crate) struct RecvMmsg {
    names: Box<[libc::sockaddr_in; BATCH]>,
    cmsgs: Box<[CmsgBuf; BATCH]>,
}

impl std::fmt::Debug for RecvMmsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecvMmsg")
    }
}

impl RecvMmsg {
    /// Buffers for [`BATCH`] messages.
    pub(crate) fn new() -> RecvMmsg {
        // SAFETY: sockaddr_in is plain old data; all zeroes is valid.
        let zero: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        RecvMmsg { names: Box::new([zero; BATCH]), cmsgs: Box::new([CmsgBuf([0; CMSG_CAP]); BATCH]) }
    }

    /// Receives up to [`BATCH`] messages without waiting, message `i` into
    /// `bufs[i]`, what it was into `out[i]`; returns how many.
    pub(crate) fn recv(
        &mut self,
        fd: BorrowedFd<'_>,
        bufs: &mut [Vec<u8>; BATCH],
        out: &mut [Received; BATCH],
    ) -> Result<usize, Errno> {
        // SAFETY: iovec and mmsghdr are plain old data; all zeroes (null
        // pointers, zero lengths) is valid, and every field the kernel
        // reads is set below.
        let mut iovs: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for (((h, iov), buf), (name, cmsg)) in hdrs
            .iter_mut()
            .zip(iovs.iter_mut())
            .zip(bufs.iter_mut())
            .zip(self.names.iter_mut().zip(self.cmsgs.iter_mut()))
        {
            iov.iov_base = buf.as_mut_ptr().cast();
            iov.iov_len = buf.len();
            h.msg_hdr.msg_name = (name as *mut libc::sockaddr_in).cast();
            h.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
            h.msg_hdr.msg_iov = iov;
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = cmsg.0.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = CMSG_CAP;
        }
        // SAFETY: see the module documentation; `hdrs` holds BATCH
        // initialised headers whose pointers are valid for the call.
        let n = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                BATCH as libc::c_uint,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let n = usize::try_from(n).map_err(|_| Errno::last())?.min(BATCH);
        for ((h, o), name) in hdrs.iter().zip(out.iter_mut()).zip(self.names.iter()).take(n) {
            o.len = h.msg_len as usize;
            o.seg = 0;
            // SAFETY: the header was filled by the kernel; CMSG_FIRSTHDR and
            // CMSG_NXTHDR return null or a header within msg_controllen.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                        let v: libc::c_int = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                        o.seg = usize::try_from(v).unwrap_or(0);
                    }
                    c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                }
            }
            o.from = (h.msg_hdr.msg_namelen as usize >= std::mem::size_of::<libc::sockaddr_in>()
                && name.sin_family == libc::AF_INET as libc::sa_family_t)
                .then(|| {
                    SocketAddr::V4(SocketAddrV4::new(
                        Ipv4Addr::from(u32::from_be(name.sin_addr.s_addr)),
                        u16::from_be(name.sin_port),
                    ))
                });
        }
        Ok(n)
    }
}

/// For tests: `SO_NO_CHECK` on `fd`, with which the kernel refuses every
/// GSO send (`EINVAL`), to exercise the fallback.
#[cfg(test)]
pub(crate) fn set_no_check(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let one: libc::c_int = 1;
    // SAFETY: a valid fd and a pointer to a c_int with its length.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}
