package image

import (
	"bytes"
	"testing"
)

// TestCommitFlushes counts the flushes each kind of commit costs: two when
// a record maps blocks (the data first, then the commit), one when no
// record points to data (times after overwrites, a punch), none when
// nothing changed. The crash rules behind the counts are covered by
// TestCrashConsistency, which cuts power between any two flushes.
func TestCommitFlushes(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	d := mustCreate(t, ms.s, "a", 1<<20)
	defer d.Close()
	if err := ms.s.Commit(); err != nil {
		t.Fatal(err)
	}
	flushes := func() uint64 { return ms.s.Metrics().Counters.Flushes }
	block := bytes.Repeat([]byte{0xab}, 4096)

	steps := []struct {
		name string
		op   func() error
		want uint64
	}{
		{"write into a hole (map record)", func() error { _, err := d.WriteAt(block, 0); return err }, 2},
		{"overwrite (times only)", func() error { _, err := d.WriteAt(block, 0); return err }, 1},
		{"nothing", func() error { return nil }, 0},
		{"punch (no map record)", func() error { return d.Punch(0, 4096) }, 1},
		{"write into a hole and overwrite (map record)", func() error {
			if _, err := d.WriteAt(block, 8192); err != nil {
				return err
			}
			_, err := d.WriteAt(block, 8192)
			return err
		}, 2},
	}
	for _, st := range steps {
		if err := st.op(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		before := flushes()
		if err := ms.s.Commit(); err != nil {
			t.Fatalf("%s: commit: %v", st.name, err)
		}
		if got := flushes() - before; got != st.want {
			t.Errorf("%s: commit flushed %d times, want %d", st.name, got, st.want)
		}
	}
	ms.reopen()
	d2, err := ms.s.OpenDisk("a")
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	got := make([]byte, 12288)
	if _, err := d2.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 12288)
	copy(want[8192:], block)
	if !bytes.Equal(got, want) {
		t.Errorf("after reopen the disk does not hold the punch and the last write")
	}
}
