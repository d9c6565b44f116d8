//! The transcoder's shared setup (tests/transcoder.rs and
//! benches/transcoder.rs): the source stream, its packets and set-ups, and a
//! sandbox and credentials with room for the codecs.

use anode_cred::{
    ChannelGrant, Credential, GrantSpec, Interface, InterfaceSet, Limits, ModuleGrant, ModuleHash, PrincipalId,
    RequestedLimits,
};
use anode_sandbox::pods::OnFault;
use anode_sandbox::{LoadSpec, ModuleId, PodSpec, Sandbox};

use super::{issuer, line_routes, module, now, sandbox_with, user};

/// `n` frames of 192 kbit/s MPEG-1 stereo at 44.1 kHz (rusty_mp3, frame
/// level) from two tone mixtures and a little noise.
pub fn source(n: usize) -> Vec<Vec<u8>> {
    let h = rusty_mp3::encoder_header(44_100, 2, 192).unwrap();
    let mut enc = rusty_mp3::Mp3Encode::new();
    let mut seed = 12345u32;
    (0..n)
        .map(|f| {
            let (mut l, mut r) = (vec![0f32; 1152], vec![0f32; 1152]);
            for i in 0..1152 {
                let t = (f * 1152 + i) as f32 / 44_100.0;
                seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                let noise = ((seed >> 9) as f32 / (1u32 << 23) as f32 - 0.5) * 0.02;
                let m = |hz: f32| (2.0 * std::f32::consts::PI * hz * t).sin();
                l[i] = 0.3 * m(220.0) + 0.1 * m(660.0) + noise;
                r[i] = 0.3 * m(330.0) + 0.1 * m(1100.0) + noise;
            }
            enc.encode_frame(&h, &[&l, &r], None).unwrap()
        })
        .collect()
}

/// A source packet: `[seq u32 BE][frame]`.
pub fn packet(seq: u32, frame: &[u8]) -> Vec<u8> {
    let mut p = seq.to_be_bytes().to_vec();
    p.extend_from_slice(frame);
    p
}

/// A set-up (`tc_common::Setup`) for a client at 10.0.0.9.
pub fn setup_bytes(tier: u8, port: u16, key: Option<[u8; 16]>) -> Vec<u8> {
    let mut v = vec![tier];
    v.extend_from_slice(&[10, 0, 0, 9]);
    v.extend_from_slice(&port.to_be_bytes());
    if let Some(k) = key {
        v.extend_from_slice(&k);
    }
    v
}

/// A sandbox whose node limit allows a codec's fuel.
pub fn codec_sandbox() -> Sandbox {
    let mut cfg = anode_sandbox::SandboxConfig::default();
    cfg.verifier.node_limits.cpu = 500_000_000;
    sandbox_with(cfg, line_routes(1, 1))
}

/// A credential for `p` to load `code` with `net`, `pod` and `time` (a
/// path's self-wake alarm), and room for
/// a codec: 500 M fuel per invocation (the admin credential's 10 M is less
/// than a silver encode), 32 MiB of memory.
pub fn codec_cred(p: PrincipalId, code: &[u8]) -> Credential {
    let spec = GrantSpec {
        modules: vec![ModuleGrant::Hash(ModuleHash::of(code))],
        interfaces: InterfaceSet::of(&[Interface::Net, Interface::Pod, Interface::Time]),
        limits: Limits { memory: 32 << 20, cpu: 500_000_000, state: 4096 },
        expires: None,
    };
    issuer().issue(p, &spec).unwrap()
}

/// Loads example module `name` as `local` (any channel).
pub fn load(sb: &mut Sandbox, name: &str, local: &str) -> ModuleId {
    load_granted(sb, name, local, &[])
}

/// Loads example module `name` as `local`, with these channel grants in
/// its credential (none: any channel).
pub fn load_granted(sb: &mut Sandbox, name: &str, local: &str, grants: &[ChannelGrant]) -> ModuleId {
    let code = module(name);
    let cred = if grants.is_empty() {
        codec_cred(user(), &code)
    } else {
        let spec = GrantSpec {
            modules: vec![ModuleGrant::Hash(ModuleHash::of(&code))],
            interfaces: InterfaceSet::of(&[Interface::Net, Interface::Pod, Interface::Time]),
            limits: Limits { memory: 32 << 20, cpu: 500_000_000, state: 4096 },
            expires: None,
        };
        issuer().issue_channels(user(), &spec, grants).unwrap()
    };
    let c = cred.to_bytes();
    let spec = LoadSpec {
        code: &code,
        credential: Some(c),
        requester: None,
        local_name: Some(local),
        limits: RequestedLimits::default(),
    };
    sb.load(now(0), &spec).unwrap()
}

/// Loads example module `name` as pod `as_name`, reset on a fault.
pub fn load_pod(sb: &mut Sandbox, name: &str, as_name: &str, clients: Option<Vec<PrincipalId>>) {
    let code = module(name);
    let cred = codec_cred(user(), &code);
    let c = cred.to_bytes();
    let spec = PodSpec {
        code: &code,
        credential: Some(c),
        requester: None,
        name: as_name,
        limits: RequestedLimits::default(),
        clients,
        on_fault: OnFault::Reset,
        min_fuel: 0,
    };
    sb.load_pod(now(0), &spec).unwrap();
}
