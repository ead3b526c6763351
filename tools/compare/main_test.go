package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/tools/compare/fio"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"2G": 2 << 30, "512M": 512 << 20, "1024": 1024, "3k": 3 << 10, "1GiB": 1 << 30, "1T": 1 << 40} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "G", "-1", "2X", "99999999999T"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
		}
	}
}

func TestParseTargets(t *testing.T) {
	got, err := parseTargets("passthrough, qsd,vdiskfs", nil)
	if err != nil || !slices.Equal(got, []string{"vdiskfs", "passthrough", "qsd-qcow2"}) {
		t.Errorf("got %v, %v", got, err)
	}
	if got, _ := parseTargets("all", nil); len(got) != len(allTargets) {
		t.Errorf("all = %v", got)
	}
	if _, err := parseTargets("vdiskfs,nfs", nil); err == nil {
		t.Error("unknown target accepted")
	}
	// --binary targets come after the built-in ones, in flag order.
	bins := []binarySpec{{Name: "new", Path: "/b/new"}, {Name: "old", Path: "/b/old"}}
	got, err = parseTargets("old,raw,new", bins)
	if err != nil || !slices.Equal(got, []string{"raw", "new", "old"}) {
		t.Errorf("with binaries: got %v, %v", got, err)
	}
	if got, _ := parseTargets("all", bins); len(got) != len(allTargets)+2 {
		t.Errorf("all with binaries = %v", got)
	}
	// librbd is named, never part of "all", and comes after the binaries.
	got, err = parseTargets("librbd,new", bins)
	if err != nil || !slices.Equal(got, []string{"new", "librbd"}) {
		t.Errorf("librbd: got %v, %v", got, err)
	}
}

// --rbd-pool measures librbd and stores of vdisk binaries; the librbd
// target needs a pool, and the targets whose store is a file of this
// process are refused with one.
func TestCheckRBD(t *testing.T) {
	if err := checkRBD("", []string{"vdiskfs", "raw"}); err != nil {
		t.Errorf("no pool, no librbd: %v", err)
	}
	if err := checkRBD("", []string{"librbd", "new"}); err == nil || !strings.Contains(err.Error(), "--rbd-pool") {
		t.Errorf("librbd without a pool: %v", err)
	}
	for _, target := range []string{"vdiskfs", "vdiskfs-encrypted", "guest-vhost"} {
		if err := checkRBD("rbd", []string{"librbd", target}); err == nil || !strings.Contains(err.Error(), "TAGS=rbd") {
			t.Errorf("%s on RBD: %v", target, err)
		}
	}
}

// A command that fails is named whole in the error, with what it printed.
func TestRunCommand(t *testing.T) {
	if err := runCommand(context.Background(), "sh", "-c", "exit 0"); err != nil {
		t.Fatalf("a command that succeeds: %v", err)
	}
	err := runCommand(context.Background(), "sh", "-c", "echo ' no such disk '; exit 3")
	if err == nil || !strings.Contains(err.Error(), "sh -c echo ' no such disk '; exit 3: exit status 3: no such disk") {
		t.Fatalf("a command that fails: %v", err)
	}
}

func TestParseBinary(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseBinary("--binary", "old="+exe)
	if err != nil || b.Name != "old" || b.Path != exe || b.Vhost {
		t.Errorf("--binary old=%s: %+v, %v", exe, b, err)
	}
	b, err = parseBinary("--vhost-binary", "old="+exe)
	if err != nil || b.Name != "old" || b.Path != exe || !b.Vhost {
		t.Errorf("--vhost-binary old=%s: %+v, %v", exe, b, err)
	}
	for _, bad := range []string{"old", "=x", "old=", "raw=" + exe, "qsd=" + exe, "vhost=" + exe, "a,b=" + exe, "a/b=" + exe, "x=/nonexistent/vdisk", "x=" + t.TempDir()} {
		if _, err := parseBinary("--binary", bad); err == nil {
			t.Errorf("parseBinary(%q) accepted", bad)
		}
	}
}

// The built-in job file holds the seeds' workloads, in order, then the
// placement pair (a random fill of an empty disk, a sequential read after
// it); only the thin-space write and the fill ask for empty targets.
func TestDefaultJobs(t *testing.T) {
	jobs, err := loadJobs(&options{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range jobs {
		names = append(names, j.Name)
		if j.Fresh != (j.Name == "thin-write-1m-qd16" || j.Name == "rand-fill-4k-qd32") {
			t.Errorf("%s: fresh = %v", j.Name, j.Fresh)
		}
		if j.Note == "" {
			t.Errorf("%s has no note", j.Name)
		}
		text := j.FileText(fio.Place{File: "/f"}, map[string]string{"COMPARE_RUNTIME": "15", "COMPARE_RAMP": "2"})
		if strings.Contains(text, "${") {
			t.Errorf("%s: unexpanded variable:\n%s", j.Name, text)
		}
		if j.Fresh == strings.Contains(text, "time_based") {
			t.Errorf("%s: time_based must be set on every job but the fresh ones", j.Name)
		}
	}
	want := []string{"seq-write-1m-qd1", "seq-write-1m-qd16", "ch-write-256k-qd64", "seq-read-1m-qd16",
		"rand-read-4k-qd32", "rand-write-4k-qd32", "thin-write-1m-qd16", "rand-fill-4k-qd32", "seq-read-after-rand-fill-1m-qd16"}
	if !slices.Equal(names, want) {
		t.Errorf("workloads %v, want %v", names, want)
	}
	ch := jobs[2].Text
	for _, opt := range []string{"rw=write", "bs=256k", "ioengine=libaio", "iodepth=64", "direct=1"} {
		if !strings.Contains(ch, opt+"\n") {
			t.Errorf("the cloud-hypervisor job lacks %s", opt)
		}
	}
	picked, err := loadJobs(&options{workloads: "thin-write-1m-qd16,seq-write-1m-qd1"})
	if err != nil || len(picked) != 2 || picked[0].Name != "thin-write-1m-qd16" {
		t.Errorf("--workloads: %v, %v", picked, err)
	}
	if _, err := loadJobs(&options{workloads: "nope"}); err == nil || !strings.Contains(err.Error(), "seq-write-1m-qd1") {
		t.Errorf("unknown workload: %v", err)
	}
}

func TestParseProcStatCPU(t *testing.T) {
	line := "9612 (a (weird) name) R 9608 9608 1306 0 -1 4194304 98 0 0 0 250 50 0 0 20 0 1 0 273983 3133440 381\n"
	got, err := parseProcStatCPU(line)
	if err != nil || got != 3*time.Second {
		t.Errorf("got %v, %v; want 3s (300 ticks)", got, err)
	}
	if _, err := parseProcStatCPU("12 (x) R 1 2"); err == nil {
		t.Error("short line accepted")
	}
	cpu, err := procCPU(os.Getpid())
	if err != nil || cpu < 0 {
		t.Errorf("procCPU(self) = %v, %v", cpu, err)
	}
}

func TestParseVdiskStats(t *testing.T) {
	// The shape of telemetry.Stats: counters under store_metrics.
	s, pid, err := parseVdiskStats([]byte(`{"mountpoint": "/mnt/vdisks", "pid": 4242, "store_metrics": {"counters": {"data_writes": 10, "data_write_bytes": 10485760,
		"write_requests": 10, "write_request_bytes": 10485760, "read_requests": 3, "read_request_bytes": 12288,
		"data_reads": 1, "data_read_bytes": 12288, "commits": 4}, "block_size": 4096}}`))
	if err != nil {
		t.Fatal(err)
	}
	if pid != 4242 || s.Commits == nil || *s.Commits != 4 || s.Flushes != nil {
		t.Errorf("pid %d commits %v flushes %v", pid, s.Commits, s.Flushes)
	}
	if *s.Backend != (ioCount{Reads: 1, ReadBytes: 12288, Writes: 10, WriteBytes: 10 << 20}) {
		t.Errorf("backend %+v", *s.Backend)
	}
	if *s.Req != (ioCount{Reads: 3, ReadBytes: 12288, Writes: 10, WriteBytes: 10 << 20}) {
		t.Errorf("requests %+v", *s.Req)
	}
	// Counters at the top level do too.
	if s, _, err := parseVdiskStats([]byte(`{"counters": {"data_reads": 5}}`)); err != nil || s.Backend.Reads != 5 {
		t.Errorf("top-level counters: %+v, %v", s.Backend, err)
	}
	if _, _, err := parseVdiskStats([]byte(`{"store_metrics": {"disks": []}}`)); err == nil {
		t.Error("no counters: accepted")
	}
	if _, _, err := parseVdiskStats([]byte(`usage: vdisk ...`)); err == nil {
		t.Error("not JSON: accepted")
	}
}

// A --mount target whose vdisk has no stats command degrades to n/a.
func TestVdiskfsMountWithoutStats(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "vdisk")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho 'unknown command \"stats\"' >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	mt, err := newVdiskfsMount(dir, 1<<20, fake, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	s := mt.Sample()
	if s.Req != nil || s.Backend != nil {
		t.Errorf("counters from a failing stats command: %+v", s)
	}
	if !s.HasCPU {
		t.Error("no CPU for --server-pid")
	}
	if err := mt.Close(); err != nil {
		t.Error(err)
	}
}

func TestRunUsage(t *testing.T) {
	var out, errb bytes.Buffer
	ctx := context.Background()
	if code := run(ctx, []string{"--print-jobs"}, &out, &errb); code != exitOK || !strings.Contains(out.String(), "[seq-write-1m-qd1]") {
		t.Errorf("--print-jobs: %d, %q", code, out.String())
	}
	for _, args := range [][]string{
		{"--size", "1M"}, {"--rounds", "0"}, {"--runtime", "1500ms"}, {"--store", "a", "--mount", "b"}, {"extra"}, {"--nope"},
	} {
		errb.Reset()
		if code := run(ctx, args, &out, &errb); code != exitUsage {
			t.Errorf("%v: exit %d, want %d (%s)", args, code, exitUsage, errb.String())
		}
	}
	errb.Reset()
	if code := run(ctx, []string{"--fio", "/nonexistent/fio"}, &out, &errb); code != exitMissing || !strings.Contains(errb.String(), "apt-get install fio") {
		t.Errorf("missing fio: exit %d, %q", code, errb.String())
	}
}

func TestRunFromJSON(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "r.json")
	f, err := os.Create(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := fakeReport().writeJSON(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	var out, errb bytes.Buffer
	md := filepath.Join(dir, "r.md")
	code := run(context.Background(), []string{"--from-json", js, "--markdown", md, "--chart", filepath.Join(dir, "r.svg")}, &out, &errb)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.HasPrefix(out.String(), "workload") {
		t.Errorf("no table on stdout: %q", out.String())
	}
	if b, _ := os.ReadFile(md); !strings.HasPrefix(string(b), "| workload |") {
		t.Errorf("markdown: %q", b)
	}
	out.Reset()
	if code := run(context.Background(), []string{"--from-json", js, "--markdown", "-"}, &out, &errb); code != exitOK || !strings.HasPrefix(out.String(), "| workload |") {
		t.Errorf("--markdown -: exit %d, %q", code, out.String())
	}
}

func TestParseLoadAvg(t *testing.T) {
	if got := parseLoadAvg("1.57 1.42 2.00 3/412 9612\n"); !slices.Equal(got, []float64{1.57, 1.42, 2}) {
		t.Errorf("%v", got)
	}
}

func TestUnescapeMountPath(t *testing.T) {
	if got := unescapeMountPath(`/var/tmp/a\040b`); got != "/var/tmp/a b" {
		t.Errorf("%q", got)
	}
}
