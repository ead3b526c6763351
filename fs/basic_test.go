package fs

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
)

// TestCreateWriteReadStat covers the life of a disk file through the
// mount: create, write, read, stat, readdir, chmod/chown/utimes, truncate,
// rename, unlink, and that it all survives a remount.
func TestCreateWriteReadStat(t *testing.T) {
	tc := newTestCase(t)
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)

	f, err := os.OpenFile(tc.path("a.raw"), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("0123456789abcdef"), 70000) // 1.07 MiB, not block-sized
	if _, err := f.WriteAt(data, 1000); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data)+1000)
	if n, err := f.ReadAt(got, 0); err != nil || n != len(got) {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	if !isZero(got[:1000]) || !bytes.Equal(got[1000:], data) {
		t.Fatal("read back differs from what was written")
	}
	// A read past the end is short, and at the end empty.
	if n, err := f.ReadAt(make([]byte, 4096), int64(len(got))-10); n != 10 {
		t.Errorf("read across the end: %d bytes, %v; want 10", n, err)
	}
	if n, _ := f.ReadAt(make([]byte, 4096), int64(len(got))); n != 0 {
		t.Errorf("read at the end: %d bytes, want 0", n)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	st := stat(t, tc.path("a.raw"))
	if st.Mode != syscall.S_IFREG|0o640 {
		t.Errorf("mode %o, want %o", st.Mode, syscall.S_IFREG|0o640)
	}
	if st.Size != int64(len(got)) || st.Nlink != 1 || st.Uid != 0 || st.Gid != 0 {
		t.Errorf("stat %+v", st)
	}
	if st.Blksize < 4096 {
		t.Errorf("st_blksize %d < 4096", st.Blksize)
	}
	info, err := tc.store.Stat("a.raw")
	if err != nil {
		t.Fatal(err)
	}
	if st.Blocks != info.Allocated/512 || st.Blocks == 0 {
		t.Errorf("st_blocks %d, allocated %d bytes", st.Blocks, info.Allocated)
	}
	if st.Ino != inoOf(info.ID) {
		t.Errorf("ino %d, want %d", st.Ino, inoOf(info.ID))
	}

	// mknod of a regular file makes an empty disk.
	if err := unix.Mknod(tc.path("b.raw"), unix.S_IFREG|0o600, 0); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(tc.mnt)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		if !e.Type().IsRegular() {
			t.Errorf("%s: type %v", e.Name(), e.Type())
		}
	}
	if !slices.Equal(names, []string{"a.raw", "b.raw"}) {
		t.Errorf("readdir: %q", names)
	}

	// chmod, chown, utimes, truncate by path.
	if err := os.Chmod(tc.path("b.raw"), 0o604); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tc.path("b.raw"), 1234, 5678); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(tc.path("b.raw"), 10<<20); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 600, time.UTC)
	atime := time.Date(2021, 1, 2, 3, 4, 5, 700, time.UTC)
	if err := os.Chtimes(tc.path("b.raw"), atime, mtime); err != nil {
		t.Fatal(err)
	}
	checkB := func(when string) {
		t.Helper()
		st := stat(t, tc.path("b.raw"))
		if st.Mode != syscall.S_IFREG|0o604 || st.Uid != 1234 || st.Gid != 5678 || st.Size != 10<<20 || st.Blocks != 0 {
			t.Errorf("%s: b.raw stat %+v", when, st)
		}
		if got := time.Unix(st.Mtim.Unix()); !got.Equal(mtime) {
			t.Errorf("%s: mtime %v, want %v", when, got, mtime)
		}
		if got := time.Unix(st.Atim.Unix()); !got.Equal(atime) {
			t.Errorf("%s: atime %v, want %v", when, got, atime)
		}
	}
	checkB("before remount")

	// Truncate down and up again: the cut bytes read as zeros.
	if err := os.Truncate(tc.path("a.raw"), 5000); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(tc.path("a.raw"), 9000); err != nil {
		t.Fatal(err)
	}
	b := readAll(t, tc.path("a.raw"))
	if len(b) != 9000 || !bytes.Equal(b[1000:5000], data[:4000]) || !isZero(b[5000:]) {
		t.Errorf("after truncate 5000 then 9000: %d bytes, wrong content", len(b))
	}

	// Rename, rename over an existing disk, RENAME_NOREPLACE, RENAME_EXCHANGE.
	if err := os.Rename(tc.path("a.raw"), tc.path("c.raw")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tc.path("a.raw")); !os.IsNotExist(err) {
		t.Errorf("a.raw after rename: %v", err)
	}
	err = unix.Renameat2(unix.AT_FDCWD, tc.path("c.raw"), unix.AT_FDCWD, tc.path("b.raw"), unix.RENAME_NOREPLACE)
	wantErrno(t, "rename NOREPLACE onto an existing disk", err, unix.EEXIST)
	err = unix.Renameat2(unix.AT_FDCWD, tc.path("c.raw"), unix.AT_FDCWD, tc.path("b.raw"), unix.RENAME_EXCHANGE)
	wantErrno(t, "rename EXCHANGE", err, unix.EINVAL)
	if err := unix.Renameat2(unix.AT_FDCWD, tc.path("c.raw"), unix.AT_FDCWD, tc.path("d.raw"), unix.RENAME_NOREPLACE); err != nil {
		t.Errorf("rename NOREPLACE to a free name: %v", err)
	}
	if err := os.Rename(tc.path("d.raw"), tc.path("a.raw")); err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, tc.path("a.raw")); len(b) != 9000 {
		t.Errorf("a.raw after renames: %d bytes", len(b))
	}
	if err := os.WriteFile(tc.path("e.raw"), []byte("replaced"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tc.path("e.raw"), tc.path("a.raw")); err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, tc.path("a.raw")); string(b) != "replaced" {
		t.Errorf("a.raw after rename over it: %q", b)
	}
	wantErrno(t, "rename of a missing disk", os.Rename(tc.path("nope"), tc.path("x")), unix.ENOENT)

	// Unlink.
	if err := os.Remove(tc.path("a.raw")); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "unlink again", os.Remove(tc.path("a.raw")), unix.ENOENT)
	wantErrno(t, "stat after unlink", unix.Stat(tc.path("a.raw"), new(unix.Stat_t)), unix.ENOENT)

	tc.remount()
	checkB("after remount")
	ents, _ = os.ReadDir(tc.mnt)
	if len(ents) != 1 || ents[0].Name() != "b.raw" {
		t.Errorf("after remount: %v", ents)
	}
}

// TestNamesAndTypes: only regular files exist; everything else is EPERM
// (never ENOSYS), names are checked.
func TestNamesAndTypes(t *testing.T) {
	tc := newTestCase(t)
	if err := os.WriteFile(tc.path("d.raw"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, "mkdir", os.Mkdir(tc.path("dir"), 0o755), unix.EPERM)
	wantErrno(t, "symlink", os.Symlink("d.raw", tc.path("sym")), unix.EPERM)
	wantErrno(t, "link", os.Link(tc.path("d.raw"), tc.path("hard")), unix.EPERM)
	wantErrno(t, "mknod fifo", unix.Mkfifo(tc.path("fifo"), 0o644), unix.EPERM)
	wantErrno(t, "mknod char device", unix.Mknod(tc.path("chr"), unix.S_IFCHR|0o644, int(unix.Mkdev(1, 3))), unix.EPERM)
	wantErrno(t, "mknod block device", unix.Mknod(tc.path("blk"), unix.S_IFBLK|0o644, int(unix.Mkdev(7, 0))), unix.EPERM)
	wantErrno(t, "mknod socket", unix.Mknod(tc.path("sock"), unix.S_IFSOCK|0o644, 0), unix.EPERM)
	wantErrno(t, "rmdir of a disk", unix.Rmdir(tc.path("d.raw")), unix.ENOTDIR)
	_, err := unix.Open(tc.mnt, unix.O_TMPFILE|unix.O_RDWR, 0o600)
	wantErrno(t, "O_TMPFILE", err, unix.EOPNOTSUPP)

	long := string(bytes.Repeat([]byte("x"), image.MaxNameLen+1))
	_, err = os.Create(tc.path(long))
	wantErrno(t, "create with a 256-byte name", err, unix.ENAMETOOLONG)
	_, err = os.Stat(tc.path(long))
	wantErrno(t, "lookup of a 256-byte name", err, unix.ENAMETOOLONG)
	max := string(bytes.Repeat([]byte("y"), image.MaxNameLen))
	if err := os.WriteFile(tc.path(max), []byte("ok"), 0o600); err != nil {
		t.Errorf("create with a 255-byte name: %v", err)
	}
	wantErrno(t, "rename to a 256-byte name", os.Rename(tc.path(max), tc.path(long)), unix.ENAMETOOLONG)

	// ioctl: ENOTTY, never a 0 answer (QEMU's BLKSSZGET probe).
	f := tc.openFile("d.raw", os.O_RDWR, 0)
	_, err = unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET)
	wantErrno(t, "ioctl BLKSSZGET", err, unix.ENOTTY)
	_, err = unix.IoctlGetInt(int(f.Fd()), unix.BLKGETSIZE64)
	wantErrno(t, "ioctl BLKGETSIZE64", err, unix.ENOTTY)

	// The root directory.
	st := stat(t, tc.mnt)
	if st.Mode != syscall.S_IFDIR|0o755 || st.Uid != uint32(os.Geteuid()) {
		t.Errorf("root: %+v", st)
	}
	wantErrno(t, "chmod of the root", os.Chmod(tc.mnt, 0o700), unix.EPERM)
}

// TestStatfs: statfs of the mount describes the store.
func TestStatfs(t *testing.T) {
	tc := newTestCase(t, withStoreSize(1<<30))
	if err := os.WriteFile(tc.path("a.raw"), bytes.Repeat([]byte{1}, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{tc.mnt, tc.path("a.raw")} {
		var sf unix.Statfs_t
		if err := unix.Statfs(p, &sf); err != nil {
			t.Fatal(err)
		}
		info := tc.store.Info()
		bs := int64(info.BlockSize)
		if sf.Bsize != bs || sf.Frsize != bs || sf.Blocks != uint64(info.CapacityBytes/bs) ||
			sf.Bfree != uint64(info.FreeBytes/bs) || sf.Bavail != sf.Bfree || sf.Namelen != 255 ||
			sf.Files != uint64(info.Disks)+sf.Ffree {
			t.Errorf("statfs %s: %+v, store %+v", filepath.Base(p), sf, info)
		}
		if sf.Blocks-sf.Bfree < 3<<20/uint64(bs) {
			t.Errorf("statfs %s: %d blocks used, want at least 3 MiB", filepath.Base(p), sf.Blocks-sf.Bfree)
		}
	}
}

// TestLocks: flock and OFD locks are kept by the kernel (EnableLocks is
// off): they succeed, and a conflicting OFD lock gets EAGAIN, which is
// what cloud-hypervisor and QEMU need to start (docs/CLIENTS.md trap 2).
func TestLocks(t *testing.T) {
	tc := newTestCase(t)
	if err := os.WriteFile(tc.path("d.raw"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	f1 := tc.openFile("d.raw", os.O_RDWR|unix.O_DIRECT, 0)
	f2 := tc.openFile("d.raw", os.O_RDWR|unix.O_DIRECT, 0)
	if err := unix.Flock(int(f1.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("flock: %v", err)
	}
	wantErrno(t, "second flock", unix.Flock(int(f2.Fd()), unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK)
	if err := unix.Flock(int(f1.Fd()), unix.LOCK_UN); err != nil {
		t.Errorf("unlock: %v", err)
	}

	// cloud-hypervisor: an exclusive lock over [0, max(size, blocks*512)).
	wr := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 1 << 20}
	if err := unix.FcntlFlock(f1.Fd(), unix.F_OFD_SETLK, &wr); err != nil {
		t.Fatalf("F_OFD_SETLK write lock: %v", err)
	}
	wantErrno(t, "conflicting F_OFD_SETLK", unix.FcntlFlock(f2.Fd(), unix.F_OFD_SETLK, &wr), unix.EAGAIN)
	get := wr
	if err := unix.FcntlFlock(f2.Fd(), unix.F_OFD_GETLK, &get); err != nil || get.Type != unix.F_WRLCK {
		t.Errorf("F_OFD_GETLK: %v, type %d", err, get.Type)
	}
	wr.Type = unix.F_UNLCK
	if err := unix.FcntlFlock(f1.Fd(), unix.F_OFD_SETLK, &wr); err != nil {
		t.Fatal(err)
	}
	// QEMU: shared locks on bytes 100-103 and 200-203 from both opens.
	for _, f := range []*os.File{f1, f2} {
		for _, start := range []int64{100, 200} {
			rd := unix.Flock_t{Type: unix.F_RDLCK, Start: start, Len: 4}
			if err := unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &rd); err != nil {
				t.Errorf("shared F_OFD_SETLK at %d: %v", start, err)
			}
		}
	}
	// Classic POSIX locks work too.
	if err := unix.FcntlFlock(f1.Fd(), unix.F_SETLK, &unix.Flock_t{Type: unix.F_RDLCK, Start: 0, Len: 10}); err != nil {
		t.Errorf("F_SETLK: %v", err)
	}
}
