package backend

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

const MiB = 1 << 20

func TestFileReadWriteFlush(t *testing.T) {
	path := newStoreFile(t, 4*MiB)
	b := mustOpen(t, path, OpenOptions{})

	if _, ok := b.(*File); !ok {
		t.Fatalf("Open returned %T, want *File", b)
	}
	if got := b.Size(); got != 4*MiB {
		t.Errorf("Size() = %d, want %d", got, 4*MiB)
	}
	if s := b.SectorSize(); s != 512 && s != 4096 {
		t.Errorf("SectorSize() = %d, want 512 or 4096", s)
	}
	t.Logf("%s: %d-byte sectors", b.Describe(), b.SectorSize())
	if want := `file "` + path + `"`; b.Describe() != want {
		t.Errorf("Describe() = %q, want %q", b.Describe(), want)
	}

	data := aligned(256<<10, 1)
	mustWrite(t, b, data, 1*MiB)
	if err := b.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	if got := readBack(t, b, 1*MiB, len(data)); !bytes.Equal(got, data) {
		t.Fatal("read back differs from what was written")
	}
	wantZeros(t, "unwritten range", readBack(t, b, 0, 64<<10))
	durable := aligned(64<<10, 7)
	if _, err := b.WriteAtDurable(durable, 2*MiB); err != nil {
		t.Fatalf("WriteAtDurable: %v", err)
	}
	if got := readBack(t, b, 2*MiB, len(durable)); !bytes.Equal(got, durable) {
		t.Fatal("read back of a durable write differs from what was written")
	}

	// The data is in the file, as a plain read without O_DIRECT sees it.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(raw[1*MiB:1*MiB+len(data)], data) {
		t.Fatal("file contents differ from what was written")
	}
}

func TestFileRefusesUnalignedAndOutOfRange(t *testing.T) {
	path := newStoreFile(t, 1*MiB)
	b := mustOpen(t, path, OpenOptions{})
	s := b.SectorSize()
	buf := directio.AlignedBlock(2 * 4096)

	_, err := b.WriteAt(buf[:s], int64(s/2))
	wantErrIs(t, "write at half a sector", err, ErrUnaligned)
	_, err = b.ReadAt(buf[:s/2], 0)
	wantErrIs(t, "read of half a sector", err, ErrUnaligned)
	_, err = b.ReadAt(buf[1:s+1], 0)
	wantErrIs(t, "read into a misaligned buffer", err, ErrUnaligned)
	err = b.Discard(0, int64(s/2))
	wantErrIs(t, "discard of half a sector", err, ErrUnaligned)
	err = b.WriteZeroes(int64(s/2), int64(s))
	wantErrIs(t, "write zeroes at half a sector", err, ErrUnaligned)

	_, err = b.WriteAt(buf[:4096], 1*MiB)
	wantErrIs(t, "write past the end", err, ErrOutOfRange)
	_, err = b.ReadAt(buf[:8192], 1*MiB-4096)
	wantErrIs(t, "read across the end", err, ErrOutOfRange)
	_, err = b.ReadAt(buf[:4096], -4096)
	wantErrIs(t, "read at a negative offset", err, ErrOutOfRange)
	if st, _ := os.Stat(path); st.Size() != 1*MiB {
		t.Errorf("file size changed to %d", st.Size())
	}

	// The error says what was attempted, where.
	_, err = b.WriteAt(buf[:s], int64(s/2))
	for _, want := range []string{path, "write", "bytes at"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func TestFileDiscardPunchesHole(t *testing.T) {
	path := newStoreFile(t, 4*MiB)
	b := mustOpen(t, path, OpenOptions{})
	data := aligned(2*MiB, 3)
	mustWrite(t, b, data, 0)
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	before := allocatedBytes(t, path)

	if err := b.Discard(512<<10, 1*MiB); err != nil {
		t.Fatalf("Discard: %v", err)
	}
	after := allocatedBytes(t, path)
	if after > before-1*MiB {
		t.Errorf("allocation went from %d to %d bytes, want at least 1 MiB less", before, after)
	}
	got := readBack(t, b, 0, 2*MiB)
	wantZeros(t, "discarded range", got[512<<10:512<<10+MiB])
	if !bytes.Equal(got[:512<<10], data[:512<<10]) || !bytes.Equal(got[512<<10+MiB:], data[512<<10+MiB:]) {
		t.Error("data around the discarded range changed")
	}
	if st, _ := os.Stat(path); st.Size() != 4*MiB {
		t.Errorf("file size changed to %d", st.Size())
	}
	if err := b.Discard(0, 0); err != nil {
		t.Errorf("empty Discard: %v", err)
	}
}

func TestFileWriteZeroes(t *testing.T) {
	path := newStoreFile(t, 1*MiB)
	b := mustOpen(t, path, OpenOptions{})
	data := aligned(256<<10, 5)
	mustWrite(t, b, data, 0)

	if err := b.WriteZeroes(64<<10, 128<<10); err != nil {
		t.Fatalf("WriteZeroes: %v", err)
	}
	got := readBack(t, b, 0, 256<<10)
	wantZeros(t, "zeroed range", got[64<<10:192<<10])
	if !bytes.Equal(got[:64<<10], data[:64<<10]) || !bytes.Equal(got[192<<10:], data[192<<10:]) {
		t.Error("data around the zeroed range changed")
	}
	// ZERO_RANGE beyond what was ever written, up to the end, keeps the size.
	if err := b.WriteZeroes(512<<10, 512<<10); err != nil {
		t.Fatalf("WriteZeroes up to the end: %v", err)
	}
	if st, _ := os.Stat(path); st.Size() != 1*MiB {
		t.Errorf("file size changed to %d", st.Size())
	}
}

func TestWriteZeroBuffers(t *testing.T) {
	// The last-resort path of WriteZeroes, which ext4 never takes: more than
	// one 1 MiB buffer, and a partial last one.
	path := newStoreFile(t, 4*MiB)
	b := mustOpen(t, path, OpenOptions{}).(*File)
	data := aligned(3*MiB, 7)
	mustWrite(t, b, data, 0)
	const off, n = 4096, 2*MiB + 8192
	if err := b.withFD(func(fd int) error { return writeZeroBuffers(fd, off, n, b.sectorSize) }); err != nil {
		t.Fatal(err)
	}
	got := readBack(t, b, 0, 3*MiB)
	wantZeros(t, "zeroed range", got[off:off+n])
	if !bytes.Equal(got[:off], data[:off]) || !bytes.Equal(got[off+n:], data[off+n:]) {
		t.Error("data around the zeroed range changed")
	}
}

func TestFileLocking(t *testing.T) {
	path := newStoreFile(t, 1*MiB)

	first, err := Open(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Open(path, OpenOptions{})
	wantErrIs(t, "second Open", err, ErrLocked)
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the path", err)
	}
	_, err = Open(path, OpenOptions{ReadOnly: true})
	wantErrIs(t, "read-only Open beside a writer", err, ErrLocked)

	// NoLock is for tests that open a store twice on purpose.
	again, err := Open(path, OpenOptions{NoLock: true})
	if err != nil {
		t.Fatalf("Open with NoLock: %v", err)
	}
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}

	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	// Read-only openers share; a writer is refused until they all close.
	r1 := mustOpen(t, path, OpenOptions{ReadOnly: true})
	r2, err := Open(path, OpenOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("second read-only Open: %v", err)
	}
	_, err = Open(path, OpenOptions{})
	wantErrIs(t, "Open beside readers", err, ErrLocked)
	r2.Close()
	r1.Close()
	w := mustOpen(t, path, OpenOptions{})
	w.Close()
}

func TestFileReadOnly(t *testing.T) {
	path := newStoreFile(t, 1*MiB)
	w := mustOpen(t, path, OpenOptions{})
	data := aligned(4096, 9)
	mustWrite(t, w, data, 8192)
	w.Close()

	r := mustOpen(t, path, OpenOptions{ReadOnly: true})
	if got := readBack(t, r, 8192, 4096); !bytes.Equal(got, data) {
		t.Error("read-only open reads different data")
	}
	_, err := r.WriteAt(data, 0)
	wantErrIs(t, "WriteAt on a read-only backend", err, ErrReadOnly)
	wantErrIs(t, "Discard on a read-only backend", r.Discard(0, 4096), ErrReadOnly)
	wantErrIs(t, "WriteZeroes on a read-only backend", r.WriteZeroes(0, 4096), ErrReadOnly)
}

func TestFileClosed(t *testing.T) {
	path := newStoreFile(t, 1*MiB)
	b, err := Open(path, OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = b.ReadAt(directio.AlignedBlock(4096), 0)
	wantErrIs(t, "ReadAt after Close", err, ErrClosed)
	wantErrIs(t, "Flush after Close", b.Flush(), ErrClosed)
}

func TestFileShortReadIsUnexpectedEOF(t *testing.T) {
	path := newStoreFile(t, 1*MiB)
	b := mustOpen(t, path, OpenOptions{})
	// Someone shrinks the file under the store: reads past the new end are
	// short, which is an error.
	if err := os.Truncate(path, 512<<10); err != nil {
		t.Fatal(err)
	}
	_, err := b.ReadAt(directio.AlignedBlock(8192), 512<<10-4096)
	wantErrIs(t, "read across the shrunk end", err, io.ErrUnexpectedEOF)
}

// Parallel reads, writes and flushes from several goroutines, with each
// engine: every chunk reads back what its writer wrote.
func TestFileParallelIO(t *testing.T) {
	for _, engine := range []Engine{EnginePread, EngineIOUring} {
		t.Run(string(engine), func(t *testing.T) { parallelIO(t, engine) })
	}
}

func parallelIO(t *testing.T, engine Engine) {
	path := newStoreFile(t, 4*MiB)
	b, err := Open(path, OpenOptions{Engine: engine})
	if engine == EngineIOUring && err != nil {
		testutil.Missing(t, "no io_uring here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if got, _ := EngineOf(b); got != engine {
		t.Fatalf("EngineOf: %q, want %q", got, engine)
	}
	const workers, chunk = 8, 64 << 10
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			off := int64(w * 4 * chunk)
			for i := range 4 {
				data := aligned(chunk, byte(w*16+i))
				if _, err := b.WriteAt(data, off+int64(i*chunk)); err != nil {
					t.Error(err)
					return
				}
				got := directio.AlignedBlock(chunk)
				if _, err := b.ReadAt(got, off+int64(i*chunk)); err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(got, data) {
					t.Errorf("worker %d chunk %d reads back different data", w, i)
				}
				if i == 2 {
					if err := b.Flush(); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
}

// The default engine is io_uring where the kernel allows it, else pread
// with the reason; an unknown engine name is refused.
func TestEngineAuto(t *testing.T) {
	b := mustOpen(t, newStoreFile(t, MiB), OpenOptions{})
	got, why := EngineOf(b)
	switch {
	case got == EngineIOUring && why == "":
	case got == EnginePread && why != "":
		testutil.Missing(t, "auto fell back to pread: %s", why)
	default:
		t.Errorf("EngineOf: %q (%q)", got, why)
	}
	if _, err := ParseEngine("aio"); err == nil {
		t.Error("ParseEngine accepted aio")
	}
	if e, err := ParseEngine("auto"); e != EngineAuto || err != nil {
		t.Errorf("ParseEngine(auto): %q, %v", e, err)
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()

	_, err := Open(filepath.Join(dir, "missing.img"), OpenOptions{})
	wantErrIs(t, "Open of a missing file", err, os.ErrNotExist)

	_, err = Open(dir, OpenOptions{})
	if err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("Open of a directory: %v, want an error saying it is a directory", err)
	}

	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Open(fifo, OpenOptions{ReadOnly: true}) // must not block
	if err == nil || !strings.Contains(err.Error(), "FIFO") {
		t.Errorf("Open of a FIFO: %v, want an error saying it is a FIFO", err)
	}

	_, err = Open("/dev/null", OpenOptions{})
	if err == nil || !strings.Contains(err.Error(), "character device") {
		t.Errorf("Open of /dev/null: %v, want an error saying it is a character device", err)
	}
}

func TestCreateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.img")
	if err := CreateFile(path, 64*MiB); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != 64*MiB {
		t.Errorf("size %d, want %d", st.Size(), 64*MiB)
	}
	if a := allocatedBytes(t, path); a > 1*MiB {
		t.Errorf("new file takes %d bytes, want it sparse", a)
	}
	wantErrIs(t, "CreateFile over an existing file", CreateFile(path, 64*MiB), os.ErrExist)

	for _, size := range []int64{0, -4096, 4096 + 512} {
		if err := CreateFile(filepath.Join(dir, "bad.img"), size); err == nil {
			t.Errorf("CreateFile with size %d succeeded", size)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "bad.img")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused CreateFile left a file behind: %v", err)
	}
}

// memoryFSDir returns a directory on a fresh mount of fsType (tmpfs or
// ramfs), unmounted in t.Cleanup. When it cannot mount (not root) it falls
// back to /dev/shm for tmpfs and skips for ramfs.
func memoryFSDir(t *testing.T, fsType string) string {
	t.Helper()
	if os.Geteuid() == 0 {
		dir := t.TempDir()
		if err := unix.Mount(fsType, dir, fsType, 0, ""); err == nil {
			t.Cleanup(func() {
				if err := unix.Unmount(dir, 0); err != nil {
					t.Errorf("unmount %s: %v", dir, err)
				}
			})
			return dir
		}
	}
	var fs unix.Statfs_t
	if fsType != "tmpfs" || unix.Statfs("/dev/shm", &fs) != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Skipf("cannot mount %s (needs root)", fsType)
	}
	dir, err := os.MkdirTemp("/dev/shm", "backend-test-")
	if err != nil {
		t.Skipf("no tmpfs: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// tmpfs accepts O_DIRECT since Linux 6.6 but keeps the data in memory; ramfs
// refuses O_DIRECT with EINVAL. Both are refused with ErrNoDirectIO.
func TestMemoryFileSystemsRefused(t *testing.T) {
	for _, fsType := range []string{"tmpfs", "ramfs"} {
		t.Run(fsType, func(t *testing.T) {
			dir := memoryFSDir(t, fsType)
			path := filepath.Join(dir, "s.img")
			if err := os.WriteFile(path, make([]byte, 64<<10), 0o600); err != nil {
				t.Fatal(err)
			}

			b, err := Open(path, OpenOptions{})
			if err == nil {
				b.Close()
			}
			wantErrIs(t, "Open", err, ErrNoDirectIO)
			for _, want := range []string{path, "O_DIRECT", fsType, "ext4"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
			t.Log(err)

			// CreateFile refuses too, and leaves nothing behind.
			created := filepath.Join(dir, "new.img")
			wantErrIs(t, "CreateFile", CreateFile(created, 1*MiB), ErrNoDirectIO)
			if _, err := os.Stat(created); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("CreateFile left %s behind: %v", created, err)
			}
		})
	}
}

func TestErrnoStaysReachable(t *testing.T) {
	// A kernel error keeps its errno through the wrapping: punching a hole
	// through a read-only descriptor gives EBADF (the read-only check is
	// bypassed here on purpose).
	path := newStoreFile(t, 1*MiB)
	b := mustOpen(t, path, OpenOptions{ReadOnly: true}).(*File)
	b.readOnly = false
	err := b.Discard(0, 4096)
	wantErrIs(t, "Discard through a read-only descriptor", err, syscall.EBADF)
	if !strings.Contains(err.Error(), "discard 4096 bytes at 0") {
		t.Errorf("error %q does not say what was attempted", err)
	}
}
