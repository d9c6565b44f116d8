//! `anode capture` (issue 19, "Seeing the packets") with real daemons: a
//! capture of the middle node of an encrypted testbed while a SNAP ping and
//! a capsule ping cross it, decoded by tshark with
//! `tools/wireshark/anode.lua`; the dissector's opcode table against the
//! VM's; refusals (not the operator, bad requests, unknown interface,
//! busy) as typed `refused` frames; and a capture client that stops
//! reading, which costs capture drops and then its capture, never the
//! node's forwarding.
#![allow(clippy::unwrap_used)]

mod common;

use anode_daemon::client::Client;
use anode_wire::capture::{Frame, Refusal};
use common::{ANODE, Line, Scratch, eventually, status, text, up_line3};
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

fn dissector() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/wireshark/anode.lua")
}

/// tshark with the dissector over `pcap`, fields `fields`, one line per
/// datagram; `None` (and the reason printed) if tshark is missing.
fn tshark_fields(pcap: &Path, fields: &[&str]) -> Option<Vec<Vec<String>>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-X").arg(format!("lua_script:{}", dissector().display()));
    cmd.args(["-o", "udp.try_heuristic_first:TRUE", "-r"]).arg(pcap).args(["-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let o = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: tshark is not available ({e}); scripts/setup installs it when run as root");
            return None;
        }
    };
    assert!(o.status.success(), "tshark: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    Some(out.lines().map(|l| l.split('|').map(str::to_string).collect()).collect())
}

/// The mnemonics of `examples/snap/ping.s`, from the VM's own decoder.
fn ping_mnemonics() -> String {
    let src =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/snap/ping.s")).unwrap();
    let r = anode_snap::asm::assemble(&src).unwrap();
    let m: Vec<&str> = r.code.iter().map(|w| anode_snap::ops::Insn::decode(*w).unwrap().op.mnemonic()).collect();
    m.join(",")
}

/// The listen ports of a testbed node's interfaces, from its `node.toml`.
fn listen_ports(node_dir: &Path) -> Vec<String> {
    let cfg = std::fs::read_to_string(node_dir.join("node.toml")).unwrap();
    cfg.lines()
        .filter_map(|l| l.strip_prefix("listen = \""))
        .map(|l| l.trim_end_matches('"').rsplit(':').next().unwrap().to_string())
        .collect()
}

#[test]
fn a_capture_of_an_encrypted_testbed_decodes_in_tshark() {
    let s = Scratch::new("capture", "tshark");
    up_line3(&s, &["--security", "encrypt"]);
    let b = s.tb().join("b");
    let pcap = s.0.join("b.pcap");
    let cap = Command::new(ANODE)
        .args(["capture", "--duration", "6", "-w"])
        .arg(&pcap)
        .arg("--run-dir")
        .arg(&b)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(10.0, || status(&b)["capture"]["running"] == true), "the capture did not start");
    let a = s.tb().join("a");
    let mut ping = Command::new(ANODE);
    let o = ping.args(["ping", "10.0.0.3", "-c", "3", "-i", "0.05", "-W", "3", "--run-dir"]).arg(&a).output().unwrap();
    assert!(text(&o).contains("3 received"), "{}", text(&o));
    let admin = s.tb().join("keys").join("admin.key");
    let o = Command::new(ANODE)
        .args(["ping", "10.0.0.3", "--capsule", "-c", "1", "-W", "3", "--module"])
        .arg(common::modules_dir().join("ping.wasm"))
        .arg("--admin-key")
        .arg(&admin)
        .arg("--run-dir")
        .arg(&a)
        .output()
        .unwrap();
    assert!(text(&o).contains("1 received"), "{}", text(&o));
    let o = cap.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("interface 0 = a") && text(&o).contains("duration reached"), "{}", text(&o));
    let st = status(&b)["capture"].clone();
    assert_eq!((st["running"].as_bool(), st["drops"].as_u64()), (Some(false), Some(0)), "{st}");

    let fields = [
        "sll.pkttype",
        "sll.ifindex",
        "udp.srcport",
        "udp.dstport",
        "anode.anep.type",
        "anode.snap.rb",
        "anode.snap.src",
        "anode.snap.dst",
        "anode.snap.mnemonic",
        "anode.snap.stack.value",
        "anode.capsule.kind",
        "anode.capsule.entry",
    ];
    let Some(rows) = tshark_fields(&pcap, &fields) else { return };
    let ports = listen_ports(&b);
    let snap: Vec<&Vec<String>> = rows.iter().filter(|r| r[4] == "0xa001").collect();
    assert_eq!(snap.len(), 12, "3 pings, each in and out twice at b: {rows:?}");
    let mnemonics = ping_mnemonics();
    for r in &snap {
        assert_eq!(r[8], mnemonics, "the code disassembled as the VM decodes it: {r:?}");
        let (src, dst) = (r[6].as_str(), r[7].as_str());
        assert!(matches!((src, dst), ("10.0.0.1", "10.0.0.3") | ("10.0.0.3", "10.0.0.1")), "{r:?}");
        // The local endpoint is one of b's listen ports: the destination when
        // received, the source when sent.
        let local = if r[0] == "0" { &r[3] } else { &r[2] };
        assert!(ports.contains(local), "{r:?} against {ports:?}");
        assert!(r[9].contains("int 0") || r[9].contains("int 1"), "the stack decoded: {r:?}");
    }
    // Each ping is captured in then out (its resource bound one lower when it
    // leaves), on the interface toward each end.
    for pair in snap.chunks(2) {
        assert_eq!((pair[0][0].as_str(), pair[1][0].as_str()), ("0", "4"), "in, then out: {pair:?}");
        let (rb_in, rb_out): (u32, u32) = (pair[0][5].parse().unwrap(), pair[1][5].parse().unwrap());
        assert_eq!(rb_out + 1, rb_in, "{pair:?}");
        assert_ne!(pair[0][1], pair[1][1], "received on one interface, sent on the other: {pair:?}");
    }
    let capsules: Vec<&Vec<String>> = rows.iter().filter(|r| r[4] == "0xa003" && r[10] == "1").collect();
    assert!(capsules.len() >= 2, "the capsule ping in and out: {rows:?}");
    assert!(capsules.iter().all(|r| !r[11].is_empty()), "each names its entry: {capsules:?}");
    assert!(rows.iter().all(|r| r[4] != "0xa007"), "no ESP in a capture: it is plaintext");
}

/// The dissector's opcode table is the VM's (`for_each_op!`): same codes,
/// mnemonics and immediate kinds.
#[test]
fn wireshark_opcode_table_matches_the_vm() {
    let lua = std::fs::read_to_string(dissector()).unwrap();
    let mut rows = Vec::new();
    for l in lua.lines() {
        let l = l.trim();
        let Some(rest) = l.strip_prefix("[0x") else { continue };
        let Some((code, rest)) = rest.split_once("] = { \"") else { continue };
        let Some((mn, rest)) = rest.split_once("\", \"") else { continue };
        let Some((kind, _)) = rest.split_once('"') else { continue };
        rows.push((u8::from_str_radix(code, 16).unwrap(), mn.to_string(), kind.to_string()));
    }
    let want: Vec<(u8, String, String)> = anode_snap::ops::ALL_OPS
        .iter()
        .map(|o| {
            let k = match o.imm_kind() {
                anode_snap::ops::ImmKind::None => "none",
                k => k.name(),
            };
            (o.code(), o.mnemonic().to_string(), k.to_string())
        })
        .collect();
    assert_eq!(rows, want, "regenerate the OPS table of tools/wireshark/anode.lua from docs/snap.md");
}

/// Sends `line` on node `dir`'s control socket and returns its first frame,
/// owned: (refusal, reason), or None for `start`.
fn first_frame(s: &mut UnixStream) -> Option<(Refusal, String)> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Ok(Some(n)) = anode_wire::capture::frame_len(&buf)
            && buf.len() >= n
        {
            return match Frame::parse(&buf[..n]).unwrap() {
                Frame::Refused(c, why) => Some((c, why.to_string())),
                Frame::Start(_) => None,
                f => panic!("first frame {f:?}"),
            };
        }
        let k = s.read(&mut chunk).unwrap();
        assert!(k > 0, "the node closed without a frame");
        buf.extend_from_slice(&chunk[..k]);
    }
}

fn request(dir: &Path, line: &str) -> UnixStream {
    let mut s = UnixStream::connect(dir.join(anode_daemon::CONTROL_SOCKET)).unwrap();
    s.write_all(format!("{line}\n").as_bytes()).unwrap();
    s
}

#[test]
fn bad_requests_unknown_interfaces_and_a_second_capture_are_refused_by_type() {
    let l = Line::start();
    let d = l.run_dir(2);
    for (line, want) in [
        ("capture queue=0", Refusal::BadRequest),
        ("capture queue=many", Refusal::BadRequest),
        ("capture iface=a/b", Refusal::BadRequest),
        ("capture iface=west iface=east", Refusal::BadRequest),
        ("capture promiscuous", Refusal::BadRequest),
        ("capture iface=north", Refusal::UnknownInterface),
    ] {
        let got = first_frame(&mut request(&d, line));
        assert_eq!(got.as_ref().map(|g| g.0), Some(want), "{line}: {got:?}");
    }
    let mut first = request(&d, "capture iface=east");
    assert_eq!(first_frame(&mut first), None, "the first capture runs");
    let busy = first_frame(&mut request(&d, "capture"));
    assert_eq!(busy.as_ref().map(|b| b.0), Some(Refusal::Busy), "{busy:?}");
    // The command line: a refusal exits 2 with the reason.
    drop(first);
    assert!(eventually(5.0, || status(&d)["capture"]["running"] == false), "closing ended the capture");
    let o = l.run(2, &["capture", "-i", "north", "-w", "/dev/null"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("unknown interface") && text(&o).contains("west, east"), "{}", text(&o));
    let o = l.run(2, &["capture", "--queue", "0", "-w", "/dev/null"]);
    assert!(!o.status.success() && text(&o).contains("queue="), "{}", text(&o));
    let st = status(&d)["capture"].clone();
    assert_eq!((st["started"].as_u64(), st["refused"].as_u64()), (Some(1), Some(8)), "{st}");
}

/// A member of the control socket's group may read `status` but not
/// capture: the daemon checks the client's uid (SO_PEERCRED).
#[test]
fn a_group_member_who_is_not_the_operator_is_refused() {
    let root = nix::unistd::geteuid().is_root();
    let setpriv = Command::new("setpriv").arg("--version").output().is_ok_and(|o| o.status.success());
    let nogroup = nix::unistd::Group::from_name("nogroup").ok().flatten();
    let (true, true, Some(g)) = (root, setpriv, nogroup) else {
        eprintln!("SKIPPED: needs root, setpriv and the group nogroup to run a client as another user");
        return;
    };
    let l = Line::start_with(["", "[local]\nsocket_group = \"nogroup\"\n", ""]);
    let d = l.run_dir(2);
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", &format!("--regid={}", g.gid), "--clear-groups", ANODE])
            .args(args)
            .arg("--run-dir")
            .arg(&d)
            .output()
            .unwrap()
    };
    let o = as_nobody(&["status", "--json"]);
    assert!(o.status.success(), "the group may read status: {}", text(&o));
    let o = as_nobody(&["capture", "-c", "1", "-w", "/dev/null"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not the operator") && text(&o).contains("uid 65534"), "{}", text(&o));
    assert_eq!(status(&d)["capture"]["refused"].as_u64(), Some(1));
    assert_eq!(status(&d)["capture"]["started"].as_u64(), Some(0));
}

/// A client that asks for a capture and never reads: its socket and the
/// node's bounded buffers fill, the rest is counted as capture drops, the
/// middle node forwards all the while, and after `stall_timeout_ms` the
/// capture is stopped.
#[test]
fn a_stalled_capture_client_costs_capture_drops_not_forwarding() {
    let l = Line::start_with(["", "[local]\nstall_timeout_ms = 1500\n", ""]);
    let d = l.run_dir(2);
    let stalled = request(&d, "capture queue=16");
    let mut c = Client::connect(l.run_dir(1)).unwrap();
    c.hello().unwrap();
    let payload = vec![0x5a; 1200];
    let before = status(&d)["interfaces"][1]["tx_packets"].as_u64().unwrap();
    for _ in 0..2000 {
        c.plain(Ipv4Addr::new(10, 0, 0, 3), 9, 8, &payload).unwrap();
    }
    assert!(
        eventually(10.0, || status(&d)["capture"]["drops"].as_u64().unwrap() > 0),
        "capture drops: {}",
        status(&d)["capture"]
    );
    let o = l.run(1, &["ping", "10.0.0.3", "-c", "2", "-i", "0.05", "-W", "3"]);
    assert!(text(&o).contains("2 received"), "the node forwards while its capture client stalls: {}", text(&o));
    let after = status(&d)["interfaces"][1]["tx_packets"].as_u64().unwrap();
    assert!(after >= before + 2000, "every plain packet was forwarded: {before} -> {after}");
    assert!(
        eventually(10.0, || status(&d)["capture"]["stopped_stalled"].as_u64() == Some(1)),
        "the stalled capture is stopped: {}",
        status(&d)["capture"]
    );
    assert_eq!(status(&d)["capture"]["running"], false);
    drop(stalled);
    let mut again = request(&d, "capture");
    assert_eq!(first_frame(&mut again), None, "a new capture may start");
}

/// A client that shuts down its sending side after the request (as
/// `printf 'capture\n' | socat - UNIX-CONNECT:…` does) still gets the
/// stream; hanging up ends the capture.
#[test]
fn a_half_closed_client_still_gets_the_stream_until_it_hangs_up() {
    let l = Line::start();
    let d = l.run_dir(2);
    let mut s = request(&d, "capture");
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(first_frame(&mut s), None);
    let o = l.run(1, &["ping", "10.0.0.3", "-c", "1", "-W", "3"]);
    assert!(text(&o).contains("1 received"), "{}", text(&o));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let got_packet = eventually(5.0, || {
        if let Ok(k) = s.read(&mut chunk) {
            buf.extend_from_slice(&chunk[..k]);
        }
        buf.windows(4).any(|w| w == [10, 0, 0, 3])
    });
    assert!(got_packet, "the ping's datagrams arrive after the half-close");
    assert_eq!(status(&d)["capture"]["running"], true);
    drop(s);
    assert!(eventually(5.0, || status(&d)["capture"]["running"] == false), "hanging up ends it");
    assert_eq!(status(&d)["capture"]["stopped_client"].as_u64(), Some(1));
}

/// An IPv4/UDP packet (LINKTYPE_IPV4) carrying `payload` from port 7001
/// to 7002.
fn ipv4_udp(payload: &[u8]) -> Vec<u8> {
    let total = (28 + payload.len()) as u16;
    let mut v = vec![0x45, 0];
    v.extend_from_slice(&total.to_be_bytes());
    v.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0, 127, 0, 0, 1, 127, 0, 0, 1]);
    v.extend_from_slice(&7001u16.to_be_bytes());
    v.extend_from_slice(&7002u16.to_be_bytes());
    v.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(payload);
    v
}

fn anep(type_id: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; anode_wire::anep::HEADER_LEN];
    anode_wire::anep::write_header(&mut d, anode_wire::anep::FLAG_DISCARD_UNKNOWN, type_id, payload.len());
    d.extend_from_slice(payload);
    d
}

/// The formats a ping does not show, built by the crates that own them and
/// decoded by the dissector: a little-endian SNAP packet with heap objects
/// (address, string, tuple, float) and a stack of each kind, a plain
/// packet, control load requests and replies, and the capsule code-fetch
/// messages.
#[test]
fn the_dissector_decodes_each_format_as_its_crate_encodes_it() {
    use anode_wire::anep::{TYPE_CAPSULE, TYPE_CONTROL, TYPE_PLAIN, TYPE_SNAP};
    use anode_wire::control::{CodeChunk, LoadReply, LoadRequest, Message};
    let s = Scratch::new("capture", "formats");
    let src = ".src 10.0.0.7\n.dst 10.0.0.9\n.rb 33\n.port 4242\n.endian little\n\
               .heap\nh0: addr 10.1.2.3\nh1: tuple [1, 2]\n.code\n\
               .stack 5, true, (), @h0, \"hi\", 1.5, @h1\n\
               push -3\nbne 2\npushh @h1\nnth 1\nistag int\nexit\n";
    let snap = anode_snap::asm::assemble(src).unwrap().to_bytes().unwrap();
    let mut plain = vec![10, 0, 0, 9, 10, 0, 0, 7, 17, 0, 0x1f, 0x90];
    plain.extend_from_slice(b"payload");
    let mut load = Vec::new();
    Message::Load(LoadRequest { name: Some("counter"), credential: b"cred", code: b"\0asm" }).emit(&mut load).unwrap();
    let mut loaded = Vec::new();
    Message::LoadReply(LoadReply::Loaded(3)).emit(&mut loaded).unwrap();
    let mut refused = Vec::new();
    let r = LoadReply::Refused(anode_wire::control::Refusal::Denied, "no right");
    Message::LoadReply(r).emit(&mut refused).unwrap();
    let mut chunk = Vec::new();
    Message::CodeChunk(CodeChunk { total: 200_000, offset: 60_000, data: b"\0asm" }).emit(&mut chunk).unwrap();
    let mut staged = Vec::new();
    Message::LoadReply(LoadReply::Staged(60_004)).emit(&mut staged).unwrap();
    let hash = anode_cred::ModuleHash::of(b"\0asm");
    let mut req = Vec::new();
    anode_sandbox::capsule::encode_code_request(&hash, &mut req);
    let mut reply = Vec::new();
    anode_sandbox::capsule::encode_code_reply(&hash, b"\0asm", &mut reply).unwrap();
    let datagrams = [
        anep(TYPE_SNAP, &snap),
        anep(TYPE_PLAIN, &plain),
        anep(TYPE_CONTROL, &load),
        anep(TYPE_CONTROL, &loaded),
        anep(TYPE_CONTROL, &refused),
        anep(TYPE_CAPSULE, &req),
        anep(TYPE_CAPSULE, &reply),
        anep(TYPE_CONTROL, &chunk),
        anep(TYPE_CONTROL, &staged),
    ];
    let pcap = s.0.join("formats.pcap");
    let f = std::fs::File::create(&pcap).unwrap();
    let mut sink = anode_monitor::PcapSink::new(f, anode_monitor::LinkType::Ipv4).unwrap();
    for (i, d) in datagrams.iter().enumerate() {
        let p = ipv4_udp(d);
        sink.write(1_000_000_000 * (i as u64 + 1), p.len() as u32, &p).unwrap();
    }
    drop(sink);
    let fields = [
        "anode.anep.type",
        "anode.snap.flags",
        "anode.snap.rb",
        "anode.snap.port",
        "anode.snap.src",
        "anode.snap.dst",
        "anode.snap.insn",
        "anode.snap.heap.object",
        "anode.snap.stack.value",
        "anode.plain.dst",
        "anode.plain.ttl",
        "anode.plain.port",
        "anode.control.op",
        "anode.control.name",
        "anode.control.status",
        "anode.control.module",
        "anode.control.refusal",
        "anode.control.reason",
        "anode.capsule.kind",
        "anode.capsule.code_len",
        "_ws.expert",
        "anode.control.total",
        "anode.control.offset",
        "anode.control.staged",
    ];
    let Some(rows) = tshark_fields(&pcap, &fields) else { return };
    assert_eq!(rows.len(), 9, "{rows:?}");
    let snap = &rows[0];
    assert_eq!(&snap[1..6], ["0x01", "33", "4242", "10.0.0.7", "10.0.0.9"], "{snap:?}");
    for want in ["0> push -3", "1: bne 2", "2: pushh @2", "3: nth 1", "4: istag int", "5: exit"] {
        assert!(snap[6].contains(want), "{want} in {}", snap[6]);
    }
    for want in ["addr 10.1.2.3", "tuple(2) [int 1, int 2]", "str(2) \"hi\"", "float 1.5"] {
        assert!(snap[7].contains(want), "{want} in {}", snap[7]);
    }
    // `.stack` is written top first; the dissector lists the top first too.
    for want in ["[0] int 5", "[1] true", "[2] ()", "[3] addr @0", "[4] str @", "[5] float @", "[6] tuple @2"] {
        assert!(snap[8].contains(want), "{want} in {}", snap[8]);
    }
    assert_eq!(&rows[1][9..12], ["10.0.0.9", "17", "8080"], "plain: {:?}", rows[1]);
    assert_eq!((rows[2][12].as_str(), rows[2][13].as_str()), ("0x01", "counter"), "load: {:?}", rows[2]);
    assert_eq!((rows[3][12].as_str(), rows[3][14].as_str(), rows[3][15].as_str()), ("0x81", "0", "3"), "{:?}", rows[3]);
    assert_eq!(
        (rows[4][14].as_str(), rows[4][16].as_str(), rows[4][17].as_str()),
        ("2", "4", "no right"),
        "{:?}",
        rows[4]
    );
    assert_eq!((rows[5][18].as_str(), rows[6][18].as_str(), rows[6][19].as_str()), ("2", "3", "4"), "code fetch");
    assert_eq!(
        (rows[7][12].as_str(), rows[7][21].as_str(), rows[7][22].as_str()),
        ("0x03", "200000", "60000"),
        "code chunk: {:?}",
        rows[7]
    );
    assert_eq!((rows[8][14].as_str(), rows[8][23].as_str()), ("3", "60004"), "staged: {:?}", rows[8]);
    assert!(rows.iter().all(|r| r[20].is_empty()), "no malformed-packet notes: {rows:?}");
}
