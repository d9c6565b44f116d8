//! The control plane: requests from principals authenticated by their
//! security association (today: module loads). Done for System; the answer
//! goes back over the same SA as a typed control message
//! (`anode_wire::control`).

use super::{Node, Outbox, Owner, Transmit};
use crate::core::LoadFailure;
use crate::core::staging::StageError;
use crate::counters::Drop;
use anode_sandbox::{LoadError, LoadSpec, PrincipalId};
use anode_wire::anep;
use anode_wire::control::{FaultPolicy, LoadReply, Message, Refusal};
use core::net::SocketAddr;

/// The refusal kind a load error is answered with.
fn refusal(e: &LoadError) -> Refusal {
    match e {
        LoadError::Denied(_) => Refusal::Denied,
        LoadError::TooManyModules(_) => Refusal::Limit,
        _ => Refusal::Module,
    }
}

impl Node {
    /// A control message `body` from the principal `from` whose SA ends at
    /// `to` (its reply is sealed and sent there on `iface`).
    pub(super) fn control(
        &mut self,
        from: Option<anode_sec::PublicKey>,
        to: Option<SocketAddr>,
        iface: usize,
        body: &[u8],
        now_ms: u64,
        out: &mut Outbox,
    ) {
        if let Some((&super::RECOVERY_OP, msg)) = body.split_first() {
            self.recovery_request(from, to, iface, msg, now_ms, out);
            return;
        }
        if let Some((&super::KDC_OP, msg)) = body.split_first() {
            self.kdc_request(from, to, iface, msg, now_ms, out);
            return;
        }
        if let Some((&Node::REVOKE_OP, msg)) = body.split_first() {
            self.revoke_request(from, to, iface, msg, out);
            return;
        }
        if body.first().is_some_and(|op| (0x10..=0x1f).contains(op)) {
            let reply = match from {
                Some(key) => self.session_request(PrincipalId(*key.as_bytes()), body, now_ms),
                None => {
                    anode_sched::wire::Reply::Error { code: anode_sched::wire::ErrorCode::SessionNotYours, detail: 0 }
                        .to_bytes()
                        .unwrap_or_default()
                }
            };
            if let Some(to) = to {
                send_control(out, iface, to, &[&reply]);
            }
            return;
        }
        let text;
        let msg = Message::parse(body);
        // A load with no code loads what its principal staged in chunks.
        let no_code = match &msg {
            Ok(Message::Load(r)) => r.code.is_empty(),
            Ok(Message::PodLoad(r)) => r.code.is_empty(),
            _ => false,
        };
        let staged = match from {
            Some(key) if no_code => Some(self.staging.take(PrincipalId(*key.as_bytes()), now_ms)),
            _ => None,
        };
        let parsed = match (msg, &staged) {
            (_, Some(Err(e))) => Err(StagingOr::Staging(*e)),
            (Ok(Message::Load(mut r)), Some(Ok(code))) => {
                r.code = code;
                Ok(Message::Load(r))
            }
            (Ok(Message::PodLoad(mut r)), Some(Ok(code))) => {
                r.code = code;
                Ok(Message::PodLoad(r))
            }
            (m, _) => m.map_err(StagingOr::Wire),
        };
        let reply = match (parsed, from) {
            (Err(StagingOr::Staging(e)), _) => {
                self.counters.drop(Drop::StagingRefused);
                text = e.to_string();
                LoadReply::Refused(Refusal::BadRequest, &text)
            }
            (Ok(Message::CodeChunk(_)), None) => LoadReply::Refused(Refusal::UnknownPrincipal, "unknown principal"),
            (Ok(Message::CodeChunk(c)), Some(key)) => match self.modules.as_ref().map(|m| m.sb.max_module()) {
                None => LoadReply::Refused(Refusal::NoModules, "this node runs no modules"),
                Some(max) => match self.staging.chunk(PrincipalId(*key.as_bytes()), &c, max, now_ms, |who, n| {
                    // Held in the principal's session heap while staged.
                    self.modules
                        .as_mut()
                        .map_or(Some(anode_sandbox::HeapCharge::default()), |m| m.sb.charge_staged(who, n))
                }) {
                    Ok(n) => LoadReply::Staged(n),
                    Err(e) => {
                        self.counters.drop(Drop::StagingRefused);
                        text = e.to_string();
                        let kind = match e {
                            StageError::Full | StageError::OverHeap { .. } => Refusal::Limit,
                            StageError::TooLarge { .. } => Refusal::Module,
                            _ => Refusal::BadRequest,
                        };
                        LoadReply::Refused(kind, &text)
                    }
                },
            },
            (Err(StagingOr::Wire(e)), _) => {
                text = e.to_string();
                LoadReply::Refused(Refusal::BadRequest, &text)
            }
            (Ok(Message::LoadReply(_)), _) => {
                text = "a load reply is not a request".to_string();
                LoadReply::Refused(Refusal::BadRequest, &text)
            }
            (Ok(Message::Load(_) | Message::PodLoad(_)), None) => {
                LoadReply::Refused(Refusal::UnknownPrincipal, "unknown principal")
            }
            (Ok(Message::PodLoad(req)), Some(key)) => {
                let spec = anode_sandbox::PodSpec {
                    code: req.code,
                    credential: Some(req.credential),
                    requester: Some(PrincipalId(*key.as_bytes())),
                    name: req.name,
                    limits: Default::default(),
                    clients: req.clients.map(|c| {
                        c.chunks_exact(32)
                            .map(|k| {
                                let mut id = [0u8; 32];
                                id.copy_from_slice(k);
                                PrincipalId(id)
                            })
                            .collect()
                    }),
                    on_fault: match req.on_fault {
                        FaultPolicy::Reset => anode_sandbox::pods::OnFault::Reset,
                        FaultPolicy::Retire => anode_sandbox::pods::OnFault::Retire,
                        FaultPolicy::Rollback => anode_sandbox::pods::OnFault::Rollback,
                    },
                    min_fuel: req.min_fuel,
                };
                match self.load_pod(&spec, now_ms) {
                    Some(Ok(id)) => LoadReply::Loaded(id.0),
                    None => LoadReply::Refused(Refusal::NoModules, "this node runs no modules"),
                    Some(Err(e)) => {
                        self.counters.drop(Drop::CapsuleRefused);
                        let kind = match &e {
                            anode_sandbox::pods::PodError::Load(l) => refusal(l),
                            anode_sandbox::pods::PodError::NotGranted => Refusal::Denied,
                            anode_sandbox::pods::PodError::TooMany => Refusal::Limit,
                            _ => Refusal::Module,
                        };
                        text = e.to_string();
                        LoadReply::Refused(kind, &text)
                    }
                }
            }
            (Ok(Message::Load(req)), Some(key)) => {
                let spec = LoadSpec {
                    code: req.code,
                    credential: Some(req.credential),
                    requester: Some(PrincipalId(*key.as_bytes())),
                    local_name: req.name,
                    limits: Default::default(),
                };
                match self.load_module(&spec, now_ms, out) {
                    Ok((id, false)) => LoadReply::Loaded(id.0),
                    Ok((id, true)) => LoadReply::AlreadyLoaded(id.0),
                    Err(LoadFailure::ModulesOff) => LoadReply::Refused(Refusal::NoModules, "this node runs no modules"),
                    Err(LoadFailure::Refused(e)) => {
                        self.counters.drop(Drop::CapsuleRefused);
                        text = e.to_string();
                        LoadReply::Refused(refusal(&e), &text)
                    }
                }
            }
        };
        let Some(to) = to else { return };
        let mut body = Vec::with_capacity(Message::LoadReply(reply).buffer_len());
        // A reply has no field that can be too long for its length prefix.
        let _ = Message::LoadReply(reply).emit(&mut body);
        send_control(out, iface, to, &[&body]);
    }
}

/// Why a control request did not get as far as its handler.
enum StagingOr {
    /// It did not parse.
    Wire(anode_wire::control::Error),
    /// A load of staged code with none staged, or not all of it.
    Staging(StageError),
}

/// Queues a `CONTROL` datagram made of `parts` for `to` on `iface`: an answer
/// of the control plane, done for System (sealed for that SA by the caller).
pub(super) fn send_control(out: &mut Outbox, iface: usize, to: SocketAddr, parts: &[&[u8]]) {
    let data = out.push_frame(anep::TYPE_CONTROL, parts);
    out.transmits.push(Transmit { iface, to, data, owner: Owner::System, unsealed: false, flow: None });
}
