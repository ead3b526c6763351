package crashloop

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// The model's handling of a snapshot removal that the kill interrupted,
// checked on a plain directory standing in for the mount (no daemon): the
// unlink failed (ECONNABORTED: the daemon died during it) and may or may
// not have taken effect, so a verify must accept the snapshot gone, or
// there with its content, and then keep accepting what it found. It used
// to clear the removal on finding the snapshot gone, keep it as taken, and
// fail the verify after, demanding it.
func TestModelSettlesInterruptedRemoval(t *testing.T) {
	for _, gone := range []bool{true, false} {
		t.Run(fmt.Sprintf("gone=%v", gone), func(t *testing.T) {
			dir, models := emptyDisks(t)
			m := models[1]
			data := bytes.Repeat([]byte{m.tag<<5 | 1}, 5000)
			m.snaps = []*snapModel{{name: "d1-s6.raw", data: data, done: true, removing: true}}
			if !gone {
				if err := os.WriteFile(filepath.Join(dir, "d1-s6.raw"), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			fail := func(msg string, _ map[string][]byte) { t.Fatal(msg) }
			for cycle := 1; cycle <= 2; cycle++ {
				verify(t, cycle, dir, models, 0, fail)
			}
			if gone && len(m.snaps) != 0 {
				t.Fatalf("a snapshot found removed is still modelled: %+v", m.snaps[0])
			}
			if !gone && (len(m.snaps) != 1 || !m.snaps[0].removing) {
				t.Fatalf("a snapshot whose removal did not happen must stay, to be removed first: %+v", m.snaps)
			}
		})
	}
}

// A removal that fails leaves the snapshot modelled as removing, and
// stops the snapshot that was to follow it.
func TestModelKeepsFailedRemoval(t *testing.T) {
	dir := t.TempDir()
	m := newDiskModel(1)
	m.snaps = []*snapModel{{name: "d1-s6.raw", done: true}, {name: "d1-s7.raw", done: true}}
	// A non-empty directory in its place: the unlink fails (not ENOENT).
	if err := os.MkdirAll(filepath.Join(dir, "d1-s6.raw", "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	var seq atomic.Uint64
	r := &run{seq: &seq, killAt: -1, trigger: make(chan struct{})}
	o, err := m.snapshot(r, 1, dir)
	if err == nil {
		t.Fatal("snapshot went on after its removal of the oldest failed")
	}
	if o.kind != opRemove || o.err == nil {
		t.Fatalf("the operation that stopped it: %s", o)
	}
	if len(m.snaps) != 2 || !m.snaps[0].removing || m.nextSnap != 0 {
		t.Fatalf("after the failed removal: %d snapshots, first removing %v, next %d", len(m.snaps), m.snaps[0].removing, m.nextSnap)
	}
}

// A removal that returned is undone by a kill before the next commit: the
// snapshot is back after the remount. It is still checked (it must hold
// what it held) and removed again, rather than forgotten, where it would
// pin its blocks for the rest of the run.
func TestModelRechecksUndoneRemoval(t *testing.T) {
	dir, models := emptyDisks(t)
	m := models[1]
	s6 := bytes.Repeat([]byte{m.tag<<5 | 1}, 5000)
	s7 := bytes.Repeat([]byte{m.tag<<5 | 2}, 3000)
	m.snaps = []*snapModel{{name: "d1-s6.raw", data: s6, done: true}, {name: "d1-s7.raw", data: s7, done: true}}
	for name, data := range map[string][]byte{"d1-s6.raw": s6, "d1-s7.raw": s7} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var seq atomic.Uint64
	r := &run{seq: &seq, killAt: -1, trigger: make(chan struct{})}
	// The removal of the oldest returns; the snapshot after it fails (no
	// daemon serves this directory), as if the kill came then.
	if o, err := m.snapshot(r, 1, dir); err == nil || o.kind != opSnapshot {
		t.Fatalf("snapshot without a daemon: %v, %v", o, err)
	}
	if !m.snaps[0].removing {
		t.Fatal("the removed snapshot is no longer modelled")
	}
	// The kill undid the removal, and the snapshot reads something else.
	if err := os.WriteFile(filepath.Join(dir, "d1-s6.raw"), s7, 0o644); err != nil {
		t.Fatal(err)
	}
	var failed string
	verify(t, 2, dir, models, 0, func(msg string, _ map[string][]byte) { failed = msg })
	if failed == "" {
		t.Fatal("a snapshot back from an undone removal was not checked")
	}
	// Back as it was: accepted, and to be removed again.
	if err := os.WriteFile(filepath.Join(dir, "d1-s6.raw"), s6, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, sm := range m.snaps {
		sm.again = false
	}
	verify(t, 3, dir, models, 0, func(msg string, _ map[string][]byte) { t.Fatal(msg) })
	if sm := m.snaps[0]; sm.name != "d1-s6.raw" || !sm.removing || !sm.again {
		t.Fatalf("after the verify that found it back: %+v", sm)
	}
	// Removed for good: the next verify forgets it (and the snapshot
	// that failed is long forgotten: it was never there).
	if err := os.Remove(filepath.Join(dir, "d1-s6.raw")); err != nil {
		t.Fatal(err)
	}
	verify(t, 4, dir, models, 0, func(msg string, _ map[string][]byte) { t.Fatal(msg) })
	if len(m.snaps) != 1 || m.snaps[0].name != "d1-s7.raw" {
		t.Fatalf("after the verify that found it gone: %d snapshots, first %s", len(m.snaps), m.snaps[0].name)
	}
}

// emptyDisks makes, in a plain directory standing in for the mount, an
// empty file per disk, and a model of each.
func emptyDisks(t *testing.T) (string, []*diskModel) {
	t.Helper()
	dir := t.TempDir()
	models := make([]*diskModel, disks)
	for i := range models {
		models[i] = newDiskModel(i)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("d%d.raw", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, models
}
