package image

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// Tests for the bugs the review in issue 16 found.

// crashStore formats and opens a store on a Crash backend of size bytes;
// at cleanup it checks and closes the store. Not Strict: the strict check
// after a commit waits for every change under way, and these tests commit
// while one waits for them.
func crashStore(t *testing.T, size int64) (*backend.Crash, *Store) {
	t.Helper()
	c := backend.NewCrash(size)
	c.CheckAlignment(512)
	if err := Format(c, FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.Strict = false
	s, err := Open(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if rep := s.Check(); !rep.Clean() {
			t.Errorf("check at cleanup: %v", rep.Findings)
		}
		s.Close()
	})
	return c, s
}

// pauseOn makes the first backend operation that match accepts wait,
// before it runs, until the returned release is called; reached is closed
// when it starts waiting.
func pauseOn(c *backend.Crash, match func(backend.Op) bool) (reached <-chan struct{}, release func()) {
	r, g := make(chan struct{}), make(chan struct{})
	var once sync.Once
	c.SetFault(func(op backend.Op) error {
		hit := false
		if match(op) {
			once.Do(func() { hit = true })
		}
		if hit {
			close(r)
			<-g
		}
		return nil
	})
	return r, func() { close(g) }
}

// TestGrowNeverShrinks: a growing Allocate or ZeroRange reads the size
// when it starts; a write past its range that grows the disk while it runs
// (here: while its backend I/O is held up) must keep its size and its
// blocks. Before the fix the fallocate set its own, smaller, end as the
// size: the disk shrank back and the write's blocks were freed.
func TestGrowNeverShrinks(t *testing.T) {
	const bs = 4096
	for _, tt := range []struct {
		name  string
		setup func(d *Disk) error // before the fallocate
		op    func(d *Disk) error // the growing fallocate, to 1 MiB
		pause func(backend.Op) bool
	}{
		{
			name:  "allocate",
			setup: func(d *Disk) error { return nil },
			op:    func(d *Disk) error { return d.Allocate(0, 1<<20, false) },
			pause: func(op backend.Op) bool { return op.Kind == backend.OpWriteZeroes },
		},
		{
			name: "zero range",
			setup: func(d *Disk) error {
				_, err := d.WriteAt(bytes.Repeat([]byte{0x11}, 2*bs), 0)
				return err
			},
			// Zeroes part of block 1 in place (a read-modify-write),
			// then grows.
			op:    func(d *Disk) error { return d.ZeroRange(bs+100, 1<<20-bs-100, false) },
			pause: func(op backend.Op) bool { return op.Kind == backend.OpRead },
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, s := crashStore(t, 64<<20)
			d := mustCreate(t, s, "a", 0)
			defer d.Close()
			if err := tt.setup(d); err != nil {
				t.Fatal(err)
			}
			reached, release := pauseOn(c, tt.pause)
			done := make(chan error, 1)
			go func() { done <- tt.op(d) }()
			<-reached
			// The fallocate holds blocks [0, 256) and waits in its I/O; a
			// write at 2 MiB does not conflict with it and grows the disk.
			p := bytes.Repeat([]byte{0x5a}, bs)
			if _, err := d.WriteAt(p, 2<<20); err != nil {
				t.Fatal(err)
			}
			want := int64(2<<20 + bs)
			if got := d.Size(); got != want {
				t.Fatalf("size after the write: %d, want %d", got, want)
			}
			release()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := d.Size(); got != want {
				t.Fatalf("size after the fallocate: %d, want %d: a grow lowered the size", got, want)
			}
			got := make([]byte, bs)
			if _, err := d.ReadAt(got, 2<<20); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, p) {
				t.Fatalf("the write at 2 MiB reads back as %x…, want %x…", got[:4], p[:4])
			}
			if err := d.Sync(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRenameMissingSourceKeepsTarget: renaming a disk that does not exist
// over one that does fails and leaves the target as it was, also after
// a commit and a reopen. Before the fix the target was removed first.
func TestRenameMissingSourceKeepsTarget(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{})
	b := mustCreate(t, ms.s, "b.raw", 0)
	if _, err := b.WriteAt([]byte("bbbb"), 0); err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := ms.s.Rename("missing.raw", "b.raw"); !errors.Is(err, ErrNotExist) {
		t.Fatalf("rename of a missing disk: %v, want ErrNotExist", err)
	}
	if err := ms.s.Commit(); err != nil {
		t.Fatal(err)
	}
	ms.reopen()
	if _, err := ms.s.Stat("b.raw"); err != nil {
		t.Fatalf("the target of a failed rename is gone: %v", err)
	}
	if got := readAll(t, ms.s, "b.raw"); string(got) != "bbbb" {
		t.Fatalf("the target of a failed rename holds %q, want %q", got, "bbbb")
	}
}

// TestRenameOverOpenDisk: a disk renamed over stays readable through its
// open handles until the last closes, which frees it; after a reopen only
// the renamed disk is there.
func TestRenameOverOpenDisk(t *testing.T) {
	ms := newMemStore(t, 16<<20, FormatOptions{})
	a := mustCreate(t, ms.s, "a.raw", 0)
	if _, err := a.WriteAt([]byte("aaaa"), 0); err != nil {
		t.Fatal(err)
	}
	a.Close()
	b := mustCreate(t, ms.s, "b.raw", 0)
	if _, err := b.WriteAt([]byte("bbbb"), 0); err != nil {
		t.Fatal(err)
	}
	if err := ms.s.Rename("a.raw", "b.raw"); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := b.ReadAt(got, 0); err != nil || string(got) != "bbbb" {
		t.Fatalf("the replaced disk's open handle reads %q, %v; want %q", got, err, "bbbb")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ms.reopen()
	if got := readAll(t, ms.s, "b.raw"); string(got) != "aaaa" {
		t.Fatalf("after the rename over an open disk b.raw holds %q", got)
	}
	if n := len(ms.s.List()); n != 1 {
		t.Fatalf("%d disks, want 1", n)
	}
}

// TestRenameOverIsAtomic cuts power at every point of a rename over an
// existing disk, with a commit arranged in its middle: while the rename
// waits for the source's lock (held here by the test), anything it has
// done already is committed. Every state after a cut must hold either both
// disks as they were or the source under the target's name, never the
// target gone and the source not renamed. Before the fix the target's
// removal was journalled before the source was even locked.
func TestRenameOverIsAtomic(t *testing.T) {
	c, s := crashStore(t, 16<<20)
	for _, n := range []string{"src.raw", "dst.raw"} {
		d := mustCreate(t, s, n, 0)
		if _, err := d.WriteAt(bytes.Repeat([]byte(n[:1]), 4096), 0); err != nil {
			t.Fatal(err)
		}
		d.Close()
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	start := c.OpCount()

	s.mu.Lock()
	src := s.mu.names["src.raw"]
	s.mu.Unlock()
	src.mu.Lock()
	done := make(chan error, 1)
	go func() { done <- s.Rename("src.raw", "dst.raw") }()
	// Give the rename the time to do whatever it does before it needs the
	// source (the unfixed one removed the target at once), then commit it.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if _, err := s.Stat("dst.raw"); err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}
	src.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(); err != nil {
		t.Fatal(err)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	for op := start; op <= c.OpCount(); op++ {
		for _, mode := range []backend.CrashMode{backend.DropUnflushed, backend.RandomSubset, backend.RandomSubset} {
			where := fmt.Sprintf("power cut after op %d (%s)", op, mode)
			s2, err := Open(c.MemAt(op, rng, mode), Options{CommitInterval: -1, Logger: quietLogger()})
			if err != nil {
				t.Fatalf("%s: open: %v", where, err)
			}
			var names []string
			for _, info := range s2.List() {
				names = append(names, info.Name+"="+string(readAll(t, s2, info.Name)[:1]))
			}
			got := strings.Join(names, " ")
			if got != "dst.raw=d src.raw=s" && got != "dst.raw=s" {
				t.Errorf("%s: the store holds %q, want %q (before the rename) or %q (after)", where, got, "dst.raw=d src.raw=s", "dst.raw=s")
			}
			s2.Close()
		}
	}
}

// TestZeroedTailSurvivesPowerCut: a truncate to the middle of a block
// zeroes the rest of that block in place, then journals the size. At every
// power cut where the new size is durable, growing the disk again must
// read zeros past it. Before the fix the commit of the size record (no map
// record in it) did not flush the data first, so the journal could reach
// the media without the zeroing, and the old bytes came back.
func TestZeroedTailSurvivesPowerCut(t *testing.T) {
	const bs, cutAt = 4096, 100
	c, s := crashStore(t, 16<<20)
	d := mustCreate(t, s, "a", 0)
	if _, err := d.WriteAt(bytes.Repeat([]byte{0x11}, 2*bs), 0); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	start := c.OpCount()
	if err := d.Truncate(cutAt); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.Close()

	rng := rand.New(rand.NewPCG(3, 4))
	states := 0
	for op := start; op <= c.OpCount(); op++ {
		modes := []backend.CrashMode{backend.DropUnflushed}
		for range 40 {
			modes = append(modes, backend.RandomSubset, backend.Torn)
		}
		for _, mode := range modes {
			where := fmt.Sprintf("power cut after op %d (%s)", op, mode)
			s2, err := Open(c.MemAt(op, rng, mode), Options{CommitInterval: -1, Logger: quietLogger()})
			if err != nil {
				t.Fatalf("%s: open: %v", where, err)
			}
			d2, err := s2.OpenDisk("a")
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if d2.Size() == cutAt {
				states++
				if err := d2.Truncate(2 * bs); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, 2*bs)
				if _, err := d2.ReadAt(got, 0); err != nil {
					t.Fatal(err)
				}
				if i := bytes.IndexFunc(got[cutAt:], func(r rune) bool { return r != 0 }); i >= 0 {
					t.Fatalf("%s: the truncate to %d is durable, but after growing again byte %d is %#x, want 0", where, cutAt, cutAt+i, got[cutAt+i])
				}
			}
			d2.Close()
			s2.Close()
		}
	}
	if states == 0 {
		t.Fatal("no power cut left the truncate durable")
	}
}
