package image

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/image/placement"
)

// The store's side of placement (package placement decides where blocks
// go): its allocator and its disks' allocation units, the layouts its
// disks follow, and the backing prepared for first writes. A write's holes
// are filled by placement.Fill through a diskSpace.
//
// Invariants (under Store.mu, which guards s.mu.alloc, every disk's units
// and s.mu.reserved): a block is free in the allocator, reserved in one
// disk's unit, in flight (s.mu.inflight: given to a write, not mapped
// yet), in quarantine, or mapped; never two of these. s.mu.reserved is the
// number of reserved blocks: they count as free space (Info) and as used
// by their disk in Check, and give way when space is short
// (releaseUnitsLockedMu), when their disk is deleted or shrinks past
// them, or its map empties. A reservation is never journalled: after a
// crash or a remount its blocks are simply free.

// diskSpace is one disk's placement.Space: the store's free blocks, under
// its locks, as a write of that disk takes them.
type diskSpace struct{ d *disk }

func (sp diskSpace) FromUnit(dst []pext, virt, n, goal uint64, reserve, wait bool) ([]pext, bool, error) {
	return sp.d.s.allocFromUnit(dst, sp.d, virt, n, goal, reserve, wait)
}

func (sp diskSpace) Alloc(dst []pext, n, goal uint64, hasGoal, wait bool) ([]pext, error) {
	return sp.d.s.allocData(dst, n, goal, hasGoal, wait)
}

func (sp diskSpace) Prepare(exts []pext, wait bool) error { return sp.d.s.prepareBacking(exts, wait) }

func (sp diskSpace) Base(cow bool, blocks uint64) (uint64, bool) {
	if cow {
		return sp.d.s.cowBase(sp.d, blocks)
	}
	return sp.d.s.diskBase(sp.d, blocks)
}

func (sp diskSpace) Neighbours(first, count uint64) placement.Neighbours {
	d := sp.d
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.neighboursLockedMu(first, count)
}

// fillHoles gives the holes of sc.segs new blocks (placement.Fill), in
// sc.out and sc.allocs (in flight until published or returned with
// unallocate). With wait false it never waits for a commit to release
// quarantined blocks (allocData) nor prepares the backing. On error the
// blocks given so far stay in sc.allocs for the caller to return.
func (d *disk) fillHoles(sc *scratch, nb placement.Neighbours, wait bool) error {
	var err error
	sc.out, sc.allocs, err = placement.Fill(sc.out, sc.allocs, sc.segs, nb, diskSpace{d}, d.s.bs, wait)
	return err
}

// placementErr marks an error of package placement with the store's
// sentinel for it.
func placementErr(err error) error {
	switch {
	case errors.Is(err, placement.ErrNoSpace):
		return fmt.Errorf("%w: %w", ErrNoSpace, err)
	case errors.Is(err, placement.ErrCorrupt):
		return fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return err
}

// allocData allocates n data blocks for a write, keeping back the blocks a
// checkpoint will need. When the store is full but blocks are waiting in
// quarantine, it commits once to release them and tries again, if
// mayCommit.
func (s *Store) allocData(dst []pext, n, goal uint64, hasGoal, mayCommit bool) ([]pext, error) {
	for attempt := 0; ; attempt++ {
		s.mu.Lock()
		if err := s.usableLockedMu(); err != nil {
			s.mu.Unlock()
			return dst, err
		}
		reserve := s.ckptReserveLockedMu()
		if s.mu.alloc.FreeBlocks() < n+reserve && s.mu.reserved > 0 {
			s.releaseUnitsLockedMu(nil, 0) // placement gives way to space
		}
		var err error
		if s.mu.alloc.FreeBlocks() < n+reserve {
			err = fmt.Errorf("need %d blocks, %d free (%d kept for metadata): %w", n, s.mu.alloc.FreeBlocks(), reserve, ErrNoSpace)
		} else {
			start := len(dst)
			dst, err = s.mu.alloc.Alloc(dst, n, goal, hasGoal)
			err = placementErr(err)
			for _, e := range dst[start:] {
				s.mu.inflight[e.Start] = e.Len
			}
			if err == nil {
				s.stats.Allocations.Add(1)
				s.stats.AllocatedBlocks.Add(n)
			}
		}
		// Blocks in quarantine, or taken by a commit under way, come free
		// when a commit completes: wait for one and try again.
		canRetry := len(s.mu.pend.quarantine) > 0 || s.mu.releasing > 0
		s.mu.Unlock()
		if err == nil || !errors.Is(err, ErrNoSpace) || !canRetry || !mayCommit || attempt > 0 {
			return dst, err
		}
		if cerr := s.Commit(); cerr != nil {
			return dst, fmt.Errorf("%w (commit to release freed blocks: %v)", err, cerr)
		}
	}
}

// diskBase chooses the layout base of a disk of blocks blocks that has
// nothing mapped (placement.Allocator.Base): it avoids the layouts of the other
// disks (claimedLayouts). The layouts are read disk by disk and may be
// stale by the time the allocator is asked: a base is only a goal.
func (s *Store) diskBase(self *disk, blocks uint64) (uint64, bool) {
	return s.chooseBase(&self.layout, blocks, s.claimedLayouts(self))
}

// cowBase chooses the base of the layout a disk's copied-on-write blocks
// follow where no block of its own is near (placement.Fill): like diskBase,
// but avoiding the disk's own first layout too, where the blocks it shares
// lie.
func (s *Store) cowBase(self *disk, blocks uint64) (uint64, bool) {
	return s.chooseBase(&self.cowLayout, blocks, s.claimedLayouts(nil))
}

// chooseBase returns the base slot holds (plus one), or chooses one
// outside claimed and stores it there, unless a concurrent writer chose
// first.
func (s *Store) chooseBase(slot *atomic.Uint64, blocks uint64, claimed func() []pext) (uint64, bool) {
	if l := slot.Load(); l != 0 {
		return l - 1, true
	}
	c := claimed()
	s.mu.Lock()
	base, ok := s.mu.alloc.Base(blocks, c)
	s.mu.Unlock()
	if !ok {
		return 0, false
	}
	if !slot.CompareAndSwap(0, base+1) { // a concurrent first write chose first
		base = slot.Load() - 1
	}
	return base, true
}

// claimedLayouts returns (when called) the layouts of every disk but
// except, sorted by start: each [its first extent's physical block - its
// virtual block, + its size in blocks, or up to its last mapped block if
// that is more), and its copy-on-write layout, if it has one, as long.
func (s *Store) claimedLayouts(except *disk) func() []pext {
	return func() []pext {
		s.mu.Lock()
		ds := make([]*disk, 0, len(s.mu.disks))
		for _, d := range s.mu.disks {
			if d != except { // its own first writes may be published meanwhile
				ds = append(ds, d)
			}
		}
		s.mu.Unlock()
		var claimed []pext
		for _, d := range ds {
			d.mu.RLock()
			first, ok := d.m.First()
			last, _ := d.m.Last()
			size := max((uint64(d.attr.Size)+s.bs-1)/s.bs, last.End())
			if ok && first.Phys >= first.Virt {
				claimed = append(claimed, pext{Start: first.Phys - first.Virt, Len: size})
			}
			if l := d.cowLayout.Load(); l != 0 {
				claimed = append(claimed, pext{Start: l - 1, Len: size})
			}
			d.mu.RUnlock()
		}
		slices.SortFunc(claimed, func(a, b pext) int { return cmp.Compare(a.Start, b.Start) })
		return claimed
	}
}

// unallocate returns blocks that were allocated but never mapped: no record
// names them, so they go straight back to the free set.
func (s *Store) unallocate(allocs []pext) {
	if len(allocs) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range allocs {
		delete(s.mu.inflight, e.Start)
		if err := s.mu.alloc.Free(e); err != nil {
			s.log.WithError(err).Error("returning unused blocks")
		}
	}
}

// ckptReserveLockedMu is the number of blocks kept free so that a full store
// can always checkpoint, and checkpoint again: the blocks a checkpoint of
// the current state needs, plus, when that is more than the current
// checkpoint holds, the difference. The current checkpoint's blocks come
// free only after the next one is written, so without that margin a store
// whose metadata grew since its last checkpoint could write one more
// checkpoint into the reserve and then have too little left for the next.
// Caller holds s.mu.
func (s *Store) ckptReserveLockedMu() uint64 {
	bytes := ckptSize(sharedVersion, len(s.mu.disks), len(s.mu.disks)*MaxNameLen, s.mu.extents,
		s.mu.alloc.FreeExtents()+maxCkptExtents, 2*s.mu.shared.Len()+1)
	need := uint64(bytes)/s.bs + 2
	var cur uint64
	for _, e := range s.mu.ckptExts {
		cur += e.Len
	}
	if need > cur {
		need += need - cur
	}
	return need
}

// neighboursLockedMu returns the neighbours (placement.Neighbours) of
// blocks [first, first+count). Caller holds d.mu (either mode).
func (d *disk) neighboursLockedMu(first, count uint64) placement.Neighbours {
	var nb placement.Neighbours
	nb.Prev, nb.HasPrev = d.m.Before(first)
	if v, ok := d.m.NextData(first + count); ok {
		nb.Next, nb.HasNext = d.m.Before(v + 1)
	}
	nb.Blocks = (uint64(d.attr.Size) + d.s.bs - 1) / d.s.bs
	return nb
}

// allocFromUnit gives a small hole of disk d, virtual blocks [virt,
// virt+n) inside one allocation unit, blocks from the unit's reservation,
// reserving the unit where goal (where placement.Fill aims the hole) puts it
// first if it has none. It appends the extent given to dst, in flight
// like allocData's, and reports false, with dst unchanged, where the hole
// must go to allocData: it is not inside one unit, or the unit's blocks
// for it were given before (the hole was punched) or are not free, or
// reserve is false and the unit has no reservation. With wait false it
// does not prepare the backing (prepareBacking) and fails with
// errUnprepared instead.
func (s *Store) allocFromUnit(dst []pext, d *disk, virt, n, goal uint64, reserve, wait bool) ([]pext, bool, error) {
	ub := s.unitBlocks
	if ub == 0 || n >= ub || virt/ub != (virt+n-1)/ub {
		return dst, false, nil
	}
	u, i := virt/ub, virt%ub
	s.mu.Lock()
	if d.units[u] == nil {
		s.mu.Unlock()
		if !reserve || goal < i {
			return dst, false, nil
		}
		// The whole unit's chunks are prepared before any of it is given.
		if err := s.prepareBacking([]pext{{Start: goal - i, Len: ub}}, wait); err != nil {
			return dst, false, err
		}
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	if err := s.usableLockedMu(); err != nil {
		return dst, false, err
	}
	r := d.units[u]
	if r == nil && reserve { // none yet, or given up meanwhile
		r = s.reserveUnitLockedMu(d, u, goal-i, i, n)
	}
	if r == nil || !r.Reserved(i, n) {
		return dst, false, nil
	}
	e := r.Give(i, n)
	s.mu.reserved -= n
	if r.Left() == 0 {
		delete(d.units, u)
	}
	s.mu.inflight[e.Start] = e.Len
	s.stats.Allocations.Add(1)
	s.stats.AllocatedBlocks.Add(n)
	return append(dst, e), true, nil
}

// reserveUnitLockedMu reserves unit u of d at physical block phys
// (Allocator.ReserveUnit), leaving the checkpoint's reserve free, if d is
// still live; else, or where the allocator says no, it returns nil.
// Caller holds s.mu.
func (s *Store) reserveUnitLockedMu(d *disk, u, phys, i, n uint64) *placement.Unit {
	if s.mu.disks[d.id] != d {
		return nil
	}
	r := s.mu.alloc.ReserveUnit(phys, s.unitBlocks, i, n, s.ckptReserveLockedMu())
	if r == nil {
		return nil
	}
	if d.units == nil {
		d.units = make(map[uint64]*placement.Unit)
	}
	d.units[u] = r
	s.mu.reserved += r.Left()
	return r
}

// releaseUnitsLockedMu returns the reserved blocks of d's units from
// unit index from on to the free set, or of every disk's units if d is
// nil. Caller holds s.mu.
func (s *Store) releaseUnitsLockedMu(d *disk, from uint64) {
	if d == nil {
		for _, d := range s.mu.disks {
			s.releaseUnitsLockedMu(d, 0)
		}
		return
	}
	for u, r := range d.units {
		if u < from {
			continue
		}
		s.mu.reserved -= r.Left()
		if err := r.Release(s.mu.alloc, s.unitBlocks); err != nil {
			s.log.WithError(err).Error("releasing an allocation unit")
		}
		delete(d.units, u)
	}
}

// reservedExtentsLockedMu returns every reserved stretch of blocks, for
// Check. Caller holds s.mu.
func (s *Store) reservedExtentsLockedMu() []pext {
	var out []pext
	for _, d := range s.mu.disks {
		for _, r := range d.units {
			out = r.Extents(out, s.unitBlocks)
		}
	}
	return out
}

// errUnprepared declines a plan that cannot wait (PlanWrite) whose new
// blocks lie in a part of the backing not yet prepared: WriteAt prepares
// it and writes.
var errUnprepared = errors.New("backing not prepared for the new blocks")

// prepareBacking prepares every chunk of a backend.Preparer backing (a
// store file) that holds blocks of allocs and is not yet prepared
// (prepareChunk), so that their first writes are overwrites for the host
// file system. With wait false it only checks, and returns errUnprepared
// if a chunk needs preparing.
func (s *Store) prepareBacking(allocs []pext, wait bool) error {
	p, ok := s.be.(backend.Preparer)
	if !ok {
		return nil
	}
	chunk := p.PrepareChunk()
	for _, e := range allocs {
		first := (s.dataOff + int64(e.Start*s.bs)) / chunk
		last := (min(s.dataOff+int64(e.End()*s.bs), s.dataEnd) - 1) / chunk
		for c := first; c <= last; c++ {
			if p.Prepared(c) {
				continue
			}
			if !wait {
				return errUnprepared
			}
			s.prepareChunk(p, c)
		}
	}
	return nil
}

// prepareChunk writes zeros over every free block of chunk c of the
// backing, in large writes, and marks the chunk prepared. The free blocks
// are taken from the allocator meanwhile, in flight like a write's
// (no one is given them, Check counts them), and returned after: so no
// block anyone uses, or is given meanwhile, is written, and blocks in
// quarantine (still referenced by the durable maps) are not free. Free
// blocks hold nothing anyone reads (a disk reads its holes as zeros
// without I/O), so writing them changes nothing a reader sees, before or
// after a crash. A chunk holding most of what is free is not prepared
// (taking its blocks away for the while could make a write fail for
// space), and a failed zero write is not retried: either way the chunk is
// marked and its first writes pay the host file system's allocation, as
// before preparation existed.
//
// The zeros are no IOPlan: a plan is a disk's request (its range lock,
// its map, its publish), and these blocks belong to no disk and are
// mapped by nothing; they are counted apart (PreparedBytes), not as data
// writes.
func (s *Store) prepareChunk(p backend.Preparer, c int64) {
	s.prepMu.Lock()
	defer s.prepMu.Unlock()
	if p.Prepared(c) {
		return
	}
	chunk, bs := p.PrepareChunk(), int64(s.bs)
	lo := uint64(max(c*chunk-s.dataOff+bs-1, 0) / bs)
	hi := uint64(max((c+1)*chunk-s.dataOff, 0) / bs)
	defer p.MarkPrepared(c) // prepared, or not worth trying again
	s.mu.Lock()
	hi = min(hi, s.mu.alloc.Total())
	taken := s.mu.alloc.TakeRange(lo, hi)
	var n uint64
	for _, e := range taken {
		n += e.Len
	}
	giveBack := func() { // caller holds s.mu
		for _, e := range taken {
			delete(s.mu.inflight, e.Start)
			if err := s.mu.alloc.Free(e); err != nil {
				s.log.WithError(err).Error("returning blocks after preparing the backing")
			}
		}
	}
	if s.mu.alloc.FreeBlocks() < s.ckptReserveLockedMu()+n {
		// Most of what is free is in this chunk: holding it for the
		// while could fail other writes for space. Write without.
		giveBack()
		s.mu.Unlock()
		return
	}
	for _, e := range taken {
		s.mu.inflight[e.Start] = e.Len
	}
	s.mu.Unlock()

	zeros := s.pool.Get(maxRunBytes)
	clear(zeros)
	var err error
	var written uint64
	for _, e := range taken {
		off, end := s.dataOff+int64(e.Start)*bs, s.dataOff+int64(e.End())*bs
		for ; off < end && err == nil; off += int64(len(zeros)) {
			n := min(int64(len(zeros)), end-off)
			_, err = s.be.WriteAt(zeros[:n], off)
			written += uint64(n)
		}
	}
	s.pool.Put(zeros)

	s.mu.Lock()
	giveBack()
	s.mu.Unlock()
	s.stats.PreparedBytes.Add(written)
	if err != nil {
		s.stats.Errors.Add(1)
		s.log.WithError(err).Warn("writing the store file ahead of first writes failed; writing without")
	}
}
