//go:build rbd

package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vdiskfs/vdiskfs/tests/testutil"
)

// With --rbd-pool, librbd (fio's rbd engine) and stores of a vdisk binary
// on RBD images of one cluster run side by side: a file-door and a
// vhost-door target, a fresh workload that makes every target anew and
// one on filled targets; the vdisk targets' counters and CPU come out,
// librbd has none, and no image of the run is left in the pool. Needs the
// cluster tools/test-rbd.sh starts (CEPH_CONF).
func TestRBDTargets(t *testing.T) {
	needMounts(t)
	pool := testutil.RequireCeph(t)
	bin := buildVdisk(t, "-tags", "rbd")
	scratch := t.TempDir()
	rep := runReport(t, filepath.Join(t.TempDir(), "r.json"),
		"--scratch", scratch, "--size", "64M", "--rounds", "1", "--runtime", "1s", "--ramp", "0s", "--settle", "0s",
		"--workloads", "thin-write-1m-qd16,rand-read-4k-qd32", "--rbd-pool", pool,
		"--binary", "file="+bin, "--vhost-binary", "socket="+bin,
		"--targets", "librbd,file,socket", "--baseline", "librbd")
	if rep.Config.RBDPool != pool {
		t.Errorf("report's rbd_pool %q, want %q", rep.Config.RBDPool, pool)
	}
	if len(rep.Runs) != 6 {
		t.Fatalf("%d runs, want 2 workloads × 3 targets", len(rep.Runs))
	}
	for _, r := range rep.Runs {
		if r.MBps <= 0 || r.FioIOs == 0 {
			t.Errorf("%s on %s: %+v", r.Workload, r.Target, r)
		}
		vdisk := r.Target != targetLibRBD
		if vdisk != (r.Req != nil && r.ServerCPU != nil) {
			t.Errorf("%s on %s: counters %v, server CPU %v", r.Workload, r.Target, r.Req, r.ServerCPU)
		}
	}
	out, err := exec.Command("rbd", "ls", pool).CombinedOutput()
	if err != nil {
		t.Fatalf("rbd ls %s: %v: %s", pool, err, out)
	}
	if suffix := fmt.Sprintf("-%d", os.Getpid()); strings.Contains(string(out), suffix+"\n") {
		t.Errorf("images of this run left in %s:\n%s", pool, out)
	}
	checkNoMounts(t, scratch)
}
