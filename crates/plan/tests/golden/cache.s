; compiled by anode-plan
.src 10.0.0.1
.dst 10.0.0.1
.rb 32
.port 0
.entry defaultRoute
.stack get, 7002, 12, 10.0.0.4

defaultRoute:
        forw
        paj -1
back:
        pull 3
        pull 3
        push 60
        calls "state.put"
        pop
        pull 4
        ishere
        beq L.12
        pull 2
        pull 2
        pull 2
        pull 2
        pull 2
        mktup 2
        pull 1
        demux
L.12:
        pull 4
        pull 4
        pull 4
        pull 4
        pull 4
        push back
        push defaultRoute
        push 6
        getrb
        pull 13
        nexthop
        send
        exit
request:
        pull 2
        ishere
        bne L.9
        pull 1
        calls "state.get"
        istag 2
        lnot
        ji L.10
L.9:
        push false
L.10:
        beq L.8
        pull 2
        pull 2
        pull 3
        calls "state.get"
        here
        pull 4
        push back
        push defaultRoute
        push 6
        getrb
        pull 11
        nexthop
        send
        exit
L.8:
        pull 3
        ishere
        beq L.11
        pull 2
        pull 2
        pull 3
        pull 4
        mul
        here
        pull 4
        push back
        push defaultRoute
        push 6
        getrb
        pull 11
        nexthop
        send
        exit
L.11:
        pull 3
        pull 3
        pull 3
        pull 3
        push request
        push defaultRoute
        push 5
        getrb
        pull 11
        nexthop
        send
        exit
get:
        pull 2
        getsrc
        pull 3
        pull 3
        pull 2
        ishere
        bne L.3
        pull 1
        calls "state.get"
        istag 2
        lnot
        ji L.4
L.3:
        push false
L.4:
        beq L.2
        pull 2
        pull 2
        pull 3
        calls "state.get"
        here
        pull 4
        push back
        push defaultRoute
        push 6
        getrb
        pull 11
        nexthop
        send
        exit
L.2:
        pull 3
        ishere
        beq L.6
        pull 2
        pull 2
        pull 3
        pull 4
        mul
        here
        pull 4
        push back
        push defaultRoute
        push 6
        getrb
        pull 11
        nexthop
        send
        exit
L.6:
        pull 3
        pull 3
        pull 3
        pull 3
        push request
        push defaultRoute
        push 5
        getrb
        pull 11
        nexthop
        send
