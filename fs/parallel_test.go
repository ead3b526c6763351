package fs

import (
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image/backend"
)

// slowBackend delays large (data) writes and records how many run at once.
type slowBackend struct {
	backend.Backend
	delay        time.Duration
	now, maxSeen atomic.Int64
	writes       atomic.Int64
}

func (b *slowBackend) WriteAt(p []byte, off int64) (int, error) {
	if len(p) < 64<<10 { // superblock, journal: not data of this test
		return b.Backend.WriteAt(p, off)
	}
	b.writes.Add(1)
	n := b.now.Add(1)
	for {
		m := b.maxSeen.Load()
		if n <= m || b.maxSeen.CompareAndSwap(m, n) {
			break
		}
	}
	time.Sleep(b.delay)
	defer b.now.Add(-1)
	return b.Backend.WriteAt(p, off)
}

func (b *slowBackend) reset() { b.maxSeen.Store(0); b.writes.Store(0) }

// TestParallelDirectWrites: O_DIRECT writes to one file reach the backend
// in parallel, from threads (FOPEN_PARALLEL_DIRECT_WRITES, docs/CLIENTS.md trap
// 4) and from Linux AIO submitted by one thread (CAP_ASYNC_DIO and a raised
// MaxBackground, trap 3). Without those settings the kernel sends them one
// at a time and the backend never sees two at once.
func TestParallelDirectWrites(t *testing.T) {
	sb := &slowBackend{delay: 30 * time.Millisecond}
	tc := newTestCase(t, withBackend(func(be backend.Backend) backend.Backend { sb.Backend = be; return sb }))
	const (
		n     = 16
		chunk = 256 << 10
	)
	if err := os.WriteFile(tc.path("d.raw"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// Writes inside the size: the kernel takes its inode lock exclusively
	// for writes that extend the file.
	if err := os.Truncate(tc.path("d.raw"), n*chunk); err != nil {
		t.Fatal(err)
	}
	f := tc.openFile("d.raw", os.O_RDWR|syscall.O_DIRECT, 0)

	// Threads: n goroutines, each one pwrite.
	sb.reset()
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := directio.AlignedBlock(chunk)
			buf[0] = byte(i)
			if _, err := f.WriteAt(buf, int64(i)*chunk); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	t.Logf("pwrite from %d threads: %d backend writes, at most %d at once", n, sb.writes.Load(), sb.maxSeen.Load())
	if sb.maxSeen.Load() < 4 {
		t.Errorf("O_DIRECT pwrites from %d threads: at most %d backend writes at once; want parallel writes", n, sb.maxSeen.Load())
	}

	// Linux AIO: one io_submit of n writes, as QEMU aio=native does.
	sb.reset()
	if err := aioWrite(int(f.Fd()), n, chunk); err != nil {
		t.Fatalf("aio: %v", err)
	}
	t.Logf("io_submit of %d writes: %d backend writes, at most %d at once", n, sb.writes.Load(), sb.maxSeen.Load())
	if sb.maxSeen.Load() < 4 {
		t.Errorf("AIO O_DIRECT writes: at most %d backend writes at once; want parallel writes", sb.maxSeen.Load())
	}
	got := directio.AlignedBlock(chunk)
	for i := range n {
		if _, err := f.ReadAt(got, int64(i)*chunk); err != nil || got[0] != byte(i+100) {
			t.Errorf("chunk %d: first byte %d, %v", i, got[0], err)
		}
	}
}

// Linux AIO ABI (include/uapi/linux/aio_abi.h), little endian.
// Fields we never set are blank: they only keep the layout.
type iocb struct {
	data   uint64
	_      uint32 // key
	_      uint32 // rw_flags
	opcode uint16
	_      int16 // reqprio
	fildes uint32
	buf    uint64
	nbytes uint64
	offset int64
	_      uint64 // reserved2
	_      uint32 // flags
	_      uint32 // resfd
}

type ioEvent struct {
	data, obj uint64
	res, res2 int64
}

const iocbCmdPwrite = 1

// aioWrite submits n O_DIRECT writes of size bytes at i*size (content
// i+100) with one io_submit and waits for all of them.
func aioWrite(fd, n, size int) error {
	var ctx uintptr
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, uintptr(n), uintptr(unsafe.Pointer(&ctx)), 0); e != 0 {
		return e
	}
	defer unix.Syscall(unix.SYS_IO_DESTROY, ctx, 0, 0)
	cbs := make([]iocb, n)
	ptrs := make([]*iocb, n)
	bufs := make([][]byte, n)
	for i := range n {
		bufs[i] = directio.AlignedBlock(size)
		bufs[i][0] = byte(i + 100)
		cbs[i] = iocb{data: uint64(i), opcode: iocbCmdPwrite, fildes: uint32(fd),
			buf: uint64(uintptr(unsafe.Pointer(&bufs[i][0]))), nbytes: uint64(size), offset: int64(i * size)}
		ptrs[i] = &cbs[i]
	}
	r, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, ctx, uintptr(n), uintptr(unsafe.Pointer(&ptrs[0])))
	if e != 0 {
		return e
	}
	if int(r) != n {
		return syscall.EAGAIN
	}
	events := make([]ioEvent, n)
	for done := 0; done < n; {
		got, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, ctx, 1, uintptr(n-done), uintptr(unsafe.Pointer(&events[done])), 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return e
		}
		done += int(got)
	}
	for _, ev := range events {
		if ev.res != int64(size) {
			return syscall.Errno(-ev.res)
		}
	}
	// Keep the buffers and control blocks alive until here.
	_ = bufs[n-1][0]
	_ = cbs[n-1]
	return nil
}
