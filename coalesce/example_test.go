package coalesce_test

import (
	"fmt"

	"github.com/vdiskfs/vdiskfs/blockmap"
	"github.com/vdiskfs/vdiskfs/coalesce"
)

// A 1 MiB write at byte 8 MiB of a disk with 4 KiB blocks. The map returns
// the range as three pieces (say, written at different times) that happen to
// sit one after the other on the backing: the write is one backend I/O.
func Example() {
	const bs = 4096
	off, n := uint64(8<<20), uint64(1<<20)

	first, count := coalesce.BlockRange(off, n, bs)
	segs := []blockmap.Segment{
		{Virt: first, Len: 100, Phys: 70000},
		{Virt: first + 100, Len: 56, Phys: 70100},
		{Virt: first + 156, Len: count - 156, Phys: 70156},
	}
	runs := coalesce.Runs(nil, segs, first, bs, 256)
	for _, r := range runs {
		fmt.Printf("%d blocks at physical block %d from buffer byte %d\n", r.Blocks, r.Phys, r.BufOff)
	}
	// Output: 256 blocks at physical block 70000 from buffer byte 0
}

// A write that is not block-aligned needs read-modify-write of its edges.
func ExampleSplit() {
	s := coalesce.Split(1000, 10000, 4096)
	for _, sp := range s.All() {
		fmt.Printf("blocks %d+%d bytes %d..%d partial=%v\n", sp.Block, sp.Blocks, sp.BufOff, sp.BufOff+sp.Len, sp.Partial)
	}
	// Output:
	// blocks 0+1 bytes 0..3096 partial=true
	// blocks 1+1 bytes 3096..7192 partial=false
	// blocks 2+1 bytes 7192..10000 partial=true
}
