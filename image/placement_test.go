package image

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestPlacementFollowsVirtualOffset: a disk filled block by block in random
// order (a guest file system, a database, an OS install) is laid out by
// virtual offset, so it reads back in large runs: a handful of extents,
// not one per block. Two disks filled in turns, each at random, stay apart.
func TestPlacementFollowsVirtualOffset(t *testing.T) {
	const blocks = 8192 // 32 MiB disks
	ms := newMemStore(t, 256<<20, FormatOptions{})
	a := mustCreate(t, ms.s, "a", blocks*4096)
	defer a.Close()
	b := mustCreate(t, ms.s, "b", blocks*4096)
	defer b.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	order := rng.Perm(blocks)
	p := bytes.Repeat([]byte{0xa5}, 4096)
	for _, v := range order {
		if _, err := a.WriteAt(p, int64(v)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.Stat().Extents; n > 8 {
		t.Errorf("a disk filled 4 KiB at a time in random order has %d extents for %d blocks, want at most 8", n, blocks)
	} else {
		t.Logf("random fill of %d blocks: %d extents", blocks, n)
	}
	// Two disks in turns: c and d interleave their random writes.
	c := mustCreate(t, ms.s, "c", blocks*4096)
	defer c.Close()
	d := mustCreate(t, ms.s, "d", blocks*4096)
	defer d.Close()
	oc, od := rng.Perm(blocks), rng.Perm(blocks)
	for i := range blocks {
		if _, err := c.WriteAt(p, int64(oc[i])*4096); err != nil {
			t.Fatal(err)
		}
		if _, err := d.WriteAt(p, int64(od[i])*4096); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range []*Disk{c, d} {
		if n := h.Stat().Extents; n > 64 {
			t.Errorf("disk %s, filled at random in turns with another: %d extents for %d blocks, want at most 64", h.Stat().Name, n, blocks)
		} else {
			t.Logf("disk %s, filled in turns with another: %d extents", h.Stat().Name, n)
		}
	}
}
