package image

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// quietLogger keeps expected warnings out of test output.
func quietLogger() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// testOptions are the options tests open stores with: no timer (commits
// happen when the test says), strict checking after every commit.
func testOptions() Options {
	return Options{CommitInterval: -1, Strict: true, Logger: quietLogger()}
}

// memStore is a store on an in-memory backend that refuses unaligned I/O,
// as O_DIRECT would.
type memStore struct {
	t   testing.TB
	mem *backend.Mem
	s   *Store
}

// newMemStore formats and opens a store of size bytes. At cleanup it runs
// Check and, on findings, saves the image for inspection.
func newMemStore(t testing.TB, size int64, fo FormatOptions) *memStore {
	t.Helper()
	mem := backend.NewMem(size)
	mem.CheckAlignment(512)
	if err := Format(mem, fo); err != nil {
		t.Fatalf("format: %v", err)
	}
	ms := &memStore{t: t, mem: mem}
	ms.open()
	t.Cleanup(func() {
		if ms.s == nil {
			return
		}
		if rep := ms.s.Check(); !rep.Clean() {
			ms.save()
			t.Errorf("check at cleanup: %v", rep.Findings)
		}
		ms.s.Close()
	})
	return ms
}

func (ms *memStore) open() {
	ms.t.Helper()
	s, err := Open(ms.mem, testOptions())
	if err != nil {
		ms.t.Fatalf("open: %v", err)
	}
	ms.s = s
}

// reopen closes the store cleanly and opens it again from the same bytes.
func (ms *memStore) reopen() {
	ms.t.Helper()
	if err := ms.s.Close(); err != nil {
		ms.t.Fatalf("close: %v", err)
	}
	ms.mem.Reopen()
	ms.open()
}

// save writes the backing image next to the test's output for a post-mortem.
func (ms *memStore) save() {
	dir := os.Getenv("VDISK_FAILED_IMAGES")
	if dir == "" {
		dir = os.TempDir()
	}
	path := filepath.Join(dir, sanitize(ms.t.Name())+".img")
	if err := os.WriteFile(path, ms.mem.Bytes(), 0o644); err == nil {
		ms.t.Logf("store image saved to %s", path)
	}
}

func sanitize(s string) string {
	return string(bytes.Map(func(r rune) rune {
		if r == '/' || r == ' ' {
			return '_'
		}
		return r
	}, []byte(s)))
}

func mustCreate(t testing.TB, s *Store, name string, size int64) *Disk {
	t.Helper()
	if _, err := s.Create(name, size, Attr{Mode: 0o644}); err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	d, err := s.OpenDisk(name)
	if err != nil {
		t.Fatalf("open disk %s: %v", name, err)
	}
	return d
}
