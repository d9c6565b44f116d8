//! Entry points for the fuzz targets (also run over the seeds as tests).

use std::io::Cursor;

use crate::capture::{CaptureReader, Frame, LinkType};
use crate::cryptopan::{Anonymizer, CryptoPan};
use crate::parse::parse;
use crate::policy::{Clause, ExportRights, PAYLOAD_ALL, Policy, PolicyLimits, Prefix};
use crate::view::ViewBuilder;
use anode_cred::PrincipalId;
use anode_monitor_apps::abi::{Field, View};

/// Bytes as a pcap or pcapng file: every frame is parsed; reading stops at
/// the first error. Must not panic, and must not buffer more than the bound.
pub fn capture(data: &[u8]) {
    let Ok(mut r) = CaptureReader::new(Cursor::new(data)) else { return };
    let mut n = 0u32;
    while let Ok(Some(f)) = r.next_frame() {
        let _ = parse(&f);
        n += 1;
        if n > 100_000 {
            break;
        }
    }
}

/// A restrictive policy: ports and flags only, 8 payload bytes, every address anonymized.
fn policy(admin: bool) -> Policy {
    let fields = [Field::Ts, Field::Sport, Field::Dport, Field::TcpFlags, Field::Src, Field::Dst];
    Policy {
        principal: PrincipalId([7; 32]),
        admin,
        filter: crate::policy::Filter { clauses: if admin { vec![] } else { vec![Clause::Proto(vec![6, 17])] } },
        fields: if admin { u32::MAX } else { fields.iter().fold(0, |m, f| m | f.bit()) },
        payload: if admin { PAYLOAD_ALL } else { 8 },
        anonymize: if admin { vec![] } else { vec![Prefix::ALL_V4, Prefix::ALL_V6] },
        limits: PolicyLimits { budget: 1, periodic: 1, memory: 1 },
        export: ExportRights::default(),
    }
}

/// The first byte picks a link type, the rest is a frame: the view built
/// under a restrictive policy holds no forbidden field, no more payload than
/// granted, and no address in clear; the sanitized packet is no longer than
/// the frame.
pub fn view_builder(data: &[u8]) {
    let Some((&sel, frame)) = data.split_first() else { return };
    let link = match sel % 4 {
        0 => LinkType::Ethernet,
        1 => LinkType::Raw,
        2 => LinkType::LinuxSll,
        _ => LinkType::Null,
    };
    let f = Frame { ts_ns: 1, wire_len: frame.len() as u32, iface: 0, link, data: frame };
    let Ok(p) = parse(&f) else { return };
    let mut anon = Anonymizer::new(CryptoPan::new(&[3; 32]));
    let strict = ViewBuilder::new(&policy(false), 1 << 16);
    let mut buf = vec![0u8; strict.record_cap()];
    if let Some(n) = strict.build(&p, Some(&mut anon), &mut buf) {
        let v = View::new(&buf[..n]).unwrap_or_else(|| panic!("view shorter than its header"));
        assert!(v.payload().len() <= 8, "payload beyond the grant");
        for fld in [Field::TcpSeq, Field::TcpAck, Field::Ttl, Field::IpId, Field::IpLen, Field::Tos] {
            assert!(!v.present(fld) && v.get(fld) == 0, "forbidden field {fld:?} visible");
        }
        let al = p.addr_len();
        if v.present(Field::Src) && p.src[..al] != [0u8; 16][..al] {
            assert_ne!(&v.src()[..al], &p.src[..al], "address in clear (would need a Crypto-PAn fixed point)");
        }
    }
    let mut out = Vec::new();
    strict.sanitize(&p, Some(&mut anon), &mut out);
    assert!(out.len() <= frame.len());
    let admin = ViewBuilder::new(&policy(true), 1 << 16);
    let mut buf = vec![0u8; admin.record_cap()];
    let _ = admin.build(&p, None, &mut buf);
}
