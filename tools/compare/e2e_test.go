package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
)

// needMounts skips (fails in CI) a test that needs root, /dev/fuse and fio;
// as root it installs a missing fio with apt-get, as tools/test.sh does.
func needMounts(t *testing.T) {
	t.Helper()
	testutil.RequireFUSE(t)
	if _, err := exec.LookPath("fio"); err != nil {
		cmd := exec.Command("apt-get", "install", "-y", "-qq", "fio")
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("apt-get install fio: %v: %s", err, out)
		}
		if _, err := exec.LookPath("fio"); err != nil {
			testutil.Missing(t, "needs fio (apt-get install fio)")
		}
	}
}

// buildVdisk builds cmd/vdisk, with args added to go build (-tags rbd),
// into the test's temporary directory.
func buildVdisk(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "vdisk")
	build := exec.Command("go", append(append([]string{"build", "-o", bin}, args...), "./cmd/vdisk")...)
	build.Dir = filepath.Join("..", "..") // the vdiskfs module, whose go.sum has cmd/vdisk's dependencies
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build vdisk: %v\n%s", err, out)
	}
	return bin
}

// checkNoMounts fails t if anything is still mounted under dir.
func checkNoMounts(t *testing.T, dir string) {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mi), dir) {
		t.Errorf("mounts left under %s:\n%s", dir, mi)
	}
}

// runReport runs the tool with args and --json js, fails the test unless
// it exits 0, and returns the report it wrote.
func runReport(t *testing.T, js string, args ...string) *report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, append(args, "--json", js), &stdout, &stderr)
	t.Logf("stderr:\n%s\ntable:\n%s", stderr.String(), stdout.String())
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	rep, err := readReportFile(js)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestEndToEnd mounts both targets for real (vdiskfs in process, the
// pass-through of a plain file) and runs two short workloads: every format
// comes out, the counters add up, and nothing is left mounted.
func TestEndToEnd(t *testing.T) {
	needMounts(t)
	scratch := t.TempDir()
	out := t.TempDir()
	js, md, png := filepath.Join(out, "r.json"), filepath.Join(out, "r.md"), filepath.Join(out, "r.png")
	rep := runReport(t, js,
		"--scratch", scratch, "--size", "64M", "--rounds", "1", "--runtime", "2s", "--ramp", "0s", "--settle", "0s",
		"--workloads", "seq-write-1m-qd16,rand-read-4k-qd32",
		"--markdown", md, "--chart", png)
	if len(rep.Runs) != 4 {
		t.Fatalf("%d runs, want 2 workloads × 2 targets", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		if r.MBps <= 0 || r.IOPS <= 0 || r.FioIOs == 0 || r.Req == nil || r.Req.ios() == 0 || r.ServerCPU == nil {
			t.Errorf("%s on %s: %+v", r.Workload, r.Target, r)
		}
		// The file system saw at least what fio counted after the ramp.
		if r.Req != nil && r.Req.ios() < r.FioIOs {
			t.Errorf("%s on %s: %d requests < fio's %d I/Os", r.Workload, r.Target, r.Req.ios(), r.FioIOs)
		}
	}
	get := func(w, tg, key string) float64 {
		for i := range rep.Results {
			if c := &rep.Results[i]; c.Workload == w && c.Target == tg {
				return float64(c.get(key).Median)
			}
		}
		t.Fatalf("no cell %s/%s", w, tg)
		return 0
	}
	for _, tg := range []string{targetVdiskfs, targetPassthrough} {
		if got := get("seq-write-1m-qd16", tg, "fuse_request_kib"); got != 1024 {
			t.Errorf("%s: FUSE write requests of %v KiB, want 1024 (MaxWrite 1 MiB)", tg, got)
		}
		if got := get("rand-read-4k-qd32", tg, "fuse_request_kib"); got != 4 {
			t.Errorf("%s: FUSE read requests of %v KiB, want 4", tg, got)
		}
	}
	// The seed's figure: a 1 MiB sequential write is one backend I/O.
	if got := get("seq-write-1m-qd16", targetVdiskfs, "backend_io_kib"); got < 1000 {
		t.Errorf("vdiskfs backend I/O of %v KiB for 1 MiB sequential writes, want about 1024", got)
	}
	if get("seq-write-1m-qd16", targetVdiskfs, "mb_per_s") <= 0 {
		t.Error("no ratio base")
	}
	if b, err := os.ReadFile(md); err != nil || !strings.Contains(string(b), "| seq-write-1m-qd16 | vdiskfs |") {
		t.Errorf("markdown: %v\n%s", err, b)
	}
	if b, err := os.ReadFile(png); err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
		t.Errorf("chart: %v", err)
	}
	// Nothing left: no mount under the scratch directory, no files in it.
	checkNoMounts(t, scratch)
	if left, _ := os.ReadDir(scratch); len(left) != 0 {
		t.Errorf("scratch files left: %v", left)
	}
}

// Two --binary targets and a --vhost-binary one (one vdisk binary under
// three names, as an A/B of a binary against itself): each formats and
// mounts a store of its own with the daemon in the background (the last
// serves its disk on a vhost-user socket to the load generator), its
// counters come from vdisk stats, its CPU from the daemon, and Close
// unmounts all.
func TestBinaryTargets(t *testing.T) {
	needMounts(t)
	bin := buildVdisk(t)
	scratch := t.TempDir()
	js := filepath.Join(t.TempDir(), "r.json")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, []string{
		"--scratch", scratch, "--size", "64M", "--rounds", "1", "--runtime", "2s", "--ramp", "0s", "--settle", "0s",
		"--workloads", "seq-write-1m-qd16", "--binary", "a=" + bin, "--binary", "b=" + bin, "--vhost-binary", "v=" + bin,
		"--targets", "a,b,v", "--baseline", "a", "--json", js,
	}, &stdout, &stderr)
	t.Logf("stderr:\n%s", stderr.String())
	if code != exitOK {
		t.Fatalf("exit %d", code)
	}
	rep, err := readReportFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Runs) != 3 {
		t.Fatalf("%d runs, want 1 workload × 3 targets", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		if r.Target != "a" && r.Target != "b" && r.Target != "v" {
			t.Errorf("run on target %q", r.Target)
		}
		if r.MBps <= 0 || r.Req == nil || r.Req.ios() < r.FioIOs || r.ServerCPU == nil {
			t.Errorf("%s on %s: %+v", r.Workload, r.Target, r)
		}
	}
	checkNoMounts(t, scratch)
}

// The qemu-storage-daemon target starts, serves its export, starts over
// empty on Reset and leaves no mount. Optional: skipped without QEMU.
func TestQSDTarget(t *testing.T) {
	needMounts(t)
	if _, _, err := findQSD(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	ctx := context.Background()
	q, err := newQSD(ctx, dir, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	st, err := os.Stat(q.File())
	if err != nil || st.Size() != 64<<20 || !mounted(q.File()) {
		t.Fatalf("export: %v, %v, mounted %v", st, err, mounted(q.File()))
	}
	if err := os.WriteFile(q.File(), bytes.Repeat([]byte{7}, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	if s := q.Sample(); !s.HasCPU {
		t.Error("no daemon CPU")
	}
	if err := q.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4096)
	f, err := os.Open(q.File())
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.ReadAt(b, 0)
	f.Close()
	if err != nil || !bytes.Equal(b, make([]byte, 4096)) {
		t.Errorf("after Reset the export is not empty: %v", err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if mounted(q.File()) {
		t.Error("export still mounted after Close")
	}
}

// TestGeneratorTargets runs fio on the raw file and the load generator on
// the same file through io_uring and on qemu-storage-daemon's vhost-user-blk
// export of another: every run completes and moves data, the daemon's CPU
// per I/O is known, and the generator's figures land where fio's do. Once
// with the buffers on the kernel's base pages, once on huge pages
// (--hugepages: the guest memory, raw-uring's buffers, fio's iomem).
func TestGeneratorTargets(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		testutil.Missing(t, "needs fio (apt-get install fio)")
	}
	if _, _, err := findQSD(); err != nil {
		testutil.Missing(t, "%v", err)
	}
	for _, huge := range []bool{false, true} {
		t.Run(fmt.Sprintf("hugepages=%v", huge), func(t *testing.T) { generatorTargets(t, huge) })
	}
}

func generatorTargets(t *testing.T, huge bool) {
	args := []string{"--size", "64M", "--rounds", "1", "--runtime", "1s", "--ramp", "0s", "--settle", "0s",
		"--targets", "raw,raw-uring,qsd-vhost", "--baseline", "raw",
		"--workloads", "seq-write-1m-qd16,rand-read-4k-qd32"}
	if huge {
		// The guest memory (vhostMemory), then raw-uring's or fio's
		// buffers for 16 × 1 MiB, one at a time.
		testutil.HugePages(t, vhostMemory/frontend.HugePageSize+16)
		args = append(args, "--hugepages")
	}
	scratch, out := t.TempDir(), t.TempDir()
	js := filepath.Join(out, "r.json")
	rep := runReport(t, js, append([]string{"--scratch", scratch}, args...)...)
	if rep.Config.HugePages != huge {
		t.Errorf("the report says huge pages %v, want %v", rep.Config.HugePages, huge)
	}
	if len(rep.Runs) != 6 {
		t.Fatalf("%d runs, want 2 workloads × 3 targets", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		if r.MBps <= 0 || r.FioIOs == 0 || float64(r.P99us) <= 0 {
			t.Errorf("%s on %s: %.0f MB/s, %d I/Os, p99 %v µs", r.Workload, r.Target, r.MBps, r.FioIOs, r.P99us)
		}
		if r.Target == targetQSDVhost && r.ServerCPU == nil {
			t.Errorf("%s on qsd-vhost: no server CPU", r.Workload)
		}
	}
	if entries, _ := os.ReadDir(scratch); len(entries) != 0 {
		t.Errorf("scratch files left: %v", entries)
	}
}

// The guest targets boot one TCG guest with both disks, and every run
// the guest made comes back with the daemon's counters around it; nothing
// stays mounted. Optional: skipped without QEMU.
func TestGuestTargets(t *testing.T) {
	needMounts(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("no qemu-system-x86_64 (apt-get install qemu-system-x86)")
	}
	bin := buildVdisk(t)
	scratch := t.TempDir()
	rep := runReport(t, filepath.Join(t.TempDir(), "r.json"),
		"--scratch", scratch, "--size", "64M", "--rounds", "1", "--runtime", "1s", "--ramp", "0s", "--settle", "0s",
		"--jobs", "jobs/vhost.fio", "--workloads", "seq-write-1m-qd1", "--vdisk", bin,
		"--targets", "guest-file,guest-vhost", "--baseline", "guest-file")
	var got []string
	for _, r := range rep.Runs {
		got = append(got, r.Target)
		if r.Workload != "seq-write-1m-qd1" || r.Round != 1 || r.MBps <= 0 || r.Req == nil || r.Req.ios() < r.FioIOs || r.ServerCPU == nil {
			t.Errorf("%s on %s: %+v", r.Workload, r.Target, r)
		}
	}
	if !slices.Equal(got, []string{targetGuestVhost, targetGuestFile}) {
		t.Errorf("runs on %v, want guest-vhost then guest-file", got)
	}
	checkNoMounts(t, scratch)
}
