; compiled by anode-plan
.src 10.0.0.1
.dst 10.0.0.3
.rb 8
.port 0
.entry defaultRoute
.stack main, 6, @H.0

defaultRoute:
        forw
        paj -1
main:
        pull 1
        nth 0
        calls "print"
        pop
        pull 1
        nth 0
        pull 0
        modi 2
        eqi 0
        beq L.3
        pull 0
        gti 10
        ji L.4
L.3:
        push false
L.4:
        beq L.2
        push 1
        ji L.5
L.2:
        pull 0
        lti 0
        bne L.7
        pull 0
        neqi 7
        lnot
        ji L.8
L.7:
        push true
L.8:
        beq L.6
        push 2
        ji L.9
L.6:
        push 3
L.9:
L.5:
        slide 1
        push 12
        pull 0
        modi 2
        eqi 0
        beq L.11
        pull 0
        gti 10
        ji L.12
L.11:
        push false
L.12:
        beq L.10
        push 1
        ji L.13
L.10:
        pull 0
        lti 0
        bne L.15
        pull 0
        neqi 7
        lnot
        ji L.16
L.15:
        push true
L.16:
        beq L.14
        push 2
        ji L.17
L.14:
        push 3
L.17:
L.13:
        slide 1
        push -3
        pull 0
        modi 2
        eqi 0
        beq L.19
        pull 0
        gti 10
        ji L.20
L.19:
        push false
L.20:
        beq L.18
        push 1
        ji L.21
L.18:
        pull 0
        lti 0
        bne L.23
        pull 0
        neqi 7
        lnot
        ji L.24
L.23:
        push true
L.24:
        beq L.22
        push 2
        ji L.25
L.22:
        push 3
L.25:
L.21:
        slide 1
        push 7
        pull 0
        modi 2
        eqi 0
        beq L.27
        pull 0
        gti 10
        ji L.28
L.27:
        push false
L.28:
        beq L.26
        push 1
        ji L.29
L.26:
        pull 0
        lti 0
        bne L.31
        pull 0
        neqi 7
        lnot
        ji L.32
L.31:
        push true
L.32:
        beq L.30
        push 2
        ji L.33
L.30:
        push 3
L.33:
L.29:
        slide 1
        pull 5
        nth 1
        mktup 5
        pull 1
        demux
        nop
        nop
.heap
H.0: tuple [5, true]
