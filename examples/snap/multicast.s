; Multicast by flooding a tree: every node that runs the packet hands a copy
; to each neighbour except the one it came from, then delivers the payload
; locally.  `send` sets a child's src to the sender, so at every node but the
; origin `getsrc` is the previous hop; the origin injects the packet with its
; own address as src, so there every neighbour gets a copy.
;
; The remaining resource bound is split evenly among the children (rb / count,
; rounded down); a child gets nothing, and its subtree is not reached, when the
; share is 0.  On a tree every node is reached at most once (no cycles, never
; back to the previous hop), and the depth reached is bounded by the rb.
;
; Branches go forward only, so the neighbour loop is unrolled over neighbours
; 0, 1 and 2 (`nbr i` is unit when there is none): nodes of degree at most 3.
; The origin does not deliver (its application already has the payload), so
; every node performs at most as many network operations as it has links:
; degree sends at the origin, degree − 1 sends plus one demux elsewhere. SNAP
; allows one network operation per interface, so this runs on nodes with one
; interface per link, as `anode testbed` builds them.
.src 10.0.0.1
.dst 10.0.0.1
.rb 7
.port 5
.stack blob "hello, tree"       ; [payload]

; --- count the children: neighbours that exist and are not the sender ---
        push 0                  ; [c :: payload]
        push 0
        nbr                     ; [a :: c :: payload]
        pull 0
        istag unit              ; no neighbour 0?
        bne c0none
        getsrc
        eq                      ; neighbour 0 is where we came from?
        bne c0done
        addi 1
        ji c0done
c0none: pop
c0done: push 1
        nbr
        pull 0
        istag unit
        bne c1none
        getsrc
        eq
        bne c1done
        addi 1
        ji c1done
c1none: pop
c1done: push 2
        nbr
        pull 0
        istag unit
        bne c2none
        getsrc
        eq
        bne c2done
        addi 1
        ji c2done
c2none: pop
; --- share = rb / max(c, 1) ---
c2done: push 1
        max                     ; [max(c,1) :: payload]
        getrb
        swap                    ; [m :: rb :: payload]
        div                     ; [share :: payload]
; --- one child per neighbour that exists, is not the sender, if share > 0 ---
        push 0
        nbr                     ; [a :: share :: payload]
        pull 0
        istag unit
        bne s0skip
        pull 0
        getsrc
        eq
        bne s0skip
        pull 1
        beq s0skip              ; share 0: nothing to give
        pull 2                  ; [payload :: a :: share :: payload]
        push 0                  ; entry point: this program again
        push 1                  ; the child's stack: [payload]
        pull 4                  ; rb = share
        pull 4                  ; to a
        send                    ; [() :: payload :: a :: share :: payload]
        popi 2
s0skip: pop                     ; [share :: payload]
        push 1
        nbr
        pull 0
        istag unit
        bne s1skip
        pull 0
        getsrc
        eq
        bne s1skip
        pull 1
        beq s1skip
        pull 2
        push 0
        push 1
        pull 4
        pull 4
        send
        popi 2
s1skip: pop
        push 2
        nbr
        pull 0
        istag unit
        bne s2skip
        pull 0
        getsrc
        eq
        bne s2skip
        pull 1
        beq s2skip
        pull 2
        push 0
        push 1
        pull 4
        pull 4
        send
        popi 2
s2skip: pop
; --- deliver here, on the originating application's port; not at the origin ---
        pop                     ; [payload]
        getsrc
        ishere
        bne origin
        getport
        demux
origin: exit
