//! Assembler and disassembler tests: the paper's listings, every rejection,
//! and round trips (fixed programs and property tests).

use anode_snap::asm::{AsmError, AsmErrorKind, LabelKind, Section, assemble};
use anode_snap::disasm::{disassemble, disassemble_insn};
use anode_snap::ops::{ALL_OPS, IMM_MASK, ImmKind, Insn, Op};
use anode_snap::value::{Tag, Value, header};
use anode_snap::wire::Repr;
use core::net::Ipv4Addr;
use proptest::prelude::*;

/// SNAP Fig. 1, as printed.
const FIG1: &str = "\
forw ; move on if not at dest
bne 5 ; jump 5 instrs if nonzero on top
push 1 ; 1 means “on return trip”
getsrc ; get source field
forwto ; send return packet
pop ; pop the 1 for local ping
demux ; deliver payload
";

/// SNAP Fig. 2 (the compiled part), as printed.
const FIG2: &str = "\
defaultRoute :
forw ; forward to dest
paj -1 ; jump totop stack

; value- 1
r : pull 0 ; get port num
pull 2 ; get data
demux ; deliver data & exit

p: pull 0 ; pkt stack: port
pull 2 ; pkt stack: data
push r ; pkt stack: paj offset
push defaultRoute ; entry point
push 3 ; how much stack
getrb ; how much rb
getsrc ; return to src
send ; send return packet
pop ; pop send return val
popi 3 ; pop extra stack
exit ; done
";

/// The Fig. 1 ping packet fixture from `wire.rs`.
static PING_BYTES: [u8; 72] = [
    0x01, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x07, // ver flags ep=0 rb=16 port=7
    10, 0, 0, 1, 10, 0, 0, 2, // src dst
    0x00, 0x07, 0x00, 0x02, 0x00, 0x03, 0x00, 0x00, // code 7, heap 2, stack 3
    0x20, 0x00, 0x00, 0x00, // forw
    0x30, 0x00, 0x00, 0x05, // bne 5
    0x02, 0x00, 0x00, 0x01, // push 1
    0x40, 0x00, 0x00, 0x00, // getsrc
    0x22, 0x00, 0x00, 0x00, // forwto
    0x0a, 0x00, 0x00, 0x00, // pop
    0x26, 0x00, 0x00, 0x00, // demux
    0x0a, 0x00, 0x00, 0x04, // heap: blob header, len 4
    b'p', b'i', b'n', b'g', // payload
    0x0a, 0x00, 0x00, 0x00, // stack bottom: blob@0
    0x00, 0x00, 0x00, 0x07, // 7
    0x00, 0x00, 0x00, 0x00, // top: 0
];

fn enc(op: Op, v: i64) -> u32 {
    Insn::new(op, v).expect("valid immediate").encode()
}

fn asm(src: &str) -> Repr {
    match assemble(src) {
        Ok(r) => r,
        Err(e) => panic!("assembly failed: {e}\n{src}"),
    }
}

fn ping_src() -> String {
    format!(".src 10.0.0.1\n.dst 10.0.0.2\n.rb 16\n.port 7\n.stack 0, 7, blob \"ping\"\n{FIG1}")
}

/// Asserts that disassembling `r` gives source that reassembles to `r`.
fn assert_roundtrip(r: &Repr) {
    let text = disassemble(r);
    match assemble(&text) {
        Ok(back) => assert_eq!(&back, r, "round trip changed the packet; source:\n{text}"),
        Err(e) => panic!("disassembly does not reassemble: {e}\n{text}"),
    }
}

// ---- the paper's listings ---------------------------------------------------

#[test]
fn fig1_assembles_to_the_seven_words() {
    let r = asm(FIG1);
    assert_eq!(
        r.code,
        vec![
            enc(Op::Forw, 0),
            enc(Op::Bne, 5),
            enc(Op::Push, 1),
            enc(Op::GetSrc, 0),
            enc(Op::ForwTo, 0),
            enc(Op::Pop, 0),
            enc(Op::Demux, 0),
        ]
    );
    assert!(r.heap.is_empty() && r.stack.is_empty());
    assert_eq!((r.entry, r.resource_bound, r.port), (0, 16, 0));
    assert!(!r.little_endian);
}

#[test]
fn fig1_ping_packet_matches_the_wire_fixture() {
    let r = asm(&ping_src());
    assert_eq!(r.src, Ipv4Addr::new(10, 0, 0, 1));
    assert_eq!(r.heap, vec![header(Tag::Blob, 4), u32::from_be_bytes(*b"ping")]);
    assert_eq!(r.stack, vec![Value::heap(Tag::Blob, 0).0, Value::int(7).0, Value::int(0).0]);
    assert_eq!(r.to_bytes().expect("emits"), PING_BYTES.to_vec());
    assert_eq!(Repr::parse_bytes(&PING_BYTES), Ok(r));
}

#[test]
fn fig2_compiled_ping_assembles() {
    let r = asm(FIG2);
    assert_eq!(
        r.code,
        vec![
            enc(Op::Forw, 0),
            enc(Op::Paj, -1),
            enc(Op::Pull, 0), // r = 2
            enc(Op::Pull, 2),
            enc(Op::Demux, 0),
            enc(Op::Pull, 0), // p = 5
            enc(Op::Pull, 2),
            enc(Op::Push, 2), // push r
            enc(Op::Push, 0), // push defaultRoute
            enc(Op::Push, 3),
            enc(Op::GetRb, 0),
            enc(Op::GetSrc, 0),
            enc(Op::Send, 0),
            enc(Op::Pop, 0),
            enc(Op::PopI, 3),
            enc(Op::Exit, 0),
        ]
    );
    // The PLAN program starts by evaluating p.
    let r = asm(&format!(".entry p\n{FIG2}"));
    assert_eq!(r.entry, 5);
}

// ---- one test per rejection -------------------------------------------------

fn rejects(src: &str, line: usize, col: usize, kind: AsmErrorKind) {
    match assemble(src) {
        Ok(r) => panic!("accepted {src:?} as {r:?}"),
        Err(e) => assert_eq!(e, AsmError { line, col, kind }, "{src:?}: {e}"),
    }
}

#[test]
fn rejects_unexpected_char() {
    rejects("nop\n  push $", 2, 8, AsmErrorKind::UnexpectedChar('$'));
}

#[test]
fn rejects_unterminated_string() {
    rejects("calls \"abc", 1, 7, AsmErrorKind::UnterminatedString);
    rejects("calls \"abc\\", 1, 7, AsmErrorKind::UnterminatedString);
}

#[test]
fn rejects_bad_escape() {
    rejects("calls \"a\\q\"", 1, 9, AsmErrorKind::BadEscape('q'));
    rejects("calls \"\\x4\"", 1, 8, AsmErrorKind::BadEscape('x'));
}

#[test]
fn rejects_bad_literal() {
    rejects("push 1.2.3", 1, 6, AsmErrorKind::BadLiteral("1.2.3".into()));
    rejects("nop\n.src 10.0.0.256", 2, 6, AsmErrorKind::BadLiteral("10.0.0.256".into()));
    rejects("nop\n.heap\nb: blob 0xabc", 3, 9, AsmErrorKind::BadLiteral("0xabc".into()));
    rejects("addi 99999999999999999999", 1, 6, AsmErrorKind::BadLiteral("99999999999999999999".into()));
}

#[test]
fn rejects_expected_statement() {
    rejects("nop\n, nop", 2, 1, AsmErrorKind::ExpectedStatement);
}

#[test]
fn rejects_unknown_mnemonic() {
    rejects("nop\nfrob 1", 2, 1, AsmErrorKind::UnknownMnemonic("frob".into()));
    rejects("Forw", 1, 1, AsmErrorKind::UnknownMnemonic("Forw".into()));
}

#[test]
fn rejects_unknown_directive() {
    rejects(".bogus 1\nnop", 1, 1, AsmErrorKind::UnknownDirective("bogus".into()));
}

#[test]
fn rejects_unknown_heap_entry() {
    rejects("nop\n.heap\nx: forw", 3, 4, AsmErrorKind::UnknownHeapEntry("forw".into()));
}

#[test]
fn rejects_duplicate_directive() {
    rejects(".rb 1\nnop\n.rb 2", 3, 1, AsmErrorKind::DuplicateDirective { name: "rb", first_line: 1 });
}

#[test]
fn rejects_missing_operand() {
    rejects("nop\nbne", 2, 4, AsmErrorKind::MissingOperand("an integer or code label"));
    rejects("nop ; x\n.rb ; none", 2, 4, AsmErrorKind::MissingOperand("a resource bound"));
}

#[test]
fn rejects_unexpected_operand() {
    rejects("pop 1", 1, 5, AsmErrorKind::UnexpectedOperand("pop"));
}

#[test]
fn rejects_trailing_input() {
    rejects("push 1 2", 1, 8, AsmErrorKind::TrailingInput);
    rejects("nop\n.heap\nt: tuple [1] 2", 3, 14, AsmErrorKind::TrailingInput);
}

#[test]
fn rejects_bad_operand() {
    rejects("pull x", 1, 6, AsmErrorKind::BadOperand("a count"));
    rejects(".endian middle\nnop", 1, 9, AsmErrorKind::BadOperand("`big` or `little`"));
    rejects("istag wibble", 1, 7, AsmErrorKind::BadOperand("a tag name or number"));
}

#[test]
fn rejects_out_of_range_literal() {
    rejects(".rb 70000\nnop", 1, 5, AsmErrorKind::OutOfRange { value: 70000, min: 0, max: 65535 });
    rejects(
        "nop\n.stack 16777216",
        2,
        8,
        AsmErrorKind::OutOfRange { value: 1 << 24, min: -(1 << 24), max: (1 << 24) - 1 },
    );
    rejects("nop\n.stack blob@33554432", 2, 13, AsmErrorKind::OutOfRange { value: 1 << 25, min: 0, max: 0x1ff_ffff });
}

#[test]
fn rejects_imm_out_of_range() {
    let e = assemble("nop\npush 16777216").expect_err("too big");
    assert_eq!((e.line, e.col), (2, 6));
    assert!(matches!(e.kind, AsmErrorKind::ImmOutOfRange(i) if i.op == Op::Push && i.value == 1 << 24), "{e}");
    let e = assemble("pull -1").expect_err("negative count");
    assert!(matches!(e.kind, AsmErrorKind::ImmOutOfRange(i) if i.op == Op::Pull), "{e}");
    let e = assemble("pushb 2").expect_err("bool");
    assert!(matches!(e.kind, AsmErrorKind::ImmOutOfRange(i) if i.op == Op::PushB), "{e}");
}

#[test]
fn rejects_undefined_label() {
    rejects("nop\nji nowhere", 2, 4, AsmErrorKind::UndefinedLabel("nowhere".into()));
    rejects(".entry main\nnop", 1, 1, AsmErrorKind::UndefinedLabel("main".into()));
}

#[test]
fn rejects_duplicate_label() {
    rejects("a: nop\na : nop", 2, 1, AsmErrorKind::DuplicateLabel { name: "a".into(), first_line: 1 });
}

#[test]
fn rejects_wrong_label_kind() {
    rejects(
        "x: nop\npushh @x",
        2,
        7,
        AsmErrorKind::WrongLabelKind { name: "x".into(), expected: LabelKind::Heap, found: LabelKind::Code },
    );
    rejects(
        "push s\n.heap\ns: str \"\"",
        1,
        6,
        AsmErrorKind::WrongLabelKind { name: "s".into(), expected: LabelKind::Code, found: LabelKind::Heap },
    );
}

#[test]
fn rejects_ref_to_non_object() {
    rejects("nop\n.stack @x\n.heap\nx: word 5", 2, 8, AsmErrorKind::NotAnObject("x".into()));
}

#[test]
fn rejects_backward_branch() {
    rejects("a: nop\nbne a", 2, 5, AsmErrorKind::BackwardBranch { offset: -1 });
    rejects("a: ji a", 1, 7, AsmErrorKind::BackwardBranch { offset: 0 });
    rejects("beq 0", 1, 5, AsmErrorKind::BackwardBranch { offset: 0 });
}

#[test]
fn rejects_section_too_long() {
    let code = "nop\n".repeat(65536);
    rejects(&code, 65536, 1, AsmErrorKind::SectionTooLong { section: Section::Code, len: 65536 });
    let stack = format!(".stack {}\nnop", vec!["0"; 65536].join(","));
    rejects(&stack, 1, 1, AsmErrorKind::SectionTooLong { section: Section::Stack, len: 65536 });
    let heap = format!("nop\n.heap\nb: blob 0x{}\nw: word 0", "00".repeat(4 * 65534));
    rejects(&heap, 4, 4, AsmErrorKind::SectionTooLong { section: Section::Heap, len: 65536 });
    let consts = format!("nop\n.heap\nb: blob 0x{}\n.code\ncalls \"x\"", "00".repeat(4 * 65533));
    rejects(&consts, 5, 7, AsmErrorKind::SectionTooLong { section: Section::Heap, len: 65536 });
}

#[test]
fn rejects_entry_out_of_bounds() {
    rejects(".entry 3\nnop", 1, 1, AsmErrorKind::EntryOutOfBounds { entry: 3, code_len: 1 });
    rejects(".entry end\nnop\nend:", 1, 1, AsmErrorKind::EntryOutOfBounds { entry: 1, code_len: 1 });
}

#[test]
fn rejects_empty_code() {
    rejects(".rb 3\n; nothing\n", 1, 1, AsmErrorKind::EmptyCode);
    rejects("", 1, 1, AsmErrorKind::EmptyCode);
}

#[test]
fn error_display_is_line_col_message() {
    let e = assemble("nop\n\n   bne back").expect_err("undefined");
    assert_eq!(e.to_string(), "3:8: undefined label `back`");
}

// ---- literal forms ----------------------------------------------------------

#[test]
fn push_literals_select_opcodes_and_constants() {
    let r = asm("\
        push true\n push false\n push ()\n push ( )\n push 10.0.0.1\n push 1.5\n push \"hi\"\n\
        push blob \"hi\"\n push blob 0x00ff\n push @t\n push 0x10\n push -7\n push 10.0.0.1\n\
        calls \"hi\"\n pushh 1\n\
        .heap\n t: tuple []\n");
    let h = |off| enc(Op::PushH, off);
    assert_eq!(
        r.code,
        vec![
            enc(Op::PushB, 1),
            enc(Op::PushB, 0),
            enc(Op::PushU, 0),
            enc(Op::PushU, 0),
            h(1), // explicit tuple is at 0
            h(3),
            h(5), // str "hi"
            h(7), // blob "hi": distinct from the str
            h(9),
            h(0),
            enc(Op::Push, 16),
            enc(Op::Push, -7),
            h(1), // deduplicated
            enc(Op::Calls, 5),
            h(1),
        ]
    );
    assert_eq!(
        r.heap,
        vec![
            header(Tag::Tuple, 0),
            header(Tag::Addr, 1),
            0x0a00_0001,
            header(Tag::Float, 1),
            1.5f32.to_bits(),
            header(Tag::Str, 2),
            0x6869_0000,
            header(Tag::Blob, 2),
            0x6869_0000,
            header(Tag::Blob, 2),
            0x00ff_0000,
        ]
    );
}

#[test]
fn stack_literals_are_top_first() {
    let r = asm("\
        .stack 1, -2, true, false, (), 10.0.0.1, 2.5, \"s\", blob 0x01, @o, blob@4, addr@0, word 0xfe000001, here\n\
        here: nop\n.heap\no: addr 1.2.3.4\n");
    let mut top_first = vec![
        Value::int(1).0,
        Value::int(-2).0,
        Value::bool(true).0,
        Value::bool(false).0,
        Value::UNIT.0,
        Value::heap(Tag::Addr, 2).0,
        Value::heap(Tag::Float, 4).0,
        Value::heap(Tag::Str, 6).0,
        Value::heap(Tag::Blob, 8).0,
        Value::heap(Tag::Addr, 0).0,
        Value::heap(Tag::Blob, 4).0,
        Value::heap(Tag::Addr, 0).0,
        0xfe00_0001,
        Value::int(0).0,
    ];
    top_first.reverse();
    assert_eq!(r.stack, top_first);
    assert_eq!(r.heap[..2], [header(Tag::Addr, 1), 0x0102_0304]);
    assert_eq!(r.heap[8..], [header(Tag::Blob, 1), 0x0100_0000]);
}

#[test]
fn heap_entries_and_escapes() {
    let r = asm(r#"nop
.heap
s: str "a\\\"\n\t\r\0\x7f"
b: blob "é"
f: float -0.0
i: float inf
w: word 0xdeadbeef
   .word 7
"#);
    assert_eq!(
        r.heap,
        vec![
            header(Tag::Str, 8),
            u32::from_be_bytes([b'a', b'\\', b'"', b'\n']),
            u32::from_be_bytes([b'\t', b'\r', 0, 0x7f]),
            header(Tag::Blob, 2),
            0xc3a9_0000,
            header(Tag::Float, 1),
            0x8000_0000,
            header(Tag::Float, 1),
            f32::INFINITY.to_bits(),
            0xdead_beef,
            7,
        ]
    );
}

#[test]
fn directives_and_operand_kinds() {
    let r = asm("\
        .endian little\n.entry 1\n.rb 0x20\n.port 65535\n.dst 255.255.255.255\n\
        nop\n istag float\n istag 9\n pushb 1\n amask 24\n ji end\n beq 1\n end: .word 0xfc000000\n");
    assert!(r.little_endian);
    assert_eq!((r.entry, r.resource_bound, r.port), (1, 32, 65535));
    assert_eq!(r.dst, Ipv4Addr::BROADCAST);
    assert_eq!(r.src, Ipv4Addr::UNSPECIFIED);
    assert_eq!(
        r.code,
        vec![
            enc(Op::Nop, 0),
            enc(Op::IsTag, 4),
            enc(Op::IsTag, 9),
            enc(Op::PushB, 1),
            enc(Op::AMask, 24),
            enc(Op::Ji, 2),
            enc(Op::Beq, 1),
            0xfc00_0000,
        ]
    );
}

// ---- round trips ------------------------------------------------------------

/// A program using every opcode and every literal kind.
fn everything_src() -> String {
    let mut s = String::from(
        ".endian little\n.entry start\n.rb 99\n.port 4242\n.src 192.168.1.1\n.dst 10.1.2.3\n\
         .stack 0, -1, true, (), 10.0.0.9, 0.25, \"str\", blob \"bl\", blob 0xff00, @tup, tuple@1, word 0xffffffff, start\n\
         .word 0x00000001\nstart:\n",
    );
    for &op in ALL_OPS {
        let m = op.mnemonic();
        let line = match op.imm_kind() {
            ImmKind::None => m.to_owned(),
            ImmKind::Int => format!("{m} -5"),
            ImmKind::Offset => format!("{m} 1"),
            ImmKind::Adjust => format!("{m} -3"),
            ImmKind::Count => format!("{m} 2"),
            ImmKind::HeapRef if op == Op::Calls => format!("{m} \"clock.ms\""),
            ImmKind::HeapRef => format!("{m} @name"),
            ImmKind::Bool => format!("{m} false"),
            ImmKind::Tag => format!("{m} str"),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s.push_str(
        "push true\npush false\npush ()\npush 10.0.0.1\npush 1e-3\npush \"text\"\npush blob \"b\\x00\"\n\
         push blob 0x00ff\npush @pi\npush start\nji done\nnop\ndone: exit\n\
         .heap\nname: str \"clock.ms\"\npi: float 3.1415927\nip: addr 127.0.0.1\nraw: blob 0x0001fe\n\
         tup: tuple [1, false, (), @ip, \"inner\", blob@0, word 0x7f000000]\nword 0x12345678\n",
    );
    s
}

#[test]
fn roundtrip_fig1_fig2() {
    assert_roundtrip(&asm(&ping_src()));
    assert_roundtrip(&asm(FIG1));
    assert_roundtrip(&asm(FIG2));
}

#[test]
fn roundtrip_every_opcode_and_literal() {
    let r = asm(&everything_src());
    assert_eq!(r.code.len(), ALL_OPS.len() + 14);
    assert_roundtrip(&r);
    let mut big = r.clone();
    big.little_endian = false;
    assert_roundtrip(&big);
}

#[test]
fn roundtrip_raw_and_odd_words() {
    let r = Repr {
        little_endian: false,
        entry: 2,
        resource_bound: 0,
        port: 0,
        src: Ipv4Addr::UNSPECIFIED,
        dst: Ipv4Addr::UNSPECIFIED,
        code: vec![
            0xfc00_0000,                 // invalid opcode
            enc(Op::Forw, 0) | 3,        // immediate on a no-immediate op
            enc(Op::Bne, 1) & !IMM_MASK, // offset 0
            enc(Op::PushB, 0) | 2,       // bool 2
            enc(Op::IsTag, 0) | 200,     // tag out of range
            enc(Op::PushH, 3),           // not an object start
        ],
        heap: vec![
            header(Tag::Blob, 3),
            0x4142_4301, // nonzero padding
            header(Tag::Float, 2),
            0,
            header(Tag::Addr, 1),
            0,
            header(Tag::Int, 5), // not a heap type: the rest is raw
            header(Tag::Str, 0),
        ],
        stack: vec![Value::new(Tag::Bool, 9).0, Value::new(Tag::Unit, 1).0, 0x8000_0000, Value::int(-1).0],
    };
    assert_roundtrip(&r);
    let text = disassemble(&r);
    assert!(text.contains(".word 0xfc000000"), "{text}");
    assert!(text.contains("h0: word 0x0a000003"), "{text}");
    assert!(text.contains("h4: addr 0.0.0.0"), "{text}");
    assert!(text.contains("pushh 3"), "{text}");
}

#[test]
fn disassembly_comments() {
    let text = disassemble(&asm(&ping_src()));
    assert!(text.contains("bne 5"), "{text}");
    assert!(text.contains("; 1 -> 6"), "{text}");
    assert!(text.contains(".stack 0, 7, blob@0"), "{text}");
    assert!(text.contains("h0: blob \"ping\""), "{text}");
    let text = disassemble(&asm("calls \"clock.ms\"\npush 10.0.0.1"));
    assert!(text.contains("calls @h0"), "{text}");
    assert!(text.contains("; 0: \"clock.ms\""), "{text}");
    assert!(text.contains("; 1: 10.0.0.1"), "{text}");
    assert_eq!(disassemble_insn(enc(Op::PushH, 7)), "pushh 7");
}

// ---- properties -------------------------------------------------------------

fn tagged_value() -> impl Strategy<Value = u32> {
    (0u32..10, any::<u32>()).prop_map(|(tag, d)| (tag << 25) | (d & IMM_MASK))
}

fn code_word() -> impl Strategy<Value = u32> {
    prop_oneof![
        any::<u32>(),
        (0..ALL_OPS.len(), any::<u32>()).prop_map(|(i, imm)| (u32::from(ALL_OPS[i].code()) << 25) | (imm & IMM_MASK)),
        (0..ALL_OPS.len(), -3i64..40).prop_map(|(i, v)| {
            let op = ALL_OPS[i];
            Insn::new(op, v).or_else(|_| Insn::new(op, 0)).or_else(|_| Insn::new(op, 1)).map_or(0, Insn::encode)
        }),
    ]
}

fn bytes_object(tag: Tag, b: &[u8]) -> Vec<u32> {
    let mut v = vec![header(tag, b.len() as u32)];
    v.extend(b.chunks(4).map(|c| {
        let mut w = [0; 4];
        w[..c.len()].copy_from_slice(c);
        u32::from_be_bytes(w)
    }));
    v
}

fn heap_object() -> impl Strategy<Value = Vec<u32>> {
    let bytes_tag = prop_oneof![Just(Tag::Blob), Just(Tag::Str)];
    prop_oneof![
        any::<u32>().prop_map(|w| vec![w]),
        any::<u32>().prop_map(|a| vec![header(Tag::Addr, 1), a]),
        any::<u32>().prop_map(|f| vec![header(Tag::Float, 1), f]),
        any::<f32>().prop_map(|f| vec![header(Tag::Float, 1), f.to_bits()]),
        (bytes_tag.clone(), prop::collection::vec(any::<u8>(), 0..12)).prop_map(|(t, b)| bytes_object(t, &b)),
        (bytes_tag.clone(), "[ -~]{0,10}").prop_map(|(t, s)| bytes_object(t, s.as_bytes())),
        (bytes_tag, 0u32..12, prop::collection::vec(any::<u32>(), 3)).prop_map(|(t, len, ws)| {
            let mut v = vec![header(t, len)];
            v.extend(ws.into_iter().take(len.div_ceil(4) as usize));
            v
        }),
        prop::collection::vec(tagged_value(), 0..5).prop_map(|es| {
            let mut v = vec![header(Tag::Tuple, es.len() as u32)];
            v.extend(es);
            v
        }),
        (3u32..8, 0u32..4).prop_map(|(t, len)| vec![(t << 25) | len]),
    ]
}

fn arb_repr() -> impl Strategy<Value = Repr> {
    (
        any::<bool>(),
        any::<prop::sample::Index>(),
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        any::<u32>(),
        prop::collection::vec(code_word(), 1..=64),
        prop::collection::vec(heap_object(), 0..16),
        prop::collection::vec(prop_oneof![any::<u32>(), tagged_value()], 0..=64),
    )
        .prop_map(|(le, entry, rb, port, src, dst, code, objs, stack)| {
            let mut heap: Vec<u32> = objs.into_iter().flatten().collect();
            heap.truncate(64);
            Repr {
                little_endian: le,
                entry: entry.index(code.len()) as u16,
                resource_bound: rb,
                port,
                src: Ipv4Addr::from_bits(src),
                dst: Ipv4Addr::from_bits(dst),
                code,
                heap,
                stack,
            }
        })
}

fn junk_token() -> impl Strategy<Value = String> {
    let fixed: Vec<&'static str> = vec![
        "0",
        "1",
        "-1",
        "5",
        "0x",
        "0x1f",
        "0xfffffffff",
        "99999999999999999999999",
        "1.5",
        "1e",
        "1e-",
        "-inf",
        "10.0.0.1",
        "1.2.3.4.5",
        "@",
        "@x",
        ":",
        ",",
        "[",
        "]",
        "(",
        ")",
        "\"",
        "\"a\"",
        "\"\\x\"",
        "\"\\",
        "blob",
        "word",
        "true",
        "false",
        "x",
        "x:",
        "blob@",
        "addr@1",
        "tuple",
        "str",
        "float",
        "addr",
        ".heap",
        ".code",
        ".word",
        ".stack",
        ".entry",
        ";",
        "#",
        "é",
        "\t",
        "$",
        ".",
        "-",
        "+.",
        "..",
    ];
    prop_oneof![
        prop::sample::select(fixed).prop_map(str::to_owned),
        "[a-z0-9@:,.\\[\\]()\"\\\\x-]{1,6}",
        any::<i64>().prop_map(|v| v.to_string()),
    ]
}

fn head_token() -> impl Strategy<Value = String> {
    let mut heads: Vec<String> = ALL_OPS.iter().map(|op| op.mnemonic().to_owned()).collect();
    for d in [
        ".entry", ".rb", ".src", ".dst", ".port", ".endian", ".stack", ".heap", ".code", ".word", "addr", "float",
        "blob", "str", "tuple", "word",
    ] {
        heads.push(d.to_owned());
    }
    prop::sample::select(heads)
}

fn junk_line() -> impl Strategy<Value = String> {
    (prop::option::of("[a-z]{1,3} ?:"), head_token(), prop::collection::vec(junk_token(), 0..5)).prop_map(
        |(label, head, rest)| {
            let mut s = label.unwrap_or_default();
            s.push(' ');
            s.push_str(&head);
            for t in rest {
                s.push(' ');
                s.push_str(&t);
            }
            s
        },
    )
}

/// A mostly well-formed program, so that a fair share of generated texts
/// assemble and exercise the round trip.
fn good_program() -> impl Strategy<Value = String> {
    let directives = vec![
        ".stack 1, @h, 2.5, true, ()",
        ".stack \"s\", l1, blob@2, word 0x0",
        ".endian little",
        ".entry l0",
        ".rb 7",
        ".port 9",
        ".src 1.2.3.4",
    ];
    let heap_lines = vec![
        "h: str \"svc\"",
        "h2: blob 0x00ff",
        "t: tuple [1, @h, \"q\", blob@3]",
        "a: addr 10.0.0.1",
        "f: float -1.5e-3",
        "word 0xffffffff",
        ".word 0x0e000001",
        "z: blob \"\"",
    ];
    let insn = (0..ALL_OPS.len(), 0usize..4).prop_map(|(i, k)| {
        let op = ALL_OPS[i];
        let choices: &[&str] = match op.imm_kind() {
            ImmKind::None => &[""],
            ImmKind::Int if op == Op::Push => &["blob \"x\"", "1.0.0.1", "()", "l1"],
            ImmKind::Int => &["-5", "0x10", "l0", "l1"],
            ImmKind::Offset => &["1", "2", "l1", "l2"],
            ImmKind::Adjust => &["-1", "7"],
            ImmKind::Count => &["0", "3"],
            ImmKind::HeapRef => &["@h", "\"svc\"", "0", "@t"],
            ImmKind::Bool => &["true", "0"],
            ImmKind::Tag => &["blob", "9"],
        };
        format!("{} {}", op.mnemonic(), choices[k % choices.len()])
    });
    (
        prop::sample::subsequence(directives, 0..3),
        prop::collection::vec(prop_oneof![12 => insn, 1 => junk_line()], 1..16),
        prop::sample::subsequence(heap_lines, 0..5),
    )
        .prop_map(|(dirs, code, heap)| {
            let mut lines: Vec<String> = dirs.into_iter().map(str::to_owned).collect();
            // The first three instructions are the labels operands refer to.
            let labels = ["l0: ", "l1 : ", "l2:"];
            lines.extend(code.into_iter().enumerate().map(|(i, c)| format!("{}{c}", labels.get(i).unwrap_or(&""))));
            lines.push(".heap".to_owned());
            lines.extend(heap.into_iter().map(str::to_owned));
            lines.join("\n")
        })
}

/// If the assembler accepts a text, the disassembly of its output must
/// reassemble to the same packet.
fn check_accepted(src: &str) {
    if let Ok(r) = assemble(src) {
        let text = disassemble(&r);
        assert_eq!(assemble(&text).as_ref(), Ok(&r), "source:\n{src}\ndisassembly:\n{text}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn prop_disassembly_reassembles(r in arb_repr()) {
        let text = disassemble(&r);
        prop_assert_eq!(assemble(&text), Ok(r), "{}", text);
    }

    #[test]
    fn prop_assembler_never_panics_on_arbitrary_text(s in any::<String>()) {
        check_accepted(&s);
    }

    #[test]
    fn prop_assembler_never_panics_on_printable_text(s in "[ -~\n\t]{0,200}") {
        check_accepted(&s);
    }

    #[test]
    fn prop_assembler_never_panics_on_junk_lines(lines in prop::collection::vec(junk_line(), 0..12)) {
        check_accepted(&lines.join("\n"));
    }

    #[test]
    fn prop_accepted_programs_roundtrip(src in good_program()) {
        check_accepted(&src);
    }

    #[test]
    fn prop_disassemble_insn_is_one_line(w in any::<u32>()) {
        let s = disassemble_insn(w);
        prop_assert!(!s.contains('\n'));
        let r = assemble(&s).map(|r| r.code);
        prop_assert_eq!(r, Ok(vec![w]), "{}", s);
    }
}
