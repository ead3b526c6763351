package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
)

// fragmentedStore makes a store whose disk a.raw has an extent for about
// every 4 KiB block, and returns the store's path and a.raw's bytes.
// Writes in any order stay in one extent where there is room (placement
// follows the virtual offset), so the room is taken away: a filler disk
// takes every free block, every other one of its first blocks is punched
// free, and a.raw is written into those. Then the filler is removed, which
// leaves a.raw as a disk written at random by a store made before
// placement followed the virtual offset, with room to defragment.
func fragmentedStore(t *testing.T, blocks int) (string, []byte) {
	t.Helper()
	const bs = 4096
	store := newStore(t)
	s, err := image.OpenPath(store, image.Options{CommitInterval: -1, Program: "vdisk test"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	create := func(name string, size int64) *image.Disk {
		t.Helper()
		if _, err := s.Create(name, size, image.Attr{Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
		d, err := s.OpenDisk(name)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	filler := create("filler.raw", 0)
	chunk := make([]byte, 1<<20)
	var end int64
	for ; ; end += int64(len(chunk)) {
		if _, err := filler.WriteAt(chunk, end); err != nil {
			break
		}
	}
	for ; ; end += bs {
		if _, err := filler.WriteAt(chunk[:bs], end); err != nil {
			break
		}
	}
	for v := 0; v < 2*(blocks+64); v += 2 { // 64 more: room kept for metadata
		if err := filler.Punch(int64(v*bs), bs); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Commit(); err != nil { // the punched blocks are free once it is durable
		t.Fatal(err)
	}
	d := create("a.raw", int64(blocks*bs))
	defer d.Close()
	data := randomBytes(blocks*bs, 3)
	if _, err := d.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	filler.Close()
	if err := s.Remove("filler.raw"); err != nil {
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

// TestDefragMounted: defrag of a mounted store (given its path, or its
// mount point) goes through the daemon: the disk becomes one extent while
// the mount serves it and reads the same bytes through the mount, during
// and after; fsck is clean after the unmount.
func TestDefragMounted(t *testing.T) {
	const blocks = 1024
	store, data := fragmentedStore(t, blocks)
	before := diskByName(t, store, "a.raw")
	mnt, exit := mountInProcess(t, store, filepath.Join(t.TempDir(), "mnt"))
	if got := readFileT(t, filepath.Join(mnt, "a.raw")); !bytes.Equal(got, data) { // the kernel caches some of it now
		t.Fatal("a.raw reads other bytes through the mount")
	}
	want := fmt.Sprintf("a.raw: %d → 1 extent, average extent %s → 4 MiB, moved 4 MiB\n", before.Extents, formatSize(before.AvgExtent))
	if out := mustRun(t, "defrag", store).stdout; out != want {
		t.Errorf("defrag of the mounted store printed %q, want %q", out, want)
	}
	if d := diskByName(t, mnt, "a.raw"); d.Extents != 1 || d.Allocated != before.Allocated {
		t.Errorf("after defrag through the mount: %+v", d)
	}
	if got := readFileT(t, filepath.Join(mnt, "a.raw")); !bytes.Equal(got, data) {
		t.Fatal("a.raw reads other bytes through the mount after defrag")
	}
	if out := mustRun(t, "defrag", mnt).stdout; !strings.Contains(out, "a.raw: already contiguous") {
		t.Errorf("second defrag printed %q", out)
	}
	wantFail(t, exitFailure, []string{"no such disk"}, "defrag", mnt, "b.raw")
	mustRun(t, "umount", mnt)
	if res := <-exit; res.code != 0 {
		t.Fatalf("mount exited %d: %s", res.code, res.stderr)
	}
	if res, code := fsckJSON(t, store); code != exitOK {
		t.Fatalf("fsck after defrag on the mount: exit %d: %+v", code, res.Findings)
	}
	dst := filepath.Join(t.TempDir(), "a.raw")
	mustRun(t, "export", store, "a.raw", dst)
	if !bytes.Equal(readFileT(t, dst), data) {
		t.Fatal("a.raw reads other bytes after the unmount")
	}
}
