//go:build rbd

package fs

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ncw/directio"

	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// With VDISKFS_TEST_RBD set, newTestCase puts each test's store on a new
// RBD image in testutil.RequireCeph's pool, removed when the test ends, so
// that the suite's cases run on RBD (tools/test.sh runs the core ones).

var rbdSeq atomic.Int64

// rbdTestStore returns a new RBD store name for t when VDISKFS_TEST_RBD is
// set, and "" otherwise. The image is created by the format and removed
// when the test ends.
func rbdTestStore(t testing.TB) string {
	t.Helper()
	if os.Getenv("VDISKFS_TEST_RBD") == "" {
		return ""
	}
	pool := testutil.RequireCeph(t)
	name := fmt.Sprintf("rbd:%s/fs-%s-%d-%d", pool, strings.ReplaceAll(t.Name(), "/", "-"), os.Getpid(), rbdSeq.Add(1))
	t.Logf("the store is on the RBD image %s", name)
	t.Cleanup(func() { // after newTestCase's cleanup, which closes the store
		for _, n := range []string{name, name + "-crash"} {
			if _, err := backend.Stat(n); err == nil {
				if err := backend.Remove(n); err != nil {
					t.Errorf("remove %s: %v", n, err)
				}
			}
		}
	})
	return name
}

// rbdCrashCopy copies the image of src, open and locked by the store, to a
// new image: read without the lock, as a crash would leave it.
func rbdCrashCopy(t testing.TB, src string) string {
	t.Helper()
	from, err := backend.Open(src, backend.OpenOptions{ReadOnly: true, NoLock: true})
	if err != nil {
		t.Fatal(err)
	}
	defer from.Close()
	dst := src + "-crash"
	if err := backend.Create(dst, from.Size()); err != nil {
		t.Fatal(err)
	}
	to, err := backend.Open(dst, backend.OpenOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer to.Close()
	buf := directio.AlignedBlock(4 << 20)
	zero := make([]byte, len(buf))
	for off := int64(0); off < from.Size(); off += int64(len(buf)) {
		p := buf[:min(int64(len(buf)), from.Size()-off)]
		if _, err := from.ReadAt(p, off); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(p, zero[:len(p)]) {
			continue // a new image reads zeros already
		}
		if _, err := to.WriteAt(p, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := to.Flush(); err != nil {
		t.Fatal(err)
	}
	return dst
}
