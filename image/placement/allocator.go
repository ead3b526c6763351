package placement

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/google/btree"
)

// Allocator tracks the free physical blocks of the data region as maximal
// free extents, indexed twice: by start (to find the free extent at a goal
// block, and to merge neighbours on free) and by length (to find the largest).
//
// Invariants: free extents are non-empty, inside [0, total), never overlap and
// never touch (touching extents are merged); both indexes hold the same set;
// freeBlocks is their total length.
//
// An Allocator is not safe for concurrent use: its owner's lock guards it
// (the store's mu).
type Allocator struct {
	total      uint64
	freeBlocks uint64
	byStart    *btree.BTreeG[Extent]
	bySize     *btree.BTreeG[Extent]
}

// Total is the number of blocks the allocator manages, free or not.
func (a *Allocator) Total() uint64 { return a.total }

// FreeBlocks is the number of free blocks.
func (a *Allocator) FreeBlocks() uint64 { return a.freeBlocks }

// FreeExtents is the number of free extents.
func (a *Allocator) FreeExtents() int { return a.byStart.Len() }

// FreeIn is the number of free blocks in [lo, hi).
func (a *Allocator) FreeIn(lo, hi uint64) uint64 {
	var free uint64
	a.byStart.AscendRange(Extent{Start: lo}, Extent{Start: hi}, func(f Extent) bool {
		free += min(f.End(), hi) - f.Start
		return true
	})
	if f, ok := a.Containing(lo); ok && f.Start < lo {
		free += min(f.End(), hi) - lo
	}
	return free
}

func lessStart(a, b Extent) bool { return a.Start < b.Start }

func lessSize(a, b Extent) bool {
	if a.Len != b.Len {
		return a.Len < b.Len
	}
	return a.Start < b.Start
}

// NewAllocator returns an allocator of total blocks, none of them free:
// Free gives it the free ones.
func NewAllocator(total uint64) *Allocator {
	return &Allocator{
		total:   total,
		byStart: btree.NewG(32, lessStart),
		bySize:  btree.NewG(32, lessSize),
	}
}

func (a *Allocator) insert(e Extent) {
	a.byStart.ReplaceOrInsert(e)
	a.bySize.ReplaceOrInsert(e)
	a.freeBlocks += e.Len
}

func (a *Allocator) delete(e Extent) {
	a.byStart.Delete(e)
	a.bySize.Delete(e)
	a.freeBlocks -= e.Len
}

// Containing returns the free extent that contains block b.
func (a *Allocator) Containing(b uint64) (Extent, bool) {
	var found Extent
	ok := false
	a.byStart.DescendLessOrEqual(Extent{Start: b}, func(e Extent) bool {
		if b < e.End() {
			found, ok = e, true
		}
		return false
	})
	return found, ok
}

// Free returns e to the free set, merging with touching neighbours. It fails
// (and changes nothing) if any block of e is already free: a double free
// means the maps and the Allocator disagree.
func (a *Allocator) Free(e Extent) error {
	if e.Len == 0 {
		return nil
	}
	if e.Start >= a.total || e.Len > a.total-e.Start {
		return fmt.Errorf("free [%d,+%d): outside the data region of %d blocks: %w", e.Start, e.Len, a.total, ErrCorrupt)
	}
	var prev, next Extent
	hasPrev, hasNext := false, false
	a.byStart.DescendLessOrEqual(Extent{Start: e.Start}, func(p Extent) bool {
		prev, hasPrev = p, true
		return false
	})
	a.byStart.AscendGreaterOrEqual(Extent{Start: e.Start}, func(n Extent) bool {
		if n.Start == e.Start && hasPrev && prev == n {
			return true // the same extent seen by the descent; look further
		}
		next, hasNext = n, true
		return false
	})
	if hasPrev && prev.End() > e.Start || hasNext && next.Start < e.End() {
		return fmt.Errorf("free [%d,+%d): blocks already free: %w", e.Start, e.Len, ErrCorrupt)
	}
	merged := e
	if hasPrev && prev.End() == e.Start {
		a.delete(prev)
		merged = Extent{Start: prev.Start, Len: prev.Len + merged.Len}
	}
	if hasNext && next.Start == e.End() {
		a.delete(next)
		merged.Len += next.Len
	}
	a.insert(merged)
	return nil
}

// Take marks e as used. Every block of e must be free, else nothing changes
// and an error says which block was not.
func (a *Allocator) Take(e Extent) error {
	if e.Len == 0 {
		return nil
	}
	f, ok := a.Containing(e.Start)
	if !ok || f.End() < e.End() {
		return fmt.Errorf("use [%d,+%d): blocks are not free: %w", e.Start, e.Len, ErrCorrupt)
	}
	a.delete(f)
	if f.Start < e.Start {
		a.insert(Extent{Start: f.Start, Len: e.Start - f.Start})
	}
	if e.End() < f.End() {
		a.insert(Extent{Start: e.End(), Len: f.End() - e.End()})
	}
	return nil
}

// TakeRange takes every free block in [lo, hi) and returns the extents
// taken, in order.
func (a *Allocator) TakeRange(lo, hi uint64) []Extent {
	var pieces []Extent
	if f, ok := a.Containing(lo); ok {
		pieces = append(pieces, Extent{Start: lo, Len: min(f.End(), hi) - lo})
	}
	a.byStart.AscendRange(Extent{Start: lo + 1}, Extent{Start: hi}, func(f Extent) bool {
		pieces = append(pieces, Extent{Start: f.Start, Len: min(f.End(), hi) - f.Start})
		return true
	})
	for _, e := range pieces {
		if err := a.Take(e); err != nil {
			panic(fmt.Sprintf("placement: TakeRange [%d,%d): %v", lo, hi, err))
		}
	}
	return pieces
}

// Alloc takes n blocks, preferring, in order: blocks starting exactly at
// goal (so a sequential writer's extents stay physically contiguous and
// merge in the map); the first free extent after goal large enough for all n;
// the largest free extents. It appends the extents taken to dst. It takes all
// n blocks or none (ErrNoSpace).
func (a *Allocator) Alloc(dst []Extent, n, goal uint64, hasGoal bool) ([]Extent, error) {
	if n > a.freeBlocks {
		return dst, fmt.Errorf("need %d blocks, %d free: %w", n, a.freeBlocks, ErrNoSpace)
	}
	for n > 0 {
		e, ok := a.pick(n, goal, hasGoal)
		if !ok {
			return dst, fmt.Errorf("Allocator inconsistent: %d blocks free but none found: %w", a.freeBlocks, ErrCorrupt)
		}
		if err := a.Take(e); err != nil {
			return dst, err
		}
		dst = append(dst, e)
		n -= e.Len
		goal, hasGoal = e.End(), true
	}
	return dst, nil
}

// pick chooses the next extent (at most n blocks) for alloc.
func (a *Allocator) pick(n, goal uint64, hasGoal bool) (Extent, bool) {
	if hasGoal && goal < a.total {
		if f, ok := a.Containing(goal); ok {
			return Extent{Start: goal, Len: min(n, f.End()-goal)}, true
		}
		var after Extent
		found := false
		a.byStart.AscendGreaterOrEqual(Extent{Start: goal}, func(f Extent) bool {
			if f.Len >= n {
				after, found = f, true
				return false
			}
			return true
		})
		if found {
			return Extent{Start: after.Start, Len: n}, true
		}
	}
	// No goal, or nothing near it: the largest free extent. For a fresh
	// stream (no goal) that follows someone else's used blocks, start in the
	// middle of the extent, leaving room for whoever precedes it to grow.
	var largest Extent
	ok := false
	a.bySize.Descend(func(f Extent) bool {
		largest, ok = f, true
		return false
	})
	if !ok {
		return Extent{}, false
	}
	start := largest.Start
	const spread = 1 << 16 // blocks; only split extents this big
	if !hasGoal && largest.Start > 0 && largest.Len >= 2*spread && largest.Len/2 >= n {
		start = largest.Start + largest.Len/2
	}
	return Extent{Start: start, Len: min(n, largest.End()-start)}, true
}

// Base is where a disk of blocks blocks with nothing mapped yet starts its
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
func (a *Allocator) Base(blocks uint64, claimed []Extent) (uint64, bool) {
	var best Extent
	found := false
	a.byStart.Ascend(func(f Extent) bool {
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
	var largest Extent
	ok := false
	a.bySize.Descend(func(f Extent) bool {
		largest, ok = f, true
		return false
	})
	return largest.Start, ok
}

// subtract returns the parts of f outside every extent of claimed (sorted
// by start), in order.
func subtract(f Extent, claimed []Extent) []Extent {
	var out []Extent
	at := f.Start
	for _, c := range claimed {
		if c.End() <= at || c.Start >= f.End() {
			continue
		}
		if c.Start > at {
			out = append(out, Extent{Start: at, Len: c.Start - at})
		}
		at = max(at, c.End())
	}
	if at < f.End() {
		out = append(out, Extent{Start: at, Len: f.End() - at})
	}
	return out
}

// Region chooses where n blocks should go to lie in as few physical runs
// as the free space allows (Store.Defrag), without taking them: the
// smallest free stretch outside every claimed layout (sorted by start, as
// for base) that holds all n, its first n blocks; else the largest such
// stretches, largest first, until they hold n. When the stretches outside
// the claimed layouts hold fewer than n blocks in all, the store is short
// of space and layouts give way: the same choice is made among all free
// extents. The runs come sorted by start; together they hold n blocks, or
// every free block when fewer are free.
func (a *Allocator) Region(n uint64, claimed []Extent) []Extent {
	var outside []Extent
	var outsideBlocks uint64
	a.byStart.Ascend(func(f Extent) bool {
		for _, piece := range subtract(f, claimed) {
			outside = append(outside, piece)
			outsideBlocks += piece.Len
		}
		return true
	})
	candidates := outside
	if outsideBlocks < n {
		candidates = a.Extents()
	}
	return fewestRuns(candidates, n)
}

// fewestRuns picks from the free runs candidates the fewest that hold n
// blocks: the smallest run that holds all n (its first n blocks), else the
// largest runs, largest first, until they hold n (the last one only as
// much of it as is needed) or the candidates run out. The picks come
// sorted by start.
func fewestRuns(candidates []Extent, n uint64) []Extent {
	if n == 0 {
		return nil
	}
	best, found := Extent{}, false
	for _, c := range candidates {
		if c.Len >= n && (!found || c.Len < best.Len) {
			best, found = c, true
		}
	}
	if found {
		return []Extent{{Start: best.Start, Len: n}}
	}
	bySize := slices.Clone(candidates)
	slices.SortStableFunc(bySize, func(a, b Extent) int { return cmp.Compare(b.Len, a.Len) })
	var picked []Extent
	for _, c := range bySize {
		if n == 0 {
			break
		}
		take := min(c.Len, n)
		picked = append(picked, Extent{Start: c.Start, Len: take})
		n -= take
	}
	slices.SortFunc(picked, func(a, b Extent) int { return cmp.Compare(a.Start, b.Start) })
	return picked
}

// AllocHigh takes n blocks from the top of the data region downward, for
// checkpoints, keeping metadata away from where data streams grow. At most
// maxExts extents; otherwise nothing is taken and ErrNoSpace is returned.
func (a *Allocator) AllocHigh(n uint64, maxExts int) ([]Extent, error) {
	if n > a.freeBlocks {
		return nil, fmt.Errorf("checkpoint needs %d blocks, %d free: %w", n, a.freeBlocks, ErrNoSpace)
	}
	var picked []Extent
	need := n
	a.byStart.Descend(func(f Extent) bool {
		take := min(need, f.Len)
		picked = append(picked, Extent{Start: f.End() - take, Len: take})
		need -= take
		return need > 0 && len(picked) < maxExts
	})
	if need > 0 {
		return nil, fmt.Errorf("checkpoint needs %d blocks in at most %d extents; free space is too fragmented: %w", n, maxExts, ErrNoSpace)
	}
	for _, e := range picked {
		if err := a.Take(e); err != nil {
			return nil, err
		}
	}
	// Store them in ascending order so the stream reads front to back.
	for i, j := 0, len(picked)-1; i < j; i, j = i+1, j-1 {
		picked[i], picked[j] = picked[j], picked[i]
	}
	return picked, nil
}

// Largest returns the length of the largest free extent.
func (a *Allocator) Largest() uint64 {
	var l uint64
	a.bySize.Descend(func(f Extent) bool {
		l = f.Len
		return false
	})
	return l
}

// Extents returns the free extents in order of start.
func (a *Allocator) Extents() []Extent {
	out := make([]Extent, 0, a.byStart.Len())
	a.byStart.Ascend(func(f Extent) bool {
		out = append(out, f)
		return true
	})
	return out
}

// Complement returns the free extents of a region of total blocks given the
// used extents sorted by start (overlaps allowed: they are simply covered).
func Complement(used []Extent, total uint64) []Extent {
	var free []Extent
	var cur uint64
	for _, u := range used {
		if u.Start > cur {
			free = append(free, Extent{Start: cur, Len: min(u.Start, total) - cur})
		}
		cur = max(cur, u.End())
		if cur >= total {
			return free
		}
	}
	if cur < total {
		free = append(free, Extent{Start: cur, Len: total - cur})
	}
	return free
}
