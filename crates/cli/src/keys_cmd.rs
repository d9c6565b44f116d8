//! `anode keys`: Ed25519 identities for nodes and users (SANE §4.3).

use anode_sec::{Identity, PublicKey};
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `anode keys` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum KeysCmd {
    /// Generate a key pair: DIR/NAME.key (secret, mode 0600) and
    /// DIR/NAME.pub. Refuses to overwrite either.
    Gen {
        /// Directory to write into (created with mode 0700 if missing).
        #[arg(long)]
        out: PathBuf,
        /// Base name of the two files.
        #[arg(long, default_value = "node")]
        name: String,
    },
    /// Print a key's public key and fingerprint (the principal's name in
    /// configs, logs and status). Takes a .key or .pub file, or a directory
    /// holding node.pub.
    Show {
        /// Key file or directory.
        path: PathBuf,
    },
}

/// Runs `anode keys`.
pub fn run(c: KeysCmd) -> Result<ExitCode> {
    match c {
        KeysCmd::Gen { out, name } => {
            if name.is_empty() || name.contains('/') || name.starts_with('.') {
                bail!("--name {name:?}: give a plain file name");
            }
            let id = Identity::generate()?;
            let (sk, pk) = id.save(&out, &name)?;
            println!("secret key  {}", sk.display());
            println!("public key  {}", pk.display());
            print_public(&id.public());
            Ok(ExitCode::SUCCESS)
        }
        KeysCmd::Show { path } => {
            print_public(&public_of(&path)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn print_public(k: &PublicKey) {
    println!("key         {k}");
    println!("fingerprint {}", k.fingerprint());
}

/// The public key in a .key or .pub file, or DIR/node.pub.
pub fn public_of(path: &Path) -> Result<PublicKey> {
    let path = if path.is_dir() { path.join("node.pub") } else { path.to_path_buf() };
    if path.extension().is_some_and(|e| e == "key") {
        return Ok(Identity::load(&path)?.public());
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    PublicKey::parse(&text).with_context(|| path.display().to_string())
}

/// Loads DIR/NAME.key, or creates it (and NAME.pub) if absent.
pub fn load_or_create(dir: &Path, name: &str) -> Result<Identity> {
    let sk = dir.join(format!("{name}.key"));
    if sk.exists() {
        return Ok(Identity::load(&sk)?);
    }
    let id = Identity::generate()?;
    id.save(dir, name)?;
    Ok(id)
}
