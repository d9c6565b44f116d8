; compiled by anode-plan
.src 10.0.0.1
.dst 10.0.0.2
.rb 8
.port 0
.entry defaultRoute
.stack main, 5, @H.2

defaultRoute:
        forw
        paj -1
main:
        push 4
        pull 2
        mktup 2
        push ()
        pull 1
        pull 0
        istag 2
        bne L.2
        pull 1
        pull 1
        nth 0
        swap
        mktup 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.2
        pull 1
        pull 1
        nth 0
        swap
        mktup 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.2
        pull 1
        pull 1
        nth 0
        swap
        mktup 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.2
        pull 1
        pull 1
        nth 0
        swap
        mktup 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.2
        pull 1
        pull 1
        nth 0
        swap
        mktup 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.2
        push "foldr[5] overflow at 8:15"
        calls "abort"
L.2:
        pop
        push 0
        swap
        pull 0
        istag 2
        bne L.3
        pull 1
        pull 1
        nth 0
        swap
        pull 0
        muli 10
        pull 2
        add
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.3
        pull 1
        pull 1
        nth 0
        swap
        pull 0
        muli 10
        pull 2
        add
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.3
        pull 1
        pull 1
        nth 0
        swap
        pull 0
        muli 10
        pull 2
        add
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.3
        pull 1
        pull 1
        nth 0
        swap
        pull 0
        muli 10
        pull 2
        add
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.3
        pull 1
        pull 1
        nth 0
        swap
        pull 0
        muli 10
        pull 2
        add
        slide 2
        store 1
        nth 1
L.3:
        pop
        push 0
        pull 2
        pull 0
        istag 2
        bne L.4
        pull 1
        pull 1
        nth 0
        pull 1
        muli 10
        pull 1
        add
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.4
        pull 1
        pull 1
        nth 0
        pull 1
        muli 10
        pull 1
        add
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.4
        pull 1
        pull 1
        nth 0
        pull 1
        muli 10
        pull 1
        add
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.4
        pull 1
        pull 1
        nth 0
        pull 1
        muli 10
        pull 1
        add
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.4
        pull 1
        pull 1
        nth 0
        pull 1
        muli 10
        pull 1
        add
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.4
        push "foldl[5] overflow at 8:42"
        calls "abort"
L.4:
        pop
        push 0.5
        pull 3
        pull 0
        istag 2
        bne L.5
        pull 1
        pull 1
        nth 0
        pull 1
        pull 1
        itof
        fadd
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.5
        pull 1
        pull 1
        nth 0
        pull 1
        pull 1
        itof
        fadd
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.5
        pull 1
        pull 1
        nth 0
        pull 1
        pull 1
        itof
        fadd
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.5
        pull 1
        pull 1
        nth 0
        pull 1
        pull 1
        itof
        fadd
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.5
        pull 1
        pull 1
        nth 0
        pull 1
        pull 1
        itof
        fadd
        slide 2
        store 1
        nth 1
        pull 0
        istag 2
        bne L.5
        push "foldl[5] overflow at 8:75"
        calls "abort"
L.5:
        pop
        push 2.0
        fmul
        ftoi
        mktup 3
        pull 2
        demux
.heap
H.0: tuple [3, ()]
H.1: tuple [2, @H.0]
H.2: tuple [1, @H.1]
