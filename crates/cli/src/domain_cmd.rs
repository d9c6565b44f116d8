//! `anode domain`: administrative domains (SANE §4.7, docs/security.md):
//! make a domain secret, and ask a node of the domain for a ticket over an
//! SA (its key distribution service, `CONTROL` body 0x22).

use crate::sa_client::{self, Target};
use anode_node::core::KDC_OP;
use anode_sec::ticket::KdcMessage;
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
                "ticket of {} bytes, expires at {expires} (Unix s); written to {}",
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
