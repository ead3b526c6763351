package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCatalogMounted: ls, info and fsck of a mounted store work given its
// mount point and given the store's path, through the daemon; fsck
// --repair is refused, saying the store must be unmounted; once it is,
// the same commands open the store as before and see the same thing.
func TestCatalogMounted(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1M")
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	data := randomBytes(2<<20, 40)
	if err := os.WriteFile(filepath.Join(mnt, "b.raw"), data, 0o640); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "snapshot", filepath.Join(mnt, "b.raw"), "b-snap")
	for _, arg := range []string{mnt, store} {
		t.Run(filepath.Base(arg), func(t *testing.T) {
			ds := listDisks(t, arg)
			if len(ds) != 3 || ds[0].Name != "a.raw" || ds[1].Name != "b-snap" || ds[2].Name != "b.raw" {
				t.Fatalf("ls --json %s: %+v", arg, ds)
			}
			if b := ds[2]; b.Size != 2<<20 || b.Allocated != 2<<20 || b.Shared != 2<<20 || b.Mode != "0640" {
				t.Errorf("b.raw: %+v", b)
			}
			if s := ds[1]; !s.Snapshot || s.Origin != "b.raw" {
				t.Errorf("b-snap: %+v", s)
			}
			if out := mustRun(t, "ls", arg).stdout; !strings.Contains(out, "snapshot of b.raw") || !strings.HasPrefix(out, "NAME") {
				t.Errorf("ls %s:\n%s", arg, out)
			}
			var in infoJSON
			if err := json.Unmarshal([]byte(mustRun(t, "info", "--json", arg).stdout), &in); err != nil {
				t.Fatal(err)
			}
			if in.Disks != 3 || in.Snapshots != 1 || in.FormatVersion != 2 || in.MappedBytes != 4<<20 || in.SharedBytes != 4<<20 ||
				in.BlockSize == 0 || in.Used == 0 {
				t.Errorf("info --json %s: %+v", arg, in)
			}
			if out := mustRun(t, "info", arg).stdout; !strings.Contains(out, "disks:") || !strings.Contains(out, "snapshots: 1") {
				t.Errorf("info %s:\n%s", arg, out)
			}
			r := mustRun(t, "fsck", arg)
			if !strings.Contains(r.stdout, "checking "+store+", mounted at "+mnt) || !strings.Contains(r.stdout, "result: clean (exit 0)") ||
				!strings.Contains(r.stdout, "3 disks") {
				t.Errorf("fsck %s:\n%s", arg, r.stdout)
			}
			res, code := fsckJSON(t, arg)
			if code != exitOK || res.Mountpoint != mnt || res.Store != store || res.Summary.Disks != 3 || res.Summary.BlockSize == 0 {
				t.Errorf("fsck --json %s: exit %d: %+v", arg, code, res)
			}
			wantFail(t, exitFailure, []string{"a repair needs it unmounted", "vdisk umount " + mnt, "vdisk fsck --repair " + store},
				"fsck", "--repair", arg)
		})
	}
	mustRun(t, "umount", mnt)
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	// Unmounted, the same commands open the store themselves.
	if ds := listDisks(t, store); len(ds) != 3 || ds[2].Name != "b.raw" || ds[2].Size != 2<<20 {
		t.Errorf("ls after umount: %+v", ds)
	}
	if r := mustRun(t, "fsck", store); !strings.HasPrefix(r.stdout, "checking "+store+"\n") {
		t.Errorf("offline fsck:\n%s", r.stdout)
	}
	wantFail(t, exitFailure, []string{"a store must be a regular file or a block device", "is no vdiskfs mount point"}, "ls", mnt)
}

// TestChangeMounted: create, resize, rename and rm given a mount point (and
// create given the mounted store's path) change the store through the
// mount: the files show the change at once, errors are refused as offline,
// and the store is clean after the unmount.
func TestChangeMounted(t *testing.T) {
	store := newStore(t)
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	sizeOf := func(name string) (int64, os.FileMode) {
		t.Helper()
		fi, err := os.Stat(filepath.Join(mnt, name))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size(), fi.Mode().Perm()
	}
	if r := mustRun(t, "create", "--mode", "0400", mnt, "b.raw", "2M"); r.stdout != "created b.raw: 2 MiB\n" {
		t.Errorf("create said %q", r.stdout)
	}
	if n, m := sizeOf("b.raw"); n != 2<<20 || m != 0o400 {
		t.Errorf("b.raw: %d bytes, mode %v; want 2 MiB, 0400", n, m)
	}
	mustRun(t, "create", store, "c.raw", "1M")
	if n, m := sizeOf("c.raw"); n != 1<<20 || m != 0o644 {
		t.Errorf("c.raw, created given the store: %d bytes, mode %v", n, m)
	}
	wantFail(t, exitFailure, []string{"exists"}, "create", mnt, "b.raw", "1M")
	wantFail(t, exitFailure, []string{"invalid disk name"}, "create", mnt, "../escape.raw", "1M")
	if _, err := os.Stat(filepath.Join(filepath.Dir(mnt), "escape.raw")); err == nil {
		t.Fatal("create made a file outside the mount")
	}

	mustRun(t, "resize", mnt, "b.raw", "+1M")
	if n, _ := sizeOf("b.raw"); n != 3<<20 {
		t.Errorf("b.raw after +1M: %d bytes", n)
	}
	wantFail(t, exitFailure, []string{"--shrink"}, "resize", mnt, "b.raw", "1M")
	mustRun(t, "resize", "--shrink", mnt, "b.raw", "1M")
	if n, _ := sizeOf("b.raw"); n != 1<<20 {
		t.Errorf("b.raw after shrinking to 1M: %d bytes", n)
	}
	wantFail(t, exitFailure, []string{"no such file"}, "resize", mnt, "none.raw", "1M")

	wantFail(t, exitFailure, []string{"already exists", "--force"}, "rename", mnt, "b.raw", "c.raw")
	mustRun(t, "rename", mnt, "b.raw", "d.raw")
	mustRun(t, "rename", "--force", mnt, "d.raw", "c.raw")
	if n, m := sizeOf("c.raw"); n != 1<<20 || m != 0o400 {
		t.Errorf("c.raw, replaced by d.raw: %d bytes, mode %v", n, m)
	}
	if _, err := os.Stat(filepath.Join(mnt, "b.raw")); !os.IsNotExist(err) {
		t.Errorf("b.raw after its rename: %v", err)
	}

	wantFail(t, exitFailure, []string{"none.raw"}, "rm", mnt, "none.raw", "c.raw")
	if ents, err := os.ReadDir(mnt); err != nil || len(ents) != 0 {
		t.Errorf("the mount after rm: %v, %v", ents, err)
	}
	if ds := listDisks(t, mnt); len(ds) != 0 {
		t.Errorf("ls after rm: %+v", ds)
	}
	mustRun(t, "umount", mnt)
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
}

// TestImportExportMounted: import and export given a mount point, or the
// mounted store's path, go through the mount's files: the disk shows at
// once, holes stay holes, and what is exported is what was imported.
func TestImportExportMounted(t *testing.T) {
	store := newStore(t)
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	src := filepath.Join(t.TempDir(), "src.raw")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	data := randomBytes(1<<20, 42)
	for _, off := range []int64{0, 3 << 20} {
		if _, err := f.WriteAt(data, off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(6 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want := readFileT(t, src)
	for i, arg := range []string{mnt, store} {
		name := []string{"a.raw", "b.raw"}[i]
		r := mustRun(t, "import", "--mode", "0600", arg, name, src)
		if !strings.Contains(r.stdout, "imported "+src+" as "+name+": 6 MiB disk") {
			t.Errorf("import %s said %q", arg, r.stdout)
		}
		if got := readFileT(t, filepath.Join(mnt, name)); string(got) != string(want) {
			t.Errorf("%s on the mount does not read as %s", name, src)
		}
		d := diskByName(t, mnt, name)
		if d.Size != 6<<20 || d.Allocated != 2<<20 || d.Mode != "0600" {
			t.Errorf("%s imported through %s: %+v; want 6 MiB, 2 MiB allocated, mode 0600", name, arg, d)
		}
		dst := filepath.Join(t.TempDir(), "dst.raw")
		mustRun(t, "export", arg, name, dst)
		if got := readFileT(t, dst); string(got) != string(want) {
			t.Errorf("export of %s through %s differs from what was imported", name, arg)
		}
	}
	wantFail(t, exitFailure, []string{"exists"}, "import", mnt, "a.raw", src)
	wantFail(t, exitFailure, []string{"no such file"}, "export", mnt, "none.raw", filepath.Join(t.TempDir(), "x"))
	mustRun(t, "umount", mnt)
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	if d := diskByName(t, store, "b.raw"); d.Size != 6<<20 || d.Allocated != 2<<20 {
		t.Errorf("b.raw after the unmount: %+v", d)
	}
}

// TestMountOf: a directory that is not a mount point, and a store nothing
// mounts, are taken offline.
func TestMountOf(t *testing.T) {
	store := newStore(t)
	for _, arg := range []string{t.TempDir(), store, filepath.Join(t.TempDir(), "missing")} {
		if mnt, _, ok := mountOf(arg); ok {
			t.Errorf("mountOf(%s) = %s", arg, mnt)
		}
	}
}

// TestCatalogDaemon: with the store mounted by a daemon of its own (the
// real binary, another process), ls, info and fsck given the store's path
// go through that mount. Once the daemon is killed, its dead mount still
// names the store as its source, but nothing holds the store: ls of the
// store opens it itself, and ls of the mount point says nothing serves it.
func TestCatalogDaemon(t *testing.T) {
	requireFUSE(t)
	bin := vdiskBinary(t)
	store := newStore(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	startDaemon(t, bin, store, mnt)
	if err := os.WriteFile(filepath.Join(mnt, "a.raw"), randomBytes(1<<20, 41), 0o644); err != nil {
		t.Fatal(err)
	}
	if ds := listDisks(t, store); len(ds) != 1 || ds[0].Name != "a.raw" || ds[0].Allocated != 1<<20 {
		t.Errorf("ls --json STORE of a daemon's mount: %+v", ds)
	}
	if r := mustRun(t, "fsck", store); !strings.Contains(r.stdout, "mounted at "+mnt) {
		t.Errorf("fsck STORE of a daemon's mount:\n%s", r.stdout)
	}
	mustRun(t, "create", store, "b.raw", "1M")
	mustRun(t, "umount", mnt) // commits b.raw's creation: the kill below loses nothing
	killDaemon(t, startDaemon(t, bin, store, mnt))
	if ds := listDisks(t, store); len(ds) != 2 || ds[1].Name != "b.raw" {
		t.Errorf("ls --json STORE after its daemon was killed: %+v", ds)
	}
	wantFail(t, exitFailure, []string{"no vdiskfs mount is serving there"}, "ls", mnt)
	if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
}

// TestFsckMountedLeak: fsck of a mounted store with leaked blocks (the
// leak fixture) exits 2 as offline, and says how to repair it; --repair is
// refused while it is mounted and repairs it once it is not.
func TestFsckMountedLeak(t *testing.T) {
	store := unpackFixture(t, "leak")
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	r := wantFail(t, exitLeaks, nil, "fsck", mnt)
	for _, want := range []string{"mounted at " + mnt, "leaked-blocks", "result: only leaked blocks", "(exit 2)",
		"to repair: vdisk umount " + mnt + ", then vdisk fsck --repair " + store} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("fsck of a mounted store with a leak lacks %q:\n%s", want, r.stdout)
		}
	}
	if res, code := fsckJSON(t, store); code != exitLeaks || !hasCode(res, "leaked-blocks") || res.Mountpoint != mnt {
		t.Errorf("fsck --json STORE: exit %d: %+v", code, res)
	}
	wantFail(t, exitFailure, []string{"a repair needs it unmounted"}, "fsck", "--repair", mnt)
	mustRun(t, "umount", mnt)
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	// The mount's read-write open may have reclaimed the leak already.
	if _, code := fsckJSON(t, store, "--repair"); code != exitRepaired && code != exitOK {
		t.Fatalf("fsck --repair after the unmount: exit %d", code)
	}
	if res, code := fsckJSON(t, store); code != exitOK {
		t.Fatalf("fsck after the repair: exit %d: %+v", code, res.Findings)
	}
}
