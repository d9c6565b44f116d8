//! Every class of compile error, with its file:line:col and message.
#![allow(clippy::unwrap_used)]

use anode_plan::{ErrorKind, Options, compile};

fn err(src: &str) -> anode_plan::Error {
    match compile("t.plan", src, &Options::default()) {
        Ok(c) => panic!("accepted:\n{}", c.asm),
        Err(e) => e,
    }
}

fn at(src: &str, line: u32, col: u32, contains: &str) -> ErrorKind {
    let e = err(src);
    let text = e.to_string();
    assert!(text.starts_with(&format!("t.plan:{line}:{col}: ")), "wrong position: {text}");
    assert!(text.contains(contains), "message {text:?} lacks {contains:?}");
    e.kind
}

const INV: &str = "OnRemote(|f|(1), 10.0.0.2, 8, defaultRoute)";

#[test]
fn syntax_errors() {
    let k = at("fun f(x: int) = x +\n", 2, 1, "expected an expression, found the end of the file");
    assert!(matches!(k, ErrorKind::Syntax(_)));
    at("fun f(x) = x", 1, 8, "parameter `x` needs a type");
    at("fun f(x: int) = if x then 1", 1, 28, "`else`");
    at("fun f(x: int) = (x, 1", 1, 22, "expected `)`");
    at("fun f(x: int) = x @ 1", 1, 19, "unexpected character `@`");
    at("fun f(x: int) = \"abc", 1, 17, "string literal is not closed");
    at("(* open", 1, 1, "comment `(*` is never closed");
    at("fun f(x: int) = 1.2.3", 1, 17, "bad number `1.2.3`");
    at("fun f(x: int) = 10.0.0.300", 1, 17, "bad host address");
    at(&format!("{INV}\nfun f(x: int) = x"), 2, 1, "the end of the file after the invocation");
    at("fun f(x: int) = x\nfun g(", 2, 7, "expected a parameter name");
    at("fun f(x: int) = foldl[0](g, 0, [])", 1, 23, "positive list-length bound");
}

#[test]
fn type_errors() {
    let k = at(&format!("fun f(x: int) = x + true\n{INV}"), 1, 19, "the operands of `+` differ: int and bool");
    assert!(matches!(k, ErrorKind::Type(_)));
    at(
        &format!("fun f(x: int) = if x then 1 else 2\n{INV}"),
        1,
        20,
        "the condition of `if` has type int, expected bool",
    );
    at(&format!("fun f(x: int) = if true then 1 else \"a\"\n{INV}"), 1, 37, "`then` gives int but `else` gives string");
    at(&format!("fun f(x: int) : bool = x\n{INV}"), 1, 24, "declared result is bool");
    at(&format!("fun f(x: int) = hd(x)\n{INV}"), 1, 20, "the argument of `hd` has type int");
    at(&format!("fun f(x: int) = g(x)\n{INV}"), 1, 17, "`g` is not a function of this program or a built-in");
    at(&format!("fun f(x: int) = y\n{INV}"), 1, 17, "`y` is not a parameter");
    at(&format!("fun f(x: int) = \"a\" = \"b\"\n{INV}"), 1, 21, "have no `=`");
    at(&format!("fun f(x: int) = deliver([1], 2)\n{INV}"), 1, 25, "lists and nested tuples cannot be delivered");
    at(&format!("fun f(x: int) = octet(10.0.0.1, x)\n{INV}"), 1, 33, "must be an integer literal 0..32");
    at(&format!("fun f(x: int) = x\nfun f(y: int) = y\n{INV}"), 2, 5, "already defined at 1:5");
    at("fun f(x: int) = x\nOnRemote(|f|(getRB()), 10.0.0.2, 8, defaultRoute)", 2, 14, "must be constants");
    at("fun f(x: int) = x\nOnRemote(|f|(true), 10.0.0.2, 8, defaultRoute)", 2, 14, "argument `x` of `f` has type bool");
    at(
        &format!("fun r(x: int) : int = x\nfun f(x: int) = OnRemote(|f|(x), 10.0.0.1, 1, r)\n{INV}"),
        2,
        47,
        "must have type host -> host",
    );
    at(&format!("fun f(x: int) = 16777216\n{INV}"), 1, 17, "does not fit SNAP's 25-bit integers");
}

#[test]
fn recursion_direct_names_the_cycle() {
    let k = at(&format!("fun f(x: int) : int = f(x)\n{INV}"), 1, 23, "recursive function: f -> f");
    assert_eq!(k, ErrorKind::Recursion { cycle: vec!["f".into(), "f".into()] });
}

#[test]
fn recursion_mutual_names_the_cycle() {
    let src = format!(
        "fun f(x: int) : int = g(x) + 1\nfun g(x: int) : int = h(x)\nfun h(x: int) : int =\n  if x > 0 then f(x - 1) else 0\n{INV}"
    );
    let k = at(&src, 4, 17, "recursive function: f -> g -> h -> f");
    assert_eq!(k, ErrorKind::Recursion { cycle: vec!["f".into(), "g".into(), "h".into(), "f".into()] });
    // Through a fold's iterator and through a routing function too.
    at(&format!("fun f(a: int, x: int) : int = foldl[2](f, a, [x])\n{INV}"), 1, 40, "recursive function: f -> f");
    at(
        &format!("fun r(d: host) : host = (OnRemote(|f|(1), d, 1, r); d)\nfun f(x: int) = x\n{INV}"),
        1,
        49,
        "recursive function: r -> r",
    );
    // A chunk naming its own function is not recursion: it is a new packet.
    compile(
        "t.plan",
        "fun f(x: int) = OnRemote(|f|(x), getSrc(), 1, defaultRoute)\nOnRemote(|f|(1), 10.0.0.2, 8, defaultRoute)",
        &Options::default(),
    )
    .unwrap();
}

#[test]
fn fold_without_bound() {
    let k = at(
        &format!("fun add(a: int, x: int) : int = a + x\nfun f(x: int) = foldl(add, 0, [x])\n{INV}"),
        2,
        17,
        "write foldl[N](...)",
    );
    assert_eq!(k, ErrorKind::FoldWithoutBound("foldl"));
    at(&format!("fun add(x: int, a: int) : int = a + x\nfun f(x: int) = foldr(add, [x], 0)\n{INV}"), 2, 17, "foldr[N]");
}

#[test]
fn too_large_for_a_packet() {
    // 40 unrolled steps of a call that sends: far more than 1400 bytes.
    let src = "fun d(m: int, p: int) = deliver(m, p)\n\
               fun v(p: int, h: host) : int = (OnRemote(|d|(p, p), h, 2, defaultRoute); p)\n\
               fun big(hosts: host list) = foldl[40](v, 7, hosts)\n\
               OnRemote(|big|([10.0.0.2]), 10.0.0.1, 16, defaultRoute)";
    let k = at(src, 3, 5, "over the 1400-byte packet limit");
    let ErrorKind::TooLarge { bytes, limit, detail } = k else { panic!() };
    assert!(bytes > limit && limit == 1400, "{bytes} {limit}");
    assert!(detail.contains("the largest block is fun big"), "{detail}");
    // The same program fits a larger limit.
    compile("t.plan", src, &Options { mtu: 16_000, ..Options::default() }).unwrap();
}

#[test]
fn compiler_limits_are_errors() {
    let deep = format!("fun f(x: int) = {}x{}\n{INV}", "(".repeat(200), ")".repeat(200));
    at(&deep, 1, 49, "nested more than");
    let e = err(&"x".repeat(300 * 1024));
    assert!(matches!(e.kind, ErrorKind::Limit(_)), "{e}");
    at(
        &format!("fun g(a: int, x: int) : int = a\nfun f(x: int) = foldl[5000](g, 0, [x])\n{INV}"),
        2,
        17,
        "more than 1024",
    );
    // Exponential inlining is cut off by the instruction budget.
    let mut src = String::from("fun f0(x: int) : int = x + 1\n");
    for i in 1..12 {
        src.push_str(&format!("fun f{i}(x: int) : int = f{}(x) + f{}(x)\n", i - 1, i - 1));
    }
    src.push_str("fun f(x: int) = f11(x)\n");
    src.push_str(INV);
    let e = err(&src);
    assert!(matches!(e.kind, ErrorKind::Limit(_) | ErrorKind::TooLarge { .. }), "{e}");
}

#[test]
fn no_invocation() {
    at("fun f(x: int) = x", 1, 1, "no invocation");
}
