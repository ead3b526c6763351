package fs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
)

// TestConcurrentWriters: goroutines write at once to one disk, half with
// unaligned buffered writes and half with 512-byte-aligned O_DIRECT writes
// (cloud-hypervisor's sector size, docs/CLIENTS.md trap 5), each in its own byte
// ranges, which are interleaved so that neighbouring writers share 4 KiB
// blocks (read-modify-write under concurrency). The result must equal a
// reference model.
func TestConcurrentWriters(t *testing.T) {
	tc := newTestCase(t)
	const (
		size    = 32 << 20
		writers = 8
		writes  = 300
	)
	// Ownership: chunks of 512*k bytes (k in 1..24), dealt round robin.
	rng := rand.New(rand.NewPCG(1, 2))
	type chunk struct{ off, n int64 }
	owned := make([][]chunk, writers)
	for off, i := int64(0), 0; off < size; i++ {
		n := min(int64(512*(1+rng.IntN(24))), size-off)
		owned[i%writers] = append(owned[i%writers], chunk{off, n})
		off += n
	}
	model := make([]byte, size)
	if err := os.WriteFile(tc.path("d.raw"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(tc.path("d.raw"), size); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		direct := w%2 == 1
		flags := os.O_RDWR
		if direct {
			flags |= syscall.O_DIRECT
		}
		wf, err := os.OpenFile(tc.path("d.raw"), flags, 0)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer wf.Close()
			r := rand.New(rand.NewPCG(uint64(w), 99))
			buf := directio.AlignedBlock(24 * 512)
			for range writes {
				c := owned[w][r.IntN(len(owned[w]))]
				var off, n int64
				if direct {
					// Whole sectors inside the chunk.
					sectors := c.n / 512
					s := r.Int64N(sectors)
					off, n = c.off+s*512, (1+r.Int64N(sectors-s))*512
				} else {
					off = c.off + r.Int64N(c.n)
					n = 1 + r.Int64N(c.off+c.n-off)
				}
				p := buf[:n]
				for i := range p {
					p[i] = byte(r.Uint32())
				}
				if _, err := wf.WriteAt(p, off); err != nil {
					errs <- fmt.Errorf("writer %d (direct %v) at %d+%d: %w", w, direct, off, n, err)
					return
				}
				copy(model[off:], p) // own bytes only: no lock needed
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	compare := func(when string) {
		t.Helper()
		got := readAll(t, tc.path("d.raw"))
		if !bytes.Equal(got, model) {
			for i := range got {
				if got[i] != model[i] {
					t.Fatalf("%s: first difference at byte %d", when, i)
				}
			}
			t.Fatalf("%s: size %d, want %d", when, len(got), size)
		}
	}
	compare("after the writers")
	tc.remount()
	compare("after a remount")
}

// TestUnlinkWhileOpen: an unlinked disk keeps working through the open
// file, and its space comes back once the file is closed.
func TestUnlinkWhileOpen(t *testing.T) {
	tc := newTestCase(t)
	free0 := tc.store.Info().FreeBytes
	f, err := os.OpenFile(tc.path("d.raw"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := bytes.Repeat([]byte("unlinked"), 1<<20) // 8 MiB
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(tc.path("d.raw")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tc.path("d.raw")); !os.IsNotExist(err) {
		t.Fatalf("stat after unlink: %v", err)
	}
	if ents, _ := os.ReadDir(tc.mnt); len(ents) != 0 {
		t.Errorf("readdir after unlink: %v", ents)
	}
	// A new disk of the same name is a different disk.
	if err := os.WriteFile(tc.path("d.raw"), []byte("new"), 0o600); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if _, err := f.ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after unlink: %v", err)
	}
	if _, err := f.WriteAt([]byte("still writable"), 100); err != nil {
		t.Fatalf("write after unlink: %v", err)
	}
	if err := f.Truncate(int64(len(data) + 4096)); err != nil {
		t.Errorf("ftruncate after unlink: %v", err)
	}
	if err := f.Sync(); err != nil {
		t.Errorf("fsync after unlink: %v", err)
	}
	if err := f.Chmod(0o640); err != nil {
		t.Errorf("fchmod after unlink: %v", err)
	}
	fi, err := f.Stat()
	if err != nil || fi.Size() != int64(len(data)+4096) || fi.Mode().Perm() != 0o640 {
		t.Errorf("fstat after unlink: %v %v", fi, err)
	}
	if b := readAll(t, tc.path("d.raw")); string(b) != "new" {
		t.Errorf("the new d.raw reads %q", b)
	}
	if free := tc.store.Info().FreeBytes; free > free0-int64(len(data)) {
		t.Errorf("free bytes %d before close, %d at start: the unlinked disk's blocks are gone already", free, free0)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// RELEASE is asynchronous: wait for the store to see the close.
	want := free0 - int64(tc.store.BlockSize()) // the new 3-byte d.raw
	eventually(t, "space of the unlinked disk returned", func() bool {
		if err := tc.store.Commit(); err != nil {
			t.Fatal(err)
		}
		return tc.store.Info().FreeBytes >= want
	})
	if n := len(tc.store.List()); n != 1 {
		t.Errorf("%d disks in the store, want 1", n)
	}
}

// TestFsyncDurable: what fsync acknowledged is in the backing, data and
// map: a copy of the store file taken right after fsync, without an
// unmount, opens as a clean store with the data (the crash a kill -9 of
// the daemon would leave).
func TestFsyncDurable(t *testing.T) {
	tc := newTestCase(t, withStoreOptions(image.Options{CommitInterval: -1}))
	data := make([]byte, 5<<20+1234)
	newPRNGReader(3).Read(data)
	f := tc.openFile("d.raw", os.O_RDWR|os.O_CREATE, 0o600)
	if _, err := f.WriteAt(data, 4096*3+17); err != nil {
		t.Fatal(err)
	}
	df := tc.openFile("e.raw", os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	aligned := directio.AlignedBlock(1 << 20)
	copy(aligned, data)
	if _, err := df.WriteAt(aligned, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil { // fsync on one file commits the store
		t.Fatal(err)
	}
	if err := unix.Fdatasync(int(df.Fd())); err != nil {
		t.Fatal(err)
	}
	// Unsynced writes after the fsync must not break anything.
	if _, err := f.WriteAt(bytes.Repeat([]byte{9}, 1<<20), 0); err != nil {
		t.Fatal(err)
	}

	crash := tc.crashCopy()
	s, err := image.OpenPath(crash, image.Options{CommitInterval: -1, Logger: testLogger})
	if err != nil {
		t.Fatalf("open the crash copy: %v", err)
	}
	defer s.Close()
	if rep := s.Check(); !rep.Clean() {
		t.Errorf("crash copy: %v", rep.Findings)
	}
	read := func(name string, off int64, n int) []byte {
		d, err := s.OpenDisk(name)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		b := make([]byte, n)
		if _, err := d.ReadAt(b, off); err != nil && err != io.EOF {
			t.Fatal(err)
		}
		return b
	}
	got := read("d.raw", 4096*3+17, len(data))
	// The first MiB may hold the unsynced overwrite or the old bytes.
	if !bytes.Equal(got[1<<20:], data[1<<20:]) {
		t.Errorf("d.raw: fsynced data missing in the crash copy")
	}
	if !bytes.Equal(read("e.raw", 1<<20, 1<<20), data[:1<<20]) {
		t.Errorf("e.raw: fdatasynced O_DIRECT data missing in the crash copy")
	}
}

// TestNoENOSYS: fsync, fdatasync, fallocate, lseek and copy_file_range
// never answer ENOSYS, which the kernel would remember for the whole
// mount (docs/CLIENTS.md trap 1); copy_file_range copies (it is served:
// share_test.go has what it shares).
func TestNoENOSYS(t *testing.T) {
	tc := newTestCase(t)
	data := bytes.Repeat([]byte("copy me "), 300000)
	if err := os.WriteFile(tc.path("src.raw"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	src := tc.openFile("src.raw", os.O_RDONLY, 0)
	dst := tc.openFile("dst.raw", os.O_RDWR|os.O_CREATE, 0o600)
	for range 2 { // twice: an ENOSYS would show as a silent success the second time
		if err := unix.Fsync(int(dst.Fd())); err != nil {
			t.Errorf("fsync: %v", err)
		}
		if err := unix.Fdatasync(int(dst.Fd())); err != nil {
			t.Errorf("fdatasync: %v", err)
		}
		if _, err := unix.Seek(int(src.Fd()), 0, unix.SEEK_DATA); err != nil {
			t.Errorf("SEEK_DATA: %v", err)
		}
		if err := unix.Fallocate(int(dst.Fd()), unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err != nil {
			t.Errorf("fallocate: %v", err)
		}
	}
	var offIn, offOut int64
	for offIn < int64(len(data)) {
		n, err := unix.CopyFileRange(int(src.Fd()), &offIn, int(dst.Fd()), &offOut, len(data)-int(offIn), 0)
		if err != nil {
			t.Fatalf("copy_file_range: %v", err)
		}
		if n == 0 {
			break
		}
	}
	if got := readAll(t, tc.path("dst.raw")); !bytes.Equal(got, data) {
		t.Errorf("copy_file_range copied %d bytes, wrong content", len(got))
	}
	// And through the node directly, without open files: EBADF.
	if _, e := (&diskNode{}).CopyFileRange(context.Background(), nil, 0, nil, nil, 0, 1, 0); e != unix.EBADF {
		t.Errorf("CopyFileRange without open files: %v", e)
	}
}

// TestMmap: a disk can be mapped (direct_io files allow shared mmap with
// FUSE_DIRECT_IO_ALLOW_MMAP), and what is written through the map is in
// the disk. The mapping is made by a child process: a page fault on a
// FUSE file served by the faulting process itself can deadlock the Go
// runtime (go-fuse fs/api.go, "Deadlocks", 3).
func TestMmap(t *testing.T) {
	if p := os.Getenv("VDISKFS_MMAP_HELPER"); p != "" {
		mmapHelper(t, p)
		return
	}
	tc := newTestCase(t)
	data := bytes.Repeat([]byte("mapped!!"), 1<<17) // 1 MiB
	if err := os.WriteFile(tc.path("d.raw"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestMmap$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), "VDISKFS_MMAP_HELPER="+tc.path("d.raw"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mmap helper: %v\n%s", err, out)
	}
	d, err := tc.store.OpenDisk("d.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got := make([]byte, 23)
	if _, err := d.ReadAt(got, 4096); err != nil || string(got) != "written through the map" {
		t.Errorf("store reads %q, %v", got, err)
	}
}

// mmapHelper maps path, checks it, writes through the map and syncs it.
func mmapHelper(t *testing.T, path string) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := bytes.Repeat([]byte("mapped!!"), 1<<17)
	m, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	if !bytes.Equal(m, want) {
		t.Error("mapped content differs")
	}
	copy(m[4096:], "written through the map")
	if err := unix.Msync(m, unix.MS_SYNC); err != nil {
		t.Fatal(err)
	}
	if err := unix.Munmap(m); err != nil {
		t.Fatal(err)
	}
}

// TestInvalidateDisk: a resize made through the Store behind the mount's
// back is seen after InvalidateDisk, also by O_DIRECT reads past the old
// size (docs/CLIENTS.md trap 10).
func TestInvalidateDisk(t *testing.T) {
	tc := newTestCase(t)
	if err := os.WriteFile(tc.path("d.raw"), bytes.Repeat([]byte{1}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f := tc.openFile("d.raw", os.O_RDONLY|syscall.O_DIRECT, 0)
	if fi, _ := f.Stat(); fi.Size() != 1<<20 {
		t.Fatalf("size %d", fi.Size())
	}
	d, err := tc.store.OpenDisk("d.raw")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.WriteAt(bytes.Repeat([]byte{2}, 1<<20), 1<<20); err != nil {
		t.Fatal(err)
	}
	d.Close()
	if err := tc.srv.InvalidateDisk("d.raw"); err != nil {
		t.Fatal(err)
	}
	if fi, _ := f.Stat(); fi.Size() != 2<<20 {
		t.Errorf("size after InvalidateDisk: %d", fi.Size())
	}
	buf := directio.AlignedBlock(4096)
	if n, err := f.ReadAt(buf, 2<<20-4096); n != 4096 || err != nil || buf[0] != 2 {
		t.Errorf("O_DIRECT read past the old size: %d bytes, %v, byte %d", n, err, buf[0])
	}
	if err := tc.srv.InvalidateDisk("no-such-disk"); err != nil {
		t.Errorf("InvalidateDisk of an unknown name: %v", err)
	}
}

// TestUnmountBusy: Unmount of a mount with an open file detaches it
// lazily and returns once the file is closed; the file works until then.
func TestUnmountBusy(t *testing.T) {
	tc := newTestCase(t)
	f, err := os.OpenFile(tc.path("d.raw"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	done := make(chan error)
	go func() { done <- tc.srv.Unmount() }()
	// The name goes away once the mount is detached.
	eventually(t, "lazy detach", func() bool {
		_, err := os.Stat(tc.path("d.raw"))
		return os.IsNotExist(err)
	})
	select {
	case err := <-done:
		t.Fatalf("Unmount returned (%v) with a file still open", err)
	default:
	}
	if _, err := f.WriteAt([]byte("after detach"), 0); err != nil {
		t.Errorf("write on the detached mount: %v", err)
	}
	f.Close()
	if err := <-done; err != nil {
		t.Errorf("Unmount: %v", err)
	}
	tc.srv = nil
	d, err := tc.store.OpenDisk("d.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got := make([]byte, 12)
	if _, err := d.ReadAt(got, 0); err != nil || string(got) != "after detach" {
		t.Errorf("store reads %q, %v", got, err)
	}
}

// TestExternalUnmount: Wait returns when someone else unmounts (umount),
// and handles the kernel never released are closed.
func TestExternalUnmount(t *testing.T) {
	tc := newTestCase(t)
	if err := os.WriteFile(tc.path("d.raw"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("umount", tc.mnt).CombinedOutput()
	if err != nil {
		t.Fatalf("umount: %v: %s", err, out)
	}
	tc.srv.Wait()
	v := tc.srv.vfs
	v.mu.Lock()
	closed, left := v.mu.closed, len(v.mu.files)
	v.mu.Unlock()
	if !closed || left != 0 {
		t.Errorf("after Wait: closed %v, %d handles left", closed, left)
	}
	if err := tc.srv.Unmount(); err != nil {
		t.Errorf("Unmount after umount: %v", err)
	}
	tc.srv = nil
}
