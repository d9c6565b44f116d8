; SNAP ping, exactly as in Fig. 1 of the SNAP paper (7 instructions).
; Initial stack [0 :: port :: payload]: 0 means "outbound".
.src 10.0.0.1
.dst 10.0.0.3
.rb 16
.port 7
.stack 0, 7, blob "ping"

forw            ; move on if not at dest
bne 5           ; jump 5 instrs if nonzero on top
push 1          ; 1 means "on return trip"
getsrc          ; get source field
forwto          ; send return packet
pop             ; pop the 1 for local ping
demux           ; deliver payload
