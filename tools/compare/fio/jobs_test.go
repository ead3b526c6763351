package fio

import (
	"strings"
	"testing"
)

const sampleJobs = `; a comment before any section
[global]
ioengine=libaio
direct=1

[seq]
; compare: note sequential write
rw=write
bs=1M
runtime=${COMPARE_RUNTIME}

[global]
iodepth=32

[thin]
# compare: fresh
rw=write
bs=${BS}
nrfiles=$ncpus
`

func TestParseJobs(t *testing.T) {
	jobs, err := ParseJobs(strings.NewReader(sampleJobs))
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 {
		t.Fatalf("%d jobs, want 2", len(jobs))
	}
	seq, thin := jobs[0], jobs[1]
	if seq.Name != "seq" || seq.Fresh || seq.Note != "sequential write" {
		t.Errorf("seq = %+v", seq)
	}
	if thin.Name != "thin" || !thin.Fresh || thin.Note != "" {
		t.Errorf("thin = %+v", thin)
	}
	// A job carries every [global] before it, and no other job's lines.
	if strings.Contains(seq.Text, "iodepth=32") {
		t.Errorf("seq has a later global:\n%s", seq.Text)
	}
	for _, want := range []string{"ioengine=libaio", "iodepth=32", "[thin]\n"} {
		if !strings.Contains(thin.Text, want) {
			t.Errorf("thin lacks %q:\n%s", want, thin.Text)
		}
	}
	if strings.Contains(thin.Text, "[seq]") || strings.Contains(thin.Text, "bs=1M") {
		t.Errorf("thin has seq's lines:\n%s", thin.Text)
	}
	if strings.Count(thin.Text, "[global]") != 2 {
		t.Errorf("thin should keep both global sections:\n%s", thin.Text)
	}
}

func TestParseJobsAfter(t *testing.T) {
	jobs, err := ParseJobs(strings.NewReader("[fill]\n; compare: fresh\nrw=randwrite\n[read]\n; compare: after fill\nrw=read\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 2 || !jobs[0].Fresh || jobs[0].After != "" || jobs[1].After != "fill" || jobs[1].Fresh {
		t.Fatalf("jobs: %+v", jobs)
	}
}

func TestParseJobsErrors(t *testing.T) {
	for name, text := range map[string]string{
		"option outside a section":    "rw=write\n[a]\n",
		"unterminated section":        "[a\nrw=write\n",
		"job sets filename":           "[a]\nfilename=/dev/sda\n",
		"global sets directory":       "[global]\ndirectory=/tmp\n[a]\n",
		"duplicate job":               "[a]\n[a]\n",
		"bad name":                    "[a b]\n",
		"no jobs":                     "[global]\nrw=write\n",
		"unknown directive":           "[a]\n; compare: frsh\n",
		"after a later job":           "[b]\n; compare: after a\n[a]\n",
		"after a job not just before": "[a]\n[c]\n[b]\n; compare: after a\n",
	} {
		if _, err := ParseJobs(strings.NewReader(text)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestFileText(t *testing.T) {
	jobs, err := ParseJobs(strings.NewReader(sampleJobs))
	if err != nil {
		t.Fatal(err)
	}
	got := jobs[0].FileText(Place{File: "/mnt/x/compare.img"}, map[string]string{"COMPARE_RUNTIME": "15"})
	if !strings.HasPrefix(got, "[global]\nfilename=/mnt/x/compare.img\n[global]\n") {
		t.Errorf("file text does not start with the tool's global:\n%s", got)
	}
	if !strings.Contains(got, "runtime=15\n") {
		t.Errorf("COMPARE_RUNTIME not expanded:\n%s", got)
	}
	// Unknown variables and fio's own $ncpus are left for fio.
	got = jobs[1].FileText(Place{File: "/f"}, map[string]string{"COMPARE_RUNTIME": "15"})
	if !strings.Contains(got, "bs=${BS}\n") || !strings.Contains(got, "nrfiles=$ncpus\n") {
		t.Errorf("other variables changed:\n%s", got)
	}
	// An engine's options come last, after the job's own ioengine, so
	// that fio takes them; there is no filename.
	rbd := Place{Engine: []string{"ioengine=rbd", "pool=p", "rbdname=i"}}
	got = jobs[0].FileText(rbd, map[string]string{"COMPARE_RUNTIME": "15"})
	if strings.Contains(got, "filename=") || !strings.HasSuffix(got, "\nioengine=rbd\npool=p\nrbdname=i\n") {
		t.Errorf("engine place:\n%s", got)
	}
	if rbd.String() != "ioengine=rbd pool=p rbdname=i" {
		t.Errorf("engine place named %q", rbd.String())
	}
}
