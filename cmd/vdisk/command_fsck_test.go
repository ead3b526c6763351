package main

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/image"
)

// fsckJSON runs `vdisk fsck --json` with extra flags and decodes its output.
func fsckJSON(t *testing.T, store string, flags ...string) (fsckResult, int) {
	t.Helper()
	r := vdisk(t, append(append([]string{"fsck", "--json"}, flags...), store)...)
	var res fsckResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("fsck --json: %v\nstdout:\n%s\nstderr:\n%s", err, r.stdout, r.stderr)
	}
	if res.ExitCode != r.code {
		t.Errorf("exit_code %d, but exited %d", res.ExitCode, r.code)
	}
	return res, r.code
}

func TestFsckClean(t *testing.T) {
	store := newStore(t)
	src := filepath.Join(t.TempDir(), "src")
	writeFile(t, src, randomBytes(100000, 1))
	mustRun(t, "import", store, "a.raw", src)
	mustRun(t, "create", store, "b.raw", "1G")

	r := mustRun(t, "fsck", store)
	if !strings.Contains(r.stdout, "result: clean (exit 0)") || !strings.Contains(r.stdout, "2 disks, 1 extents; ") {
		t.Errorf("fsck output:\n%s", r.stdout)
	}
	// --repair on a clean store repairs nothing and exits 0.
	if r := mustRun(t, "fsck", "--repair", store); strings.Contains(r.stdout, "repaired:") || !strings.Contains(r.stdout, "clean") {
		t.Errorf("fsck --repair output:\n%s", r.stdout)
	}

	// The JSON shape, checked on the raw object so that renaming a field
	// breaks the test.
	out := mustRun(t, "fsck", "--json", store).stdout
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"store", "findings", "summary", "repaired", "exit_code", "result"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("fsck --json has no %q:\n%s", k, out)
		}
	}
	if string(raw["findings"]) != "[]" || string(raw["repaired"]) != "[]" || string(raw["exit_code"]) != "0" {
		t.Errorf("fsck --json:\n%s", out)
	}
	res, code := fsckJSON(t, store)
	sm := res.Summary
	if code != 0 || res.Result != "clean" || sm.Disks != 2 || sm.Extents != 1 || sm.BlockSize != 4096 || sm.UsedBlocks == 0 ||
		sm.UsedBlocks+sm.FreeBlocks != sm.DataBlocks || sm.LeakedBlocks != 0 || res.After != nil {
		t.Errorf("fsck --json: %+v", res)
	}
}

// damageSuperblockB overwrites bytes in the second superblock copy (byte
// 4096 of the store, FORMAT.md), so that its checksum fails.
func damageSuperblockB(t *testing.T, store string) {
	t.Helper()
	f, err := os.OpenFile(store, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("damage"), 4096+1000); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
}

func TestFsckRepair(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store.img")
	mustRun(t, "format", "--size", "64M", store)
	src := filepath.Join(t.TempDir(), "src")
	data := randomBytes(100000, 1)
	writeFile(t, src, data)
	mustRun(t, "import", store, "a.raw", src)
	damageSuperblockB(t, store)

	// Ordinary commands refuse the damaged store and point to fsck.
	wantFail(t, exitFailure, []string{"fsck"}, "ls", store)

	r := vdisk(t, "fsck", store)
	if r.code != exitUncorrected || !strings.Contains(r.stdout, "fatal "+image.CodeSuperblockCopy+": superblock copy B") ||
		!strings.Contains(r.stdout, "errors left uncorrected") || !strings.Contains(r.stdout, "(exit 4)") {
		t.Fatalf("fsck: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	res, code := fsckJSON(t, store)
	if code != exitUncorrected || len(res.Findings) != 1 || res.Findings[0].Code != image.CodeSuperblockCopy ||
		res.Findings[0].Severity != "fatal" || res.Summary.Disks != 1 {
		t.Fatalf("fsck --json: %+v", res)
	}

	r = vdisk(t, "fsck", "--repair", store)
	if r.code != exitRepaired || !strings.Contains(r.stdout, "repaired: ") || r.stderr != "" ||
		!strings.Contains(r.stdout, "after repair: 1 disks") || !strings.Contains(r.stdout, "findings were repaired") {
		t.Fatalf("fsck --repair: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	res, code = fsckJSON(t, store)
	if code != exitOK || len(res.Findings) != 0 {
		t.Fatalf("fsck after repair: %+v", res)
	}
	checkStore(t, store)

	// The disk survived the repair.
	dst := filepath.Join(t.TempDir(), "dst")
	mustRun(t, "export", store, "a.raw", dst)
	sameContents(t, src, dst)

	// The JSON of a repair.
	damageSuperblockB(t, store)
	res, code = fsckJSON(t, store, "--repair")
	if code != exitRepaired || len(res.Findings) != 1 || len(res.Repaired) == 0 || res.After == nil ||
		len(res.After.Findings) != 0 || res.RepairError != "" {
		t.Fatalf("fsck --repair --json: %+v", res)
	}
}

func TestFsckUnreadable(t *testing.T) {
	store := filepath.Join(t.TempDir(), "store.img")
	mustRun(t, "format", "--size", "64M", store)
	mustRun(t, "create", store, "a.raw", "1M")
	// A store shorter than its superblock says cannot be opened at all.
	st, err := os.Stat(store)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(store, st.Size()-1<<20); err != nil {
		t.Fatal(err)
	}
	res, code := fsckJSON(t, store)
	if code != exitUncorrected || len(res.Findings) != 1 || res.Findings[0].Code != codeUnreadable ||
		!strings.Contains(res.Findings[0].Message, "truncated") {
		t.Fatalf("fsck of a truncated store: %+v", res)
	}
}

func TestFsckErrors(t *testing.T) {
	dir := t.TempDir()
	wantFail(t, exitFailure, []string{"no such file"}, "fsck", filepath.Join(dir, "none.img"))
	notStore := filepath.Join(dir, "zeros.img")
	writeFile(t, notStore, make([]byte, 1<<20))
	wantFail(t, exitFailure, []string{"not a vdiskfs store"}, "fsck", notStore)
	wantFail(t, exitFailure, []string{"not a vdiskfs store"}, "fsck", "--repair", notStore)
}

// TestFsckLeakReport covers the leak-only outcome on a made-up report: no
// store damage that a test outside package image can cause leaks blocks.
func TestFsckLeakReport(t *testing.T) {
	leak := image.Finding{Severity: image.Leak, Code: image.CodeLeak, Message: "3 blocks are used by nothing and not free ([10,+3))"}
	fatal := image.Finding{Severity: image.Fatal, Code: image.CodeSharedBlock, Disk: "a.raw", Message: "shared"}
	for _, tc := range []struct {
		findings []image.Finding
		want     int
	}{
		{nil, exitOK},
		{[]image.Finding{leak}, exitLeaks},
		{[]image.Finding{fatal, leak}, exitUncorrected},
		{[]image.Finding{fatal}, exitUncorrected},
	} {
		if got := checkExitCode(&image.Report{Findings: tc.findings}); got != tc.want {
			t.Errorf("%v: exit %d, want %d", tc.findings, got, tc.want)
		}
	}

	var out strings.Builder
	e := newEnv(&out, io.Discard, false)
	rep := &image.Report{Findings: []image.Finding{leak}, Disks: 1, Extents: 2, MappedBlocks: 6, DataBlocks: 100, UsedBlocks: 10, FreeBlocks: 87, LeakedBlocks: 3}
	res := fsckResult{Store: "s.img", fsckCheck: checkOf(rep, 4096), Repaired: []string{}}
	err := finishFsck(e, &res, checkExitCode(rep), nil, false)
	var ce *exitCodeError
	if !errors.As(err, &ce) || ce.code != exitLeaks || ce.err != nil {
		t.Fatalf("finishFsck: %v", err)
	}
	want := `checking s.img
leak leaked-blocks: 3 blocks are used by nothing and not free ([10,+3))
1 disks, 2 extents; 10 used, 87 free, 3 leaked of 100 blocks of 4 KiB
fragmentation: 2 extents map 6 blocks, 12 KiB per extent on average
result: only leaked blocks: no data is at risk; run vdisk fsck --repair to reclaim the space (exit 2)
`
	if out.String() != want {
		t.Errorf("output:\n%s\nwant:\n%s", out.String(), want)
	}
}

func TestDiskChanges(t *testing.T) {
	before := []image.DiskInfo{
		{ID: 1, Name: "a.raw", Allocated: 8192},
		{ID: 2, Name: "b.raw", Allocated: 4096},
		{ID: 3, Name: "c.raw", Allocated: 4096},
		{ID: 4, Name: "bad/name", Allocated: 4096},
	}
	after := []image.DiskInfo{
		{ID: 1, Name: "a.raw", Allocated: 8192},
		{ID: 2, Name: "b.raw", Allocated: 0},
		{ID: 4, Name: "recovered-4.raw", Allocated: 4096},
	}
	got := strings.Join(diskChanges(before, after), "\n")
	want := `disk "b.raw": 4 KiB of data unmapped; those ranges read as zeros now
disk "c.raw" (id 3) is gone
disk "bad/name" (id 4) is now called "recovered-4.raw"`
	if got != want {
		t.Errorf("diskChanges:\n%s\nwant:\n%s", got, want)
	}
}
