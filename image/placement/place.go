package placement

import "github.com/vdiskfs/vdiskfs/blockmap"

// PrepareBelow: only holes smaller than this are worth preparing the
// backing for (Space.Prepare). A large first write pays the host file
// system's allocation once for many blocks, and preparing its chunk would
// write every block twice (zeros, then the data).
const PrepareBelow = 256 << 10

// Neighbours are what placement aims by: a disk's mapped extents on either
// side of a request's block range, and the disk's size in blocks.
type Neighbours struct {
	Prev, Next       blockmap.Extent
	HasPrev, HasNext bool
	Blocks           uint64
	// CoW: a neighbour was dropped because the disk shares its blocks
	// (DropShared), so the disk's first layout is where blocks it shares
	// lie: a hole with no neighbour aims at its copy-on-write layout
	// instead (Space.Base).
	CoW bool
	// Lazy: not looked up yet (Space.Neighbours resolves them), for blocks
	// [First, First+Count): a write whose holes its allocation units cover
	// needs none.
	Lazy         bool
	First, Count uint64
}

// Sharing says whether any of n physical blocks from start is shared
// (refcount.Table).
type Sharing interface {
	Shared(start, n uint64) bool
}

// DropShared drops the neighbours that cannot say where the new blocks of
// blocks [first, first+count) belong because the disk does not own their
// blocks alone: an extent before the range whose last block is shared or
// that reaches into the range (its blocks there are being copied on
// write), an extent after it whose first block is shared. Aimed by those,
// a copy-on-write would aim at the shared block itself, which is taken,
// and land wherever the allocator finds room next, one extent per write.
func (nb *Neighbours) DropShared(first, count uint64, sh Sharing) {
	if nb.HasPrev && (nb.Prev.End() > first || sh.Shared(nb.Prev.PhysEnd()-1, 1)) {
		nb.HasPrev, nb.CoW = false, true
	}
	if nb.HasNext && (nb.Next.Virt < first+count || sh.Shared(nb.Next.Phys, 1)) {
		nb.HasNext, nb.CoW = false, true
	}
}

// A Space is where one disk's new blocks come from: the store's
// allocator, its allocation units and its backing, under the store's
// locks. Every extent it gives is in flight (no map holds it) until the
// caller maps it or returns it. With wait false no call blocks: one that
// would (a commit to release quarantined blocks, preparing the backing)
// fails instead.
type Space interface {
	// FromUnit gives virtual blocks [virt, virt+n) blocks from their
	// allocation unit, reserving the unit where goal puts virt first if
	// reserve and it has none, and appends the extent to dst; false, with
	// dst unchanged: the hole must go to Alloc.
	FromUnit(dst []Extent, virt, n, goal uint64, reserve, wait bool) ([]Extent, bool, error)
	// Alloc takes n blocks, at goal if hasGoal and free, and appends them
	// to dst. It takes all n or none.
	Alloc(dst []Extent, n, goal uint64, hasGoal, wait bool) ([]Extent, error)
	// Prepare readies the backing for first writes to exts.
	Prepare(exts []Extent, wait bool) error
	// Base is the layout base of a disk of blocks blocks with nothing
	// near (cow: of its copy-on-write layout); false: nothing is free.
	Base(cow bool, blocks uint64) (uint64, bool)
	// Neighbours looks up the neighbours of blocks [first, first+count).
	Neighbours(first, count uint64) Neighbours
}

// Fill gives the holes of segs (a lookup of one disk's map, in order) new
// blocks from sp: it appends to out every segment of segs, each hole now
// mapped to its new blocks, and to allocs the extents given, and returns
// both. On error out is partial and allocs holds what was given so far,
// which the caller returns.
//
// Placement follows the virtual offset, not the order of the writes: a
// hole is aimed where its nearest mapped neighbour says it belongs, the
// neighbour's physical block plus the virtual distance (as ext4 aims a new
// block by its logical neighbour): the extent before it, or else the one
// after it, or, for a disk with nothing mapped yet, a base chosen for the
// whole disk (Allocator.Base). So every block of a disk filled in any
// order is aimed at one linear layout, base + virtual block, and a disk
// written at random reads back in large I/Os wherever that layout was
// free; where another disk holds the goal, the allocator takes the next
// free blocks after it. Neighbours whose blocks are shared do not count
// (DropShared), and a copy-on-write with none left aims at a second
// layout of the disk's (Space.Base with cow), so a disk rewritten at
// random over a snapshot or a clone is laid out by virtual offset too.
//
// A small hole (under PrepareBelow) takes its blocks from its allocation
// unit where it can, and the backing is prepared for it; a large one is
// allocated as it is.
func Fill(out []blockmap.Segment, allocs []Extent, segs []blockmap.Segment, nb Neighbours, sp Space, bs uint64, wait bool) ([]blockmap.Segment, []Extent, error) {
	var lastVirt, lastPhys uint64 // the last mapped or given block before the hole
	hasLast := false
	if nb.HasPrev {
		lastVirt, lastPhys, hasLast = nb.Prev.End(), nb.Prev.PhysEnd(), true
	}
	for i, sg := range segs {
		if !sg.Hole {
			out = append(out, sg)
			lastVirt, lastPhys, hasLast = sg.Virt+sg.Len, sg.Phys+sg.Len, true
			continue
		}
		// A small hole whose allocation unit is reserved already takes its
		// blocks there and needs no goal, so no neighbours; else the goal
		// is computed, and the unit reserved at it if it can be.
		small := sg.Len*bs < PrepareBelow
		var given bool
		var err error
		if small {
			allocs, given, err = sp.FromUnit(allocs, sg.Virt, sg.Len, 0, false, false)
		}
		var goal uint64
		hasGoal := false
		if !given && err == nil {
			if nb.Lazy {
				nb = sp.Neighbours(nb.First, nb.Count)
				if nb.HasPrev && !hasLast {
					lastVirt, lastPhys, hasLast = nb.Prev.End(), nb.Prev.PhysEnd(), true
				}
			}
			goal, hasGoal = holeGoal(nb, sp, segs, i, lastVirt, lastPhys, hasLast)
			if hasGoal && small {
				allocs, given, err = sp.FromUnit(allocs, sg.Virt, sg.Len, goal, true, wait)
			}
		}
		if err != nil {
			return out, allocs, err
		}
		if given {
			e := allocs[len(allocs)-1]
			out = append(out, blockmap.Segment{Virt: sg.Virt, Len: e.Len, Phys: e.Start})
			lastVirt, lastPhys, hasLast = sg.Virt+sg.Len, e.Start+sg.Len, true
			continue
		}
		start := len(allocs)
		if hasGoal && small { // the blocks aimed at are given after their chunk is prepared
			err = sp.Prepare([]Extent{{Start: goal, Len: sg.Len}}, wait)
		}
		if err == nil {
			allocs, err = sp.Alloc(allocs, sg.Len, goal, hasGoal, wait)
		}
		if err != nil {
			return out, allocs, err
		}
		v := sg.Virt
		for _, e := range allocs[start:] {
			out = append(out, blockmap.Segment{Virt: v, Len: e.Len, Phys: e.Start})
			v += e.Len
		}
		lastVirt, lastPhys, hasLast = v, allocs[len(allocs)-1].End(), true
		// Blocks given away from the goal may lie in a chunk not prepared yet.
		if small {
			if err := sp.Prepare(allocs[start:], wait); err != nil {
				return out, allocs, err
			}
		}
	}
	return out, allocs, nil
}

// holeGoal is where Fill aims hole segs[i] (see there): by the last mapped
// or given block before it (lastVirt, lastPhys), else by the data after
// it, else by the disk's layout base.
func holeGoal(nb Neighbours, sp Space, segs []blockmap.Segment, i int, lastVirt, lastPhys uint64, hasLast bool) (uint64, bool) {
	sg := segs[i]
	next, hasNext := nb.Next, nb.HasNext
	if i+1 < len(segs) { // a hole is followed by data in a lookup
		next, hasNext = blockmap.Extent{Virt: segs[i+1].Virt, Phys: segs[i+1].Phys}, true
	}
	switch {
	case hasLast:
		return lastPhys + (sg.Virt - lastVirt), true
	case hasNext && next.Phys >= next.Virt-sg.Virt:
		return next.Phys - (next.Virt - sg.Virt), true
	case hasNext:
		return 0, false
	}
	base, ok := sp.Base(nb.CoW, nb.Blocks)
	return base + sg.Virt, ok
}
