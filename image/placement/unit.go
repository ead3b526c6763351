package placement

// UnitBytes is the virtual span of an allocation unit, and its physical
// reservation. Stores whose blocks are larger than 1/16 of it have no
// units: a write of one such block is already large.
const UnitBytes = 1 << 20

// UnitBlocks is the blocks per allocation unit for block size bs, 0 for
// none.
func UnitBlocks(bs uint64) uint64 {
	if n := UnitBytes / bs; n >= 16 {
		return n
	}
	return 0
}

// A Unit is one disk's reservation of an allocation unit: virtual block
// i of the unit is always physical block Phys()+i. Its blocks are taken
// from the allocator when it is reserved (ReserveUnit) and handed out one
// hole at a time (Give); Release returns what is left. Like the
// allocator, it is guarded by its owner's lock.
type Unit struct {
	phys  uint64    // physical block of the unit's first virtual block
	given [4]uint64 // bit i: block phys+i is not (or no longer) reserved
	left  uint64    // blocks still reserved
}

// ReserveUnit reserves a unit of ub blocks at physical block phys: every
// free block of [phys, phys+ub), if blocks [phys+i, phys+i+n) (the hole
// asking) are among them and taking them all leaves at least keep blocks
// free; else it returns nil and takes nothing. Blocks of the stretch in
// use (the unit's blocks written before a remount, another disk's) count
// as given.
func (a *Allocator) ReserveUnit(phys, ub, i, n, keep uint64) *Unit {
	if phys+ub > a.total || phys+ub < phys {
		return nil
	}
	if f, ok := a.Containing(phys + i); !ok || f.End() < phys+i+n {
		return nil
	}
	if a.freeBlocks < a.FreeIn(phys, phys+ub)+keep {
		return nil
	}
	r := &Unit{phys: phys, given: [4]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}}
	for _, e := range a.TakeRange(phys, phys+ub) {
		for b := e.Start - phys; b < e.End()-phys; b++ {
			r.given[b/64] &^= 1 << (b % 64)
		}
		r.left += e.Len
	}
	return r
}

// Left is the number of blocks still reserved.
func (r *Unit) Left() uint64 { return r.left }

// Reserved reports whether blocks [i, i+n) of the unit are still reserved.
func (r *Unit) Reserved(i, n uint64) bool {
	for b := i; b < i+n; b++ {
		if r.given[b/64]&(1<<(b%64)) != 0 {
			return false
		}
	}
	return true
}

// Give hands out blocks [i, i+n) of the unit, which must be reserved,
// and returns them as an extent.
func (r *Unit) Give(i, n uint64) Extent {
	for b := i; b < i+n; b++ {
		r.given[b/64] |= 1 << (b % 64)
	}
	r.left -= n
	return Extent{Start: r.phys + i, Len: n}
}

// Extents appends every stretch of blocks still reserved in a unit of ub
// blocks to dst.
func (r *Unit) Extents(dst []Extent, ub uint64) []Extent {
	for i := uint64(0); i < ub; {
		if !r.Reserved(i, 1) {
			i++
			continue
		}
		j := i + 1
		for j < ub && r.Reserved(j, 1) {
			j++
		}
		dst = append(dst, Extent{Start: r.phys + i, Len: j - i})
		i = j
	}
	return dst
}

// Release returns every block still reserved in a unit of ub blocks to
// a, and returns the first error of Free (the unit is then empty all the
// same).
func (r *Unit) Release(a *Allocator, ub uint64) error {
	var first error
	for _, e := range r.Extents(nil, ub) {
		if err := a.Free(e); err != nil && first == nil {
			first = err
		}
	}
	*r = Unit{phys: r.phys, given: [4]uint64{^uint64(0), ^uint64(0), ^uint64(0), ^uint64(0)}}
	return first
}
