package image

// Allocation units. A disk written at random in small pieces (a guest's
// file system, a database, an OS install) would ask the allocator for one
// block per write: a search and a split of the free-extent B-trees each
// time, which grow to one free extent per hole. Instead, the first small
// write into an aligned 1 MiB of a disk's virtual space (a unit) reserves
// the unit's whole physical stretch where its layout puts it (the same
// goal allocHoles computes), and the unit's later first writes take their
// blocks from that reservation: virtual block u*U+i is always physical
// block phys+i, so the unit ends up one extent whatever order its blocks
// were written in, and 255 of every 256 first writes of 4 KiB touch no
// B-tree of the allocator.
//
// Invariants (under Store.mu): a reserved block is in no free extent, no
// map, no write in flight and no quarantine; Store.mu.reserved is the
// number of reserved blocks. A reservation is memory only: it holds no
// data (the disk reads its unmapped blocks as zeros without I/O, so a
// reserved block is never anyone's bytes), it is never journalled or
// checkpointed (after a crash or a remount its blocks are simply free),
// it counts as free space (Info), Check counts it as in use by its disk,
// and it gives way: a write or a checkpoint that finds too little free
// releases every reservation first, and a disk's go when it is deleted,
// shrinks past them, or its map empties.

// unitBytes is the virtual span of an allocation unit, and its physical
// reservation. Stores whose blocks are larger than 1/16 of it have no
// units: a write of one such block is already large.
const unitBytes = 1 << 20

// unit is one disk's reservation of an allocation unit.
type unit struct {
	phys  uint64    // physical block of the unit's first virtual block
	given [4]uint64 // bit i: block phys+i is not (or no longer) reserved
	left  uint64    // blocks still reserved
}

// storeUnitBlocks is the blocks per allocation unit for block size bs, 0
// for none.
func storeUnitBlocks(bs uint64) uint64 {
	if n := unitBytes / bs; n >= 16 {
		return n
	}
	return 0
}

// free reports whether blocks [i, i+n) of the unit are still reserved.
func (r *unit) free(i, n uint64) bool {
	for b := i; b < i+n; b++ {
		if r.given[b/64]&(1<<(b%64)) != 0 {
			return false
		}
	}
	return true
}

// give marks blocks [i, i+n) as given; they must be free.
func (r *unit) give(i, n uint64) {
	for b := i; b < i+n; b++ {
		r.given[b/64] |= 1 << (b % 64)
	}
	r.left -= n
}

// runs calls fn with every stretch [i, i+n) of blocks still reserved.
func (r *unit) runs(blocks uint64, fn func(i, n uint64)) {
	for i := uint64(0); i < blocks; {
		if !r.free(i, 1) {
			i++
			continue
		}
		j := i + 1
		for j < blocks && r.free(j, 1) {
			j++
		}
		fn(i, j-i)
		i = j
	}
}

// allocFromUnit gives a small hole of disk d, virtual blocks [virt,
// virt+n) inside one allocation unit, blocks from the unit's reservation,
// reserving the unit where goal (where allocHoles aims the hole) puts it
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
	if r == nil || !r.free(i, n) {
		return dst, false, nil
	}
	r.give(i, n)
	s.mu.reserved -= n
	if r.left == 0 {
		delete(d.units, u)
	}
	e := pext{Start: r.phys + i, Len: n}
	s.mu.inflight[e.Start] = e.Len
	s.stats.Allocations.Add(1)
	s.stats.AllocatedBlocks.Add(n)
	return append(dst, e), true, nil
}

// reserveUnitLockedMu reserves unit u of d at physical block phys: every
// free block of [phys, phys+U), if blocks [phys+i, phys+i+n) (the hole
// asking) are among them and taking them all leaves the checkpoint's
// reserve free; else it returns nil. Blocks of the stretch in use (the
// unit's blocks written before a remount, another disk's) are marked
// given. Caller holds s.mu.
func (s *Store) reserveUnitLockedMu(d *disk, u, phys, i, n uint64) *unit {
	ub, a := s.unitBlocks, s.mu.alloc
	if s.mu.disks[d.id] != d || phys+ub > a.total || phys+ub < phys {
		return nil
	}
	if f, ok := a.containing(phys + i); !ok || f.end() < phys+i+n {
		return nil
	}
	var free uint64
	a.byStart.AscendRange(pext{Start: phys}, pext{Start: phys + ub}, func(f pext) bool {
		free += min(f.end(), phys+ub) - f.Start
		return true
	})
	if f, ok := a.containing(phys); ok && f.Start < phys {
		free += min(f.end(), phys+ub) - phys
	}
	if a.freeBlocks < free+s.ckptReserveLockedMu() {
		return nil
	}
	r := &unit{phys: phys, given: [4]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}}
	for _, e := range a.takeRange(phys, phys+ub) {
		for b := e.Start - phys; b < e.end()-phys; b++ {
			r.given[b/64] &^= 1 << (b % 64)
		}
		r.left += e.Len
	}
	if d.units == nil {
		d.units = make(map[uint64]*unit)
	}
	d.units[u] = r
	s.mu.reserved += r.left
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
		r.runs(s.unitBlocks, func(i, n uint64) {
			if err := s.mu.alloc.free(pext{Start: r.phys + i, Len: n}); err != nil {
				s.log.WithError(err).Error("releasing an allocation unit")
			}
		})
		s.mu.reserved -= r.left
		delete(d.units, u)
	}
}

// reservedExtentsLockedMu returns every reserved stretch of blocks, for
// Check. Caller holds s.mu.
func (s *Store) reservedExtentsLockedMu() []pext {
	var out []pext
	for _, d := range s.mu.disks {
		for _, r := range d.units {
			r.runs(s.unitBlocks, func(i, n uint64) {
				out = append(out, pext{Start: r.phys + i, Len: n})
			})
		}
	}
	return out
}
