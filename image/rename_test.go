package image

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// Rename over an existing disk: failures leave the target, open handles
// keep the renamed-over disk, and a power cut at any point is atomic.

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
