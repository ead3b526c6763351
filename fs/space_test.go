package fs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"
)

// blocksOf returns st_blocks of a mount path, with the attribute cache
// bypassed (the kernel refetches after writes and fallocate anyway).
func blocksOf(t *testing.T, f *os.File) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks
}

func sizeOf(t *testing.T, f *os.File) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Size
}

func bfree(t *testing.T, path string) uint64 {
	t.Helper()
	var sf unix.Statfs_t
	if err := unix.Statfs(path, &sf); err != nil {
		t.Fatal(err)
	}
	return sf.Bfree
}

// TestFallocate: punch-hole and zero-range read back zeros and free
// space (st_blocks and statfs), allocation grows st_blocks, the
// cloud-hypervisor probes past the end answer 0 without a size change, and
// unsupported modes are EOPNOTSUPP (never ENOSYS: docs/CLIENTS.md trap 1).
func TestFallocate(t *testing.T) {
	tc := newTestCase(t)
	const size = 16 << 20
	data := make([]byte, size)
	newPRNGReader(7).Read(data)
	if err := os.WriteFile(tc.path("d.raw"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	f := tc.openFile("d.raw", os.O_RDWR, 0)
	fd := int(f.Fd())
	check := func(what string) {
		t.Helper()
		got := readAll(t, tc.path("d.raw"))
		if !bytes.Equal(got, data) {
			for i := range got {
				if i >= len(data) || got[i] != data[i] {
					t.Fatalf("%s: content differs from the model at byte %d (size %d, want %d)", what, i, len(got), len(data))
				}
			}
			t.Fatalf("%s: size %d, want %d", what, len(got), len(data))
		}
	}
	check("written")
	blocks0, free0 := blocksOf(t, f), bfree(t, tc.mnt)
	if blocks0 != size/512 {
		t.Errorf("st_blocks %d after writing %d bytes", blocks0, size)
	}

	// Punch 4 MiB + unaligned edges.
	off, n := int64(2<<20+1000), int64(4<<20+3000)
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		t.Fatalf("punch hole: %v", err)
	}
	clear(data[off : off+n])
	check("punched")
	blocks1, free1 := blocksOf(t, f), bfree(t, tc.mnt)
	if blocks0-blocks1 < (4<<20-4096)/512 { // whole blocks inside the range
		t.Errorf("punch of 4 MiB: st_blocks %d -> %d", blocks0, blocks1)
	}
	if free1 <= free0 {
		t.Errorf("punch: statfs free blocks %d -> %d, want a rise", free0, free1)
	}

	// Zero-range with KEEP_SIZE (cloud-hypervisor's write-zeroes) and
	// without, inside the disk.
	off, n = 8<<20+512, 2<<20
	if err := unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		t.Fatalf("zero range keep size: %v", err)
	}
	clear(data[off : off+n])
	off, n = 12<<20, 1<<20+77
	if err := unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE, off, n); err != nil {
		t.Fatalf("zero range: %v", err)
	}
	clear(data[off : off+n])
	check("zeroed")
	blocks2 := blocksOf(t, f)
	if blocks1-blocks2 < 3<<20/512-16 {
		t.Errorf("zero range of 3 MiB: st_blocks %d -> %d", blocks1, blocks2)
	}

	// ZERO_RANGE past the end grows the disk; with KEEP_SIZE it does not.
	if err := unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, size, 1<<20); err != nil {
		t.Errorf("zero range keep size past the end: %v", err)
	}
	if s := sizeOf(t, f); s != size {
		t.Errorf("zero range keep size past the end: size %d", s)
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_ZERO_RANGE, size-100, 4196); err != nil {
		t.Errorf("zero range past the end: %v", err)
	}
	clear(data[size-100:])
	data = append(data, make([]byte, 4096)...)
	check("zero range past the end")

	// The cloud-hypervisor discard probe: fallocate(PUNCH_HOLE|KEEP_SIZE,
	// size, 1) answers 0 and changes nothing.
	cur := sizeOf(t, f)
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, cur, 1); err != nil {
		t.Errorf("punch-hole probe past the end: %v", err)
	}
	if s := sizeOf(t, f); s != cur {
		t.Errorf("punch-hole probe changed the size %d -> %d", cur, s)
	}

	// Mode 0 allocates and grows; KEEP_SIZE allocates inside only.
	b3 := blocksOf(t, f)
	if err := unix.Fallocate(fd, 0, cur, 1<<20); err != nil {
		t.Fatalf("allocate: %v", err)
	}
	data = append(data, make([]byte, 1<<20)...)
	if s := sizeOf(t, f); s != cur+1<<20 {
		t.Errorf("allocate: size %d, want %d", s, cur+1<<20)
	}
	if b := blocksOf(t, f); b-b3 < 1<<20/512 {
		t.Errorf("allocate 1 MiB: st_blocks %d -> %d", b3, b)
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 2<<20, 1<<20); err != nil {
		t.Fatalf("allocate keep size: %v", err)
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, int64(len(data)), 1<<20); err != nil {
		t.Fatalf("allocate keep size past the end: %v", err)
	}
	check("allocated")

	// Unsupported modes: the kernel refuses most before asking us, and
	// our handler answers EOPNOTSUPP for anything it gets.
	wantErrno(t, "collapse range", unix.Fallocate(fd, unix.FALLOC_FL_COLLAPSE_RANGE, 0, 1<<20), unix.EOPNOTSUPP)
	wantErrno(t, "insert range", unix.Fallocate(fd, unix.FALLOC_FL_INSERT_RANGE, 0, 1<<20), unix.EOPNOTSUPP)
	wantErrno(t, "punch hole without keep size", unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE, 0, 4096), unix.EOPNOTSUPP)
	df := &diskFile{vfs: tc.srv.vfs}
	for _, mode := range []uint32{unix.FALLOC_FL_COLLAPSE_RANGE, unix.FALLOC_FL_INSERT_RANGE, unix.FALLOC_FL_UNSHARE_RANGE,
		unix.FALLOC_FL_PUNCH_HOLE, unix.FALLOC_FL_NO_HIDE_STALE, unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_ZERO_RANGE, 0x80} {
		if e := df.Allocate(context.Background(), 0, 4096, mode); e != unix.EOPNOTSUPP {
			t.Errorf("Allocate mode %#x: %v, want EOPNOTSUPP", mode, e)
		}
	}
	check("after refused modes")
}

// TestSeekDataHole: SEEK_DATA and SEEK_HOLE agree with what was written
// (qemu-img and cp find holes this way).
func TestSeekDataHole(t *testing.T) {
	tc := newTestCase(t)
	f := tc.openFile("d.raw", os.O_RDWR|os.O_CREATE, 0o600)
	fd := int(f.Fd())
	const M = 1 << 20
	if err := f.Truncate(8 * M); err != nil {
		t.Fatal(err)
	}
	w := func(off int64, n int) {
		if _, err := f.WriteAt(bytes.Repeat([]byte{0xab}, n), off); err != nil {
			t.Fatal(err)
		}
	}
	w(1*M, M)        // [1M, 2M)
	w(5*M, 4096)     // [5M, 5M+4K)
	w(6*M+100, 3000) // inside block [6M, 6M+4K)
	seek := func(off int64, whence int, want int64, wantErr error) {
		t.Helper()
		got, err := unix.Seek(fd, off, whence)
		name := map[int]string{unix.SEEK_DATA: "SEEK_DATA", unix.SEEK_HOLE: "SEEK_HOLE"}[whence]
		if wantErr != nil {
			wantErrno(t, name, err, wantErr.(unix.Errno))
			return
		}
		if err != nil || got != want {
			t.Errorf("%s(%d) = %d, %v; want %d", name, off, got, err, want)
		}
	}
	seek(0, unix.SEEK_DATA, 1*M, nil)
	seek(0, unix.SEEK_HOLE, 0, nil)
	seek(1*M+5, unix.SEEK_DATA, 1*M+5, nil)
	seek(1*M, unix.SEEK_HOLE, 2*M, nil)
	seek(2*M, unix.SEEK_DATA, 5*M, nil)
	seek(5*M, unix.SEEK_HOLE, 5*M+4096, nil)
	seek(5*M+4096, unix.SEEK_DATA, 6*M, nil)
	seek(6*M, unix.SEEK_HOLE, 6*M+4096, nil)
	seek(6*M+4096, unix.SEEK_DATA, 0, unix.ENXIO)
	seek(7*M, unix.SEEK_HOLE, 7*M, nil)
	seek(8*M-1, unix.SEEK_HOLE, 8*M-1, nil)
	seek(8*M, unix.SEEK_DATA, 0, unix.ENXIO)
	seek(8*M, unix.SEEK_HOLE, 0, unix.ENXIO)
	// After a punch the hole shows.
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 1*M, M/2); err != nil {
		t.Fatal(err)
	}
	seek(0, unix.SEEK_DATA, 1*M+M/2, nil)
	// Data up to the end: the end is the hole.
	w(8*M-4096, 4096)
	seek(8*M-4096, unix.SEEK_HOLE, 8*M, nil)
}

// TestNoSpace: a full store answers ENOSPC (not EIO), what was written
// before stays readable, and removing the disk gives the space back.
func TestNoSpace(t *testing.T) {
	tc := newTestCase(t, withStoreSize(64<<20))
	f := tc.openFile("big.raw", os.O_RDWR|os.O_CREATE, 0o600)
	buf := bytes.Repeat([]byte{0x5a}, 1<<20)
	var written int64
	var err error
	for written < 128<<20 {
		if _, err = f.WriteAt(buf, written); err != nil {
			break
		}
		written += int64(len(buf))
	}
	wantErrno(t, "write to a full store", err, unix.ENOSPC)
	if written < 32<<20 {
		t.Errorf("only %d MiB fit in a 64 MiB store", written>>20)
	}
	got := make([]byte, 1<<20)
	if _, err := f.ReadAt(got, written-1<<20); err != nil || !bytes.Equal(got, buf) {
		t.Errorf("last full MiB before ENOSPC: %v", err)
	}
	t.Logf("%d MiB written; statfs free blocks at ENOSPC: %d", written>>20, bfree(t, tc.mnt))
	f.Close()
	if err := os.Remove(tc.path("big.raw")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "space back after unlink", func() bool {
		return bfree(t, tc.mnt)*uint64(tc.store.BlockSize()) >= uint64(written)
	})
	if err := os.WriteFile(tc.path("again.raw"), buf, 0o600); err != nil {
		t.Errorf("write after freeing space: %v", err)
	}
}

// TestRewriteParallelNoENOSPC rewrites a disk again and again the way
// qemu-img convert -W does: truncate to 0, then 8 writers in parallel. The
// store has room for the disk four times over, but the blocks a truncate
// frees wait in quarantine until a commit, so the writers depend on
// image's commit-and-retry when the free space runs out.
//
// Regression test: image.Store.allocData retried only when s.mu.quarantine
// was non-empty, but a commit under way (started by another writer or the
// timer) had already taken the quarantine into its local list without
// releasing it yet, so a writer gave up with ENOSPC ("need 256 blocks, 255
// free") although hundreds of MiB were about to come free (image commit
// bccf0a6 counts those blocks as releasing and waits for the commit).
func TestRewriteParallelNoENOSPC(t *testing.T) {
	tc := newTestCase(t, withStoreSize(512<<20))
	const (
		size    = 128 << 20
		writers = 8
	)
	if err := os.WriteFile(tc.path("d.raw"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for round := range 8 {
		if err := os.Truncate(tc.path("d.raw"), 0); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				f, err := os.OpenFile(tc.path("d.raw"), os.O_WRONLY|syscall.O_DIRECT, 0)
				if err != nil {
					errs <- err
					return
				}
				defer f.Close()
				buf := directio.AlignedBlock(1 << 20)
				for off := int64(w) << 20; off < size; off += writers << 20 {
					if _, err := f.WriteAt(buf, off); err != nil {
						errs <- fmt.Errorf("round %d, writer %d at %d MiB: %w", round, w, off>>20, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}
