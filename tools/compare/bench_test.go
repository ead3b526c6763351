package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vdiskfs/vdiskfs/tools/compare/fio"
)

// fakeTarget records what the bench does to it; its counters grow by a
// fixed step per sample.
type fakeTarget struct {
	name, file string
	log        *[]string
	n          uint64
}

func (f *fakeTarget) Name() string { return f.name }
func (f *fakeTarget) File() string { return f.file }
func (f *fakeTarget) Reset(ctx context.Context) error {
	*f.log = append(*f.log, "reset "+f.name)
	return nil
}
func (f *fakeTarget) Sample() sample {
	f.n++
	return sample{
		Req:     &ioCount{Writes: f.n * 100, WriteBytes: f.n * 100 << 20},
		Backend: &ioCount{Writes: f.n * 50, WriteBytes: f.n * 100 << 20},
		CPU:     time.Duration(f.n) * time.Second,
		HasCPU:  true,
	}
}
func (f *fakeTarget) Close() error { return nil }

// fakeFio writes a script that logs each job file's job and target, and
// prints a captured fio JSON output.
func fakeFio(t *testing.T, dir string) (bin, log string) {
	t.Helper()
	sample, err := filepath.Abs("fio/testdata/seq-write-1m-qd16.json")
	if err != nil {
		t.Fatal(err)
	}
	log = filepath.Join(dir, "fio.log")
	bin = filepath.Join(dir, "fio")
	script := "#!/bin/sh\n" +
		"job=$(grep '^\\[' \"$2\" | grep -v global | tr -d '[]')\n" +
		"file=$(sed -n 's/^filename=//p' \"$2\")\n" +
		"echo \"$job $(basename $(dirname $file))\" >> " + log + "\n" +
		"cat " + sample + "\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, log
}

// The bench fills targets before time-based workloads, empties them before
// a fresh one, alternates their order, and takes counter deltas.
func TestBenchRounds(t *testing.T) {
	dir := t.TempDir()
	bin, fioLog := fakeFio(t, dir)
	var events []string
	var targets []target
	for _, n := range []string{"A", "B"} {
		if err := os.MkdirAll(filepath.Join(dir, n), 0o755); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, n, "f")
		if err := os.WriteFile(file, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		targets = append(targets, &fakeTarget{name: n, file: file, log: &events})
	}
	jobs := []fio.Job{
		{Name: "seq", Text: "[seq]\nrw=write\n"},
		{Name: "thin", Text: "[thin]\nrw=write\n", Fresh: true},
	}
	b := &bench{
		cfg:     benchConfig{Rounds: 2, Jobs: jobs, Baseline: "B"},
		targets: targets,
		runner:  &fio.Runner{Bin: bin, Dir: dir},
	}
	runs, err := b.run(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(fioLog)
	got := strings.Fields(strings.ReplaceAll(string(raw), "\n", ","))
	want := strings.Fields(strings.Join([]string{
		// round 1: seq A,B (each filled first), thin B,A
		"fill A,seq A,fill B,seq B,thin B,thin A,",
		// round 2: seq B,A (filled again after the thin write), thin A,B
		"fill B,seq B,fill A,seq A,thin A,thin B,",
	}, ""))
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("fio ran\n  %v\nwant\n  %v", got, want)
	}
	if strings.Join(events, ",") != "reset B,reset A,reset A,reset B" {
		t.Errorf("resets %v", events)
	}
	if len(runs) != 8 {
		t.Fatalf("%d runs", len(runs))
	}
	r := runs[0]
	if r.Workload != "seq" || r.Target != "A" || r.Round != 1 || r.Position != 1 {
		t.Errorf("first run %+v", r)
	}
	if r.Req == nil || r.Req.Writes != 100 || r.Backend.Writes != 50 || r.ServerCPU == nil || *r.ServerCPU != 1 {
		t.Errorf("deltas: req %+v backend %+v cpu %v", r.Req, r.Backend, r.ServerCPU)
	}
	if r.MBps != 3173.898698 || r.FioIOs != 6069 || float64(r.P99us) <= 0 {
		t.Errorf("fio figures %+v", r)
	}
	if runs[2].Target != "B" || runs[2].Workload != "thin" || runs[4].Target != "B" || runs[4].Round != 2 {
		t.Errorf("order: %s/%s, %s/%s", runs[2].Workload, runs[2].Target, runs[4].Workload, runs[4].Target)
	}
}

// A cancelled bench stops at once and says so: no target is reset, fio
// never runs, no run is reported.
func TestBenchCancelled(t *testing.T) {
	dir := t.TempDir()
	bin, fioLog := fakeFio(t, dir)
	var events []string
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	b := &bench{
		cfg:     benchConfig{Rounds: 1, Jobs: []fio.Job{{Name: "seq", Text: "[seq]\n"}}},
		targets: []target{&fakeTarget{name: "A", file: file, log: &events}},
		runner:  &fio.Runner{Bin: bin, Dir: dir},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	runs, err := b.run(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if len(runs) != 0 || len(events) != 0 {
		t.Errorf("a cancelled bench reported %d runs and did %v", len(runs), events)
	}
	if raw, err := os.ReadFile(fioLog); err == nil && len(raw) != 0 {
		t.Errorf("fio ran after the cancel: %s", raw)
	}
}
