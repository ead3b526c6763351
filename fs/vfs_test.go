package fs

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// gateBackend holds up the first data read after arm until open is
// called.
type gateBackend struct {
	backend.Backend
	mu      sync.Mutex
	armed   bool
	reached chan struct{}
	gate    chan struct{}
}

func (b *gateBackend) arm() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed, b.reached, b.gate = true, make(chan struct{}), make(chan struct{})
}

func (b *gateBackend) open() { close(b.gate) }

func (b *gateBackend) ReadAt(p []byte, off int64) (int, error) {
	b.mu.Lock()
	hold := b.armed
	b.armed = false
	b.mu.Unlock()
	if hold {
		close(b.reached)
		<-b.gate
	}
	return b.Backend.ReadAt(p, off)
}

// TestTruncateUnlinkedOpenDisk: a truncate through /proc/PID/fd of a disk
// unlinked while open comes without a file handle and is served on a
// handle of the open file (withOpenHandle). While it waits for the range
// of a read in flight, the mount must go on serving: an open of another
// disk (which registers its handle) and an O_DIRECT read of another disk
// (on the io_uring transport served by a queue thread, which pins a
// handle) must not wait for it. Before the fix the truncate ran holding
// vfs.mu, which both need: with the range held by a plan that only the
// waiting queue thread could finish, the mount hung.
func TestTruncateUnlinkedOpenDisk(t *testing.T) {
	for _, tr := range []Transport{TransportDev, TransportIOURing} {
		t.Run(string(tr), func(t *testing.T) {
			requireFUSE(t)
			if tr == TransportIOURing {
				requireIOURing(t)
			}
			gb := &gateBackend{}
			tc := newTestCase(t, withMountOptions(Options{Transport: tr}),
				withBackend(func(be backend.Backend) backend.Backend { gb.Backend = be; return gb }))
			testTruncateUnlinkedOpenDisk(t, tc, gb)
		})
	}
}

func testTruncateUnlinkedOpenDisk(t *testing.T, tc *testCase, gb *gateBackend) {
	const bs = 4096
	if err := os.WriteFile(tc.path("a.raw"), make([]byte, 2*bs), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tc.path("b.raw"), make([]byte, 2*bs), 0o644); err != nil {
		t.Fatal(err)
	}
	a := tc.openFile("a.raw", os.O_RDWR, 0)
	b, err := directio.OpenFile(tc.path("b.raw"), os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := os.Remove(tc.path("a.raw")); err != nil {
		t.Fatal(err)
	}

	// A read of a.raw held up in the backend keeps its range.
	gb.arm()
	readDone := make(chan error, 1)
	go func() {
		_, err := a.ReadAt(make([]byte, 100), 1)
		readDone <- err
	}()
	<-gb.reached
	// A truncate of a.raw by path, without a file handle: it waits for
	// that range.
	truncDone := make(chan error, 1)
	go func() { truncDone <- unix.Truncate(fmt.Sprintf("/proc/self/fd/%d", a.Fd()), 0) }()
	time.Sleep(300 * time.Millisecond) // for the SETATTR to reach the wait
	select {
	case err := <-truncDone:
		gb.open()
		t.Fatalf("the truncate did not wait for the read in flight (%v): the test does not test anything", err)
	default:
	}

	// Meanwhile other disks are served.
	probe := func(what string, fn func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s while a truncate waits: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s waited for a truncate of another disk", what)
			gb.open() // let the truncate finish, and with it the probe
			<-done
		}
	}
	probe("O_DIRECT read of b.raw", func() error {
		_, err := b.ReadAt(directio.AlignedBlock(bs), 0)
		return err
	})
	probe("open of b.raw", func() error {
		f, err := os.Open(tc.path("b.raw"))
		if err == nil {
			f.Close()
		}
		return err
	})

	select {
	case <-gb.gate:
	default:
		gb.open()
	}
	if err := <-readDone; err != nil {
		t.Fatalf("read: %v", err)
	}
	select {
	case err := <-truncDone:
		if err != nil {
			t.Fatalf("truncate: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the truncate did not finish after the read did")
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(a.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != 0 {
		t.Fatalf("size after the truncate: %d, want 0", st.Size)
	}
}
