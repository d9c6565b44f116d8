; compiled by anode-plan
.src 10.0.0.1
.dst 10.0.0.3
.rb 16
.port 0
.entry defaultRoute
.stack p, 7, blob "ping"

defaultRoute:
        forw
        paj -1
r:
        demux
p:
        pull 1
        pull 1
        push r
        push defaultRoute
        push 3
        getrb
        getsrc
        send
