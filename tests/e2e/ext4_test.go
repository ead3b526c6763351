package e2e

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// loopDevice is a loop device attached to a file; detach is idempotent
// and also runs at cleanup.
type loopDevice struct {
	dev      string
	detached bool
}

// attachLoop runs `losetup --direct-io=on --show -f FILE`.
func attachLoop(t *testing.T, file string) *loopDevice {
	t.Helper()
	dev := strings.TrimSpace(run(t, time.Minute, "losetup", "--direct-io=on", "--show", "-f", file))
	if !strings.HasPrefix(dev, "/dev/loop") {
		t.Fatalf("losetup printed %q", dev)
	}
	l := &loopDevice{dev: dev}
	t.Cleanup(func() { l.detach(t) })
	sys := "/sys/block/" + filepath.Base(dev)
	dio, _ := os.ReadFile(sys + "/loop/dio")
	lbs, _ := os.ReadFile(sys + "/queue/logical_block_size")
	dmax, _ := os.ReadFile(sys + "/queue/discard_max_bytes")
	t.Logf("%s on %s: dio=%s logical_block_size=%s discard_max_bytes=%s", dev, filepath.Base(file),
		strings.TrimSpace(string(dio)), strings.TrimSpace(string(lbs)), strings.TrimSpace(string(dmax)))
	if strings.TrimSpace(string(dio)) != "1" {
		t.Errorf("%s: direct I/O is off (dio=%q): the loop driver did not accept O_DIRECT on the vdisk", dev, strings.TrimSpace(string(dio)))
	}
	return l
}

func (l *loopDevice) detach(t *testing.T) {
	t.Helper()
	if l.detached {
		return
	}
	var out string
	var err error
	for i := 0; i < 50; i++ { // udev may still hold the device for a moment
		if out, err = runErr(time.Minute, "losetup", "-d", l.dev); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Errorf("losetup -d %s: %v: %s", l.dev, err, out)
		return
	}
	l.detached = true
}

// mountExt4 mounts an ext4 file system; the cleanup unmounts it (lazily
// if it is busy) when the test has not.
func mountExt4(t *testing.T, dev, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(dev, dir, "ext4", 0, ""); err != nil {
		t.Fatalf("mount -t ext4 %s %s: %v", dev, dir, err)
	}
	t.Cleanup(func() {
		if isMounted(dir) {
			if unix.Unmount(dir, 0) != nil {
				unix.Unmount(dir, unix.MNT_DETACH)
			}
		}
	})
}

func umountExt4(t *testing.T, dir string) {
	t.Helper()
	start := time.Now()
	if err := unix.Unmount(dir, 0); err != nil {
		t.Fatalf("umount %s: %v", dir, err)
	}
	t.Logf("umount ext4: %v", time.Since(start).Round(time.Millisecond))
}

// e2fsckClean runs e2fsck -fn and fails unless it finds nothing.
func e2fsckClean(t *testing.T, dev, when string) {
	t.Helper()
	start := time.Now()
	out, err := runErr(5*time.Minute, "e2fsck", "-fn", dev)
	if err != nil {
		t.Fatalf("e2fsck -fn %s %s: %v\n%s", dev, when, err, out)
	}
	t.Logf("e2fsck -fn %s: clean in %v: %s", when, time.Since(start).Round(time.Millisecond), lastLine(out))
}

// treeFile is one file of the test tree and its checksum.
type treeFile struct {
	path string // relative
	size int64
	sum  [32]byte
}

// writeTree writes n files of seeded random sizes and contents into
// nested directories under root.
func writeTree(t *testing.T, root string, seed uint64, n int) []treeFile {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	var contentSeed [32]byte
	copy(contentSeed[:], fmt.Sprintf("tree %d", seed))
	content := rand.NewChaCha8(contentSeed)
	var files []treeFile
	for i := range n {
		var size int64
		switch r := rng.IntN(100); {
		case r < 5:
			size = 0
		case r < 65:
			size = rng.Int64N(16 << 10)
		case r < 95:
			size = 16<<10 + rng.Int64N(1<<20)
		default:
			size = 1<<20 + rng.Int64N(7<<20)
		}
		dir := fmt.Sprintf("d%02d/s%d", rng.IntN(12), rng.IntN(4))
		if rng.IntN(5) == 0 {
			dir = fmt.Sprintf("d%02d", rng.IntN(12))
		}
		rel := filepath.Join(dir, fmt.Sprintf("f%04d.bin", i))
		data := make([]byte, size)
		content.Read(data)
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, rel), data, 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, treeFile{path: rel, size: size, sum: sha256.Sum256(data)})
	}
	return files
}

// verifyTree checks that root holds exactly files, with their checksums.
func verifyTree(t *testing.T, root string, files []treeFile) {
	t.Helper()
	want := map[string]treeFile{}
	for _, f := range files {
		want[f.path] = f
	}
	var seen []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel == "lost+found" {
				return filepath.SkipDir
			}
			return nil
		}
		f, ok := want[rel]
		if !ok {
			return fmt.Errorf("unexpected file %s", rel)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if int64(len(data)) != f.size {
			return fmt.Errorf("%s: %d bytes, want %d", rel, len(data), f.size)
		}
		if sha256.Sum256(data) != f.sum {
			return fmt.Errorf("%s: sha256 differs", rel)
		}
		seen = append(seen, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != len(files) {
		sort.Strings(seen)
		t.Fatalf("found %d files, want %d", len(seen), len(files))
	}
}

func treeBytes(files []treeFile) int64 {
	var n int64
	for _, f := range files {
		n += f.size
	}
	return n
}

// TestExt4OnLoopDevice: mkfs.ext4 on a 1 GiB vdisk, attached with a
// direct-I/O loop device; a seeded tree of files with checksums; e2fsck
// clean; the checksums again after remounting vdiskfs; then deleting half
// the tree and fstrim give the space back to the disk.
func TestExt4OnLoopDevice(t *testing.T) {
	requireRoot(t)
	testStart := time.Now()
	needTools(t, "mkfs.ext4:e2fsprogs", "e2fsck:e2fsprogs", "losetup:util-linux", "fstrim:util-linux", "truncate:coreutils")
	nfiles := 300
	if testing.Short() {
		nfiles = 120
	}

	store := newStore(t)
	mnt := filepath.Join(t.TempDir(), "mnt")
	m := mountStore(t, store, mnt)
	img := filepath.Join(mnt, "fs.raw")
	run(t, time.Minute, "truncate", "-s", "1G", img)
	start := time.Now()
	run(t, 5*time.Minute, "mkfs.ext4", "-q", "-F", img)
	alloc, size := usage(t, img)
	t.Logf("mkfs.ext4 in %v: fs.raw allocated %s of apparent %s", time.Since(start).Round(time.Millisecond), mib(alloc), mib(size))

	loop := attachLoop(t, img)
	fsdir := filepath.Join(t.TempDir(), "ext4")
	mountExt4(t, loop.dev, fsdir)
	start = time.Now()
	files := writeTree(t, fsdir, 7, nfiles)
	unix.Sync()
	total := treeBytes(files)
	t.Logf("wrote %d files, %s, in %v", len(files), mib(total), time.Since(start).Round(time.Millisecond))
	umountExt4(t, fsdir)
	e2fsckClean(t, loop.dev, "after writing")
	loop.detach(t)
	alloc, size = usage(t, img)
	t.Logf("fs.raw: allocated %s (st_blocks*512) of apparent %s, for %s of file data", mib(alloc), mib(size), mib(total))
	if alloc < total {
		t.Errorf("fs.raw allocates %d bytes, less than the %d bytes of file data in it", alloc, total)
	}

	// Through a fresh daemon: the store's copy, not a cache.
	m.unmount(t)
	m = mountStore(t, store, mnt)
	loop = attachLoop(t, img)
	e2fsckClean(t, loop.dev, "after remounting vdiskfs")
	mountExt4(t, loop.dev, fsdir)
	start = time.Now()
	verifyTree(t, fsdir, files)
	t.Logf("all %d checksums match after remounting vdiskfs (read in %v)", len(files), time.Since(start).Round(time.Millisecond))

	// Delete every other file, fstrim: the loop device turns the discards
	// into punch holes on fs.raw, which must shrink.
	var kept []treeFile
	var freed int64
	for i, f := range files {
		if i%2 == 0 {
			kept = append(kept, f)
			continue
		}
		if err := os.Remove(filepath.Join(fsdir, f.path)); err != nil {
			t.Fatal(err)
		}
		freed += f.size
	}
	unix.Sync()
	before, _ := usage(t, img)
	out := run(t, 5*time.Minute, "fstrim", "-v", fsdir)
	after, _ := usage(t, img)
	t.Logf("deleted %d files (%s), %s; fs.raw allocated %s -> %s", len(files)-len(kept), mib(freed), strings.TrimSpace(out), mib(before), mib(after))
	if before-after < freed/2 {
		t.Errorf("fstrim freed only %d bytes of fs.raw after deleting %d bytes of files", before-after, freed)
	}
	verifyTree(t, fsdir, kept)
	umountExt4(t, fsdir)
	e2fsckClean(t, loop.dev, "after fstrim")
	loop.detach(t)
	m.unmount(t)
	fsckClean(t, store)
	t.Logf("TestExt4OnLoopDevice: %v in all", time.Since(testStart).Round(time.Millisecond))
}
