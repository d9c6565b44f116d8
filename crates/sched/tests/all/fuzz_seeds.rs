//! Replays the sched fuzz targets over their seeds plus deterministic
//! mutations, as an ordinary test. `ANODE_BLESS=1` rewrites the seeds under
//! `fuzz/seeds/sched_*`.

use anode_sched::fuzzing;
use anode_sched::wire::{ErrorCode, Reply, Request};
use anode_sched::{ReserveRequest, SessionId, VpId, VpOp, VpParams};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn control_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let p = VpParams { slice_ns: 400_000, period_ns: 4_000_000, extra: false };
    let s = SessionId::from_raw(1 << 32 | 2);
    let v = VpId::from_raw(1 << 32 | 2);
    let res = ReserveRequest { vps: vec![VpOp::Add(p)], heap_bytes: Some(4096), ..ReserveRequest::default() };
    let reqs = [
        ("open", Request::Open { credential: b"credential".to_vec(), reservation: res.clone() }),
        (
            "reserve",
            Request::Reserve {
                session: s,
                reservation: ReserveRequest {
                    vps: vec![VpOp::Change(v, p), VpOp::Remove(VpId::from_raw(3)), VpOp::Add(p)],
                    tx_bytes_per_sec: Some(1000),
                    rx_bytes_per_sec: Some(1000),
                    ..ReserveRequest::default()
                },
            },
        ),
        ("close", Request::Close { session: s }),
        ("list", Request::List),
        ("show", Request::Show { session: s }),
    ];
    let mut v: Vec<(&str, Vec<u8>)> = reqs.iter().map(|(n, r)| (*n, r.to_bytes().unwrap())).collect();
    v.push(("granted", Reply::Granted { session: s, added: vec![VpId::from_raw(5)] }.to_bytes().unwrap()));
    v.push(("error", Reply::Error { code: ErrorCode::VpNotYours, detail: 9 }.to_bytes().unwrap()));
    // A stream for control_apply: (principal selector, message) pairs.
    let mut stream = Vec::new();
    for (sel, (_, r)) in [(1u8, &reqs[0]), (2, &reqs[0]), (1, &reqs[1]), (1, &reqs[3]), (2, &reqs[2]), (3, &reqs[4])] {
        stream.push(sel);
        stream.extend(r.to_bytes().unwrap());
    }
    v.push(("stream", stream));
    // A VP outside the bounds that asks for slack: its bad-VP reply must
    // parse back to itself (a crash `sched_control` found: the reply kept
    // the extra flag, which its bytes do not carry).
    let bad = VpParams { slice_ns: 734_439_409_178, period_ns: 1 << 63 | 16_400_169, extra: true };
    let open_bad = Request::Open {
        credential: b"credential".to_vec(),
        reservation: ReserveRequest { vps: vec![VpOp::Add(bad)], ..ReserveRequest::default() },
    };
    let mut stream = vec![1u8];
    stream.extend(open_bad.to_bytes().unwrap());
    v.push(("stream_bad_vp_extra", stream));
    v
}

const TRACE: &str = "# steal_ticks=3\nsource,load,period,start_ns,length_ns,slice_ns,received_ns,share\nlinux-deadline,B,0,3000000000,4000000,400000,400120,0.100030\nanode,A,0,0,100000000,0,95000000,0.950000\n";

fn mutate(seed: &[u8], f: &mut impl FnMut(&[u8])) {
    f(seed);
    for i in 0..seed.len() * 8 {
        let mut m = seed.to_vec();
        m[i / 8] ^= 1 << (i % 8);
        f(&m);
    }
    for cut in 0..seed.len() {
        f(&seed[..cut]);
    }
}

#[test]
fn seeds_and_mutations() {
    let bless = std::env::var_os("ANODE_BLESS").is_some();
    for (name, bytes) in control_seeds() {
        if bless {
            let dir = root().join("fuzz/seeds/sched_control");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(name), &bytes).unwrap();
        }
        mutate(&bytes, &mut |b| {
            fuzzing::control_parse(b);
            fuzzing::control_apply(b);
        });
    }
    if bless {
        let dir = root().join("fuzz/seeds/sched_trace");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("trace.csv"), TRACE).unwrap();
    }
    mutate(TRACE.as_bytes(), &mut |b| fuzzing::trace_parse(b));
}

#[test]
fn committed_seeds_replay() {
    for (target, f) in [
        (
            "sched_control",
            (|b: &[u8]| {
                fuzzing::control_parse(b);
                fuzzing::control_apply(b);
            }) as fn(&[u8]),
        ),
        ("sched_trace", fuzzing::trace_parse as fn(&[u8])),
    ] {
        let dir = root().join("fuzz/seeds").join(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut n = 0;
        for e in entries {
            f(&std::fs::read(e.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n > 0, "no seeds in {}", dir.display());
    }
}
