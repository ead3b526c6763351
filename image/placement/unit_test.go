package placement

import (
	"fmt"
	"testing"
)

// TestReserveUnit: a unit takes every free block of its stretch, counts
// the used ones as given, hands blocks out at phys+i, and gives back what
// is left on Release; it refuses a stretch where the asking hole is not
// free or that would leave less than keep free.
func TestReserveUnit(t *testing.T) {
	const ub = 256
	a := NewAllocator(4096)
	if err := a.Free(Extent{Start: 0, Len: 4096}); err != nil {
		t.Fatal(err)
	}
	if err := a.Take(Extent{Start: 1024 + 10, Len: 5}); err != nil { // someone's blocks inside the stretch
		t.Fatal(err)
	}
	if r := a.ReserveUnit(1024, ub, 12, 1, 0); r != nil {
		t.Fatalf("reserved a unit whose asking block 12 is in use")
	}
	if r := a.ReserveUnit(1024, ub, 0, 1, 4096); r != nil {
		t.Fatalf("reserved a unit that leaves less than keep free")
	}
	if r := a.ReserveUnit(4096-100, ub, 0, 1, 0); r != nil {
		t.Fatalf("reserved a unit past the end")
	}
	free := a.FreeBlocks()
	r := a.ReserveUnit(1024, ub, 0, 1, 0)
	if r == nil {
		t.Fatal("no unit reserved over free blocks")
	}
	if r.Left() != ub-5 || a.FreeBlocks() != free-(ub-5) {
		t.Fatalf("left %d, free %d; want %d, %d", r.Left(), a.FreeBlocks(), ub-5, free-(ub-5))
	}
	if r.Reserved(9, 2) || !r.Reserved(0, 10) || !r.Reserved(15, ub-15) {
		t.Fatal("the blocks in use are not marked given, or free ones are")
	}
	if e := r.Give(3, 2); e != (Extent{Start: 1027, Len: 2}) {
		t.Fatalf("Give(3, 2) = %v, want [1027,+2)", e)
	}
	if r.Reserved(3, 1) || r.Left() != ub-7 {
		t.Fatalf("after Give: reserved(3) %v, left %d", r.Reserved(3, 1), r.Left())
	}
	want := []Extent{{1024, 3}, {1029, 5}, {1039, ub - 15}}
	if got := r.Extents(nil, ub); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Extents = %v, want %v", got, want)
	}
	if err := r.Release(a, ub); err != nil {
		t.Fatal(err)
	}
	if r.Left() != 0 || a.FreeBlocks() != free-2 {
		t.Fatalf("after Release: left %d, free %d; want 0, %d", r.Left(), a.FreeBlocks(), free-2)
	}
}

func TestUnitBlocks(t *testing.T) {
	for _, tc := range []struct{ bs, want uint64 }{{4096, 256}, {65536, 16}, {131072, 0}} {
		if got := UnitBlocks(tc.bs); got != tc.want {
			t.Errorf("UnitBlocks(%d) = %d, want %d", tc.bs, got, tc.want)
		}
	}
}
