//! Transmit reservations of channels (RCANE §IV-D: "A channel may have a
//! guaranteed level of ... transmission bandwidth"): `net.channel_tx`
//! carves a channel's reservation from its session's, `net.channel_send`
//! sends as the channel's flow, and closing, unloading or a lowered session
//! reservation gives it back (docs/rcane.md, "Transmit reservations of
//! channels").
#![allow(clippy::unwrap_used)]

mod common;

use anode_sandbox::host::{E_INVAL, E_LIMIT, E_NOTFOUND};
use anode_sandbox::{Action, Flow, Job, JobKind, LoadSpec, ModuleId, PrincipalId, Sandbox};
use common::heap::run_job;
use common::*;

/// `open` (arg: port) opens a channel; `tx` (arg: handle, input: the rate
/// as 8 bytes LE) sets its transmit reservation; `send` (arg: handle)
/// sends "ping" on it to 10.0.0.2:4001; `close` (arg: handle) closes it.
const TX_WAT: &str = r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "anode" "input_read" (func $input (param i32 i32 i32) (result i32)))
  (import "net" "open_channel" (func $open (param i32 i32 i32 i32 i32) (result i32)))
  (import "net" "close_channel" (func $close (param i32) (result i32)))
  (import "net" "channel_tx" (func $tx (param i32 i64) (result i32)))
  (import "net" "channel_send" (func $send (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "open")
  (data (i32.const 8) "pkt")
  (data (i32.const 16) "tx")
  (data (i32.const 24) "send")
  (data (i32.const 32) "close")
  (data (i32.const 64) "ping")
  (func $open_f (param i32 i32) (result i32)
    (call $open (local.get 0) (i32.const 0) (i32.const 0) (i32.const 8) (i32.const 3)))
  (func $pkt (param i32 i32) (result i32) (i32.const 0))
  (func $tx_f (param i32 i32) (result i32)
    (drop (call $input (i32.const 128) (i32.const 8) (i32.const 0)))
    (call $tx (local.get 0) (i64.load (i32.const 128))))
  (func $send_f (param i32 i32) (result i32)
    (call $send (local.get 0) (i32.const 0x0a000002) (i32.const 4001) (i32.const 64) (i32.const 4)))
  (func $close_f (param i32 i32) (result i32) (call $close (local.get 0)))
  (table (export "__indirect_function_table") 5 funcref)
  (elem (i32.const 0) $open_f $pkt $tx_f $send_f $close_f)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 0)))
    (drop (call $reg (i32.const 8) (i32.const 3) (i32.const 1)))
    (drop (call $reg (i32.const 16) (i32.const 2) (i32.const 2)))
    (drop (call $reg (i32.const 24) (i32.const 4) (i32.const 3)))
    (drop (call $reg (i32.const 32) (i32.const 5) (i32.const 4)))))"#;

fn load(sb: &mut Sandbox, p: PrincipalId) -> ModuleId {
    let code = wat(TX_WAT);
    let cred = admin(p);
    let spec = LoadSpec {
        code: &code,
        credential: Some(cred.to_bytes()),
        requester: None,
        local_name: None,
        limits: Default::default(),
    };
    sb.load(now(0), &spec).unwrap()
}

fn call(sb: &mut Sandbox, m: ModuleId, entry: &str, arg: i32, input: &[u8]) -> (i32, Vec<Action>) {
    let mut out = Vec::new();
    let job = Job::new(m, JobKind::Entry { entry: entry.into(), arg }, input.to_vec(), 0);
    (run_job(sb, job, &mut out).unwrap(), out)
}

fn tx(sb: &mut Sandbox, m: ModuleId, h: i32, bps: i64) -> i32 {
    call(sb, m, "tx", h, &bps.to_le_bytes()).0
}

fn other() -> PrincipalId {
    PrincipalId([7; 32])
}

#[test]
fn a_channel_reserves_part_of_its_sessions_transmit_reservation_and_sends_as_its_own_flow() {
    let mut sb = sandbox();
    let p = user();
    let m = load(&mut sb, p);
    let h1 = call(&mut sb, m, "open", 5000, b"").0;
    let h2 = call(&mut sb, m, "open", 5001, b"").0;
    assert!(h1 >= 0 && h2 >= 0 && h1 != h2);
    let (f1, f2) = (Flow { module: m.0, handle: h1 }, Flow { module: m.0, handle: h2 });
    // Without a session reservation there is nothing to carve from.
    assert_eq!(tx(&mut sb, m, h1, 1), E_LIMIT);
    sb.set_session_tx(p, Some(1000));
    assert_eq!(tx(&mut sb, m, h1, 600), 0);
    assert_eq!(tx(&mut sb, m, h2, 500), E_LIMIT, "600 + 500 is over the session's 1,000");
    assert_eq!(tx(&mut sb, m, h2, 400), 0);
    assert_eq!(tx(&mut sb, m, 99, 1), E_NOTFOUND, "not a channel of the module");
    assert_eq!(tx(&mut sb, m, h1, -1), E_INVAL);
    assert_eq!(sb.flow_tx(&p, Some(f1)), (1000, 600));
    assert_eq!(sb.flow_tx(&p, Some(f2)), (1000, 400));
    assert_eq!(sb.tx_book(&p).unwrap().rest(), 0);
    // Sends on a channel carry its flow; on no channel, nothing is sent.
    let (r, out) = call(&mut sb, m, "send", h1, b"");
    assert_eq!(r, 0);
    match out.as_slice() {
        [Action::SendPacket { principal, port: 4001, payload, flow: Some(f), .. }] => {
            assert_eq!((*principal, payload.as_slice(), *f), (p, &b"ping"[..], f1));
        }
        other => panic!("{other:?}"),
    }
    let (r, out) = call(&mut sb, m, "send", 99, b"");
    assert_eq!((r, out.len()), (E_NOTFOUND, 0));
    // Closing a channel gives its reservation back to the session.
    assert_eq!(call(&mut sb, m, "close", h1, b"").0, 0);
    assert_eq!(sb.flow_tx(&p, Some(f1)), (400, 0));
    assert_eq!(sb.tx_book(&p).unwrap().rest(), 600);
    assert_eq!(call(&mut sb, m, "send", h1, b"").0, E_NOTFOUND, "a closed channel sends nothing");
    // A lowered session reservation releases channels until they fit.
    let h3 = call(&mut sb, m, "open", 5002, b"").0;
    assert_eq!(tx(&mut sb, m, h3, 200), 0);
    sb.set_session_tx(p, Some(450));
    let book = sb.tx_book(&p).unwrap();
    assert_eq!(book.channels().collect::<Vec<_>>(), vec![(f2, 400)], "the last to ask (h3) went first");
    assert_eq!((book.rest(), book.released()), (50, 1));
    // Another principal's book is its own.
    let q = other();
    let mq = load(&mut sb, q);
    let hq = call(&mut sb, mq, "open", 5003, b"").0;
    assert_eq!(tx(&mut sb, mq, hq, 1), E_LIMIT, "q has no session reservation");
    sb.set_session_tx(q, Some(5000));
    assert_eq!(tx(&mut sb, mq, hq, 5000), 0);
    assert_eq!(sb.flow_tx(&p, Some(f2)), (400, 400), "p's book unchanged");
    // Unloading a module gives back its channels' reservations.
    assert!(sb.unload(m));
    assert_eq!(sb.flow_tx(&p, Some(f2)), (0, 0));
    assert_eq!(sb.tx_book(&p).map(|b| b.rest()), Some(450));
    assert_eq!(sb.flow_tx(&q, Some(Flow { module: mq.0, handle: hq })), (5000, 5000));
}
