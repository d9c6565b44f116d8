; SNAP's equivalent of UDP (SNAP paper §VII-A: "forw followed by demux"):
; the packet travels to its destination and delivers its payload to the
; port on its stack.  Overhead 44 bytes: the 24-byte header, two
; instructions, the blob's header word and two stack words.  `anode send`
; fills in the header and the stack [port :: blob chunk].
.src 10.0.0.1
.dst 10.0.0.3
.rb 16
.port 7
.stack 7, blob "hello"

        forw            ; on toward dst, unless this is it
        demux           ; deliver the blob to the port
