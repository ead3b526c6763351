package image

import (
	"bytes"
	"math/rand/v2"
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

// TestWriteAtSync: a synchronous write is durable when it returns. An
// O_DSYNC overwrite in place of durable mappings is a durable (FUA) write
// and nothing else: no flush, no journal commit. Into a hole, while other
// records are pending, or with all (O_SYNC), it commits. Each case is
// checked by cutting power right after it returns, dropping every write
// not made durable.
func TestWriteAtSync(t *testing.T) {
	c, s := crashStore(t, 64<<20)
	d := mustCreate(t, s, "a", 1<<20)
	defer d.Close()
	old := bytes.Repeat([]byte{0x11}, 8192)
	if _, err := d.WriteAt(old, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name             string
		off              int64
		n                int
		all              bool
		before           func() error // an unsynced change before the write
		durable          uint64       // durable (FUA) writes it makes
		flushes, commits uint64
	}{
		{name: "overwrite in place, aligned", off: 0, n: 4096, durable: 1},
		{name: "overwrite in place, unaligned", off: 4096 + 100, n: 1000, durable: 1},
		{name: "overwrite after the timer's unflushed commit of times", off: 0, n: 4096, durable: 1,
			before: func() error {
				if _, err := d.WriteAt(old[:4096], 0); err != nil {
					return err
				}
				return s.commitBackground()
			}},
		{name: "into a hole", off: 64 << 10, n: 4096, flushes: 2, commits: 1},
		{name: "overwrite while a record is pending", off: 0, n: 4096, flushes: 2, commits: 1,
			before: func() error { _, err := d.WriteAt(old[:4096], 128<<10); return err }},
		{name: "overwrite, all (O_SYNC)", off: 0, n: 4096, all: true, flushes: 1, commits: 1},
		{name: "growing the disk", off: 1 << 20, n: 4096, flushes: 2, commits: 1},
	}
	for i, st := range steps {
		if st.before != nil {
			if err := st.before(); err != nil {
				t.Fatal(err)
			}
		}
		p := bytes.Repeat([]byte{byte(0x20 + i)}, st.n)
		before := s.Metrics().Counters
		if n, err := d.WriteAtSync(p, st.off, st.all); err != nil || n != st.n {
			t.Fatalf("%s: WriteAtSync: %d, %v", st.name, n, err)
		}
		after := s.Metrics().Counters
		if got := [3]uint64{after.DurableWrites - before.DurableWrites, after.Flushes - before.Flushes, after.Commits - before.Commits}; got != [3]uint64{st.durable, st.flushes, st.commits} {
			t.Errorf("%s: %d durable writes, %d flushes, %d commits; want %d, %d, %d", st.name, got[0], got[1], got[2], st.durable, st.flushes, st.commits)
		}
		cut, err := Open(c.MemAt(c.OpCount(), nil, backend.DropUnflushed), Options{CommitInterval: -1, Logger: quietLogger()})
		if err != nil {
			t.Fatalf("%s: open after a power cut: %v", st.name, err)
		}
		h, err := cut.OpenDisk("a")
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, st.n)
		if _, err := h.ReadAt(got, st.off); err != nil {
			t.Fatalf("%s: read after a power cut: %v", st.name, err)
		}
		if !bytes.Equal(got, p) {
			t.Errorf("%s: after a power cut right after it returned, the write is not there", st.name)
		}
		h.Close()
		cut.Close()
	}
}

// TestCommitBackground: the commit timer's commit of the disks' times alone
// is written without a flush; the next Sync flushes it although nothing new
// is pending, so a power cut after that Sync keeps the times, and one right
// after the timer's commit opens a clean store with the older times. Any
// other record makes the timer's commit flush as Commit's does.
func TestCommitBackground(t *testing.T) {
	c, s, d, block := committedBlock(t)
	synced := d.Stat().Mtime
	counters := func() CounterSnapshot { return s.Metrics().Counters }
	steps := []struct {
		name                        string
		op                          func() error
		flushes, commits, unflushed uint64
		durable                     bool
	}{
		{"overwrite, timer", func() error {
			if _, err := d.WriteAt(block, 0); err != nil {
				return err
			}
			return s.commitBackground()
		}, 0, 1, 1, false},
		{"nothing, timer", s.commitBackground, 0, 0, 0, false},
		{"nothing new, Sync", d.Sync, 1, 0, 0, true},
		{"nothing, Sync", d.Sync, 0, 0, 0, true},
		{"overwrite, SyncData, timer", func() error {
			if _, err := d.WriteAt(block, 0); err != nil {
				return err
			}
			if err := d.SyncData(); err != nil { // flushes the data, leaves the times
				return err
			}
			return s.commitBackground()
		}, 1, 1, 1, false},
		{"no new write, Sync", d.Sync, 1, 0, 0, true},
		{"overwrite and chmod, timer", func() error {
			if _, err := d.WriteAt(block, 0); err != nil {
				return err
			}
			mode := uint32(0o600)
			if err := d.SetAttr(AttrChange{Mode: &mode}); err != nil {
				return err
			}
			return s.commitBackground()
		}, 1, 1, 0, true},
		{"write into a hole, timer", func() error {
			if _, err := d.WriteAt(block, 8192); err != nil {
				return err
			}
			return s.commitBackground()
		}, 2, 1, 0, true},
	}
	var lazyOp, syncOp int
	var lazyMtime time.Time
	for _, st := range steps {
		before := counters()
		if err := st.op(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		after := counters()
		f, n, u := after.Flushes-before.Flushes, after.Commits-before.Commits, after.UnflushedCommits-before.UnflushedCommits
		if f != st.flushes || n != st.commits || u != st.unflushed {
			t.Errorf("%s: %d flushes, %d commits (%d unflushed); want %d, %d (%d)", st.name, f, n, u, st.flushes, st.commits, st.unflushed)
		}
		if got := s.recordsDurable(); got != st.durable {
			t.Errorf("%s: every record durable = %v, want %v", st.name, got, st.durable)
		}
		switch st.name {
		case "overwrite, timer":
			lazyOp, lazyMtime = c.OpCount(), d.Stat().Mtime
		case "nothing new, Sync":
			syncOp = c.OpCount()
		}
	}
	d.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if !lazyMtime.After(synced) {
		t.Fatalf("the overwrite did not move the modification time (%v, %v)", synced, lazyMtime)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, cut := range []struct {
		name string
		op   int
		want time.Time
	}{
		{"after the timer's commit", lazyOp, synced},
		{"after the Sync", syncOp, lazyMtime},
	} {
		s2, err := Open(c.MemAt(cut.op, rng, backend.DropUnflushed), Options{CommitInterval: -1, Logger: quietLogger()})
		if err != nil {
			t.Fatalf("power cut %s: open: %v", cut.name, err)
		}
		if rep := s2.Check(); !rep.Clean() {
			t.Errorf("power cut %s: check: %v", cut.name, rep.Findings)
		}
		info, err := s2.Stat("a")
		if err != nil {
			t.Fatalf("power cut %s: %v", cut.name, err)
		}
		if !info.Mtime.Equal(cut.want) {
			t.Errorf("power cut %s: modification time %v, want %v", cut.name, info.Mtime, cut.want)
		}
		s2.Close()
	}
}

// TestCommitBackgroundReplaced: while the timer's unflushed commit is the
// journal's last, the next commit is written over it (Store.lazy), so that
// no power cut finds a commit after one it lost (which replay must take
// for damage in the middle of the journal). Two timer ticks over
// overwrites, then a chmod and a Sync: the second tick's commit and the
// chmod's each replace the one before, and a power cut at every point,
// losing, keeping or tearing each unflushed write, opens clean.
func TestCommitBackgroundReplaced(t *testing.T) {
	c, s, d, block := committedBlock(t)
	first := c.OpCount()
	tick := func() {
		t.Helper()
		time.Sleep(time.Millisecond) // a later modification time
		if _, err := d.WriteAt(block, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.commitBackground(); err != nil {
			t.Fatal(err)
		}
	}
	tick()
	lazyAt := s.jOff
	tick()
	if s.jOff != lazyAt {
		t.Fatalf("the second unflushed commit ends at journal byte %d, want %d: it went after the first instead of over it", s.jOff, lazyAt)
	}
	if got := s.Metrics().Counters.UnflushedCommits; got != 2 {
		t.Fatalf("%d commits written without a flush, want 2", got)
	}
	if s.lazy.count != 1 {
		t.Fatalf("the unflushed commit holds %d records after two ticks over one disk, want 1 (the later times)", s.lazy.count)
	}
	mode := uint32(0o600)
	if err := d.SetAttr(AttrChange{Mode: &mode}); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	last := c.OpCount()
	d.Close()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(3, 4))
	for op := first; op <= last; op++ {
		for _, mode := range []backend.CrashMode{backend.DropUnflushed, backend.RandomSubset, backend.Torn} {
			for try := 0; try < 4; try++ {
				s2, err := Open(c.MemAt(op, rng, mode), Options{CommitInterval: -1, Logger: quietLogger()})
				if err != nil {
					t.Fatalf("power cut after op %d (%s): open: %v", op, mode, err)
				}
				if rep := s2.Check(); !rep.Clean() {
					t.Errorf("power cut after op %d (%s): check: %v", op, mode, rep.Findings)
				}
				info, err := s2.Stat("a")
				if err != nil {
					t.Fatal(err)
				}
				if op == last && info.Mode&0o777 != 0o600 {
					t.Errorf("power cut after the Sync (%s): mode %o, want 600", mode, info.Mode)
				}
				s2.Close()
			}
		}
	}
}

// committedBlock formats a crash backend, opens it with the timer off, and
// makes disk "a" (1 MiB) with its first block written and committed; it
// returns the backend, the store, the disk and the block.
func committedBlock(t *testing.T) (*backend.Crash, *Store, *Disk, []byte) {
	t.Helper()
	c := backend.NewCrash(64 << 20)
	if err := Format(c, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(c, Options{CommitInterval: -1, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	d := mustCreate(t, s, "a", 1<<20)
	block := bytes.Repeat([]byte{0xab}, 4096)
	if _, err := d.WriteAt(block, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	return c, s, d, block
}

// TestDropSupersededTimes: a disk's later times record replaces its
// earlier one in a lazy commit; other disks' records stay, in order.
func TestDropSupersededTimes(t *testing.T) {
	times := func(id uint64, mtime int64) record {
		return record{Type: recAttr, ID: id, Attr: diskAttr{Mode: 0o644, Mtime: mtime}}
	}
	encode := func(rs ...record) ([]byte, uint32) {
		var b []byte
		for i := range rs {
			b = appendRecord(b, &rs[i])
		}
		return b, uint32(len(rs))
	}
	older, on := encode(times(1, 10), times(2, 10), times(3, 10))
	newer, nn := encode(times(2, 20))
	kept, n := dropSupersededTimes(older, on, newer, nn)
	got, err := decodeRecords(kept, n)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != times(1, 10) || got[1] != times(3, 10) {
		t.Fatalf("kept %+v, want disks 1 and 3 at their earlier times", got)
	}
}

// recordsDurable reports whether every journal record appended so far,
// the disks' dirty times included, is durable (mappingsDurable leaves the
// times out).
func (s *Store) recordsDurable() bool {
	s.mu.Lock()
	appended := s.mu.recGen
	s.mu.Unlock()
	return s.durableRec.Load() >= appended
}
