package refcount

import (
	"math/rand/v2"
	"testing"
)

// TestTableModel runs random Adds and Drops against a per-block model and
// checks, after each, every block's count, what Drop freed, the table's
// invariants, and that Depths of the same references gives the same table.
func TestTableModel(t *testing.T) {
	const blocks = 96
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 1))
		tab := New()
		model := make([]int, blocks) // references per block
		var uses []Range             // one Range per reference taken
		for range 60 {
			start := r.Uint64N(blocks)
			n := 1 + r.Uint64N(min(16, blocks-start))
			if r.IntN(3) > 0 || !allUsed(model, start, n) {
				// Add only over blocks with at least one reference, as
				// a clone of mapped blocks does.
				for b := start; b < start+n; b++ {
					model[b]++
				}
				if allUsedBefore(model, start, n) {
					tab.Add(start, n)
				} else {
					addFresh(tab, model, start, n)
				}
				uses = append(uses, Range{start, n})
			} else {
				freed := tab.Drop(start, n, nil)
				var want []Range
				for b := start; b < start+n; b++ {
					model[b]--
					if model[b] == 0 {
						want = appendRange(want, Range{b, 1})
					}
				}
				if !equalRanges(freed, want) {
					t.Fatalf("seed %d: Drop(%d, %d) freed %v, want %v", seed, start, n, freed, want)
				}
				uses = dropUse(uses, start, n)
			}
			checkTable(t, seed, tab, model)
			depths := Depths(uses)
			var got []Extent
			tab.Ascend(func(e Extent) bool { got = append(got, e); return true })
			if len(got) != len(depths) {
				t.Fatalf("seed %d: table %v, Depths %v", seed, got, depths)
			}
			for i := range got {
				if got[i] != depths[i] {
					t.Fatalf("seed %d: table %v, Depths %v", seed, got, depths)
				}
			}
		}
	}
}

// addFresh adds references where some blocks had none: the model's new
// first references are not the table's business (count 1 is unlisted), so
// only blocks that had one or more get an Add.
func addFresh(tab *Table, model []int, start, n uint64) {
	for b := start; b < start+n; b++ {
		if model[b] >= 2 {
			tab.Add(b, 1)
		}
	}
}

func allUsed(model []int, start, n uint64) bool {
	for b := start; b < start+n; b++ {
		if model[b] == 0 {
			return false
		}
	}
	return true
}

// allUsedBefore: every block had a reference before the increment.
func allUsedBefore(model []int, start, n uint64) bool {
	for b := start; b < start+n; b++ {
		if model[b] < 2 {
			return false
		}
	}
	return true
}

// dropUse removes one reference to each block of [start, start+n) from
// uses, splitting the uses that cover it.
func dropUse(uses []Range, start, n uint64) []Range {
	for b := start; b < start+n; b++ {
		for i, u := range uses {
			if b < u.Start || b >= u.Start+u.Len {
				continue
			}
			uses = append(uses[:i], uses[i+1:]...)
			if b > u.Start {
				uses = append(uses, Range{u.Start, b - u.Start})
			}
			if b+1 < u.Start+u.Len {
				uses = append(uses, Range{b + 1, u.Start + u.Len - b - 1})
			}
			break
		}
	}
	return uses
}

func checkTable(t *testing.T, seed uint64, tab *Table, model []int) {
	t.Helper()
	var prev Extent
	first := true
	tab.Ascend(func(e Extent) bool {
		if e.Len == 0 || e.Refs < 2 {
			t.Fatalf("seed %d: bad entry %+v", seed, e)
		}
		if !first && (prev.End() > e.Start || prev.End() == e.Start && prev.Refs == e.Refs) {
			t.Fatalf("seed %d: entries %+v and %+v overlap or should be merged", seed, prev, e)
		}
		prev, first = e, false
		return true
	})
	for b := range uint64(len(model)) {
		var got uint32
		tab.Pieces(b, 1, func(_, _ uint64, refs uint32) { got = refs })
		want := uint32(max(model[b], 1))
		if model[b] <= 1 {
			want = 1
		}
		if got != want {
			t.Fatalf("seed %d: block %d has %d references in the table, the model %d", seed, b, got, model[b])
		}
		if tab.Shared(b, 1) != (model[b] >= 2) {
			t.Fatalf("seed %d: Shared(%d) = %v with %d references", seed, b, tab.Shared(b, 1), model[b])
		}
	}
}

func equalRanges(a, b []Range) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestSetRefusesBadEntries(t *testing.T) {
	tab := New()
	if err := tab.Set(Extent{Start: 10, Len: 5, Refs: 2}); err != nil {
		t.Fatal(err)
	}
	for _, e := range []Extent{{Start: 12, Len: 5, Refs: 3}, {Start: 0, Len: 1, Refs: 1}, {Start: 20, Len: 0, Refs: 2}} {
		if tab.Set(e) == nil {
			t.Errorf("Set(%+v) accepted", e)
		}
	}
}
