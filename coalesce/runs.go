package coalesce

import (
	"fmt"

	"github.com/vdiskfs/vdiskfs/blockmap"
)

// Run is one backend I/O: Blocks blocks at physical block Phys, from/to the
// caller's buffer at byte BufOff.
type Run struct {
	Phys   uint64
	Blocks uint64
	BufOff uint64 // byte offset in the buffer; = (virtual block - base) * bs
	Virt   uint64 // first virtual block of the run
}

// Runs appends to dst one Run per physically contiguous stretch of data
// segments, skipping holes. segs are consecutive lookup segments starting at
// virtual block base (segs[0].Virt == base); Runs panics if they are not,
// because the buffer offsets would then be wrong.
//
// Consecutive data segments whose physical ranges are contiguous are merged
// into one run; a run is split only when it would exceed maxBlocks
// (maxBlocks == 0 means no limit). Runs already in dst are never extended.
// Runs does not allocate when dst has capacity.
func Runs(dst []Run, segs []blockmap.Segment, base, bs, maxBlocks uint64) []Run {
	first := len(dst) // runs before this index belong to the caller
	next := base      // the virtual block the next segment must start at
	for i := range segs {
		seg := &segs[i]
		if seg.Virt != next {
			panic(fmt.Sprintf("coalesce: segment %d starts at block %d, want %d (segments must be consecutive from base)",
				i, seg.Virt, next))
		}
		next += seg.Len
		if seg.Hole {
			// A hole also ends the current run: the run after it starts at a
			// different place in the buffer even if its physical blocks happen
			// to follow on.
			continue
		}

		virt, phys, left := seg.Virt, seg.Phys, seg.Len
		for left > 0 {
			// Grow the last run if this piece follows it in both spaces and it
			// has room. Otherwise start a new run, as long as the limit allows.
			take := left
			if n := len(dst); n > first && follows(&dst[n-1], virt, phys) && !full(&dst[n-1], maxBlocks) {
				last := &dst[n-1]
				if maxBlocks != 0 {
					take = min(take, maxBlocks-last.Blocks)
				}
				last.Blocks += take
			} else {
				if maxBlocks != 0 {
					take = min(take, maxBlocks)
				}
				dst = append(dst, Run{Phys: phys, Blocks: take, BufOff: (virt - base) * bs, Virt: virt})
			}
			virt += take
			phys += take
			left -= take
		}
	}
	return dst
}

// follows reports whether blocks starting at virt/phys continue r in both the
// virtual space (so the buffer is contiguous) and the physical space (so the
// backend I/O is contiguous).
func follows(r *Run, virt, phys uint64) bool {
	return r.Virt+r.Blocks == virt && r.Phys+r.Blocks == phys
}

func full(r *Run, maxBlocks uint64) bool {
	return maxBlocks != 0 && r.Blocks >= maxBlocks
}
