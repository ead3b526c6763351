package fio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ErrNotInstalled: no fio binary was found.
var ErrNotInstalled = errors.New("fio is not installed")

// InstallHint says how to get fio.
const InstallHint = "fio is the load generator of the compare tool and is not installed.\n" +
	"  Debian/Ubuntu: apt-get install fio\n" +
	"  Fedora/RHEL:   dnf install fio\n" +
	"  or pass --fio /path/to/fio"

// Find returns the fio binary: bin if it names one (a path or a name in
// PATH), wrapping ErrNotInstalled with InstallHint when there is none.
func Find(bin string) (string, error) {
	if bin == "" {
		bin = "fio"
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("%w (%s)\n%s", ErrNotInstalled, bin, InstallHint)
	}
	return p, nil
}

// Version returns what `fio --version` prints ("fio-3.33").
func Version(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// Runner runs workloads with one fio binary.
type Runner struct {
	Bin string            // path of fio
	Dir string            // where job files are written ("" = os.TempDir())
	Var map[string]string // ${NAME} replacements (COMPARE_RUNTIME, ...)
	// IOMem is fio's iomem= for every job ("": fio's own default, malloc),
	// set before the job's text, which may still override it.
	IOMem string
}

// Run runs job on p and returns fio's parsed output, its raw JSON, and
// the wall time of the fio process. A cancelled ctx stops fio.
func (r *Runner) Run(ctx context.Context, job Job, p Place) (*Output, []byte, time.Duration, error) {
	jf, err := os.CreateTemp(r.Dir, "compare-"+job.Name+"-*.fio")
	if err != nil {
		return nil, nil, 0, err
	}
	defer os.Remove(jf.Name())
	text := job.FileText(p, r.Var)
	if r.IOMem != "" {
		text = "[global]\niomem=" + r.IOMem + "\n" + text
	}
	if _, err := jf.WriteString(text); err != nil {
		jf.Close()
		return nil, nil, 0, err
	}
	if err := jf.Close(); err != nil {
		return nil, nil, 0, err
	}
	cmd := exec.CommandContext(ctx, r.Bin, "--output-format=json", filepath.Clean(jf.Name()))
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGINT) }
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err = cmd.Run()
	wall := time.Since(start)
	if ctx.Err() != nil {
		return nil, nil, wall, ctx.Err()
	}
	if err != nil {
		return nil, stdout.Bytes(), wall, fmt.Errorf("fio %s on %s: %w: %s", job.Name, p, err, lastLines(stderr.String(), 5))
	}
	out, err := Parse(stdout.Bytes())
	if err != nil {
		return nil, stdout.Bytes(), wall, fmt.Errorf("fio %s on %s: %w: %s", job.Name, p, err, lastLines(stderr.String(), 5))
	}
	for _, j := range out.Jobs {
		if j.Error != 0 {
			return out, stdout.Bytes(), wall, fmt.Errorf("fio %s on %s: job %s failed with error %d (%s): %s",
				job.Name, p, j.Name, j.Error, syscall.Errno(j.Error), lastLines(stderr.String(), 5))
		}
	}
	return out, stdout.Bytes(), wall, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
