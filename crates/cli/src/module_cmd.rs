//! `anode module load`: a user loads a module into a node over the network
//! (SANE §4.8): a Noise XX handshake binds the user's Ed25519 identity to a
//! security association, then the module and its credential travel in an
//! authenticated (encrypted) control message; the node decides once, at
//! load, and answers over the same SA.

use anode_wire::control::{LoadReply, LoadRequest, Message};
use anyhow::{Context, Result, anyhow, bail};
use std::path::PathBuf;
use std::process::ExitCode;

/// `anode module` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum ModuleCmd {
    /// Load a module into a running node over an authenticated, encrypted
    /// control message. The node must list the user's key in `[security]
    /// users` and run switchlets (`[modules]`).
    Load {
        /// The module (wasm).
        file: PathBuf,
        /// Its credential (Biscuit bytes, issued from the node's admin key).
        #[arg(long)]
        credential: PathBuf,
        /// The loader's name for the module.
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        target: crate::sa_client::Target,
    },
}

/// Runs `anode module`.
pub fn run(c: ModuleCmd) -> Result<ExitCode> {
    let ModuleCmd::Load { file, credential, name, target } = c;
    let code = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    let cred = std::fs::read(&credential).with_context(|| format!("reading {}", credential.display()))?;
    let mut body = Vec::new();
    Message::Load(LoadRequest { name: name.as_deref(), credential: &cred, code: &code })
        .emit(&mut body)
        .map_err(|e| anyhow!("load request: {e}"))?;
    let node = target.node;
    let answer = crate::sa_client::request(&target, &body, &format!("{} bytes of module", code.len()))?;
    let reply = match Message::parse(&answer) {
        Ok(Message::LoadReply(r)) => r,
        Ok(other) => bail!("{node} answered with {other:?}, not a load reply"),
        Err(e) => bail!("{node} answered with a malformed control message: {e}"),
    };
    println!("{node}: {reply}");
    let ok = matches!(reply, LoadReply::Loaded(_) | LoadReply::AlreadyLoaded(_));
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
