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
