package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
	"golang.org/x/sys/unix"
)

// fragmentedStore makes a store whose disk a.raw has an extent for about
// every 4 KiB block, and returns the store's path and a.raw's bytes.
// Writes in any order now stay in one extent (placement follows the
// virtual offset), but an allocation (fallocate) still aims only at the
// extent before its range: allocating a.raw's blocks one at a time, last
// to first, gives each block a place of its own, as writes in random order
// got in stores made before placement followed the virtual offset. The
// data is then written in place.
func fragmentedStore(t *testing.T, blocks int) (string, []byte) {
	t.Helper()
	const bs = 4096
	store := newStore(t)
	s, err := image.OpenPath(store, image.Options{CommitInterval: -1, Program: "vdisk test"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Create("a.raw", int64(blocks*bs), image.Attr{Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	d, err := s.OpenDisk("a.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for v := blocks - 1; v >= 0; v-- {
		if err := d.Allocate(int64(v*bs), bs, true); err != nil {
			t.Fatal(err)
		}
	}
	data := randomBytes(blocks*bs, 3)
	if _, err := d.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	return store, data
}

// TestDefrag: vdisk defrag makes a fragmented disk one extent, its average
// extent the whole disk, with the same bytes; fsck is clean; a second run
// leaves it alone and says so.
func TestDefrag(t *testing.T) {
	const blocks = 1024
	store, data := fragmentedStore(t, blocks)
	before := diskByName(t, store, "a.raw")
	if before.Extents < blocks/2 {
		t.Fatalf("a.raw has %d extents for %d blocks: the setup did not fragment it", before.Extents, blocks)
	}
	out := mustRun(t, "defrag", store).stdout
	t.Logf("vdisk defrag: %s", out)
	want := fmt.Sprintf("a.raw: %d → 1 extent, average extent %s → 4 MiB, moved 4 MiB\n", before.Extents, formatSize(before.AvgExtent))
	if out != want {
		t.Errorf("defrag printed %q, want %q", out, want)
	}
	after := diskByName(t, store, "a.raw")
	if after.Extents != 1 || after.AvgExtent != blocks*4096 || after.AvgExtent <= before.AvgExtent || after.Allocated != before.Allocated {
		t.Errorf("after defrag: %+v; before: %+v", after, before)
	}
	mustRun(t, "fsck", store)
	dst := filepath.Join(t.TempDir(), "a.raw")
	mustRun(t, "export", store, "a.raw", dst)
	if !bytes.Equal(readFileT(t, dst), data) {
		t.Fatal("a.raw reads other bytes after defrag")
	}

	var res []defragEntry
	if err := json.Unmarshal([]byte(mustRun(t, "defrag", "--json", store, "a.raw").stdout), &res); err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Skipped != image.DefragContiguous || res[0].MovedBytes != 0 || res[0].ExtentsAfter != 1 {
		t.Errorf("second defrag: %+v, want a.raw left alone as %q", res, image.DefragContiguous)
	}
	if out := mustRun(t, "defrag", store).stdout; !strings.Contains(out, "a.raw: already contiguous (1 extent, 4 MiB per extent") {
		t.Errorf("second defrag printed %q", out)
	}
	wantFail(t, exitFailure, []string{"no such disk"}, "defrag", store, "b.raw")
}

// TestDefragRefusesMountedStore: defrag works offline; on a mounted store
// it fails with exit 8, naming the mount and saying to unmount it.
func TestDefragRefusesMountedStore(t *testing.T) {
	store := newStore(t)
	mustRun(t, "create", store, "a.raw", "1M")
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	r := wantFail(t, exitFailure, []string{"locked", "vdisk mount", "unmount it"}, "defrag", store)
	t.Logf("vdisk defrag on a mounted store: %s", r.stderr)
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatal(err)
	}
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	mustRun(t, "defrag", store)
}
