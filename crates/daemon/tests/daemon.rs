//! The daemon's data path allocates nothing once warm: a real daemon in a
//! thread forwards SNAP pings and plain packets between two loopback UDP
//! sockets, through recvmmsg, the core and sendmmsg, while dhat counts every
//! heap allocation of this process.
//!
//! dhat's testing mode counts every allocation of the test binary, so this
//! file holds exactly one test.
use anode_daemon::{Daemon, Options};
use anode_node::anep;
use anode_node::config::NodeConfig;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

const PING: &str = include_str!("../../../examples/snap/ping.s");

/// Sends `n` copies of each packet from `a` to `to`, a few at a time, and
/// waits until `c` received them all (or the time runs out); returns how
/// many arrived. Allocates nothing.
fn pump(a: &UdpSocket, to: SocketAddr, c: &UdpSocket, packets: &[&[u8]], n: usize, buf: &mut [u8]) -> usize {
    let want = n * packets.len();
    let (mut sent, mut got) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while got < want && Instant::now() < deadline {
        // Keep at most 64 in flight so nothing overflows a socket buffer.
        while sent < want && sent - got < 64 {
            a.send_to(packets[sent % packets.len()], to).expect("send");
            sent += 1;
        }
        match c.recv_from(buf) {
            Ok(_) => got += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
                // Lost or late: resend to keep the window moving.
                sent = got;
            }
            Err(e) => panic!("recv: {e}"),
        }
    }
    got
}

#[test]
fn warm_daemon_data_path_does_not_allocate() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let a = UdpSocket::bind("127.0.0.1:0").expect("bind a");
    let c = UdpSocket::bind("127.0.0.1:0").expect("bind c");
    c.set_read_timeout(Some(Duration::from_millis(200))).expect("timeout");
    // Two free ports (config validation rejects two listens on port 0),
    // below the ephemeral range so that no other socket takes one first.
    let free: Vec<u16> = anode_daemon::ports::reserve_loopback(2)
        .expect("free ports")
        .iter()
        .map(|s| s.local_addr().expect("addr").port())
        .collect();
    let run_dir = std::env::temp_dir().join(format!("anode-noalloc-{}", std::process::id()));
    let cfg = NodeConfig::from_toml(&format!(
        "address = \"10.0.0.2\"\nrun_dir = \"{}\"\n\
         [[interface]]\nname = \"west\"\nlisten = \"127.0.0.1:{}\"\n\
         neighbors = [{{ address = \"10.0.0.1\", endpoint = \"{}\" }}]\n\
         [[interface]]\nname = \"east\"\nlisten = \"127.0.0.1:{}\"\n\
         neighbors = [{{ address = \"10.0.0.3\", endpoint = \"{}\" }}]\n",
        run_dir.display(),
        free[0],
        a.local_addr().expect("a"),
        free[1],
        c.local_addr().expect("c"),
    ))
    .expect("config");

    // The daemon holds raw mmsghdr buffers (not Send): build it in its thread.
    let (tx, rx) = std::sync::mpsc::channel();
    let th = std::thread::spawn(move || {
        let mut d = Daemon::bind(&cfg, None, &Options::default()).expect("daemon");
        tx.send((d.listen_addrs()[0], d.stopper())).expect("send addr");
        d.run().expect("run");
        d.node().counters.clone()
    });
    let (west, stopper) = rx.recv().expect("listen address");

    let ping = anode_snap::asm::assemble(PING).expect("ping").to_bytes().expect("emit");
    let ping = anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_SNAP, &ping);
    let mut plain = vec![0u8; anep::HEADER_LEN + anode_node::plain::HEADER_LEN + 32];
    let plen = plain.len() - anep::HEADER_LEN;
    anep::write_header(&mut plain, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_PLAIN, plen);
    anode_node::plain::Repr {
        dst: "10.0.0.3".parse().expect("addr"),
        src: "10.0.0.1".parse().expect("addr"),
        ttl: 8,
        port: 9,
    }
    .emit(&mut plain[anep::HEADER_LEN..])
    .expect("header room");
    let packets: [&[u8]; 2] = [&ping, &plain];
    let mut buf = vec![0u8; 4096];

    // Warm up: outboxes and socket paths reach their working size.
    assert_eq!(pump(&a, west, &c, &packets, 500, &mut buf), 1000);
    let before = dhat::HeapStats::get();
    let n = pump(&a, west, &c, &packets, 2000, &mut buf);
    let after = dhat::HeapStats::get();
    assert_eq!(n, 4000, "all packets forwarded");
    assert_eq!(
        after.total_blocks - before.total_blocks,
        0,
        "the warm data path allocated {} blocks ({} bytes) for {n} packets",
        after.total_blocks - before.total_blocks,
        after.total_bytes - before.total_bytes
    );

    stopper.stop();
    let counters = th.join().expect("daemon thread");
    assert!(counters.snap_forwarded >= 2500 && counters.plain_forwarded >= 2500, "{counters:?}");
    assert!(!run_dir.join(anode_daemon::APP_SOCKET).exists(), "sockets removed");
    let _ = std::fs::remove_dir(&run_dir);
}
