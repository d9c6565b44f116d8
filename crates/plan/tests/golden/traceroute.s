; compiled by anode-plan
.src 10.0.0.1
.dst 10.0.0.1
.rb 32
.port 0
.entry defaultRoute
.stack start, 9, 10.0.0.4

defaultRoute:
        forw
        paj -1
report:
        pull 2
        pull 2
        mktup 2
        pull 1
        demux
probe:
        pull 1
        gti 0
        beq L.7
        here
        pull 2
        pull 2
        push report
        push defaultRoute
        push 4
        pull 7
        pull 9
        send
        slide 4
        ji L.8
L.7:
        push ()
L.8:
        pop
        pull 3
        ishere
        beq L.9
        exit
L.9:
        pull 3
        pull 3
        pull 3
        addi 1
        pull 3
        push probe
        push defaultRoute
        push 5
        getrb
        pull 11
        nexthop
        send
        exit
start:
        pull 1
        getsrc
        push 0
        pull 3
        pull 1
        gti 0
        beq L.2
        here
        pull 2
        pull 2
        push report
        push defaultRoute
        push 4
        pull 7
        pull 9
        send
        slide 4
        ji L.4
L.2:
        push ()
L.4:
        pop
        pull 3
        ishere
        beq L.5
        exit
L.5:
        pull 3
        pull 3
        pull 3
        addi 1
        pull 3
        push probe
        push defaultRoute
        push 5
        getrb
        pull 11
        nexthop
        send
