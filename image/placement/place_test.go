package placement

import (
	"fmt"
	"testing"

	"github.com/vdiskfs/vdiskfs/blockmap"
)

// fakeSpace is a Space over an allocator alone: no units unless units is
// set, a fixed base, and lazy neighbours from nb.
type fakeSpace struct {
	a        *Allocator
	base     uint64
	nb       Neighbours
	units    map[uint64]*Unit // by virtual unit, of ub blocks
	ub       uint64
	prepared []Extent
	resolved int
}

func (f *fakeSpace) FromUnit(dst []Extent, virt, n, goal uint64, reserve, wait bool) ([]Extent, bool, error) {
	if f.units == nil || virt/f.ub != (virt+n-1)/f.ub {
		return dst, false, nil
	}
	u, i := virt/f.ub, virt%f.ub
	r := f.units[u]
	if r == nil && reserve && goal >= i {
		r = f.a.ReserveUnit(goal-i, f.ub, i, n, 0)
		f.units[u] = r
	}
	if r == nil || !r.Reserved(i, n) {
		return dst, false, nil
	}
	return append(dst, r.Give(i, n)), true, nil
}

func (f *fakeSpace) Alloc(dst []Extent, n, goal uint64, hasGoal, wait bool) ([]Extent, error) {
	return f.a.Alloc(dst, n, goal, hasGoal)
}

func (f *fakeSpace) Prepare(exts []Extent, wait bool) error {
	f.prepared = append(f.prepared, exts...)
	return nil
}

func (f *fakeSpace) Base(cow bool, blocks uint64) (uint64, bool) {
	if cow {
		return f.base + 1000, true
	}
	return f.base, true
}

func (f *fakeSpace) Neighbours(first, count uint64) Neighbours {
	f.resolved++
	return f.nb
}

func newFakeSpace(t *testing.T) *fakeSpace {
	a := NewAllocator(10000)
	if err := a.Free(Extent{Start: 0, Len: 10000}); err != nil {
		t.Fatal(err)
	}
	return &fakeSpace{a: a, base: 2000}
}

func hole(virt, n uint64) blockmap.Segment { return blockmap.Segment{Virt: virt, Len: n, Hole: true} }

// TestFillAims: a hole is aimed by the data before it, else by the data
// after it, else by the disk's base (its copy-on-write base where a
// shared neighbour was dropped), plus the virtual distance.
func TestFillAims(t *testing.T) {
	const bs = 4096
	for _, tc := range []struct {
		name string
		segs []blockmap.Segment
		nb   Neighbours
		want string
	}{
		{"before", []blockmap.Segment{{Virt: 10, Len: 2, Phys: 500}, hole(12, 3)}, Neighbours{},
			"[{10 2 500 false} {12 3 502 false}]"},
		{"after", []blockmap.Segment{hole(10, 2), {Virt: 12, Len: 2, Phys: 700}}, Neighbours{},
			"[{10 2 698 false} {12 2 700 false}]"},
		{"prev neighbour", []blockmap.Segment{hole(20, 4)}, Neighbours{Prev: blockmap.Extent{Virt: 0, Phys: 300, Len: 10}, HasPrev: true},
			"[{20 4 320 false}]"},
		{"next neighbour", []blockmap.Segment{hole(20, 4)}, Neighbours{Next: blockmap.Extent{Virt: 30, Phys: 900, Len: 1}, HasNext: true},
			"[{20 4 890 false}]"},
		{"base", []blockmap.Segment{hole(20, 4)}, Neighbours{}, "[{20 4 2020 false}]"},
		{"cow base", []blockmap.Segment{hole(20, 4)}, Neighbours{CoW: true}, "[{20 4 3020 false}]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp := newFakeSpace(t)
			for _, sg := range tc.segs {
				if !sg.Hole {
					if err := sp.a.Take(Extent{Start: sg.Phys, Len: sg.Len}); err != nil {
						t.Fatal(err)
					}
				}
			}
			out, allocs, err := Fill(nil, nil, tc.segs, tc.nb, sp, bs, true)
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(out) != tc.want {
				t.Errorf("Fill = %v, want %s", out, tc.want)
			}
			var given uint64
			for _, e := range allocs {
				given += e.Len
			}
			if given+sp.a.FreeBlocks() != 10000-dataBlocks(tc.segs) {
				t.Errorf("%d blocks given, %d free: blocks lost or given twice", given, sp.a.FreeBlocks())
			}
			if len(sp.prepared) == 0 {
				t.Errorf("small holes given blocks without preparing the backing")
			}
		})
	}
}

func dataBlocks(segs []blockmap.Segment) uint64 {
	var n uint64
	for _, sg := range segs {
		if !sg.Hole {
			n += sg.Len
		}
	}
	return n
}

// TestFillUnits: a small hole whose unit is reserved takes its blocks
// there without looking up its neighbours; the first one into a unit
// looks them up (lazily) and reserves the unit at the goal.
func TestFillUnits(t *testing.T) {
	const bs, ub = 4096, 256
	sp := newFakeSpace(t)
	sp.units, sp.ub = map[uint64]*Unit{}, ub
	lazy := Neighbours{Lazy: true, First: 300, Count: 1}
	out, _, err := Fill(nil, nil, []blockmap.Segment{hole(300, 1)}, lazy, sp, bs, true)
	if err != nil || fmt.Sprint(out) != "[{300 1 2300 false}]" || sp.resolved != 1 {
		t.Fatalf("first write into a unit: %v, %v, neighbours looked up %d times; want [{300 1 2300 false}], once", out, err, sp.resolved)
	}
	out, _, err = Fill(nil, nil, []blockmap.Segment{hole(260, 2)}, Neighbours{Lazy: true, First: 260, Count: 2}, sp, bs, true)
	if err != nil || fmt.Sprint(out) != "[{260 2 2260 false}]" || sp.resolved != 1 {
		t.Fatalf("second write into the unit: %v, %v, neighbours looked up %d times; want [{260 2 2260 false}], still once", out, err, sp.resolved)
	}
	big := uint64(PrepareBelow / bs)
	sp.prepared = nil
	if _, _, err := Fill(nil, nil, []blockmap.Segment{hole(1024, big)}, Neighbours{}, sp, bs, true); err != nil {
		t.Fatal(err)
	}
	if len(sp.prepared) != 0 {
		t.Errorf("a large hole prepared the backing: %v", sp.prepared)
	}
}
