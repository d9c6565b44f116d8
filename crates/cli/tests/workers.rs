//! Data path workers (issue 19) on a real daemon: with `--workers 2`, one
//! security association's datagrams arrive from many source ports, so the
//! kernel's SO_REUSEPORT hash spreads them over both workers, reordered and
//! each sent twice; the single replay window under the node's lock must
//! pass each exactly once, and the counters must add up.
#![allow(clippy::unwrap_used)]

mod common;

use anode_node::{anep, plain};
use anode_sec::sa::{AH_LEN, OVERHEAD};
use anode_sec::{Identity, Links, LinksConfig, Mode, Output as SecOut, PeerConfig};
use common::{ANODE, Scratch, eventually, free_ports, status};
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn id(n: u8) -> Identity {
    Identity::from_seed(&[n; 32])
}

/// The harness's end of one link to b: its security layer.
struct End {
    links: Links,
    t0: Instant,
}

impl End {
    fn new(who: u8, b_ep: SocketAddr, t0: Instant) -> End {
        let unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        let cfg = LinksConfig {
            peers: vec![PeerConfig { key: id(2).public(), endpoint: b_ep, mode: Mode::Encrypt }],
            unix_offset_ms: unix - t0.elapsed().as_millis() as u64,
            ..LinksConfig::default()
        };
        End { links: Links::new(id(who), cfg, 0).unwrap(), t0 }
    }

    fn now(&self) -> u64 {
        self.t0.elapsed().as_millis() as u64
    }

    /// Runs the handshake on `sock` until this end is up.
    fn handshake(&mut self, sock: &UdpSocket) {
        sock.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut buf = vec![0u8; 4096];
        while !self.links.is_up(0) {
            assert!(Instant::now() < deadline, "no SA with b");
            let mut out = Vec::new();
            self.links.poll(self.now(), &mut out);
            if let Ok((n, from)) = sock.recv_from(&mut buf) {
                let p = anep::Packet::new_checked(&buf[..n]).unwrap();
                if p.type_id() == anep::TYPE_HANDSHAKE {
                    let start = p.payload_start();
                    let _ = self.links.handle_handshake(from, &buf[start..n], self.now(), &mut out);
                }
            }
            for o in out {
                if let SecOut::Handshake { to, msg, .. } = o {
                    sock.send_to(&anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_HANDSHAKE, &msg), to).unwrap();
                }
            }
        }
    }

    /// `inner` sealed for b.
    fn seal(&mut self, inner: &[u8]) -> Vec<u8> {
        let n = inner.len();
        let mut buf = vec![0u8; 8 + OVERHEAD + n];
        buf[8 + AH_LEN..8 + AH_LEN + n].copy_from_slice(inner);
        anep::write_header(&mut buf, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_ESP, AH_LEN + n + 16);
        let now = self.now();
        let len = self.links.seal(0, &mut buf, 8, n, now).unwrap();
        buf.truncate(len);
        buf
    }

    /// The plain packet inside a datagram from b, if it opens.
    fn open(&mut self, d: &mut [u8]) -> Option<Vec<u8>> {
        let p = anep::Packet::new_checked(&*d).ok()?;
        let (ty, start) = (p.type_id(), p.payload_start());
        if ty != anep::TYPE_ESP {
            return None;
        }
        let now = self.now();
        let o = self.links.open(d, start, true, now).ok()?;
        Some(d[o.inner].to_vec())
    }
}

fn write_key(dir: &Path, name: &str, who: &Identity) -> String {
    let p = dir.join(format!("{name}.key"));
    std::fs::write(&p, who.to_file_text().as_bytes()).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.display().to_string()
}

/// b with two workers between the harness's a (west) and c (east), its
/// SAs with both up; `east` is appended to the east interface's table.
struct Bed {
    _b: Kill,
    run: std::path::PathBuf,
    /// a's socket: kept open, b's west neighbour.
    _sa: UdpSocket,
    sc: UdpSocket,
    a: End,
    c: End,
    b_west: SocketAddr,
}

impl Bed {
    fn up(s: &Scratch, east: &str) -> Bed {
        let t0 = Instant::now();
        let (sa, sc) = (UdpSocket::bind("127.0.0.1:0").unwrap(), UdpSocket::bind("127.0.0.1:0").unwrap());
        // c reads only after everything was sent: room for all of it.
        nix::sys::socket::setsockopt(&sc, nix::sys::socket::sockopt::RcvBuf, &(4 << 20)).unwrap();
        let ports = free_ports(2);
        let (b_west, b_east): (SocketAddr, SocketAddr) =
            ((Ipv4Addr::LOCALHOST, ports[0]).into(), (Ipv4Addr::LOCALHOST, ports[1]).into());
        let key = write_key(&s.0, "b", &id(2));
        let cfg = format!(
            "address = \"10.0.0.2\"\nrun_dir = \"{run}\"\n\
             [[interface]]\nname = \"west\"\nlisten = \"{b_west}\"\n\
             neighbors = [{{ address = \"10.0.0.1\", endpoint = \"{a}\", key = \"{ka}\" }}]\n\
             [[interface]]\nname = \"east\"\nlisten = \"{b_east}\"\n{east}\
             neighbors = [{{ address = \"10.0.0.3\", endpoint = \"{c}\", key = \"{kc}\" }}]\n\
             [security]\nkey = \"{key}\"\nmode = \"encrypt\"\n",
            run = s.0.join("run").display(),
            a = sa.local_addr().unwrap(),
            c = sc.local_addr().unwrap(),
            ka = id(1).public(),
            kc = id(3).public(),
        );
        std::fs::write(s.0.join("b.toml"), cfg).unwrap();
        let log = std::fs::File::create(s.0.join("b.log")).unwrap();
        let b = Kill(
            Command::new(ANODE)
                .args(["node", "--workers", "2", "--config"])
                .arg(s.0.join("b.toml"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let run = s.0.join("run");
        assert!(eventually(10.0, || run.join("control.sock").exists()), "b did not start");
        assert_eq!(status(&run)["io"]["workers"], 2);
        let (mut a, mut c) = (End::new(1, b_west, t0), End::new(3, b_east, t0));
        a.handshake(&sa);
        c.handshake(&sc);
        Bed { _b: b, run, _sa: sa, sc, a, c, b_west }
    }

    /// `n` plain packets for c of `len` bytes (after the plain header),
    /// numbered and sealed by a in order.
    fn sealed(&mut self, n: usize, len: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| {
                let mut p = vec![0u8; plain::HEADER_LEN + len.max(4)];
                plain::Repr { dst: Ipv4Addr::new(10, 0, 0, 3), src: Ipv4Addr::new(10, 0, 0, 1), ttl: 9, port: 7 }
                    .emit(&mut p[..plain::HEADER_LEN])
                    .unwrap();
                p[plain::HEADER_LEN..plain::HEADER_LEN + 4].copy_from_slice(&(i as u32).to_be_bytes());
                self.a.seal(&anep::frame(anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_PLAIN, &p))
            })
            .collect()
    }

    /// What c receives until `quiet` passes without a datagram: each
    /// packet's number in arrival order, with the arrival time of the first
    /// and the last (of datagrams that opened).
    fn receive(&mut self, quiet: Duration) -> (Vec<u32>, Option<(Instant, Instant)>) {
        let mut got = Vec::new();
        let mut span: Option<(Instant, Instant)> = None;
        self.sc.set_read_timeout(Some(quiet)).unwrap();
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = self.sc.recv(&mut buf) {
            let at = Instant::now();
            if let Some(inner) = self.c.open(&mut buf[..n]) {
                let body = anep::HEADER_LEN + plain::HEADER_LEN;
                got.push(u32::from_be_bytes(inner[body..body + 4].try_into().unwrap()));
                span = Some((span.map_or(at, |s| s.0), at));
            }
        }
        (got, span)
    }
}

#[test]
fn two_workers_pass_each_datagram_of_one_sa_once_however_it_is_spread_reordered_and_replayed() {
    let s = Scratch::new("workers", "replay");
    let mut bed = Bed::up(&s, "");

    // 400 plain packets for c, sealed in order, sent reordered (odd ones
    // first, each half backwards) from 16 source ports, then every one
    // again from another port.
    const N: usize = 400;
    let sealed = bed.sealed(N, 64 - plain::HEADER_LEN);
    let srcs: Vec<UdpSocket> = (0..16).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    let mut order: Vec<usize> = (1..N).step_by(2).rev().collect();
    order.extend((0..N).step_by(2).rev());
    let mut sent = 0;
    for round in 0..2 {
        for (k, &i) in order.iter().enumerate() {
            srcs[(k + round * 7) % srcs.len()].send_to(&sealed[i], bed.b_west).unwrap();
            sent += 1;
            if sent % 32 == 0 {
                // Paced so no socket buffer overflows: every loss here must
                // be the replay window's doing.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    // c receives each packet once.
    let (got, _) = bed.receive(Duration::from_millis(300));
    let mut seen: BTreeMap<u32, usize> = BTreeMap::new();
    for seq in got {
        *seen.entry(seq).or_default() += 1;
    }
    assert_eq!(seen.len(), N, "every packet reached c");
    assert!(seen.values().all(|n| *n == 1), "no packet reached c twice");

    let st = status(&bed.run);
    let w = st["io"]["worker_datagrams"].as_array().unwrap();
    assert_eq!(w.len(), 2);
    let per: Vec<u64> = w.iter().map(|x| x.as_u64().unwrap()).collect();
    assert!(per.iter().all(|n| *n > 0), "the kernel spread the sources over both workers: {per:?}");
    assert!(per.iter().sum::<u64>() >= 2 * N as u64, "{per:?}");
    let replays = st["drops"]["auth_replay"].as_u64().unwrap() + st["drops"]["auth_beyond_window"].as_u64().unwrap();
    assert_eq!(replays, N as u64, "each second copy was refused once: {}", st["drops"]);
    assert_eq!(st["packets"]["plain_forwarded"].as_u64().unwrap(), N as u64, "{}", st["packets"]);
}

#[test]
fn two_workers_share_one_paced_link_whose_order_and_rate_are_one_schedulers() {
    // East is paced at 2 Mbit/s. Both workers forward a's datagrams (16
    // source ports spread them) and queue them on the one link; the event
    // loop releases and seals them. c's replay window refuses a datagram
    // sealed out of the order it is sent in only when it falls behind the
    // window, so the check that matters is that c opens every one, and that
    // the link never ran faster than its rate.
    const RATE: u64 = 2_000_000;
    let s = Scratch::new("workers", "paced");
    let mut bed = Bed::up(&s, &format!("rate_bps = {RATE}\n"));
    const N: usize = 300;
    let sealed = bed.sealed(N, 200);
    let srcs: Vec<UdpSocket> = (0..16).map(|_| UdpSocket::bind("127.0.0.1:0").unwrap()).collect();
    for (i, d) in sealed.iter().enumerate() {
        srcs[i % srcs.len()].send_to(d, bed.b_west).unwrap();
        if i % 32 == 31 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // 300 datagrams of about 260 bytes at 2 Mbit/s take about 0.3 s.
    let (got, span) = bed.receive(Duration::from_millis(500));
    let st = status(&bed.run);
    let per: Vec<u64> = st["io"]["worker_datagrams"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert!(per.iter().all(|n| *n > 0), "the kernel spread the sources over both workers: {per:?}");
    let mut distinct = got.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!((got.len(), distinct.len()), (N, N), "c opened every datagram once: {}", st["drops"]);
    let tx = &st["interfaces"][1]["tx"];
    assert_eq!(tx["queued_packets"].as_u64(), Some(0), "{tx}");
    // Forwarding is best effort's; the node's own handshakes are System's.
    let be = tx["clients"].as_array().unwrap().iter().find(|c| c["owner"] == "best-effort").unwrap();
    assert_eq!(be["sent_packets"].as_u64(), Some(N as u64), "{tx}");
    // The link's rate held: the N - 1 datagrams after the first took at
    // least 90 % of the time their bytes take at RATE.
    let bytes = be["sent_bytes"].as_u64().unwrap() as f64;
    let (first, last) = span.unwrap();
    let least = (bytes * (N - 1) as f64 / N as f64) * 8.0 / RATE as f64;
    let took = (last - first).as_secs_f64();
    assert!(took >= 0.9 * least, "{took:.3} s for {bytes} bytes; at {RATE} bit/s at least {least:.3} s");
}
