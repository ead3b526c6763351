package image

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 5))
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32()) | 1
	}
	return p
}

func mustRead(t *testing.T, h *Disk, off, n int64) []byte {
	t.Helper()
	p := make([]byte, n)
	if k, err := h.ReadAt(p, off); err != nil || int64(k) != n {
		t.Fatalf("read %d at %d: %d bytes, %v", n, off, k, err)
	}
	return p
}

func mustWrite(t *testing.T, h *Disk, p []byte, off int64) {
	t.Helper()
	if _, err := h.WriteAt(p, off); err != nil {
		t.Fatalf("write %d at %d: %v", len(p), off, err)
	}
}

// TestCopyFromShares: a whole-disk copy maps the source's blocks (no new
// blocks, no data written), both disks read the same, a write to either
// leaves the other as it was, and all of it survives a reopen; removing
// one disk frees only what the other does not map.
func TestCopyFromShares(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	const size = 8 << 20
	a := mustCreate(t, s, "a", 0)
	data := randomBytes(1, size)
	mustWrite(t, a, data, 0)
	b := mustCreate(t, s, "b", 0)
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	free := s.Info().FreeBlocks
	writes := s.Counters().DataWriteBytes
	n, err := b.CopyFrom(a, 0, 0, size+4096) // past a's end: stops there
	if err != nil || n != size {
		t.Fatalf("copy: %d, %v; want %d", n, err, size)
	}
	if got := s.Info().FreeBlocks; got != free {
		t.Errorf("free blocks %d after the copy, %d before: a copy of whole blocks must take none", got, free)
	}
	if got := s.Counters().DataWriteBytes; got != writes {
		t.Errorf("the copy wrote %v data bytes", got-writes)
	}
	if s.Version() != 2 {
		t.Errorf("store version %d after a share, want 2", s.Version())
	}
	if !bytes.Equal(mustRead(t, b, 0, size), data) {
		t.Fatal("the copy reads differently from its source")
	}
	info, _ := s.Stat("b")
	if info.Shared != size || info.Allocated != size || !info.Clone || info.Origin != "a" {
		t.Errorf("b: shared %d allocated %d clone %v origin %q; want %d, %d, true, a", info.Shared, info.Allocated, info.Clone, info.Origin, size, size)
	}

	// Writes to either side go to new blocks: 1 MiB into b, unaligned
	// bytes into a.
	patch := randomBytes(2, 1<<20)
	mustWrite(t, b, patch, 3<<20)
	mustWrite(t, a, []byte("hello"), 5<<20+17)
	want := bytes.Clone(data)
	copy(want[3<<20:], patch)
	if !bytes.Equal(mustRead(t, b, 0, size), want) {
		t.Fatal("b does not read its own write")
	}
	wantA := bytes.Clone(data)
	copy(wantA[5<<20+17:], "hello")
	if !bytes.Equal(mustRead(t, a, 0, size), wantA) {
		t.Fatal("a changed when b was written, or lost its own write")
	}
	a.Close()
	b.Close()
	ms.reopen()
	s = ms.s
	a, _ = s.OpenDisk("a")
	b, _ = s.OpenDisk("b")
	defer a.Close()
	defer b.Close()
	if !bytes.Equal(mustRead(t, a, 0, size), wantA) || !bytes.Equal(mustRead(t, b, 0, size), want) {
		t.Fatal("after a reopen the disks read differently")
	}
	info, _ = s.Stat("a")
	if info.Shared != size-(1<<20)-4096 {
		t.Errorf("a shares %d bytes after the reopen, want %d", info.Shared, size-(1<<20)-4096)
	}

	// Removing a frees only a's own blocks: the 1 MiB b took, b's COW
	// block of "hello", and nothing b maps.
	free = s.Info().FreeBlocks
	a.Close()
	if err := s.Remove("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Info().FreeBlocks-free, uint64(1<<20+4096)/4096; got != want {
		t.Errorf("removing a freed %d blocks, want %d (its own only)", got, want)
	}
	if !bytes.Equal(mustRead(t, b, 0, size), want) {
		t.Fatal("b changed when a was removed")
	}
	if info, _ := s.Stat("b"); info.Shared != 0 {
		t.Errorf("b shares %d bytes with nobody", info.Shared)
	}
}

// TestCopyFromRanges copies ranges of every shape (shared whole blocks with
// copied edges, offsets placed differently in their blocks, within one
// disk, onto mapped ranges and holes, growing the target) and checks the
// disks against a model.
func TestCopyFromRanges(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	r := rand.New(rand.NewPCG(9, 9))
	const limit = 2 << 20
	hs := []*Disk{mustCreate(t, s, "x", 0), mustCreate(t, s, "y", 0)}
	m := &model{disks: map[string][]byte{}}
	names := []string{"x", "y"}
	for i := range hs {
		p := randomBytes(uint64(10+i), limit)
		mustWrite(t, hs[i], p, 0)
		m.write(names[i], p, 0)
		if err := hs[i].Punch(int64(r.IntN(limit/2)), 300<<10); err != nil {
			t.Fatal(err)
		}
	}
	for i, h := range hs {
		defer h.Close()
		m.disks[names[i]] = mustRead(t, h, 0, limit)
	}
	for step := range 300 {
		di, si := r.IntN(2), r.IntN(2)
		srcOff, n := randRange(r, 4096, limit)
		off := r.Int64N(limit/4096) * 4096
		switch r.IntN(3) {
		case 0:
			off = r.Int64N(limit)
		case 1:
			off += srcOff % 4096 // same place in its block: edges copied, middle shared
		}
		srcLen := int64(len(m.disks[names[si]]))
		got, err := hs[di].CopyFrom(hs[si], srcOff, off, n)
		if di == si && srcOff < off+n && off < srcOff+n && srcOff < srcLen {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("step %d: an overlapping copy within one disk: %v, want ErrInvalid", step, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: copy %s [%d,+%d) to %s at %d: %v", step, names[si], srcOff, n, names[di], off, err)
		}
		want := max(0, min(n, srcLen-srcOff))
		if got != want {
			t.Fatalf("step %d: copied %d, want %d", step, got, want)
		}
		if want > 0 {
			m.write(names[di], bytes.Clone(m.disks[names[si]][srcOff:srcOff+want]), off)
		}
		if r.IntN(4) == 0 { // and writes over shared blocks
			p := randomBytes(uint64(step), int(1+r.IntN(20000)))
			woff := r.Int64N(limit)
			mustWrite(t, hs[di], p, woff)
			m.write(names[di], p, woff)
		}
		for i, h := range hs {
			wantData := m.disks[names[i]]
			if got := mustRead(t, h, 0, int64(len(wantData))); !bytes.Equal(got, wantData) {
				t.Fatalf("step %d: disk %s differs from the model", step, names[i])
			}
		}
		if step%50 == 0 {
			if rep := s.Check(); !rep.Clean() {
				t.Fatalf("step %d: %v", step, rep.Findings)
			}
		}
	}
}

// TestSnapshot: a snapshot holds the disk as it was, refuses every change,
// can be copied and removed, and survives a reopen.
func TestSnapshot(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a := mustCreate(t, s, "a", 0)
	v1 := randomBytes(1, 4<<20)
	mustWrite(t, a, v1, 0)
	if _, err := s.Snapshot("a", "a-snap"); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, a, randomBytes(2, 1<<20), 1<<20)
	if err := a.Truncate(2 << 20); err != nil {
		t.Fatal(err)
	}
	snap, err := s.OpenDisk("a-snap")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mustRead(t, snap, 0, 4<<20), v1) {
		t.Fatal("the snapshot does not hold the disk as it was")
	}
	for what, err := range map[string]error{
		"write":      func() error { _, err := snap.WriteAt([]byte{1}, 0); return err }(),
		"truncate":   snap.Truncate(0),
		"punch":      snap.Punch(0, 4096),
		"zero range": snap.ZeroRange(0, 4096, true),
		"allocate":   snap.Allocate(8<<20, 4096, false),
		"copy into":  func() error { _, err := snap.CopyFrom(a, 0, 0, 4096); return err }(),
	} {
		if !errors.Is(err, ErrReadOnlyDisk) {
			t.Errorf("%s on a snapshot: %v, want ErrReadOnlyDisk", what, err)
		}
	}
	info, _ := s.Stat("a-snap")
	if !info.Snapshot || info.Origin != "a" || info.UUID == ([16]byte{}) {
		t.Errorf("a-snap: snapshot %v origin %q uuid %x", info.Snapshot, info.Origin, info.UUID)
	}
	// A clone of the snapshot is writable.
	c := mustCreate(t, s, "c", 0)
	if _, err := c.CopyFrom(snap, 0, 0, 4<<20); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, c, []byte("writable"), 0)
	snap.Close()
	a.Close()
	c.Close()
	ms.reopen()
	snap, _ = ms.s.OpenDisk("a-snap")
	defer snap.Close()
	if !bytes.Equal(mustRead(t, snap, 0, 4<<20), v1) {
		t.Fatal("after a reopen the snapshot reads differently")
	}
	if _, err := snap.WriteAt([]byte{1}, 0); !errors.Is(err, ErrReadOnlyDisk) {
		t.Errorf("write to a snapshot after a reopen: %v", err)
	}
	if again, _ := ms.s.Stat("a-snap"); again.UUID != info.UUID || !again.Snapshot {
		t.Errorf("after a reopen a-snap has uuid %x (was %x), snapshot %v", again.UUID, info.UUID, again.Snapshot)
	}
	if err := ms.s.Rename("a-snap", "renamed"); err != nil {
		t.Fatal(err)
	}
}

// TestSharedBlockWaitsForTheDrop: when one disk writes around a shared
// block, the other may not write into that block until the record that
// dropped the first disk's reference is durable: a power cut before it
// would give the first disk its old mapping back, over the other disk's
// new bytes. Every state a cut can leave must show each disk only its own
// bytes.
func TestSharedBlockWaitsForTheDrop(t *testing.T) {
	c, s := crashStore(t, 32<<20)
	a := mustCreate(t, s, "a", 0)
	b := mustCreate(t, s, "b", 0)
	defer a.Close()
	defer b.Close()
	a1, a2, b2 := bytes.Repeat([]byte{0xa1}, 4096), bytes.Repeat([]byte{0xa2}, 4096), bytes.Repeat([]byte{0xb2}, 4096)
	mustWrite(t, a, a1, 0)
	if _, err := b.CopyFrom(a, 0, 0, 4096); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, a, a2, 0) // around the shared block: its drop awaits a commit
	mustWrite(t, b, b2, 0) // must go around it too
	op := c.OpCount()
	rng := rand.New(rand.NewPCG(3, 3))
	for i := range 40 {
		mem := c.MemAt(op, rng, backend.RandomSubset)
		cs, err := Open(mem, testOptions())
		if err != nil {
			t.Fatalf("state %d: open: %v", i, err)
		}
		for name, ok := range map[string][][]byte{"a": {a1, a2}, "b": {a1, b2}} {
			h, err := cs.OpenDisk(name)
			if err != nil {
				t.Fatal(err)
			}
			got := mustRead(t, h, 0, 4096)
			if !bytes.Equal(got, ok[0]) && !bytes.Equal(got, ok[1]) {
				t.Fatalf("state %d: disk %s reads %#x..., none of its own writes", i, name, got[0])
			}
			h.Close()
		}
		if rep := cs.Check(); !rep.Clean() {
			t.Fatalf("state %d: %v", i, rep.Findings)
		}
		cs.Close()
	}
}

// TestSpaceOpsOnSharedBlocks: truncate, punch and zero range of a disk
// whose blocks another disk shares rewrite partial blocks around the
// shared copy and drop whole ones: the other disk never changes.
func TestSpaceOpsOnSharedBlocks(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{})
	s := ms.s
	a := mustCreate(t, s, "a", 0)
	defer a.Close()
	data := randomBytes(4, 64<<10)
	mustWrite(t, a, data, 0)
	var copies []*Disk
	for _, name := range []string{"b", "c", "d"} {
		h := mustCreate(t, s, name, 0)
		defer h.Close()
		if _, err := h.CopyFrom(a, 0, 0, int64(len(data))); err != nil {
			t.Fatal(err)
		}
		copies = append(copies, h)
	}
	if err := copies[0].Truncate(5000); err != nil {
		t.Fatal(err)
	}
	if err := copies[1].Punch(100, 9000); err != nil {
		t.Fatal(err)
	}
	if err := copies[2].ZeroRange(6000, 3000, true); err != nil {
		t.Fatal(err)
	}
	if err := a.Truncate(20000); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		if !bytes.Equal(mustRead(t, a, 0, 20000), data[:20000]) {
			t.Fatalf("%s: a changed", when)
		}
		want := map[int][]byte{0: data[:5000], 1: bytes.Clone(data), 2: bytes.Clone(data)}
		clear(want[1][100:9100])
		clear(want[2][6000:9000])
		for i, h := range copies {
			if got := mustRead(t, h, 0, int64(len(want[i]))); !bytes.Equal(got, want[i]) {
				t.Fatalf("%s: copy %d differs", when, i)
			}
		}
		if rep := s.Check(); !rep.Clean() {
			t.Fatalf("%s: %v", when, rep.Findings)
		}
	}
	check("before a commit")
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	check("after a commit")
}

// TestDefragLeavesSharedBlocks: defrag of a disk that shares blocks moves
// only its own: the shared ones stay shared (no block is stored twice),
// and both disks read as before.
func TestDefragLeavesSharedBlocks(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a := mustCreate(t, s, "a", 0)
	defer a.Close()
	data := randomBytes(7, 4<<20)
	mustWrite(t, a, data, 0)
	b := mustCreate(t, s, "b", 0)
	defer b.Close()
	if _, err := b.CopyFrom(a, 0, 0, int64(len(data))); err != nil {
		t.Fatal(err)
	}
	// Fragment b's own blocks: overwrite every other 4 KiB block (each
	// goes copy-on-write to new blocks).
	want := bytes.Clone(data)
	for off := 0; off < len(data); off += 8192 {
		p := randomBytes(uint64(off), 4096)
		mustWrite(t, b, p, int64(off))
		copy(want[off:], p)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	before, _ := s.Stat("b")
	used := s.Info().FreeBlocks
	if _, err := s.Defrag("b", nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	after, _ := s.Stat("b")
	if after.Shared != before.Shared {
		t.Errorf("b shares %d bytes after defrag, %d before", after.Shared, before.Shared)
	}
	if got := s.Info().FreeBlocks; got != used {
		t.Errorf("free blocks %d after defrag, %d before: shared blocks were copied", got, used)
	}
	if !bytes.Equal(mustRead(t, b, 0, int64(len(want))), want) || !bytes.Equal(mustRead(t, a, 0, int64(len(data))), data) {
		t.Fatal("defrag changed what a disk reads")
	}
}

// TestFreeBlocksWithSharedDrops: Info counts as free only what the next
// commit frees: a write around, or a punch of, shared blocks frees none of
// them, while the new blocks of a copy-on-write are used at once.
func TestFreeBlocksWithSharedDrops(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a := mustCreate(t, s, "a", 0)
	defer a.Close()
	mustWrite(t, a, randomBytes(1, 8<<20), 0)
	b := mustCreate(t, s, "b", 0)
	defer b.Close()
	if _, err := b.CopyFrom(a, 0, 0, 8<<20); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	free := s.Info().FreeBlocks
	mustWrite(t, b, randomBytes(2, 1<<20), 1<<20) // 256 new blocks, the old ones stay a's
	if got, want := s.Info().FreeBlocks, free-256; got != want {
		t.Errorf("after a copy-on-write of 1 MiB: %d free blocks, want %d", got, want)
	}
	if err := b.Punch(4<<20, 1<<20); err != nil { // shared: frees nothing
		t.Fatal(err)
	}
	if got, want := s.Info().FreeBlocks, free-256; got != want {
		t.Errorf("after punching shared blocks: %d free blocks, want %d", got, want)
	}
	if err := b.Punch(1<<20, 1<<20); err != nil { // b's own: freed at the commit
		t.Fatal(err)
	}
	if got := s.Info().FreeBlocks; got != free {
		t.Errorf("after punching b's own blocks: %d free blocks, want %d", got, free)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if got := s.Info().FreeBlocks; got != free {
		t.Errorf("after the commit: %d free blocks, want %d", got, free)
	}
}

// TestClone: Store.Clone makes a writable disk sharing every block of a
// disk with holes, in one step and with no data I/O; writes to either side
// leave the other as it was, holes stay holes, and the clone survives a
// reopen as a clone of its origin; Check stays clean.
func TestClone(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a := mustCreate(t, s, "a", 16<<20)
	v1 := randomBytes(3, 2<<20)
	mustWrite(t, a, v1, 4<<20) // the rest of a is holes
	before := s.Counters()
	info, err := s.Clone("a", "b")
	if err != nil {
		t.Fatal(err)
	}
	if after := s.Counters(); after.DataWriteBytes != before.DataWriteBytes {
		t.Errorf("the clone wrote %d data bytes", after.DataWriteBytes-before.DataWriteBytes)
	}
	if st, _ := s.Stat("b"); !info.Clone || !st.Clone || st.Snapshot || st.Origin != "a" || st.Size != 16<<20 || st.Shared != 2<<20 || st.Allocated != 2<<20 {
		t.Errorf("b: %+v", st)
	}
	if _, err := s.Clone("a", "b"); !errors.Is(err, ErrExist) {
		t.Errorf("clone onto an existing name: %v", err)
	}
	if _, err := s.Clone("missing", "x"); !errors.Is(err, ErrNotExist) {
		t.Errorf("clone of a missing disk: %v", err)
	}
	b, err := s.OpenDisk("b")
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, b, randomBytes(4, 1<<20), 4<<20)     // over shared blocks
	mustWrite(t, b, randomBytes(5, 1<<20), 12<<20)    // into a hole
	mustWrite(t, a, randomBytes(6, 4096), 5<<20+4096) // the origin changes too
	wantA := make([]byte, 16<<20)
	copy(wantA[4<<20:], v1)
	copy(wantA[5<<20+4096:], randomBytes(6, 4096))
	wantB := make([]byte, 16<<20)
	copy(wantB[4<<20:], v1)
	copy(wantB[4<<20:], randomBytes(4, 1<<20))
	copy(wantB[12<<20:], randomBytes(5, 1<<20))
	check := func(when string) {
		t.Helper()
		for name, want := range map[string][]byte{"a": wantA, "b": wantB} {
			if got := readAll(t, ms.s, name); !bytes.Equal(got, want) {
				t.Errorf("%s: disk %s differs", when, name)
			}
		}
		if rep := ms.s.Check(); !rep.Clean() {
			t.Errorf("%s: check: %v", when, rep.Findings)
		}
	}
	check("after writes to both")
	a.Close()
	b.Close()
	ms.reopen()
	check("after a reopen")
	if got, _ := ms.s.Stat("b"); !got.Clone || got.Origin != "a" {
		t.Errorf("after a reopen b is clone %v of %q", got.Clone, got.Origin)
	}
}

// TestCloneHasNoUUID: a snapshot gets an identity, a clone (writable)
// none, by Store.Clone or by a whole-disk CopyFrom; FindUUID finds only a
// snapshot, also when a clone carries an identity (as clones made by
// earlier builds do): such a clone may have been written since.
func TestCloneHasNoUUID(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a := mustCreate(t, s, "a", 0)
	mustWrite(t, a, randomBytes(7, 1<<20), 0)
	snap, err := s.Snapshot("a", "snap")
	if err != nil {
		t.Fatal(err)
	}
	clone, err := s.Clone("a", "clone")
	if err != nil {
		t.Fatal(err)
	}
	if snap.UUID == ([16]byte{}) || clone.UUID != ([16]byte{}) {
		t.Errorf("snapshot uuid %x, clone uuid %x: want one and none", snap.UUID, clone.UUID)
	}
	if name, ok := s.FindUUID(snap.UUID); !ok || name != "snap" {
		t.Errorf("FindUUID(snap) = %q, %v", name, ok)
	}
	// A clone of a snapshot with a legacy identity: not a base.
	c2, err := s.Clone("snap", "clone-of-snap")
	if err != nil {
		t.Fatal(err)
	}
	if c2.UUID != ([16]byte{}) {
		t.Errorf("clone of a snapshot has uuid %x", c2.UUID)
	}
	legacy := [16]byte{0xcc, 1}
	s.mu.Lock()
	s.mu.names["clone"].uuid = legacy
	s.mu.Unlock()
	if name, ok := s.FindUUID(legacy); ok {
		t.Errorf("FindUUID matched the writable clone %q", name)
	}
	a.Close()
}

// TestSnapshotHidden: a hidden snapshot reads as its source did when it
// was taken, whatever is written to the source afterwards; it has no name
// and no identity, cannot be written, and is gone (its blocks back) when
// its handle closes, or at the next open after the store went down with
// it open.
func TestSnapshotHidden(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	a := mustCreate(t, s, "a", 0)
	v1 := randomBytes(8, 2<<20)
	mustWrite(t, a, v1, 0)
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	free := s.Info().FreeBlocks
	h, err := s.SnapshotHidden("a")
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, a, randomBytes(9, 1<<20), 512<<10) // copy on write
	if got := mustRead(t, h, 0, 2<<20); !bytes.Equal(got, v1) {
		t.Error("the hidden snapshot reads a later write")
	}
	if st := h.Stat(); !st.Snapshot || st.UUID != ([16]byte{}) || st.Size != 2<<20 {
		t.Errorf("hidden snapshot: %+v", st)
	}
	if _, err := h.WriteAt([]byte{1}, 0); !errors.Is(err, ErrReadOnlyDisk) {
		t.Errorf("write to a hidden snapshot: %v", err)
	}
	if l := s.List(); len(l) != 1 {
		t.Errorf("disks listed: %+v", l)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	// a's rewritten 1 MiB took new blocks; its old copy, the hidden
	// snapshot's alone, is free again.
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Info().FreeBlocks, free; got != want {
		t.Errorf("after closing: %d free blocks, want %d", got, want)
	}

	// Left open when the store goes down: deleted at the next open.
	if _, err := s.SnapshotHidden("a"); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, a, randomBytes(10, 1<<20), 0)
	a.Close()
	ms.reopen()
	if err := ms.s.Commit(); err != nil {
		t.Fatal(err)
	}
	if l := ms.s.List(); len(l) != 1 {
		t.Errorf("disks after a reopen: %+v", l)
	}
	if got, want := ms.s.Info().FreeBlocks, free; got != want {
		t.Errorf("after a reopen: %d free blocks, want %d", got, want)
	}
}
