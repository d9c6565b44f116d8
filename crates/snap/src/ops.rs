//! The SNAP instruction set, defined once.
//!
//! Every opcode is listed exactly once in [`for_each_op!`]. The [`Op`] enum, the
//! decoder ([`Op::from_code`]), the encoder ([`Insn::encode`]), the assembler's
//! mnemonic table ([`Op::from_mnemonic`]), the disassembler ([`Insn`]'s `Display`)
//! and the reference table in `docs/snap.md` (see [`markdown_table`]) are all
//! generated from it, so they cannot drift apart (the pattern of wasmtime's
//! `pulley` `for_each_op!`).
//!
//! An instruction is one 32-bit word: a 7-bit opcode in the high bits and a
//! 25-bit immediate in the low bits (SNAP §VI-B: "We have 100 distinct
//! instructions in our final encoding; therefore we set n to be 7 bits").

use core::fmt;

/// Number of bits of the immediate / datum field of a word.
pub const IMM_BITS: u32 = 25;
/// Mask of the immediate / datum field of a word.
pub const IMM_MASK: u32 = (1 << IMM_BITS) - 1;
/// Largest signed immediate.
pub const IMM_MAX: i32 = (1 << (IMM_BITS - 1)) - 1;
/// Smallest signed immediate.
pub const IMM_MIN: i32 = -(1 << (IMM_BITS - 1));

/// Sign-extends the low 25 bits of `w`.
#[inline(always)]
pub const fn sext25(w: u32) -> i32 {
    ((w << 7) as i32) >> 7
}

/// Truncates an integer to 25 bits (two's complement), as stored in a word.
#[inline(always)]
pub const fn trunc25(v: i32) -> u32 {
    (v as u32) & IMM_MASK
}

/// How an instruction's 25-bit immediate is interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImmKind {
    /// No immediate; encoders write 0 and decoders ignore the field.
    None,
    /// A signed 25-bit integer.
    Int,
    /// A signed branch offset relative to the branch's own index; must be ≥ 1.
    Offset,
    /// A signed adjustment added to the popped jump value (`paj`).
    Adjust,
    /// An unsigned count or index.
    Count,
    /// An unsigned word offset into the packet's original heap.
    HeapRef,
    /// A boolean, 0 or 1.
    Bool,
    /// A value tag (see [`crate::value::Tag`]).
    Tag,
}

impl ImmKind {
    /// Whether the immediate is read as a signed number.
    pub const fn is_signed(self) -> bool {
        matches!(self, ImmKind::Int | ImmKind::Offset | ImmKind::Adjust)
    }
    /// Short name used in documentation.
    pub const fn name(self) -> &'static str {
        match self {
            ImmKind::None => "—",
            ImmKind::Int => "int",
            ImmKind::Offset => "offset",
            ImmKind::Adjust => "adjust",
            ImmKind::Count => "count",
            ImmKind::HeapRef => "heapref",
            ImmKind::Bool => "bool",
            ImmKind::Tag => "tag",
        }
    }
}

/// The seven instruction classes of SNAP Table I (address, float and blob
/// operations are "simple computation", listed separately for readability).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// `forw`, `forwto`, `send`, `demux`, `exit`.
    Network,
    /// `bne`, `beq`, `ji`, `paj`.
    Flow,
    /// `push`, `pop`, `pull`, …
    Stack,
    /// `getsrc`, `getrb`, `here`, `ishere`, …
    Env,
    /// Integer, bitwise and relational operators.
    Compute,
    /// Floating point operators.
    Float,
    /// IPv4 address operators.
    Address,
    /// Tuple and type operators.
    Tuple,
    /// Byte-array operators.
    Blob,
    /// `calls`.
    Service,
}

impl Class {
    /// Short name used in documentation.
    pub const fn name(self) -> &'static str {
        match self {
            Class::Network => "network control",
            Class::Flow => "flow control",
            Class::Stack => "stack manipulation",
            Class::Env => "environment query",
            Class::Compute => "simple computation",
            Class::Float => "floating point",
            Class::Address => "address",
            Class::Tuple => "tuple manipulation",
            Class::Blob => "byte array",
            Class::Service => "service access",
        }
    }
}

/// Cost class of an instruction (SNAP §IV-A).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cost {
    /// Constant time; at most one stack word, no heap.
    Const,
    /// Constant time; at most one stack word and one heap object of one payload
    /// word (two heap words with its header).
    Alloc,
    /// `mktup n`: n+1 heap words, amortized over the n instructions it owns.
    Amortized,
    /// Network operation: time linear in the packet length; counted against
    /// the node's per-packet limit of network operations.
    Net,
    /// Node-resident service: SNAP-safe services are constant time and space.
    Service,
}

impl Cost {
    /// Short name used in documentation.
    pub const fn name(self) -> &'static str {
        match self {
            Cost::Const => "const",
            Cost::Alloc => "const+alloc",
            Cost::Amortized => "amortized",
            Cost::Net => "net",
            Cost::Service => "service",
        }
    }
}

/// Calls `$m!` with the whole opcode table.
///
/// Columns: variant, mnemonic, opcode, immediate kind, class, cost, stack
/// effect (before -- after, top on the right), failure cases, description.
#[macro_export]
macro_rules! for_each_op {
    ($m:ident) => {
        $m! {
            // ---- stack manipulation (0x00..) ------------------------------------
            Nop     "nop"     0x00 None    Stack   Const  "--"              ""                              "Does nothing (padding after `mktup`).";
            Push    "push"    0x01 Int     Stack   Const  "-- i"            ""                              "Pushes the integer immediate.";
            PushB   "pushb"   0x02 Bool    Stack   Const  "-- b"            "InvalidImmediate"                              "Pushes the boolean immediate.";
            PushU   "pushu"   0x03 None    Stack   Const  "-- ()"           ""                              "Pushes unit.";
            PushH   "pushh"   0x04 HeapRef Stack   Const  "-- ref"          "HeapOutOfBounds, TypeMismatch" "Pushes a reference to the original-heap object at the immediate offset; the tag is the object's type.";
            Pop     "pop"     0x05 None    Stack   Const  "v --"            "StackUnderflow"                "Discards the top value.";
            PopI    "popi"    0x06 Count   Stack   Const  "v1..vk --"       "StackUnderflow"                "Discards the top k values.";
            Pull    "pull"    0x07 Count   Stack   Const  "vk..v0 -- vk..v0 vk" "StackUnderflow"           "Pushes a copy of the value k below the top (`pull 0` duplicates).";
            Store   "store"   0x08 Count   Stack   Const  "vk..v0 x -- x..v0" "StackUnderflow"             "Pops x and overwrites the value k below the new top with it.";
            Slide   "slide"   0x09 Count   Stack   Const  "v1..vk x -- x"   "StackUnderflow"                "Pops x, discards k values, pushes x back (ends a `let` scope).";
            Swap    "swap"    0x0a None    Stack   Const  "a b -- b a"      "StackUnderflow"                "Swaps the two top values.";
            // ---- network control (0x10..) ---------------------------------------
            Forw    "forw"    0x10 None    Network Net    "--"              "ResourceBoundExhausted, TooManySends, PacketTooLarge, HeapOutOfBounds" "If the destination is not this node, forwards the packet (same entry point, whole stack, all remaining resource bound) and ends; otherwise falls through.";
            ForwTo  "forwto"  0x11 None    Network Net    "a --"            "TypeMismatch, ResourceBoundExhausted, TooManySends, StackUnderflow, PacketTooLarge, HeapOutOfBounds" "Pops address a; if a is not this node, forwards the packet to a with source set to this node and ends; otherwise falls through.";
            Send    "send"    0x12 None    Network Net    "vs..v1 ep s r d -- vs..v1 ()" "StackUnderflow, BadEntryPoint, InvalidSendBound, ResourceBoundExhausted, TooManySends, PacketTooLarge, TypeMismatch, HeapOutOfBounds" "Sends a child packet to d with entry point ep, resource bound r (deducted from this packet) and a copy of the top s values as its stack; pushes unit.";
            Demux   "demux"   0x13 None    Network Net    "v p --"          "StackUnderflow, BadPort, TooManySends, TypeMismatch, HeapOutOfBounds" "Delivers v to local application port p and ends the packet.";
            Exit    "exit"    0x14 None    Network Const  "--"              ""                              "Ends the packet.";
            // ---- flow control (0x18..) ------------------------------------------
            Bne     "bne"     0x18 Offset  Flow    Const  "v --"            "BackwardBranch, BranchOutOfBounds, StackUnderflow" "Pops v; if its datum is nonzero, jumps forward by the offset.";
            Beq     "beq"     0x19 Offset  Flow    Const  "v --"            "BackwardBranch, BranchOutOfBounds, StackUnderflow" "Pops v; if its datum is zero, jumps forward by the offset.";
            Ji      "ji"      0x1a Offset  Flow    Const  "--"              "BackwardBranch, BranchOutOfBounds" "Jumps forward by the offset.";
            Paj     "paj"     0x1b Adjust  Flow    Const  "i --"            "BackwardBranch, BranchOutOfBounds, StackUnderflow" "Pops i and jumps forward by i + immediate (`paj -pc` jumps to absolute index i).";
            // ---- environment query (0x20..) -------------------------------------
            GetSrc  "getsrc"  0x20 None    Env     Alloc  "-- a"            "OutOfMemory"                   "Pushes the packet's source address.";
            GetDst  "getdst"  0x21 None    Env     Alloc  "-- a"            "OutOfMemory"                   "Pushes the packet's destination address.";
            GetRb   "getrb"   0x22 None    Env     Const  "-- i"            ""                              "Pushes the remaining resource bound.";
            GetEp   "getep"   0x23 None    Env     Const  "-- i"            ""                              "Pushes the packet's entry point.";
            GetPort "getport" 0x24 None    Env     Const  "-- i"            ""                              "Pushes the header's demux port.";
            Here    "here"    0x25 None    Env     Alloc  "-- a"            "OutOfMemory"                   "Pushes this node's address.";
            IsHere  "ishere"  0x26 None    Env     Const  "a -- b"          "StackUnderflow, TypeMismatch, HeapOutOfBounds"  "Pops a; pushes whether a is an address of this node.";
            GetIfc  "getifc"  0x27 None    Env     Const  "-- i"            ""                              "Pushes this node's interface count.";
            NextHop "nexthop" 0x28 None    Env     Alloc  "a -- h"          "StackUnderflow, TypeMismatch, OutOfMemory, HeapOutOfBounds" "Pops a; pushes the next hop toward a, or unit if there is no route.";
            Nbr     "nbr"     0x29 None    Env     Alloc  "i -- a"          "StackUnderflow, OutOfMemory"   "Pops i; pushes the address of neighbour i, or unit if there is none.";
            NNbr    "nnbr"    0x2a None    Env     Const  "-- i"            ""                              "Pushes the number of neighbours.";
            Depth   "depth"   0x2b None    Env     Const  "-- i"            ""                              "Pushes the current stack depth.";
            // ---- integer arithmetic (0x30..) ------------------------------------
            Add     "add"     0x30 None    Compute Const  "a b -- a+b"      "StackUnderflow"                "Integer addition, wrapping at 25 bits.";
            Sub     "sub"     0x31 None    Compute Const  "a b -- a-b"      "StackUnderflow"                "Integer subtraction.";
            Mul     "mul"     0x32 None    Compute Const  "a b -- a*b"      "StackUnderflow"                "Integer multiplication.";
            Div     "div"     0x33 None    Compute Const  "a b -- a/b"      "StackUnderflow, DivideByZero"  "Integer division, truncating toward zero.";
            Mod     "mod"     0x34 None    Compute Const  "a b -- a%b"      "StackUnderflow, DivideByZero"  "Remainder; its sign is the dividend's.";
            Neg     "neg"     0x35 None    Compute Const  "a -- -a"         "StackUnderflow"                "Negation.";
            Abs     "abs"     0x36 None    Compute Const  "a -- |a|"        "StackUnderflow"                "Absolute value.";
            Min     "min"     0x37 None    Compute Const  "a b -- min"      "StackUnderflow"                "Smaller of two integers.";
            Max     "max"     0x38 None    Compute Const  "a b -- max"      "StackUnderflow"                "Larger of two integers.";
            AddI    "addi"    0x39 Int     Compute Const  "a -- a+k"        "StackUnderflow"                "Adds the immediate.";
            SubI    "subi"    0x3a Int     Compute Const  "a -- a-k"        "StackUnderflow"                "Subtracts the immediate.";
            MulI    "muli"    0x3b Int     Compute Const  "a -- a*k"        "StackUnderflow"                "Multiplies by the immediate.";
            DivI    "divi"    0x3c Int     Compute Const  "a -- a/k"        "StackUnderflow, DivideByZero"  "Divides by the immediate.";
            ModI    "modi"    0x3d Int     Compute Const  "a -- a%k"        "StackUnderflow, DivideByZero"  "Remainder by the immediate.";
            // ---- bitwise and logical (0x40..) -----------------------------------
            And     "and"     0x40 None    Compute Const  "a b -- a&b"      "StackUnderflow"                "Bitwise and.";
            Or      "or"      0x41 None    Compute Const  "a b -- a|b"      "StackUnderflow"                "Bitwise or.";
            Xor     "xor"     0x42 None    Compute Const  "a b -- a^b"      "StackUnderflow"                "Bitwise exclusive or.";
            Not     "not"     0x43 None    Compute Const  "a -- ~a"         "StackUnderflow"                "Bitwise complement.";
            Shl     "shl"     0x44 None    Compute Const  "a n -- a<<n"     "StackUnderflow"                "Shift left by n mod 32.";
            Shr     "shr"     0x45 None    Compute Const  "a n -- a>>n"     "StackUnderflow"                "Arithmetic shift right by n mod 32.";
            ShrU    "shru"    0x46 None    Compute Const  "a n -- a>>>n"    "StackUnderflow"                "Logical shift right of the 25-bit pattern.";
            AndI    "andi"    0x47 Int     Compute Const  "a -- a&k"        "StackUnderflow"                "Bitwise and with the immediate.";
            OrI     "ori"     0x48 Int     Compute Const  "a -- a|k"        "StackUnderflow"                "Bitwise or with the immediate.";
            XorI    "xori"    0x49 Int     Compute Const  "a -- a^k"        "StackUnderflow"                "Exclusive or with the immediate.";
            ShlI    "shli"    0x4a Count   Compute Const  "a -- a<<k"       "StackUnderflow"                "Shift left by the immediate mod 32.";
            ShrI    "shri"    0x4b Count   Compute Const  "a -- a>>k"       "StackUnderflow"                "Arithmetic shift right by the immediate mod 32.";
            LNot    "lnot"    0x4c None    Compute Const  "a -- b"          "StackUnderflow"                "Logical not: pushes true if the datum is zero.";
            // ---- relational (0x50..) --------------------------------------------
            Eq      "eq"      0x50 None    Compute Const  "a b -- b"        "StackUnderflow, TypeMismatch, HeapOutOfBounds"                "Equality: same tag and same datum; addresses and floats by value, blobs, strings and tuples by identity.";
            Neq     "neq"     0x51 None    Compute Const  "a b -- b"        "StackUnderflow, TypeMismatch, HeapOutOfBounds"                "Negation of `eq`.";
            Lt      "lt"      0x52 None    Compute Const  "a b -- a<b"      "StackUnderflow"                "Signed integer less-than.";
            Le      "le"      0x53 None    Compute Const  "a b -- a<=b"     "StackUnderflow"                "Signed integer less-or-equal.";
            Gt      "gt"      0x54 None    Compute Const  "a b -- a>b"      "StackUnderflow"                "Signed integer greater-than.";
            Ge      "ge"      0x55 None    Compute Const  "a b -- a>=b"     "StackUnderflow"                "Signed integer greater-or-equal.";
            EqI     "eqi"     0x56 Int     Compute Const  "a -- a==k"       "StackUnderflow"                "Compares the datum with the immediate.";
            NeqI    "neqi"    0x57 Int     Compute Const  "a -- a!=k"       "StackUnderflow"                "Negation of `eqi`.";
            LtI     "lti"     0x58 Int     Compute Const  "a -- a<k"        "StackUnderflow"                "Less than the immediate.";
            LeI     "lei"     0x59 Int     Compute Const  "a -- a<=k"       "StackUnderflow"                "Less or equal to the immediate.";
            GtI     "gti"     0x5a Int     Compute Const  "a -- a>k"        "StackUnderflow"                "Greater than the immediate.";
            GeI     "gei"     0x5b Int     Compute Const  "a -- a>=k"       "StackUnderflow"                "Greater or equal to the immediate.";
            // ---- floating point (0x60..) ----------------------------------------
            FAdd    "fadd"    0x60 None    Float   Alloc  "x y -- x+y"      "StackUnderflow, TypeMismatch, OutOfMemory, HeapOutOfBounds" "IEEE-754 binary32 addition.";
            FSub    "fsub"    0x61 None    Float   Alloc  "x y -- x-y"      "StackUnderflow, TypeMismatch, OutOfMemory, HeapOutOfBounds" "Float subtraction.";
            FMul    "fmul"    0x62 None    Float   Alloc  "x y -- x*y"      "StackUnderflow, TypeMismatch, OutOfMemory, HeapOutOfBounds" "Float multiplication.";
            FDiv    "fdiv"    0x63 None    Float   Alloc  "x y -- x/y"      "StackUnderflow, TypeMismatch, OutOfMemory, HeapOutOfBounds" "Float division (IEEE semantics, no trap).";
            FNeg    "fneg"    0x64 None    Float   Alloc  "x -- -x"         "StackUnderflow, TypeMismatch, OutOfMemory, HeapOutOfBounds" "Float negation.";
            FLt     "flt"     0x65 None    Float   Const  "x y -- b"        "StackUnderflow, TypeMismatch, HeapOutOfBounds"  "Float less-than.";
            FLe     "fle"     0x66 None    Float   Const  "x y -- b"        "StackUnderflow, TypeMismatch, HeapOutOfBounds"  "Float less-or-equal.";
            FEq     "feq"     0x67 None    Float   Const  "x y -- b"        "StackUnderflow, TypeMismatch, HeapOutOfBounds"  "Float equality.";
            IToF    "itof"    0x68 None    Float   Alloc  "i -- x"          "StackUnderflow, OutOfMemory"   "Converts an integer to a float.";
            FToI    "ftoi"    0x69 None    Float   Const  "x -- i"          "StackUnderflow, TypeMismatch, HeapOutOfBounds"  "Converts a float to an integer, truncating and saturating at 25 bits; NaN gives 0.";
            // ---- addresses (0x6c..) ---------------------------------------------
            AMask   "amask"   0x6c Count   Address Alloc  "a -- a'"         "StackUnderflow, TypeMismatch, InvalidImmediate, OutOfMemory, HeapOutOfBounds" "Keeps the first k bits of address a (subnet mask /k, k ≤ 32).";
            AMatch  "amatch"  0x6d Count   Address Const  "a b -- b"        "StackUnderflow, TypeMismatch, InvalidImmediate, HeapOutOfBounds" "Whether a and b are in the same /k subnet.";
            AOctet  "aoctet"  0x6e Count   Address Const  "a -- i"          "StackUnderflow, TypeMismatch, InvalidImmediate, HeapOutOfBounds" "Pushes octet k (0 is the first) of address a.";
            MkAddr  "mkaddr"  0x6f None    Address Alloc  "o0 o1 o2 o3 -- a" "StackUnderflow, OutOfMemory"  "Builds the address o0.o1.o2.o3 from four integers (each taken mod 256).";
            // ---- tuples and types (0x70..) --------------------------------------
            MkTup   "mktup"   0x70 Count   Tuple   Amortized "v0..vn-1 -- t" "StackUnderflow, MktupTooClose, MktupPastEnd, OutOfMemory" "Pops n values into a new tuple (v0 deepest is element 0). Must be followed by n-1 non-`mktup` instructions (SNAP §IV-A.2).";
            Nth     "nth"     0x71 Count   Tuple   Const  "t -- v"          "StackUnderflow, TypeMismatch, IndexOutOfBounds, HeapOutOfBounds" "Pushes element k of tuple t.";
            NthX    "nthx"    0x72 None    Tuple   Const  "t i -- v"        "StackUnderflow, TypeMismatch, IndexOutOfBounds, HeapOutOfBounds" "Pushes element i of tuple t.";
            TLen    "tlen"    0x73 None    Tuple   Const  "t -- i"          "StackUnderflow, TypeMismatch, HeapOutOfBounds"  "Pushes the number of elements of tuple t.";
            IsTag   "istag"   0x74 Tag     Tuple   Const  "v -- b"          "StackUnderflow"                "Pops v; pushes whether its tag is the immediate.";
            TagOf   "tagof"   0x75 None    Tuple   Const  "v -- i"          "StackUnderflow"                "Pops v; pushes its tag as an integer.";
            // ---- byte arrays (0x78..) -------------------------------------------
            BLen    "blen"    0x78 None    Blob    Const  "s -- i"          "StackUnderflow, TypeMismatch, HeapOutOfBounds"  "Pushes the length in bytes of a blob or string.";
            BGet    "bget"    0x79 Count   Blob    Const  "s -- i"          "StackUnderflow, TypeMismatch, IndexOutOfBounds, HeapOutOfBounds" "Pushes byte k of s.";
            BGetX   "bgetx"   0x7a None    Blob    Const  "s i -- i"        "StackUnderflow, TypeMismatch, IndexOutOfBounds, HeapOutOfBounds" "Pushes byte i of s.";
            BGet16  "bget16"  0x7b Count   Blob    Const  "s -- i"          "StackUnderflow, TypeMismatch, IndexOutOfBounds, HeapOutOfBounds" "Pushes the big-endian 16-bit value at byte k of s.";
            BGetA   "bgeta"   0x7c Count   Blob    Alloc  "s -- a"          "StackUnderflow, TypeMismatch, IndexOutOfBounds, OutOfMemory, HeapOutOfBounds" "Pushes the 4 bytes at byte k of s as an address.";
            // ---- services (0x7f) ------------------------------------------------
            Calls   "calls"   0x7f HeapRef Service Service "args -- r"      "HeapOutOfBounds, TypeMismatch, UnknownService, ServiceFailed, StackUnderflow, OutOfMemory" "Calls the node-resident service whose name is the string at the immediate heap offset; it pops its arguments and pushes one result.";
        }
    };
}

macro_rules! define_ops {
    ($($name:ident $mn:literal $code:literal $imm:ident $class:ident $cost:ident $eff:literal $fails:literal $doc:literal;)*) => {
        /// A SNAP opcode.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum Op {
            $(#[doc = $doc] $name = $code,)*
        }

        /// Every opcode, in table order.
        pub const ALL_OPS: &[Op] = &[$(Op::$name,)*];

        /// Opcode lookup table indexed by the 7-bit code.
        const DECODE: [Option<Op>; 128] = {
            let mut t = [None; 128];
            $(t[$code] = Some(Op::$name);)*
            t
        };

        impl Op {
            /// The 7-bit opcode.
            #[inline(always)]
            pub const fn code(self) -> u8 { self as u8 }

            /// Decodes a 7-bit opcode; `None` if it is unassigned.
            #[inline(always)]
            pub const fn from_code(code: u8) -> Option<Op> {
                if code < 128 { DECODE[code as usize] } else { None }
            }

            /// The assembler mnemonic.
            pub const fn mnemonic(self) -> &'static str {
                match self { $(Op::$name => $mn,)* }
            }

            /// Looks up an assembler mnemonic.
            pub fn from_mnemonic(s: &str) -> Option<Op> {
                match s { $($mn => Some(Op::$name),)* _ => None }
            }

            /// How the immediate is read.
            pub const fn imm_kind(self) -> ImmKind {
                match self { $(Op::$name => ImmKind::$imm,)* }
            }

            /// The instruction class.
            pub const fn class(self) -> Class {
                match self { $(Op::$name => Class::$class,)* }
            }

            /// The cost class.
            pub const fn cost(self) -> Cost {
                match self { $(Op::$name => Cost::$cost,)* }
            }

            /// Stack effect, `before -- after`, top on the right.
            pub const fn stack_effect(self) -> &'static str {
                match self { $(Op::$name => $eff,)* }
            }

            /// The fault kinds this instruction can end a packet with.
            pub const fn failures(self) -> &'static str {
                match self { $(Op::$name => $fails,)* }
            }

            /// One-line description.
            pub const fn doc(self) -> &'static str {
                match self { $(Op::$name => $doc,)* }
            }
        }
    };
}

for_each_op!(define_ops);

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.mnemonic())
    }
}

/// A decoded instruction: opcode plus raw 25-bit immediate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Insn {
    /// The opcode.
    pub op: Op,
    /// The raw 25-bit immediate field.
    pub imm: u32,
}

/// A word whose opcode field is not assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid opcode {code:#04x}")]
pub struct InvalidOpcode {
    /// The unassigned 7-bit code.
    pub code: u8,
}

/// An immediate that does not fit its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("immediate {value} out of range for `{op}` ({kind})", kind = op.imm_kind().name())]
pub struct ImmOutOfRange {
    /// The instruction.
    pub op: Op,
    /// The rejected value.
    pub value: i64,
}

impl Insn {
    /// Builds an instruction from an opcode and a numeric immediate, checking
    /// that the immediate fits the opcode's immediate kind.
    pub fn new(op: Op, value: i64) -> Result<Insn, ImmOutOfRange> {
        let ok = match op.imm_kind() {
            ImmKind::None => value == 0,
            ImmKind::Int | ImmKind::Adjust => (IMM_MIN as i64..=IMM_MAX as i64).contains(&value),
            ImmKind::Offset => (1..=IMM_MAX as i64).contains(&value),
            ImmKind::Count | ImmKind::HeapRef => (0..=IMM_MASK as i64).contains(&value),
            ImmKind::Bool => value == 0 || value == 1,
            ImmKind::Tag => (0..128).contains(&value),
        };
        if ok { Ok(Insn { op, imm: (value as u32) & IMM_MASK }) } else { Err(ImmOutOfRange { op, value }) }
    }

    /// Decodes one instruction word.
    #[inline(always)]
    pub const fn decode(word: u32) -> Result<Insn, InvalidOpcode> {
        let code = (word >> IMM_BITS) as u8;
        match Op::from_code(code) {
            Some(op) => Ok(Insn { op, imm: word & IMM_MASK }),
            None => Err(InvalidOpcode { code }),
        }
    }

    /// Encodes the instruction as one word.
    #[inline(always)]
    pub const fn encode(self) -> u32 {
        ((self.op as u32) << IMM_BITS) | (self.imm & IMM_MASK)
    }

    /// The immediate read as a signed 25-bit number.
    #[inline(always)]
    pub const fn simm(self) -> i32 {
        sext25(self.imm)
    }

    /// The immediate as the assembler writes it (signed where the kind is).
    pub const fn imm_value(self) -> i64 {
        if self.op.imm_kind().is_signed() { self.simm() as i64 } else { self.imm as i64 }
    }
}

impl fmt::Display for Insn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op.imm_kind() {
            ImmKind::None => f.write_str(self.op.mnemonic()),
            _ => write!(f, "{} {}", self.op.mnemonic(), self.imm_value()),
        }
    }
}

/// Renders the opcode table as Markdown, for `docs/snap.md`.
///
/// A test checks that the document contains exactly this text.
pub fn markdown_table() -> String {
    let mut s = String::from(
        "| code | mnemonic | class | immediate | stack effect | cost | fails with | description |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for op in ALL_OPS {
        let fails = if op.failures().is_empty() { "—" } else { op.failures() };
        s.push_str(&format!(
            "| `{:#04x}` | `{}` | {} | {} | `{}` | {} | {} | {} |\n",
            op.code(),
            op.mnemonic(),
            op.class().name(),
            op.imm_kind().name(),
            op.stack_effect(),
            op.cost().name(),
            fails,
            op.doc().replace('|', "\\|"),
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        let mut seen = std::collections::HashSet::new();
        for &op in ALL_OPS {
            assert!(seen.insert(op.code()), "duplicate code {:#x}", op.code());
            assert_eq!(Op::from_code(op.code()), Some(op));
            assert_eq!(Op::from_mnemonic(op.mnemonic()), Some(op));
        }
        assert!(ALL_OPS.len() >= 95, "about 100 instructions, have {}", ALL_OPS.len());
    }

    #[test]
    fn encode_decode_roundtrip() {
        for &op in ALL_OPS {
            for v in [0i64, 1, 5, -1, IMM_MAX as i64, IMM_MIN as i64] {
                if let Ok(i) = Insn::new(op, v) {
                    let back = Insn::decode(i.encode()).expect("valid");
                    assert_eq!(back, i);
                    assert_eq!(back.imm_value(), v);
                }
            }
        }
    }

    #[test]
    fn unassigned_codes_are_rejected() {
        let n = (0u8..128).filter(|&c| Op::from_code(c).is_none()).count();
        assert_eq!(n, 128 - ALL_OPS.len());
        assert_eq!(Insn::decode(0x7e << 25), Err(InvalidOpcode { code: 0x7e }));
    }

    #[test]
    fn offsets_must_be_forward() {
        assert!(Insn::new(Op::Bne, 0).is_err());
        assert!(Insn::new(Op::Bne, -3).is_err());
        assert!(Insn::new(Op::Bne, 5).is_ok());
    }
}
