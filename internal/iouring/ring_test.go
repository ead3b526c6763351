package iouring

import (
	"os"
	"path/filepath"
	"testing"
	"unsafe"
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
