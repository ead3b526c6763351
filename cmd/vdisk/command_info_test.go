package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestInfo(t *testing.T) {
	store := newStore(t)
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, []byte(strings.Repeat("y", 1<<20)))
	mustRun(t, "import", store, "a.raw", src)
	mustRun(t, "create", store, "b.raw", "1G")

	r := mustRun(t, "info", store)
	for _, want := range []string{"uuid:", "backing:", `file "` + store + `", 64 MiB`, "block size:", "4 KiB", "capacity:", "used:", "free:",
		"largest free extent:", "disks:", "1, 1 MiB each on average", "journal:", "checkpoint:", "generation:", "created:"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("info does not show %q:\n%s", want, r.stdout)
		}
	}
	var in infoJSON
	if err := json.Unmarshal([]byte(mustRun(t, "info", "--json", store).stdout), &in); err != nil {
		t.Fatal(err)
	}
	if len(in.UUID) != 36 || in.BlockSize != 4096 || in.StoreSize != 64<<20 || in.Disks != 2 || in.Extents != 1 || in.AvgExtent != 1<<20 ||
		in.Capacity != int64(in.DataBlocks)*4096 || in.Used+in.Free != in.Capacity || in.Used < 1<<20 ||
		in.LargestFreeExtent <= 0 || in.LargestFreeExtent > in.Free || in.JournalSize <= 0 || in.CheckpointBytes <= 0 ||
		time.Since(in.Created) > time.Hour {
		t.Errorf("info --json: %+v", in)
	}
}

func TestInfoErrors(t *testing.T) {
	wantFail(t, exitFailure, []string{"no such file"}, "info", filepath.Join(t.TempDir(), "none.img"))
}
