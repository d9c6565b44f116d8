//! RCANE sessions on real daemons (issue 14): a principal opens a session
//! over its SA with a session credential; a CPU-bound module it loaded
//! runs in that session's VP; requests above the credential or the node's
//! capacity, with a forged credential, or naming another principal's
//! session are refused with typed answers; closing frees the reservation.
#![allow(clippy::unwrap_used)]

mod common;

use common::{ANODE, Scratch, UserLine, issue_cred, modules_dir, status, text, user_keys};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

impl UserLine {
    /// Issues a module credential for `modules/out/<module>.wasm` to the
    /// holder of `pubk` (interfaces `ifaces`, then `extra` options), saved
    /// as `<cred_name>`, and loads the module with it over `key`'s SA: the
    /// node's answer.
    fn load_module(
        &self,
        key: &Path,
        pubk: &Path,
        module: &str,
        cred_name: &str,
        ifaces: &str,
        extra: &[&str],
    ) -> Output {
        let wasm = modules_dir().join(format!("{module}.wasm"));
        let mut args = vec!["--kind", "module", "--module", wasm.to_str().unwrap(), "--interface", ifaces];
        args.extend_from_slice(extra);
        let cred = self.cred(pubk, cred_name, &args);
        self.run(key, &["module", "load", wasm.to_str().unwrap(), "--credential", cred.to_str().unwrap()])
    }
}

/// The line of [`UserLine::up`] for this file's tests.
fn up(tag: &str, names: &[&str]) -> (UserLine, PathBuf, Vec<(PathBuf, PathBuf)>) {
    UserLine::up("sessions", tag, names, &[])
}

fn session_of(o: &Output) -> String {
    let t = String::from_utf8_lossy(&o.stdout);
    t.split_whitespace().nth(1).unwrap_or_default().to_string()
}

fn principal_sessions(c: &Path) -> Vec<serde_json::Value> {
    let st = status(c);
    st["rcane"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !matches!(s["owner"].as_str(), Some("system") | Some("best-effort")))
        .cloned()
        .collect()
}

#[test]
fn sessions_open_run_modules_refuse_what_is_not_allowed_and_close() {
    let (env, c, keys) = up("all", &["u", "m"]);
    let mut keys = keys.into_iter();
    let (ukey, upub) = keys.next().unwrap();
    let (mkey, mpub) = keys.next().unwrap();
    // The user's CPU-bound module, loaded over the network: best-effort first.
    let o = env.load_module(&ukey, &upub, "burn", "burn.cred", "time", &["--cpu", "5000000"]);
    assert!(o.status.success(), "{}", text(&o));

    // A session credential: at most 40 % per VP and in total.
    let scred = env.cred(&upub, "u.session", &["--kind", "session", "--vp-share", "40%", "--total-share", "40%"]);
    let sc = scred.to_str().unwrap();
    // Above the credential: refused, saying so, and nothing opened.
    let o = env.run(&ukey, &["session", "open", "--credential", sc, "--vp", "2ms/4ms"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("refused by the credential"), "{}", text(&o));
    assert!(principal_sessions(&c).is_empty());
    // Another principal's credential presented by this user: refused.
    let mcred_s = env.cred(&mpub, "m.session", &["--kind", "session", "--vp-share", "40%", "--total-share", "40%"]);
    let o = env.run(&ukey, &["session", "open", "--credential", mcred_s.to_str().unwrap(), "--vp", "1ms/4ms"]);
    assert!(!o.status.success() && text(&o).contains("CredentialRefused"), "{}", text(&o));
    // A forged credential: refused.
    let forged = env.s.0.join("forged");
    let mut bytes = std::fs::read(&scred).unwrap();
    let n = bytes.len();
    bytes[n / 2] ^= 0x55;
    std::fs::write(&forged, &bytes).unwrap();
    let o = env.run(&ukey, &["session", "open", "--credential", forged.to_str().unwrap(), "--vp", "1ms/4ms"]);
    assert!(!o.status.success() && text(&o).contains("CredentialRefused"), "{}", text(&o));

    // Within the credential: granted; the module's work moves to the session.
    let o = env.run(&ukey, &["session", "open", "--credential", sc, "--vp", "1200us/4ms"]);
    assert!(o.status.success(), "{}", text(&o));
    let sid = session_of(&o);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mine = principal_sessions(&c);
    assert_eq!(mine.len(), 1, "{mine:?}");
    let vp = &mine[0]["vps"][0];
    assert_eq!(vp["slice_ns"].as_u64(), Some(1_200_000));
    assert!(vp["received_ns_total"]["guaranteed"].as_u64().unwrap() > 0, "the VP ran the module: {vp}");
    assert!(mine[0]["charges"]["cpu_guaranteed_ns"].as_u64().unwrap() > 0, "{}", mine[0]);
    // /metrics exports the same, Prometheus-style.
    let o = Command::new(ANODE).args(["status", "--metrics", "--run-dir"]).arg(&c).output().unwrap();
    let m = String::from_utf8_lossy(&o.stdout).to_string();
    let owner = mine[0]["owner"].as_str().unwrap();
    let line = m
        .lines()
        .find(|l| l.starts_with("anode_session_cpu_guaranteed_nanoseconds_total") && l.contains(owner))
        .unwrap_or_else(|| panic!("no session CPU metric for {owner}:\n{m}"));
    assert!(line.rsplit(' ').next().unwrap().parse::<u64>().unwrap() > 0, "{line}");
    assert!(m.contains("anode_vp_slice_received_ratio{"), "{m}");

    // A second user's credential is fine, but the node has no room for 90 %.
    let big = env.cred(&mpub, "m.big", &["--kind", "session", "--vp-share", "100%", "--total-share", "100%"]);
    let o = env.run(&mkey, &["session", "open", "--credential", big.to_str().unwrap(), "--vp", "3600us/4ms"]);
    assert!(!o.status.success() && text(&o).contains("refused by the node"), "{}", text(&o));
    // Naming the user's session: not Mallory's to show, change or close.
    for args in [vec!["session", "show", &sid], vec!["session", "close", &sid]] {
        let o = env.run(&mkey, &args);
        assert!(!o.status.success() && text(&o).contains("SessionNotYours"), "{args:?}: {}", text(&o));
    }
    let o = env.run(&ukey, &["session", "list"]);
    assert!(o.status.success() && text(&o).contains(&format!("session {sid}")), "{}", text(&o));
    // Change it at run time, within the credential, then beyond it.
    let vpid = String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("vp "))
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .to_string();
    let o = env.run(&ukey, &["session", "reserve", &sid, "--change", &format!("{vpid}=1ms/4ms")]);
    assert!(o.status.success(), "{}", text(&o));
    let o = env.run(&ukey, &["session", "reserve", &sid, "--vp", "1ms/4ms"]);
    assert!(!o.status.success() && text(&o).contains("refused by the credential"), "{}", text(&o));

    // Closing frees it; the module goes back to best-effort.
    let o = env.run(&ukey, &["session", "close", &sid]);
    assert!(o.status.success() && text(&o).contains("closed"), "{}", text(&o));
    assert!(principal_sessions(&c).is_empty());
    // The ledger agrees with the session's final account (within 1 %).
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let field = |name: &str| -> u64 {
        let i = out.find(&format!("{name}: ")).unwrap() + name.len() + 2;
        out[i..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    let used = field("cpu_guaranteed_ns") + field("cpu_slack_ns");
    assert!(used > 0);
    // The daemon hands charges to the ledger writer once a second: wait
    // for the session's last ones (up to 10 s on a loaded machine).
    let ledger_cpu = || -> (u64, serde_json::Value) {
        let o = Command::new(ANODE).args(["account", "--json", "--run-dir"]).arg(&c).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let cpu = v["totals"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| !matches!(t["principal"].as_str(), Some("system") | Some("best-effort")))
            .filter(|t| t["kind"].as_str().is_some_and(|k| k.starts_with("cpu")))
            .map(|t| t["amount"].as_u64().unwrap())
            .sum();
        (cpu, v["totals"].clone())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (ledger, totals) = loop {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let (cpu, totals) = ledger_cpu();
        if cpu >= used || std::time::Instant::now() > deadline {
            break (cpu, totals);
        }
    };
    let diff = (ledger as f64 - used as f64).abs() / used as f64;
    assert!(diff <= 0.01, "ledger {ledger} ns against the session's {used} ns: {totals}");
    let st = status(&c);
    assert!(st["rcane"]["counters"]["session_refused"].as_u64().unwrap() >= 6, "{}", st["rcane"]["counters"]);
    assert!(st["modules"]["invocations"].as_u64().unwrap() > 10, "the module kept running: {}", st["modules"]);
    // Its work moved to Best-Effort when the session closed: it still runs.
    let before = st["modules"]["invocations"].as_u64().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(status(&c)["modules"]["invocations"].as_u64().unwrap() > before, "the module outlived its session");
}

#[test]
fn an_expired_session_credential_is_refused() {
    let (env, _c, keys) = up("expired", &["u"]);
    let mut keys = keys.into_iter();
    let (ukey, upub) = keys.next().unwrap();
    let scred = env.cred(&upub, "u.session", &["--kind", "session", "--expires", "1s"]);
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let o = env.run(&ukey, &["session", "open", "--credential", scred.to_str().unwrap(), "--vp", "100us/4ms"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("CredentialExpired") || text(&o).contains("CredentialRefused"), "{}", text(&o));
}

#[test]
fn the_operator_lists_and_unloads_modules() {
    let (env, c, keys) = up("modules", &["u"]);
    let mut keys = keys.into_iter();
    let (ukey, upub) = keys.next().unwrap();
    let o = env.load_module(&ukey, &upub, "burn", "burn.cred", "time", &["--cpu", "5000000", "--expires", "1h"]);
    assert!(o.status.success(), "{}", text(&o));
    let list = |json: bool| {
        let mut cmd = Command::new(ANODE);
        cmd.args(["module", "list", "--run-dir"]).arg(&c);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let o = list(true);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let m = &v[0];
    let user = anode_sec::Identity::load(&ukey).unwrap();
    assert_eq!(m["principal"].as_str().unwrap(), anode_cred::PrincipalId(*user.public().as_bytes()).to_string());
    assert!(m["entries"].as_array().unwrap().iter().any(|e| e == "work"), "{m}");
    assert!(m["until_unix_s"].as_u64().is_some(), "the credential's expiry is shown: {m}");
    let id = m["id"].as_str().unwrap().to_string();
    assert!(text(&list(false)).contains(&id));
    let unload = |id: &str| Command::new(ANODE).args(["module", "unload", id, "--run-dir"]).arg(&c).output().unwrap();
    let o = unload(&id);
    assert!(o.status.success() && text(&o).contains("unloaded"), "{}", text(&o));
    assert!(text(&list(false)).contains("no modules loaded"));
    let o = unload(&id);
    assert!(!o.status.success() && text(&o).contains("no module"), "{}", text(&o));
    // Its alarm chain stopped with it: no more invocations.
    let before = status(&c)["modules"]["invocations"].as_u64().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert_eq!(status(&c)["modules"]["invocations"].as_u64().unwrap(), before);
}

/// Hostile modules beside a principal with a reservation (issue 14): the
/// hostile forwarder of RCANE's Fig. 1 (memory and sends until refused,
/// forever), a module that re-arms an alarm at 0 ms with nearly no work,
/// and one that asks for 100,000 alarms (refused at load: its host calls
/// exhaust its CPU bound), all best-effort.
/// The principal's session keeps being served in its periods, SNAP pings
/// through the node keep their answers, and each hostile module ends at
/// its limit.
#[test]
fn hostile_modules_do_not_cost_a_session_its_reservation() {
    let (env, c, keys) = up("hostile", &["v", "h"]);
    let mut keys = keys.into_iter();
    let (vkey, vpub) = keys.next().unwrap();
    let (hkey, hpub) = keys.next().unwrap();
    let load = |key: &Path, pubk: &Path, name: &str, ifaces: &str, extra: &[&str]| {
        let o = env.load_module(key, pubk, name, &format!("{name}.cred"), ifaces, extra);
        assert!(o.status.success(), "{name}: {}", text(&o));
    };
    // The hostile principal's modules, best-effort.
    load(&hkey, &hpub, "yielder", "time", &[]);
    // 100,000 alarms at init: every host call is charged fuel, so the flood
    // ends on its CPU bound and the load is refused, saying why.
    let o = env.load_module(&hkey, &hpub, "alarms", "alarms.cred", "time,state", &["--cpu", "10000000"]);
    assert!(!o.status.success() && text(&o).contains("CPU bound exceeded"), "{}", text(&o));
    // Last: it takes all of its principal's memory.
    load(&hkey, &hpub, "forwarder", "route,net,time", &[]);
    // The victim's session, then its CPU-bound module.
    let scred = env.cred(&vpub, "v.session", &["--kind", "session", "--vp-share", "30%", "--total-share", "30%"]);
    let o = env.run(&vkey, &["session", "open", "--credential", scred.to_str().unwrap(), "--vp", "1ms/4ms"]);
    assert!(o.status.success(), "{}", text(&o));
    load(&vkey, &vpub, "burn", "time", &["--cpu", "5000000"]);
    std::thread::sleep(std::time::Duration::from_millis(2000));
    // SNAP pings through b to c keep their answers.
    let o = Command::new(ANODE)
        .args(["ping", "10.0.0.3", "-c", "3", "-i", "0.1", "-W", "2", "--run-dir"])
        .arg(env.s.tb().join("a"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let mine = principal_sessions(&c);
    let victim = mine.iter().find(|s| s["vps"][0]["slice_ns"].as_u64() == Some(1_000_000)).unwrap();
    let vp = &victim["vps"][0];
    assert!(vp["received_ns_total"]["guaranteed"].as_u64().unwrap() > 0, "{vp}");
    assert!(vp["periods_with_95pct_of_slice"].as_u64().unwrap() > 0, "the session got whole slices: {vp}");
    // Each hostile module ran into its limit, and the node counted it.
    let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(&c).output().unwrap();
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let hostile = anode_cred::PrincipalId(*anode_sec::Identity::load(&hkey).unwrap().public().as_bytes()).to_string();
    let forwarder = list
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["principal"] == hostile.as_str() && m["entries"].as_array().unwrap().iter().any(|e| e == "flood"))
        .unwrap();
    assert!(
        forwarder["memory_used"].as_u64().unwrap() <= 16 << 20,
        "the principal stays under its memory cap (16 MiB, its credentials' largest): {forwarder}"
    );
    assert!(forwarder["counters"]["invocations"].as_u64().unwrap() > 10, "{forwarder}");
    let st = status(&c);
    assert!(st["modules"]["invocations"].as_u64().unwrap() > 100, "{}", st["modules"]);
    // The forwarder's packets reached b and were dropped there (no listener), 16 per burst at most.
    let b = status(&env.s.tb().join("b"));
    assert!(b["drops"]["no_listener"].as_u64().unwrap() > 0, "{}", b["drops"]);
    // It ran into its transmit limit at c (1.25 MB/s by default for a
    // principal without a session), and b sees no more than that.
    assert!(st["drops"]["tx_limit"].as_u64().unwrap() > 0, "{}", st["drops"]);
    let t0 = std::time::Instant::now();
    let n0 = b["drops"]["no_listener"].as_u64().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2000));
    let n1 = status(&env.s.tb().join("b"))["drops"]["no_listener"].as_u64().unwrap();
    let rate = (n1 - n0) as f64 * 1400.0 / t0.elapsed().as_secs_f64();
    let limit = anode_node::core::DEFAULT_TX_BYTES_PER_SEC as f64;
    assert!(n1 > n0 && rate <= 1.25 * limit, "{rate:.0} B/s of the forwarder's payload reached b, limit {limit}");
}

#[test]
fn session_requests_are_rate_limited_and_credentials_end_sessions() {
    let (env, c, keys) = up("limits", &["u"]);
    let mut keys = keys.into_iter();
    let (ukey, upub) = keys.next().unwrap();
    // A burst of 200 requests over one SA: the burst allowance (40) is
    // answered, the rest refused with RateLimited; none is lost unanswered.
    let o = env.run(&ukey, &["session", "list", "--repeat", "200"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    // "200 answers to 200 requests: 40 listed, 160 rate limited, 0 other"
    let n = |what: &str| -> u64 {
        let i = out.find(what).unwrap();
        out[..i].split_whitespace().last().unwrap().parse().unwrap()
    };
    assert_eq!(n("answers"), 200, "every request answered: {out}");
    assert!(n("listed") >= 40 && n("listed") < 100, "{out}");
    assert!(n("rate limited") >= 100, "{out}");
    let st = status(&c);
    assert!(st["rcane"]["counters"]["session_rate_limited"].as_u64().unwrap() >= 100, "{}", st["rcane"]["counters"]);
    // The burst was the control plane's work: charged to System.
    let system = st["rcane"]["sessions"].as_array().unwrap().iter().find(|s| s["owner"] == "system").unwrap().clone();
    assert!(system["charges"]["rx_packets"].as_u64().unwrap() >= 200, "{system}");
    assert!(system["charges"]["cpu_guaranteed_ns"].as_u64().unwrap() > 0, "{system}");
    // A session whose credential expires while it runs is closed then.
    // (Credential dates are whole seconds: the expiry is 4-5 s from now.)
    let scred = env.cred(&upub, "u.session", &["--kind", "session", "--expires", "5s"]);
    let o = env.run(&ukey, &["session", "open", "--credential", scred.to_str().unwrap(), "--vp", "100us/4ms"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(principal_sessions(&c).len(), 1);
    std::thread::sleep(std::time::Duration::from_millis(5500));
    assert!(principal_sessions(&c).is_empty(), "closed at its credential's expiry");
    let log = std::fs::read_to_string(c.join("node.log")).unwrap();
    assert!(log.contains("session closed: its credential expired"), "{log}");
}

#[test]
fn a_session_ends_when_its_principal_is_gone_even_mid_invocation_and_a_held_one_stays() {
    // SAs last 2 s and sessions outlive their principal's last SA by 1 s.
    let (env, c, keys) = UserLine::up("sessions", "gone", &["g", "h"], &["--sa-lifetime", "2", "--session-grace", "1"]);
    let mut keys = keys.into_iter();
    let (gkey, gpub) = keys.next().unwrap();
    let (hkey, hpub) = keys.next().unwrap();
    let mut sessions = Vec::new();
    for (key, pubk, name) in [(&gkey, &gpub, "g"), (&hkey, &hpub, "h")] {
        let scred = env.cred(
            pubk,
            &format!("{name}.session"),
            &["--kind", "session", "--vp-share", "30%", "--total-share", "30%"],
        );
        // A 100 µs slice: each of burn's invocations (~1.5 M fuel, a few
        // hundred µs) is preempted at least once, so the session's VP
        // nearly always holds a suspended invocation.
        let o = env.run(key, &["session", "open", "--credential", scred.to_str().unwrap(), "--vp", "100us/4ms"]);
        assert!(o.status.success(), "{}", text(&o));
        sessions.push(session_of(&o));
        let o = env.load_module(key, pubk, "burn", &format!("{name}.burn"), "time", &["--cpu", "5000000"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    // h keeps contacting the node; g goes away.
    let mut hold = env.command(&hkey, &["session", "hold", &sessions[1], "--every", "500ms", "--for", "8s"]);
    let hold = hold.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(800));
    let st = status(&c);
    assert_eq!(principal_sessions(&c).len(), 2);
    assert!(
        st["rcane"]["counters"]["preemptions"].as_u64().unwrap() > 0,
        "invocations were cut at slice ends: {}",
        st["rcane"]
    );
    // g's last SA is gone after 2 s, and its session 1 s later.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while principal_sessions(&c).len() > 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let left = principal_sessions(&c);
    assert_eq!(left.len(), 1, "{left:?}");
    let h_fp = anode_cred::PrincipalId(*anode_sec::Identity::load(&hkey).unwrap().public().as_bytes()).to_string();
    assert!(left[0]["owner"].as_str().unwrap().contains(&h_fp[..16]), "the held session stays: {}", left[0]);
    // The held session keeps getting whole slices after g's closed.
    let got = |v: &serde_json::Value| v["vps"][0]["received_ns_total"]["guaranteed"].as_u64().unwrap();
    let before = got(&left[0]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    let after = principal_sessions(&c);
    assert!(got(&after[0]) > before, "{}", after[0]);
    // g's module runs on, best-effort; the node answers SNAP pings.
    let o = Command::new(ANODE)
        .args(["ping", "10.0.0.3", "-c", "3", "-i", "0.1", "-W", "2", "--run-dir"])
        .arg(env.s.tb().join("a"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(&c).output().unwrap();
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 2, "both modules still loaded: {list}");
    // The ledger records why g's session ended (written within a second).
    let g_fp = anode_cred::PrincipalId(*anode_sec::Identity::load(&gkey).unwrap().public().as_bytes()).to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let reasons = loop {
        let o = Command::new(ANODE).args(["account", "--json", "--run-dir"]).arg(&c).output().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let reasons: Vec<(String, Option<String>)> = v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["principal"].as_str().unwrap_or("").to_string(), s["reason"].as_str().map(String::from)))
            .collect();
        if reasons.iter().any(|(_, r)| r.is_some()) || std::time::Instant::now() > deadline {
            break reasons;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
    };
    assert!(
        reasons.iter().any(|(p, r)| p.contains(&g_fp[..16]) && r.as_deref() == Some("principal-gone")),
        "{reasons:?}"
    );
    assert!(reasons.iter().all(|(p, r)| !p.contains(&h_fp[..16]) || r.is_none()), "{reasons:?}");
    let out = hold.wait_with_output().unwrap();
    assert!(out.status.success(), "hold: {}", text(&out));
}

#[test]
fn the_capsules_of_a_principal_with_a_session_run_in_it() {
    let (env, c, keys) = up("capsules", &["p"]);
    let (pkey, ppub) = keys.into_iter().next().unwrap();
    let scred = env.cred(&ppub, "p.session", &["--kind", "session", "--vp-share", "30%", "--total-share", "30%"]);
    let o = env.run(&pkey, &["session", "open", "--credential", scred.to_str().unwrap(), "--vp", "1ms/4ms"]);
    assert!(o.status.success(), "{}", text(&o));
    // Capsule pings from a to c under a credential naming the principal.
    let ping = modules_dir().join("ping.wasm");
    let cred = env.cred(
        &ppub,
        "ping.cred",
        &["--kind", "module", "--module", ping.to_str().unwrap(), "--interface", "route,net,time", "--cpu", "1000000"],
    );
    let o = Command::new(ANODE)
        .args(["ping", "10.0.0.3", "--capsule", "-c", "5", "-i", "0.05", "-W", "2", "--module"])
        .arg(&ping)
        .arg("--credential")
        .arg(&cred)
        .arg("--run-dir")
        .arg(env.s.tb().join("a"))
        .output()
        .unwrap();
    assert!(text(&o).contains("5 received"), "{}", text(&o));
    // At c, each ran as an event of the principal's session, charged to it.
    let mine = principal_sessions(&c);
    let pool = &mine[0]["pools"][0];
    let stats = pool["stats"].as_str().unwrap();
    let accepted: u64 = stats
        .split("accepted: ")
        .nth(1)
        .unwrap()
        .split(|ch: char| !ch.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(accepted >= 5, "{pool}");
    assert!(mine[0]["charges"]["cpu_guaranteed_ns"].as_u64().unwrap() > 0, "{}", mine[0]);
    assert_eq!(mine[0]["charges"]["module_loads"].as_u64(), Some(0), "no module was loaded: {}", mine[0]);
    // What was received for it is its session's, not Best-Effort's.
    assert!(mine[0]["charges"]["rx_packets"].as_u64().unwrap() >= 5, "{}", mine[0]);
    assert!(mine[0]["charges"]["rx_bytes"].as_u64().unwrap() > 0, "{}", mine[0]);
}

#[test]
fn sessions_from_the_config_open_at_start_and_a_refused_one_stops_the_start() {
    let s = Scratch::new("sessions", "static");
    let (akey, apub) = user_keys(&s.0.join("admin"), "admin");
    let (_ukey, upub) = user_keys(&s.0.join("u"), "u");
    let hex = |p: &Path| std::fs::read_to_string(p).unwrap().trim().to_string();
    let issue = |name: &str, args: &[&str]| issue_cred(&akey, &upub, &s.0.join(name), args);
    let burn = modules_dir().join("burn.wasm");
    let scred = issue("u.session", &["--kind", "session", "--vp-share", "30%", "--total-share", "30%"]);
    let mcred = issue("u.burn", &["--kind", "module", "--module", burn.to_str().unwrap(), "--interface", "time"]);
    let modules = |vp: &str| {
        format!(
            "[modules]\nadmin_key = \"{}\"\n[[modules.session]]\nprincipal = \"{}\"\ncredential = \"{}\"\nvp = [\"{vp}\"]\n\
             [[modules.load]]\nfile = \"{}\"\ncredential = \"{}\"\n",
            hex(&apub),
            hex(&upub),
            scred.display(),
            burn.display(),
            mcred.display()
        )
    };
    // Within the credential: the session is there from the start, without
    // any SA, and the principal's module runs in it.
    let cfg = modules("1ms/4ms");
    let line = common::Line::start_with(["", &cfg, ""]);
    assert!(
        common::eventually(10.0, || {
            let st = status(&line.run_dir(2));
            st["rcane"]["sessions"].as_array().unwrap().iter().any(|x| {
                x["vps"][0]["slice_ns"].as_u64() == Some(1_000_000)
                    && x["vps"][0]["received_ns_total"]["guaranteed"].as_u64().unwrap_or(0) > 0
            })
        }),
        "{}",
        status(&line.run_dir(2))["rcane"]
    );
    drop(line);
    // Above the credential: the node does not start, and says why.
    let o = common::node_refuses_to_start(&s.0, &modules("2ms/4ms"));
    assert!(text(&o).contains("[[modules.session]] #0") && text(&o).contains("Credential"), "{}", text(&o));
}

#[test]
fn a_session_heap_reservation_caps_its_principals_modules() {
    let (env, c, keys) = up("heap", &["s", "n"]);
    let mut keys = keys.into_iter();
    let (skey, spub) = keys.next().unwrap();
    let (nkey, npub) = keys.next().unwrap();
    // s reserves 2 MiB of heap in its session; n has no session.
    let scred = env.cred(&spub, "s.session", &["--kind", "session", "--vp-share", "30%", "--total-share", "30%"]);
    let o = env
        .run(&skey, &["session", "open", "--credential", scred.to_str().unwrap(), "--vp", "1ms/4ms", "--heap", "2MiB"]);
    assert!(o.status.success(), "{}", text(&o));
    for (key, pubk, name) in [(&skey, &spub, "s"), (&nkey, &npub, "n")] {
        let o =
            env.load_module(key, pubk, "forwarder", &format!("{name}.fwd"), "route,net,time", &["--memory", "8MiB"]);
        assert!(o.status.success(), "{name}: {}", text(&o));
    }
    // The forwarder grows its memory by a page per burst until refused.
    let used = |who: &Path| -> u64 {
        let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(&c).output().unwrap();
        let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let fp = anode_cred::PrincipalId(*anode_sec::Identity::load(who).unwrap().public().as_bytes()).to_string();
        list.as_array().unwrap().iter().find(|m| m["principal"] == fp.as_str()).unwrap()["memory_used"]
            .as_u64()
            .unwrap()
    };
    assert!(
        common::eventually(15.0, || used(&nkey) > 4 << 20),
        "the principal without a session grows to its grant: {}",
        used(&nkey)
    );
    assert!(used(&skey) <= 2 << 20, "the session's principal stays within its reservation: {}", used(&skey));
    assert!(used(&skey) > 1 << 20, "and did grow to it: {}", used(&skey));
    // Its session charges the reservation over time (by reserved size).
    let mine = principal_sessions(&c);
    assert!(mine[0]["charges"]["heap_byte_seconds"].as_u64().unwrap() > 0, "{}", mine[0]);
}

/// A module that asks its session for 4 MiB of heap, then (300 ms later)
/// for 1 GiB, through `session.heap_request`; 300 ms later still it grows
/// its memory to 3.5 MiB, past 80 % of 4 MiB, and its `heap_pressure`
/// entry asks for 8 MiB (issue 15).
const HEAP_ASK_WAT: &str = r#"(module
  (import "anode" "register" (func $reg (param i32 i32 i32) (result i32)))
  (import "time" "set_alarm" (func $alarm (param i64 i32 i32) (result i32)))
  (import "session" "heap_request" (func $ask (param i64) (result i32)))
  (memory (export "memory") 1)
  (global $n (mut i32) (i32.const 0))
  (data (i32.const 0) "tick")
  (data (i32.const 8) "heap_pressure")
  (func $tick (param i32 i32) (result i32)
    (global.set $n (i32.add (global.get $n) (i32.const 1)))
    (if (i32.eq (global.get $n) (i32.const 1)) (then (drop (call $ask (i64.const 4194304)))))
    (if (i32.eq (global.get $n) (i32.const 2)) (then (drop (call $ask (i64.const 1073741824)))))
    (if (i32.eq (global.get $n) (i32.const 3)) (then (drop (memory.grow (i32.const 55)))))
    (if (i32.lt_u (global.get $n) (i32.const 3)) (then (drop (call $alarm (i64.const 300) (i32.const 0) (i32.const 4)))))
    (i32.const 0))
  (func $pressure (param i32 i32) (result i32) (call $ask (i64.const 8388608)))
  (table (export "__indirect_function_table") 2 funcref)
  (elem (i32.const 0) $tick $pressure)
  (func (export "anode_init")
    (drop (call $reg (i32.const 0) (i32.const 4) (i32.const 0)))
    (drop (call $reg (i32.const 8) (i32.const 13) (i32.const 1)))
    (drop (call $alarm (i64.const 100) (i32.const 0) (i32.const 4)))))"#;

#[test]
fn a_module_asks_its_session_for_heap_and_admission_decides() {
    let (env, c, keys) = up("heapask", &["s"]);
    let (skey, spub) = keys.into_iter().next().unwrap();
    // The session credential allows 16 MiB of heap (the issue default).
    let scred = env.cred(&spub, "s.session", &["--kind", "session", "--vp-share", "30%", "--total-share", "30%"]);
    let o = env
        .run(&skey, &["session", "open", "--credential", scred.to_str().unwrap(), "--vp", "1ms/4ms", "--heap", "2MiB"]);
    assert!(o.status.success(), "{}", text(&o));
    let wasm = env.s.0.join("heapask.wasm");
    std::fs::write(&wasm, wat::parse_str(HEAP_ASK_WAT).unwrap()).unwrap();
    let w = wasm.to_str().unwrap();
    let cred = env.cred(&spub, "s.module", &["--kind", "module", "--module", w, "--interface", "time"]);
    let o = env.run(&skey, &["module", "load", w, "--credential", cred.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let heap_of = || -> (u64, serde_json::Value) {
        let mine = principal_sessions(&c);
        let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(&c).output().unwrap();
        let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (mine[0]["heap_bytes"].as_u64().unwrap(), list[0]["heap"].clone())
    };
    // 4 MiB is within the credential: granted, and the sandbox's account follows.
    assert!(common::eventually(10.0, || heap_of().0 == 4 << 20), "{:?}", heap_of());
    assert!(common::eventually(5.0, || heap_of().1["reservation"].as_u64() == Some(4 << 20)), "{:?}", heap_of());
    // 1 GiB is not: refused, the reservation stays.
    let refused = || status(&c)["rcane"]["counters"]["session_refused"].as_u64().unwrap_or(0);
    assert!(common::eventually(5.0, || refused() >= 1), "{}", status(&c)["rcane"]);
    assert_eq!(heap_of().0, 4 << 20, "{:?}", heap_of());
    // Past 80 % of 4 MiB its pressure entry runs (in its session) and asks for 8 MiB.
    assert!(common::eventually(10.0, || heap_of().0 == 8 << 20), "{:?}", heap_of());
    let (_, h) = heap_of();
    assert_eq!(h["pressure_calls"].as_u64(), Some(1), "{h}");
    assert!(h["memory"].as_u64().unwrap() == 56 * (64 << 10), "its memory is charged: {h}");
    assert_eq!(h["reservation"].as_u64(), Some(8 << 20), "{h}");
}

#[test]
fn the_period_log_records_every_vp_period_and_makes_a_fig11_trace() {
    let (env, c, keys) = UserLine::up("sessions", "periods", &["p"], &["--period-log"]);
    let (pkey, ppub) = keys.into_iter().next().unwrap();
    let scred = env.cred(&ppub, "p.session", &["--kind", "session", "--vp-share", "30%", "--total-share", "30%"]);
    let o = env.run(&pkey, &["session", "open", "--credential", scred.to_str().unwrap(), "--vp", "400us/4ms"]);
    assert!(o.status.success(), "{}", text(&o));
    let vp = String::from_utf8_lossy(&o.stdout).split("VPs added: ").nth(1).unwrap().trim().to_string();
    let o = env.load_module(&pkey, &ppub, "burn", "p.burn", "time", &["--cpu", "5000000"]);
    assert!(o.status.success(), "{}", text(&o));
    std::thread::sleep(std::time::Duration::from_millis(1000));
    // The daemons stop (SIGTERM): the writer thread writes what is left.
    let o = Command::new(ANODE).args(["testbed", "down", "--dir"]).arg(env.s.tb()).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let log = std::fs::read_to_string(c.join("periods.csv")).unwrap();
    assert!(log.starts_with("vp,session,start_ns,end_ns,slice_ns,received_ns,slack_ns,idle\n"), "{log}");
    let mine: Vec<&str> = log.lines().filter(|l| l.starts_with(&format!("{vp},"))).collect();
    assert!(mine.len() > 100, "about 250 periods of 4 ms in a second: {}\n{log}", mine.len());
    let out = env.s.0.join("trace.csv");
    let o = Command::new(ANODE)
        .args(["experiment", "from-periods"])
        .arg(c.join("periods.csv"))
        .args(["--load", &format!("B={vp}"), "--best-effort", "A=1.1", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new(ANODE).args(["experiment", "stats"]).arg(&out).output().unwrap();
    assert!(o.status.success() && text(&o).contains("B"), "{}", text(&o));
}

#[test]
fn code_staged_for_a_load_is_held_in_the_session_heap_and_a_staging_past_it_is_refused() {
    let (env, c, keys) = up("staged", &["s"]);
    let (skey, spub) = keys.into_iter().next().unwrap();
    let scred = env.cred(&spub, "s.session", &["--kind", "session", "--vp-share", "30%", "--total-share", "30%"]);
    let o = env.run(
        &skey,
        &["session", "open", "--credential", scred.to_str().unwrap(), "--vp", "1ms/4ms", "--heap", "128KiB"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let sid = session_of(&o);
    // A module of 150,000 bytes goes in chunks ahead of its load request,
    // and 150,000 bytes do not fit in a 128 KiB session heap.
    let mut code = std::fs::read(modules_dir().join("forwarder.wasm")).unwrap();
    common::pad_wasm(&mut code, 150_000);
    let wasm = env.s.0.join("big.wasm");
    std::fs::write(&wasm, &code).unwrap();
    let w = wasm.to_str().unwrap();
    let cred = env.cred(&spub, "big.cred", &["--kind", "module", "--module", w, "--interface", "route,net,time"]);
    let load = || env.run(&skey, &["module", "load", w, "--credential", cred.to_str().unwrap()]);
    let o = load();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(t.contains("staged code of 150000 bytes does not fit in the session's heap reservation"), "{t}");
    let st = status(&c);
    assert_eq!(st["drops"]["staging_refused"], 1, "{}", st["drops"]);
    assert_eq!(st["modules"]["modules"].as_array().map(Vec::len), Some(0), "nothing loaded");
    // With a larger reservation the same load is staged and loaded, and
    // the staged bytes are given back to the heap once it is.
    let o = env.run(&skey, &["session", "reserve", &sid, "--heap", "4MiB"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = load();
    assert!(o.status.success() && text(&o).contains("loaded m"), "{}", text(&o));
    let o = Command::new(ANODE).args(["module", "list", "--json", "--run-dir"]).arg(&c).output().unwrap();
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let heap = &list[0]["heap"];
    assert_eq!(heap["staged"], 0, "{heap}");
    assert!(heap["refusals"].as_u64() >= Some(1), "the refused staging is counted on the account: {heap}");
}
