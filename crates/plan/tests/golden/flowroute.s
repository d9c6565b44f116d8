; compiled by anode-plan
.src 10.0.0.1
.dst 10.0.0.1
.rb 32
.port 0
.entry defaultRoute
.stack setup, 7001, "pinned", @H.2, 10.0.0.3

defaultRoute:
        forw
        paj -1
route.flowRoute:
        pull 1
        ishere
        bne L.8
        pull 1
        pull 0
        calls "state.get"
        istag 2
        lnot
        beq L.9
        pull 0
        calls "state.get"
        ji L.10
L.9:
        pull 0
        nexthop
L.10:
        slide 1
        forwto
        exit
L.8:
        slide 1
        paj -20
data:
        demux
go:
        pull 1
        pull 1
        pull 4
        push data
        push route.flowRoute
        push 4
        getrb
        here
        send
        exit
install:
        pull 3
        istag 2
        beq L.5
        pull 4
        pull 2
        pull 2
        push go
        push defaultRoute
        push 4
        getrb
        pull 9
        send
        exit
L.5:
        pull 4
        pull 4
        nth 0
        push 60
        calls "state.put"
        pop
        pull 4
        pull 4
        nth 1
        pull 4
        pull 4
        pull 4
        push install
        push defaultRoute
        push 6
        getrb
        pull 12
        nth 0
        send
        exit
setup:
        pull 3
        pull 3
        getsrc
        pull 4
        pull 4
        pull 3
        istag 2
        beq L.2
        pull 4
        pull 2
        pull 2
        push go
        push defaultRoute
        push 4
        getrb
        pull 9
        send
        exit
L.2:
        pull 4
        pull 4
        nth 0
        push 60
        calls "state.put"
        pop
        pull 4
        pull 4
        nth 1
        pull 4
        pull 4
        pull 4
        push install
        push defaultRoute
        push 6
        getrb
        pull 12
        nth 0
        send
.heap
H.0: tuple [10.0.0.3, ()]
H.1: tuple [10.0.0.4, @H.0]
H.2: tuple [10.0.0.5, @H.1]
