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
			dir := t.TempDir()
			models := make([]*diskModel, disks)
			for i := range models {
				models[i] = newDiskModel(i)
				if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("d%d.raw", i)), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
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
