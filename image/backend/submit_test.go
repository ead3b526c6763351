package backend

import (
	"bytes"
	"errors"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

// TestFilePrepareSQE: File puts an IO on a caller's io_uring (RWF_DSYNC for
// a Durable write), the ring's completion transfers it, and ReadAt sees it;
// it declines a misaligned IO, a write on a read-only backing and any IO
// after Close, where Do reports the error.
func TestFilePrepareSQE(t *testing.T) {
	path := newStoreFile(t, 4*MiB)
	b := mustOpen(t, path, OpenOptions{}).(Submitter)
	rg, err := iouring.Setup(8, 16, 0)
	if err != nil {
		t.Skipf("no io_uring: %v", err)
	}
	defer rg.Close()
	run := func(io IO) {
		t.Helper()
		var sqe iouring.SQE
		if !b.PrepareSQE(&sqe, io) {
			t.Fatalf("%+v: not prepared", io)
		}
		if io.Durable != (sqe.RWFlags == unix.RWF_DSYNC) {
			t.Fatalf("Durable %v, RWFlags %#x", io.Durable, sqe.RWFlags)
		}
		sqe.UserData = 7
		rg.Put(sqe)
		if err := rg.Enter(true); err != nil {
			t.Fatal(err)
		}
		rg.Reap(func(c iouring.CQE) {
			if c.UserData != 7 || int(c.Res) != len(io.Buf) {
				t.Fatalf("completion %+v for %d bytes", c, len(io.Buf))
			}
		})
	}
	p := aligned(64<<10, 3)
	run(IO{Off: 1 * MiB, Buf: p, Write: true})
	run(IO{Off: 2 * MiB, Buf: p, Write: true, Durable: true})
	if got := readBack(t, b, 2*MiB, len(p)); !bytes.Equal(got, p) {
		t.Fatal("a durable write through the ring does not read back")
	}
	q := aligned(64<<10, 0)
	run(IO{Off: 1 * MiB, Buf: q})
	if !bytes.Equal(q, p) {
		t.Fatal("a read through the ring differs from the write")
	}

	var sqe iouring.SQE
	if b.PrepareSQE(&sqe, IO{Off: 100, Buf: p}) || sqe != (iouring.SQE{}) {
		t.Fatal("prepared a misaligned read")
	}
	if err := b.Do(IO{Off: 100, Buf: p}); !errors.Is(err, ErrUnaligned) {
		t.Fatalf("Do of a misaligned read: %v", err)
	}
	ro := mustOpen(t, newStoreFile(t, MiB), OpenOptions{ReadOnly: true}).(Submitter)
	if ro.PrepareSQE(&sqe, IO{Buf: p, Write: true}) {
		t.Fatal("prepared a write on a read-only backing")
	}
	b.Close()
	if b.PrepareSQE(&sqe, IO{Buf: p}) {
		t.Fatal("prepared a read after Close")
	}
	if err := b.Do(IO{Buf: p}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do after Close: %v", err)
	}
}

// TestMemoryBackendsDo: Mem and Crash never prepare ring entries; their Do
// performs the IO, and Crash's Do goes through its fault function and op
// log like WriteAt.
func TestMemoryBackendsDo(t *testing.T) {
	m, c := NewMem(MiB), NewCrash(MiB)
	p := aligned(8192, 5)
	for _, b := range []Submitter{m, c} {
		var sqe iouring.SQE
		if b.PrepareSQE(&sqe, IO{Buf: p}) {
			t.Fatalf("%s prepared an io_uring entry", b.Describe())
		}
		if err := b.Do(IO{Off: 4096, Buf: p, Write: true, Durable: true}); err != nil {
			t.Fatal(err)
		}
		q := make([]byte, len(p))
		if err := b.Do(IO{Off: 4096, Buf: q}); err != nil || !bytes.Equal(q, p) {
			t.Fatalf("%s: Do read back: %v", b.Describe(), err)
		}
	}
	ops := c.OpCount()
	c.SetFault(FailNth(OpWrite, 2, syscall.EIO)) // the second write: the first was the durable one above
	if err := c.Do(IO{Off: 0, Buf: p, Write: true}); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Crash Do with a write fault: %v", err)
	}
	if err := c.Do(IO{Off: 0, Buf: p, Write: true}); err != nil || c.OpCount() != ops+1 {
		t.Fatalf("Crash Do after the fault: %v, ops %d -> %d", err, ops, c.OpCount())
	}
}
