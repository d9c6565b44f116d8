//! `anode experiment transcoder`: Expert's tiered transcoder (§4-5, issue
//! 17, docs/transcoder.md) on a testbed of real daemons, a - c.
//!
//! Node c runs the transcoder, loaded over the user's SA like any user's
//! code: the path-based variant (pods `gold`, `silver`, `bronze` of
//! `tc-cache`, pod `aes` of `tc-aes` with the user as its only client,
//! `tc-rx`, one `tc-path` per gold or silver stream and one for bronze) or
//! the all-in-one (`tc-all`). c's `[modules] max_cpu` is raised to
//! [`MAX_CPU`] (a silver frame is about 10.7 M fuel; the default is 10 M).
//!
//! **Wake-ups and VPs.** Each module has its own principal and session
//! of one VP: `tc-rx` user r's (`--rx-vp`), which gets the source's
//! packets on a channel (port [`SOURCE`]); `tc-path` `i` user p<i>'s
//! (`--gold-vp`, `--silver-vp`, `--bronze-vp`). Path instance `n` (in load
//! order, a ticket of pod `gold`) opens a control channel on port
//! `7100 + n` (asking for VP `n + 1`, which a one-VP session does not
//! have: it runs on its session's VP); the harness sends it its set-up
//! (`S`, then the set-up) and then, every frame time, half a frame after the source
//! frame, a one-byte tick (`T`) that calls `poll`, which serves every
//! frame the cache holds that the path has not served yet. (An alarm would
//! do too; a packet makes the wake-up visible in the channel counters.)
//! Why a principal each: a principal has one store, and a job that finds
//! it held by another VP's preempted invocation is dropped by the node
//! (`jobs_busy`, reported). With all paths one principal's, the bronze
//! path's tick always found a silver encode preempted and bronze got
//! nothing. The pods are user u's; the AES pod's access list is the paths'
//! principals. The all-in-one is one module of u's on one VP
//! (`--all-vp`), set up on port 7001.
//!
//! **Harness.** Node a's application socket: the source sends `[seq][one
//! 192 kbit/s MP3 frame]` (rusty_mp3, from tones and noise, as the sandbox
//! test does) every 26.12 ms to c; the clients are ports registered at a,
//! counted per second and per stream. CPU is node c's process CPU
//! (`/proc/PID/task/*/schedstat`, ns) over the measured window; each run
//! also records what c charged the variant's sessions (RCANE's accounting:
//! the thread CPU time of each dispatch), so that node − charged is the
//! work outside dispatches (receiving, transmitting, timers).
//!
//! **Side by side** (`--side-by-side`, Table 3 only): both variants on the
//! same node at the same time, each with its own principals, sessions and
//! clients (the all-in-one's on ports [`SIDE_OFFSET`] higher, its module
//! user w's), fed by the same source packets (a packet for the source port
//! goes to every channel that matches it, so to both `tc-rx` and
//! `tc-all`). A variant's CPU is then what c charged its sessions: the
//! machine's drift between runs, which moves single runs by ±15 % here,
//! is the same for both. It measures the work inside dispatches only, and
//! holds while the two together leave c's module thread unsaturated.
//!
//! Steps: `one` (1 gold, 1 silver, 1 bronze, both variants), `table3` (1
//! gold + 1 bronze + k silver), `fig4` (5 gold + 1 bronze + rising silver).
//! Nothing here asserts timing: the machine is shared.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anode_daemon::client::Client;
use anyhow::{Context, Result, anyhow, bail};
use plotters::prelude::*;
use serde_json::json;

/// The source's port on c (`tc_common::SOURCE_PORT`).
const SOURCE: u16 = 7000;
/// `tc-all`'s set-up port (`tc_common::CLIENT_PORT`).
const CLIENT_SETUP: u16 = 7001;
/// `tc-path` instance `n`'s control port is `PATH_PORT + n`.
const PATH_PORT: u16 = 7100;
/// The first client port at a.
const CLIENT_BASE: u16 = 5000;
/// In side-by-side runs, the all-in-one's clients are this far above the
/// path-based variant's.
const SIDE_OFFSET: u16 = 500;
/// Packets one invocation may send on c (`[modules] max_sends`): more than
/// the all-in-one's clients (one packet each per frame).
const MAX_SENDS: u32 = 256;
/// The channels the transcoder's modules on c are granted: the source
/// (7000), `tc-all`'s set-ups (7001) and the paths' control ports
/// (7100 + n), from node a only.
const CONTROL_GRANT: &str = "7000-7199@10.0.0.1/32";

/// Fuel per invocation on c, and in every module credential.
pub const MAX_CPU: u64 = 400_000_000;
/// One MP3 frame: 1,152 samples at 44.1 kHz.
const FRAME: Duration = Duration::from_micros(26_122);
/// Most silver streams of one run (the AES pod holds 64 bindings; 5 gold
/// and 24 silver are past this machine's saturation in a release build).
const MAX_SILVER: u16 = 24;
/// A self-waking path's alarm period, ms: just under a frame, so that a
/// path never falls a frame behind for long (each poll serves every frame
/// it has not served).
const ALARM_MS: u8 = 26;
/// Distinct source frames generated (then repeated, with rising seq).
const DISTINCT: usize = 48;

/// `anode experiment transcoder`.
#[derive(Debug, clap::Args)]
pub struct TranscoderArgs {
    /// Which steps: `one`, `table3`, `fig4` (comma-separated) or `all`.
    #[arg(long, default_value = "all")]
    steps: String,
    /// Seconds of stream per run (the first second is not measured).
    #[arg(long, default_value_t = 8.0)]
    seconds: f64,
    /// Silver streams of Table 3's runs (1 gold + 1 bronze + k silver).
    #[arg(long, value_delimiter = ',', default_value = "1,3,5,7,9,11")]
    table3: Vec<u16>,
    /// Silver streams of Fig. 4's runs (5 gold + 1 bronze + k silver).
    #[arg(long, value_delimiter = ',', default_value = "0,4,8,12,16,20,24")]
    fig4: Vec<u16>,
    /// The receive path's VP, `SLICE/PERIOD` (it decodes, and encodes
    /// bronze, once per frame: about 1 ms in a release build).
    #[arg(long, default_value = "2ms/26ms")]
    rx_vp: String,
    /// Each gold path's VP.
    #[arg(long, default_value = "500us/26ms")]
    gold_vp: String,
    /// Each silver path's VP (a silver frame is about 1.3 ms in a release
    /// build, 2.4 ms in a debug one; slack covers the rest).
    #[arg(long, default_value = "1500us/26ms+extra")]
    silver_vp: String,
    /// Each silver path's VP in Fig. 4: less than a frame's cost (about
    /// 1.3 ms in a release build), plus slack, so that past the admission
    /// limit silver streams can still be added and the machine saturates.
    #[arg(long, default_value = "500us/26ms+extra")]
    fig4_silver_vp: String,
    /// The bronze path's VP (with slack).
    #[arg(long, default_value = "500us/26ms+extra")]
    bronze_vp: String,
    /// The all-in-one's VP (the paper's 85 ms/100 ms; this node admits at most 80 %).
    #[arg(long, default_value = "78ms/100ms")]
    all_vp: String,
    /// How the path-based variant's per-stream paths are woken: `alarm`
    /// (each path re-arms its own alarm every 26 ms, on its own VP, as
    /// Expert's paths are scheduled by the node) or `tick` (the harness
    /// sends each path a packet every frame, as before).
    #[arg(long, value_enum, default_value_t = Wake::Alarm)]
    wake: Wake,
    /// Runs of each Table 3 and Fig. 4 point, per variant; the variants'
    /// order alternates from one repetition to the next.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Table 3 with both variants on the same node at the same time, fed
    /// by the same source packets (each has its own clients): each
    /// variant's CPU is what the node charged its sessions over the window
    /// (RCANE's accounting), so the machine's drift from run to run, which
    /// moves single runs by ±15 % here, is the same for both.
    #[arg(long)]
    side_by_side: bool,
    /// The all-in-one's VP in `--side-by-side` runs, where both variants'
    /// guarantees must fit the node's admission limit (80 %) together: 30
    /// % fits up to 5 silver streams. Give it a guarantee that covers its
    /// work: on slack it is cut at every timer and packet of the other
    /// variant, and pays for the extra dispatches and cold caches (a slack
    /// VP made it look 5-6 % dearer; docs/transcoder.md).
    #[arg(long, default_value = "30ms/100ms")]
    side_all_vp: String,
    /// Node a's `--spin-us` (the clients' node; default: its config's).
    /// Above the spacing of c's packets (10000), a polls its sockets
    /// instead of sleeping, so c's sends never wake it: on loopback the
    /// receiver's wakeup happens, and is billed, inside the sender's send
    /// call. A diagnostic: a then keeps a CPU busy.
    #[arg(long, value_name = "US")]
    receiver_spin_us: Option<u64>,
    /// Directory of the transcoder modules (`scripts/setup` builds them).
    #[arg(long, default_value = "modules/out")]
    modules: PathBuf,
    /// Also write every packet each client received to
    /// OUT/one-VARIANT/client-PORT.bin (`[len u16 BE][packet]` records),
    /// with the keys in OUT/one-VARIANT/clients.json (for tests).
    #[arg(long)]
    dump: bool,
    /// Output directory.
    #[arg(short, long, default_value = "transcoder-out")]
    out: PathBuf,
}

/// How the per-stream paths are woken (`--wake`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Wake {
    /// Each path's own alarm, re-armed every [`ALARM_MS`].
    Alarm,
    /// A packet from the harness to each path every frame.
    Tick,
}

/// The tiers (their wire byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Tier {
    Gold = 0,
    Silver = 1,
    Bronze = 2,
}

impl Tier {
    fn name(self) -> &'static str {
        match self {
            Tier::Gold => "gold",
            Tier::Silver => "silver",
            Tier::Bronze => "bronze",
        }
    }
}

/// One client stream.
#[derive(Debug, Clone)]
struct Stream {
    tier: Tier,
    port: u16,
    key: Option<[u8; 16]>,
}

/// A client's key: distinct per port, fixed so that a test can decrypt.
fn key_of(port: u16) -> [u8; 16] {
    let mut k = [0u8; 16];
    for (i, b) in k.iter_mut().enumerate() {
        *b = (port as u8).wrapping_mul(31).wrapping_add(i as u8 * 7) ^ (port >> 8) as u8;
    }
    k
}

fn streams(gold: u16, silver: u16, bronze: u16) -> Vec<Stream> {
    streams_from(CLIENT_BASE, gold, silver, bronze)
}

/// [`streams`] with client ports from `base`.
fn streams_from(base: u16, gold: u16, silver: u16, bronze: u16) -> Vec<Stream> {
    let mut v = Vec::new();
    let mut port = base;
    for (tier, n) in [(Tier::Gold, gold), (Tier::Silver, silver), (Tier::Bronze, bronze)] {
        for _ in 0..n {
            let key = (tier != Tier::Bronze).then(|| key_of(port));
            v.push(Stream { tier, port, key });
            port += 1;
        }
    }
    v
}

/// The set-up bytes (`tc_common::Setup`): client at a (10.0.0.1).
fn setup_bytes(s: &Stream) -> Vec<u8> {
    let mut v = vec![s.tier as u8, 10, 0, 0, 1];
    v.extend_from_slice(&s.port.to_be_bytes());
    if let Some(k) = s.key {
        v.extend_from_slice(&k);
    }
    v
}

/// `n` frames of 192 kbit/s MPEG-1 stereo at 44.1 kHz from two tone
/// mixtures and a little noise (as crates/sandbox/tests/transcoder.rs).
pub fn source_frames(n: usize) -> Result<Vec<Vec<u8>>> {
    let h = rusty_mp3::encoder_header(44_100, 2, 192).map_err(|e| anyhow!("MP3 header: {e:?}"))?;
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
            enc.encode_frame(&h, &[&l, &r], None).map_err(|e| anyhow!("encoding source frame {f}: {e:?}"))
        })
        .collect()
}

/// A scratch testbed of a - c with c's `max_cpu` raised.
struct Bed {
    anode: PathBuf,
    dir: PathBuf,
    c_pid: u32,
    /// Node a's `--spin-us`, if set.
    a_spin_us: Option<u64>,
}

impl Bed {
    fn cmd(&self, args: &[&str]) -> Result<String> {
        let o = Command::new(&self.anode).args(args).output().with_context(|| format!("running anode {args:?}"))?;
        if !o.status.success() {
            let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            bail!("anode {args:?} failed: {text}");
        }
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    }

    fn p(&self, rel: &str) -> String {
        self.dir.join(rel).to_string_lossy().into_owned()
    }

    /// Plans the testbed (`testbed up --configs-only`) and makes the user's
    /// keys; nothing runs yet.
    fn plan(anode: PathBuf, dir: PathBuf) -> Result<Bed> {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let bed = Bed { anode, dir, c_pid: 0, a_spin_us: None };
        let topo = bed.dir.join("line2.toml");
        std::fs::write(
            &topo,
            "node = [{ name = \"a\", address = \"10.0.0.1\" }, { name = \"c\", address = \"10.0.0.3\" }]\n\
             link = [{ a = \"a\", b = \"c\" }]\n",
        )?;
        for u in ["u", "r"] {
            bed.cmd(&["keys", "gen", "--name", u, "--out", &bed.p("")])?;
        }
        let (t, u, r, tb) = (topo.to_string_lossy().into_owned(), bed.p("u.pub"), bed.p("r.pub"), bed.p("tb"));
        let base = super::bed::free_base(2)?.to_string();
        bed.cmd(&[
            "testbed",
            "up",
            &t,
            "--user",
            &u,
            "--user",
            &r,
            "--configs-only",
            "--base-port",
            &base,
            "--dir",
            &tb,
        ])?;
        Ok(bed)
    }

    /// User `u`'s public key, hex.
    fn user_hex(&self, u: &str) -> Result<String> {
        let text = std::fs::read_to_string(self.dir.join(format!("{u}.pub")))?;
        text.split_whitespace().last().map(str::to_string).ok_or_else(|| anyhow!("empty u.pub"))
    }

    /// Raises c's `max_cpu` and `max_sends`, appends `extra` (sessions, pods, loads) to
    /// c's config, and starts both nodes as `testbed up` would (so that
    /// `testbed down` stops them).
    fn start(&mut self, extra: &str) -> Result<()> {
        let cfg_path = self.dir.join("tb/c/node.toml");
        let cfg = std::fs::read_to_string(&cfg_path)?;
        // The planned config writes every `[modules]` key, `max_cpu` too.
        let Some(line) = cfg.lines().find(|l| l.starts_with("max_cpu = ")) else {
            bail!("c's node.toml has no max_cpu line");
        };
        // The all-in-one sends one packet per client per frame: 5 gold and
        // 24 silver clients are more than the default 16 sends an
        // invocation may make (which capped it at 16 clients before).
        let raised = format!("max_cpu = {MAX_CPU}\nmax_sends = {MAX_SENDS}");
        let cfg = format!("{}\n{extra}", cfg.replacen(line, &raised, 1));
        std::fs::write(&cfg_path, cfg)?;
        for n in ["a", "c"] {
            let nd = self.dir.join("tb").join(n);
            let _ = std::fs::remove_file(nd.join("app.sock"));
            let log = std::fs::File::create(nd.join("node.log"))?;
            let mut cmd = Command::new(&self.anode);
            cmd.arg("node").arg("--config").arg(nd.join("node.toml"));
            if let (true, Some(us)) = (n == "a", self.a_spin_us) {
                cmd.arg("--spin-us").arg(us.to_string());
            }
            cmd.stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log);
            std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
            let child = cmd.spawn().with_context(|| format!("starting node {n}"))?;
            std::fs::write(nd.join("pid"), format!("{}\n", child.id()))?;
            if n == "c" {
                self.c_pid = child.id();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        for n in ["a", "c"] {
            let nd = self.dir.join("tb").join(n);
            while Client::connect(&nd).is_err() {
                if Instant::now() > deadline {
                    bail!("node {n} did not come up: {}", std::fs::read_to_string(nd.join("node.log"))?);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }

    fn cred(&self, u: &str, name: &str, args: &[&str]) -> Result<String> {
        let out = self.p(name);
        let (admin, principal) = (self.p("tb/keys/admin.key"), self.p(&format!("{u}.pub")));
        let mut a = vec!["cred", "issue", "--admin-key", &admin, "--principal", &principal];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", &out]);
        self.cmd(&a)?;
        Ok(out)
    }

    /// User `u`'s session (`[[modules.session]]`) with `vps`.
    fn session(&self, u: &str, vps: &[String]) -> Result<String> {
        let n = vps.len().to_string();
        let sc = self.cred(
            u,
            &format!("{u}.session"),
            &[
                "--kind",
                "session",
                "--vp-share",
                "90%",
                "--total-share",
                "95%",
                "--vps",
                &n,
                "--extra",
                "--heap",
                "512MiB",
            ],
        )?;
        let vps: Vec<String> = vps.iter().map(|v| format!("{v:?}")).collect();
        Ok(format!(
            "[[modules.session]]\nprincipal = \"{}\"\ncredential = {sc:?}\nvp = [{}]\n\n",
            self.user_hex(u)?,
            vps.join(", ")
        ))
    }

    /// `file` (from the modules directory) as a `[[modules.load]]` or
    /// `[[modules.pod]]` of user `u`'s.
    fn load(&self, u: &str, dir: &Path, file: &str, pod: Option<(&str, &[String])>, n: usize) -> Result<String> {
        let wasm = dir.join(format!("{file}.wasm")).to_string_lossy().into_owned();
        let cpu = MAX_CPU.to_string();
        let ifaces = if pod.is_some() { "pod" } else { "net,pod,time" };
        let mut args =
            vec!["--kind", "module", "--module", &wasm, "--interface", ifaces, "--cpu", &cpu, "--memory", "32MiB"];
        if pod.is_none() {
            // The source, the set-ups and the paths' control: from node a
            // (the harness) only. The modules open their channels on "the
            // source my credential grants" (tc_common::channel_spec), so
            // nobody else can add clients or inject frames.
            args.extend_from_slice(&["--channel", CONTROL_GRANT]);
        }
        let cred = self.cred(u, &format!("{file}-{n}.cred"), &args)?;
        Ok(match pod {
            Some((name, clients)) => {
                let clients: Vec<String> = clients.iter().map(|c| format!("{c:?}")).collect();
                let clients =
                    if clients.is_empty() { String::new() } else { format!("clients = [{}]\n", clients.join(", ")) };
                format!("[[modules.pod]]\nfile = {wasm:?}\ncredential = {cred:?}\nname = \"{name}\"\n{clients}\n")
            }
            None => format!("[[modules.load]]\nfile = {wasm:?}\ncredential = {cred:?}\nname = \"{file}-{n}\"\n\n"),
        })
    }

    fn status(&self) -> Result<serde_json::Value> {
        let rd = self.p("tb/c");
        serde_json::from_str(&self.cmd(&["status", "--json", "--run-dir", &rd])?).context("JSON of anode status")
    }

    fn down(&self) {
        let _ = Command::new(&self.anode).args(["testbed", "down", "--dir"]).arg(self.dir.join("tb")).output();
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        self.down();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Node c's CPU so far, ns (every thread of its process).
fn node_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

/// The path-based or the all-in-one variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Variant {
    Path,
    All,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Path => "path-based",
            Variant::All => "all-in-one",
        }
    }
}

/// What one run measured.
#[derive(Debug)]
struct RunResult {
    variant: Variant,
    /// Which repetition of its point (0-based).
    rep: u32,
    streams: Vec<Stream>,
    /// Frames sent in the measured window.
    sent: u64,
    /// Per client port: distinct frames of the measured window received,
    /// and payload bytes (after the 5-byte header) of those.
    got: BTreeMap<u16, (u64, u64)>,
    /// Per client port, per second since the start: frames received.
    per_second: BTreeMap<u16, Vec<u64>>,
    window_s: f64,
    /// Node c's process CPU over the window.
    node_cpu_ns: u64,
    /// What c charged the variant's sessions over the window (RCANE's
    /// accounting: each dispatch's thread CPU time).
    charged_ns: u64,
    /// Whether both variants ran side by side.
    side: bool,
    load1: String,
    counters: serde_json::Value,
}

impl RunResult {
    /// The variant's CPU, % of one core over the window: node c's process
    /// CPU when it ran alone, what c charged its sessions when both ran
    /// side by side.
    fn cpu_pct(&self) -> f64 {
        if self.side { self.charged_pct() } else { self.node_cpu_pct() }
    }
    /// Node c's process CPU % of one core over the window.
    fn node_cpu_pct(&self) -> f64 {
        self.node_cpu_ns as f64 / 1e7 / self.window_s
    }
    /// What c charged the variant's sessions, % of one core.
    fn charged_pct(&self) -> f64 {
        self.charged_ns as f64 / 1e7 / self.window_s
    }
    /// The smallest fraction of the window's frames any client received.
    fn min_fraction(&self) -> f64 {
        self.got.values().map(|g| g.0 as f64 / self.sent.max(1) as f64).fold(1.0, f64::min)
    }
    /// Mean received rate of a tier's streams, kbit/s of payload.
    fn tier_kbps(&self, tier: Tier) -> Option<f64> {
        let v: Vec<f64> = self
            .streams
            .iter()
            .filter(|s| s.tier == tier)
            .map(|s| self.got.get(&s.port).map_or(0.0, |g| g.1 as f64 * 8.0 / 1e3 / self.window_s))
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// Shared state of the receiver thread.
#[derive(Default)]
struct Rx {
    /// Per port: seq -> body length (first copy only).
    seen: BTreeMap<u16, BTreeMap<u32, usize>>,
    /// Per port: (arrival since start, s) of each packet.
    arrivals: BTreeMap<u16, Vec<f64>>,
    dump: BTreeMap<u16, Vec<u8>>,
}

/// One run of one variant on a fresh testbed.
fn run_one(
    a: &TranscoderArgs,
    variant: Variant,
    streams: Vec<Stream>,
    silver_vp: &str,
    dump: Option<&Path>,
) -> Result<RunResult> {
    let mut r = run_set(a, vec![(variant, streams)], silver_vp, &a.all_vp, dump)?;
    r.pop().ok_or_else(|| anyhow!("no result"))
}

/// The CPU node c has charged so far to the sessions of each set of
/// principals (hex), ns (guaranteed and slack time).
fn charged_ns(bed: &Bed, owners: &[Vec<String>]) -> Result<Vec<u64>> {
    let status = bed.status()?;
    let sessions = status["rcane"]["sessions"].as_array().ok_or_else(|| anyhow!("c's status has no sessions"))?;
    owners
        .iter()
        .map(|set| {
            let mine: Vec<&serde_json::Value> =
                sessions.iter().filter(|s| s["owner"].as_str().is_some_and(|o| set.iter().any(|p| p == o))).collect();
            if mine.len() != set.len() {
                bail!("c has {} sessions of the {} principals of a variant", mine.len(), set.len());
            }
            Ok(mine
                .iter()
                .map(|s| {
                    let c = &s["charges"];
                    c["cpu_guaranteed_ns"].as_u64().unwrap_or(0) + c["cpu_slack_ns"].as_u64().unwrap_or(0)
                })
                .sum())
        })
        .collect()
}

/// One run on a fresh testbed: one variant, or both side by side (each
/// with its own streams, on distinct client ports, fed by the same source
/// packets). One result per variant, in `set`'s order. A variant's CPU is
/// the node's process CPU when it runs alone, and what the node charged
/// its sessions when both run.
fn run_set(
    a: &TranscoderArgs,
    set: Vec<(Variant, Vec<Stream>)>,
    silver_vp: &str,
    all_vp: &str,
    dump: Option<&Path>,
) -> Result<Vec<RunResult>> {
    let anode = std::env::current_exe().context("locating the anode executable")?;
    let work = std::env::temp_dir().join(format!("anode-transcoder-{}", std::process::id()));
    let mut bed = Bed::plan(anode, work)?;
    bed.a_spin_us = a.receiver_spin_us;
    let c_log = bed.dir.join("tb/c/node.log");
    let modules = std::fs::canonicalize(&a.modules)
        .with_context(|| format!("{} (build the modules with scripts/setup)", a.modules.display()))?;
    let no_streams = Vec::new();
    let path_streams = set.iter().find(|(v, _)| *v == Variant::Path).map_or(&no_streams, |(_, s)| s);
    let paths: Vec<&Stream> = {
        let mut v: Vec<&Stream> = path_streams.iter().filter(|s| s.tier != Tier::Bronze).collect();
        v.extend(path_streams.iter().find(|s| s.tier == Tier::Bronze));
        v
    };
    // `anode module load` carries a module in one control datagram (at
    // most 64 KiB): the codecs are larger, so c loads them from its config.
    let mut extra = String::new();
    let mut owners = Vec::new();
    for (variant, _) in &set {
        match variant {
            Variant::Path => {
                // The receive path is user r's and path i user p<i>'s: each in
                // its own session of one VP, hence its own store.
                extra.push_str(&bed.session("r", std::slice::from_ref(&a.rx_vp))?);
                let mut mine = vec![bed.user_hex("r")?];
                for (i, s) in paths.iter().enumerate() {
                    let p = format!("p{i}");
                    bed.cmd(&["keys", "gen", "--name", &p, "--out", &bed.p("")])?;
                    let vp: &str = match s.tier {
                        Tier::Gold => &a.gold_vp,
                        Tier::Silver => silver_vp,
                        Tier::Bronze => &a.bronze_vp,
                    };
                    extra.push_str(&bed.session(&p, &[vp.to_string()])?);
                    mine.push(bed.user_hex(&p)?);
                }
                for (i, pod) in ["gold", "silver", "bronze"].iter().enumerate() {
                    extra.push_str(&bed.load("u", &modules, "tc-cache", Some((pod, &[])), i)?);
                }
                extra.push_str(&bed.load("u", &modules, "tc-aes", Some(("aes", &mine[1..])), 0)?);
                extra.push_str(&bed.load("r", &modules, "tc-rx", None, 0)?);
                for i in 0..paths.len() {
                    extra.push_str(&bed.load(&format!("p{i}"), &modules, "tc-path", None, i)?);
                }
                owners.push(mine);
            }
            Variant::All => {
                // User w's: not the pods' owner u, so that its session is its own.
                bed.cmd(&["keys", "gen", "--name", "w", "--out", &bed.p("")])?;
                extra.push_str(&bed.session("w", &[all_vp.to_string()])?);
                extra.push_str(&bed.load("w", &modules, "tc-all", None, 0)?);
                owners.push(vec![bed.user_hex("w")?]);
            }
        }
    }
    bed.start(&extra)?;
    // The clients at a.
    let c = Ipv4Addr::new(10, 0, 0, 3);
    let mut rxc = Client::connect(bed.dir.join("tb/a")).map_err(|e| anyhow!("a's application socket: {e}"))?;
    for s in set.iter().flat_map(|(_, s)| s) {
        rxc.register(s.port).map_err(|e| anyhow!("registering port {} at a: {e}", s.port))?;
    }
    let mut tx = Client::connect(bed.dir.join("tb/a")).map_err(|e| anyhow!("a's application socket: {e}"))?;
    // The a - c link's SA comes up a moment after the nodes start.
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Err(e) = tx.plain(c, 9, 64, b"hello") {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(&c_log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            bail!("a cannot send to c: {e}; c's log ends: {tail:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Set-ups, then a moment for them to run.
    for (variant, streams) in &set {
        match variant {
            Variant::Path => {
                let mut bronze_path = None;
                let mut n = 0u16;
                for s in streams {
                    let idx = match (s.tier, bronze_path) {
                        (Tier::Bronze, Some(i)) => i,
                        (Tier::Bronze, None) => {
                            bronze_path = Some(paths.len() as u16 - 1);
                            paths.len() as u16 - 1
                        }
                        _ => {
                            n += 1;
                            n - 1
                        }
                    };
                    let mut p = vec![b'S'];
                    p.extend_from_slice(&setup_bytes(s));
                    tx.plain(c, PATH_PORT + idx, 64, &p).map_err(|e| anyhow!("set-up: {e}"))?;
                    if a.wake == Wake::Alarm {
                        tx.plain(c, PATH_PORT + idx, 64, &[b'A', ALARM_MS]).map_err(|e| anyhow!("alarm: {e}"))?;
                    }
                }
            }
            Variant::All => {
                for s in streams {
                    tx.plain(c, CLIENT_SETUP, 64, &setup_bytes(s)).map_err(|e| anyhow!("set-up: {e}"))?;
                }
            }
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let frames = source_frames(DISTINCT)?;
    let n = (a.seconds / FRAME.as_secs_f64()).round() as u32;
    let warm = (1.0 / FRAME.as_secs_f64()).round() as u32;
    let state = Arc::new(Mutex::new(Rx::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let keep = dump.is_some();
    let receiver = {
        let (state, stop) = (state.clone(), stop.clone());
        std::thread::spawn(move || -> Result<()> {
            while !stop.load(Ordering::Relaxed) {
                let Some((port, p)) = rxc.recv(Duration::from_millis(50)).map_err(|e| anyhow!("receiving: {e}"))?
                else {
                    continue;
                };
                let at = start.elapsed().as_secs_f64();
                let mut r = state.lock().map_err(|_| anyhow!("poisoned"))?;
                if keep {
                    let d = r.dump.entry(port).or_default();
                    d.extend_from_slice(&(p.len() as u16).to_be_bytes());
                    d.extend_from_slice(&p);
                }
                r.arrivals.entry(port).or_default().push(at);
                if p.len() > 5 {
                    let seq = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
                    r.seen.entry(port).or_default().entry(seq).or_insert(p.len() - 5);
                }
            }
            Ok(())
        })
    };
    let ticks: Vec<u16> =
        if a.wake == Wake::Tick { (0..paths.len() as u16).map(|i| PATH_PORT + i).collect() } else { Vec::new() };
    let side = set.len() > 1;
    let (mut cpu0, mut t0, mut charged0) = (0, start, vec![0; owners.len()]);
    for i in 0..n {
        if i == warm {
            charged0 = charged_ns(&bed, &owners)?;
            cpu0 = node_cpu_ns(bed.c_pid);
            t0 = Instant::now();
        }
        let due = start + FRAME * i;
        if let Some(d) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        let mut p = i.to_be_bytes().to_vec();
        p.extend_from_slice(frames.get(i as usize % DISTINCT).map_or(&[][..], |f| f));
        if let Err(e) = tx.plain(c, SOURCE, 64, &p) {
            // Seen once: a's application socket reset; connect again, once.
            eprintln!("sending frame {i}: {e}; connecting again");
            tx = Client::connect(bed.dir.join("tb/a")).map_err(|e| anyhow!("a's application socket: {e}"))?;
            tx.plain(c, SOURCE, 64, &p).map_err(|e| anyhow!("sending frame {i}: {e}"))?;
        }
        if !ticks.is_empty() {
            let due = due + FRAME / 2;
            if let Some(d) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
            for &t in &ticks {
                tx.plain(c, t, 64, b"T").map_err(|e| anyhow!("tick: {e}"))?;
            }
        }
    }
    // The window ends a frame after the last one.
    std::thread::sleep(FRAME);
    let (cpu1, t1) = (node_cpu_ns(bed.c_pid), Instant::now());
    let charged1 = charged_ns(&bed, &owners)?;
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    receiver.join().map_err(|_| anyhow!("the receiver thread panicked"))??;
    let load1 = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load1 = load1.split_whitespace().next().unwrap_or("?").to_string();
    let counters = bed
        .status()
        .map(|s| json!({"jobs_busy": s["rcane"]["counters"]["jobs_busy"], "channels": s["modules"]["channels"]}))
        .unwrap_or(serde_json::Value::Null);
    let r = state.lock().map_err(|_| anyhow!("poisoned"))?;
    if let Some(d) = dump {
        std::fs::create_dir_all(d)?;
        for (port, bytes) in &r.dump {
            std::fs::write(d.join(format!("client-{port}.bin")), bytes)?;
        }
        let clients: Vec<serde_json::Value> = set
            .iter()
            .flat_map(|(_, s)| s)
            .map(|s| {
                json!({"port": s.port, "tier": s.tier.name(),
                       "key": s.key.map(|k| k.iter().map(|b| format!("{b:02x}")).collect::<String>())})
            })
            .collect();
        std::fs::write(d.join("clients.json"), serde_json::to_string_pretty(&json!({"clients": clients}))?)?;
        let logs = std::fs::read_to_string(bed.dir.join("tb/c/node.log")).unwrap_or_default();
        std::fs::write(d.join("node-c.log"), logs)?;
        std::fs::write(d.join("node-c-status.json"), serde_json::to_string_pretty(&counters)?)?;
    }
    let node_cpu_ns = cpu1.saturating_sub(cpu0);
    let mut out = Vec::new();
    for (i, (variant, streams)) in set.into_iter().enumerate() {
        let mut got = BTreeMap::new();
        let mut per_second = BTreeMap::new();
        for s in &streams {
            let seen = r.seen.get(&s.port);
            let in_window: Vec<usize> = seen.map(|m| m.range(warm..n).map(|(_, l)| *l).collect()).unwrap_or_default();
            got.insert(s.port, (in_window.len() as u64, in_window.iter().map(|l| *l as u64).sum()));
            let mut secs = vec![0u64; a.seconds.ceil() as usize + 1];
            for t in r.arrivals.get(&s.port).into_iter().flatten() {
                if let Some(c) = secs.get_mut(*t as usize) {
                    *c += 1;
                }
            }
            per_second.insert(s.port, secs);
        }
        let charged_ns = charged1.get(i).copied().unwrap_or(0).saturating_sub(charged0.get(i).copied().unwrap_or(0));
        out.push(RunResult {
            rep: 0,
            variant,
            streams,
            sent: u64::from(n - warm),
            got,
            per_second,
            window_s: t1.duration_since(t0).as_secs_f64(),
            node_cpu_ns,
            charged_ns,
            side,
            load1: load1.clone(),
            counters: counters.clone(),
        });
    }
    Ok(out)
}

fn summary_line(r: &RunResult) -> String {
    let tiers: Vec<String> = [Tier::Gold, Tier::Silver, Tier::Bronze]
        .iter()
        .filter_map(|t| r.tier_kbps(*t).map(|k| format!("{} {k:.1} kbit/s", t.name())))
        .collect();
    format!(
        "{} {} streams: CPU {:.1} % {} (node {:.1} %, charged {:.1} %), min received {:.3}, {}; load {}; jobs_busy {}",
        r.variant.name(),
        r.streams.len(),
        r.cpu_pct(),
        if r.side { "charged, side by side" } else { "node" },
        r.node_cpu_pct(),
        r.charged_pct(),
        r.min_fraction(),
        tiers.join(", "),
        r.load1,
        r.counters["jobs_busy"]
    )
}

fn count(r: &RunResult, t: Tier) -> usize {
    r.streams.iter().filter(|s| s.tier == t).count()
}

fn csv_row(r: &RunResult) -> String {
    let k = |t| r.tier_kbps(t).map_or(String::new(), |v| format!("{v:.2}"));
    format!(
        "{},{},{},{},{:.3},{:.2},{:.4},{},{},{},{},{},{},{},{:.2},{:.2}\n",
        r.variant.name(),
        count(r, Tier::Gold),
        count(r, Tier::Silver),
        count(r, Tier::Bronze),
        r.window_s,
        r.cpu_pct(),
        r.min_fraction(),
        k(Tier::Gold),
        k(Tier::Silver),
        k(Tier::Bronze),
        r.load1,
        r.counters["jobs_busy"],
        r.rep,
        if r.side { "charged" } else { "process" },
        r.node_cpu_pct(),
        r.charged_pct()
    )
}

const HEADER: &str = "variant,gold,silver,bronze,window_s,cpu_pct,min_received_fraction,gold_kbps,silver_kbps,bronze_kbps,load1,jobs_busy,rep,cpu_measure,node_cpu_pct,charged_cpu_pct\n";

/// `anode experiment transcoder`.
pub fn run(a: TranscoderArgs) -> Result<std::process::ExitCode> {
    if !(2.0..=120.0).contains(&a.seconds) {
        bail!("--seconds must be 2..=120");
    }
    let steps: Vec<&str> = a.steps.split(',').map(str::trim).collect();
    let all = steps.contains(&"all");
    for s in &steps {
        if !["all", "one", "table3", "fig4"].contains(s) {
            bail!("--steps: unknown step {s:?} (one, table3, fig4, all)");
        }
    }
    if a.table3.iter().chain(&a.fig4).any(|k| *k > MAX_SILVER) {
        bail!("at most {MAX_SILVER} silver streams");
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    if all || steps.contains(&"one") {
        let mut csv = String::from(HEADER);
        let mut per_sec = String::from("variant,port,tier,second,frames\n");
        for v in [Variant::Path, Variant::All] {
            let dump = a.dump.then(|| a.out.join(format!("one-{}", v.name())));
            let r = run_one(&a, v, streams(1, 1, 1), &a.silver_vp, dump.as_deref())?;
            eprintln!("one: {}", summary_line(&r));
            csv.push_str(&csv_row(&r));
            for s in &r.streams {
                for (sec, f) in r.per_second.get(&s.port).into_iter().flatten().enumerate() {
                    per_sec.push_str(&format!("{},{},{},{sec},{f}\n", v.name(), s.port, s.tier.name()));
                }
            }
        }
        write(&a.out, "transcoder-one.csv", &csv)?;
        write(&a.out, "transcoder-one-per-second.csv", &per_sec)?;
    }
    if all || steps.contains(&"table3") {
        let mut rows = Vec::new();
        let mut csv = String::from(HEADER);
        for &k in &a.table3 {
            if a.side_by_side {
                for rep in 0..a.repeat.max(1) {
                    let set = vec![
                        (Variant::Path, streams(1, k, 1)),
                        (Variant::All, streams_from(CLIENT_BASE + SIDE_OFFSET, 1, k, 1)),
                    ];
                    for mut r in run_set(&a, set, &a.silver_vp, &a.side_all_vp, None)? {
                        r.rep = rep;
                        eprintln!("table3 k={k} run {rep}: {}", summary_line(&r));
                        csv.push_str(&csv_row(&r));
                        rows.push(r);
                    }
                }
                continue;
            }
            for (rep, v) in repetitions(a.repeat) {
                let mut r = run_one(&a, v, streams(1, k, 1), &a.silver_vp, None)?;
                r.rep = rep;
                eprintln!("table3 k={k} run {rep}: {}", summary_line(&r));
                csv.push_str(&csv_row(&r));
                rows.push(r);
            }
        }
        write(&a.out, "transcoder-table3.csv", &csv)?;
        let summary = table3_summary(&rows);
        eprint!("{summary}");
        write(&a.out, "transcoder-table3-summary.csv", &summary)?;
        plot_table3(&rows, &a.out.join("transcoder-table3.png"))?;
    }
    if all || steps.contains(&"fig4") {
        let mut rows = Vec::new();
        let mut csv = String::from(HEADER);
        for &k in &a.fig4 {
            for (rep, v) in repetitions(a.repeat) {
                let mut r = run_one(&a, v, streams(5, k, 1), &a.fig4_silver_vp, None)?;
                r.rep = rep;
                eprintln!("fig4 k={k} run {rep}: {}", summary_line(&r));
                csv.push_str(&csv_row(&r));
                rows.push(r);
            }
        }
        write(&a.out, "transcoder-fig4.csv", &csv)?;
        plot_fig4(&rows, &a.out.join("transcoder-fig4.png"))?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// The runs of one point: `n` repetitions of both variants, path-based
/// first in even ones and all-in-one first in odd ones (so that neither
/// variant always runs on the warmer, or the noisier, side of a pair).
fn repetitions(n: u32) -> impl Iterator<Item = (u32, Variant)> {
    (0..n.max(1)).flat_map(|rep| {
        let order = if rep % 2 == 0 { [Variant::Path, Variant::All] } else { [Variant::All, Variant::Path] };
        order.map(|v| (rep, v))
    })
}

/// Median of `f` over the runs of `variant` with `k` silver streams (a
/// run the machine's other load slowed is an outlier here, not a shift).
fn median_of(rows: &[RunResult], variant: Variant, k: usize, f: impl Fn(&RunResult) -> f64) -> Option<f64> {
    let mut v: Vec<f64> = rows.iter().filter(|r| r.variant == variant && count(r, Tier::Silver) == k).map(f).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Table 3 per silver count: each variant's median CPU over its runs, the
/// ratio of the medians, the range of the per-repetition ratios, whether
/// every run was loss-free (`min_received_fraction` 1), and, for runs of
/// one variant at a time, each variant's median CPU outside dispatches
/// (node − charged: receiving, transmitting, timers, the loop).
fn table3_summary(rows: &[RunResult]) -> String {
    let mut ks: Vec<usize> = rows.iter().map(|r| count(r, Tier::Silver)).collect();
    ks.sort_unstable();
    ks.dedup();
    let mut out = String::from(
        "silver,runs,path_cpu_pct_median,all_cpu_pct_median,path_over_all,ratio_min,ratio_max,loss_free,path_outside_pct_median,all_outside_pct_median\n",
    );
    for k in ks {
        let (Some(p), Some(a)) = (
            median_of(rows, Variant::Path, k, RunResult::cpu_pct),
            median_of(rows, Variant::All, k, RunResult::cpu_pct),
        ) else {
            continue;
        };
        let at = |v: Variant, rep: u32| {
            rows.iter().find(|r| r.variant == v && r.rep == rep && count(r, Tier::Silver) == k).map(RunResult::cpu_pct)
        };
        let reps: Vec<u32> = {
            let mut v: Vec<u32> = rows.iter().filter(|r| count(r, Tier::Silver) == k).map(|r| r.rep).collect();
            v.sort_unstable();
            v.dedup();
            v
        };
        let ratios: Vec<f64> =
            reps.iter().filter_map(|&rep| Some(at(Variant::Path, rep)? / at(Variant::All, rep)?)).collect();
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let loss_free =
            rows.iter().filter(|r| count(r, Tier::Silver) == k).all(|r| r.min_fraction() >= 1.0 - f64::EPSILON);
        // CPU outside dispatches (node − charged), per variant: only when
        // each ran alone (side by side, the node's is shared).
        let outside = |v: Variant| {
            median_of(rows, v, k, |r| r.node_cpu_pct() - r.charged_pct())
                .filter(|_| rows.iter().all(|r| !r.side))
                .map_or(String::new(), |x| format!("{x:.2}"))
        };
        out.push_str(&format!(
            "{k},{},{p:.2},{a:.2},{:.4},{lo:.4},{hi:.4},{loss_free},{},{}\n",
            reps.len(),
            p / a,
            outside(Variant::Path),
            outside(Variant::All)
        ));
    }
    out
}

fn write(dir: &Path, name: &str, text: &str) -> Result<()> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    eprintln!("wrote {}", p.display());
    Ok(())
}

const BLUE: RGBColor = RGBColor(31, 119, 180);
const RED: RGBColor = RGBColor(214, 39, 40);
const GREEN: RGBColor = RGBColor(44, 160, 44);

/// Table 3: CPU % against silver streams, both variants.
fn plot_table3(rows: &[RunResult], out: &Path) -> Result<()> {
    super::plot::register_font()?;
    let root = BitMapBackend::new(out, (900, 560)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xmax = rows.iter().map(|r| count(r, Tier::Silver)).max().unwrap_or(1) as f64 + 0.5;
    let ymax = rows.iter().map(RunResult::cpu_pct).fold(10.0, f64::max) * 1.15;
    let mut c = ChartBuilder::on(&root)
        .caption(
            if rows.iter().any(|r| r.side) {
                "Table 3 side by side: CPU charged to each variant, 1 gold + 1 bronze + k silver (% of one core)"
            } else {
                "Table 3: node CPU, 1 gold + 1 bronze + k silver (% of one core)"
            },
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..xmax, 0f64..ymax)
        .map_err(|x| e(&x))?;
    c.configure_mesh().x_desc("silver streams").y_desc("CPU %").draw().map_err(|x| e(&x))?;
    let mut ks: Vec<usize> = rows.iter().map(|r| count(r, Tier::Silver)).collect();
    ks.sort_unstable();
    ks.dedup();
    for (v, col) in [(Variant::Path, BLUE), (Variant::All, RED)] {
        // The median of each point's runs, and every run as a small dot.
        let medians: Vec<(f64, f64)> =
            ks.iter().filter_map(|&k| Some((k as f64, median_of(rows, v, k, RunResult::cpu_pct)?))).collect();
        c.draw_series(LineSeries::new(medians.clone(), col.stroke_width(2)))
            .map_err(|x| e(&x))?
            .label(format!("{} (median of runs)", v.name()))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
        c.draw_series(medians.into_iter().map(|p| Circle::new(p, 4, col.filled()))).map_err(|x| e(&x))?;
        let runs: Vec<(f64, f64)> =
            rows.iter().filter(|r| r.variant == v).map(|r| (count(r, Tier::Silver) as f64, r.cpu_pct())).collect();
        c.draw_series(runs.into_iter().map(|p| Circle::new(p, 2, col.mix(0.5)))).map_err(|x| e(&x))?;
    }
    super::plot::legend(&mut c, SeriesLabelPosition::UpperLeft, 14).map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// Fig. 4: per-tier received rate against silver streams, both variants.
fn plot_fig4(rows: &[RunResult], out: &Path) -> Result<()> {
    super::plot::register_font()?;
    let root = BitMapBackend::new(out, (900, 560)).into_drawing_area();
    let e = |e: &dyn std::fmt::Display| anyhow!("drawing {}: {e}", out.display());
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let xmax = rows.iter().map(|r| count(r, Tier::Silver)).max().unwrap_or(1) as f64 + 0.5;
    let mut c = ChartBuilder::on(&root)
        .caption("Fig. 4: received rate per stream, 5 gold + 1 bronze + k silver", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(0f64..xmax, 0f64..220f64)
        .map_err(|x| e(&x))?;
    c.configure_mesh().x_desc("silver streams").y_desc("kbit/s (payload)").draw().map_err(|x| e(&x))?;
    for (t, col) in [(Tier::Gold, BLUE), (Tier::Silver, GREEN), (Tier::Bronze, RED)] {
        for v in [Variant::Path, Variant::All] {
            // The median of each point's runs.
            let mut ks: Vec<usize> = rows
                .iter()
                .filter(|r| r.variant == v && r.tier_kbps(t).is_some())
                .map(|r| count(r, Tier::Silver))
                .collect();
            ks.sort_unstable();
            ks.dedup();
            let pts: Vec<(f64, f64)> = ks
                .iter()
                .filter_map(|&k| Some((k as f64, median_of(rows, v, k, |r| r.tier_kbps(t).unwrap_or(0.0))?)))
                .collect();
            let style = if v == Variant::Path { col.stroke_width(2) } else { col.mix(0.5).stroke_width(1) };
            c.draw_series(LineSeries::new(pts.clone(), style))
                .map_err(|x| e(&x))?
                .label(format!("{}, {}", t.name(), v.name()))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
            c.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, style))).map_err(|x| e(&x))?;
        }
    }
    super::plot::legend(&mut c, SeriesLabelPosition::LowerLeft, 13).map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_encrypted_client_gets_its_own_key_and_setups_parse_as_the_modules_expect() {
        let s = streams(2, 3, 2);
        assert_eq!(s.len(), 7);
        let keys: std::collections::BTreeSet<_> = s.iter().filter_map(|s| s.key).collect();
        assert_eq!(keys.len(), 5, "gold and silver have distinct keys, bronze none");
        let b = setup_bytes(&s[0]);
        assert_eq!((b.len(), b[0], &b[1..5], u16::from_be_bytes([b[5], b[6]])), (23, 0, &[10, 0, 0, 1][..], 5000));
        assert_eq!(setup_bytes(&s[6]).len(), 7);
    }

    fn result(variant: Variant, rep: u32, node: f64, charged: f64, side: bool) -> RunResult {
        RunResult {
            variant,
            rep,
            streams: streams(1, 2, 1),
            sent: 10,
            got: BTreeMap::new(),
            per_second: BTreeMap::new(),
            window_s: 1.0,
            node_cpu_ns: (node * 1e7) as u64,
            charged_ns: (charged * 1e7) as u64,
            side,
            load1: "0".into(),
            counters: serde_json::Value::Null,
        }
    }

    #[test]
    fn the_table3_summary_gives_the_cpu_outside_dispatches_only_for_variants_run_alone() {
        let alone = [
            result(Variant::Path, 0, 12.0, 10.0, false),
            result(Variant::All, 0, 10.5, 10.0, false),
            result(Variant::All, 1, 11.5, 11.0, false),
            result(Variant::Path, 1, 14.0, 11.0, false),
        ];
        let s = table3_summary(&alone);
        let row: Vec<&str> = s.lines().nth(1).unwrap().split(',').collect();
        // Medians: path 13 (of 12, 14), all 11 (of 10.5, 11.5); per
        // repetition 12/10.5 and 14/11.5; outside: path 2.5, all 0.5.
        assert_eq!(row[..5], ["2", "2", "13.00", "11.00", format!("{:.4}", 13.0 / 11.0).as_str()], "{s}");
        assert_eq!(row[8..], ["2.50", "0.50"], "{s}");
        let side = [result(Variant::Path, 0, 30.0, 14.0, true), result(Variant::All, 0, 30.0, 14.0, true)];
        let s = table3_summary(&side);
        let row: Vec<&str> = s.lines().nth(1).unwrap().split(',').collect();
        assert_eq!(row[2..5], ["14.00", "14.00", "1.0000"], "{s}");
        assert_eq!(row[8..], ["", ""], "the node's CPU outside dispatches is shared: {s}");
    }
}
