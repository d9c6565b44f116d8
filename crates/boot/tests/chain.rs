//! The boot chain under attack: the eleven attacks of the TUF
//! specification (§1.5.2), each as a test, and the node-specific ones
//! (corrupted binary, a file swapped after verification, bad, old and
//! stalling recovery sources, a recovery loop ended by policy). Each ends in
//! a typed error with nothing half-applied: no state recorded, no file
//! written that did not verify.
#![allow(clippy::unwrap_used)]

mod common;

use anode_boot::boot::{BootError, BootEvent, Policy, SNAPSHOT, STATE, TARGETS, TIMESTAMP, boot};
use anode_boot::recovery::{ErrorCode, FetchError};
use anode_boot::sign::{self, Targets};
use anode_boot::verify::{Limits, MetadataError, MetadataInput, Role, verify_metadata};
use anode_boot::{BootState, ChainBuilder, ChainError, ComponentError, Layer, Verdict};
use common::*;
use std::collections::BTreeMap;

fn run(
    io: &mut MemIo,
    sources: Vec<Box<dyn anode_boot::Source>>,
    policy: Policy,
) -> Result<anode_boot::BootOutcome, BootError> {
    let mut sources = sources;
    boot(io, &mut sources, &params(policy), now())
}

/// Nothing was recorded or stored.
fn untouched(io: &MemIo) {
    assert!(io.writes.is_empty(), "nothing half-applied, but wrote {:?}", io.writes);
    assert!(!io.boot.contains_key(STATE));
}

fn input(p: &common::Published) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
    (p.root.clone(), p.timestamp.clone(), p.snapshot.clone(), p.targets.clone())
}

fn verify(p: &common::Published, prior: Option<&BootState>) -> Result<anode_boot::Trusted, MetadataError> {
    let (r, t, s, g) = input(p);
    verify_metadata(
        &MetadataInput { root: &r, root_updates: &[], timestamp: &t, snapshot: &s, targets: &g },
        prior,
        "b",
        now(),
        &Limits::default(),
    )
}

#[test]
fn a_good_chain_boots_layer_by_layer_and_records_its_state() {
    let p = repo(1);
    let mut io = MemIo::installed(&p);
    let out = run(&mut io, vec![], Policy::Refuse).unwrap();
    let layers: Vec<Layer> = out.chain.report().iter().map(|r| r.name.layer).collect();
    let mut sorted = layers.clone();
    sorted.sort();
    assert_eq!(layers, sorted, "reported in layer order");
    assert_eq!(layers.len(), 7);
    assert!(out.chain.report().iter().all(|r| r.verdict == Verdict::Verified));
    assert_eq!(out.chain.get(Layer::Config, "node.toml").unwrap(), &p.files["b/config/node.toml"][..]);
    assert_eq!(io.writes, vec![STATE.to_string()]);
    let s = BootState::parse(&io.boot[STATE]).unwrap();
    assert_eq!((s.root, s.timestamp, s.snapshot, s.targets), (1, 1, 1, 1));
    assert!(out.events.iter().any(|e| matches!(e, BootEvent::FirstBoot)));
    assert!(out.events.iter().any(|e| matches!(e, BootEvent::StateRecorded([1, 1, 1, 1]))));
}

// ------------------------------------------------------------ TUF §1.5.2

#[test]
fn tuf_arbitrary_installation() {
    // An attacker replaces a component with bytes of its choice...
    let p = repo(1);
    let mut io = MemIo::installed(&p);
    io.set("b/switchlets/mods/counter.wasm", b"\0asm evil!!!!!!!!!");
    let e = run(&mut io, vec![], Policy::Refuse).unwrap_err();
    assert!(matches!(e, BootError::Component { error: ComponentError::Length { .. } }), "{e}");
    untouched(&io);
    // ...or with bytes of the same length.
    let mut io = MemIo::installed(&p);
    let mut evil = p.files["b/switchlets/mods/counter.wasm"].clone();
    evil[0] ^= 0xff;
    io.set("b/switchlets/mods/counter.wasm", &evil);
    let e = run(&mut io, vec![], Policy::Refuse).unwrap_err();
    assert!(matches!(e, BootError::Component { error: ComponentError::Hash { .. } }), "{e}");
    untouched(&io);
    // ...or signs its own targets metadata: its key is not a targets key.
    let keys = Keys::new();
    let mut t = Targets::new();
    t.add(&name("b/switchlets/mods/counter.wasm"), b"\0asm evil").unwrap();
    let forged = t.sign(2, now() + 30 * DAY, &[&id(99), &id(98)]).unwrap();
    let snap = sign::snapshot(2, now() + 30 * DAY, &forged, &[&keys.snapshot]).unwrap();
    let ts = sign::timestamp(2, now() + 30 * DAY, &snap, &[&keys.timestamp]).unwrap();
    let forged = common::Published { targets: forged, snapshot: snap, timestamp: ts, ..p.clone() };
    assert!(matches!(
        verify(&forged, None),
        Err(MetadataError::BelowThreshold { role: Role::Targets, valid: 0, threshold: 2 })
    ));
}

#[test]
fn tuf_endless_data() {
    let p = repo(1);
    // Metadata larger than its bound is refused before it is parsed.
    let mut io = MemIo::installed(&p);
    io.boot.insert(TIMESTAMP.into(), vec![b' '; Limits::default().timestamp + 1]);
    let e = run(&mut io, vec![], Policy::Refuse).unwrap_err();
    assert!(matches!(e, BootError::Metadata(MetadataError::TooLarge { role: Role::Timestamp, .. })), "{e}");
    untouched(&io);
    // A component file that goes on and on is read to its signed length + 1 only.
    let mut io = MemIo::installed(&p);
    let signed = p.files["b/config/node.toml"].len() as u64;
    io.set("b/config/node.toml", &vec![b'#'; 10 << 20]);
    let e = run(&mut io, vec![], Policy::Refuse).unwrap_err();
    assert!(
        matches!(e, BootError::Component { error: ComponentError::Length { found, .. } } if found == signed + 1),
        "{e}"
    );
    // A repository announcing endless data is cut off at the first reply.
    let mut io = MemIo::installed(&p);
    io.set("b/config/node.toml", b"broken");
    let clock = io.clock.clone();
    let src = MemSource::new("endless", &p, Behaviour::Endless, &clock);
    let requests = src.requests.clone();
    let e = run(&mut io, vec![src.boxed()], Policy::Recover).unwrap_err();
    let BootError::Unrecovered { recovery: FetchError::GaveUp { attempts: 3, last }, .. } = e else { panic!("{e}") };
    assert!(matches!(*last, FetchError::Size { total: 4294967295, .. }));
    assert_eq!(requests.get(), 3, "one request per attempt, then the attempt ends");
    untouched(&io);
}

#[test]
fn tuf_extraneous_dependencies() {
    let p = repo(1);
    let mut io = MemIo::installed(&p);
    // An extra module dropped next to the node's files is never read or
    // handed out: only what the signed targets list is in the chain.
    io.set("b/switchlets/mods/extra.wasm", b"\0asm extra");
    let out = run(&mut io, vec![], Policy::Refuse).unwrap();
    assert_eq!(
        out.chain.get(Layer::Switchlets, "mods/extra.wasm"),
        Err(ChainError::NotInChain("b/switchlets/mods/extra.wasm".into()))
    );
    assert!(matches!(out.chain.find("mods/extra.wasm"), Err(ChainError::NotInChain(_))));
    // Offering an unlisted component to the chain is refused.
    let t = verify(&p, None).unwrap();
    let mut c = ChainBuilder::new(t);
    let e = c.offer(&name("b/binary/extra"), b"x".to_vec()).unwrap_err();
    assert_eq!(e, ChainError::Component(ComponentError::NotInMetadata("b/binary/extra".into())));
}

#[test]
fn tuf_fast_forward() {
    let keys = Keys::new();
    let p = repo(3);
    // Without the keys, versions cannot be pushed ahead: a timestamp of
    // version 1000 signed by another key is refused and moves nothing.
    let ff = sign::timestamp(1000, now() + 30 * DAY, &p.snapshot, &[&id(66)]).unwrap();
    let forged = common::Published { timestamp: ff, ..p.clone() };
    assert!(matches!(verify(&forged, None), Err(MetadataError::BelowThreshold { role: Role::Timestamp, .. })));
    // A snapshot naming a targets version far ahead of the real targets: refused.
    let snap = {
        let mut t = Targets::new();
        t.add(&name("b/config/node.toml"), b"x").unwrap();
        let far = t.sign(9999, now() + 30 * DAY, &[&keys.targets[0], &keys.targets[1]]).unwrap();
        sign::snapshot(4, now() + 30 * DAY, &far, &[&keys.snapshot]).unwrap()
    };
    let ts = sign::timestamp(4, now() + 30 * DAY, &snap, &[&keys.timestamp]).unwrap();
    let mixed = common::Published { snapshot: snap, timestamp: ts, ..p.clone() };
    assert!(matches!(verify(&mixed, None), Err(MetadataError::HashMismatch { role: Role::Targets })));
    // With the timestamp key compromised, a node that trusted version 1000
    // refuses the real version 3 (rollback)...
    let ff = sign::timestamp(1000, now() + 30 * DAY, &p.snapshot, &[&keys.timestamp]).unwrap();
    let after_attack = verify(&common::Published { timestamp: ff, ..p.clone() }, None).unwrap();
    let state = after_attack.new_state().clone();
    assert_eq!(state.timestamp, 1000);
    assert!(matches!(
        verify(&p, Some(&state)),
        Err(MetadataError::Rollback { role: Role::Timestamp, trusted: 1000, new: 3 })
    ));
    // ...until the operator rotates the timestamp key (root v2): the
    // versions trusted under the old key are forgotten (TUF §5.3.11).
    let mut rotated = Keys::new();
    rotated.timestamp = id(77);
    let root2 = sign::root(&rotated.spec(2), &[&keys.root[0], &keys.root[1]]).unwrap();
    let ts = sign::timestamp(4, now() + 30 * DAY, &p.snapshot, &[&rotated.timestamp]).unwrap();
    let updates = vec![root2];
    let t = verify_metadata(
        &MetadataInput {
            root: &p.root,
            root_updates: &updates,
            timestamp: &ts,
            snapshot: &p.snapshot,
            targets: &p.targets,
        },
        Some(&state),
        "b",
        now(),
        &Limits::default(),
    )
    .unwrap();
    assert_eq!(t.new_state().timestamp, 4);
    assert!(t.notices().iter().any(|n| matches!(n, anode_boot::verify::Notice::KeysRotated { role: Role::Timestamp })));
}

#[test]
fn tuf_indefinite_freeze() {
    let stale = publish(&Keys::new(), 1, components("v1"), now() - DAY);
    let mut io = MemIo::installed(&stale);
    let e = run(&mut io, vec![], Policy::Refuse).unwrap_err();
    assert!(matches!(e, BootError::Metadata(MetadataError::Expired { role: Role::Timestamp, .. })), "{e}");
    untouched(&io);
    // A clock set back does not revive it: the latest known time is used.
    let p = publish(&Keys::new(), 1, components("v1"), now() + DAY);
    let prior = BootState {
        format: 1,
        latest_known_time: (now() + 2 * DAY).duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64,
        ..BootState::default()
    };
    assert!(matches!(verify(&p, Some(&prior)), Err(MetadataError::Expired { role: Role::Timestamp, .. })));
    // An expired root is a freeze too.
    let keys = Keys::new();
    let mut spec = keys.spec(1);
    spec.expires = now() - DAY;
    let old_root = sign::root(&spec, &[&keys.root[0], &keys.root[1]]).unwrap();
    let p = common::Published { root: old_root, ..repo(1) };
    assert!(matches!(verify(&p, None), Err(MetadataError::Expired { role: Role::Root, .. })));
}

#[test]
fn tuf_malicious_mirrors_preventing_updates() {
    // The node trusted version 2; its local metadata is gone. The first
    // mirror serves the still-valid version 1 (to keep it from updating),
    // the second serves version 2.
    let v1 = repo(1);
    let v2 = repo(2);
    let mut io = MemIo::installed(&v2);
    let state = verify(&v2, None).unwrap().new_state().clone();
    io.boot.insert(STATE.into(), state.to_bytes());
    io.boot.remove(TIMESTAMP);
    let clock = io.clock.clone();
    let bad = MemSource::new("old mirror", &v1, Behaviour::Good, &clock);
    let good = MemSource::new("good mirror", &v2, Behaviour::Good, &clock);
    let out = run(&mut io, vec![bad.boxed(), good.boxed()], Policy::Recover).unwrap();
    let refused: Vec<&BootEvent> =
        out.events.iter().filter(|e| matches!(e, BootEvent::MetadataSourceRefused { .. })).collect();
    assert_eq!(refused.len(), 1);
    assert!(format!("{refused:?}").contains("rollback"), "{refused:?}");
    assert!(out.events.iter().any(|e| matches!(e, BootEvent::MetadataRecovered { source } if source == "good mirror")));
    assert_eq!(io.boot[TIMESTAMP], v2.timestamp, "the good metadata was stored");
    // With only the old mirror, the node refuses to start, naming both failures.
    let mut io = MemIo::installed(&v2);
    io.boot.insert(STATE.into(), state.to_bytes());
    io.boot.remove(TIMESTAMP);
    let clock = io.clock.clone();
    let e = run(&mut io, vec![MemSource::new("old mirror", &v1, Behaviour::Good, &clock).boxed()], Policy::Recover)
        .unwrap_err();
    assert!(matches!(e, BootError::MetadataUnrecovered { .. }), "{e}");
    assert!(io.writes.is_empty());
}

#[test]
fn tuf_mix_and_match() {
    let v1 = repo(1);
    let v2 = repo(2);
    // Targets of version 2 with snapshot and timestamp of version 1.
    let mixed = common::Published { targets: v2.targets.clone(), ..v1.clone() };
    assert!(matches!(verify(&mixed, None), Err(MetadataError::HashMismatch { role: Role::Targets })));
    // Snapshot of version 1 under timestamp of version 2.
    let mixed = common::Published { snapshot: v1.snapshot.clone(), ..v2.clone() };
    assert!(matches!(verify(&mixed, None), Err(MetadataError::HashMismatch { role: Role::Snapshot })));
    // Components of version 1 with metadata of version 2.
    let mut io = MemIo::installed(&v2);
    io.set("b/switchlets/mods/counter.wasm", &v1.files["b/switchlets/mods/counter.wasm"]);
    assert!(matches!(
        run(&mut io, vec![], Policy::Refuse),
        Err(BootError::Component { error: ComponentError::Hash { .. } })
    ));
    untouched(&io);
}

#[test]
fn tuf_rollback() {
    let v1 = repo(1);
    let v2 = repo(2);
    let state = verify(&v2, None).unwrap().new_state().clone();
    let mut io = MemIo::installed(&v1);
    io.boot.insert(STATE.into(), state.to_bytes());
    let e = run(&mut io, vec![], Policy::Refuse).unwrap_err();
    assert!(
        matches!(e, BootError::Metadata(MetadataError::Rollback { role: Role::Timestamp, trusted: 2, new: 1 })),
        "{e}"
    );
    assert!(io.writes.is_empty());
    // A valid timestamp v3 that names the old snapshot v1 is a rollback too (TUF §5.2.2.2).
    let keys = Keys::new();
    let ts = sign::timestamp(3, now() + 30 * DAY, &v1.snapshot, &[&keys.timestamp]).unwrap();
    let p = common::Published { timestamp: ts, ..v1.clone() };
    assert!(matches!(
        verify(&p, Some(&state)),
        Err(MetadataError::Rollback { role: Role::Snapshot, trusted: 2, new: 1 })
    ));
    // A root rotation back to an older version is refused.
    let root0 = sign::root(&keys.spec(1), &[&keys.root[0], &keys.root[1]]).unwrap();
    let (t, s, g) = (v2.timestamp.clone(), v2.snapshot.clone(), v2.targets.clone());
    let later = BootState { root: 2, ..state };
    let r = verify_metadata(
        &MetadataInput { root: &root0, root_updates: &[], timestamp: &t, snapshot: &s, targets: &g },
        Some(&later),
        "b",
        now(),
        &Limits::default(),
    );
    assert!(matches!(r, Err(MetadataError::Rollback { role: Role::Root, trusted: 2, new: 1 })));
}

#[test]
fn tuf_slow_retrieval() {
    let p = repo(1);
    // A source that never answers: each attempt ends at the request timeout.
    let mut io = MemIo::installed(&p);
    io.set("b/switchlets/mods/counter.wasm", b"bad");
    let clock = io.clock.clone();
    let e =
        run(&mut io, vec![MemSource::new("stall", &p, Behaviour::Stall, &clock).boxed()], Policy::Recover).unwrap_err();
    let BootError::Unrecovered { recovery: FetchError::GaveUp { attempts: 3, last }, .. } = e else { panic!("{e}") };
    assert!(matches!(*last, FetchError::Timeout { ms: 1_000, .. }), "{last}");
    untouched(&io);
    // A source that answers the first chunk and then dribbles: the attempt
    // deadline ends it even though each request is "only" slow.
    let mut big = components("v1");
    big.insert("b/switchlets/mods/counter.wasm".into(), vec![9u8; 5000]);
    let p = publish(&Keys::new(), 1, big, now() + 30 * DAY);
    let mut io = MemIo::installed(&p);
    io.set("b/switchlets/mods/counter.wasm", b"bad");
    let clock = io.clock.clone();
    let e = run(&mut io, vec![MemSource::new("dribble", &p, Behaviour::Dribble, &clock).boxed()], Policy::Recover)
        .unwrap_err();
    let BootError::Unrecovered { recovery: FetchError::GaveUp { last, .. }, .. } = e else { panic!("{e}") };
    assert!(matches!(*last, FetchError::Timeout { .. } | FetchError::Deadline { .. }), "{last}");
    untouched(&io);
}

#[test]
fn tuf_compromised_key_below_threshold() {
    let keys = Keys::new();
    let p = repo(1);
    // One of the two targets keys is compromised: its signature alone is not enough.
    let mut t = Targets::new();
    t.add(&name("b/config/node.toml"), b"evil").unwrap();
    let one = t.sign(2, now() + 30 * DAY, &[&keys.targets[0]]).unwrap();
    let snap = sign::snapshot(2, now() + 30 * DAY, &one, &[&keys.snapshot]).unwrap();
    let ts = sign::timestamp(2, now() + 30 * DAY, &snap, &[&keys.timestamp]).unwrap();
    let forged = common::Published { targets: one, snapshot: snap, timestamp: ts, ..p.clone() };
    assert!(matches!(
        verify(&forged, None),
        Err(MetadataError::BelowThreshold { role: Role::Targets, valid: 1, threshold: 2 })
    ));
    // One root key of three (threshold two) cannot rotate the root to the attacker's keys.
    let mut evil = Keys::new();
    evil.root = vec![id(90), id(91), id(92)];
    evil.targets = vec![id(93), id(94)];
    let root2 = sign::root(&evil.spec(2), &[&keys.root[0], &evil.root[0], &evil.root[1]]).unwrap();
    let updates = vec![root2];
    let r = verify_metadata(
        &MetadataInput {
            root: &p.root,
            root_updates: &updates,
            timestamp: &p.timestamp,
            snapshot: &p.snapshot,
            targets: &p.targets,
        },
        None,
        "b",
        now(),
        &Limits::default(),
    );
    assert!(matches!(r, Err(MetadataError::BelowThreshold { role: Role::Root, valid: 1, threshold: 2 })), "{r:?}");
}

#[test]
fn tuf_wrong_software_installation() {
    let p = repo(1);
    // Node c's valid configuration installed on node b.
    let mut io = MemIo::installed(&p);
    io.set("b/config/node.toml", &p.files["c/config/node.toml"]);
    let e = run(&mut io, vec![], Policy::Refuse).unwrap_err();
    assert!(
        matches!(&e, BootError::Component { error: ComponentError::WrongComponent { other, .. } } if other == "c/config/node.toml"),
        "{e}"
    );
    untouched(&io);
    // A valid component of another layer in the binary's place.
    let mut io = MemIo::installed(&p);
    io.set("b/binary/anode", &p.files["b/monitor/mods/flows.wasm"]);
    let e = run(&mut io, vec![], Policy::Refuse).unwrap_err();
    assert!(
        matches!(&e, BootError::Component { error: ComponentError::WrongComponent { other, .. } } if other == "b/monitor/mods/flows.wasm"),
        "{e}"
    );
    // Metadata for a node that is not in it.
    let (r, t, s, g) = input(&p);
    let e = verify_metadata(
        &MetadataInput { root: &r, root_updates: &[], timestamp: &t, snapshot: &s, targets: &g },
        None,
        "z",
        now(),
        &Limits::default(),
    );
    assert_eq!(e.err(), Some(MetadataError::NoTargetsForNode("z".into())));
}

// ------------------------------------------------------------ the node's own

#[test]
fn corrupted_binary_digest_stops_the_chain_at_layer_one() {
    let p = repo(1);
    for policy in [Policy::Refuse, Policy::Recover, Policy::Degraded] {
        let mut io = MemIo::installed(&p);
        let mut b = p.files["b/binary/anode"].clone();
        b[3] ^= 1;
        io.set("b/binary/anode", &b);
        let e = run(&mut io, vec![], policy).unwrap_err();
        match (policy, &e) {
            (Policy::Refuse, BootError::Component { error: ComponentError::Hash { name, .. } }) => {
                assert_eq!(name, "b/binary/anode")
            }
            (_, BootError::Unrecovered { error: ComponentError::Hash { .. }, recovery: FetchError::NoSource }) => {}
            _ => panic!("{policy:?}: {e}"),
        }
        untouched(&io);
    }
}

#[test]
fn layers_are_settled_in_order() {
    let p = repo(1);
    let mut c = ChainBuilder::new(verify(&p, None).unwrap());
    let e = c.offer(&name("b/switchlets/mods/counter.wasm"), p.files["b/switchlets/mods/counter.wasm"].clone());
    assert_eq!(
        e,
        Err(ChainError::OutOfOrder { name: "b/switchlets/mods/counter.wasm".into(), pending: Layer::Binary })
    );
    assert!(matches!(c.skip(&name("b/config/node.toml"), "x"), Err(ChainError::Essential(_))));
    assert!(matches!(c.finish(), Err(ChainError::Unsettled(_))));
}

#[test]
fn recovery_from_a_bad_an_old_and_a_stalling_source() {
    let v1 = repo(1);
    let v2 = repo(2);
    let mut io = MemIo::installed(&v2);
    io.set("b/switchlets/mods/counter.wasm", b"corrupted on disk");
    let clock = io.clock.clone();
    let sources = vec![
        MemSource::new("corrupt", &v2, Behaviour::Corrupt, &clock).boxed(),
        MemSource::new("old", &v1, Behaviour::Good, &clock).boxed(),
        MemSource::new("stall", &v2, Behaviour::Stall, &clock).boxed(),
        MemSource::new("good", &v2, Behaviour::Good, &clock).boxed(),
    ];
    let mut params = params(Policy::Recover);
    params.fetch.max_attempts = 4;
    let mut sources = sources;
    let out = boot(&mut io, &mut sources, &params, now()).unwrap();
    let line = out.chain.report().iter().find(|r| r.name.file == "mods/counter.wasm").unwrap();
    assert!(matches!(&line.verdict, Verdict::Recovered { source, .. } if source == "good"), "{:?}", line.verdict);
    let fails: Vec<String> = out
        .events
        .iter()
        .filter_map(|e| match e {
            BootEvent::Fetch { event: anode_boot::recovery::FetchEvent::AttemptFailed(f), .. } => Some(f.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(fails.len(), 3, "{fails:?}");
    assert!(fails[0].contains("failed verification") && fails[1].contains("failed verification"), "{fails:?}");
    assert!(fails[2].contains("slow retrieval"), "{fails:?}");
    assert_eq!(io.files["b/switchlets/mods/counter.wasm"], v2.files["b/switchlets/mods/counter.wasm"], "stored");
    assert_eq!(
        io.writes,
        vec!["b/switchlets/mods/counter.wasm".to_string(), STATE.to_string()],
        "only the verified copy and the state"
    );
}

#[test]
fn a_recovery_loop_is_ended_by_the_policy() {
    let p = repo(1);
    let setup = || {
        let mut io = MemIo::installed(&p);
        io.set("b/switchlets/mods/counter.wasm", b"bad");
        let clock = io.clock.clone();
        let src = MemSource::new("corrupt", &p, Behaviour::Corrupt, &clock);
        (io, src)
    };
    // recover: after max_attempts bad copies the node refuses to start.
    let (mut io, src) = setup();
    let requests = src.requests.clone();
    let e = run(&mut io, vec![src.boxed()], Policy::Recover).unwrap_err();
    assert!(matches!(e, BootError::Unrecovered { recovery: FetchError::GaveUp { attempts: 3, .. }, .. }), "{e}");
    assert_eq!(requests.get(), 3);
    untouched(&io);
    // degraded: the switchlet is left out and the node starts without it.
    let (mut io, src) = setup();
    let out = run(&mut io, vec![src.boxed()], Policy::Degraded).unwrap();
    assert!(out.chain.degraded());
    assert_eq!(
        out.chain.get(Layer::Switchlets, "mods/counter.wasm"),
        Err(ChainError::Skipped("b/switchlets/mods/counter.wasm".into()))
    );
    assert!(out.events.iter().any(|e| matches!(e, BootEvent::Skipped { .. })));
    assert_eq!(io.files["b/switchlets/mods/counter.wasm"], b"bad", "the bad copy is not replaced by a bad copy");
    // degraded, but an essential layer: refused.
    let mut io = MemIo::installed(&p);
    io.set("b/config/node.toml", b"bad");
    let clock = io.clock.clone();
    let e = run(&mut io, vec![MemSource::new("corrupt", &p, Behaviour::Corrupt, &clock).boxed()], Policy::Degraded)
        .unwrap_err();
    assert!(matches!(e, BootError::Unrecovered { .. }), "{e}");
    untouched(&io);
}

#[test]
fn a_secret_is_never_fetched() {
    let p = repo(1);
    let mut io = MemIo::installed(&p);
    io.set("b/keys/keys/b.key", b"anode-ed25519-secret-v1 0000");
    let clock = io.clock.clone();
    let src = MemSource::new("good", &p, Behaviour::Good, &clock);
    let requests = src.requests.clone();
    let e = run(&mut io, vec![src.boxed()], Policy::Degraded).unwrap_err();
    assert!(matches!(e, BootError::Unrecovered { recovery: FetchError::Secret, .. }), "{e}");
    assert_eq!(requests.get(), 0);
    // And a repository refuses to serve one.
    let mut files = BTreeMap::new();
    files.insert("b/keys/keys/b.key".to_string(), p.files["b/keys/keys/b.key"].clone());
    let dir = std::env::temp_dir().join(format!("anode-boot-secret-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("targets/b/keys/keys")).unwrap();
    std::fs::write(dir.join("targets/b/keys/keys/b.key"), &p.files["b/keys/keys/b.key"]).unwrap();
    let mut m = anode_boot::fsio::MirrorSource::new(&dir);
    let req = anode_boot::recovery::Repr::Fetch { id: 1, offset: 0, max: 100, name: "b/keys/keys/b.key" }.to_vec();
    let reply = anode_boot::Source::exchange(&mut m, &req).unwrap();
    assert_eq!(
        anode_boot::recovery::parse(&reply),
        Ok(anode_boot::recovery::Repr::Error { id: 1, code: ErrorCode::Refused })
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupted_state_file() {
    let p = repo(1);
    let mut io = MemIo::installed(&p);
    io.boot.insert(STATE.into(), b"{ not json".to_vec());
    assert!(matches!(run(&mut io, vec![], Policy::Refuse), Err(BootError::State(_))));
    let mut io = MemIo::installed(&p);
    io.boot.insert(STATE.into(), b"{ not json".to_vec());
    let out = run(&mut io, vec![], Policy::Recover).unwrap();
    assert!(out.events.iter().any(|e| matches!(e, BootEvent::StateIgnored(_))));
}

#[test]
fn missing_metadata_is_recovered_and_stored_only_when_good() {
    let p = repo(1);
    let mut io = MemIo::installed(&p);
    io.boot.remove(SNAPSHOT);
    io.boot.remove(TARGETS);
    let clock = io.clock.clone();
    let out = run(&mut io, vec![MemSource::new("m", &p, Behaviour::Good, &clock).boxed()], Policy::Recover).unwrap();
    assert!(out.events.iter().any(|e| matches!(e, BootEvent::MetadataRecovered { .. })));
    assert_eq!(io.boot[SNAPSHOT], p.snapshot);
    assert_eq!(io.boot[TARGETS], p.targets);
    // No root anchor: nothing to verify against.
    let mut io = MemIo::installed(&p);
    io.boot.remove("root.json");
    assert_eq!(run(&mut io, vec![], Policy::Recover).unwrap_err(), BootError::NoRoot);
}
