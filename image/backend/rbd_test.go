//go:build rbd

package backend

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// These tests need a Ceph cluster (testutil.RequireCeph): CEPH_CONF names
// its configuration (tools/ceph/cluster.sh start prints it),
// VDISKFS_TEST_RBD_POOL the pool (default rbd). Without one they skip, and
// in CI (CI=true) they fail.

var rbdImageSeq atomic.Int64

// newRBDImage creates an image of size bytes for the test and returns its
// store name; cleanup removes it.
func newRBDImage(t *testing.T, size int64) string {
	t.Helper()
	pool := testutil.RequireCeph(t)
	name := fmt.Sprintf("rbd:%s/backend-%s-%d-%d", pool, strings.ReplaceAll(t.Name(), "/", "-"), os.Getpid(), rbdImageSeq.Add(1))
	if err := Create(name, size); err != nil {
		t.Fatalf("create %s (is the cluster of CEPH_CONF=%s up?): %v", name, os.Getenv("CEPH_CONF"), err)
	}
	t.Cleanup(func() {
		if err := Remove(name); err != nil {
			t.Errorf("remove %s: %v", name, err)
		}
	})
	return name
}

func openRBDTest(t *testing.T, name string, opts OpenOptions) *RBD {
	t.Helper()
	b, err := Open(name, opts)
	if err != nil {
		t.Fatalf("open %s: %v", name, err)
	}
	t.Cleanup(func() { b.Close() })
	return b.(*RBD)
}

// The contract on RBD: size from the image, 512-byte sectors, aligned
// reads and writes at any offset (across the 4 MiB objects), what the
// checks refuse, and the data after a reopen read-only.
func TestRBDReadWrite(t *testing.T) {
	const size = 64 << 20
	name := newRBDImage(t, size)
	r := openRBDTest(t, name, OpenOptions{})
	if r.Size() != size || r.SectorSize() != 512 || !strings.Contains(r.Describe(), "rbd image") ||
		!strings.Contains(r.Describe(), strings.TrimPrefix(name, "rbd:")) {
		t.Fatalf("size %d, sector %d, describe %q", r.Size(), r.SectorSize(), r.Describe())
	}
	if e, _ := EngineOf(r); e != "librbd" {
		t.Errorf("engine %q", e)
	}
	model := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, w := range [][2]int64{{0, 4096}, {4<<20 - 512, 1024}, {8<<20 - 1<<20, 3 << 20}, {size - 512, 512}, {12345 * 512, 77 * 512}} {
		p := alignedBuffer(int(w[1]), 4096)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		if n, err := r.WriteAt(p, w[0]); err != nil || n != len(p) {
			t.Fatalf("write %d at %d: %d, %v", len(p), w[0], n, err)
		}
		copy(model[w[0]:], p)
	}
	if n, err := r.WriteAtDurable(alignedBuffer(512, 512), 1<<20); err != nil || n != 512 {
		t.Fatalf("durable write: %d, %v", n, err)
	}
	clear(model[1<<20 : 1<<20+512])
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
	check := func(b Backend) {
		t.Helper()
		got := alignedBuffer(size, 4096)
		for off := int64(0); off < size; off += 4 << 20 {
			if n, err := b.ReadAt(got[off:off+4<<20], off); err != nil || n != 4<<20 {
				t.Fatalf("read at %d: %d, %v", off, n, err)
			}
		}
		if !bytes.Equal(got, model) {
			t.Fatal("the image does not read back what was written")
		}
	}
	check(r)

	buf := alignedBuffer(8192, 4096)
	for _, c := range []struct {
		what string
		err  error
		want error
	}{
		{"unaligned offset", firstErr(r.ReadAt(buf[:512], 100)), ErrUnaligned},
		{"unaligned length", firstErr(r.WriteAt(buf[:100], 0)), ErrUnaligned},
		{"unaligned buffer", firstErr(r.ReadAt(buf[1:513], 0)), ErrUnaligned},
		{"past the end", firstErr(r.ReadAt(buf[:1024], size-512)), ErrOutOfRange},
		{"zeroes past the end", r.WriteZeroes(size, 512), ErrOutOfRange},
	} {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: %v, want %v", c.what, c.err, c.want)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if _, err := r.ReadAt(buf[:512], 0); !errors.Is(err, ErrClosed) {
		t.Errorf("read after close: %v", err)
	}

	ro := openRBDTest(t, name, OpenOptions{ReadOnly: true})
	check(ro)
	if _, err := ro.WriteAt(buf[:512], 0); !errors.Is(err, ErrReadOnly) {
		t.Errorf("write on a read-only open: %v", err)
	}
}

func firstErr(_ int, err error) error { return err }

// Many goroutines at once (queue depth 32) write and read 4 KiB blocks;
// each reads back its own writes and the image ends as the model says.
func TestRBDParallel(t *testing.T) {
	const size, bs, workers, perWorker = 32 << 20, 4096, 32, 64
	name := newRBDImage(t, size)
	r := openRBDTest(t, name, OpenOptions{})
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			p, q := alignedBuffer(bs, 4096), alignedBuffer(bs, 4096)
			for i := range perWorker {
				// Worker w owns the blocks b with b % workers == w.
				blk := int64(rng.IntN(size/bs/workers)*workers + w)
				for j := range p {
					p[j] = byte(w + i + j)
				}
				if _, err := r.WriteAt(p, blk*bs); err != nil {
					errs <- err
					return
				}
				if _, err := r.ReadAt(q, blk*bs); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(p, q) {
					errs <- fmt.Errorf("worker %d: block %d reads back other bytes", w, blk)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// WriteZeroes zeroes exactly its range, also in part of an object; a
// discard is accepted.
func TestRBDDiscardWriteZeroes(t *testing.T) {
	const size = 16 << 20
	name := newRBDImage(t, size)
	r := openRBDTest(t, name, OpenOptions{})
	p := alignedBuffer(12<<20, 4096)
	for i := range p {
		p[i] = byte(i%251 + 1)
	}
	if _, err := r.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	zOff, zLen := int64(1<<20+512), int64(8<<20-1024) // crosses two object boundaries, partial at both ends
	if err := r.WriteZeroes(zOff, zLen); err != nil {
		t.Fatal(err)
	}
	clear(p[zOff : zOff+zLen])
	got := alignedBuffer(12<<20, 4096)
	if _, err := r.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, p); i >= 0 {
		t.Fatalf("after write zeroes [%d, %d): byte %d is %d, want %d", zOff, zOff+zLen, i, got[i], p[i])
	}
	if err := r.Discard(4<<20, 8<<20); err != nil {
		t.Fatalf("discard: %v", err)
	}
	if err := r.Discard(512, 1024); err != nil {
		t.Fatalf("discard of part of an object: %v", err)
	}
	if err := r.Flush(); err != nil {
		t.Fatal(err)
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// A second opener, read-write or read-only, is refused with ErrLocked
// naming the holder; an opener without the lock is not; once the holder
// closes, the next one gets the lock.
func TestRBDLock(t *testing.T) {
	name := newRBDImage(t, 8<<20)
	a := openRBDTest(t, name, OpenOptions{})
	holder := LockHolder(a)
	if !strings.HasPrefix(holder, "client.") || !strings.Contains(holder, " at ") || !FencesOtherHosts(a) {
		t.Fatalf("holder %q, fences %v", holder, FencesOtherHosts(a))
	}
	for _, ro := range []bool{false, true} {
		b, err := Open(name, OpenOptions{ReadOnly: ro})
		if err == nil {
			b.Close()
			t.Fatalf("read-only %v: a second open of a locked image succeeded", ro)
		}
		// The error names the holder as its client and address.
		addr := holder[strings.Index(holder, " at ")+4:]
		if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), strings.Fields(holder)[0]) {
			t.Errorf("read-only %v: %v; want ErrLocked naming %s", ro, err, holder)
		}
	}
	nl := openRBDTest(t, name, OpenOptions{ReadOnly: true, NoLock: true})
	if _, err := nl.ReadAt(alignedBuffer(512, 512), 0); err != nil || FencesOtherHosts(nl) {
		t.Errorf("read without the lock: %v (fences %v)", err, FencesOtherHosts(nl))
	}
	if _, err := a.WriteAt(alignedBuffer(4096, 4096), 0); err != nil {
		t.Fatalf("the holder's write: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := openRBDTest(t, name, OpenOptions{})
	if _, err := b.WriteAt(alignedBuffer(4096, 4096), 0); err != nil {
		t.Fatalf("write after taking the lock over: %v", err)
	}
}

// BreakLock blocklists the holder: its writes and flushes then fail with
// ErrFenced and ESHUTDOWN, and a new opener gets the lock.
func TestRBDBreakLock(t *testing.T) {
	name := newRBDImage(t, 8<<20)
	if broken, err := BreakLock(name); err != nil || len(broken) != 0 {
		t.Fatalf("break of a free lock: %v, %v", broken, err)
	}
	a := openRBDTest(t, name, OpenOptions{})
	p := alignedBuffer(4096, 4096)
	if _, err := a.WriteAt(p, 0); err != nil {
		t.Fatal(err)
	}
	broken, err := BreakLock(name)
	if err != nil || len(broken) != 1 || !strings.Contains(broken[0], strings.Fields(LockHolder(a))[2]) {
		t.Fatalf("break: %v, %v; want the holder %s", broken, err, LockHolder(a))
	}
	_, err = a.WriteAt(p, 4096)
	if !errors.Is(err, ErrFenced) || !errors.Is(err, syscall.ESHUTDOWN) || !strings.Contains(err.Error(), "blocklisted") {
		t.Errorf("write of the broken holder: %v; want ErrFenced, ESHUTDOWN", err)
	}
	if err := a.Flush(); !errors.Is(err, ErrFenced) {
		t.Errorf("flush of the broken holder: %v", err)
	}
	b := openRBDTest(t, name, OpenOptions{})
	if _, err := b.WriteAt(p, 8192); err != nil {
		t.Fatalf("the new holder's write: %v", err)
	}
	a.Close() // a blocklisted client's close may fail; it must not hang
}

// Stat, Create and Remove of images; a missing pool and a build without
// the image say what is wrong.
func TestRBDStatCreateRemove(t *testing.T) {
	name := newRBDImage(t, 8<<20)
	if info, err := Stat(name); err != nil || info.Kind != KindRBD || info.Size != 8<<20 {
		t.Fatalf("stat: %+v, %v", info, err)
	}
	if err := Create(name, 8<<20); !errors.Is(err, os.ErrExist) {
		t.Errorf("create over an image: %v", err)
	}
	missing := name + "-missing"
	if _, err := Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat of a missing image: %v", err)
	}
	if _, err := Open(missing, OpenOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("open of a missing image: %v", err)
	}
	if _, err := Stat("rbd:no-such-pool-vdiskfs/x"); err == nil || !strings.Contains(err.Error(), "pool \"no-such-pool-vdiskfs\" does not exist") {
		t.Errorf("stat in a missing pool: %v", err)
	}
	if _, err := Open(name+":conf=/nonexistent/ceph.conf", OpenOptions{}); err == nil || !strings.Contains(err.Error(), "/nonexistent/ceph.conf") {
		t.Errorf("open with a missing configuration file: %v", err)
	}
}
