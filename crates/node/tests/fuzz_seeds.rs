//! Replays the node fuzz targets over their seeds, plus a few thousand
//! deterministic mutations of them, as an ordinary test.
//! `ANODE_BLESS=1` rewrites the seeds under `fuzz/seeds/node_*`.

use anode_node::anep;
use anode_node::fuzzing;
use anode_wire::local::{Reply, Request};
use std::net::Ipv4Addr;
use std::path::PathBuf;

const PING: &str = include_str!("../../../examples/snap/ping.s");
const TRACEROUTE: &str = include_str!("../../../examples/snap/traceroute.s");
const MULTICAST: &str = include_str!("../../../examples/snap/multicast.s");
const BAD_SENDS: &str = include_str!("../../../examples/snap/bad_sends.s");

const TARGETS: [&str; 3] = ["node_datagram", "node_config", "node_local"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn a(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, n)
}

fn snap(src: &str, from: Ipv4Addr, to: Ipv4Addr, rb: u16, port: u16) -> Vec<u8> {
    let mut r = anode_snap::asm::assemble(src).expect("assembles");
    r.src = from;
    r.dst = to;
    r.resource_bound = rb;
    r.port = port;
    r.to_bytes().expect("emits")
}

fn plain(dst: Ipv4Addr, ttl: u8, port: u16, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0; anode_node::plain::HEADER_LEN + payload.len()];
    anode_node::plain::Repr { dst, src: a(1), ttl, port }.emit(&mut b).expect("room for the header");
    b[anode_node::plain::HEADER_LEN..].copy_from_slice(payload);
    b
}

/// `(mode, datagram)` for `fuzzing::datagram` (see its documentation).
fn datagram_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let framed = |t: u16, p: &[u8]| anep::frame(anep::FLAG_DISCARD_UNKNOWN, t, p);
    let raw = |mode: u8, d: Vec<u8>| [vec![mode], d].concat();
    // The node is 10.0.0.2 between 10.0.0.1 and 10.0.0.3; 10.0.0.4 is behind 10.0.0.3.
    vec![
        ("ping_request", raw(0x00, framed(anep::TYPE_SNAP, &snap(PING, a(1), a(3), 16, 7)))),
        ("ping_here", raw(0x02, framed(anep::TYPE_SNAP, &snap(PING, a(1), a(2), 16, 7)))),
        ("ping_snap_mode", raw(0x10, snap(PING, a(4), a(1), 16, 7))),
        ("traceroute", raw(0x04, framed(anep::TYPE_SNAP, &snap(TRACEROUTE, a(1), a(4), 16, 9)))),
        ("multicast", raw(0x10, snap(MULTICAST, a(1), a(2), 16, 7))),
        ("bad_sends", raw(0x10, snap(BAD_SENDS, a(1), a(2), 40, 7))),
        ("plain_forward", raw(0x00, framed(anep::TYPE_PLAIN, &plain(a(4), 8, 7, b"payload")))),
        ("plain_deliver", raw(0x20, plain(a(2), 8, 7, b"payload"))),
        ("plain_ttl0", raw(0x20, plain(a(3), 0, 7, b""))),
        ("unknown_pass_on", raw(0x31, [&[0x12, 0x34][..], b"capsule"].concat())),
        ("unknown_discard", raw(0xB1, [&[0x12, 0x34][..], b"capsule"].concat())),
        ("anep_options", raw(0x00, vec![1, 0, 0xA0, 2, 0, 4, 0, 16, 0, 7, 0, 2, 9, 9, 9, 9])),
        ("anep_truncated", raw(0x00, vec![1, 0x80, 0xA0])),
    ]
}

const NODE: &str = r#"address = "10.0.0.2"
mtu = 1400
run_dir = "/run/anode/n2"
metrics = "127.0.0.1:9102"

[[interface]]
name = "west"
listen = "127.0.0.1:7002"
neighbors = [{ address = "10.0.0.1", endpoint = "127.0.0.1:7001" }]

[[interface]]
name = "east"
listen = "127.0.0.1:7012"
neighbors = [
  { address = "10.0.0.3", endpoint = "127.0.0.1:7003" },
  { address = "10.0.0.5", endpoint = "127.0.0.1:7005" },
]

[routes]
topology = "topology.toml"
static = [{ dest = "10.0.0.9", via = "10.0.0.3" }]
default_via = "10.0.0.1"
"#;

const TOPOLOGY: &str = r#"node = [
  { name = "a", address = "10.0.0.1" },
  { name = "b", address = "10.0.0.2" },
  { name = "c", address = "10.0.0.3" },
  { name = "d", address = "10.0.0.4" },
  { name = "e", address = "10.0.0.5" },
]
link = [
  { a = "a", b = "b" },
  { a = "b", b = "c" },
  { a = "c", b = "d" },
  { a = "d", b = "e" },
  { a = "e", b = "b" },
]
"#;

/// A node of an administrative domain (`[domain]`, with security on).
const DOMAIN: &str = "address = \"10.0.0.1\"\n[[interface]]\nname = \"x\"\nlisten = \"127.0.0.1:7000\"\n\
    [security]\nkey = \"n.key\"\n[domain]\n\
    operator = \"edfab70325ff07ab2bde8a6e3fa5d2c8c53ad3d0ba4cc0bfe6f1cb9e8e1b1a5c\"\n\
    secret = \"d.secret\"\nepoch = 2\nkdc = true\nmax_ticket_secs = 120\n";

/// A border of a domain with a border policy and revocations in its config.
const DOMAIN_BORDER: &str = "border = true\n[domain.border_policy]\ninterfaces = [\"log\", \"time\"]\n\
    max_memory = 65536\n[domain.revoked]\nmin_epoch = 2\ntickets = [\"0x2a\"]\n\
    users = [\"edfab70325ff07ab2bde8a6e3fa5d2c8c53ad3d0ba4cc0bfe6f1cb9e8e1b1a5c\"]\n";

const MODULES_SESSIONS: &str = include_str!("../../../fuzz/seeds/node_config/modules_sessions");
/// A `[monitor]` section (the FLAME tap) for the configuration seeds.
const MONITOR: &str = "[monitor]\nenabled = true\nadmin_key = \"3981782f1d32f1d6fbd807c7b02acb1cc8f09743e1b49d15d0b7a984d65474c0\"\n\
    batch = 8\ntick_ms = 100\ninterfaces = [\"east\"]\nload = [{ file = \"t.wasm\", credential = \"t.cred\", name = \"t\" }]\n";

fn config_seeds() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("node", NODE.as_bytes().to_vec()),
        ("topology", TOPOLOGY.as_bytes().to_vec()),
        ("node_and_topology", format!("{NODE}\n%%\n{TOPOLOGY}").into_bytes()),
        ("minimal", b"address = \"10.0.0.1\"\n[[interface]]\nname = \"eth0\"\nlisten = \"0.0.0.0:7000\"\n".to_vec()),
        ("modules_sessions", MODULES_SESSIONS.as_bytes().to_vec()),
        ("node_monitor", format!("{NODE}\n{MONITOR}").into_bytes()),
        ("domain", DOMAIN.as_bytes().to_vec()),
        ("domain_border", format!("{DOMAIN}{DOMAIN_BORDER}").into_bytes()),
    ]
}

fn local_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let ping = snap(PING, a(2), a(3), 16, 7);
    vec![
        ("hello", Request::Hello.encode()),
        ("register", Request::Register(7).encode()),
        ("unregister", Request::Unregister(7).encode()),
        ("inject_ping", Request::Inject(&ping).encode()),
        ("inject_multicast", Request::Inject(&snap(MULTICAST, a(2), a(2), 8, 7)).encode()),
        ("plain", Request::Plain { dst: a(4), port: 7, ttl: 64, payload: b"hi" }.encode()),
        ("ok", Reply::Ok.encode()),
        ("info", Reply::Info { address: a(2), mtu: 1400 }.encode()),
        ("deliver", Reply::Deliver { port: 7, payload: b"ping" }.encode()),
        ("error", Reply::Error("no such port").encode()),
    ]
}

fn seeds(target: &str) -> Vec<(&'static str, Vec<u8>)> {
    match target {
        "node_datagram" => datagram_seeds(),
        "node_config" => config_seeds(),
        _ => local_seeds(),
    }
}

fn run(target: &str, data: &[u8]) {
    match target {
        "node_datagram" => fuzzing::datagram(data),
        "node_config" => fuzzing::config(data),
        _ => fuzzing::local(data),
    }
}

/// xorshift64*: deterministic mutations without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four random edits: flip a bit, set a byte to an interesting value,
/// insert or delete a byte, truncate, or copy a run of bytes elsewhere.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    const INTERESTING: [u8; 10] = [0, 1, 2, 0x7f, 0x80, 0xff, b'"', b'\n', b'=', b'['];
    let mut m = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = m.len();
        match rng.below(6) {
            0 if len > 0 => {
                let i = rng.below(len);
                m[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                m[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = rng.below(len + 1);
                m.insert(i, rng.next() as u8);
            }
            3 if len > 0 => {
                m.remove(rng.below(len));
            }
            4 => m.truncate(rng.below(len + 1)),
            _ if len > 1 => {
                let from = rng.below(len);
                let n = 1 + rng.below((len - from).min(16));
                let run = m[from..from + n].to_vec();
                let to = rng.below(len);
                for (k, b) in run.into_iter().enumerate() {
                    if let Some(x) = m.get_mut(to + k) {
                        *x = b;
                    }
                }
            }
            _ => {}
        }
    }
    m
}

#[test]
fn seeds_and_mutations() {
    let bless = std::env::var_os("ANODE_BLESS").is_some();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut runs = 0;
    for target in TARGETS {
        let dir = root().join("fuzz/seeds").join(target);
        if bless {
            std::fs::create_dir_all(&dir).expect("mkdir");
        }
        for (name, seed) in seeds(target) {
            if bless {
                std::fs::write(dir.join(name), &seed).expect("write seed");
            }
            run(target, &seed);
            for cut in 0..seed.len().min(64) {
                run(target, &seed[..cut]);
            }
            for _ in 0..300 {
                run(target, &mutate(&mut rng, &seed));
                runs += 1;
            }
        }
    }
    assert!(runs >= 3000, "{runs} mutations");
}

#[test]
fn committed_seeds_replay() {
    for target in TARGETS {
        let dir = root().join("fuzz/seeds").join(target);
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let data = std::fs::read(e.expect("entry").path()).expect("read");
            run(target, &data);
            n += 1;
        }
        assert!(n >= seeds(target).len(), "{target}: {n} seeds; run with ANODE_BLESS=1 to write them");
    }
}

/// The `node_control` target over the session control seeds (shared with
/// `sched_control`: they are session requests) and every bit flip and
/// truncation of them: a node with RCANE on answers each with a well-formed
/// reply.
/// Runs `f` over the seeds in `fuzz/seeds/{dir}`, every prefix of each and
/// every one-bit change; the number of changes run.
fn seeds_prefixes_and_bit_flips(dir: &str, f: fn(&[u8])) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(root().join("fuzz/seeds").join(dir)).expect("seeds") {
        let seed = std::fs::read(e.expect("entry").path()).expect("seed");
        f(&seed);
        for i in 0..seed.len() {
            f(&seed[..i]);
            for bit in 0..8 {
                let mut m = seed.clone();
                m[i] ^= 1 << bit;
                f(&m);
                n += 1;
            }
        }
    }
    n
}

#[test]
fn node_control_over_session_seeds_and_mutations() {
    let n = seeds_prefixes_and_bit_flips("sched_control", fuzzing::control);
    assert!(n > 100, "the seeds were found and mutated ({n})");
}

/// The staging of code chunks (`fuzzing::staging`) over its seeds, every
/// prefix and every one-bit change of them, and random sequences.
#[test]
fn node_staging_seeds_and_mutations() {
    let n = seeds_prefixes_and_bit_flips("node_staging", fuzzing::staging);
    let mut rng = Rng(0x5eed_57a9);
    for _ in 0..2_000 {
        let m: Vec<u8> = (0..6 * (1 + rng.below(40))).map(|_| rng.next() as u8).collect();
        fuzzing::staging(&m);
    }
    assert!(n > 100, "the seeds were found and mutated ({n})");
}
