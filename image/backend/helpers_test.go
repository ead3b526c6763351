package backend

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ncw/directio"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// aligned returns a 4096-aligned buffer of n bytes filled with a pattern
// derived from seed, so that different writes are told apart.
func aligned(n int, seed byte) []byte {
	b := directio.AlignedBlock(n)
	fill(b, seed)
	return b
}

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i/512) + byte(i*7)
	}
}

// newStoreFile creates a sparse store file of size bytes in a temporary
// directory on the disk (t.TempDir is on ext4 here) and returns its path.
func newStoreFile(t *testing.T, size int64) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "store.img")
	if err := CreateFile(path, size); err != nil {
		t.Fatalf("CreateFile: %v", err)
	}
	return path
}

// mustOpen opens path and closes it at the end of the test.
func mustOpen(t *testing.T, path string, opts OpenOptions) Backend {
	t.Helper()
	b, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%q, %+v): %v", path, opts, err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func mustWrite(t *testing.T, b Backend, p []byte, off int64) {
	t.Helper()
	if n, err := b.WriteAt(p, off); err != nil || n != len(p) {
		t.Fatalf("WriteAt(%d bytes at %d) = %d, %v", len(p), off, n, err)
	}
}

// readBack reads n bytes at off into a fresh aligned buffer.
func readBack(t *testing.T, b Backend, off int64, n int) []byte {
	t.Helper()
	p := directio.AlignedBlock(n)
	if got, err := b.ReadAt(p, off); err != nil || got != n {
		t.Fatalf("ReadAt(%d bytes at %d) = %d, %v", n, off, got, err)
	}
	return p
}

func wantZeros(t *testing.T, what string, p []byte) {
	t.Helper()
	if i := bytes.IndexFunc(p, func(r rune) bool { return r != 0 }); i >= 0 {
		t.Fatalf("%s: byte %d is %#x, want all zeros", what, i, p[i])
	}
}

func wantErrIs(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: error %v, want one wrapping %v", what, err, target)
	}
}

// allocatedBytes returns the space a file takes (st_blocks * 512).
func allocatedBytes(t *testing.T, path string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func requireRoot(t *testing.T, what string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("%s needs root", what)
	}
}

// newLoopDevice attaches a loop device over a new sparse file of size bytes
// with the given logical sector size (0 for the default) and returns its
// path. It is detached in t.Cleanup, also when the test fails. Without root
// the test is skipped; when losetup fails the test is skipped too, except in
// CI (CI=true), where it fails.
func newLoopDevice(t *testing.T, size int64, sectorSize int) string {
	t.Helper()
	requireRoot(t, "a loop device")
	img := filepath.Join(t.TempDir(), "loop.img")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	args := []string{"--find", "--show"}
	if sectorSize != 0 {
		args = append(args, "--sector-size", fmt.Sprint(sectorSize))
	}
	args = append(args, img)
	out, err := exec.Command("losetup", args...).CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("losetup %s: %v: %s", strings.Join(args, " "), err, out)
		testutil.Missing(t, "%s", msg)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	return dev
}
