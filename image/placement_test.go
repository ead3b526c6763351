package image

import (
	"bytes"
	"math/rand/v2"
	"sync"
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

// TestPlacementCopyOnWrite: the blocks a disk gets by copy-on-write follow
// a layout of their own, base + virtual block, as first writes into holes
// do: a disk whose every block is shared (with a snapshot, or with a
// clone) and then rewritten 4 KiB at a time in random order reads back in
// large runs, not one extent per block, and so does one rewritten by
// concurrent 1 MiB writes in order. The shared copies keep their bytes.
func TestPlacementCopyOnWrite(t *testing.T) {
	const blocks = 4096 // 16 MiB disks
	ms := newMemStore(t, 256<<20, FormatOptions{})
	s := ms.s
	rng := rand.New(rand.NewPCG(3, 4))
	fill := func(name string) *Disk {
		h := mustCreate(t, s, name, blocks*4096)
		mustWrite(t, h, randomBytes(uint64(len(name)), blocks*4096), 0)
		return h
	}
	randomRewrite := func(h *Disk) {
		p := bytes.Repeat([]byte{0x5a}, 4096)
		for _, v := range rng.Perm(blocks) {
			mustWrite(t, h, p, int64(v)*4096)
		}
	}
	check := func(what string, h *Disk, max int) {
		t.Helper()
		if n := h.Stat().Extents; n > max {
			t.Errorf("%s: %d extents for %d blocks, want at most %d", what, n, blocks, max)
		} else {
			t.Logf("%s: %d extents", what, n)
		}
	}

	// Under a snapshot, taken in this session (the disk's own layout is
	// its shared blocks now) and after a reopen.
	a := fill("a")
	want := mustRead(t, a, 0, blocks*4096)
	if _, err := s.Snapshot("a", "a-snap"); err != nil {
		t.Fatal(err)
	}
	randomRewrite(a)
	check("a, rewritten at random over a snapshot", a, 8)
	a.Close()
	c := fill("c")
	if _, err := s.Snapshot("c", "c-snap"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	ms.reopen()
	s = ms.s
	c, err := s.OpenDisk("c")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	randomRewrite(c)
	check("c, rewritten at random over a snapshot after a reopen", c, 8)

	// Both sides of a clone.
	src := fill("src")
	defer src.Close()
	dst := mustCreate(t, s, "dst", 0)
	defer dst.Close()
	if _, err := dst.CopyFrom(src, 0, 0, blocks*4096); err != nil {
		t.Fatal(err)
	}
	randomRewrite(dst)
	check("a clone rewritten at random", dst, 8)
	randomRewrite(src)
	check("its source rewritten at random after it", src, 8)

	// Concurrent 1 MiB writes in order, 16 at a time, as fio's iodepth 16.
	e := fill("e")
	defer e.Close()
	if _, err := s.Snapshot("e", "e-snap"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	p := bytes.Repeat([]byte{0x77}, 1<<20)
	for off := int64(0); off < blocks*4096; off += 1 << 20 {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := e.WriteAt(p, off); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	check("e, rewritten in 1 MiB writes 16 at a time over a snapshot", e, 8)

	snap, err := s.OpenDisk("a-snap")
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	if !bytes.Equal(mustRead(t, snap, 0, blocks*4096), want) {
		t.Fatal("a-snap changed")
	}
}

// TestPlacementAllocate: fallocate (mode 0) places blocks as writes do. A
// disk allocated 4 KiB at a time from its last block to its first, and one
// grown by fallocate past its size, end up in one extent each, and read as
// zeros.
func TestPlacementAllocate(t *testing.T) {
	const blocks = 2048 // 8 MiB disks
	ms := newMemStore(t, 128<<20, FormatOptions{})
	a := mustCreate(t, ms.s, "a", blocks*4096)
	defer a.Close()
	for v := blocks - 1; v >= 0; v-- {
		if err := a.Allocate(int64(v)*4096, 4096, true); err != nil {
			t.Fatal(err)
		}
	}
	if n := a.Stat().Extents; n != 1 {
		t.Errorf("disk allocated last block first: %d extents for %d blocks, want 1", n, blocks)
	}
	g := mustCreate(t, ms.s, "g", 0)
	defer g.Close()
	for i := range 8 { // grows by 1 MiB, back to front within each step
		for v := 255; v >= 0; v -= 64 {
			if err := g.Allocate(int64(i*256+v-63)*4096, 64*4096, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n, size := g.Stat().Extents, g.Stat().Size; n != 1 || size != 8<<20 {
		t.Errorf("disk grown by fallocate: %d extents, size %d, want 1 and %d", n, size, 8<<20)
	}
	for _, h := range []*Disk{a, g} {
		got := make([]byte, blocks*4096)
		if _, err := h.ReadAt(got, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, make([]byte, len(got))) {
			t.Errorf("disk %s: allocated blocks do not read as zeros", h.Stat().Name)
		}
	}
}
