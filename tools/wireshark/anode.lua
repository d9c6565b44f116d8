-- anode.lua: a Wireshark dissector for anode's wire formats (issue 19).
--
-- Dissects ANEP (the header that starts every datagram between anode
-- nodes), and inside it: SNAP packets (header, code disassembled into
-- mnemonics, heap objects, stack values), plain packets, capsules and the
-- code-fetch messages, control messages (module and pod loads, code chunks, replies),
-- and the outer AUTH/ESP/handshake/domain framing. An AUTH datagram's
-- inner datagram is dissected (it is not encrypted); an ESP one's is not
-- (it is), which is what `anode capture` is for: its pcap holds the
-- plaintext inner datagrams as UDP payloads between the real endpoints.
--
-- Load it:
--   tshark -X lua_script:tools/wireshark/anode.lua -r capture.pcap -V
--   wireshark -X lua_script:tools/wireshark/anode.lua capture.pcap
-- or copy it into the personal Lua plugins directory
-- (~/.local/lib/wireshark/plugins/ on Linux; Help > About > Folders).
--
-- It registers as a heuristic UDP dissector (an ANEP version 1 header
-- whose packet length equals the UDP payload's and whose type id is one of
-- anode's) and on the UDP port of the preference "anode.port" (0: none).
-- If another dissector owns the port, add `-o udp.try_heuristic_first:TRUE`.
--
-- The opcode table below is checked against the one in crates/snap/src/ops.rs
-- by crates/cli/tests/capture.rs (wireshark_opcode_table_matches_the_vm):
-- regenerate it from docs/snap.md section 5 when an instruction changes.
-- Written for Lua 5.1-5.4 (plain arithmetic, no bit operators).

local anode = Proto("anode", "anode active network (ANEP)")

-- SNAP instruction table: opcode -> { mnemonic, immediate kind }.
local OPS = {
    [0x00] = { "nop", "none" },
    [0x01] = { "push", "int" },
    [0x02] = { "pushb", "bool" },
    [0x03] = { "pushu", "none" },
    [0x04] = { "pushh", "heapref" },
    [0x05] = { "pop", "none" },
    [0x06] = { "popi", "count" },
    [0x07] = { "pull", "count" },
    [0x08] = { "store", "count" },
    [0x09] = { "slide", "count" },
    [0x0a] = { "swap", "none" },
    [0x10] = { "forw", "none" },
    [0x11] = { "forwto", "none" },
    [0x12] = { "send", "none" },
    [0x13] = { "demux", "none" },
    [0x14] = { "exit", "none" },
    [0x18] = { "bne", "offset" },
    [0x19] = { "beq", "offset" },
    [0x1a] = { "ji", "offset" },
    [0x1b] = { "paj", "adjust" },
    [0x20] = { "getsrc", "none" },
    [0x21] = { "getdst", "none" },
    [0x22] = { "getrb", "none" },
    [0x23] = { "getep", "none" },
    [0x24] = { "getport", "none" },
    [0x25] = { "here", "none" },
    [0x26] = { "ishere", "none" },
    [0x27] = { "getifc", "none" },
    [0x28] = { "nexthop", "none" },
    [0x29] = { "nbr", "none" },
    [0x2a] = { "nnbr", "none" },
    [0x2b] = { "depth", "none" },
    [0x30] = { "add", "none" },
    [0x31] = { "sub", "none" },
    [0x32] = { "mul", "none" },
    [0x33] = { "div", "none" },
    [0x34] = { "mod", "none" },
    [0x35] = { "neg", "none" },
    [0x36] = { "abs", "none" },
    [0x37] = { "min", "none" },
    [0x38] = { "max", "none" },
    [0x39] = { "addi", "int" },
    [0x3a] = { "subi", "int" },
    [0x3b] = { "muli", "int" },
    [0x3c] = { "divi", "int" },
    [0x3d] = { "modi", "int" },
    [0x40] = { "and", "none" },
    [0x41] = { "or", "none" },
    [0x42] = { "xor", "none" },
    [0x43] = { "not", "none" },
    [0x44] = { "shl", "none" },
    [0x45] = { "shr", "none" },
    [0x46] = { "shru", "none" },
    [0x47] = { "andi", "int" },
    [0x48] = { "ori", "int" },
    [0x49] = { "xori", "int" },
    [0x4a] = { "shli", "count" },
    [0x4b] = { "shri", "count" },
    [0x4c] = { "lnot", "none" },
    [0x50] = { "eq", "none" },
    [0x51] = { "neq", "none" },
    [0x52] = { "lt", "none" },
    [0x53] = { "le", "none" },
    [0x54] = { "gt", "none" },
    [0x55] = { "ge", "none" },
    [0x56] = { "eqi", "int" },
    [0x57] = { "neqi", "int" },
    [0x58] = { "lti", "int" },
    [0x59] = { "lei", "int" },
    [0x5a] = { "gti", "int" },
    [0x5b] = { "gei", "int" },
    [0x60] = { "fadd", "none" },
    [0x61] = { "fsub", "none" },
    [0x62] = { "fmul", "none" },
    [0x63] = { "fdiv", "none" },
    [0x64] = { "fneg", "none" },
    [0x65] = { "flt", "none" },
    [0x66] = { "fle", "none" },
    [0x67] = { "feq", "none" },
    [0x68] = { "itof", "none" },
    [0x69] = { "ftoi", "none" },
    [0x6c] = { "amask", "count" },
    [0x6d] = { "amatch", "count" },
    [0x6e] = { "aoctet", "count" },
    [0x6f] = { "mkaddr", "none" },
    [0x70] = { "mktup", "count" },
    [0x71] = { "nth", "count" },
    [0x72] = { "nthx", "none" },
    [0x73] = { "tlen", "none" },
    [0x74] = { "istag", "tag" },
    [0x75] = { "tagof", "none" },
    [0x78] = { "blen", "none" },
    [0x79] = { "bget", "count" },
    [0x7a] = { "bgetx", "none" },
    [0x7b] = { "bget16", "count" },
    [0x7c] = { "bgeta", "count" },
    [0x7f] = { "calls", "heapref" },
}

local TYPES = {
    [0xA001] = "SNAP", [0xA002] = "plain", [0xA003] = "capsule", [0xA004] = "control",
    [0xA005] = "AUTH", [0xA006] = "handshake", [0xA007] = "ESP", [0xA008] = "domain",
}
local TAGS = { [0] = "int", [1] = "bool", [2] = "unit", [3] = "addr", [4] = "float", [5] = "blob", [6] = "tuple", [7] = "str" }
local CONTROL_OPS = {
    [0x01] = "module load", [0x02] = "pod load", [0x03] = "code chunk", [0x81] = "load reply",
    [0x21] = "boot recovery", [0x22] = "ticket (KDC)",
}
local CAPSULE_KINDS = { [1] = "capsule", [2] = "code request", [3] = "code reply" }
local REPLY_STATUS = { [0] = "loaded", [1] = "already loaded", [2] = "refused", [3] = "staged" }
local REFUSALS = { [1] = "bad request", [2] = "no modules", [3] = "unknown principal", [4] = "denied", [5] = "module", [6] = "limit" }
local MNEMONICS = {}
for code, op in pairs(OPS) do MNEMONICS[code] = op[1] end

local f = anode.fields
-- ANEP
f.version = ProtoField.uint8("anode.anep.version", "Version")
f.flags = ProtoField.uint8("anode.anep.flags", "Flags", base.HEX)
f.discard = ProtoField.bool("anode.anep.discard_unknown", "Discard if type unknown", 8, nil, 0x80)
f.type = ProtoField.uint16("anode.anep.type", "Type id", base.HEX, TYPES)
f.hlen = ProtoField.uint16("anode.anep.header_words", "Header length (words)")
f.plen = ProtoField.uint16("anode.anep.length", "Packet length")
f.option = ProtoField.bytes("anode.anep.option", "Option")
f.payload = ProtoField.bytes("anode.anep.payload", "Payload")
-- plain
f.plain_dst = ProtoField.ipv4("anode.plain.dst", "Destination")
f.plain_src = ProtoField.ipv4("anode.plain.src", "Source")
f.plain_ttl = ProtoField.uint8("anode.plain.ttl", "TTL")
f.plain_port = ProtoField.uint16("anode.plain.port", "Port")
f.plain_data = ProtoField.bytes("anode.plain.payload", "Payload")
-- SNAP
f.snap_version = ProtoField.uint8("anode.snap.version", "Version")
f.snap_flags = ProtoField.uint8("anode.snap.flags", "Flags (bit 0: little-endian words)", base.HEX)
f.snap_entry = ProtoField.uint16("anode.snap.entry", "Entry point")
f.snap_rb = ProtoField.uint16("anode.snap.rb", "Resource bound")
f.snap_port = ProtoField.uint16("anode.snap.port", "Demux port")
f.snap_src = ProtoField.ipv4("anode.snap.src", "Source")
f.snap_dst = ProtoField.ipv4("anode.snap.dst", "Destination")
f.snap_code_len = ProtoField.uint16("anode.snap.code_len", "Code length (instructions)")
f.snap_heap_len = ProtoField.uint16("anode.snap.heap_len", "Heap length (words)")
f.snap_stack_len = ProtoField.uint16("anode.snap.stack_len", "Stack length (values)")
f.snap_reserved = ProtoField.uint16("anode.snap.reserved", "Reserved", base.HEX)
f.snap_insn = ProtoField.string("anode.snap.insn", "Instruction")
f.snap_opcode = ProtoField.uint8("anode.snap.opcode", "Opcode", base.HEX, MNEMONICS)
f.snap_mnemonic = ProtoField.string("anode.snap.mnemonic", "Mnemonic")
f.snap_imm = ProtoField.int32("anode.snap.imm", "Immediate")
f.snap_heap_obj = ProtoField.string("anode.snap.heap.object", "Heap object")
f.snap_stack_val = ProtoField.string("anode.snap.stack.value", "Stack value")
f.snap_stack_tag = ProtoField.uint8("anode.snap.stack.tag", "Tag", base.DEC, TAGS)
-- capsules
f.cap_version = ProtoField.uint8("anode.capsule.version", "Version")
f.cap_kind = ProtoField.uint8("anode.capsule.kind", "Kind", base.DEC, CAPSULE_KINDS)
f.cap_flags = ProtoField.uint8("anode.capsule.flags", "Flags (bit 0: code carried)", base.HEX)
f.cap_entry_len = ProtoField.uint8("anode.capsule.entry_len", "Entry name length")
f.cap_cred_len = ProtoField.uint16("anode.capsule.cred_len", "Credential length")
f.cap_data_len = ProtoField.uint16("anode.capsule.data_len", "Data length")
f.cap_code_len = ProtoField.uint32("anode.capsule.code_len", "Code length")
f.cap_hash = ProtoField.bytes("anode.capsule.hash", "Code SHA-256")
f.cap_entry = ProtoField.string("anode.capsule.entry", "Entry")
f.cap_cred = ProtoField.bytes("anode.capsule.credential", "Credential")
f.cap_data = ProtoField.bytes("anode.capsule.data", "Data")
f.cap_code = ProtoField.bytes("anode.capsule.code", "Code (WebAssembly)")
-- control
f.ctl_op = ProtoField.uint8("anode.control.op", "Op", base.HEX, CONTROL_OPS)
f.ctl_name = ProtoField.string("anode.control.name", "Name")
f.ctl_cred = ProtoField.bytes("anode.control.credential", "Credential")
f.ctl_code = ProtoField.bytes("anode.control.code", "Code")
f.ctl_status = ProtoField.uint8("anode.control.status", "Status", base.DEC, REPLY_STATUS)
f.ctl_module = ProtoField.uint32("anode.control.module", "Module id")
f.ctl_refusal = ProtoField.uint8("anode.control.refusal", "Refusal", base.DEC, REFUSALS)
f.ctl_reason = ProtoField.string("anode.control.reason", "Reason")
f.ctl_body = ProtoField.bytes("anode.control.body", "Body")
f.ctl_total = ProtoField.uint32("anode.control.total", "Code length")
f.ctl_offset = ProtoField.uint32("anode.control.offset", "Offset")
f.ctl_staged = ProtoField.uint32("anode.control.staged", "Bytes staged")
-- security framing
f.spi = ProtoField.uint32("anode.sec.spi", "SPI", base.HEX)
f.counter = ProtoField.uint64("anode.sec.counter", "Counter")
f.ciphertext = ProtoField.bytes("anode.sec.ciphertext", "Encrypted inner datagram")
f.tag = ProtoField.bytes("anode.sec.tag", "AES-GCM tag")
f.handshake = ProtoField.bytes("anode.sec.handshake", "Noise handshake message")

local e_malformed = ProtoExpert.new("anode.malformed", "Malformed anode datagram", expert.group.MALFORMED, expert.severity.ERROR)

-- The subtree of one format, or nil (its reason shown as malformed) when
-- the bytes are shorter than `min`.
local function opened(tree, tvb, title, min, why)
    local t = tree:add(anode, tvb(), title)
    if tvb:len() < min then
        t:add_proto_expert_info(e_malformed, why)
        return nil
    end
    return t
end
anode.experts = { e_malformed }

anode.prefs.port = Pref.uint("UDP port", 0, "Also decode this UDP port as anode (0: heuristics only)")

local TWO24, TWO25 = 16777216, 33554432

local function signed25(v)
    if v >= TWO24 then return v - TWO25 end
    return v
end

local function ipv4_text(w)
    local a = math.floor(w / 16777216) % 256
    local b = math.floor(w / 65536) % 256
    local c = math.floor(w / 256) % 256
    return string.format("%d.%d.%d.%d", a, b, c, w % 256)
end

-- A 32-bit word of a SNAP section, in the packet's byte order.
local function word(range, le)
    if le then return range:le_uint() end
    return range:uint()
end

-- The text of instruction word w: mnemonic and immediate.
local function insn_text(w)
    local code = math.floor(w / TWO25)
    local imm = w % TWO25
    local op = OPS[code]
    if op == nil then return string.format("(invalid opcode 0x%02x)", code), code, nil end
    local kind = op[2]
    if kind == "none" then return op[1], code, nil end
    if kind == "int" or kind == "offset" or kind == "adjust" then imm = signed25(imm) end
    if kind == "bool" then return op[1] .. " " .. (imm == 1 and "true" or (imm == 0 and "false" or tostring(imm))), code, imm end
    if kind == "tag" then return op[1] .. " " .. (TAGS[imm] or tostring(imm)), code, imm end
    if kind == "heapref" then return op[1] .. " @" .. imm, code, imm end
    return op[1] .. " " .. imm, code, imm
end

-- The bytes of a blob or string object: len bytes, packed most
-- significant first in each word of the packet's byte order.
local function object_bytes(tvb, off, len, le)
    local out = {}
    local words = math.floor((len + 3) / 4)
    for i = 0, words - 1 do
        local w = word(tvb(off + 4 * i, 4), le)
        for j = 3, 0, -1 do
            if #out < len then out[#out + 1] = math.floor(w / (256 ^ j)) % 256 end
        end
    end
    return out
end

local function printable(bytes)
    local s = {}
    for i = 1, math.min(#bytes, 64) do
        local b = bytes[i]
        if b >= 32 and b < 127 and b ~= 34 then s[#s + 1] = string.char(b) else s[#s + 1] = string.format("\\x%02x", b) end
    end
    if #bytes > 64 then s[#s + 1] = "..." end
    return '"' .. table.concat(s) .. '"'
end

-- Heap objects from word offset 0: an object where a header names one
-- that fits, else the raw word.
local function dissect_heap(tvb, tree, base_off, words, le)
    local i = 0
    while i < words do
        local off = base_off + 4 * i
        local hdr = word(tvb(off, 4), le)
        local typ = math.floor(hdr / TWO25)
        local len = hdr % TWO25
        local payload = nil
        if typ == 3 or typ == 4 then payload = 1
        elseif typ == 5 or typ == 7 then payload = math.floor((len + 3) / 4)
        elseif typ == 6 then payload = len end
        if payload ~= nil and i + 1 + payload <= words then
            local text
            if typ == 3 then
                text = "addr " .. ipv4_text(word(tvb(off + 4, 4), le))
            elseif typ == 4 then
                local w = word(tvb(off + 4, 4), le)
                local r = le and tvb(off + 4, 4):le_float() or tvb(off + 4, 4):float()
                text = string.format("float %g (0x%08x)", r, w)
            elseif typ == 6 then
                local el = {}
                for k = 1, math.min(len, 16) do
                    local v = word(tvb(off + 4 * k, 4), le)
                    el[#el + 1] = (TAGS[math.floor(v / TWO25)] or "?") .. " " .. (v % TWO25)
                end
                text = "tuple(" .. len .. ") [" .. table.concat(el, ", ") .. (len > 16 and ", ..." or "") .. "]"
            else
                text = TAGS[typ] .. "(" .. len .. ") " .. printable(object_bytes(tvb, off + 4, len, le))
            end
            tree:add(f.snap_heap_obj, tvb(off, 4 * (1 + payload)), string.format("@%d %s", i, text))
            i = i + 1 + payload
        else
            tree:add(f.snap_heap_obj, tvb(off, 4), string.format("@%d word 0x%08x", i, hdr))
            i = i + 1
        end
    end
end

local function dissect_snap(tvb, pinfo, tree)
    local t = opened(tree, tvb, "SNAP packet", 24, "SNAP packet shorter than its 24-byte header")
    if not t then return end
    t:add(f.snap_version, tvb(0, 1))
    local flags = tvb(1, 1):uint()
    local le = (flags % 2) == 1
    t:add(f.snap_flags, tvb(1, 1))
    t:add(f.snap_entry, tvb(2, 2))
    t:add(f.snap_rb, tvb(4, 2))
    t:add(f.snap_port, tvb(6, 2))
    t:add(f.snap_src, tvb(8, 4))
    t:add(f.snap_dst, tvb(12, 4))
    t:add(f.snap_code_len, tvb(16, 2))
    t:add(f.snap_heap_len, tvb(18, 2))
    t:add(f.snap_stack_len, tvb(20, 2))
    t:add(f.snap_reserved, tvb(22, 2))
    local code, heap, stack = tvb(16, 2):uint(), tvb(18, 2):uint(), tvb(20, 2):uint()
    if 24 + 4 * (code + heap + stack) > tvb:len() then
        t:add_proto_expert_info(e_malformed, "SNAP sections longer than the packet")
        return
    end
    pinfo.cols.info:append(string.format(" %s -> %s rb=%d code=%d", ipv4_text(tvb(8, 4):uint()),
        ipv4_text(tvb(12, 4):uint()), tvb(4, 2):uint(), code))
    local ct = t:add(anode, tvb(24, 4 * code), string.format("Code: %d instructions", code))
    local entry = tvb(2, 2):uint()
    for i = 0, code - 1 do
        local r = tvb(24 + 4 * i, 4)
        local text, opcode, imm = insn_text(word(r, le))
        local it = ct:add(f.snap_insn, r, string.format("%4d%s %s", i, i == entry and ">" or ":", text))
        it:add(f.snap_opcode, r, opcode)
        it:add(f.snap_mnemonic, r, (OPS[opcode] or { "invalid" })[1])
        if imm ~= nil then it:add(f.snap_imm, r, imm) end
    end
    local hoff = 24 + 4 * code
    if heap > 0 then
        dissect_heap(tvb, t:add(anode, tvb(hoff, 4 * heap), string.format("Heap: %d words", heap)), hoff, heap, le)
    end
    local soff = hoff + 4 * heap
    if stack > 0 then
        local st = t:add(anode, tvb(soff, 4 * stack), string.format("Stack: %d values (top first)", stack))
        for k = stack - 1, 0, -1 do
            local r = tvb(soff + 4 * k, 4)
            local w = word(r, le)
            local tag, datum = math.floor(w / TWO25), w % TWO25
            local text
            if tag == 0 then text = "int " .. signed25(datum)
            elseif tag == 1 then text = datum == 1 and "true" or "false"
            elseif tag == 2 then text = "()"
            elseif TAGS[tag] then text = TAGS[tag] .. " @" .. datum
            else text = string.format("tag %d datum %d", tag, datum) end
            local it = st:add(f.snap_stack_val, r, string.format("[%d] %s", stack - 1 - k, text))
            it:add(f.snap_stack_tag, r, tag)
        end
    end
end

local function dissect_plain(tvb, pinfo, tree)
    local t = opened(tree, tvb, "Plain packet", 12, "plain packet shorter than its 12-byte header")
    if not t then return end
    t:add(f.plain_dst, tvb(0, 4))
    t:add(f.plain_src, tvb(4, 4))
    t:add(f.plain_ttl, tvb(8, 1))
    t:add(f.plain_port, tvb(10, 2))
    if tvb:len() > 12 then t:add(f.plain_data, tvb(12)) end
    pinfo.cols.info:append(string.format(" %s -> %s:%d ttl=%d", ipv4_text(tvb(4, 4):uint()),
        ipv4_text(tvb(0, 4):uint()), tvb(10, 2):uint(), tvb(8, 1):uint()))
end

local function dissect_capsule(tvb, pinfo, tree)
    local t = opened(tree, tvb, "Capsule message", 2, "capsule message shorter than 2 bytes")
    if not t then return end
    local n = tvb:len()
    t:add(f.cap_version, tvb(0, 1))
    t:add(f.cap_kind, tvb(1, 1))
    local kind = tvb(1, 1):uint()
    if kind ~= 1 then pinfo.cols.info:append(" " .. (CAPSULE_KINDS[kind] or "?")) end
    if kind == 1 and n >= 44 then
        t:add(f.cap_flags, tvb(2, 1))
        t:add(f.cap_entry_len, tvb(3, 1))
        t:add(f.cap_cred_len, tvb(4, 2))
        t:add(f.cap_data_len, tvb(6, 2))
        t:add(f.cap_code_len, tvb(8, 4))
        t:add(f.cap_hash, tvb(12, 32))
        local el, cl, dl, kl = tvb(3, 1):uint(), tvb(4, 2):uint(), tvb(6, 2):uint(), tvb(8, 4):uint()
        if 44 + el + cl + dl + kl ~= n then
            t:add_proto_expert_info(e_malformed, "capsule lengths disagree with its size")
            return
        end
        local off = 44
        if el > 0 then
            t:add(f.cap_entry, tvb(off, el))
            pinfo.cols.info:append(" entry=" .. tvb(off, el):string())
        end
        off = off + el
        if cl > 0 then t:add(f.cap_cred, tvb(off, cl)) end
        off = off + cl
        if dl > 0 then t:add(f.cap_data, tvb(off, dl)) end
        off = off + dl
        if kl > 0 then t:add(f.cap_code, tvb(off, kl)) end
        pinfo.cols.info:append(kl > 0 and " (code carried)" or " (code by hash)")
    elseif kind == 2 and n == 34 then
        t:add(f.cap_hash, tvb(2, 32))
    elseif kind == 3 and n >= 38 then
        t:add(f.cap_code_len, tvb(2, 4))
        t:add(f.cap_hash, tvb(6, 32))
        if n > 38 then t:add(f.cap_code, tvb(38)) end
    else
        t:add_proto_expert_info(e_malformed, "capsule message of the wrong size for its kind")
    end
end

local function dissect_control(tvb, pinfo, tree)
    local t = opened(tree, tvb, "Control message", 1, "empty control message")
    if not t then return end
    local n = tvb:len()
    t:add(f.ctl_op, tvb(0, 1))
    local op = tvb(0, 1):uint()
    pinfo.cols.info:append(" " .. (CONTROL_OPS[op] or string.format("op 0x%02x", op)))
    if op == 0x01 and n >= 2 then
        local nl = tvb(1, 1):uint()
        if 2 + nl + 4 <= n then
            if nl > 0 then t:add(f.ctl_name, tvb(2, nl)) end
            local cl = tvb(2 + nl, 4):uint()
            local off = 6 + nl
            if off + cl <= n then
                if cl > 0 then t:add(f.ctl_cred, tvb(off, cl)) end
                if off + cl < n then t:add(f.ctl_code, tvb(off + cl)) end
                return
            end
        end
        t:add_proto_expert_info(e_malformed, "truncated load request")
    elseif op == 0x03 then
        if n < 10 then
            t:add_proto_expert_info(e_malformed, "a code chunk needs its length, offset and at least one byte")
            return
        end
        t:add(f.ctl_total, tvb(1, 4))
        t:add(f.ctl_offset, tvb(5, 4))
        t:add(f.ctl_code, tvb(9))
        pinfo.cols.info:append(string.format(" %d+%d of %d", tvb(5, 4):uint(), n - 9, tvb(1, 4):uint()))
    elseif op == 0x81 and n >= 2 then
        t:add(f.ctl_status, tvb(1, 1))
        local st = tvb(1, 1):uint()
        if st <= 1 and n == 6 then
            t:add(f.ctl_module, tvb(2, 4))
        elseif st == 2 and n >= 3 then
            t:add(f.ctl_refusal, tvb(2, 1))
            if n > 3 then t:add(f.ctl_reason, tvb(3)) end
        elseif st == 3 and n == 6 then
            t:add(f.ctl_staged, tvb(2, 4))
        end
    elseif n > 1 then
        t:add(f.ctl_body, tvb(1))
    end
end

local dissect_anep

local function dissect_protected(tvb, pinfo, tree, esp)
    local t = opened(tree, tvb, esp and "ESP (encrypted)" or "AUTH (authenticated)", 28, "shorter than SPI, counter and tag")
    if not t then return end
    local n = tvb:len()
    t:add(f.spi, tvb(0, 4))
    t:add(f.counter, tvb(4, 8))
    if n == 28 then
        pinfo.cols.info:append(" keepalive")
    elseif esp then
        t:add(f.ciphertext, tvb(12, n - 28))
        pinfo.cols.info:append(" (encrypted: capture it with `anode capture` to see it)")
    else
        dissect_anep(tvb(12, n - 28):tvb(), pinfo, t)
    end
    t:add(f.tag, tvb(n - 16, 16))
end

dissect_anep = function(tvb, pinfo, tree)
    local t = opened(tree, tvb, "ANEP", 8, "shorter than the 8-byte ANEP header")
    if not t then return end
    local n = tvb:len()
    t:add(f.version, tvb(0, 1))
    local ft = t:add(f.flags, tvb(1, 1))
    ft:add(f.discard, tvb(1, 1))
    t:add(f.type, tvb(2, 2))
    t:add(f.hlen, tvb(4, 2))
    t:add(f.plen, tvb(6, 2))
    local typ, words, plen = tvb(2, 2):uint(), tvb(4, 2):uint(), tvb(6, 2):uint()
    local hl = 4 * words
    if words < 2 or hl > n or plen ~= n then
        t:add_proto_expert_info(e_malformed, "ANEP lengths disagree with the datagram")
        return
    end
    local off = 8
    while off + 4 <= hl do
        local olen = 4 * tvb(off + 2, 2):uint()
        if olen < 4 or off + olen > hl then break end
        t:add(f.option, tvb(off, olen))
        off = off + olen
    end
    t:append_text(", " .. (TYPES[typ] or string.format("type 0x%04x", typ)))
    if hl == n then return end
    local body = tvb(hl):tvb()
    if typ == 0xA001 then dissect_snap(body, pinfo, t)
    elseif typ == 0xA002 then dissect_plain(body, pinfo, t)
    elseif typ == 0xA003 then dissect_capsule(body, pinfo, t)
    elseif typ == 0xA004 then dissect_control(body, pinfo, t)
    elseif typ == 0xA005 then dissect_protected(body, pinfo, t, false)
    elseif typ == 0xA007 then dissect_protected(body, pinfo, t, true)
    elseif typ == 0xA006 then
        t:add(f.handshake, tvb(hl))
    else
        t:add(f.payload, tvb(hl))
    end
end

-- The SLL2 packet type of `anode capture` records: 0 received, 4 sent.
local sll_pkttype_field = Field.new("sll.pkttype")
local function sll_pkttype()
    local v = sll_pkttype_field()
    if v == nil then return nil end
    return v.value
end

function anode.dissector(tvb, pinfo, tree)
    pinfo.cols.protocol = "ANODE"
    pinfo.cols.info = (TYPES[tvb(2, 2):uint()] or "ANEP")
    local pkttype = sll_pkttype()
    if pkttype ~= nil then pinfo.cols.info:prepend(pkttype == 4 and "out " or "in  ") end
    dissect_anep(tvb, pinfo, tree)
    return tvb:len()
end

-- ANEP version 1, header length >= 2 words inside the datagram, packet
-- length equal to the UDP payload's, and one of anode's type ids.
local function heuristic(tvb, pinfo, tree)
    local n = tvb:len()
    if n < 8 or tvb(0, 1):uint() ~= 1 then return false end
    local words, plen, typ = tvb(4, 2):uint(), tvb(6, 2):uint(), tvb(2, 2):uint()
    if words < 2 or 4 * words > n or plen ~= n or TYPES[typ] == nil then return false end
    anode.dissector(tvb, pinfo, tree)
    return true
end

anode:register_heuristic("udp", heuristic)

local registered_port = 0
function anode.prefs_changed()
    local udp = DissectorTable.get("udp.port")
    if registered_port ~= 0 then udp:remove(registered_port, anode) end
    registered_port = anode.prefs.port
    if registered_port ~= 0 then udp:add(registered_port, anode) end
end
