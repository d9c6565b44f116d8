//! Built-in functions: PLAN services and list primitives, each mapped to SNAP
//! instructions or a `calls` service (see the table in `docs/plan.md`).

use anode_snap::Op;

/// Argument or result type of a built-in with a fixed signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BTy {
    /// `int`
    Int,
    /// `bool`
    Bool,
    /// `unit`
    Unit,
    /// `float`
    Float,
    /// `host`
    Host,
    /// `blob`
    Blob,
    /// `string`
    Str,
    /// A soft-state key: int, bool, host, blob or string.
    Key,
    /// A soft-state value: int, bool, unit, host or float.
    Scalar,
    /// Any type.
    Any,
    /// A constant integer literal, compiled into the instruction's immediate.
    ConstInt,
}

/// How a built-in compiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// One instruction without immediate, after the arguments.
    Insn(Op),
    /// One instruction whose immediate is the last (constant) argument.
    InsnImm(Op),
    /// `calls "name"` after the arguments.
    Service(&'static str),
    /// `calls "state.get"; istag unit; lnot`.
    StateMember,
    /// `demux`: delivers and ends the packet.
    Deliver,
    /// `hd`, `tl`, `null`: handled by the checker and code generator.
    List,
    /// `abort(msg)`: prints the message and ends the packet with a fault.
    Abort,
}

/// A built-in function.
#[derive(Debug, Clone, Copy)]
pub struct Builtin {
    /// PLAN name.
    pub name: &'static str,
    /// Parameter types.
    pub params: &'static [BTy],
    /// Result type.
    pub ret: BTy,
    /// Code.
    pub code: Code,
    /// One-line description for the docs.
    pub doc: &'static str,
}

use BTy::*;
use Code::*;

/// Every built-in.
pub const BUILTINS: &[Builtin] = &[
    Builtin {
        name: "getSrc",
        params: &[],
        ret: Host,
        code: Insn(Op::GetSrc),
        doc: "source address of this packet (the node that sent it)",
    },
    Builtin {
        name: "getDst",
        params: &[],
        ret: Host,
        code: Insn(Op::GetDst),
        doc: "destination address of this packet",
    },
    Builtin { name: "getRB", params: &[], ret: Int, code: Insn(Op::GetRb), doc: "remaining resource bound" },
    Builtin { name: "thisHost", params: &[], ret: Host, code: Insn(Op::Here), doc: "this node's address" },
    Builtin {
        name: "getPort",
        params: &[],
        ret: Int,
        code: Insn(Op::GetPort),
        doc: "the packet header's application port",
    },
    Builtin { name: "getIfCount", params: &[], ret: Int, code: Insn(Op::GetIfc), doc: "this node's interface count" },
    Builtin { name: "numNeighbors", params: &[], ret: Int, code: Insn(Op::NNbr), doc: "number of neighbours" },
    Builtin { name: "neighbor", params: &[Int], ret: Host, code: Insn(Op::Nbr), doc: "neighbour i (unit if none)" },
    Builtin {
        name: "isHere",
        params: &[Host],
        ret: Bool,
        code: Insn(Op::IsHere),
        doc: "whether h is an address of this node",
    },
    Builtin {
        name: "nextHop",
        params: &[Host],
        ret: Host,
        code: Insn(Op::NextHop),
        doc: "next hop toward h (unit if no route)",
    },
    Builtin {
        name: "mkHost",
        params: &[Int, Int, Int, Int],
        ret: Host,
        code: Insn(Op::MkAddr),
        doc: "the address a.b.c.d",
    },
    Builtin {
        name: "octet",
        params: &[Host, ConstInt],
        ret: Int,
        code: InsnImm(Op::AOctet),
        doc: "octet k (constant, 0 first) of h",
    },
    Builtin {
        name: "maskHost",
        params: &[Host, ConstInt],
        ret: Host,
        code: InsnImm(Op::AMask),
        doc: "h masked to its first k bits (constant)",
    },
    Builtin {
        name: "sameSubnet",
        params: &[Host, Host, ConstInt],
        ret: Bool,
        code: InsnImm(Op::AMatch),
        doc: "whether a and b share the /k subnet (constant k)",
    },
    Builtin { name: "blobLength", params: &[Blob], ret: Int, code: Insn(Op::BLen), doc: "length of a blob in bytes" },
    Builtin { name: "blobByte", params: &[Blob, Int], ret: Int, code: Insn(Op::BGetX), doc: "byte i of a blob" },
    Builtin { name: "size", params: &[Str], ret: Int, code: Insn(Op::BLen), doc: "length of a string in bytes" },
    Builtin { name: "real", params: &[Int], ret: Float, code: Insn(Op::IToF), doc: "integer to float" },
    Builtin { name: "trunc", params: &[Float], ret: Int, code: Insn(Op::FToI), doc: "float to integer, toward zero" },
    Builtin { name: "abs", params: &[Int], ret: Int, code: Insn(Op::Abs), doc: "absolute value" },
    Builtin { name: "min", params: &[Int, Int], ret: Int, code: Insn(Op::Min), doc: "smaller of two integers" },
    Builtin { name: "max", params: &[Int, Int], ret: Int, code: Insn(Op::Max), doc: "larger of two integers" },
    Builtin { name: "andb", params: &[Int, Int], ret: Int, code: Insn(Op::And), doc: "bitwise and" },
    Builtin { name: "orb", params: &[Int, Int], ret: Int, code: Insn(Op::Or), doc: "bitwise or" },
    Builtin { name: "xorb", params: &[Int, Int], ret: Int, code: Insn(Op::Xor), doc: "bitwise exclusive or" },
    Builtin {
        name: "clockMs",
        params: &[],
        ret: Int,
        code: Service("clock.ms"),
        doc: "node clock in ms modulo 2^24 (service `clock.ms`)",
    },
    Builtin {
        name: "clockS",
        params: &[],
        ret: Int,
        code: Service("clock.s"),
        doc: "node clock in s (service `clock.s`)",
    },
    Builtin {
        name: "statePut",
        params: &[Key, Scalar, Int],
        ret: Unit,
        code: Service("state.put"),
        doc: "soft state: store value under key for ttl s (1-3600)",
    },
    Builtin {
        name: "stateGet",
        params: &[Key],
        ret: Int,
        code: Service("state.get"),
        doc: "soft state: the int under key (unit, which acts as 0, if absent)",
    },
    Builtin {
        name: "stateGetHost",
        params: &[Key],
        ret: Host,
        code: Service("state.get"),
        doc: "soft state: the host under key (unit if absent)",
    },
    Builtin {
        name: "stateMember",
        params: &[Key],
        ret: Bool,
        code: StateMember,
        doc: "soft state: whether key is present",
    },
    Builtin {
        name: "stateDel",
        params: &[Key],
        ret: Bool,
        code: Service("state.del"),
        doc: "soft state: remove key; whether it was present",
    },
    Builtin {
        name: "print",
        params: &[Any],
        ret: Unit,
        code: Service("print"),
        doc: "append the value to the packet's log (service `print`)",
    },
    Builtin {
        name: "abort",
        params: &[Str],
        ret: Unit,
        code: Abort,
        doc: "print the message and end the packet with a fault (no network effect)",
    },
    Builtin {
        name: "deliver",
        params: &[Any, Int],
        ret: Unit,
        code: Deliver,
        doc: "deliver v to application port p and end the packet (`demux`)",
    },
    Builtin {
        name: "deliverUDP",
        params: &[Any, Int],
        ret: Unit,
        code: Deliver,
        doc: "the same as deliver, PLAN's name",
    },
    Builtin { name: "hd", params: &[Any], ret: Any, code: List, doc: "first element of a list (`nth 0`)" },
    Builtin { name: "tl", params: &[Any], ret: Any, code: List, doc: "the rest of a list (`nth 1`)" },
    Builtin { name: "null", params: &[Any], ret: Bool, code: List, doc: "whether a list is empty (`istag unit`)" },
];

/// The built-in called `name`.
pub fn lookup(name: &str) -> Option<&'static Builtin> {
    BUILTINS.iter().find(|b| b.name == name)
}

/// Names that are not functions but cannot be redefined either.
pub const RESERVED: &[&str] = &["foldl", "foldr", "OnRemote", "OnNeighbor", "defaultRoute"];
