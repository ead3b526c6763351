package storeplan

import (
	"bytes"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

func openStore(t *testing.T, be backend.Backend) *image.Store {
	t.Helper()
	if err := image.Format(be, image.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := image.Open(be, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func createDisk(t *testing.T, s *image.Store) *image.Disk {
	t.Helper()
	if _, err := s.Create("d", 1<<20, image.Attr{Mode: 0o600}); err != nil {
		t.Fatal(err)
	}
	d, err := s.OpenDisk("d")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// On a memory backend there is no ring: NewCompletions is a nil interface
// (not a typed nil a door would take for a queue), PrepareSQE says false
// and leaves the entry alone, and Do performs the I/O.
func TestMemPlan(t *testing.T) {
	s := openStore(t, backend.NewMem(64<<20))
	cq, err := NewCompletions(s)
	if err != nil || cq != nil {
		t.Fatalf("NewCompletions on Mem = %v, %v; want a nil interface", cq, err)
	}
	d := createDisk(t, s)
	p := NewPlan(cq)
	buf := directio.AlignedBlock(8192)
	for i := range buf {
		buf[i] = byte(i*7 + 1)
	}
	if !d.PlanWrite(&p.IOPlan, buf, 4096, 8) {
		t.Fatal("write not planned")
	}
	if p.IOs() != 1 || p.IOLen(0) != len(buf) || p.Bytes() != len(buf) || p.Async() {
		t.Fatalf("plan: %d I/Os, first %d bytes, covers %d, async %v", p.IOs(), p.IOLen(0), p.Bytes(), p.Async())
	}
	var sqe iouring.SQE
	if p.PrepareSQE(&sqe, 0) || sqe != (iouring.SQE{}) {
		t.Fatalf("Mem prepared a ring entry: %+v", sqe)
	}
	if err := p.Do(0); err != nil {
		t.Fatal(err)
	}
	p.IOPlan.Finish()
	got := make([]byte, len(buf))
	if _, err := d.ReadAt(got, 4096); err != nil || !bytes.Equal(got, buf) {
		t.Fatalf("read back: %v", err)
	}
}

// On a file backing the plan's I/O goes on the door's ring: the entry
// names the I/O's offset, length and buffer.
func TestFilePlan(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.img")
	if err := image.FormatPath(path, 64<<20, image.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s, err := image.OpenPath(path, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	d := createDisk(t, s)
	buf := directio.AlignedBlock(4096)
	if _, err := d.WriteAt(buf, 0); err != nil { // maps the block and prepares its chunk
		t.Fatal(err)
	}
	p := NewPlan(nil)
	if !d.PlanWrite(&p.IOPlan, buf, 0, 8) {
		t.Fatal("overwrite not planned")
	}
	var sqe iouring.SQE
	io := p.IOPlan.IOs[0]
	if !p.PrepareSQE(&sqe, 0) || sqe.Opcode != iouring.OpWrite || sqe.Off != uint64(io.Off) ||
		sqe.Len != uint32(len(io.Buf)) || sqe.Addr != uint64(uintptr(unsafe.Pointer(&buf[0]))) {
		t.Fatalf("entry for %d bytes at %d: %+v", len(io.Buf), io.Off, sqe)
	}
	p.IOPlan.Abort()
}
