package image

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestUnitsRandomFill: a disk filled 4 KiB at a time in random order takes
// its blocks from allocation units, so the allocator's free extents stay a
// handful instead of splitting into one per hole, the disk ends as one
// extent, and meanwhile the reserved blocks count as free, Check accounts
// for them, and every block reads back what was written.
func TestUnitsRandomFill(t *testing.T) {
	const blocks = 4096 // a 16 MiB disk: 16 units
	ms := newMemStore(t, 256<<20, FormatOptions{})
	s := ms.s
	freeBefore := s.Info().FreeBlocks
	h := mustCreate(t, s, "fill", blocks*4096)
	defer h.Close()
	order := rand.New(rand.NewPCG(3, 4)).Perm(blocks)
	block := func(v int) []byte { return bytes.Repeat([]byte{byte(v), byte(v >> 8), 0x5a, 0xa5}, 1024) }
	for i, v := range order {
		if _, err := h.WriteAt(block(v), int64(v)*4096); err != nil {
			t.Fatal(err)
		}
		if i != blocks/2 {
			continue
		}
		info := s.Info()
		if info.ReservedBlocks == 0 {
			t.Errorf("halfway through a random fill no blocks are reserved in allocation units")
		}
		if want := freeBefore - uint64(i+1); info.FreeBlocks != want {
			t.Errorf("halfway: %d blocks free (%d of them reserved), want %d: reserved blocks must count as free", info.FreeBlocks, info.ReservedBlocks, want)
		}
		s.mu.Lock()
		freeExtents := s.mu.alloc.FreeExtents()
		s.mu.Unlock()
		if freeExtents > 4 {
			t.Errorf("halfway through a random fill the allocator has %d free extents, want at most 4 (one per hole without units)", freeExtents)
		}
		if rep := s.Check(); !rep.Clean() {
			t.Fatalf("check with units reserved: %v", rep.Findings)
		}
	}
	if n := h.Stat().Extents; n != 1 {
		t.Errorf("random fill of %d blocks: %d extents, want 1", blocks, n)
	}
	if r := s.Info().ReservedBlocks; r != 0 {
		t.Errorf("%d blocks still reserved after every unit was written in full", r)
	}
	buf := make([]byte, 4096)
	for v := range blocks {
		if _, err := h.ReadAt(buf, int64(v)*4096); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, block(v)) {
			t.Fatalf("block %d reads back other bytes", v)
		}
	}
}

// TestUnitsGiveWayToSpace: blocks reserved in one disk's allocation units
// are free space for everyone: another disk can write all of it, the
// reservations are given up for it, and the first disk still reads what
// it wrote, and its holes as zeros.
func TestUnitsGiveWayToSpace(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a := mustCreate(t, s, "a", 32<<20)
	defer a.Close()
	one := bytes.Repeat([]byte{0xaa}, 4096)
	for mib := int64(0); mib < 32; mib++ { // one block in each unit: 32 units reserved
		if _, err := a.WriteAt(one, mib<<20); err != nil {
			t.Fatal(err)
		}
	}
	info := s.Info()
	if info.ReservedBlocks < 32*255 {
		t.Fatalf("%d blocks reserved after a first write into each of 32 units, want at least %d", info.ReservedBlocks, 32*255)
	}
	// b writes what is free, a MiB at a time, and then block by block to
	// the last block the store will give.
	b := mustCreate(t, s, "b", 0)
	defer b.Close()
	mib := bytes.Repeat([]byte{0xbb}, 1<<20)
	var off int64
	for {
		if _, err := b.WriteAt(mib, off); err != nil {
			break
		}
		off += 1 << 20
	}
	for {
		if _, err := b.WriteAt(one, off); err != nil {
			break
		}
		off += 4096
	}
	if got, want := uint64(off)/4096, info.FreeBlocks-s.Info().FreeBlocks; got != want {
		t.Errorf("b wrote %d blocks, but free space fell by %d", got, want)
	}
	if uint64(off) < info.ReservedBlocks*4096 {
		t.Errorf("b could write %d bytes with %d bytes reserved by a: reservations did not give way", off, info.ReservedBlocks*4096)
	}
	if r := s.Info().ReservedBlocks; r != 0 {
		t.Errorf("%d blocks still reserved on a full store", r)
	}
	buf := make([]byte, 4096)
	for mib := int64(0); mib < 32; mib++ {
		if _, err := a.ReadAt(buf, mib<<20); err != nil || !bytes.Equal(buf, one) {
			t.Fatalf("a's block at %d MiB: %v, or other bytes", mib, err)
		}
		if _, err := a.ReadAt(buf, mib<<20+4096); err != nil || !bytes.Equal(buf, make([]byte, 4096)) {
			t.Fatalf("a's hole at %d MiB + 4 KiB: %v, or not zeros", mib, err)
		}
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("check: %v", rep.Findings)
	}
}

// TestUnitsReleased: a disk's reservations go when it shrinks past them,
// when it is deleted, and when the store is closed; each time the free
// space is what it was.
func TestUnitsReleased(t *testing.T) {
	ms := newMemStore(t, 256<<20, FormatOptions{})
	s := ms.s
	freeBefore := s.Info().FreeBlocks
	h := mustCreate(t, s, "a", 16<<20)
	one := bytes.Repeat([]byte{0x11}, 4096)
	for mib := int64(0); mib < 16; mib++ {
		if _, err := h.WriteAt(one, mib<<20); err != nil {
			t.Fatal(err)
		}
	}
	if r := s.Info().ReservedBlocks; r != 16*255 {
		t.Fatalf("%d blocks reserved, want %d", r, 16*255)
	}
	if err := h.Truncate(8 << 20); err != nil {
		t.Fatal(err)
	}
	if r := s.Info().ReservedBlocks; r != 8*255 {
		t.Errorf("after a shrink to 8 MiB: %d blocks reserved, want %d (the units past the end released)", r, 8*255)
	}
	if rep := s.Check(); !rep.Clean() {
		t.Fatalf("check: %v", rep.Findings)
	}
	ms.reopen()
	s = ms.s
	if info := s.Info(); info.ReservedBlocks != 0 || info.FreeBlocks != freeBefore-8 {
		t.Errorf("after a reopen: %d free, %d reserved; want %d free, none reserved", info.FreeBlocks, info.ReservedBlocks, freeBefore-8)
	}
	h, err := s.OpenDisk("a")
	if err != nil {
		t.Fatal(err)
	}
	for mib := int64(0); mib < 8; mib++ { // reserve again
		if _, err := h.WriteAt(one, mib<<20+4096); err != nil {
			t.Fatal(err)
		}
	}
	h.Close()
	if r := s.Info().ReservedBlocks; r == 0 {
		t.Fatal("no blocks reserved after first writes into 8 units")
	}
	if err := s.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if info := s.Info(); info.ReservedBlocks != 0 || info.FreeBlocks != freeBefore {
		t.Errorf("after deleting the disk: %d free, %d reserved; want %d free, none reserved", info.FreeBlocks, info.ReservedBlocks, freeBefore)
	}
}
