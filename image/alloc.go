package image

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/google/btree"
)

// allocator tracks the free physical blocks of the data region as maximal
// free extents, indexed twice: by start (to find the free extent at a goal
// block, and to merge neighbours on free) and by length (to find the largest).
//
// Invariants: free extents are non-empty, inside [0, total), never overlap and
// never touch (touching extents are merged); both indexes hold the same set;
// freeBlocks is their total length.
//
// The allocator is not safe for concurrent use: the store's mu guards it.
type allocator struct {
	total      uint64
	freeBlocks uint64
	byStart    *btree.BTreeG[pext]
	bySize     *btree.BTreeG[pext]
}

func lessStart(a, b pext) bool { return a.Start < b.Start }

func lessSize(a, b pext) bool {
	if a.Len != b.Len {
		return a.Len < b.Len
	}
	return a.Start < b.Start
}

func newAllocator(total uint64) *allocator {
	return &allocator{
		total:   total,
		byStart: btree.NewG(32, lessStart),
		bySize:  btree.NewG(32, lessSize),
	}
}

func (a *allocator) insert(e pext) {
	a.byStart.ReplaceOrInsert(e)
	a.bySize.ReplaceOrInsert(e)
	a.freeBlocks += e.Len
}

func (a *allocator) delete(e pext) {
	a.byStart.Delete(e)
	a.bySize.Delete(e)
	a.freeBlocks -= e.Len
}

// containing returns the free extent that contains block b.
func (a *allocator) containing(b uint64) (pext, bool) {
	var found pext
	ok := false
	a.byStart.DescendLessOrEqual(pext{Start: b}, func(e pext) bool {
		if b < e.end() {
			found, ok = e, true
		}
		return false
	})
	return found, ok
}

// free returns e to the free set, merging with touching neighbours. It fails
// (and changes nothing) if any block of e is already free: a double free
// means the maps and the allocator disagree.
func (a *allocator) free(e pext) error {
	if e.Len == 0 {
		return nil
	}
	if e.Start >= a.total || e.Len > a.total-e.Start {
		return fmt.Errorf("free [%d,+%d): outside the data region of %d blocks: %w", e.Start, e.Len, a.total, ErrCorrupt)
	}
	var prev, next pext
	hasPrev, hasNext := false, false
	a.byStart.DescendLessOrEqual(pext{Start: e.Start}, func(p pext) bool {
		prev, hasPrev = p, true
		return false
	})
	a.byStart.AscendGreaterOrEqual(pext{Start: e.Start}, func(n pext) bool {
		if n.Start == e.Start && hasPrev && prev == n {
			return true // the same extent seen by the descent; look further
		}
		next, hasNext = n, true
		return false
	})
	if hasPrev && prev.end() > e.Start || hasNext && next.Start < e.end() {
		return fmt.Errorf("free [%d,+%d): blocks already free: %w", e.Start, e.Len, ErrCorrupt)
	}
	merged := e
	if hasPrev && prev.end() == e.Start {
		a.delete(prev)
		merged = pext{Start: prev.Start, Len: prev.Len + merged.Len}
	}
	if hasNext && next.Start == e.end() {
		a.delete(next)
		merged.Len += next.Len
	}
	a.insert(merged)
	return nil
}

// take marks e as used. Every block of e must be free, else nothing changes
// and an error says which block was not.
func (a *allocator) take(e pext) error {
	if e.Len == 0 {
		return nil
	}
	f, ok := a.containing(e.Start)
	if !ok || f.end() < e.end() {
		return fmt.Errorf("use [%d,+%d): blocks are not free: %w", e.Start, e.Len, ErrCorrupt)
	}
	a.delete(f)
	if f.Start < e.Start {
		a.insert(pext{Start: f.Start, Len: e.Start - f.Start})
	}
	if e.end() < f.end() {
		a.insert(pext{Start: e.end(), Len: f.end() - e.end()})
	}
	return nil
}

// takeRange takes every free block in [lo, hi) and returns the extents
// taken, in order.
func (a *allocator) takeRange(lo, hi uint64) []pext {
	var pieces []pext
	if f, ok := a.containing(lo); ok {
		pieces = append(pieces, pext{Start: lo, Len: min(f.end(), hi) - lo})
	}
	a.byStart.AscendRange(pext{Start: lo + 1}, pext{Start: hi}, func(f pext) bool {
		pieces = append(pieces, pext{Start: f.Start, Len: min(f.end(), hi) - f.Start})
		return true
	})
	for _, e := range pieces {
		if err := a.take(e); err != nil {
			panic(fmt.Sprintf("image: takeRange [%d,%d): %v", lo, hi, err))
		}
	}
	return pieces
}

// alloc takes n blocks, preferring, in order: blocks starting exactly at
// goal (so a sequential writer's extents stay physically contiguous and
// merge in the map); the first free extent after goal large enough for all n;
// the largest free extents. It appends the extents taken to dst. It takes all
// n blocks or none (ErrNoSpace).
func (a *allocator) alloc(dst []pext, n, goal uint64, hasGoal bool) ([]pext, error) {
	if n > a.freeBlocks {
		return dst, fmt.Errorf("need %d blocks, %d free: %w", n, a.freeBlocks, ErrNoSpace)
	}
	for n > 0 {
		e, ok := a.pick(n, goal, hasGoal)
		if !ok {
			return dst, fmt.Errorf("allocator inconsistent: %d blocks free but none found: %w", a.freeBlocks, ErrCorrupt)
		}
		if err := a.take(e); err != nil {
			return dst, err
		}
		dst = append(dst, e)
		n -= e.Len
		goal, hasGoal = e.end(), true
	}
	return dst, nil
}

// pick chooses the next extent (at most n blocks) for alloc.
func (a *allocator) pick(n, goal uint64, hasGoal bool) (pext, bool) {
	if hasGoal && goal < a.total {
		if f, ok := a.containing(goal); ok {
			return pext{Start: goal, Len: min(n, f.end()-goal)}, true
		}
		var after pext
		found := false
		a.byStart.AscendGreaterOrEqual(pext{Start: goal}, func(f pext) bool {
			if f.Len >= n {
				after, found = f, true
				return false
			}
			return true
		})
		if found {
			return pext{Start: after.Start, Len: n}, true
		}
	}
	// No goal, or nothing near it: the largest free extent. For a fresh
	// stream (no goal) that follows someone else's used blocks, start in the
	// middle of the extent, leaving room for whoever precedes it to grow.
	var largest pext
	ok := false
	a.bySize.Descend(func(f pext) bool {
		largest, ok = f, true
		return false
	})
	if !ok {
		return pext{}, false
	}
	start := largest.Start
	const spread = 1 << 16 // blocks; only split extents this big
	if !hasGoal && largest.Start > 0 && largest.Len >= 2*spread && largest.Len/2 >= n {
		start = largest.Start + largest.Len/2
	}
	return pext{Start: start, Len: min(n, largest.end()-start)}, true
}

// base is where a disk of blocks blocks with nothing mapped yet starts its
// layout (base + virtual block), given the layouts other disks already
// follow (claimed, sorted by start, overlaps allowed): the first stretch of
// free blocks outside every claimed layout that holds the whole disk, else
// the largest such stretch, else (every free block lies in someone's
// layout: the store is short of space, and layouts give way) the largest
// free extent. In a stretch that follows other blocks and is much larger
// than the disk (a disk that grows by writes has no size yet), the layout
// starts in its middle, leaving room for whoever precedes it to grow, as
// pick does for a stream without a goal. Nothing is reserved: a layout only
// steers where a disk's blocks are aimed. ok is false when nothing is free.
func (a *allocator) base(blocks uint64, claimed []pext) (uint64, bool) {
	var best pext
	found := false
	a.byStart.Ascend(func(f pext) bool {
		for _, piece := range subtract(f, claimed) {
			if piece.Len >= blocks {
				best, found = piece, true
				return false
			}
			if piece.Len > best.Len {
				best = piece
			}
		}
		return true
	})
	if found || best.Len > 0 {
		const spread = 1 << 16 // blocks, as in pick
		if best.Start > 0 && best.Len >= 2*spread && best.Len-best.Len/2 >= blocks {
			return best.Start + best.Len/2, true
		}
		return best.Start, true
	}
	var largest pext
	ok := false
	a.bySize.Descend(func(f pext) bool {
		largest, ok = f, true
		return false
	})
	return largest.Start, ok
}

// subtract returns the parts of f outside every extent of claimed (sorted
// by start), in order.
func subtract(f pext, claimed []pext) []pext {
	var out []pext
	at := f.Start
	for _, c := range claimed {
		if c.end() <= at || c.Start >= f.end() {
			continue
		}
		if c.Start > at {
			out = append(out, pext{Start: at, Len: c.Start - at})
		}
		at = max(at, c.end())
	}
	if at < f.end() {
		out = append(out, pext{Start: at, Len: f.end() - at})
	}
	return out
}

// region chooses where n blocks should go to lie in as few physical runs
// as the free space allows (Store.Defrag), without taking them: the
// smallest free stretch outside every claimed layout (sorted by start, as
// for base) that holds all n, its first n blocks; else the largest such
// stretches, largest first, until they hold n. When the stretches outside
// the claimed layouts hold fewer than n blocks in all, the store is short
// of space and layouts give way: the same choice is made among all free
// extents. The runs come sorted by start; together they hold n blocks, or
// every free block when fewer are free.
func (a *allocator) region(n uint64, claimed []pext) []pext {
	var outside []pext
	var outsideBlocks uint64
	a.byStart.Ascend(func(f pext) bool {
		for _, piece := range subtract(f, claimed) {
			outside = append(outside, piece)
			outsideBlocks += piece.Len
		}
		return true
	})
	candidates := outside
	if outsideBlocks < n {
		candidates = a.extents()
	}
	return fewestRuns(candidates, n)
}

// fewestRuns picks from the free runs candidates the fewest that hold n
// blocks: the smallest run that holds all n (its first n blocks), else the
// largest runs, largest first, until they hold n (the last one only as
// much of it as is needed) or the candidates run out. The picks come
// sorted by start.
func fewestRuns(candidates []pext, n uint64) []pext {
	if n == 0 {
		return nil
	}
	best, found := pext{}, false
	for _, c := range candidates {
		if c.Len >= n && (!found || c.Len < best.Len) {
			best, found = c, true
		}
	}
	if found {
		return []pext{{Start: best.Start, Len: n}}
	}
	bySize := slices.Clone(candidates)
	slices.SortStableFunc(bySize, func(a, b pext) int { return cmp.Compare(b.Len, a.Len) })
	var picked []pext
	for _, c := range bySize {
		if n == 0 {
			break
		}
		take := min(c.Len, n)
		picked = append(picked, pext{Start: c.Start, Len: take})
		n -= take
	}
	slices.SortFunc(picked, func(a, b pext) int { return cmp.Compare(a.Start, b.Start) })
	return picked
}

// allocHigh takes n blocks from the top of the data region downward, for
// checkpoints, keeping metadata away from where data streams grow. At most
// maxExts extents; otherwise nothing is taken and ErrNoSpace is returned.
func (a *allocator) allocHigh(n uint64, maxExts int) ([]pext, error) {
	if n > a.freeBlocks {
		return nil, fmt.Errorf("checkpoint needs %d blocks, %d free: %w", n, a.freeBlocks, ErrNoSpace)
	}
	var picked []pext
	need := n
	a.byStart.Descend(func(f pext) bool {
		take := min(need, f.Len)
		picked = append(picked, pext{Start: f.end() - take, Len: take})
		need -= take
		return need > 0 && len(picked) < maxExts
	})
	if need > 0 {
		return nil, fmt.Errorf("checkpoint needs %d blocks in at most %d extents; free space is too fragmented: %w", n, maxExts, ErrNoSpace)
	}
	for _, e := range picked {
		if err := a.take(e); err != nil {
			return nil, err
		}
	}
	// Store them in ascending order so the stream reads front to back.
	for i, j := 0, len(picked)-1; i < j; i, j = i+1, j-1 {
		picked[i], picked[j] = picked[j], picked[i]
	}
	return picked, nil
}

// largest returns the length of the largest free extent.
func (a *allocator) largest() uint64 {
	var l uint64
	a.bySize.Descend(func(f pext) bool {
		l = f.Len
		return false
	})
	return l
}

// extents returns the free extents in order of start.
func (a *allocator) extents() []pext {
	out := make([]pext, 0, a.byStart.Len())
	a.byStart.Ascend(func(f pext) bool {
		out = append(out, f)
		return true
	})
	return out
}

// complement returns the free extents of a region of total blocks given the
// used extents sorted by start (overlaps allowed: they are simply covered).
func complement(used []pext, total uint64) []pext {
	var free []pext
	var cur uint64
	for _, u := range used {
		if u.Start > cur {
			free = append(free, pext{Start: cur, Len: min(u.Start, total) - cur})
		}
		cur = max(cur, u.end())
		if cur >= total {
			return free
		}
	}
	if cur < total {
		free = append(free, pext{Start: cur, Len: total - cur})
	}
	return free
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
		if s.mu.alloc.freeBlocks < n+reserve && s.mu.reserved > 0 {
			s.releaseUnitsLockedMu(nil, 0) // placement gives way to space
		}
		var err error
		if s.mu.alloc.freeBlocks < n+reserve {
			err = fmt.Errorf("need %d blocks, %d free (%d kept for metadata): %w", n, s.mu.alloc.freeBlocks, reserve, ErrNoSpace)
		} else {
			start := len(dst)
			dst, err = s.mu.alloc.alloc(dst, n, goal, hasGoal)
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
// nothing mapped (allocator.base): it avoids the layouts of the other
// disks (claimedLayouts). The layouts are read disk by disk and may be
// stale by the time the allocator is asked: a base is only a goal.
func (s *Store) diskBase(self *disk, blocks uint64) (uint64, bool) {
	return s.chooseBase(&self.layout, blocks, s.claimedLayouts(self))
}

// cowBase chooses the base of the layout a disk's copied-on-write blocks
// follow where no block of its own is near (allocHoles): like diskBase,
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
	base, ok := s.mu.alloc.base(blocks, c)
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
		if err := s.mu.alloc.free(e); err != nil {
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
		s.mu.alloc.byStart.Len()+maxCkptExtents, 2*s.mu.shared.Len()+1)
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
