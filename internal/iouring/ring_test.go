package iouring

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestWriteRead writes a buffer to a file through the ring and reads it
// back, with 64- and 128-byte SQEs.
func TestWriteRead(t *testing.T) {
	for _, flags := range []uint32{0, SetupSQE128} {
		r, err := Setup(8, 16, flags)
		if err != nil {
			t.Skipf("no io_uring here: %v", err)
		}
		f, err := os.Create(filepath.Join(t.TempDir(), "f"))
		if err != nil {
			t.Fatal(err)
		}
		want := []byte("through the ring")
		got := make([]byte, len(want))
		s, cmd := r.Next()
		if flags&SetupSQE128 != 0 && len(cmd) != 80 || flags == 0 && len(cmd) != 16 {
			t.Errorf("flags %#x: command area %d bytes", flags, len(cmd))
		}
		*s = SQE{Opcode: OpWrite, Fd: int32(f.Fd()), Addr: uint64(uintptr(unsafe.Pointer(&want[0]))), Len: uint32(len(want)), UserData: 1}
		if err := r.Enter(true); err != nil {
			t.Fatal(err)
		}
		r.Put(SQE{Opcode: OpRead, Fd: int32(f.Fd()), Addr: uint64(uintptr(unsafe.Pointer(&got[0]))), Len: uint32(len(got)), UserData: 2})
		if err := r.Enter(true); err != nil {
			t.Fatal(err)
		}
		res := map[uint64]int32{}
		for len(res) < 2 {
			if r.Reap(func(c CQE) { res[c.UserData] = c.Res }) == 0 {
				if err := r.Enter(true); err != nil {
					t.Fatal(err)
				}
			}
		}
		if res[1] != int32(len(want)) || res[2] != int32(len(want)) || string(got) != string(want) {
			t.Errorf("flags %#x: write %d, read %d %q", flags, res[1], res[2], got)
		}
		if r.Pending() != 0 {
			t.Errorf("flags %#x: %d SQEs left unsubmitted", flags, r.Pending())
		}
		f.Close()
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	}
}

// TestVectored writes three pieces as one vectored write made from a
// plain write's entry, reads them back into two pieces the same way, and
// leaves an entry of another kind alone.
func TestVectored(t *testing.T) {
	r, err := Setup(8, 16, 0)
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	defer r.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pieces := [][]byte{[]byte("one "), []byte("vectored "), []byte("write")}
	var want []byte
	var out []unix.Iovec
	for _, p := range pieces {
		want = append(want, p...)
		out = append(out, unix.Iovec{Base: &p[0], Len: uint64(len(p))})
	}
	got := make([]byte, len(want))
	in := []unix.Iovec{{Base: &got[0], Len: 5}, {Base: &got[5], Len: uint64(len(got) - 5)}}
	for i, c := range []struct {
		op  uint8
		iov []unix.Iovec
	}{{OpWrite, out}, {OpRead, in}} {
		sqe := SQE{Opcode: c.op, Fd: int32(f.Fd()), Off: 3, Len: uint32(len(want)), UserData: uint64(i)}
		if !Vectored(&sqe, c.iov) || sqe.Len != uint32(len(c.iov)) || sqe.Off != 3 || sqe.UserData != uint64(i) {
			t.Fatalf("op %d: Vectored gave %+v", c.op, sqe)
		}
		r.Put(sqe)
		if err := r.Enter(true); err != nil {
			t.Fatal(err)
		}
		var res int32 = -1
		for r.Reap(func(c CQE) { res = c.Res }) == 0 {
			if err := r.Enter(true); err != nil {
				t.Fatal(err)
			}
		}
		if res != int32(len(want)) {
			t.Fatalf("op %d: result %d, want %d", c.op, res, len(want))
		}
	}
	if string(got) != string(want) {
		t.Errorf("read back %q, want %q", got, want)
	}
	other := ReadEventfd(0, make([]byte, 8), 1)
	other.Opcode = OpURingCmd
	if before := other; Vectored(&other, in) || other != before {
		t.Errorf("Vectored changed an entry of another kind: %+v", other)
	}
}
