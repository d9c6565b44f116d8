; Ping as compiled from PLAN, Fig. 2 of the SNAP paper.
;   fun r(w:blob,n:int) = deliverUDP(w,n)
;   fun p(w:blob,n:int) = OnRemote(|r|(w,n), getSrc(), getRB(), defaultRoute)
; The packet starts at p's code on the destination: entry is defaultRoute with
; the offset of p on the stack, so forw carries it there first.
.src 10.0.0.1
.dst 10.0.0.3
.rb 16
.port 7
.entry defaultRoute
.stack p, 7, blob "ping"

defaultRoute :
        forw            ; forward to dest
        paj -1          ; jump to top stack value - 1
r :     pull 0          ; get port num
        pull 2          ; get data
        demux           ; deliver data & exit
p:      pull 0          ; pkt stack: port
        pull 2          ; pkt stack: data
        push r          ; pkt stack: paj offset
        push defaultRoute ; entry point
        push 3          ; how much stack
        getrb           ; how much rb
        getsrc          ; return to src
        send            ; send return packet
        pop             ; pop send return val
        popi 3          ; pop extra stack
        exit            ; done
