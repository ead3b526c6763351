package fio

import (
	"errors"
	"math"
	"os"
	"strings"
	"testing"
)

func readSample(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testdata/seq-write-1m-qd16.json is fio 3.33 on a plain ext4 file:
// --rw=write --bs=1M --iodepth=16 --lat_percentiles=1 --ramp_time=1.
func TestParseSeqWrite(t *testing.T) {
	out, err := Parse(readSample(t, "seq-write-1m-qd16.json"))
	if err != nil {
		t.Fatal(err)
	}
	if out.Version != "fio-3.33" || len(out.Jobs) != 1 || out.Jobs[0].Name != "seq" {
		t.Fatalf("version %q, jobs %+v", out.Version, out.Jobs)
	}
	s := out.Summary()
	if s.Bytes != 6379536384 || s.IOs != 6069 {
		t.Errorf("bytes %d ios %d", s.Bytes, s.IOs)
	}
	if s.BWBytes != 3173898698 || math.Abs(s.IOPS-3019.402985) > 1e-6 {
		t.Errorf("bw %v iops %v", s.BWBytes, s.IOPS)
	}
	if s.Dominant != "write" {
		t.Errorf("dominant %q", s.Dominant)
	}
	// lat_ns percentiles (lat_percentiles=1) win over clat_ns.
	w := out.Jobs[0].Write
	if got, want := s.P50Ns, w.LatNs.Percentile["50.000000"]; got != want || got == w.ClatNs.Percentile["50.000000"] {
		t.Errorf("p50 %v, want lat_ns's %v", got, want)
	}
	if got, want := s.P99Ns, w.LatNs.Percentile["99.000000"]; got != want {
		t.Errorf("p99 %v, want %v", got, want)
	}
	wantCPU := (out.Jobs[0].UsrCPU + out.Jobs[0].SysCPU) / 100 * float64(out.Jobs[0].JobRuntime) / 1000
	if math.Abs(s.CPUSeconds-wantCPU) > 1e-9 || s.CPUSeconds <= 0 {
		t.Errorf("cpu %v, want %v", s.CPUSeconds, wantCPU)
	}
}

// testdata/randrw-4k-qd32.json has both directions: they add up, and the
// percentiles are the busier direction's.
func TestParseMixed(t *testing.T) {
	out, err := Parse(readSample(t, "randrw-4k-qd32.json"))
	if err != nil {
		t.Fatal(err)
	}
	j := out.Jobs[0]
	s := out.Summary()
	if s.IOs != j.Read.TotalIOs+j.Write.TotalIOs || s.Bytes != j.Read.IOBytes+j.Write.IOBytes {
		t.Errorf("ios %d bytes %d, want the sum of both directions", s.IOs, s.Bytes)
	}
	if math.Abs(s.IOPS-(j.Read.IOPS+j.Write.IOPS)) > 1e-6 {
		t.Errorf("iops %v", s.IOPS)
	}
	dom := j.Read
	if j.Write.TotalIOs > j.Read.TotalIOs {
		dom = j.Write
	}
	if s.P99Ns != dom.Percentile(99) {
		t.Errorf("p99 %v, want the dominant direction's %v", s.P99Ns, dom.Percentile(99))
	}
}

func TestParseSkipsNoise(t *testing.T) {
	b := append([]byte("fio: some warning\nnote: another\n"), readSample(t, "seq-write-1m-qd16.json")...)
	if _, err := Parse(b); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse([]byte("fio: file not found\n")); !errors.Is(err, ErrNoJSON) {
		t.Errorf("no JSON: %v", err)
	}
	if _, err := Parse([]byte(`{"fio version": "x", "jobs": []}`)); err == nil {
		t.Error("no jobs: no error")
	}
}

func TestPercentileMissing(t *testing.T) {
	var d DirStat
	if !math.IsNaN(d.Percentile(99)) {
		t.Error("percentile of nothing is not NaN")
	}
	d.ClatNs = LatStat{N: 3, Percentile: map[string]float64{"50.000000": 7, "99.000000": 9}}
	if d.Percentile(50) != 7 || d.Percentile(99) != 9 {
		t.Error("clat_ns fallback")
	}
	if !math.IsNaN(d.Percentile(75)) {
		t.Error("a percentile fio did not report should be NaN")
	}
}

func TestFind(t *testing.T) {
	_, err := Find("/nonexistent/fio")
	if !errors.Is(err, ErrNotInstalled) {
		t.Fatalf("err = %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "apt-get install fio") {
		t.Errorf("error does not say how to get fio: %s", msg)
	}
}
