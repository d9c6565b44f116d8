//! RCANE II receive channels on real daemons (issue 15, RCANE §IV-D; see
//! docs/channels.md). Two principals, each with a session and a module on
//! node c whose channel listens on the same port 5000 (A's packets start
//! with `A`, B's with `B`). A's channel has a 4,000-byte FIFO and a
//! consumer that burns about a millisecond per packet on a 5 % VP; B's
//! module hands each packet to a local application at once, on its own VP.
//! Node a floods A's channel (4,000 packets at about 2,000 a second) while
//! sending B a paced stream (200 packets, one every 10 ms).
//!
//! A third module, of B's, whose credential grants only port 5000 from
//! 10.0.2.0/24, asks for a channel that would capture A's packets: refused.
//!
//! Checked: A's FIFO fills and its drops are counted on A's channel (and as
//! `channel_full`); B's channel takes every packet of its stream and drops
//! none; B's application receives all 200; B's VP was dispatched for them.
//! Nothing asserts a timing.
#![allow(clippy::unwrap_used)]

mod common;

use anode_daemon::client::Client;
use common::{UserLine, status, text};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const C: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);
const PORT: u16 = 5000;
const APP_PORT: u16 = 6001;
const FLOOD: usize = 4000;
const STREAM: usize = 200;

/// A module whose init opens a channel with the spec bytes `spec` on VP
/// index `vp` of its session, calling `pkt`, whose body is `body`.
fn rx_wat(spec: &str, vp: u8, body: &str) -> Vec<u8> {
    let src = format!(
        r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "anode" "input_read" (func $input (param i32 i32 i32) (result i32)))
  (import "net" "open_channel_spec" (func $open (param i32 i32 i32 i32 i32) (result i32)))
  (import "net" "deliver_local" (func $deliver (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $opened (mut i32) (i32.const 0))
  (data (i32.const 0) "pkt")
  (data (i32.const 16) "{spec}")
  (func $pkt (param i32 i32) (result i32) (local $i i32) (local $n i32)
    {body})
  (table (export "__indirect_function_table") 1 funcref)
  (elem (i32.const 0) $pkt)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 3) (i32.const 0)))
    (global.set $opened (call $open (i32.const 16) (i32.const 11) (i32.const 0) (i32.const 3) (i32.const {vp})))))"#
    );
    wat::parse_str(src).unwrap()
}

/// Port 5000, any source, payload prefix `A`, 4,000 bytes of FIFO; about
/// a million loop iterations per packet.
fn flooded_module() -> Vec<u8> {
    rx_wat(
        r"\01\00\13\88\00\00\0f\a0\01A\00",
        0,
        "(loop $l (local.set $i (i32.add (local.get $i) (i32.const 1)))
           (br_if $l (i32.lt_u (local.get $i) (i32.const 1000000))))
         (i32.const 0)",
    )
}

/// Port 5000, any source, payload prefix `B`, 64,000 bytes of FIFO, on
/// VP index `vp`; each packet to the local application on port 6001.
fn served_module(vp: u8) -> Vec<u8> {
    rx_wat(
        r"\01\00\13\88\00\00\fa\00\01B\00",
        vp,
        "(local.set $n (call $input (i32.const 1024) (i32.const 2048) (i32.const 0)))
         (drop (call $deliver (i32.const 6001) (i32.const 1024) (local.get $n)))
         (i32.const 0)",
    )
}

impl UserLine {
    /// Writes `code` as `<name>.wasm`, issues its credential to `pubk`
    /// (with `extra` options) and loads it over `key`'s SA.
    fn load(&self, key: &Path, pubk: &Path, name: &str, code: &[u8], extra: &[&str]) {
        let wasm = self.s.0.join(format!("{name}.wasm"));
        std::fs::write(&wasm, code).unwrap();
        let w = wasm.to_str().unwrap();
        let mut args = vec!["--kind", "module", "--module", w, "--interface", "net", "--cpu", "10000000"];
        args.extend_from_slice(extra);
        let cred = self.cred(pubk, &format!("{name}.cred"), &args);
        let o = self.run(key, &["module", "load", w, "--credential", cred.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
    }

    /// Opens a session for the holder of `key` with `args` (VPs, receive
    /// reservation): its id.
    fn session(&self, key: &Path, pubk: &Path, name: &str, args: &[&str]) -> String {
        let sc = self.cred(
            pubk,
            &format!("{name}.session"),
            &["--kind", "session", "--vp-share", "40%", "--total-share", "40%"],
        );
        let mut a = vec!["session", "open", "--credential", sc.to_str().unwrap()];
        a.extend_from_slice(args);
        let o = self.run(key, &a);
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).split_whitespace().nth(1).unwrap_or_default().to_string()
    }
}

fn channel(st: &serde_json::Value, prefix_len: u64, buffer: u64) -> &serde_json::Value {
    st["modules"]["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["prefix_len"].as_u64() == Some(prefix_len) && c["buffer"].as_u64() == Some(buffer))
        .unwrap_or_else(|| panic!("no channel with a {buffer}-byte FIFO: {}", st["modules"]["channels"]))
}

fn session_vp(st: &serde_json::Value, sid: &str, index: usize) -> serde_json::Value {
    let s = st["rcane"]["sessions"].as_array().unwrap().iter().find(|s| s["session"].as_str() == Some(sid));
    s.unwrap_or_else(|| panic!("no session {sid}: {}", st["rcane"]))["vps"][index].clone()
}

/// The testbed a - b - c with the users `names`, commands pointed at c.
fn up(tag: &str, names: &[&str]) -> (UserLine, PathBuf, Vec<(PathBuf, PathBuf)>) {
    UserLine::up("rx", tag, names, &[])
}

#[test]
fn a_flood_for_one_channel_costs_another_channel_on_the_same_port_nothing() {
    let (env, c, keys) = up("flood", &["a", "b"]);
    let [(akey, apub), (bkey, bpub)] = <[_; 2]>::try_from(keys).unwrap();
    let sid_a = env.session(&akey, &apub, "a", &["--vp", "1ms/20ms"]);
    // B has two VPs; its channel names the second.
    let sid_b = env.session(&bkey, &bpub, "b", &["--vp", "1ms/10ms", "--vp", "2ms/10ms"]);
    env.load(&akey, &apub, "flooded", &flooded_module(), &[]);
    env.load(&bkey, &bpub, "served", &served_module(1), &[]);
    // A module of B's granted only port 5000 from 10.0.2.0/24 tries to
    // capture A's traffic (any source, prefix `A`): refused, counted.
    let capture = rx_wat(r"\01\00\13\88\00\00\0f\a0\01A\00", 0, "(i32.const 0)");
    env.load(&bkey, &bpub, "capture", &capture, &["--channel", "5000@10.0.2.0/24"]);
    let st = status(&c);
    assert_eq!(st["modules"]["channels"].as_array().unwrap().len(), 2, "{}", st["modules"]);
    assert_eq!(st["modules"]["channel_refused"].as_u64(), Some(1), "{}", st["modules"]);

    // B's application on c.
    let mut app = Client::connect(&c).unwrap();
    app.register(APP_PORT).unwrap();
    let receiver = std::thread::spawn(move || {
        let mut got = std::collections::BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() < STREAM && Instant::now() < deadline {
            if let Ok(Some((APP_PORT, p))) = app.recv(Duration::from_millis(500)) {
                got.insert(p);
            }
        }
        got
    });

    // The flood for A, from a, in its own thread.
    let a_dir = env.s.tb().join("a");
    let flood_dir = a_dir.clone();
    let flooder = std::thread::spawn(move || {
        let mut tx = Client::connect(&flood_dir).unwrap();
        let mut payload = vec![b'A'; 100];
        for i in 0..FLOOD {
            payload[1..9].copy_from_slice(&(i as u64).to_be_bytes());
            tx.plain(C, PORT, 64, &payload).unwrap();
            if i % 2 == 1 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    // B's paced stream.
    let mut tx = Client::connect(&a_dir).unwrap();
    for i in 0..STREAM {
        tx.plain(C, PORT, 64, format!("B{i:04}").as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    flooder.join().unwrap();
    let got = receiver.join().unwrap();

    let st = status(&c);
    let a = channel(&st, 1, 4000).clone();
    let b = channel(&st, 1, 64_000).clone();
    eprintln!("A's channel: {a}\nB's channel: {b}\ndrops: {}", st["drops"]);
    // A's FIFO filled: its drops are counted on its channel.
    assert!(a["dropped_full"].as_u64().unwrap() > 0, "A's FIFO never filled: {a}");
    assert!(a["delivered"].as_u64().unwrap() + a["dropped_full"].as_u64().unwrap() > 0);
    assert!(st["drops"]["channel_full"].as_u64().unwrap() > 0, "{}", st["drops"]);
    // B lost nothing: every packet of its stream into its FIFO, and to its application.
    assert_eq!(b["delivered"].as_u64(), Some(STREAM as u64), "{b}");
    assert_eq!(b["dropped_full"].as_u64(), Some(0), "{b}");
    assert_eq!(b["dropped_rate"].as_u64(), Some(0), "{b}");
    assert_eq!(got.len(), STREAM, "B's application received {} of {STREAM}", got.len());
    // B's processing ran on the VP its channel names (B's second), none
    // on B's first; A's on A's.
    let (va, vb0, vb1) = (session_vp(&st, &sid_a, 0), session_vp(&st, &sid_b, 0), session_vp(&st, &sid_b, 1));
    eprintln!("A's VP: {va}\nB's VPs: {vb0}\n{vb1}");
    let dispatches = |v: &serde_json::Value| v["received_ns_total"]["dispatches"].as_u64().unwrap();
    assert!(dispatches(&vb1) > 0, "{vb1}");
    assert_eq!(dispatches(&vb0), 0, "{vb0}");
    assert!(dispatches(&va) > 0, "{va}");
}

#[test]
fn a_session_over_its_receive_reservation_drops_on_its_channel() {
    let (env, c, keys) = up("rate", &["b"]);
    let (bkey, bpub) = keys.into_iter().next().unwrap();
    // 20 kB/s: a burst of 64 KiB, then 20 kB a second.
    env.session(&bkey, &bpub, "b", &["--vp", "2ms/10ms", "--rx", "20kB/s"]);
    env.load(&bkey, &bpub, "served", &served_module(0), &[]);
    let mut tx = Client::connect(env.s.tb().join("a")).unwrap();
    let n = 300u64;
    for i in 0..n {
        let mut p = vec![b'B'; 1000];
        p[1..9].copy_from_slice(&i.to_be_bytes());
        tx.plain(C, PORT, 64, &p).unwrap();
        // About 200 kB/s, ten times the reservation.
        std::thread::sleep(Duration::from_millis(5));
    }
    // Wait until c has seen them all (or 10 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let st = loop {
        let st = status(&c);
        let b = channel(&st, 1, 64_000).clone();
        let seen: u64 = ["delivered", "dropped_full", "dropped_rate"].iter().map(|k| b[*k].as_u64().unwrap()).sum();
        if seen >= n || Instant::now() > deadline {
            break st;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let b = channel(&st, 1, 64_000);
    eprintln!("B's channel: {b}");
    let (delivered, rate) = (b["delivered"].as_u64().unwrap(), b["dropped_rate"].as_u64().unwrap());
    assert_eq!(delivered + rate + b["dropped_full"].as_u64().unwrap(), n, "{b}");
    assert!(rate > 0 && delivered >= 64, "policed at its reservation after its burst: {b}");
    assert!(st["drops"]["channel_rate"].as_u64().unwrap() > 0, "{}", st["drops"]);
}
