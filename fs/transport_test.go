package fs

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/fs/fuseuring"
)

// TestTransports runs one client workload over each FUSE transport: what a
// hypervisor and an operator do to a disk, with more requests in flight
// than an io_uring queue has entries. The rest of the suite runs on the
// default (auto: io_uring where the kernel has it, as in CI).
func TestTransports(t *testing.T) {
	for _, tr := range []Transport{TransportIOURing, TransportDev} {
		t.Run(string(tr), func(t *testing.T) {
			requireFUSE(t)
			if tr == TransportIOURing {
				requireIOURing(t)
			}
			tc := newTestCase(t, withMountOptions(Options{Transport: tr}))
			if got := tc.srv.Transport(); got != string(tr) {
				t.Fatalf("mount with Transport %q serves over %q", tr, got)
			}
			exerciseDisk(t, tc)
		})
	}
}

// TestTransportAuto: the default mount uses io_uring when the kernel has
// it (turning the module parameter on, as root).
func TestTransportAuto(t *testing.T) {
	requireFUSE(t)
	requireIOURing(t)
	t.Setenv("VDISKFS_TEST_TRANSPORT", "") // this test is of the default
	tc := newTestCase(t)
	if got := tc.srv.Transport(); got != string(TransportIOURing) {
		t.Fatalf("default mount serves over %q, want io_uring", got)
	}
}

// requireIOURing skips a test on a kernel built without FUSE-over-io_uring
// (no enable_uring parameter) and fails it when the parameter cannot be
// turned on.
func requireIOURing(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(fuseuring.EnableParam); errors.Is(err, os.ErrNotExist) {
		t.Skipf("kernel without FUSE-over-io_uring: %v", err)
	}
	if err := fuseuring.Enable(); err != nil {
		t.Fatal(err)
	}
}

func exerciseDisk(t *testing.T, tc *testCase) {
	const size = 64 << 20
	name := tc.path("d.raw")
	if err := os.WriteFile(name, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(name, size); err != nil {
		t.Fatal(err)
	}
	f, err := directio.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	// Large aligned writes and reads, as a guest's sequential I/O.
	big := directio.AlignedBlock(1 << 20)
	fill(big, 1)
	for off := int64(0); off < 8<<20; off += 1 << 20 {
		if _, err := f.WriteAt(big, off); err != nil {
			t.Fatalf("1 MiB write at %d: %v", off, err)
		}
	}
	got := directio.AlignedBlock(1 << 20)
	if _, err := f.ReadAt(got, 3<<20); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("1 MiB read back: err %v, equal %v", err, bytes.Equal(got, big))
	}

	// 4 KiB random writes and reads from 96 goroutines at once (an
	// io_uring queue has 64 entries), each in its own stripe.
	const workers, per = 96, 40
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			wb, rb := directio.AlignedBlock(4096), directio.AlignedBlock(4096)
			stripe := int64(8<<20) + int64(w)*(512<<10)
			for i := range per {
				off := stripe + rng.Int64N(128)*4096
				fill(wb, byte(w*per+i))
				if _, err := f.WriteAt(wb, off); err != nil {
					errs <- fmt.Errorf("worker %d write at %d: %w", w, off, err)
					return
				}
				if _, err := f.ReadAt(rb, off); err != nil || !bytes.Equal(rb, wb) {
					errs <- fmt.Errorf("worker %d read at %d: err %v, equal %v", w, off, err, bytes.Equal(rb, wb))
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
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync: %v", err)
	}

	// Discard, as a guest's TRIM: the range reads back as zeros.
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 1<<20, 1<<20); err != nil {
		t.Fatalf("punch hole: %v", err)
	}
	if _, err := f.ReadAt(got, 1<<20); err != nil || !isZero(got) {
		t.Fatalf("read of the punched range: err %v, zero %v", err, isZero(got))
	}

	// An advisory lock, as QEMU takes on its image.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatalf("flock: %v", err)
	}

	// Unaligned buffered I/O, as cp and dd without O_DIRECT.
	if err := os.WriteFile(tc.path("small.raw"), []byte("hello, disk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, tc.path("small.raw")); string(b) != "hello, disk" {
		t.Fatalf("small file reads back %q", b)
	}
	if err := os.Rename(tc.path("small.raw"), tc.path("renamed.raw")); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(tc.mnt)
	if err != nil || len(ents) != 2 {
		t.Fatalf("readdir: %v, %d entries", err, len(ents))
	}
	if st := stat(t, name); st.Size != size {
		t.Fatalf("size %d, want %d", st.Size, size)
	}
	if err := os.Remove(tc.path("renamed.raw")); err != nil {
		t.Fatal(err)
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v + byte(i/4096)
	}
}
