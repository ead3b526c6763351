package passthrough

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

func mountTest(t *testing.T, size int64) (*Server, string) {
	t.Helper()
	testutil.RequireFUSE(t)
	dir := t.TempDir()
	backing := filepath.Join(dir, "backing.img")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, size); err != nil {
		t.Fatal(err)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	srv, err := Mount(backing, mnt, Options{Name: "disk.img"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Error(err)
		}
	})
	return srv, backing
}

func alignedBuf(n int) []byte {
	b := make([]byte, n+4096)
	off := int((4096 - uintptr(unsafe.Pointer(&b[0]))%4096) % 4096)
	return b[off : off+n]
}

// O_DIRECT I/O through the mount lands in the backing file, one request
// per write (up to MaxWrite), served with O_DIRECT; unaligned buffered I/O
// works too; the mount is what vdiskfs asks of the kernel.
func TestPassthrough(t *testing.T) {
	srv, backing := mountTest(t, 8<<20)
	if !strings.HasSuffix(srv.Path(), "/mnt/disk.img") {
		t.Errorf("path %s", srv.Path())
	}
	f, err := os.OpenFile(srv.Path(), os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	buf := alignedBuf(1 << 20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	c0 := srv.Counters()
	if _, err := f.WriteAt(buf, 1<<20); err != nil {
		t.Fatal(err)
	}
	c1 := srv.Counters()
	if w := c1.Writes - c0.Writes; w != 1 || c1.WriteBytes-c0.WriteBytes != 1<<20 {
		t.Errorf("a 1 MiB O_DIRECT write became %d requests, %d bytes", w, c1.WriteBytes-c0.WriteBytes)
	}
	if c1.Direct-c0.Direct != 1 {
		t.Errorf("the write was not served with O_DIRECT: %+v", c1)
	}
	back := alignedBuf(1 << 20)
	if _, err := f.ReadAt(back, 1<<20); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(back, buf) {
		t.Error("read back differs")
	}
	if err := f.Sync(); err != nil {
		t.Error(err)
	}
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 1<<20, 4096); err != nil {
		t.Errorf("punch hole: %v", err)
	}
	f.Close()

	raw, err := os.ReadFile(backing)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw[1<<20+4096:2<<20], buf[4096:]) || !bytes.Equal(raw[1<<20:1<<20+4096], make([]byte, 4096)) {
		t.Error("backing file does not hold the writes and the hole")
	}

	// Buffered, unaligned: goes through the buffered descriptor.
	g, err := os.OpenFile(srv.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.WriteAt([]byte("hello"), 3); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := g.ReadAt(got, 3); err != nil || string(got) != "hello" {
		t.Errorf("read %q, %v", got, err)
	}
	g.Close()

	// Truncate through the mount reaches the backing file.
	if err := os.Truncate(srv.Path(), 4<<20); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(backing); err != nil || st.Size() != 4<<20 {
		t.Errorf("backing size after truncate: %v, %v", st.Size(), err)
	}
	if st, err := os.Stat(srv.Path()); err != nil || st.Size() != 4<<20 {
		t.Errorf("size in the mount after truncate: %v, %v", st, err)
	}
	c := srv.Counters()
	if c.Errors != 0 || c.Opens < 2 || c.Fsyncs < 1 || c.Fallocates < 1 || c.Setattrs < 1 {
		t.Errorf("counters %+v", c)
	}
	// The mount carries vdiskfs's settings.
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	line := ""
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, filepath.Dir(srv.Path())+" ") {
			line = l
		}
	}
	if !strings.Contains(line, "fuse.passthrough") || !strings.Contains(line, "default_permissions") {
		t.Errorf("mountinfo line %q", line)
	}
}
