package image

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// killedCopy is the store as a daemon killed right now leaves it: every
// write that completed is there, flushed or not (a crash of the process,
// not of the machine), and nothing more was committed. The store s is
// left open; the copy is opened as the next mount would.
func killedCopy(t *testing.T, mem *backend.Mem) *Store {
	t.Helper()
	cp := backend.NewMemFrom(mem.Bytes())
	cp.CheckAlignment(512)
	s, err := Open(cp, testOptions())
	if err != nil {
		t.Fatalf("open after the kill: %v", err)
	}
	t.Cleanup(func() {
		if rep := s.Check(); !rep.Clean() {
			t.Errorf("check after the kill: %v", rep.Findings)
		}
		s.Close()
	})
	return s
}

// A write that grew the disk from inside its last block went in place, and
// the daemon was killed before the record of the new size was committed:
// the write is lost, as the contract allows, and the disk ends where it
// did. Its bytes past that end are still in the block on the backing, and
// they must never show: when the disk grows again (by a write further on,
// a truncate, a fallocate, a copy), the bytes between the old end and the
// new data read as zeros, as they did before the write.
func TestLostGrowingWriteStaysUnseen(t *testing.T) {
	const end = 4096 + 100 // inside block 1
	grow := map[string]func(t *testing.T, h *Disk){
		"write": func(t *testing.T, h *Disk) {
			if _, err := h.WriteAt(bytes.Repeat([]byte{7}, 4096), 3*4096); err != nil {
				t.Fatal(err)
			}
		},
		"truncate": func(t *testing.T, h *Disk) {
			if err := h.Truncate(4 * 4096); err != nil {
				t.Fatal(err)
			}
		},
		"fallocate": func(t *testing.T, h *Disk) {
			if err := h.Allocate(2*4096, 2*4096, false); err != nil {
				t.Fatal(err)
			}
		},
		"zero range": func(t *testing.T, h *Disk) {
			if err := h.ZeroRange(3*4096, 4096, false); err != nil {
				t.Fatal(err)
			}
		},
		"copy": func(t *testing.T, h *Disk) {
			if n, err := h.CopyFrom(h, 0, 3*4096, 4096); err != nil || n != 4096 {
				t.Fatalf("copy: %d, %v", n, err)
			}
		},
		"unaligned write in the block": func(t *testing.T, h *Disk) {
			if _, err := h.WriteAt([]byte{9}, end+200); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, g := range grow {
		t.Run(name, func(t *testing.T) {
			ms := newMemStore(t, 16<<20, FormatOptions{})
			h := mustCreate(t, ms.s, "d", 0)
			defer h.Close()
			if _, err := h.WriteAt(bytes.Repeat([]byte{1}, 2*4096), 0); err != nil {
				t.Fatal(err)
			}
			if err := h.Truncate(end); err != nil {
				t.Fatal(err)
			}
			if err := h.Sync(); err != nil {
				t.Fatal(err)
			}
			// Grows the disk to end+1000, in place in block 1: the data
			// reaches the backing, the new size stays a pending record.
			if _, err := h.WriteAt(bytes.Repeat([]byte{2}, 1000), end); err != nil {
				t.Fatal(err)
			}

			s := killedCopy(t, ms.mem)
			k, err := s.OpenDisk("d")
			if err != nil {
				t.Fatal(err)
			}
			defer k.Close()
			if k.Size() != end {
				t.Fatalf("size after the kill %d, want %d (the growing write was never committed)", k.Size(), end)
			}
			g(t, k)
			got := make([]byte, 4096-end%4096)
			if _, err := k.ReadAt(got, end); err != nil && !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			if want := make([]byte, len(got)); !bytes.Equal(got[:min(len(got), 200)], want[:min(len(got), 200)]) {
				t.Fatalf("after the disk grew again, the bytes past its old end read % x..., want zeros: the lost write shows", got[:16])
			}
		})
	}
}
