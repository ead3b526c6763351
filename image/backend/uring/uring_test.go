package uring

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// newRing returns a ring, or skips the test when this kernel refuses
// io_uring (the package's documented failure) and CI is not set.
func newRing(t testing.TB) *Ring {
	t.Helper()
	r, err := New(64)
	if err != nil {
		testutil.Missing(t, "no io_uring here: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// directFile opens a new O_DIRECT file of size bytes in a directory that
// accepts O_DIRECT (/var/tmp on the project's machines; TMPDIR may be tmpfs).
func directFile(t testing.TB, size int64) int {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "uring-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	fd, err := unix.Open(filepath.Join(dir, "f"), unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Ftruncate(fd, size); err != nil {
		t.Fatal(err)
	}
	return fd
}

// Many goroutines write distinct blocks through one ring and read them
// back, at a depth beyond the ring's (so operations queue for room); every
// block holds what its writer wrote.
func TestConcurrentReadWrite(t *testing.T) {
	r := newRing(t)
	const blocks, bs, workers = 512, 4096, 32
	fd := directFile(t, blocks*bs)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := directio.AlignedBlock(bs)
			got := directio.AlignedBlock(bs)
			for b := w; b < blocks; b += workers {
				for i := range buf {
					buf[i] = byte(b*7 + i)
				}
				if n, err := unix.Pwrite(fd, buf, int64(b*bs)); err != nil || n != bs {
					errs <- fmt.Errorf("write block %d: %d, %v", b, n, err)
					return
				}
				if n, err := r.Pread(fd, got, int64(b*bs)); err != nil || n != bs {
					errs <- fmt.Errorf("read block %d: %d, %v", b, n, err)
					return
				}
				if !bytes.Equal(got, buf) {
					errs <- fmt.Errorf("block %d reads back different bytes", b)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// And what the ring wrote is in the file, for a plain pread too.
	b := rand.IntN(blocks)
	got := directio.AlignedBlock(bs)
	if _, err := unix.Pread(fd, got, int64(b*bs)); err != nil {
		t.Fatal(err)
	}
	if got[5] != byte(b*7+5) {
		t.Errorf("block %d through pread: byte 5 is %d, want %d", b, got[5], byte(b*7+5))
	}
}

// The ring answers what pread(2) answers: errors as the operation's errno
// (a bad descriptor, a misaligned O_DIRECT request), a read at the end of
// the file transfers nothing, one that runs past it is short.
func TestSameAsPread(t *testing.T) {
	r := newRing(t)
	fd := directFile(t, 8192)
	if _, err := unix.Pwrite(fd, directio.AlignedBlock(8192), 0); err != nil {
		t.Fatal(err)
	}
	buf := directio.AlignedBlock(3 * 4096)
	cases := []struct {
		name string
		fd   int
		p    []byte
		off  int64
	}{
		{"bad descriptor", -1, buf[:4096], 0},
		{"misaligned offset", fd, buf[:4096], 1},
		{"misaligned length", fd, buf[:100], 0},
		{"at the end", fd, buf[:4096], 8192},
		{"past the end", fd, buf, 4096},
		{"whole file", fd, buf[:8192], 0},
	}
	for i, c := range cases {
		wantN, wantErr := unix.Pread(c.fd, c.p, c.off)
		if (i < 3) != (wantErr != nil) {
			t.Fatalf("%s: pread gives %d, %v: the case does not test what it says", c.name, wantN, wantErr)
		}
		if wantErr != nil {
			wantN = 0
		}
		n, err := r.Pread(c.fd, c.p, c.off)
		if n != wantN || !errors.Is(err, wantErr) && (err != nil || wantErr != nil) {
			t.Errorf("%s: ring %d, %v; pread %d, %v", c.name, n, err, wantN, wantErr)
		}
	}
	if n, err := r.Pread(fd, nil, 0); n != 0 || err != nil {
		t.Errorf("empty read: %d, %v", n, err)
	}
}

// Close waits for nothing when idle, is idempotent, and operations after
// it fail with ErrClosed instead of hanging.
func TestClose(t *testing.T) {
	r, err := New(8)
	if err != nil {
		t.Skipf("no io_uring here: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := r.Pread(0, make([]byte, 1), 0); !errors.Is(err, ErrClosed) {
		t.Errorf("read after close: %v, want ErrClosed", err)
	}
}

// BenchmarkPread4KiB is 4 KiB O_DIRECT reads from every P, through the ring
// and through pread(2), on a file in /var/tmp.
func BenchmarkPread4KiB(b *testing.B) {
	const size = 64 << 20
	fd := directFile(b, size)
	fill := directio.AlignedBlock(1 << 20)
	for off := int64(0); off < size; off += 1 << 20 {
		unix.Pwrite(fd, fill, off)
	}
	unix.Fsync(fd)
	run := func(b *testing.B, pread func(int, []byte, int64) (int, error)) {
		b.SetBytes(4096)
		b.SetParallelism(16)
		b.RunParallel(func(pb *testing.PB) {
			buf := directio.AlignedBlock(4096)
			rng := rand.New(rand.NewPCG(rand.Uint64(), 1))
			for pb.Next() {
				if _, err := pread(fd, buf, rng.Int64N(size/4096)*4096); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	b.Run("pread", func(b *testing.B) { run(b, unix.Pread) })
	b.Run("uring", func(b *testing.B) { run(b, newRing(b).Pread) })
}
