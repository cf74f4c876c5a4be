module memtune/tests/go

go 1.19
