package main

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// fakeReport is two workloads on three targets over two rounds.
func fakeReport() *report {
	mib := uint64(1 << 20)
	req := &ioCount{Writes: 2000, WriteBytes: 2000 * mib}
	small := &ioCount{Reads: 50000, ReadBytes: 50000 * 4096}
	var runs []runResult
	for round := 1; round <= 2; round++ {
		f := float64(round)
		runs = append(runs,
			fakeRun("seq-write-1m-qd16", "vdiskfs", round, 1000+f, req, req),
			fakeRun("seq-write-1m-qd16", "passthrough", round, 1100+f, req, req),
			fakeRun("seq-write-1m-qd16", "raw", round, 2000+f, nil, nil),
		)
		r := fakeRun("rand-read-4k-qd32", "vdiskfs", round, 80, small, small)
		r.IOPS = 20000
		p := fakeRun("rand-read-4k-qd32", "passthrough", round, 100, small, small)
		p.IOPS = 25000
		runs = append(runs, r, p)
	}
	rep := &report{
		Tool: "vdiskfs compare", Command: "compare --rounds 2",
		Started: time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC), Finished: time.Date(2026, 11, 30, 4, 10, 0, 0, time.UTC),
		Machine:  machineInfo{Nproc: 2, CPU: "AMD EPYC", Kernel: "6.18", Fio: "fio-3.33"},
		Config:   configInfo{Rounds: 2, RuntimeSec: 15, RampSec: 2, SizeBytes: 2 << 30, Device: "vda (254:0)"},
		Targets:  []string{"vdiskfs", "passthrough", "raw"},
		Baseline: "passthrough",
		Workloads: []workloadInfo{
			{Name: "seq-write-1m-qd16", Note: "1 MiB sequential write"},
			{Name: "rand-read-4k-qd32"},
		},
		Runs: runs,
	}
	rep.Results = aggregate(runs, rep.workloadNames(), rep.Targets, rep.Baseline)
	return rep
}

func TestTable(t *testing.T) {
	var b bytes.Buffer
	if err := fakeReport().writeTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(out, "\n")
	if !strings.HasPrefix(lines[0], "workload") || !strings.Contains(lines[0], "× passthrough") || !strings.Contains(lines[0], "backend KiB") {
		t.Errorf("header: %q", lines[0])
	}
	for _, want := range []string{
		"seq-write-1m-qd16  vdiskfs      1002 (1001–1002)",
		"0.91", // 1001.5 / 1101.5
		"1.82", // raw: 2001.5 / 1101.5
		"1024", // request and backend KiB
		"4.00", // 4 KiB random reads
		"n/a",  // raw has no request counters
		"Medians of 2 round(s)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Every row has the same width: figures right-aligned in columns.
	for i := 1; i <= 5; i++ {
		if i != 4 && utf8.RuneCountInString(lines[i]) != utf8.RuneCountInString(lines[0]) {
			t.Errorf("row %d is not as wide as the header:\n%s", i, out)
		}
	}
	// A blank line between workloads.
	if lines[4] != "" {
		t.Errorf("line 4 = %q, want a blank line between workloads", lines[4])
	}
}

func TestMarkdown(t *testing.T) {
	var b bytes.Buffer
	if err := fakeReport().writeMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.HasPrefix(lines[0], "| workload | target | MB/s | MB/s min–max | × passthrough |") {
		t.Errorf("header %q", lines[0])
	}
	if !strings.HasPrefix(lines[1], "| --- | --- | --: |") {
		t.Errorf("separator %q", lines[1])
	}
	cols := strings.Count(lines[0], "|")
	for i := 1; i <= 6; i++ {
		if strings.Count(lines[i], "|") != cols {
			t.Errorf("line %d has %d bars, header %d: %q", i, strings.Count(lines[i], "|"), cols, lines[i])
		}
	}
	if lines[2] != "| seq-write-1m-qd16 | vdiskfs | 1002 | 1001–1002 | 0.91 | 0.91 (0.91–0.91) | 1002 | 150 | n/a | 1024 | 1000 | 1024 | 2000 | 512 | 0.24 | 250.0 | 0.10 |" {
		t.Errorf("first row %q", lines[2])
	}
	if lines[3][:len("| seq-write-1m-qd16 | passthrough | 1102 | 1101–1102 | 1 | 1 |")] != "| seq-write-1m-qd16 | passthrough | 1102 | 1101–1102 | 1 | 1 |" {
		t.Errorf("baseline row %q", lines[3])
	}
}

func TestJSONRoundTrip(t *testing.T) {
	rep := fakeReport()
	var b bytes.Buffer
	if err := rep.writeJSON(&b); err != nil {
		t.Fatal(err)
	}
	// Unknown figures are null, not NaN (which JSON cannot hold).
	var generic map[string]any
	if err := json.Unmarshal(b.Bytes(), &generic); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	if !strings.Contains(b.String(), `"p99_us": null`) {
		t.Error("NaN p99 is not null")
	}
	back, err := readReport(bytes.NewReader(b.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Results) != len(rep.Results) || len(back.Runs) != len(rep.Runs) {
		t.Fatalf("results %d runs %d", len(back.Results), len(back.Runs))
	}
	for i := range rep.Results {
		for k, s := range rep.Results[i].Metrics {
			g := back.Results[i].Metrics[k]
			same := func(a, b jfloat) bool {
				return a == b || math.IsNaN(float64(a)) && math.IsNaN(float64(b)) || math.Abs(float64(a-b)) < 1e-3*math.Abs(float64(a))
			}
			if !same(s.Median, g.Median) || !same(s.Ratio, g.Ratio) || s.N != g.N {
				t.Errorf("%s %s %s: %+v after the round trip, was %+v", rep.Results[i].Workload, rep.Results[i].Target, k, g, s)
			}
		}
	}
	if _, err := readReport(strings.NewReader(`{"runs": []}`)); err == nil {
		t.Error("a report without runs was accepted")
	}
}

func TestChart(t *testing.T) {
	dir := t.TempDir()
	rep := fakeReport()
	png := filepath.Join(dir, "c.png")
	if err := rep.writeChart(png); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(png)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n")) {
		t.Fatalf("not a PNG (%v)", err)
	}
	svg := filepath.Join(dir, "c.svg")
	if err := rep.writeChart(svg); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(svg)
	if !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("rand-read-4k-qd32")) {
		t.Error("SVG lacks the svg element or a panel title")
	}
	if err := rep.writeChart(filepath.Join(dir, "c.gif")); err == nil {
		t.Error("a .gif chart was accepted")
	}
}

func TestPanelMetric(t *testing.T) {
	rep := fakeReport()
	var seq, rnd []*cell
	for i := range rep.Results {
		if rep.Results[i].Workload == "seq-write-1m-qd16" {
			seq = append(seq, &rep.Results[i])
		} else {
			rnd = append(rnd, &rep.Results[i])
		}
	}
	if k, _ := panelMetric(seq); k != "mb_per_s" {
		t.Errorf("1 MiB workload shows %s", k)
	}
	if k, _ := panelMetric(rnd); k != "iops" {
		t.Errorf("4 KiB workload shows %s", k)
	}
}

func TestFmtNum(t *testing.T) {
	for _, tc := range []struct {
		v    float64
		d    int
		want string
	}{
		{1234.4, 0, "1234"}, {42.25, 0, "42.2"}, {4, 0, "4.00"}, {0, 0, "0"}, {0.123, 2, "0.12"}, {math.NaN(), 0, "n/a"},
	} {
		if got := fmtNum(tc.v, tc.d); got != tc.want {
			t.Errorf("fmtNum(%v, %d) = %q, want %q", tc.v, tc.d, got, tc.want)
		}
	}
}

func TestNiceTicks(t *testing.T) {
	for _, tc := range []struct {
		hi   float64
		want string
	}{
		{2800, "0 500 1000 1500 2000 2500"},
		{1300, "0 250 500 750 1000 1250"},
		{66000, "0 20000 40000 60000"},
		{95, "0 20 40 60 80"},
	} {
		var got []string
		for _, tk := range (niceTicks{}).Ticks(0, tc.hi) {
			got = append(got, tk.Label)
		}
		if s := strings.Join(got, " "); s != tc.want {
			t.Errorf("ticks(0, %v) = %s, want %s", tc.hi, s, tc.want)
		}
	}
}

// TestRebase: a report read back takes its ratios against another of its
// targets; an absent one is refused.
func TestRebase(t *testing.T) {
	rep := fakeReport()
	if err := rep.rebase("raw"); err != nil {
		t.Fatal(err)
	}
	mb := rep.Results[0].get("mb_per_s")
	if rep.Results[0].Target != "vdiskfs" || math.Abs(float64(mb.Ratio)-1001.5/2001.5) > 1e-9 || mb.RoundRatio == nil || mb.RoundRatio.N != 2 {
		t.Errorf("vdiskfs against raw: %+v", mb)
	}
	if rep.Baseline != "raw" || rep.Results[2].get("mb_per_s").RoundRatio != nil {
		t.Errorf("baseline %s, raw's own round ratio %+v", rep.Baseline, rep.Results[2].get("mb_per_s").RoundRatio)
	}
	if err := rep.rebase("qsd-vhost"); err == nil {
		t.Error("rebase on a target the report lacks succeeded")
	}
}
