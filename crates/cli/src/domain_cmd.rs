//! `anode domain`: administrative domains (SANE §4.7, docs/security.md):
//! make a domain secret, ask a node of the domain for a ticket over an SA
//! (its key distribution service, `CONTROL` body 0x22), and send
//! ticket-authenticated packets (ANEP `DOMAIN`, 0xA008) to the domain's
//! nodes with no handshake; and, as the domain's operator, revoke tickets,
//! users or old key epochs at a node over the operator's own SA (`CONTROL`
//! body 0x23).

use crate::sa_client::{self, Target};
use anode_node::core::KDC_OP;
use anode_node::core::Node;
use anode_sec::ticket::{KdcMessage, RevokeMessage, RevokeUpdate};
use anode_sec::{DomainKey, TicketHolder};
use anyhow::{Context, Result, anyhow, bail};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `anode domain` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum DomainCmd {
    /// Write a fresh random domain secret (mode 0600): every node of the
    /// domain holds it (`[domain] secret`).
    Secret {
        /// The file to write (refused if it exists).
        #[arg(long, short)]
        out: PathBuf,
    },
    /// Ask a node of the domain for a ticket: an SA as the user, the
    /// credential sent, the ticket and its session key written to --out
    /// (mode 0600: the session key is a secret).
    Ticket(TicketArgs),
    /// Send a ticket-authenticated packet to a node of the domain, with no
    /// handshake: a SNAP packet to run, or a module to load (authorized by
    /// the ticket's credential). Sent to --node, for the node at --to: the
    /// node itself, or, through a border node, a member behind it. One way:
    /// the node does not answer; see its `anode status` (`domain`).
    Send(SendArgs),
    /// As the domain's operator (--key is the operator's key), revoke
    /// tickets, users, or every ticket of key epochs below --min-epoch at
    /// one node, over an SA: the node applies it at once (tickets it holds
    /// that are now revoked are dropped) or refuses it whole. Send it to
    /// every node of the domain. In memory only: a restarted node forgets it.
    Revoke(RevokeArgs),
}

/// Arguments of `anode domain revoke`.
#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    #[command(flatten)]
    target: Target,
    /// A ticket id to revoke (decimal or 0x hex; `anode domain ticket`
    /// prints it). Repeatable.
    #[arg(long = "ticket", value_parser = parse_ticket_id)]
    tickets: Vec<u64>,
    /// A user to revoke (hex public key, or a .pub/.key file). Repeatable.
    #[arg(long = "user")]
    users: Vec<String>,
    /// Raise the key epoch floor: tickets and attachments of older epochs
    /// are refused, and the node moves to this epoch (its service issues
    /// under it).
    #[arg(long, default_value_t = 0)]
    min_epoch: u32,
}

fn parse_ticket_id(s: &str) -> Result<u64, String> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .map_err(|e| format!("{s:?}: {e}"))
}

/// Arguments of `anode domain send`.
#[derive(Debug, clap::Args)]
pub struct SendArgs {
    /// The ticket file (`anode domain ticket -o FILE`).
    #[arg(long)]
    ticket: PathBuf,
    /// The UDP endpoint to send to: the node itself, or a border node.
    #[arg(long)]
    node: std::net::SocketAddr,
    /// The overlay address of the node the packet is for.
    #[arg(long)]
    to: std::net::Ipv4Addr,
    /// A SNAP packet to run there (binary, from `anode snap asm`).
    #[arg(long, conflicts_with = "load", required_unless_present = "load")]
    snap: Option<PathBuf>,
    /// A module (.wasm) to load there, under the ticket's credential.
    #[arg(long)]
    load: Option<PathBuf>,
    /// The local name for the loaded module.
    #[arg(long, requires = "load")]
    name: Option<String>,
    /// Leave the ticket out (the node must hold it from an earlier packet).
    #[arg(long)]
    no_ticket: bool,
}

/// Arguments of `anode domain ticket`.
#[derive(Debug, clap::Args)]
pub struct TicketArgs {
    #[command(flatten)]
    target: Target,
    /// The user's credential, rooted in the domain operator's key.
    #[arg(long)]
    credential: PathBuf,
    /// Lifetime wanted, seconds (the service caps it).
    #[arg(long, default_value_t = 300)]
    lifetime: u16,
    /// Where to write the ticket (the service's reply).
    #[arg(long, short)]
    out: PathBuf,
}

/// Runs `anode domain`.
pub fn run(c: DomainCmd) -> Result<ExitCode> {
    match c {
        DomainCmd::Secret { out } => {
            let secret = DomainKey::generate_secret().map_err(|e| anyhow!("{e}"))?;
            write_private(&out, DomainKey::secret_file_text(&secret).as_bytes())?;
            println!("wrote domain secret {}", out.display());
            Ok(ExitCode::SUCCESS)
        }
        DomainCmd::Ticket(a) => ticket(&a),
        DomainCmd::Send(a) => send(&a),
        DomainCmd::Revoke(a) => revoke(&a),
    }
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {} (refused if it exists)", path.display()))?;
    f.write_all(bytes).with_context(|| path.display().to_string())
}

fn ticket(a: &TicketArgs) -> Result<ExitCode> {
    let cred = std::fs::read(&a.credential).with_context(|| a.credential.display().to_string())?;
    let body = [&[KDC_OP][..], &KdcMessage::Request { lifetime_s: a.lifetime, credential: &cred }.to_vec()].concat();
    let answer = sa_client::request(&a.target, &body, "ticket request")?;
    let Some((&KDC_OP, reply)) = answer.split_first() else { bail!("the node's answer is not a ticket reply") };
    match KdcMessage::parse(reply).map_err(|e| anyhow!("malformed reply: {e}"))? {
        KdcMessage::Reply { expires, .. } => {
            let h = TicketHolder::from_reply(reply).map_err(|e| anyhow!("{e}"))?;
            write_private(&a.out, reply)?;
            println!(
                "ticket {:#x} of {} bytes, expires at {expires} (Unix s); written to {}",
                h.id(),
                h.ticket().len(),
                a.out.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        KdcMessage::Refusal(code) => {
            eprintln!("ticket refused: {code:?}");
            Ok(ExitCode::from(1))
        }
        KdcMessage::Request { .. } => bail!("the node answered with a request"),
    }
}

fn revoke(a: &RevokeArgs) -> Result<ExitCode> {
    let mut users = Vec::new();
    for u in &a.users {
        let k = if Path::new(u).exists() {
            crate::keys_cmd::public_of(Path::new(u))?
        } else {
            anode_sec::PublicKey::parse(u).with_context(|| format!("--user {u}"))?
        };
        users.push(*k.as_bytes());
    }
    if a.tickets.is_empty() && users.is_empty() && a.min_epoch == 0 {
        bail!("nothing to revoke: give --ticket ID, --user KEY or --min-epoch N");
    }
    let update = RevokeUpdate { min_epoch: a.min_epoch, tickets: a.tickets.clone(), users };
    let msg = RevokeMessage::Update(update)
        .to_vec()
        .map_err(|e| anyhow!("{e}: at most {} tickets and users per update", anode_sec::ticket::MAX_REVOKE_ITEMS))?;
    let answer = sa_client::request(&a.target, &[&[Node::REVOKE_OP][..], &msg].concat(), "revocation")?;
    let Some((&Node::REVOKE_OP, reply)) = answer.split_first() else {
        bail!("the node's answer is not a revocation answer")
    };
    match RevokeMessage::parse(reply).map_err(|e| anyhow!("malformed answer: {e}"))? {
        RevokeMessage::Ack { min_epoch, tickets, users } => {
            println!(
                "revocation applied at {}: epoch floor {min_epoch}, {tickets} tickets and {users} users revoked",
                a.target.node
            );
            Ok(ExitCode::SUCCESS)
        }
        RevokeMessage::Refusal(code) => {
            eprintln!("revocation refused: {} (nothing applied)", code.label());
            Ok(ExitCode::from(1))
        }
        RevokeMessage::Update(_) => bail!("the node answered with an update"),
    }
}

/// The inner ANEP datagram `anode domain send` carries.
fn inner_datagram(a: &SendArgs) -> Result<Vec<u8>> {
    use anode_wire::anep;
    let (type_id, body) = match (&a.snap, &a.load) {
        (Some(f), _) => (anep::TYPE_SNAP, std::fs::read(f).with_context(|| f.display().to_string())?),
        (None, Some(f)) => {
            let code = std::fs::read(f).with_context(|| f.display().to_string())?;
            // The credential is the ticket's: the request carries none.
            let req = anode_wire::control::LoadRequest { name: a.name.as_deref(), credential: &[], code: &code };
            let m = anode_wire::control::Message::Load(req);
            let mut body = Vec::with_capacity(m.buffer_len());
            m.emit(&mut body).map_err(|e| anyhow!("load request: {e}"))?;
            (anep::TYPE_CONTROL, body)
        }
        (None, None) => bail!("give --snap FILE or --load FILE"),
    };
    let mut d = vec![0u8; anep::HEADER_LEN];
    anep::write_header(&mut d, anep::FLAG_DISCARD_UNKNOWN, type_id, body.len());
    d.extend_from_slice(&body);
    Ok(d)
}

fn send(a: &SendArgs) -> Result<ExitCode> {
    use anode_sec::ticket::Envelope;
    use anode_wire::anep;
    let reply = std::fs::read(&a.ticket).with_context(|| a.ticket.display().to_string())?;
    let mut h = TicketHolder::from_reply(&reply).map_err(|e| anyhow!("{}: not a ticket: {e}", a.ticket.display()))?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    if h.expires() <= now.as_secs() {
        bail!("the ticket expired at {} (Unix s): ask for a new one (`anode domain ticket`)", h.expires());
    }
    // Counters never repeat across runs: the node's replay window would
    // refuse a packet whose counter it has seen.
    h.set_counter(u64::try_from(now.as_micros()).unwrap_or(u64::MAX));
    let inner = inner_datagram(a)?;
    let packet = h.seal_with(u32::from(a.to), &inner, !a.no_ticket);
    let mut env = Vec::new();
    Envelope::Ticket(&packet).emit(&mut env).map_err(|e| anyhow!("{e}"))?;
    let mut d = vec![0u8; anep::HEADER_LEN];
    anep::write_header(&mut d, anep::FLAG_DISCARD_UNKNOWN, anep::TYPE_DOMAIN, env.len());
    d.extend_from_slice(&env);
    let sock = std::net::UdpSocket::bind(if a.node.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })
        .context("binding a UDP socket")?;
    sock.send_to(&d, a.node).with_context(|| format!("sending to {}", a.node))?;
    println!(
        "sent {} bytes to {} for {} (ticket {:#x}{}, inner {} bytes)",
        d.len(),
        a.node,
        a.to,
        h.id(),
        if a.no_ticket { ", not included" } else { " included" },
        inner.len()
    );
    Ok(ExitCode::SUCCESS)
}
