//! `anode module load`: a user loads a module into a node over the network
//! (SANE §4.8): a Noise XX handshake binds the user's Ed25519 identity to a
//! security association, then the module and its credential travel in an
//! authenticated (encrypted) control message; the node decides once, at
//! load, and answers over the same SA.

use anode_wire::control::{CodeChunk, FaultPolicy, LoadReply, LoadRequest, Message, PodLoadRequest};
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
        /// Load it as a pod (Expert's protected module, docs/pods.md) named
        /// NAME: its offers are `NAME.<entry>`; the credential must grant
        /// `pod`. Any principal whose module's credential grants `pod` may
        /// bind to it.
        #[arg(long, value_name = "NAME", conflicts_with = "name")]
        pod: Option<String>,
        /// With --pod: what restores the pod when it traps or is cut off:
        /// `reset` (instantiate it again; bindings are dropped), `retire`
        /// (unload it), or `rollback` (put back its memory and globals from
        /// before the call, then its `pod_check`; bindings stay; the pod must
        /// export every mutable global). docs/pods.md "Faults".
        #[arg(long, value_name = "POLICY", requires = "pod", default_value = "reset", value_parser = ["reset", "retire", "rollback"])]
        on_fault: String,
        /// With --pod: the same as `--on-fault retire`.
        #[arg(long, requires = "pod", conflicts_with = "on_fault")]
        retire: bool,
        /// With --pod: a principal whose modules may bind to it (a .pub or
        /// .key file); repeat for more, at most 64. Without it, any principal
        /// whose module's credential grants `pod` may.
        #[arg(long = "client", value_name = "KEY", requires = "pod")]
        clients: Vec<PathBuf>,
        /// With --pod: fuel a caller must have left for a call to enter it.
        #[arg(long, value_name = "FUEL", requires = "pod", default_value_t = 0)]
        min_fuel: u64,
        #[command(flatten)]
        target: crate::sa_client::Target,
    },
    /// List the modules a node runs: for whom (principal), under which
    /// names, with which limits, until when its credential allows each,
    /// and their counters. Over the node's control socket (local operator).
    List {
        /// The node's run directory.
        #[arg(long, value_name = "DIR")]
        run_dir: PathBuf,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Unload a module (the operator's decision; its alarms, channels and
    /// names go with it). Over the node's control socket.
    Unload {
        /// The module id (`m3` or `3`, or a pod's `p0`, as `list` shows it).
        id: String,
        /// The node's run directory.
        #[arg(long, value_name = "DIR")]
        run_dir: PathBuf,
    },
}

fn control(run_dir: &std::path::Path, req: &str) -> Result<String> {
    anode_daemon::query(run_dir, req, std::time::Duration::from_secs(5)).with_context(|| {
        format!("no node answers on {} (is it running?)", run_dir.join(anode_daemon::CONTROL_SOCKET).display())
    })
}

/// Runs `anode module`.
pub fn run(c: ModuleCmd) -> Result<ExitCode> {
    let (file, credential, name, pod, target) = match c {
        ModuleCmd::Load { file, credential, name, pod, on_fault, retire, clients, min_fuel, target } => {
            let on_fault = match if retire { "retire" } else { on_fault.as_str() } {
                "retire" => FaultPolicy::Retire,
                "rollback" => FaultPolicy::Rollback,
                _ => FaultPolicy::Reset,
            };
            if clients.len() > anode_wire::control::MAX_POD_CLIENTS {
                bail!(
                    "--client given {} times; a pod may name at most {}",
                    clients.len(),
                    anode_wire::control::MAX_POD_CLIENTS
                );
            }
            let mut keys = Vec::with_capacity(32 * clients.len());
            for c in &clients {
                keys.extend_from_slice(
                    crate::keys_cmd::public_of(c).with_context(|| format!("--client {}", c.display()))?.as_bytes(),
                );
            }
            (file, credential, name, pod.map(|p| (p, on_fault, min_fuel, keys)), target)
        }
        ModuleCmd::List { run_dir, json } => {
            let answer = control(&run_dir, "modules")?;
            if json {
                print!("{answer}");
                return Ok(ExitCode::SUCCESS);
            }
            let v: serde_json::Value = serde_json::from_str(&answer).context("the node's answer is not JSON")?;
            let list = v.as_array().cloned().unwrap_or_default();
            if list.is_empty() {
                println!("no modules loaded");
            }
            for m in list {
                let s = |k: &str| m[k].as_str().unwrap_or("?").to_string();
                let until = m["until_unix_s"].as_u64().map_or("no expiry".to_string(), |t| format!("until unix {t}"));
                println!(
                    "{} principal {} names {} entries {} {}; invocations {} (traps {}, cpu {}, memory {})",
                    s("id"),
                    s("principal"),
                    m["names"],
                    m["entries"],
                    until,
                    m["counters"]["invocations"],
                    m["counters"]["traps"],
                    m["counters"]["cpu_exhausted"],
                    m["counters"]["memory_exhausted"]
                );
            }
            return Ok(ExitCode::SUCCESS);
        }
        ModuleCmd::Unload { id, run_dir } => {
            let answer = control(&run_dir, &format!("unload {id}"))?;
            print!("{answer}");
            return Ok(if answer.starts_with("error") { ExitCode::from(1) } else { ExitCode::SUCCESS });
        }
    };
    let code = std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
    let cred = std::fs::read(&credential).with_context(|| format!("reading {}", credential.display()))?;
    // Code too large for one request goes ahead of it in chunks, and the
    // request carries none (docs/modules.md "Modules larger than one datagram").
    let request = |code| match &pod {
        Some((name, on_fault, min_fuel, keys)) => Message::PodLoad(PodLoadRequest {
            name,
            on_fault: *on_fault,
            clients: (!keys.is_empty()).then_some(keys.as_slice()),
            min_fuel: *min_fuel,
            credential: &cred,
            code,
        }),
        None => Message::Load(LoadRequest { name: name.as_deref(), credential: &cred, code }),
    };
    let fits = request(&code).buffer_len() <= crate::sa_client::MAX_BODY;
    let chunks: Vec<Vec<u8>> = if fits { Vec::new() } else { code_chunks(&code)? };
    let mut body = Vec::new();
    request(if fits { &code } else { &[] }).emit(&mut body).map_err(|e| anyhow!("load request: {e}"))?;
    let node = target.node;
    let mut bodies: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
    bodies.push(&body);
    let what = format!("{} bytes of module in {} request(s)", code.len(), bodies.len());
    // Each chunk is answered with the bytes staged so far; the first that
    // is not ends the sequence.
    let staged = |a: &[u8]| matches!(Message::parse(a), Ok(Message::LoadReply(LoadReply::Staged(_))));
    let mut answers = crate::sa_client::request_sequence(&target, &bodies, &staged, &what)?;
    if answers.len() <= chunks.len() {
        let last = answers.last().map_or(&[][..], Vec::as_slice);
        match Message::parse(last) {
            Ok(Message::LoadReply(r)) if !staged(last) => bail!("{node}: staging the code: {r}"),
            _ => bail!("{node} answered {} of the {} code chunks", answers.len(), chunks.len()),
        }
    }
    let answer = answers.pop().unwrap_or_default();
    let reply = match Message::parse(&answer) {
        Ok(Message::LoadReply(r)) => r,
        Ok(other) => bail!("{node} answered with {other:?}, not a load reply"),
        Err(e) => bail!("{node} answered with a malformed control message: {e}"),
    };
    match (&pod, reply) {
        (Some(_), LoadReply::Loaded(id)) => println!("{node}: loaded pod p{id}"),
        _ => println!("{node}: {reply}"),
    }
    let ok = matches!(reply, LoadReply::Loaded(_) | LoadReply::AlreadyLoaded(_));
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// The code chunks of a module too large for one request: each one
/// control request (`anode_wire::control` "code chunk"), in order.
fn code_chunks(code: &[u8]) -> Result<Vec<Vec<u8>>> {
    /// Code bytes per chunk: a chunk request well inside one datagram.
    const CHUNK: usize = 60_000;
    let total = u32::try_from(code.len()).map_err(|_| anyhow!("a module of {} bytes is too large", code.len()))?;
    let mut out = Vec::new();
    for (i, data) in code.chunks(CHUNK).enumerate() {
        let offset = u32::try_from(i * CHUNK)?;
        let mut b = Vec::new();
        Message::CodeChunk(CodeChunk { total, offset, data }).emit(&mut b).map_err(|e| anyhow!("code chunk: {e}"))?;
        out.push(b);
    }
    Ok(out)
}
