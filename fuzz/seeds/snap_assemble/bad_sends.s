; A packet that tries to multicast more copies than the node has interfaces.
.src 10.0.0.1
.dst 10.0.0.3
.rb 40
.stack 0
        push 0          ; entry
        push 1          ; stack words
        push 1          ; rb
        getdst
        send
        push 0
        push 1
        push 1
        getdst
        send
        push 0
        push 1
        push 1
        getdst
        send
        exit
