package image

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/image/backend"
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

// TestCommitData: fdatasync's commit leaves the times out, so after
// overwrites in place it is one flush and no journal write; after a write
// into a hole it commits the map (two flushes). The times are still
// committed by the next full Commit.
func TestCommitData(t *testing.T) {
	ms := newMemStore(t, 64<<20, FormatOptions{})
	d := mustCreate(t, ms.s, "a", 1<<20)
	defer d.Close()
	block := bytes.Repeat([]byte{0xcd}, 4096)
	if _, err := d.WriteAt(block, 0); err != nil {
		t.Fatal(err)
	}
	if err := ms.s.Commit(); err != nil {
		t.Fatal(err)
	}
	c := func() CounterSnapshot { return ms.s.Metrics().Counters }
	steps := []struct {
		name             string
		op               func() error
		flushes, commits uint64
	}{
		{"overwrite, SyncData", func() error { _, err := d.WriteAt(block, 0); return err }, 1, 0},
		{"write into a hole, SyncData", func() error { _, err := d.WriteAt(block, 8192); return err }, 2, 1},
		{"nothing, SyncData", func() error { return nil }, 0, 0},
	}
	for _, st := range steps {
		if err := st.op(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		before := c()
		if err := d.SyncData(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		after := c()
		if f, n := after.Flushes-before.Flushes, after.Commits-before.Commits; f != st.flushes || n != st.commits {
			t.Errorf("%s: %d flushes and %d journal commits, want %d and %d", st.name, f, n, st.flushes, st.commits)
		}
	}
	before := c()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	if n := c().Commits - before.Commits; n != 1 {
		t.Errorf("Sync after SyncData: %d journal commits, want 1 (the times)", n)
	}
}

// slowFlush is a backend whose flushes take a while, as a device's cache
// flush does.
type slowFlush struct {
	backend.Backend
	delay time.Duration
}

func (b slowFlush) Flush() error {
	time.Sleep(b.delay)
	return b.Backend.Flush()
}

// TestGroupCommit: 32 writers each making a write durable at once
// (O_DSYNC: WriteAt then SyncData) share commits and flushes instead of
// paying for one each, in series: a writer that arrives while a commit is
// in progress is covered by the next one, with everyone else who arrived
// meanwhile.
func TestGroupCommit(t *testing.T) {
	const writers = 32
	for _, hole := range []bool{false, true} {
		mem := backend.NewMem(64 << 20)
		if err := Format(mem, FormatOptions{}); err != nil {
			t.Fatal(err)
		}
		s, err := Open(slowFlush{mem, 20 * time.Millisecond}, testOptions())
		if err != nil {
			t.Fatal(err)
		}
		d := mustCreate(t, s, "a", writers<<12)
		block := make([]byte, 4096)
		if !hole {
			for i := range writers {
				if _, err := d.WriteAt(block, int64(i)<<12); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := s.Commit(); err != nil {
			t.Fatal(err)
		}
		before := s.Metrics().Counters
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for i := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := bytes.Repeat([]byte{byte(i + 1)}, 4096)
				if _, err := d.WriteAt(p, int64(i)<<12); err != nil {
					errs <- err
					return
				}
				errs <- d.SyncData()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		after := s.Metrics().Counters
		flushes, commits := after.Flushes-before.Flushes, after.Commits-before.Commits
		t.Logf("hole %v: %d synchronous writers, %d flushes, %d journal commits", hole, writers, flushes, commits)
		if flushes > writers/4 {
			t.Errorf("hole %v: %d synchronous writers cost %d flushes: they do not share them", hole, writers, flushes)
		}
		d.Close()
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
