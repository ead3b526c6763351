package image

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// fragmentedDisk makes disk a.raw of blocks 4 KiB blocks, each an extent
// of its own, the way a store laid out before placement followed the
// virtual offset ended up, and returns its bytes. Placement now keeps a
// disk written in any order in one extent, so the layout is forced: g.raw
// takes the first room blocks; f.raw, whose size claims the whole store as
// its layout, fills what is left; every other block of f.raw is punched
// and the punches committed; a.raw, finding no free blocks outside the
// layouts, goes into f.raw's holes, one block here, one there. Then f.raw
// and g.raw are removed and that committed: the store has room blocks free
// in one run (and f.raw's blocks between a.raw's), so a.raw fits in one
// run when room >= blocks. a.raw is left open, until the test ends.
func fragmentedDisk(t *testing.T, s *Store, room, blocks uint64) (*Disk, []byte) {
	t.Helper()
	const bs = 4096
	rng := rand.New(rand.NewPCG(room, blocks))
	fill := func(name string, size int64, n uint64) []byte {
		d := mustCreate(t, s, name, size)
		defer d.Close()
		data := make([]byte, n*bs)
		for i := range data {
			data[i] = byte(rng.UintN(255) + 1) // never zero: a hole would show
		}
		for off := 0; off < len(data); off += 1 << 20 {
			end := min(off+1<<20, len(data))
			if _, err := d.WriteAt(data[off:end], int64(off)); err != nil {
				t.Fatalf("write %s at %d: %v", name, off, err)
			}
		}
		return data
	}
	if room > 0 {
		fill("g.raw", int64(room*bs), room)
	}
	commit(t, s)
	info := s.Info()
	const margin = 128 // blocks left for the checkpoint reserve, which the punches grow
	fBlocks := info.FreeBlocks - margin
	fill("f.raw", int64(info.DataBlocks*bs), fBlocks)
	f, err := s.OpenDisk("f.raw")
	if err != nil {
		t.Fatal(err)
	}
	for v := int64(0); v < int64(fBlocks); v += 2 {
		if err := f.Punch(v*bs, bs); err != nil {
			t.Fatalf("punch f.raw block %d: %v", v, err)
		}
	}
	f.Close()
	commit(t, s)
	want := fill("a.raw", int64(blocks*bs), blocks)
	for _, name := range []string{"f.raw", "g.raw"} {
		if err := s.Remove(name); err != nil && !errors.Is(err, ErrNotExist) {
			t.Fatal(err)
		}
	}
	commit(t, s)
	a, err := s.OpenDisk("a.raw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a, want
}

func commit(t *testing.T, s *Store) {
	t.Helper()
	if err := s.Commit(); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// TestDefragMakesContiguous: a disk of one extent per block, moved by
// Defrag, is one extent, reads the same bytes (also after a reopen), and
// the store uses as many blocks as before once the old blocks are
// released; a second Defrag leaves it alone.
func TestDefragMakesContiguous(t *testing.T) {
	const blocks = 2048
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a, want := fragmentedDisk(t, s, 4096, blocks)
	before := a.Stat()
	if before.Extents < blocks/2 {
		t.Fatalf("the fragmented disk has %d extents for %d blocks: the setup did not fragment it", before.Extents, blocks)
	}
	usedBefore := s.Check().UsedBlocks

	var last, total uint64
	res, err := s.Defrag("a.raw", func(done, all uint64) {
		if done < last {
			t.Errorf("progress went back from %d to %d", last, done)
		}
		last, total = done, all
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.ExtentsBefore != before.Extents || res.ExtentsAfter != 1 || res.MovedBytes != blocks*4096 ||
		res.MappedBytes != blocks*4096 || res.FreeRuns != 1 || res.Skipped != "" {
		t.Errorf("result %+v, want %d extents before, 1 after, %d bytes moved into 1 free run", res, before.Extents, blocks*4096)
	}
	if last != blocks*4096 || total != blocks*4096 {
		t.Errorf("progress ended at %d of %d, want %d of %d", last, total, blocks*4096, blocks*4096)
	}
	if got := s.List()[0]; got.Extents != 1 || got.Allocated != before.Allocated || got.Size != before.Size {
		t.Errorf("after defrag: %+v, want 1 extent and the allocation and size of before: %+v", got, before)
	}
	// The bytes are the same, and a 1 MiB read is one backend read.
	got := make([]byte, len(want))
	reads := s.Counters().DataReads
	for off := 0; off < len(got); off += 1 << 20 {
		if _, err := a.ReadAt(got[off:off+1<<20], int64(off)); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the disk reads other bytes after defrag")
	}
	if n := s.Counters().DataReads - reads; n != uint64(len(got)>>20) {
		t.Errorf("%d backend reads for %d reads of 1 MiB", n, len(got)>>20)
	}
	commit(t, s) // the last chunk's old blocks come out of quarantine
	if rep := s.Check(); !rep.Clean() || rep.UsedBlocks != usedBefore {
		t.Errorf("after defrag: check %v, %d blocks used, want clean and %d", rep.Findings, rep.UsedBlocks, usedBefore)
	}
	ms.reopen()
	if got := readAll(t, ms.s, "a.raw"); !bytes.Equal(got, want) {
		t.Fatal("the disk reads other bytes after defrag and a reopen")
	}
	again, err := ms.s.Defrag("a.raw", nil)
	if err != nil || again.Skipped != DefragContiguous || again.MovedBytes != 0 || again.ExtentsAfter != 1 {
		t.Errorf("second defrag: %+v, %v; want it left alone as %q", again, err, DefragContiguous)
	}
}

// TestDefragKeepsHoles: holes stay holes (they read zeros and take no
// blocks), the data around them ends up in one run of adjacent blocks, in
// chunks of virtual space each committed on its own (a chunk of only
// holes is passed over); a sparse disk laid out by virtual offset is left
// alone.
func TestDefragKeepsHoles(t *testing.T) {
	const blocks, bs = 2048, 4096
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a, want := fragmentedDisk(t, s, 4096, blocks)
	for _, h := range [][2]int64{{0, 3}, {100, 200}, {1000, 1}, {2040, 8}} { // first block, length
		if err := a.Punch(h[0]*bs, h[1]*bs); err != nil {
			t.Fatal(err)
		}
		clear(want[h[0]*bs : (h[0]+h[1])*bs])
	}
	commit(t, s)
	before := a.Stat()
	commitsBefore := s.Counters().Commits

	res, err := a.d.defrag("a.raw", 128, nil) // 16 chunks, one of them all hole
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.ExtentsAfter != 3 || res.MovedBytes != before.Allocated || res.Skipped != "" {
		t.Errorf("result %+v, want 3 extents after (data between 3 holes) and %d bytes moved", res, before.Allocated)
	}
	if n := s.Counters().Commits - commitsBefore; n != 15 {
		t.Errorf("%d commits, want one for each of the 15 chunks that hold data", n)
	}
	if got := readAll(t, s, "a.raw"); !bytes.Equal(got, want) {
		t.Fatal("the disk reads other bytes after defrag")
	}
	if after := a.Stat(); after.Allocated != before.Allocated {
		t.Errorf("allocated %d bytes after defrag, %d before: holes were filled or data dropped", after.Allocated, before.Allocated)
	}
	a.d.mu.RLock()
	runs := a.d.layoutRunsLockedMu()
	a.d.mu.RUnlock()
	if runs != 1 {
		t.Errorf("after defrag the disk lies in %d runs, want 1", runs)
	}
	for _, h := range [][2]int64{{0, 3}, {100, 200}, {1000, 1}} {
		if off, err := a.SeekData(h[0] * bs); err != nil || off != (h[0]+h[1])*bs {
			t.Errorf("SeekData(%d) = %d, %v; want %d: the hole moved", h[0]*bs, off, err, (h[0]+h[1])*bs)
		}
	}

	// A sparse disk written in order lies in one layout, gaps for its
	// holes and all: nothing to do.
	b := mustCreate(t, s, "b.raw", 8<<20)
	defer b.Close()
	for _, off := range []int64{0, 3 << 20, 7 << 20} {
		if _, err := b.WriteAt(bytes.Repeat([]byte{7}, 1<<20), off); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := s.Defrag("b.raw", nil); err != nil || res.Skipped != DefragContiguous || res.ExtentsBefore != 3 {
		t.Errorf("sparse disk in one layout: %+v, %v; want it left alone as %q", res, err, DefragContiguous)
	}
}

// TestDefragNoRoom: when the free space cannot hold a fragmented disk,
// Defrag leaves it as it is and says so.
func TestDefragNoRoom(t *testing.T) {
	const blocks = 2048
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a, want := fragmentedDisk(t, s, 0, blocks)
	// Fill the free space: what is left is less than a.raw's data.
	h := mustCreate(t, s, "h.raw", 0)
	p := bytes.Repeat([]byte{9}, 1<<20)
	var err error
	for off := int64(0); err == nil; off += int64(len(p)) {
		_, err = h.WriteAt(p, off)
	}
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("filling the store: %v, want ErrNoSpace", err)
	}
	h.Close()
	before := a.Stat()
	res, err := s.Defrag("a.raw", nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Skipped != DefragNoRoom || res.MovedBytes != 0 || res.ExtentsAfter != before.Extents {
		t.Errorf("result %+v, want a.raw left alone as %q", res, DefragNoRoom)
	}
	if got := readAll(t, s, "a.raw"); !bytes.Equal(got, want) {
		t.Fatal("the disk reads other bytes")
	}
}

// TestDefragWithOpenHandle: writes through an open handle while Defrag
// runs are ordered with it by the range lock: none is lost or undone by
// the copy.
func TestDefragWithOpenHandle(t *testing.T) {
	const blocks, bs = 2048, 4096
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a, want := fragmentedDisk(t, s, 4096, blocks)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(5, 6))
		for i := range 400 {
			v := rng.Int64N(blocks)
			p := bytes.Repeat([]byte{byte(i%250 + 1)}, bs)
			if _, err := a.WriteAt(p, v*bs); err != nil {
				t.Errorf("write during defrag: %v", err)
				return
			}
			copy(want[v*bs:], p)
		}
	}()
	res, err := a.d.defrag("a.raw", 64, nil)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if got := readAll(t, s, "a.raw"); !bytes.Equal(got, want) {
		t.Fatal("the disk does not hold the writes made during defrag")
	}
}

// TestDefragPowerCut: power cut after every backend operation of a Defrag
// (each write, flush, discard; unflushed writes dropped, kept at random,
// or torn): the store reopens, checks clean, and the disk reads exactly
// what it held before. Defrag moves it in 4 chunks, one commit each.
func TestDefragPowerCut(t *testing.T) {
	const blocks = 256
	c, s := crashStore(t, 16<<20)
	a, want := fragmentedDisk(t, s, 512, blocks)
	if n := a.Stat().Extents; n < blocks/2 {
		t.Fatalf("the fragmented disk has %d extents for %d blocks: the setup did not fragment it", n, blocks)
	}
	start, commits := c.OpCount(), s.Counters().Commits
	res, err := a.d.defrag("a.raw", 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", res)
	if res.ExtentsAfter != 1 || s.Counters().Commits-commits < 4 {
		t.Fatalf("defrag left %d extents in %d commits, want 1 extent in 4 commits or more", res.ExtentsAfter, s.Counters().Commits-commits)
	}
	rng := rand.New(rand.NewPCG(7, 8))
	states := 0
	for op := start; op <= c.OpCount(); op++ {
		for _, mode := range []backend.CrashMode{backend.DropUnflushed, backend.RandomSubset, backend.Torn} {
			where := fmt.Sprintf("power cut after op %d of %d (%s)", op-start, c.OpCount()-start, mode)
			s2, err := Open(c.MemAt(op, rng, mode), Options{CommitInterval: -1, Logger: quietLogger()})
			if err != nil {
				t.Fatalf("%s: open: %v", where, err)
			}
			if rep := s2.Check(); !rep.Clean() {
				t.Fatalf("%s: check: %v", where, rep.Findings)
			}
			if got := readAll(t, s2, "a.raw"); !bytes.Equal(got, want) {
				t.Fatalf("%s: the disk reads other bytes than before defrag", where)
			}
			s2.Close()
			states++
		}
	}
	t.Logf("%d power-cut states checked", states)
}
