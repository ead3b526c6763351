package image

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestDiffSnapshots: the changes between two snapshots of a disk are
// exactly the blocks written or punched between them, found from the maps
// alone (no data read).
func TestDiffSnapshots(t *testing.T) {
	ms := newMemStore(t, 128<<20, FormatOptions{})
	s := ms.s
	const size = 16 << 20
	a := mustCreate(t, s, "a", 0)
	defer a.Close()
	mustWrite(t, a, randomBytes(1, size), 0)
	if err := a.Punch(2<<20, 1<<20); err != nil { // a hole in both snapshots
		t.Fatal(err)
	}
	if _, err := s.Snapshot("a", "s1"); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(2, 2))
	changed := make([]byte, size/4096) // per block: 0 same, 'd' data, 'z' zeros
	for range 40 {
		off := r.Int64N(size/4096) * 4096
		n := min(int64(1+r.IntN(8))*4096, size-off)
		if r.IntN(4) == 0 {
			if err := a.Punch(off, n); err != nil {
				t.Fatal(err)
			}
			for b := off / 4096; b < (off+n)/4096; b++ {
				changed[b] = 'z' // s1 has data there, s2 a hole
				if inHole(b) {
					changed[b] = 0 // a hole in both
				}
			}
			continue
		}
		mustWrite(t, a, randomBytes(uint64(off), int(n)), off)
		for b := off / 4096; b < (off+n)/4096; b++ {
			changed[b] = 'd'
		}
	}
	if _, err := s.Snapshot("a", "s2"); err != nil {
		t.Fatal(err)
	}
	s1, _ := s.OpenDisk("s1")
	s2, _ := s.OpenDisk("s2")
	defer s1.Close()
	defer s2.Close()
	reads := s.Counters().DataReadBytes
	changes, st, err := Diff(s1, s2)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Counters().DataReadBytes - reads; got != 0 || !st.Related {
		t.Errorf("diff of two snapshots read %d data bytes (related %v), want none", got, st.Related)
	}
	got := make([]byte, size/4096)
	for _, c := range changes {
		kind := byte('d')
		if c.Zero {
			kind = 'z'
		}
		for b := c.Off / 4096; b < (c.Off+c.Len)/4096; b++ {
			got[b] = kind
		}
	}
	if !bytes.Equal(got, changed) {
		for b := range got {
			if got[b] != changed[b] {
				t.Fatalf("block %d: diff says %q, the writes say %q", b, got[b], changed[b])
			}
		}
	}
}

// inHole: the blocks TestDiffSnapshots punched before the first snapshot.
func inHole(b int64) bool { return b >= (2<<20)/4096 && b < (3<<20)/4096 }

// TestDiffUnrelated: disks that share nothing are compared by their data
// where both map blocks; a complete diff (no old disk) lists every mapped
// range.
func TestDiffUnrelated(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	s := ms.s
	data := randomBytes(3, 1<<20)
	x, y := mustCreate(t, s, "x", 0), mustCreate(t, s, "y", 0)
	defer x.Close()
	defer y.Close()
	mustWrite(t, x, data, 0)
	mustWrite(t, y, data, 0)
	mustWrite(t, y, []byte("changed"), 300<<10+5)
	mustWrite(t, y, randomBytes(4, 8192), 2<<20) // past x's end
	changes, st, err := Diff(x, y)
	if err != nil {
		t.Fatal(err)
	}
	want := []Change{{Off: 300 << 10, Len: 4096}, {Off: 2 << 20, Len: 8192}}
	if st.Related || st.ComparedBytes == 0 || len(changes) != len(want) || changes[0] != want[0] || changes[1] != want[1] {
		t.Fatalf("diff %+v (%+v), want %+v", changes, st, want)
	}
	full, _, err := Diff(nil, y)
	if err != nil {
		t.Fatal(err)
	}
	if len(full) != 2 || full[0] != (Change{Off: 0, Len: 1 << 20}) || full[1] != (Change{Off: 2 << 20, Len: 8192}) {
		t.Fatalf("complete diff %+v", full)
	}
}
