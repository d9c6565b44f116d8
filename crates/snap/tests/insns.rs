//! Per-instruction tests written in assembler text.
//!
//! The cases live in `insns.snapt`, in the spirit of wasmtime's `.wast` files.
//! Each case starts with a `=== op/what` line, holds assembler source (the
//! syntax [`anode_snap::asm::assemble`] accepts) and ends with expectation
//! lines starting with `---`:
//!
//! | line | checks |
//! |---|---|
//! | `--- stack: V, V` | the final stack, top first, each value as [`TraceView::render`] shows it (empty: `--- stack:`) |
//! | `--- end: exit\|forwarded\|delivered` | how the packet ended |
//! | `--- fault: KIND [at N \| on arrival]` | the fault kind (snake case, [`FAULT_KINDS`]) and the faulting instruction's index, or that it came before execution |
//! | `--- send: DEST rb N [ep N] [src A] [port N] [heap N] [stack N\|[V, V]] [forward\|child]` | the packets sent, in order; `stack [..]` lists the child's stack top first (as `Value`'s `Debug`) |
//! | `--- deliver: PORT HEX` | the payloads delivered, in order (lowercase hex, may be empty) |
//! | `--- send: none`, `--- deliver: none` | no packet sent / no payload delivered |
//! | `--- executed: N` | instructions executed |
//! | `--- log: TEXT` | the `print` output, one line per expectation, in order |
//! | `--- rb: N` | the resource bound the packet kept (`Outcome::rb_left`) |
//! | `--- asm-error[: TEXT]` | the source does not assemble (and the error mentions TEXT) |
//!
//! Only the expectations given are checked, with one implicit one: a case
//! that has no `--- fault` line must not fault. Expectations of a kind that
//! can repeat (`send`, `deliver`, `log`) list all of them once one is given.
//!
//! Comment lines in a case's source can set up the run:
//! - `; node: interfaces=N now_ms=T` — the node's interface count (default 2)
//!   and clock (default 123456);
//! - `; vm: mtu=N` — the VM's MTU (default [`anode_snap::vm::DEFAULT_MTU`]);
//! - `; patch: OFFSET HEX` — overwrite bytes of the assembled packet (to build
//!   malformed packets the assembler refuses to produce);
//! - `; append: HEX` — bytes after the packet (trailing garbage);
//! - `; xfail: WHY` — a known discrepancy between the VM and docs/snap.md:
//!   the expectations state what the document says, and the case passes
//!   while they do *not* hold (so it fails once the discrepancy is fixed,
//!   as a reminder to remove the marker).
//!
//! Every case runs on a node 10.0.0.2 with neighbours 10.0.0.1 and 10.0.0.3,
//! routes 10.0.0.1→10.0.0.1, 10.0.0.3→10.0.0.3, 10.0.0.4→10.0.0.3, a clock
//! at 123456 ms and the built-in services. It runs twice: in a buffer with
//! room for in-place execution and in an exact-size buffer (which makes the
//! VM copy the packet first); both runs must observe exactly the same.

use anode_snap::asm::assemble;
use anode_snap::fuzzing::traced_and_untraced_agree;
use anode_snap::ops::{ALL_OPS, Insn, Op};
use anode_snap::vm::{Action, End, FAULT_KINDS, SendKind, SimpleNode, TraceView, Tracer, Vm, VmConfig};
use anode_snap::wire::{Packet, Repr};
use anode_snap::{Tag, Value};
use core::net::Ipv4Addr;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

const FILE: &str = "insns.snapt";
const DATA: &str = include_str!("insns.snapt");

// ---------------------------------------------------------------------------
// The data file
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
struct SendExp {
    dest: Ipv4Addr,
    rb: u16,
    ep: Option<u16>,
    src: Option<Ipv4Addr>,
    port: Option<u16>,
    heap: Option<u16>,
    stack_len: Option<u16>,
    stack: Option<String>,
    kind: Option<SendKind>,
}

#[derive(Debug, Clone, PartialEq)]
enum Expect {
    Stack(String),
    End(String),
    Fault {
        kind: String,
        at: Option<Option<u16>>,
    },
    Send(SendExp),
    /// `--- send: none`
    NoSends,
    Deliver {
        port: u16,
        bytes: Vec<u8>,
    },
    /// `--- deliver: none`
    NoDeliveries,
    Executed(u32),
    Log(String),
    Rb(u16),
    AsmError(Option<String>),
}

#[derive(Debug, Clone)]
struct Case {
    name: String,
    /// Line of the `===` header.
    line: usize,
    src: String,
    /// (line, expectation)
    expects: Vec<(usize, Expect)>,
    interfaces: u8,
    now_ms: u64,
    mtu: Option<usize>,
    patches: Vec<(usize, Vec<u8>)>,
    append: Vec<u8>,
    xfail: Option<String>,
}

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    if !s.is_ascii() {
        return Err(format!("bad hex `{s}`"));
    }
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits in `{s}`"));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| format!("bad hex `{s}`: {e}")))
        .collect()
}

fn parse_num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.trim().parse().map_err(|_| format!("expected {what}, found `{s}`"))
}

fn parse_addr(s: &str) -> Result<Ipv4Addr, String> {
    s.trim().parse().map_err(|_| format!("expected an address, found `{s}`"))
}

fn parse_send(rest: &str) -> Result<SendExp, String> {
    let mut toks: Vec<String> = Vec::new();
    let mut chars = rest.trim().chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '[' {
            let mut t = String::new();
            for c in chars.by_ref() {
                t.push(c);
                if c == ']' {
                    break;
                }
            }
            if !t.ends_with(']') {
                return Err("unterminated `[`".into());
            }
            toks.push(t);
        } else {
            let mut t = String::new();
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                t.push(c);
                chars.next();
            }
            toks.push(t);
        }
    }
    let mut it = toks.into_iter();
    let dest = parse_addr(&it.next().ok_or("missing destination")?)?;
    let mut e =
        SendExp { dest, rb: 0, ep: None, src: None, port: None, heap: None, stack_len: None, stack: None, kind: None };
    let mut rb = None;
    while let Some(k) = it.next() {
        match k.as_str() {
            "forward" => e.kind = Some(SendKind::Forward),
            "child" => e.kind = Some(SendKind::Child),
            _ => {
                let v = it.next().ok_or_else(|| format!("`{k}` needs a value"))?;
                match k.as_str() {
                    "rb" => rb = Some(parse_num(&v, "a resource bound")?),
                    "ep" => e.ep = Some(parse_num(&v, "an entry point")?),
                    "src" => e.src = Some(parse_addr(&v)?),
                    "port" => e.port = Some(parse_num(&v, "a port")?),
                    "heap" => e.heap = Some(parse_num(&v, "a heap length")?),
                    "stack" => {
                        if let Some(inner) = v.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
                            e.stack = Some(inner.trim().to_owned());
                        } else {
                            e.stack_len = Some(parse_num(&v, "a stack length or `[values]`")?);
                        }
                    }
                    _ => return Err(format!("unknown send field `{k}`")),
                }
            }
        }
    }
    e.rb = rb.ok_or("missing `rb N`")?;
    Ok(e)
}

fn parse_expect<'a>(text: &'a str) -> Result<Expect, String> {
    let body = text.trim_start_matches('-').trim();
    let (key, rest) = match body.split_once(':') {
        Some((k, r)) => (k.trim(), Some(r.trim())),
        None => (body, None),
    };
    let missing = || format!("`--- {key}` needs `: value`");
    let need = |r: Option<&'a str>| r.ok_or_else(missing);
    Ok(match key {
        "stack" => Expect::Stack(need(rest)?.to_owned()),
        "end" => {
            let v = need(rest)?;
            if !matches!(v, "exit" | "forwarded" | "delivered") {
                return Err(format!("unknown end `{v}` (exit, forwarded or delivered)"));
            }
            Expect::End(v.to_owned())
        }
        "fault" => {
            let v = need(rest)?;
            let mut words = v.split_whitespace();
            let kind = words.next().ok_or("missing fault kind")?.to_owned();
            if !FAULT_KINDS.contains(&kind.as_str()) {
                return Err(format!("unknown fault kind `{kind}`"));
            }
            let at = match (words.next(), words.next(), words.next()) {
                (None, _, _) => None,
                (Some("at"), Some(n), None) => Some(Some(parse_num(n, "an instruction index")?)),
                (Some("on"), Some("arrival"), None) => Some(None),
                _ => return Err(format!("expected `KIND [at N | on arrival]`, found `{v}`")),
            };
            Expect::Fault { kind, at }
        }
        "send" if rest == Some("none") => Expect::NoSends,
        "send" => Expect::Send(parse_send(need(rest)?)?),
        "deliver" if rest == Some("none") => Expect::NoDeliveries,
        "deliver" => {
            let v = need(rest)?;
            let (port, hex) = v.split_once(char::is_whitespace).unwrap_or((v, ""));
            Expect::Deliver { port: parse_num(port, "a port")?, bytes: parse_hex(hex)? }
        }
        "executed" => Expect::Executed(parse_num(need(rest)?, "a count")?),
        "log" => Expect::Log(need(rest)?.to_owned()),
        "rb" => Expect::Rb(parse_num(need(rest)?, "a resource bound")?),
        "asm-error" => Expect::AsmError(rest.filter(|r| !r.is_empty()).map(str::to_owned)),
        _ => return Err(format!("unknown expectation `--- {key}`")),
    })
}

const SETUP_KEYS: &[&str] = &["node", "vm", "patch", "append", "xfail"];

/// Whether `text` (a trimmed line) is a case-setup comment: `; KEY: ...`.
fn is_setup_comment(text: &str) -> bool {
    let Some(body) = text.strip_prefix([';', '#']) else { return false };
    body.split_once(':').is_some_and(|(k, _)| SETUP_KEYS.contains(&k.trim()))
}

/// Applies a case-setup comment (`; node: ...` etc.) to `case`.
fn setup_comment(case: &mut Case, text: &str) -> Result<(), String> {
    let body = text.trim_start_matches([';', '#']).trim();
    let Some((key, rest)) = body.split_once(':') else { return Ok(()) };
    let rest = rest.trim();
    match key.trim() {
        "node" => {
            for kv in rest.split_whitespace() {
                match kv.split_once('=') {
                    Some(("interfaces", n)) => case.interfaces = parse_num(n, "an interface count")?,
                    Some(("now_ms", n)) => case.now_ms = parse_num(n, "a time in milliseconds")?,
                    _ => return Err(format!("unknown node setting `{kv}`")),
                }
            }
        }
        "vm" => {
            for kv in rest.split_whitespace() {
                match kv.split_once('=') {
                    Some(("mtu", n)) => case.mtu = Some(parse_num(n, "an MTU")?),
                    _ => return Err(format!("unknown vm setting `{kv}`")),
                }
            }
        }
        "patch" => {
            let (off, hex) = rest.split_once(char::is_whitespace).ok_or("expected `; patch: OFFSET HEX`")?;
            case.patches.push((parse_num(off, "a byte offset")?, parse_hex(hex)?));
        }
        "append" => case.append.extend(parse_hex(rest)?),
        "xfail" => {
            if rest.is_empty() {
                return Err("`; xfail:` needs a reason".into());
            }
            case.xfail = Some(rest.to_owned());
        }
        _ => {}
    }
    Ok(())
}

fn parse_file(data: &str) -> Result<Vec<Case>, String> {
    let mut cases: Vec<Case> = Vec::new();
    let mut names = BTreeMap::new();
    for (i, raw) in data.lines().enumerate() {
        let line = i + 1;
        let err = |m: String| format!("{FILE}:{line}: {m}");
        let t = raw.trim();
        if let Some(name) = t.strip_prefix("===") {
            let name = name.trim();
            if name.is_empty() || name.contains(char::is_whitespace) {
                return Err(err(format!("bad case name `{name}`")));
            }
            if let Some(first) = names.insert(name.to_owned(), line) {
                return Err(err(format!("duplicate case `{name}` (first on line {first})")));
            }
            cases.push(Case {
                name: name.to_owned(),
                line,
                src: String::new(),
                expects: Vec::new(),
                interfaces: 2,
                now_ms: 123_456,
                mtu: None,
                patches: Vec::new(),
                append: Vec::new(),
                xfail: None,
            });
            continue;
        }
        let comment_or_blank = t.is_empty() || t.starts_with(';') || t.starts_with('#');
        let Some(case) = cases.last_mut() else {
            if comment_or_blank {
                continue;
            }
            return Err(err("text before the first `=== name` line".into()));
        };
        if t.starts_with("---") {
            let e = parse_expect(t).map_err(|m| err(format!("case {}: {m}", case.name)))?;
            case.expects.push((line, e));
            continue;
        }
        if !case.expects.is_empty() {
            // Only comments may follow the expectations (e.g. a section
            // heading before the next case); they belong to no case.
            if !comment_or_blank {
                return Err(err(format!("case {}: source after its expectations (missing `===`?)", case.name)));
            }
            if is_setup_comment(t) {
                return Err(err(format!("case {}: setup comment after its expectations", case.name)));
            }
            continue;
        }
        if is_setup_comment(t) {
            setup_comment(case, t).map_err(|m| err(format!("case {}: {m}", case.name)))?;
        }
        case.src.push_str(raw);
        case.src.push('\n');
    }
    for c in &cases {
        if c.expects.is_empty() {
            return Err(format!("{FILE}:{}: case {} has no expectations", c.line, c.name));
        }
        let asm_err = c.expects.iter().any(|(_, e)| matches!(e, Expect::AsmError(_)));
        if asm_err && c.expects.len() > 1 {
            return Err(format!("{FILE}:{}: case {}: `--- asm-error` must be its only expectation", c.line, c.name));
        }
        let has = |f: fn(&Expect) -> bool| c.expects.iter().any(|(_, e)| f(e));
        if (has(|e| matches!(e, Expect::NoSends)) && has(|e| matches!(e, Expect::Send(_))))
            || (has(|e| matches!(e, Expect::NoDeliveries)) && has(|e| matches!(e, Expect::Deliver { .. })))
        {
            return Err(format!("{FILE}:{}: case {}: `none` mixed with other send/deliver lines", c.line, c.name));
        }
        let ends = c.expects.iter().filter(|(_, e)| matches!(e, Expect::End(_) | Expect::Fault { .. })).count();
        if ends > 1 {
            return Err(format!("{FILE}:{}: case {}: more than one `end`/`fault` expectation", c.line, c.name));
        }
    }
    Ok(cases)
}

// ---------------------------------------------------------------------------
// Running a case
// ---------------------------------------------------------------------------

/// Records the stack after the last instruction, and which instructions ran.
#[derive(Default)]
struct Capture {
    stack: Option<Vec<String>>,
    ok_ops: BTreeSet<Op>,
    fault_op: Option<Op>,
}

impl Tracer for Capture {
    const ENABLED: bool = true;
    fn step(&mut self, _pc: usize, insn: Result<Insn, u32>, view: &TraceView<'_>) {
        self.stack = Some(view.stack().iter().rev().map(|&v| view.render(v)).collect());
        if let Ok(i) = insn {
            if view.fault.is_some() {
                self.fault_op = Some(i.op);
            } else {
                self.ok_ops.insert(i.op);
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Act {
    Send { dest: Ipv4Addr, kind: SendKind, bytes: Vec<u8> },
    Deliver { port: u16, bytes: Vec<u8> },
}

/// Everything observable about one run.
#[derive(Debug, Clone, PartialEq)]
struct Observed {
    end: End,
    stack: Option<Vec<String>>,
    actions: Vec<Act>,
    log: String,
    executed: u32,
    rb_left: u16,
    ok_ops: BTreeSet<Op>,
    fault_op: Option<Op>,
}

fn node(interfaces: u8, now_ms: u64) -> SimpleNode {
    let a = |d| Ipv4Addr::new(10, 0, 0, d);
    let mut n = SimpleNode::new(a(2), interfaces);
    n.neighbors = vec![a(1), a(3)];
    n.routes = vec![(a(1), a(1)), (a(3), a(3)), (a(4), a(3))];
    n.now_ms = now_ms;
    n
}

/// The packet bytes a case executes.
fn packet(case: &Case, repr: &Repr) -> Result<Vec<u8>, String> {
    let mut bytes = repr.to_bytes().map_err(|e| format!("cannot emit the packet: {e}"))?;
    for (off, patch) in &case.patches {
        let end = off + patch.len();
        let dst = bytes.get_mut(*off..end).ok_or_else(|| format!("patch at {off} runs past the packet"))?;
        dst.copy_from_slice(patch);
    }
    bytes.extend_from_slice(&case.append);
    Ok(bytes)
}

fn run(case: &Case, repr: &Repr, bytes: &[u8], in_place: bool) -> Observed {
    let len = bytes.len();
    let mut buf = bytes.to_vec();
    if in_place {
        buf.resize(Vm::buffer_need(len, repr.code.len()), 0);
    }
    let ctx = node(case.interfaces, case.now_ms);
    let mut vm = match case.mtu {
        Some(mtu) => Vm::new(VmConfig { mtu }),
        None => Vm::default(),
    };
    let mut cap = Capture::default();
    let out = vm.execute_traced(&mut buf, len, &ctx, &mut cap);
    let actions = out
        .actions()
        .iter()
        .map(|a| match a {
            Action::Send { dest, kind, packet } => {
                Act::Send { dest: *dest, kind: *kind, bytes: out.bytes(packet, &buf).to_vec() }
            }
            Action::Deliver { port, payload } => Act::Deliver { port: *port, bytes: out.bytes(payload, &buf).to_vec() },
        })
        .collect();
    Observed {
        end: out.end,
        stack: cap.stack,
        actions,
        log: out.log.clone(),
        executed: out.executed,
        rb_left: out.rb_left,
        ok_ops: cap.ok_ops,
        fault_op: cap.fault_op,
    }
}

fn end_name(e: &End) -> &'static str {
    match e {
        End::Exit => "exit",
        End::Forwarded => "forwarded",
        End::Delivered => "delivered",
        End::Fault { .. } => "fault",
    }
}

fn describe_end(e: &End) -> String {
    match e {
        End::Fault { fault, pc } => match pc {
            Some(pc) => format!("fault {} at {pc} ({fault})", fault.kind()),
            None => format!("fault {} before execution ({fault})", fault.kind()),
        },
        other => end_name(other).to_owned(),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A sent packet's header fields and stack, for `--- send` lines.
fn describe_send(dest: Ipv4Addr, kind: SendKind, bytes: &[u8]) -> Result<SendExp, String> {
    let p = Packet::new_checked(bytes).map_err(|e| format!("sent packet is malformed: {e}"))?;
    let r = Repr::parse(&p).map_err(|e| format!("sent packet is malformed: {e}"))?;
    if r.dst != dest {
        return Err(format!("sent toward {dest} but its header says dst {}", r.dst));
    }
    let stack: Vec<String> = r.stack.iter().rev().map(|&w| format!("{:?}", Value(w))).collect();
    Ok(SendExp {
        dest,
        rb: r.resource_bound,
        ep: Some(r.entry),
        src: Some(r.src),
        port: Some(r.port),
        heap: u16::try_from(r.heap.len()).ok(),
        stack_len: u16::try_from(r.stack.len()).ok(),
        stack: Some(stack.join(", ")),
        kind: Some(kind),
    })
}

fn send_matches(want: &SendExp, got: &SendExp) -> bool {
    fn opt<T: PartialEq>(w: &Option<T>, g: &Option<T>) -> bool {
        w.is_none() || w == g
    }
    want.dest == got.dest
        && want.rb == got.rb
        && opt(&want.ep, &got.ep)
        && opt(&want.src, &got.src)
        && opt(&want.port, &got.port)
        && opt(&want.heap, &got.heap)
        && opt(&want.stack_len, &got.stack_len)
        && opt(&want.stack, &got.stack)
        && opt(&want.kind, &got.kind)
}

fn fmt_send(s: &SendExp) -> String {
    let mut t = format!("{} rb {}", s.dest, s.rb);
    if let Some(ep) = s.ep {
        t += &format!(" ep {ep}");
    }
    if let Some(src) = s.src {
        t += &format!(" src {src}");
    }
    if let Some(p) = s.port {
        t += &format!(" port {p}");
    }
    if let Some(h) = s.heap {
        t += &format!(" heap {h}");
    }
    if let Some(n) = s.stack_len {
        t += &format!(" stack {n}");
    }
    if let Some(v) = &s.stack {
        t += &format!(" stack [{v}]");
    }
    match s.kind {
        Some(SendKind::Forward) => t += " forward",
        Some(SendKind::Child) => t += " child",
        None => {}
    }
    t
}

/// Checks `obs` against the case's expectations; returns the mismatches.
fn check(case: &Case, obs: &Observed) -> Vec<String> {
    let mut bad = Vec::new();
    let mut fail = |line: usize, m: String| bad.push(format!("{FILE}:{line}: {m}"));
    let sends: Vec<(usize, &SendExp)> =
        case.expects.iter().filter_map(|(l, e)| if let Expect::Send(s) = e { Some((*l, s)) } else { None }).collect();
    let delivers: Vec<(usize, u16, &Vec<u8>)> = case
        .expects
        .iter()
        .filter_map(|(l, e)| if let Expect::Deliver { port, bytes } = e { Some((*l, *port, bytes)) } else { None })
        .collect();
    let logs: Vec<(usize, &String)> =
        case.expects.iter().filter_map(|(l, e)| if let Expect::Log(s) = e { Some((*l, s)) } else { None }).collect();
    let expects_fault = case.expects.iter().any(|(_, e)| matches!(e, Expect::Fault { .. }));
    if !expects_fault && matches!(obs.end, End::Fault { .. }) {
        fail(case.line, format!("unexpected {}", describe_end(&obs.end)));
    }
    for (line, e) in &case.expects {
        let line = *line;
        match e {
            Expect::Stack(want) => match &obs.stack {
                Some(s) if s.join(", ") == *want => {}
                Some(s) => fail(line, format!("stack: expected [{want}], got [{}]", s.join(", "))),
                None => fail(line, "stack: no instruction ran, so there is no final stack".into()),
            },
            Expect::End(want) => {
                if end_name(&obs.end) != want {
                    fail(line, format!("end: expected {want}, got {}", describe_end(&obs.end)));
                }
            }
            Expect::Fault { kind, at } => {
                let ok = match obs.end {
                    End::Fault { fault, pc } => fault.kind() == kind && (at.is_none() || *at == Some(pc)),
                    _ => false,
                };
                if !ok {
                    let want = match at {
                        Some(Some(n)) => format!("{kind} at {n}"),
                        Some(None) => format!("{kind} on arrival"),
                        None => kind.clone(),
                    };
                    fail(line, format!("fault: expected {want}, got {}", describe_end(&obs.end)));
                }
            }
            Expect::Executed(n) => {
                if obs.executed != *n {
                    fail(line, format!("executed: expected {n}, got {}", obs.executed));
                }
            }
            Expect::Rb(n) => {
                if obs.rb_left != *n {
                    fail(line, format!("rb: expected {n}, got {}", obs.rb_left));
                }
            }
            // Checked as lists below.
            Expect::Send(_) | Expect::Deliver { .. } | Expect::Log(_) => {}
            Expect::NoSends => {
                if obs.actions.iter().any(|a| matches!(a, Act::Send { .. })) {
                    fail(line, format!("send: expected none, got {:?}", obs.actions));
                }
            }
            Expect::NoDeliveries => {
                if obs.actions.iter().any(|a| matches!(a, Act::Deliver { .. })) {
                    fail(line, format!("deliver: expected none, got {:?}", obs.actions));
                }
            }
            Expect::AsmError(_) => fail(line, "asm-error: the source assembled".into()),
        }
    }
    if let Some(&(first, _)) = sends.first() {
        let got: Vec<Result<SendExp, String>> = obs
            .actions
            .iter()
            .filter_map(|a| match a {
                Act::Send { dest, kind, bytes } => Some(describe_send(*dest, *kind, bytes)),
                Act::Deliver { .. } => None,
            })
            .collect();
        let shown: Vec<String> = got
            .iter()
            .map(|g| match g {
                Ok(s) => fmt_send(s),
                Err(e) => e.clone(),
            })
            .collect();
        if got.len() != sends.len() {
            fail(first, format!("send: expected {} packets, got {}: {shown:?}", sends.len(), got.len()));
        } else {
            for ((line, want), g) in sends.iter().zip(&got) {
                match g {
                    Ok(g) if send_matches(want, g) => {}
                    Ok(g) => fail(*line, format!("send: expected {}, got {}", fmt_send(want), fmt_send(g))),
                    Err(e) => fail(*line, format!("send: {e}")),
                }
            }
        }
    }
    if let Some(&(first, _, _)) = delivers.first() {
        let got: Vec<(u16, &Vec<u8>)> = obs
            .actions
            .iter()
            .filter_map(|a| match a {
                Act::Deliver { port, bytes } => Some((*port, bytes)),
                Act::Send { .. } => None,
            })
            .collect();
        let shown: Vec<String> = got.iter().map(|(p, b)| format!("{p} {}", hex(b))).collect();
        if got.len() != delivers.len() {
            fail(first, format!("deliver: expected {} payloads, got {shown:?}", delivers.len()));
        } else {
            for ((line, port, bytes), (gp, gb)) in delivers.iter().zip(&got) {
                if port != gp || *bytes != *gb {
                    fail(*line, format!("deliver: expected {port} {}, got {gp} {}", hex(bytes), hex(gb)));
                }
            }
        }
    }
    if let Some(&(first, _)) = logs.first() {
        let got: Vec<&str> = obs.log.lines().collect();
        let want: Vec<&str> = logs.iter().map(|(_, s)| s.as_str()).collect();
        if got != want {
            fail(first, format!("log: expected {want:?}, got {got:?}"));
        }
    }
    bad
}

/// The result of one case.
struct CaseResult {
    case: Case,
    /// The in-place run, if the case assembled.
    obs: Option<Observed>,
    /// Mismatches: non-empty means the case fails.
    problems: Vec<String>,
    /// For an `xfail` case: how the VM departs from the expectations.
    xfailed: Vec<String>,
}

fn run_case(case: Case) -> CaseResult {
    let asm_expect = case.expects.iter().find_map(|(l, e)| match e {
        Expect::AsmError(t) => Some((*l, t.clone())),
        _ => None,
    });
    let repr = match (assemble(&case.src), asm_expect) {
        (Err(e), Some((line, Some(text)))) if !e.to_string().contains(&text) => {
            let p = format!("{FILE}:{line}: asm-error: expected a message containing {text:?}, got `{e}`");
            return CaseResult { case, obs: None, problems: vec![p], xfailed: Vec::new() };
        }
        (Err(_), Some(_)) => return CaseResult { case, obs: None, problems: Vec::new(), xfailed: Vec::new() },
        (Err(e), None) => {
            // The source starts on the line after `===`, and keeps every line
            // up to the expectations, so assembler lines map back directly.
            let p = format!("{FILE}:{}:{}: does not assemble: {}", case.line + e.line, e.col, e.kind);
            return CaseResult { case, obs: None, problems: vec![p], xfailed: Vec::new() };
        }
        (Ok(r), _) => r,
    };
    let bytes = match packet(&case, &repr) {
        Ok(b) => b,
        Err(e) => {
            let p = format!("{FILE}:{}: {e}", case.line);
            return CaseResult { case, obs: None, problems: vec![p], xfailed: Vec::new() };
        }
    };
    let in_place = run(&case, &repr, &bytes, true);
    let copied = run(&case, &repr, &bytes, false);
    let mut problems = Vec::new();
    if in_place != copied {
        problems.push(format!(
            "{FILE}:{}: in-place and copying runs differ:\n  in place: {in_place:?}\n  copied:   {copied:?}",
            case.line
        ));
    }
    // The same packet with and without a tracer: the interpreter's fast loop
    // (taken only without one) must agree with its general loop in
    // everything observable, in place and copied.
    let ctx = node(case.interfaces, case.now_ms);
    let cfg = case.mtu.map_or(VmConfig::default(), |mtu| VmConfig { mtu });
    for headroom in [0, Vm::buffer_need(bytes.len(), repr.code.len()).saturating_sub(bytes.len())] {
        if let Err(e) = traced_and_untraced_agree(&bytes, headroom, &ctx, cfg) {
            problems.push(format!("{FILE}:{}: {e}", case.line));
        }
    }
    let mismatches = check(&case, &in_place);
    let mut xfailed = Vec::new();
    match &case.xfail {
        None => problems.extend(mismatches),
        Some(why) if mismatches.is_empty() => problems.push(format!(
            "{FILE}:{}: marked `xfail: {why}` but every expectation holds now: remove the marker",
            case.line
        )),
        Some(_) => xfailed = mismatches,
    }
    CaseResult { case, obs: Some(in_place), problems, xfailed }
}

fn results() -> &'static [CaseResult] {
    static RESULTS: OnceLock<Vec<CaseResult>> = OnceLock::new();
    RESULTS.get_or_init(|| {
        let cases = parse_file(DATA).unwrap_or_else(|e| panic!("{e}"));
        cases.into_iter().map(run_case).collect()
    })
}

/// Observations of the cases that count for coverage (not `xfail`).
fn counted() -> impl Iterator<Item = (&'static Case, &'static Observed)> {
    results().iter().filter(|r| r.case.xfail.is_none()).filter_map(|r| Some((&r.case, r.obs.as_ref()?)))
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn insns() {
    let all = results();
    let mut report = String::new();
    let mut failed = 0;
    for r in all {
        if !r.problems.is_empty() {
            failed += 1;
            report += &format!("case {} (line {}):\n", r.case.name, r.case.line);
            for p in &r.problems {
                report += &format!("  {p}\n");
            }
        }
    }
    for r in all.iter().filter(|r| r.problems.is_empty()) {
        if let Some(why) = &r.case.xfail {
            eprintln!("xfail {} ({FILE}:{}): {why}", r.case.name, r.case.line);
            for m in &r.xfailed {
                eprintln!("  {m}");
            }
        }
    }
    assert!(failed == 0, "{failed} of {} cases failed:\n{report}", all.len());
    assert!(all.len() > 100, "only {} cases", all.len());
}

/// Every opcode runs without faulting in at least one case.
#[test]
fn every_opcode_is_exercised() {
    let ran: BTreeSet<Op> = counted().flat_map(|(_, o)| o.ok_ops.iter().copied()).collect();
    let missing: Vec<&str> = ALL_OPS.iter().filter(|op| !ran.contains(op)).map(|op| op.mnemonic()).collect();
    assert!(missing.is_empty(), "opcodes no case runs successfully: {missing:?}");
}

/// Fault kinds that no case can trigger: the checks are defence in depth.
/// The stack never outgrows `len + 4·(code_len − entry)` because each
/// instruction pushes at most one word, and the execution heap is meant to
/// hold two words per remaining instruction (docs/snap.md §3.2). That heap
/// bound does not account for allocations in a `mktup`'s shadow, so
/// `out_of_memory` *is* reachable today: see the `xfail` case
/// `mktup/shadow-allocations`, which does not count for coverage.
const UNREACHABLE_FAULTS: &[&str] = &["stack_overflow", "out_of_memory"];

fn faults_seen() -> BTreeSet<(Option<Op>, &'static str)> {
    counted()
        .filter_map(|(_, o)| match o.end {
            End::Fault { fault, .. } => Some((o.fault_op, fault.kind())),
            _ => None,
        })
        .collect()
}

/// Every reachable fault kind (including `wire`) is triggered by some case.
#[test]
fn every_fault_kind_is_triggered() {
    let seen: BTreeSet<&str> = faults_seen().into_iter().map(|(_, k)| k).collect();
    let missing: Vec<&str> =
        FAULT_KINDS.iter().copied().filter(|k| !seen.contains(k) && !UNREACHABLE_FAULTS.contains(k)).collect();
    assert!(missing.is_empty(), "fault kinds no case triggers: {missing:?}");
}

/// `FooBar` → `foo_bar`, as in [`FAULT_KINDS`].
fn snake(s: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// Every (instruction, fault) pair of the opcode table's "fails with" column
/// is triggered by a case whose faulting instruction is that one, unless the
/// fault is unreachable.
#[test]
fn every_listed_failure_is_triggered() {
    let seen = faults_seen();
    let mut missing = Vec::new();
    for &op in ALL_OPS {
        for f in op.failures().split(',').map(str::trim).filter(|f| !f.is_empty()) {
            let kind = snake(f);
            assert!(FAULT_KINDS.contains(&kind.as_str()), "{op}: `{f}` is not a fault kind");
            if UNREACHABLE_FAULTS.contains(&kind.as_str()) {
                continue;
            }
            if !seen.iter().any(|(o, k)| *o == Some(op) && *k == kind) {
                missing.push(format!("{op}/{kind}"));
            }
        }
    }
    assert!(missing.is_empty(), "listed failures no case triggers: {missing:?}");
}

/// Every fault a case raises at an instruction is listed in that
/// instruction's "fails with" column.
#[test]
fn observed_failures_are_listed() {
    let mut unlisted = Vec::new();
    for (op, kind) in faults_seen() {
        let Some(op) = op else { continue };
        let listed = op.failures().split(',').map(|f| snake(f.trim())).any(|f| f == kind);
        if !listed {
            unlisted.push(format!("{op}/{kind}"));
        }
    }
    assert!(unlisted.is_empty(), "faults missing from the opcode table's \"fails with\" column: {unlisted:?}");
}

/// The harness itself rejects malformed data files.
#[test]
fn harness_rejects_bad_files() {
    let bad = [
        ("nop\n", "before the first"),
        ("=== a\nnop\n", "no expectations"),
        ("=== a\nnop\n--- stak: 1\n", "unknown expectation"),
        ("=== a\nnop\n--- end: exit\nnop\n", "source after"),
        ("=== a\nnop\n--- end: exit\n=== a\nnop\n--- end: exit\n", "duplicate case"),
        ("=== a\nnop\n--- fault: oops\n", "unknown fault kind"),
        ("=== a\n; node: ifaces=2\nnop\n--- end: exit\n", "unknown node setting"),
        ("=== a\nnop\n--- asm-error\n--- end: exit\n", "only expectation"),
        ("=== a\nnop\n--- end: exit\n; vm: mtu=60\n", "setup comment after"),
        ("=== a\nnop\n--- send: 10.0.0.1\n", "missing `rb N`"),
        ("=== a\nnop\n--- deliver: 7 abc\n", "odd number"),
    ];
    for (text, why) in bad {
        match parse_file(text) {
            Ok(c) => panic!("accepted {text:?}: {c:?}"),
            Err(e) => assert!(e.contains(why), "{text:?}: expected an error about {why:?}, got {e:?}"),
        }
    }
    // A case that does not assemble fails (unless it expects `asm-error`).
    let cases =
        parse_file("=== a\nfrob\n--- end: exit\n=== b\nfrob\n--- asm-error: unknown mnemonic\n").expect("parses");
    let r: Vec<CaseResult> = cases.into_iter().map(run_case).collect();
    assert!(r[0].problems.iter().any(|p| p.contains("insns.snapt:2:1: does not assemble")), "{:?}", r[0].problems);
    assert!(r[1].problems.is_empty(), "{:?}", r[1].problems);
    // Wrong expectations are reported, and so is an unexpected fault.
    let cases =
        parse_file("=== a\npush 1\n--- stack: 2\n--- executed: 3\n=== b\npop\n--- executed: 1\n").expect("parses");
    let r: Vec<CaseResult> = cases.into_iter().map(run_case).collect();
    assert_eq!(r[0].problems.len(), 2, "{:?}", r[0].problems);
    assert!(r[1].problems.iter().any(|p| p.contains("unexpected fault stack_underflow")), "{:?}", r[1].problems);
    // An `xfail` case passes while its expectations fail, and fails once they hold.
    let cases = parse_file("=== a\n; xfail: why\npush 1\n--- stack: 2\n=== b\n; xfail: why\npush 1\n--- stack: 1\n")
        .expect("parses");
    let r: Vec<CaseResult> = cases.into_iter().map(run_case).collect();
    assert!(r[0].problems.is_empty() && r[0].xfailed.len() == 1, "{:?} {:?}", r[0].problems, r[0].xfailed);
    assert!(r[1].problems.iter().any(|p| p.contains("remove the marker")), "{:?}", r[1].problems);
    // Sent packets are rendered with `Value`'s `Debug`.
    assert_eq!(format!("{:?}", Value::heap(Tag::Blob, 0)), "blob@0");
}
