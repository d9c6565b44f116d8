; Traceroute: every node after the source sends the source a report, the
; tuple (its address, its hop count), then the probe moves on.  Each report
; is a child packet given exactly the resource bound it needs to get home
; (one per hop), deducted from the probe's own bound.
.src 10.0.0.1
.dst 10.0.0.4
.rb 16
.port 9
.stack 0, 9             ; [hops :: reply port], top first

probe:
        pull 0          ; [k :: k :: port]
        beq next        ; nothing to report at the source itself
        here            ; [here :: k :: port]
        pull 1          ; [k :: here :: k :: port]
        mktup 2         ; [(here, k) :: k :: port]
        pull 2          ; [port :: t :: k :: port]
        push report     ; entry point of the report
        push 2          ; it takes [port :: t]
        pull 4          ; rb = k, one per hop back
        getsrc          ; to the source
        send
        popi 3          ; drop (), port, t
next:   addi 1          ; one more hop
        forw            ; on toward the destination
        exit            ; arrived
report: forw            ; travel home
        demux           ; deliver (address, hops) to the reply port
