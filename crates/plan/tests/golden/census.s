; compiled by anode-plan
.src 10.0.0.1
.dst 10.0.0.1
.rb 40
.port 0
.entry defaultRoute
.stack start, 7003, @H.3

defaultRoute:
        forw
        paj -1
report:
        pull 4
        pull 4
        pull 4
        pull 4
        mktup 4
        pull 1
        demux
tour:
        nnbr
        pull 0
        pull 5
        gt
        beq L.9
        pull 0
        ji L.10
L.9:
        pull 4
L.10:
        pull 1
        pull 6
        gt
        beq L.11
        here
        ji L.12
L.11:
        pull 4
L.12:
        pull 9
        istag 2
        beq L.13
        pull 8
        addi 1
        pull 8
        pull 4
        add
        pull 3
        pull 3
        pull 7
        push report
        push defaultRoute
        push 6
        getrb
        pull 13
        send
        exit
L.13:
        pull 9
        nth 1
        pull 9
        addi 1
        pull 9
        pull 5
        add
        pull 4
        pull 4
        pull 9
        pull 9
        push tour
        push defaultRoute
        push 8
        getrb
        pull 20
        nth 0
        send
        exit
start:
        pull 1
        push 0
        push 0
        push 0
        here
        getsrc
        pull 6
        nnbr
        pull 0
        pull 5
        gt
        beq L.2
        pull 0
        ji L.3
L.2:
        pull 4
L.3:
        pull 1
        pull 6
        gt
        beq L.4
        here
        ji L.5
L.4:
        pull 4
L.5:
        pull 9
        istag 2
        beq L.6
        pull 8
        addi 1
        pull 8
        pull 4
        add
        pull 3
        pull 3
        pull 7
        push report
        push defaultRoute
        push 6
        getrb
        pull 13
        send
        exit
L.6:
        pull 9
        nth 1
        pull 9
        addi 1
        pull 9
        pull 5
        add
        pull 4
        pull 4
        pull 9
        pull 9
        push tour
        push defaultRoute
        push 8
        getrb
        pull 20
        nth 0
        send
.heap
H.0: tuple [10.0.0.5, ()]
H.1: tuple [10.0.0.4, @H.0]
H.2: tuple [10.0.0.3, @H.1]
H.3: tuple [10.0.0.2, @H.2]
