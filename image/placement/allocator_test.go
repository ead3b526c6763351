package placement

import (
	"errors"
	"fmt"
	"testing"
)

// TestAllocatorRegion: the region for n blocks is the smallest free run
// outside other disks' layouts that holds them all, else the largest runs.
func TestAllocatorRegion(t *testing.T) {
	a := NewAllocator(1000)
	for _, f := range []Extent{{0, 10}, {100, 50}, {200, 30}, {300, 400}} {
		if err := a.Free(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		n       uint64
		claimed []Extent
		want    []Extent
	}{
		{20, nil, []Extent{{200, 20}}},                                  // the smallest run that holds all
		{50, nil, []Extent{{100, 50}}},                                  // an exact fit
		{60, nil, []Extent{{300, 60}}},                                  // only the large run holds it
		{20, []Extent{{190, 60}}, []Extent{{100, 20}}},                  // not into another disk's layout
		{60, []Extent{{250, 500}}, []Extent{{100, 50}, {200, 10}}},      // no run holds all outside the layouts: the largest
		{900, nil, []Extent{{0, 10}, {100, 50}, {200, 30}, {300, 400}}}, // fewer free than wanted: all of it
	} {
		if got := a.Region(tc.n, tc.claimed); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("Region(%d, %v) = %v, want %v", tc.n, tc.claimed, got, tc.want)
		}
	}
}

// TestAllocatorFreeTake: free extents merge with their neighbours; a
// double free or a take of used blocks fails and changes nothing.
func TestAllocatorFreeTake(t *testing.T) {
	a := NewAllocator(100)
	for _, f := range []Extent{{10, 10}, {30, 10}, {20, 10}} {
		if err := a.Free(f); err != nil {
			t.Fatal(err)
		}
	}
	if got := fmt.Sprint(a.Extents()); got != "[{10 30}]" || a.FreeBlocks() != 30 {
		t.Fatalf("after freeing three touching extents: %s, %d free", got, a.FreeBlocks())
	}
	if err := a.Free(Extent{15, 2}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("double free: %v, want ErrCorrupt", err)
	}
	if err := a.Free(Extent{95, 10}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("free past the end: %v, want ErrCorrupt", err)
	}
	if err := a.Take(Extent{35, 10}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("take of used blocks: %v, want ErrCorrupt", err)
	}
	if err := a.Take(Extent{15, 5}); err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(a.Extents()); got != "[{10 5} {20 20}]" || a.FreeBlocks() != 25 || a.FreeExtents() != 2 {
		t.Fatalf("after a take in the middle: %s, %d free", got, a.FreeBlocks())
	}
	if n := a.FreeIn(12, 25); n != 3+5 {
		t.Fatalf("FreeIn(12, 25) = %d, want 8", n)
	}
	if got := fmt.Sprint(a.TakeRange(12, 25)); got != "[{12 3} {20 5}]" {
		t.Fatalf("TakeRange(12, 25) = %s", got)
	}
}

// TestAllocatorAlloc: blocks at the goal first, then the first free
// extent after it that holds all, then the largest; all or nothing.
func TestAllocatorAlloc(t *testing.T) {
	a := NewAllocator(1000)
	for _, f := range []Extent{{100, 10}, {200, 50}, {500, 300}} {
		if err := a.Free(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		n, goal uint64
		hasGoal bool
		want    string
	}{
		{5, 102, true, "[{102 5}]"},          // at the goal
		{20, 102, true, "[{200 20}]"},        // the goal's extent is too short: the first after it that holds all
		{30, 0, false, "[{500 30}]"},         // no goal: the largest
		{10, 107, true, "[{107 3} {220 7}]"}, // the rest of the goal's extent, then the first after it that holds the rest
	} {
		got, err := a.Alloc(nil, tc.n, tc.goal, tc.hasGoal)
		if err != nil || fmt.Sprint(got) != tc.want {
			t.Errorf("Alloc(%d, %d, %v) = %v, %v; want %s", tc.n, tc.goal, tc.hasGoal, got, err, tc.want)
		}
	}
	free := a.FreeBlocks()
	if _, err := a.Alloc(nil, free+1, 0, false); !errors.Is(err, ErrNoSpace) || a.FreeBlocks() != free {
		t.Fatalf("Alloc of more than is free: %v, %d free after; want ErrNoSpace, %d", err, a.FreeBlocks(), free)
	}
	got, err := a.AllocHigh(20, 4)
	if err != nil || fmt.Sprint(got) != "[{780 20}]" {
		t.Fatalf("AllocHigh(20) = %v, %v; want the top of the region", got, err)
	}
}

func TestComplement(t *testing.T) {
	got := Complement([]Extent{{0, 5}, {3, 4}, {20, 5}}, 30)
	if fmt.Sprint(got) != "[{7 13} {25 5}]" {
		t.Fatalf("Complement = %v", got)
	}
}
