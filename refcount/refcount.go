// Package refcount counts the references to physical blocks that more
// than one map holds: the shared blocks of clones and snapshots.
//
// A Table lists only blocks referenced at least twice. A block it does not
// list has one reference if some map holds it and none otherwise; the
// caller, which knows its maps, tells the two apart. So a store that shares
// nothing has an empty table, and the table's size follows the number of
// shared stretches, not the number of blocks.
//
// Invariants: entries do not overlap, each has Len > 0 and Refs >= 2, and
// two entries that touch have different Refs (touching entries with equal
// counts are merged). A Table is not safe for concurrent use; its owner's
// lock guards it. Clone is O(1) and copy-on-write.
package refcount

import (
	"fmt"
	"sort"

	"github.com/google/btree"
)

// Extent is a stretch of physical blocks [Start, Start+Len) each referenced
// Refs times.
type Extent struct {
	Start, Len uint64
	Refs       uint32
}

// End is the block after the extent.
func (e Extent) End() uint64 { return e.Start + e.Len }

// Range is a stretch of physical blocks [Start, Start+Len).
type Range struct {
	Start, Len uint64
}

// Table counts the references of shared physical blocks.
type Table struct {
	t *btree.BTreeG[Extent]
}

func less(a, b Extent) bool { return a.Start < b.Start }

// New returns an empty table: nothing shared.
func New() *Table { return &Table{t: btree.NewG(16, less)} }

// Clone returns a copy that shares the original's nodes until either
// changes (O(1)).
func (t *Table) Clone() *Table { return &Table{t: t.t.Clone()} }

// Len is the number of entries.
func (t *Table) Len() int { return t.t.Len() }

// Ascend calls fn for every entry in physical order until fn says false.
func (t *Table) Ascend(fn func(Extent) bool) { t.t.Ascend(fn) }

// Pieces calls fn for the pieces of [start, start+n) in order, each with its
// count from the table: the table's, or 1 where it lists nothing (the
// caller knows whether those blocks are used at all).
func (t *Table) Pieces(start, n uint64, fn func(start, n uint64, refs uint32)) {
	end := start + n
	at := start
	t.overlapping(start, end, func(e Extent) bool {
		lo, hi := max(e.Start, start), min(e.End(), end)
		if at < lo {
			fn(at, lo-at, 1)
		}
		fn(lo, hi-lo, e.Refs)
		at = hi
		return true
	})
	if at < end {
		fn(at, end-at, 1)
	}
}

// Shared reports whether any block of [start, start+n) is listed (has two
// or more references).
func (t *Table) Shared(start, n uint64) bool {
	shared := false
	t.overlapping(start, start+n, func(Extent) bool { shared = true; return false })
	return shared
}

// Add adds one reference to every block of [start, start+n): a block the
// table does not list (one reference) gets two.
func (t *Table) Add(start, n uint64) {
	if n == 0 {
		return
	}
	var out []Extent
	t.Pieces(start, n, func(s, l uint64, refs uint32) {
		if refs == ^uint32(0) {
			panic(fmt.Sprintf("refcount: block %d has %d references", s, refs))
		}
		out = append(out, Extent{Start: s, Len: l, Refs: refs + 1})
	})
	t.replace(start, start+n, out)
}

// Drop removes one reference from every block of [start, start+n) and
// appends to freed the pieces that had only one, which nothing references
// now.
func (t *Table) Drop(start, n uint64, freed []Range) []Range {
	if n == 0 {
		return freed
	}
	var out []Extent
	t.Pieces(start, n, func(s, l uint64, refs uint32) {
		if refs == 1 {
			freed = appendRange(freed, Range{Start: s, Len: l})
		} else if refs > 2 {
			out = append(out, Extent{Start: s, Len: l, Refs: refs - 1})
		}
	})
	t.replace(start, start+n, out)
	return freed
}

// Set lists e as it is, for loading a stored table; e must not overlap an
// entry and must have Refs >= 2.
func (t *Table) Set(e Extent) error {
	if e.Len == 0 || e.Refs < 2 || e.Start+e.Len < e.Start {
		return fmt.Errorf("refcount: invalid entry [%d,+%d) with %d references", e.Start, e.Len, e.Refs)
	}
	if t.Shared(e.Start, e.Len) {
		return fmt.Errorf("refcount: entry [%d,+%d) overlaps another", e.Start, e.Len)
	}
	t.replace(e.Start, e.End(), []Extent{e})
	return nil
}

// overlapping calls fn for every entry that overlaps [start, end), in order.
func (t *Table) overlapping(start, end uint64, fn func(Extent) bool) {
	first := Extent{Start: start}
	if prev, ok := t.before(start); ok && prev.End() > start {
		first = prev
	}
	t.t.AscendGreaterOrEqual(first, func(e Extent) bool {
		if e.Start >= end {
			return false
		}
		return fn(e)
	})
}

// before returns the entry starting at or before block b.
func (t *Table) before(b uint64) (Extent, bool) {
	var got Extent
	ok := false
	t.t.DescendLessOrEqual(Extent{Start: b}, func(e Extent) bool {
		got, ok = e, true
		return false
	})
	return got, ok
}

// replace makes the table list exactly out (sorted, disjoint, inside
// [start, end)) over [start, end), keeping what lies outside: entries that
// cross start or end are cut there. Touching entries with equal counts
// are merged.
func (t *Table) replace(start, end uint64, out []Extent) {
	var cut []Extent
	t.overlapping(start, end, func(e Extent) bool { cut = append(cut, e); return true })
	for _, e := range cut {
		t.t.Delete(e)
		if e.Start < start {
			t.t.ReplaceOrInsert(Extent{Start: e.Start, Len: start - e.Start, Refs: e.Refs})
		}
		if e.End() > end {
			t.t.ReplaceOrInsert(Extent{Start: end, Len: e.End() - end, Refs: e.Refs})
		}
	}
	for _, e := range out {
		t.t.ReplaceOrInsert(e)
	}
	// Merge across the edges of what changed and inside it.
	lo := start
	if prev, ok := t.before(start - min(start, 1)); ok && start > 0 {
		lo = prev.Start
	}
	var run []Extent
	t.t.AscendGreaterOrEqual(Extent{Start: lo}, func(e Extent) bool {
		if e.Start > end {
			return false
		}
		run = append(run, e)
		return true
	})
	for i := 1; i < len(run); i++ {
		a, b := run[i-1], run[i]
		if a.End() == b.Start && a.Refs == b.Refs {
			t.t.Delete(a)
			t.t.Delete(b)
			run[i] = Extent{Start: a.Start, Len: a.Len + b.Len, Refs: a.Refs}
			t.t.ReplaceOrInsert(run[i])
		}
	}
}

// appendRange appends r to rs, merging it with the last range it touches.
func appendRange(rs []Range, r Range) []Range {
	if n := len(rs); n > 0 && rs[n-1].Start+rs[n-1].Len == r.Start {
		rs[n-1].Len += r.Len
		return rs
	}
	return append(rs, r)
}

// Profile counts users from a list of uses: given every use of physical
// blocks (each map extent, in any order), it returns the stretches used at
// least once, sorted, each with its number of users (Refs), touching
// stretches with equal counts merged.
func Profile(uses []Range) []Extent {
	type edge struct {
		at    uint64
		delta int
	}
	edges := make([]edge, 0, 2*len(uses))
	for _, u := range uses {
		if u.Len > 0 {
			edges = append(edges, edge{u.Start, 1}, edge{u.Start + u.Len, -1})
		}
	}
	sort.Slice(edges, func(i, j int) bool { return edges[i].at < edges[j].at })
	var out []Extent
	depth := 0
	for i := 0; i < len(edges); {
		at := edges[i].at
		for i < len(edges) && edges[i].at == at {
			depth += edges[i].delta
			i++
		}
		if i == len(edges) || depth == 0 {
			continue
		}
		e := Extent{Start: at, Len: edges[i].at - at, Refs: uint32(depth)}
		if n := len(out); n > 0 && out[n-1].End() == e.Start && out[n-1].Refs == e.Refs {
			out[n-1].Len += e.Len
		} else {
			out = append(out, e)
		}
	}
	return out
}

// Depths is the table of uses: the stretches of Profile used at least
// twice. It is how a checkpoint or a repair derives the counts from the
// maps.
func Depths(uses []Range) []Extent {
	var out []Extent
	for _, e := range Profile(uses) {
		if e.Refs >= 2 {
			out = append(out, e)
		}
	}
	return out
}

// Equal reports whether two tables list the same counts.
func (t *Table) Equal(o *Table) bool {
	if t.Len() != o.Len() {
		return false
	}
	var a, b []Extent
	t.Ascend(func(e Extent) bool { a = append(a, e); return true })
	o.Ascend(func(e Extent) bool { b = append(b, e); return true })
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
