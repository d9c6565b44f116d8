; compiled by anode-plan
.src 10.0.0.1
.dst 10.0.0.1
.rb 16
.port 0
.entry defaultRoute
.stack mcast, @H.2, 7000

defaultRoute:
        forw
        paj -1
deliverHere:
        demux
mcast:
        pull 1
        pull 1
        pull 0
        istag 2
        bne L.2
        pull 1
        pull 1
        nth 0
        push "x"
        pull 2
        push deliverHere
        push defaultRoute
        push 3
        push 2
        pull 6
        send
        popi 4
        pull 1
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.2
        pull 1
        pull 1
        nth 0
        push "x"
        pull 2
        push deliverHere
        push defaultRoute
        push 3
        push 2
        pull 6
        send
        popi 4
        pull 1
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.2
        push "foldl[2] overflow at 7:42"
        calls "abort"
L.2:
.heap
H.0: tuple [10.0.0.4, ()]
H.1: tuple [10.0.0.3, @H.0]
H.2: tuple [10.0.0.2, @H.1]
