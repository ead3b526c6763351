package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// report is everything one comparison produced; --json writes it and
// --from-json reads it back.
type report struct {
	Tool      string         `json:"tool"`
	Command   string         `json:"command"`
	Started   time.Time      `json:"started"`
	Finished  time.Time      `json:"finished"`
	Machine   machineInfo    `json:"machine"`
	Config    configInfo     `json:"config"`
	Workloads []workloadInfo `json:"workloads"`
	Targets   []string       `json:"targets"`
	Baseline  string         `json:"baseline"`
	Results   []cell         `json:"results"`
	Runs      []runResult    `json:"runs"`
}

type configInfo struct {
	Rounds     int     `json:"rounds"`
	RuntimeSec float64 `json:"runtime_s"`
	RampSec    float64 `json:"ramp_s"`
	SettleSec  float64 `json:"settle_s"`
	SizeBytes  int64   `json:"size_bytes"`
	Scratch    string  `json:"scratch"`
	Device     string  `json:"device,omitempty"`
	Jobs       string  `json:"jobs"` // "built-in" or the job file
	VdiskfsSrc string  `json:"vdiskfs"`
	// CommitInterval is --commit-interval when it was given.
	CommitInterval string `json:"commit_interval,omitempty"`
	// IOEngine is how the in-process vdiskfs store issued its data I/O
	// (io_uring or pread), when it ran.
	IOEngine string `json:"io_engine,omitempty"`
	// FUSETransport is how the in-process vdiskfs mount got its requests
	// (io_uring or dev), when it ran.
	FUSETransport string `json:"fuse_transport,omitempty"`
	// HugePages is --hugepages: the generator's and fio's buffers on
	// hugetlb pages.
	HugePages bool `json:"huge_pages,omitempty"`
	// RBDPool is --rbd-pool: the pool of the librbd target's image and of
	// the vdisk binaries' stores.
	RBDPool string `json:"rbd_pool,omitempty"`
}

type workloadInfo struct {
	Name  string `json:"name"`
	Note  string `json:"note,omitempty"`
	Fresh bool   `json:"fresh,omitempty"`
}

func (r *report) workloadNames() []string {
	out := make([]string, len(r.Workloads))
	for i, w := range r.Workloads {
		out[i] = w.Name
	}
	return out
}

// fmtNum prints a figure with sensible precision; "n/a" when unknown.
func fmtNum(v float64, digits int) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	if digits == 0 {
		switch a := math.Abs(v); {
		case a != 0 && a < 10:
			return fmt.Sprintf("%.2f", v)
		case a != 0 && a < 100:
			return fmt.Sprintf("%.1f", v)
		}
	}
	return fmt.Sprintf("%.*f", digits, v)
}

func fmtRatio(v float64) string {
	if math.IsNaN(v) {
		return ""
	}
	return fmt.Sprintf("%.2f", v)
}

// fmtSpread prints ratios as "median (min–max)"; empty when none is known.
func fmtSpread(s *spread) string {
	if s == nil || s.N == 0 {
		return ""
	}
	return fmt.Sprintf("%.2f (%.2f–%.2f)", float64(s.Median), float64(s.Min), float64(s.Max))
}

// tableColumns are the metrics shown in the table and markdown, after
// workload, target, MB/s with its range and the ratio.
var tableColumns = []string{
	"iops", "p50_us", "p99_us", "fuse_request_kib",
	"backend_io_per_s", "backend_io_kib", "device_io_per_s", "device_io_kib",
	"server_cpu_s_per_gb", "server_cpu_us_per_io", "fio_cpu_s_per_gb",
}

func metricByKey(key string) metricDef {
	for _, m := range metrics {
		if m.Key == key {
			return m
		}
	}
	panic("unknown metric " + key)
}

// rows builds the table: a header and one row per cell. rangeCol puts the
// MB/s min–max in a column of its own (markdown) instead of after the
// median (terminal).
func (r *report) rows(rangeCol bool) [][]string {
	head := []string{"workload", "target", "MB/s"}
	if rangeCol {
		head = append(head, "MB/s min–max")
	}
	head = append(head, "× "+r.Baseline, "× "+r.Baseline+" per round")
	for _, k := range tableColumns {
		head = append(head, metricByKey(k).Head)
	}
	out := [][]string{head}
	for i := range r.Results {
		c := &r.Results[i]
		mb := c.get("mb_per_s")
		rng := fmt.Sprintf("%s–%s", fmtNum(float64(mb.Min), 0), fmtNum(float64(mb.Max), 0))
		row := []string{c.Workload, c.Target}
		if rangeCol {
			row = append(row, fmtNum(float64(mb.Median), 0), rng)
		} else {
			row = append(row, fmt.Sprintf("%s (%s)", fmtNum(float64(mb.Median), 0), rng))
		}
		if c.Target == r.Baseline {
			row = append(row, "1", "1")
		} else {
			row = append(row, fmtRatio(float64(mb.Ratio)), fmtSpread(mb.RoundRatio))
		}
		for _, k := range tableColumns {
			m := metricByKey(k)
			row = append(row, fmtNum(float64(c.get(k).Median), m.Digits))
		}
		out = append(out, row)
	}
	return out
}

// writeTable writes the terminal table: medians, MB/s min–max in
// parentheses; names left-aligned, figures right-aligned, a blank line
// between workloads.
func (r *report) writeTable(w io.Writer) error {
	rows := r.rows(false)
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for j, c := range row {
			width[j] = max(width[j], utf8.RuneCountInString(c))
		}
	}
	var b strings.Builder
	for i, row := range rows {
		if i > 1 && r.Results[i-1].Workload != r.Results[i-2].Workload {
			b.WriteByte('\n')
		}
		for j, c := range row {
			pad := strings.Repeat(" ", width[j]-utf8.RuneCountInString(c))
			if j > 0 {
				b.WriteString("  ")
			}
			if j < 2 {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		b.WriteByte('\n')
	}
	b.WriteString("\n" + r.legend() + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// legend explains the columns.
func (r *report) legend() string {
	return fmt.Sprintf("Medians of %d round(s), %gs each (+%gs ramp), file size %s; MB/s is 10^6 bytes/s, (min–max) over rounds; "+
		"× %s = MB/s median over %s's; per round = median (min–max) of each round's MB/s over %s's in the same round, "+
		"the ratio to read on a noisy machine (a round runs the targets back to back). FUSE req = average READ/WRITE request size the file system received; "+
		"backend = the server's own I/O to its backing (vdiskfs store counters; one pread/pwrite per request for %s); "+
		"device = /proc/diskstats of %s (every process on the machine); "+
		"server CPU = user+system CPU of the process serving the file, per GB it served; fio CPU = fio's own. n/a = not measurable for that target.",
		r.Config.Rounds, r.Config.RuntimeSec, r.Config.RampSec, fmtSize(r.Config.SizeBytes),
		r.Baseline, r.Baseline, r.Baseline, targetPassthrough, orNA(r.Config.Device))
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}

// machineLine says where and when the numbers were taken.
func (r *report) machineLine() string {
	m := r.Machine
	load := func(l []float64) string {
		if len(l) == 0 {
			return "?"
		}
		return fmt.Sprintf("%.2f", l[0])
	}
	during := ""
	if len(r.Runs) > 0 {
		lo, hi := r.Runs[0].Load1, r.Runs[0].Load1
		for _, run := range r.Runs {
			lo, hi = min(lo, run.Load1), max(hi, run.Load1)
		}
		during = fmt.Sprintf(", %.2f–%.2f at the runs' starts", lo, hi)
	}
	procs := ""
	if m.GoMaxProcs > 0 {
		procs = fmt.Sprintf(" (GOMAXPROCS %d)", m.GoMaxProcs)
	}
	if r.Config.IOEngine != "" {
		procs += ", vdiskfs I/O engine " + r.Config.IOEngine
	}
	if r.Config.FUSETransport != "" {
		procs += ", vdiskfs FUSE transport " + r.Config.FUSETransport
	}
	if r.Config.HugePages {
		procs += ", I/O buffers and guest memory on 2 MiB huge pages"
	}
	return fmt.Sprintf("Machine: %d × %s, %.0f GiB, Linux %s, %s, %s%s; scratch on %s, device %s; "+
		"1-minute load average %s before, %s after%s; %s to %s UTC.",
		m.Nproc, m.CPU, m.MemGiB, m.Kernel, m.Fio, m.Go, procs, orNA(m.FsType), orNA(r.Config.Device),
		load(m.LoadBefore), load(m.LoadAfter), during, r.Started.Format("2006-01-02 15:04"), r.Finished.Format("15:04"))
}

// writeMarkdown writes a GitHub table, the legend and the machine.
func (r *report) writeMarkdown(w io.Writer) error {
	rows := r.rows(true)
	var b strings.Builder
	for i, row := range rows {
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		if i == 0 {
			seps := make([]string, len(row))
			for j := range seps {
				if j < 2 {
					seps[j] = "---"
				} else {
					seps[j] = "--:"
				}
			}
			b.WriteString("| " + strings.Join(seps, " | ") + " |\n")
		}
	}
	b.WriteString("\n" + r.legend() + "\n\n" + r.machineLine() + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// writeJSON writes the whole report.
func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// readReport reads what writeJSON wrote and recomputes the cells from the
// runs (so a report can be re-rendered by a newer tool).
func readReport(rd io.Reader) (*report, error) {
	var r report
	if err := json.NewDecoder(rd).Decode(&r); err != nil {
		return nil, fmt.Errorf("reading report: %w", err)
	}
	if len(r.Runs) == 0 {
		return nil, fmt.Errorf("reading report: no runs")
	}
	r.Results = aggregate(r.Runs, r.workloadNames(), r.Targets, r.Baseline)
	return &r, nil
}

// readReportFile is readReport of the file at path (--from-json).
func readReportFile(path string) (*report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rep, err := readReport(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rep, nil
}

// rebase takes the report's ratios against another of its targets.
func (r *report) rebase(baseline string) error {
	if !slices.Contains(r.Targets, baseline) {
		return fmt.Errorf("--baseline %s is not among the report's targets %s", baseline, strings.Join(r.Targets, ","))
	}
	r.Baseline = baseline
	r.Results = aggregate(r.Runs, r.workloadNames(), r.Targets, baseline)
	return nil
}

// fmtSize prints a byte count with a binary suffix.
func fmtSize(n int64) string {
	for _, u := range []struct {
		s string
		v int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.v && n%u.v == 0 {
			return fmt.Sprintf("%d %s", n/u.v, u.s)
		}
	}
	return fmt.Sprintf("%d B", n)
}
