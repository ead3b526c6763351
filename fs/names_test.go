package fs

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
)

// TestBadNames creates, makes, renames, looks up and removes disks with
// bad and borderline names through the mount. A name the store cannot
// hold is refused with the errno a file system gives (ENAMETOOLONG past
// 255 bytes, EINVAL for what is not UTF-8); the VFS itself refuses what
// never reaches us (empty, ".", "..", '/' inside); nothing is created by
// a refused call, and valid odd names work like any other.
func TestBadNames(t *testing.T) {
	tc := newTestCase(t, withStoreOptions(image.Options{CommitInterval: -1}))
	long := func(n int) string { return strings.Repeat("n", n) }
	cases := []struct {
		name  string
		errno unix.Errno // 0: must work
	}{
		{long(255), 0},
		{long(256), unix.ENAMETOOLONG},
		{long(1024), unix.ENAMETOOLONG}, // the kernel lets up to 1024 bytes through to FUSE
		{long(1025), unix.ENAMETOOLONG}, // the kernel's own limit
		{long(4096), unix.ENAMETOOLONG}, // longer than PATH_MAX
		{"\xff\xfe.raw", unix.EINVAL},
		{"bad\xc3", unix.EINVAL},
		{"", unix.EISDIR},   // "mnt/": the directory itself
		{".", unix.EEXIST},  // O_EXCL on the directory
		{"..", unix.EEXIST}, // its parent
		{"a/b", unix.ENOENT},
		{"new\nline.raw", unix.EINVAL},
		{"with space.raw", 0},
		{"ディスク.raw", 0},
		{"-rf", 0},
		{"...", 0},
	}
	var made []string
	for _, c := range cases {
		path := tc.mnt + "/" + c.name // not filepath.Join, which cleans "." and ".." away
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
		if c.errno == 0 {
			if err != nil {
				t.Errorf("create %q: %v", c.name, err)
				continue
			}
			if _, err := f.Write([]byte("data")); err != nil {
				t.Errorf("write %q: %v", c.name, err)
			}
			f.Close()
			made = append(made, c.name)
			continue
		}
		if err == nil {
			f.Close()
			t.Errorf("create %q (%d bytes) succeeded", c.name, len(c.name))
			continue
		}
		wantErrno(t, "create "+shortName(c.name), err, c.errno)
		if c.name == "" || c.name == "." || c.name == ".." || strings.Contains(c.name, "/") {
			continue // refused by the VFS: no FUSE request
		}
		wantErrno(t, "mknod "+shortName(c.name), unix.Mknod(path, unix.S_IFREG|0o600, 0), c.errno)
		_, err = os.Stat(path)
		if c.errno == unix.EINVAL {
			wantErrno(t, "stat "+shortName(c.name), err, unix.ENOENT) // a lookup of a name that cannot exist
		} else {
			wantErrno(t, "stat "+shortName(c.name), err, c.errno)
		}
		if err := os.Rename(tc.path(long(255)), path); err != nil {
			wantErrno(t, "rename to "+shortName(c.name), err, c.errno)
		} else {
			t.Errorf("rename to %s succeeded", shortName(c.name))
			os.Rename(path, tc.path(long(255)))
		}
	}
	// Other kinds of file are refused whatever the name.
	wantErrno(t, "mkdir", os.Mkdir(tc.path("dir"), 0o755), unix.EPERM)
	wantErrno(t, "symlink", os.Symlink("x", tc.path("link")), unix.EPERM)
	wantErrno(t, "link", os.Link(tc.path("-rf"), tc.path("hard")), unix.EPERM)
	wantErrno(t, "mknod of a fifo", unix.Mknod(tc.path("fifo"), unix.S_IFIFO|0o600, 0), unix.EPERM)

	// Exactly the valid names exist, in the mount and in the store.
	ents, err := os.ReadDir(tc.mnt)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, e := range ents {
		listed = append(listed, e.Name())
	}
	slices.Sort(listed)
	slices.Sort(made)
	if !slices.Equal(listed, made) {
		t.Errorf("readdir lists %q, want %q", listed, made)
	}
	if n := len(tc.store.List()); n != len(made) {
		t.Errorf("the store has %d disks, want %d", n, len(made))
	}
	tc.remount()
	for _, name := range made {
		if got := readAll(t, tc.path(name)); string(got) != "data" {
			t.Errorf("%s after a remount: %q", shortName(name), got)
		}
		if err := os.Remove(tc.path(name)); err != nil {
			t.Errorf("remove %s: %v", shortName(name), err)
		}
	}
}

// shortName quotes a name for messages, eliding long ones.
func shortName(s string) string {
	if len(s) > 20 {
		return fmt.Sprintf("%q…(%d bytes)", s[:10], len(s))
	}
	return fmt.Sprintf("%q", s)
}
