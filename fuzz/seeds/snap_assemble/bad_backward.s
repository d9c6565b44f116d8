; A hostile packet: paj takes its target from the stack, and this one points
; back at itself.  The VM ends it with BackwardBranch before it can loop.
.src 10.0.0.1
.dst 10.0.0.1
.rb 4
        push 1
        paj -1          ; jumps by 1 + (-1) = 0: backward
        exit
