; Multicast to a list of hosts (`anode multicast`): one packet visits each
; listed host in turn and leaves a copy of the message there.
;
; Stack, top first: [port :: message :: a1 :: a2 :: ... :: an], n >= 1; a1
; is the next host to visit.  Code is forward only, so each node runs it at
; most once per arrival; the loop over the hosts is the network itself: the
; packet restarts at instruction 0 at every node it reaches (`forwto` keeps
; the entry point and the whole stack).
;
; - On the way to a1 (including the node it was injected at, if that is not
;   a1) the packet just moves on: one network operation.
; - At a1, if a1 is the last host (stack depth 3), `demux` delivers: one op.
; - Otherwise it `send`s itself a delivery child (resource bound 1, it only
;   arrives here), drops a1 and `forwto`s a2: two network operations, so a
;   listed host other than the last needs at least 2 interfaces (SNAP
;   §IV-A.1: at most one network operation per interface per node).
;
; The resource bound limits the tour: every arrival at a node costs 1 and
; every delivery child 1, so visiting hosts h hops apart in all takes
; rb >= 1 + h + (n - 1).  Where the bound runs out the packet faults
; (resource_bound_exhausted), which also undoes the copy it made there, so
; that host and all after it get nothing; the tour never costs more than rb
; transmissions whatever the list says (SNAP §IV-A.3).  The list
; itself is limited only by the MTU (4 bytes of stack and 8 of heap a host).
.src 10.0.0.1
.dst 10.0.0.2
.rb 16
.port 7000
.stack 7000, blob "hello", 10.0.0.2, 10.0.0.3

visit:  pull 2          ; [a1 :: port :: msg :: a1 :: ...]
        forwto          ; not at a1 yet: on toward it; here: fall through
        depth           ; at a1: is it the last host?
        eqi 3
        bne deliver     ; yes: deliver and end
        pull 1          ; [msg :: port :: msg :: a1 :: ...]
        pull 1          ; [port :: msg :: port :: msg :: a1 :: ...]
        push deliver    ; the copy's entry point
        push 2          ; it takes [port :: msg]
        push 1          ; resource bound 1: it only arrives here
        here            ; to this node itself
        send            ; [() :: port :: msg :: port :: msg :: a1 :: ...]
        popi 3          ; [port :: msg :: a1 :: a2 :: ...]
        store 1         ; [msg :: port :: a2 :: ...]
        swap            ; [port :: msg :: a2 :: ...]
        pull 2          ; [a2 :: port :: msg :: a2 :: ...]
        forwto          ; on toward a2
        exit            ; (a2 is this node: a duplicate in the list)
deliver: demux          ; deliver msg to port and end
