package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/tools/compare/fio"
)

func TestGuestTargetsStandAlone(t *testing.T) {
	got, err := parseTargets("guest-file,guest-vhost", nil)
	if err != nil || !slices.Equal(got, []string{targetGuestVhost, targetGuestFile}) || !isGuest(got) {
		t.Errorf("guest-file,guest-vhost: %v, %v", got, err)
	}
	if _, err := parseTargets("guest-vhost,vhost", nil); err == nil {
		t.Error("a guest target with a host target is accepted")
	}
	all, err := parseTargets("all", nil)
	if err != nil || isGuest(all) || slices.Contains(all, targetGuestVhost) || slices.Contains(all, targetGuestFile) {
		t.Errorf("all: %v, %v", all, err)
	}
	if err := checkGuestJobs([]fio.Job{{Name: "a"}, {Name: "thin", Fresh: true}}); err == nil {
		t.Error("a fresh workload is accepted for the guest")
	}
	if err := checkGuestJobs([]fio.Job{{Name: "a"}, {Name: "b", After: "a"}}); err == nil {
		t.Error("an after workload is accepted for the guest")
	}
}

// The guest fills each disk once, then alternates the disks as the host
// rounds do.
func TestGuestPlan(t *testing.T) {
	var log []string
	a, b := &fakeTarget{name: "A", log: &log}, &fakeTarget{name: "B", log: &log}
	jobs := []fio.Job{{Name: "j0"}, {Name: "j1"}}
	var got []string
	for _, st := range guestPlan(jobs, []target{a, b}, 2) {
		got = append(got, fmt.Sprintf("%d:%s:%s:%d", st.round, st.job.Name, st.disk.Name(), st.pos))
	}
	want := []string{
		"0:fill:A:0", "0:fill:B:0",
		"1:j0:A:1", "1:j0:B:2", "1:j1:B:1", "1:j1:A:2",
		"2:j0:B:1", "2:j0:A:2", "2:j1:A:1", "2:j1:B:2",
	}
	if !slices.Equal(got, want) {
		t.Errorf("plan\n got %v\nwant %v", got, want)
	}
}

// guestInit is a shell script sh accepts, with one fio run per step on
// its job file and a flush of the step's disk after it.
func TestGuestInit(t *testing.T) {
	var log []string
	a, b := &fakeTarget{name: targetGuestVhost, log: &log}, &fakeTarget{name: targetGuestFile, log: &log}
	steps := guestPlan([]fio.Job{{Name: "j0"}}, []target{a, b}, 2)
	script := guestInit(steps, []string{"/cache/virtio.ko", "/cache/virtio_blk.ko"}, []string{"/lib/x86_64-linux-gnu", "/lib64"}, 1500*time.Millisecond)
	file := filepath.Join(t.TempDir(), "init")
	if err := os.WriteFile(file, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-n", file).CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v: %s\n%s", err, out, script)
	}
	for _, want := range []string{"insmod /lib/modules/virtio.ko", "insmod /lib/modules/virtio_blk.ko", "LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/lib64", "sleep 1.5\n"} {
		if !strings.Contains(script, want) {
			t.Errorf("no %q in\n%s", want, script)
		}
	}
	for i, st := range steps {
		for _, want := range []string{
			fmt.Sprintf("echo \"%s%d\"\n%s --output-format=json --output=/tmp/out.json /jobs/%d.fio ", markBegin, i, guestFioBin, i),
			fmt.Sprintf("%s%d\"\nsync /dev/%s ", markJSONEnd, i, st.disk.Name()),
		} {
			if !strings.Contains(script, want) {
				t.Errorf("step %d: no %q in\n%s", i, want, script)
			}
		}
	}
}

// guestLines is the console of a guest that runs steps, each printing
// json as its fio output, with noise (kernel lines) between the markers.
func guestLines(steps int, json string) []string {
	var lines []string
	for i := range steps {
		lines = append(lines, fmt.Sprintf("%s%d", markBegin, i), "[   12.000000] some kernel line", fmt.Sprintf("%s%d", markEnd, i), fmt.Sprintf("%s%d", markJSONBegin, i))
		lines = append(lines, strings.Split(json, "\n")...)
		lines = append(lines, fmt.Sprintf("%s%d", markJSONEnd, i))
	}
	return append(lines, markDone)
}

// The console turns each step's JSON into a run with the counters taken
// at its markers; the fills are not runs.
func TestGuestConsole(t *testing.T) {
	sample, err := os.ReadFile("fio/testdata/seq-write-1m-qd16.json")
	if err != nil {
		t.Fatal(err)
	}
	out, err := fio.Parse(sample)
	if err != nil {
		t.Fatal(err)
	}
	sum := out.Summary()
	var log []string
	a, b := &fakeTarget{name: targetGuestVhost, log: &log}, &fakeTarget{name: targetGuestFile, log: &log}
	steps := guestPlan([]fio.Job{{Name: "j0"}}, []target{a, b}, 2)
	bn := &bench{}
	var snapped []string
	snap := func(t target) snapshot {
		snapped = append(snapped, t.Name())
		return bn.snapshot(t)
	}
	c := newGuestConsole(steps, snap, t.Logf)
	for _, l := range guestLines(len(steps), string(sample)) {
		c.line(l)
	}
	if c.err != nil || !c.done {
		t.Fatalf("err %v, done %v", c.err, c.done)
	}
	var wantSnaps []string
	for _, st := range steps {
		wantSnaps = append(wantSnaps, st.disk.Name(), st.disk.Name())
	}
	if !slices.Equal(snapped, wantSnaps) {
		t.Errorf("samples taken of %v, want %v", snapped, wantSnaps)
	}
	if len(c.runs) != 4 {
		t.Fatalf("%d runs, want 4 (the fills are not runs)", len(c.runs))
	}
	for i, r := range c.runs {
		st := steps[i+2]
		if r.Workload != "j0" || r.Target != st.disk.Name() || r.Round != st.round || r.Position != st.pos {
			t.Errorf("run %d: %s on %s, round %d position %d; want step %+v", i, r.Workload, r.Target, r.Round, r.Position, st)
		}
		if r.MBps != sum.BWBytes/1e6 || r.FioBytes != sum.Bytes || r.FioIOs != sum.IOs {
			t.Errorf("run %d: %v MB/s, %d bytes, %d I/Os; fio says %v, %d, %d", i, r.MBps, r.FioBytes, r.FioIOs, sum.BWBytes/1e6, sum.Bytes, sum.IOs)
		}
		// fakeTarget's CPU grows by 1 s and its requests by 100 per sample.
		if r.ServerCPU == nil || *r.ServerCPU != 1 || r.Req == nil || r.Req.Writes != 100 {
			t.Errorf("run %d: server CPU %v, requests %+v: not the delta between its own markers", i, r.ServerCPU, r.Req)
		}
	}
}

// Whatever goes wrong in the guest is an error, never a run too few or a
// run of the wrong step.
func TestGuestConsoleErrors(t *testing.T) {
	sample, err := os.ReadFile("fio/testdata/seq-write-1m-qd16.json")
	if err != nil {
		t.Fatal(err)
	}
	good := guestLines(3, string(sample))
	// upTo is good up to and with line.
	upTo := func(line string) []string { return slices.Clone(good[:slices.Index(good, line)+1]) }
	cases := []struct {
		name  string
		lines []string
		want  string
	}{
		{"fio failed", append(upTo(markBegin+"1"), markFail+": step 1: fio: no such device"), "no such device"},
		{"fio job error", guestLines(3, strings.Replace(string(sample), `"error" : 0`, `"error" : 5`, 1)), "error 5"},
		{"kernel line in the JSON", guestLines(3, strings.Replace(string(sample), "\n", "\n[  3.1] virtio_blk: oops\n", 3)), "step 0"},
		{"a step skipped", slices.DeleteFunc(slices.Clone(good), func(l string) bool { return strings.HasSuffix(l, " 1") }), "step 2 begins after step 0"},
		{"a step begun twice", append(slices.Clone(good[:2]), good...), "step 0 begins"},
		{"no end marker", slices.DeleteFunc(slices.Clone(good), func(l string) bool { return l == markEnd+"2" }), "JSON of step 2"},
		{"done too early", append(upTo(markJSONEnd+"1"), markDone), "done after step 2 of 3"},
	}
	if !strings.Contains(string(sample), `"error" : 0`) {
		t.Fatal("the sample has no \"error\" : 0 to change")
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var log []string
			a, b := &fakeTarget{name: targetGuestVhost, log: &log}, &fakeTarget{name: targetGuestFile, log: &log}
			steps := guestPlan([]fio.Job{{Name: "j0"}}, []target{a, b}, 1) // 2 fills + 2 runs; 3 used
			steps = steps[:3]
			c := newGuestConsole(steps, (&bench{}).snapshot, t.Logf)
			for _, l := range tc.lines {
				c.line(l)
			}
			if c.err == nil || !strings.Contains(c.err.Error(), tc.want) {
				t.Errorf("err %v, want one saying %q", c.err, tc.want)
			}
		})
	}
}
