//! The bare relay the data-path benches (`forwarding`, `secure`) compare
//! anode with: the bench binary re-run as a child process with
//! [`ENV`] set, relaying every datagram that arrives on one UDP socket to
//! the sink from another, `recvmmsg` → `sendmmsg`, [`BATCH`] at a time,
//! with no anode code. A process of its own like the node it stands in
//! for, so both pay the same context switches.

use nix::errno::Errno;
use nix::sys::socket::{ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg, sendmmsg};
use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The environment variable that makes the bench binary a relay to the
/// address it holds.
pub const ENV: &str = "ANODE_BENCH_RELAY_TO";

/// Datagrams per `recvmmsg`/`sendmmsg`.
pub const BATCH: usize = 32;

/// A running relay process; dropping it kills it.
pub struct Relay {
    /// The relay process.
    pub child: Child,
    /// Where it receives.
    pub addr: SocketAddr,
}

impl Relay {
    /// Starts this bench binary as a relay to `to` and waits for the port
    /// it receives on.
    pub fn start(to: SocketAddr) -> Relay {
        use std::io::BufRead;
        let mut child = Command::new(std::env::current_exe().expect("own executable"))
            .env(ENV, to.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the relay");
        let mut line = String::new();
        let out = child.stdout.take().expect("relay stdout");
        std::io::BufReader::new(out).read_line(&mut line).expect("relay port");
        let port: u16 = line.trim().parse().expect("relay port");
        Relay { child, addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)) }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The relay process's main, given the value of [`ENV`] and its two
/// sockets: prints the input's port, then relays until its parent goes
/// (the bench exits or is killed).
pub fn main(to: &str, input: UdpSocket, output: UdpSocket) -> ! {
    let to: SocketAddr = to.parse().expect("ANODE_BENCH_RELAY_TO");
    println!("{}", input.local_addr().expect("addr").port());
    let parent = nix::unistd::getppid();
    std::thread::spawn(move || {
        while nix::unistd::getppid() == parent {
            std::thread::sleep(Duration::from_millis(500));
        }
        std::process::exit(0);
    });
    let mut bufs = vec![vec![0u8; 2048]; BATCH];
    let mut lens = [0usize; BATCH];
    let mut rh = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let mut sh = MultiHeaders::<SockaddrStorage>::preallocate(BATCH, None);
    let addrs = [Some(SockaddrStorage::from(to)); BATCH];
    loop {
        let n = {
            let mut iovs: Vec<[IoSliceMut<'_>; 1]> = bufs.iter_mut().map(|b| [IoSliceMut::new(b)]).collect();
            match recvmmsg(input.as_raw_fd(), &mut rh, iovs.iter_mut(), MsgFlags::MSG_WAITFORONE, None) {
                Ok(msgs) => {
                    let mut n = 0;
                    for (m, l) in msgs.zip(lens.iter_mut()) {
                        *l = m.bytes;
                        n += 1;
                    }
                    n
                }
                Err(Errno::EAGAIN | Errno::EINTR) => 0,
                Err(e) => panic!("recvmmsg: {e}"),
            }
        };
        let iovs: Vec<[IoSlice<'_>; 1]> = bufs[..n].iter().zip(&lens).map(|(b, l)| [IoSlice::new(&b[..*l])]).collect();
        let mut start = 0;
        while start < n {
            let none: [ControlMessage<'_>; 0] = [];
            match sendmmsg(output.as_raw_fd(), &mut sh, iovs[start..].iter(), &addrs[start..n], none, MsgFlags::empty())
                .map(Iterator::count)
            {
                Ok(k) if k > 0 => start += k,
                Err(Errno::EINTR) => {}
                // A full socket buffer or a refused send drops the rest of
                // one datagram, as a router would.
                _ => start += 1,
            }
        }
    }
}
