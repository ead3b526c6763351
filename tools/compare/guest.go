package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vdiskfs/vdiskfs/internal/tcgguest"
	"github.com/vdiskfs/vdiskfs/tools/compare/fio"
)

// The guest targets: fio inside one QEMU guest under TCG (package
// tcgguest), on two disks of one store that the vdisk binary (--vdisk)
// formats and mounts.
const (
	// targetGuestVhost is a disk served on its vhost-user-blk socket
	// (`vdisk vhost-user`).
	targetGuestVhost = "guest-vhost"
	// targetGuestFile is another disk of the store, its file in the mount
	// opened by QEMU itself (-drive cache=none,aio=io_uring).
	targetGuestFile = "guest-file"

	guestMemory = "1G" // the guest's RAM: fio, its libraries and its buffers
	guestVCPUs  = 2    // and as many queues on each disk
	guestFioBin = "/usr/bin/fio"
)

// guestTargets are the guest targets in the order they appear.
var guestTargets = []string{targetGuestVhost, targetGuestFile}

// guestDisk is one disk of the guest: a target whose runs the guest makes
// and the host only reads (Sample) around them. Both disks are served by
// one daemon, and only one runs at a time, so the daemon's counters and
// CPU between a run's markers are that run's.
type guestDisk struct {
	name   string // the target, and the guest's /dev/NAME
	file   string // the disk's file in the mount
	daemon *vdiskDaemon
}

func (d *guestDisk) Name() string { return d.name }
func (d *guestDisk) File() string { return d.file }
func (d *guestDisk) Reset(ctx context.Context) error {
	return fmt.Errorf("%s: the guest targets run no fresh workloads", d.name)
}
func (d *guestDisk) Sample() sample { return d.daemon.Sample() }
func (d *guestDisk) Close() error   { return nil } // the guestSetup closes what serves it

// guestSetup is the store, its two disks and what the guest is made of.
type guestSetup struct {
	daemon  *vdiskDaemon
	socket  string // the vhost disk's socket
	disks   map[string]*guestDisk
	qemu    string
	kernel  *tcgguest.Kernel
	busybox string
	fio     string // the host's fio, copied into the guest with its libraries
	dir     string
}

// newGuestSetup formats and mounts a store with the vdisk binary, serves
// one disk on a socket and makes a second one for QEMU to open, and finds
// (or fetches, into tcgguest's cache) the guest's kernel and busybox.
func newGuestSetup(ctx context.Context, vdisk, fioBin, dir string, size int64, logf func(string, ...any)) (*guestSetup, error) {
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, fmt.Errorf("%w: the guest targets need qemu-system-x86_64 (Debian: apt-get install qemu-system-x86)", errMissing)
	}
	cache := &tcgguest.Cache{Dir: tcgguest.DefaultCacheDir(), Apt: &tcgguest.Apt{}, Logf: logf}
	g := &guestSetup{qemu: qemu, fio: fioBin, dir: dir, socket: filepath.Join(dir, "guest-vhost.sock")}
	if g.kernel, err = cache.Kernel(); err != nil {
		return nil, fmt.Errorf("guest kernel: %w", err)
	}
	if g.busybox, err = cache.Busybox(); err != nil {
		return nil, fmt.Errorf("guest busybox: %w", err)
	}
	if g.daemon, err = newVdiskDaemon(ctx, binarySpec{Name: "guest", Path: vdisk}, dir, "", size); err != nil {
		return nil, err
	}
	g.disks = map[string]*guestDisk{
		targetGuestVhost: {name: targetGuestVhost, file: g.daemon.path, daemon: g.daemon},
		targetGuestFile:  {name: targetGuestFile, file: filepath.Join(g.daemon.mnt, "guest-file.img"), daemon: g.daemon},
	}
	if err := createFile(g.disks[targetGuestFile].file, size); err != nil {
		return nil, errors.Join(err, g.Close())
	}
	if err := runCommand(ctx, vdisk, "vhost-user", g.daemon.path, g.socket); err != nil {
		return nil, errors.Join(err, g.Close())
	}
	return g, nil
}

// describe says what the guest is, for the report.
func (g *guestSetup) describe() string {
	return fmt.Sprintf("TCG guest (kernel %s, %s, %d vCPUs) on a store mounted by %s: %s on its vhost-user socket, %s opened by QEMU (cache=none,aio=io_uring), %d queues each",
		g.kernel.Release, guestMemory, guestVCPUs, g.daemon.bin, targetGuestVhost, targetGuestFile, guestVCPUs)
}

// Close stops serving the socket, removes the second disk and unmounts.
func (g *guestSetup) Close() error {
	var errs []error
	if _, err := os.Stat(g.socket); err == nil {
		errs = append(errs, runCommand(context.Background(), g.daemon.bin, "vhost-user", "--stop", g.socket))
	}
	if d := g.disks[targetGuestFile]; d != nil {
		errs = append(errs, ignoreNotExist(os.Remove(d.file)))
	}
	errs = append(errs, g.daemon.Close())
	return errors.Join(errs...)
}

// checkGuestJobs refuses workloads the guest cannot prepare: it neither
// empties a disk (fresh) nor tracks what ran before (after).
func checkGuestJobs(jobs []fio.Job) error {
	for _, j := range jobs {
		if j.Fresh || j.After != "" {
			return fmt.Errorf("workload %s: the guest targets run only workloads on fully written disks (no \"compare: fresh\" or \"compare: after\")", j.Name)
		}
	}
	return nil
}

// guestStep is one fio run of the guest's /init: the fill of a disk
// (round 0), or a workload of a round.
type guestStep struct {
	job        fio.Job
	disk       target
	round, pos int
}

// guestPlan is what the guest runs: each disk filled once, then the rounds
// with the targets alternating as orderFor says, as on the host.
func guestPlan(jobs []fio.Job, disks []target, rounds int) []guestStep {
	var steps []guestStep
	for _, d := range disks {
		steps = append(steps, guestStep{job: fillJob, disk: d})
	}
	for round := 1; round <= rounds; round++ {
		for ji, job := range jobs {
			for pos, d := range orderFor(disks, round+ji) {
				steps = append(steps, guestStep{job: job, disk: d, round: round, pos: pos + 1})
			}
		}
	}
	return steps
}

// Console markers of the guest's /init; each ends with the step's index.
const (
	markInit      = "COMPARE-INIT"
	markBegin     = "COMPARE-BEGIN "
	markEnd       = "COMPARE-END "
	markJSONBegin = "COMPARE-JSON-BEGIN "
	markJSONEnd   = "COMPARE-JSON-END "
	markFail      = "COMPARE-FAIL"
	markDone      = "COMPARE-DONE"
	markDisk      = "COMPARE-DISK" // what the guest sees of a disk, logged
)

// guestInit is the guest's /init: load the virtio modules, name the disks
// /dev/guest-file (the one whose serial says so) and /dev/guest-vhost, then
// for every step run fio on its job file, print its JSON between markers,
// flush the disk (fsync of the block device: a FLUSH request) and wait
// settle; then power off.
func guestInit(steps []guestStep, modules, libDirs []string, settle time.Duration) string {
	var s strings.Builder
	fmt.Fprintf(&s, `#!/bin/sh
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin LD_LIBRARY_PATH=%s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
fail() { echo "%s: $*"; poweroff -f; sleep 30; }
echo "%s kernel $(uname -r)"
`, strings.Join(libDirs, ":"), markFail, markInit)
	for _, m := range modules {
		fmt.Fprintf(&s, "insmod /lib/modules/%[1]s || fail 'insmod %[1]s'\n", filepath.Base(m))
	}
	fmt.Fprintf(&s, `n=0
while [ $(ls /sys/block | grep -c '^vd') -lt 2 ]; do n=$((n+1)); [ $n -gt 300 ] && fail "not two virtio disks: $(ls /sys/block)"; sleep 0.1; done
for d in /sys/block/vd*; do
	if [ "$(cat $d/serial 2>/dev/null)" = %[1]s ]; then ln -s ${d##*/} /dev/%[1]s; else ln -s ${d##*/} /dev/%[2]s; fi
done
for t in %[1]s %[2]s; do
	[ -b /dev/$t ] || fail "no /dev/$t"
	d=/sys/block/$(readlink /dev/$t)
	q=$d/queue
	echo "%[4]s $t=$(readlink /dev/$t) sectors=$(cat $d/size) queues=$(ls $d/mq | wc -l) write_cache=$(cat $q/write_cache) max_sectors_kb=$(cat $q/max_sectors_kb) max_segments=$(cat $q/max_segments) max_segment_size=$(cat $q/max_segment_size)"
done
%[3]s --version || fail "%[3]s does not run"
`, targetGuestFile, targetGuestVhost, guestFioBin, markDisk)
	for i, st := range steps {
		fmt.Fprintf(&s, `echo "%[1]s%[2]d"
%[3]s --output-format=json --output=/tmp/out.json /jobs/%[2]d.fio >/tmp/fio.log 2>&1 || fail "step %[2]d: fio: $(tail -n 5 /tmp/fio.log)"
echo "%[4]s%[2]d"
echo "%[5]s%[2]d"; cat /tmp/out.json; echo; echo "%[6]s%[2]d"
sync /dev/%[7]s || fail "step %[2]d: flush"
sleep %[8]s
`, markBegin, i, guestFioBin, markEnd, markJSONBegin, markJSONEnd, st.disk.Name(), strconv.FormatFloat(settle.Seconds(), 'f', -1, 64))
	}
	fmt.Fprintf(&s, "echo %s\npoweroff -f\nsleep 30\n", markDone)
	return s.String()
}

// guestConsole follows the guest's console as its steps go: the counters
// at each step's begin and end markers (snap), then the step's fio JSON
// into a run. The first thing out of order is kept in err and ends the
// following.
type guestConsole struct {
	steps []guestStep
	snap  func(target) snapshot
	logf  func(string, ...any)

	cur    int // the step begun last, -1 before the first
	s0, s1 snapshot
	ended  bool     // cur's end marker was seen
	parsed bool     // cur's JSON was read into a run
	json   []string // cur's JSON lines, while between its JSON markers
	inJSON bool
	runs   []runResult // the rounds' runs (not the fills)
	done   bool        // every step ran and the guest said so
	err    error
}

func newGuestConsole(steps []guestStep, snap func(target) snapshot, logf func(string, ...any)) *guestConsole {
	return &guestConsole{steps: steps, snap: snap, logf: logf, cur: -1}
}

// marker reads "PREFIX<index>".
func marker(line, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(line, prefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(strings.TrimSpace(rest))
	return i, err == nil
}

// line takes one console line.
func (c *guestConsole) line(l string) {
	if c.err != nil {
		return
	}
	c.err = c.take(l)
}

func (c *guestConsole) take(l string) error {
	if c.inJSON {
		if i, ok := marker(l, markJSONEnd); ok {
			if i != c.cur {
				return fmt.Errorf("guest: JSON of step %d ends in step %d", i, c.cur)
			}
			c.inJSON = false
			return c.finish()
		}
		c.json = append(c.json, l)
		return nil
	}
	if i, ok := marker(l, markBegin); ok {
		if i != c.cur+1 || i >= len(c.steps) || (c.cur >= 0 && !c.parsed) {
			return fmt.Errorf("guest: step %d begins after step %d", i, c.cur)
		}
		c.cur, c.ended, c.parsed, c.json = i, false, false, nil
		c.s0 = c.snap(c.steps[i].disk)
		return nil
	}
	if i, ok := marker(l, markEnd); ok {
		if i != c.cur || c.ended {
			return fmt.Errorf("guest: step %d ends in step %d", i, c.cur)
		}
		c.s1, c.ended = c.snap(c.steps[i].disk), true
		return nil
	}
	if i, ok := marker(l, markJSONBegin); ok {
		if i != c.cur || !c.ended || c.parsed {
			return fmt.Errorf("guest: JSON of step %d in step %d", i, c.cur)
		}
		c.inJSON = true
		return nil
	}
	if strings.HasPrefix(l, markFail) {
		return fmt.Errorf("guest: %s", l)
	}
	if strings.HasPrefix(l, markDisk) {
		c.logf("  guest: %s", l)
	}
	if l == markDone {
		if c.cur != len(c.steps)-1 || !c.parsed {
			return fmt.Errorf("guest: done after step %d of %d", c.cur+1, len(c.steps))
		}
		c.done = true
	}
	return nil
}

// finish turns the current step's JSON into a run.
func (c *guestConsole) finish() error {
	st := c.steps[c.cur]
	c.parsed = true
	out, err := fio.Parse([]byte(strings.Join(c.json, "\n")))
	if err != nil {
		return fmt.Errorf("guest: step %d (%s on %s): %w", c.cur, st.job.Name, st.disk.Name(), err)
	}
	for _, j := range out.Jobs {
		if j.Error != 0 {
			return fmt.Errorf("guest: step %d (%s on %s): fio job %s failed with error %d", c.cur, st.job.Name, st.disk.Name(), j.Name, j.Error)
		}
	}
	r := result(st.job, st.disk, c.s0, c.s1, out.Summary(), c.s1.at.Sub(c.s0.at))
	if st.round == 0 {
		c.logf("  fill %-12s %6.0f MB/s (%.1fs)", st.disk.Name(), r.MBps, r.WallSec)
		return nil
	}
	r.Round, r.Position = st.round, st.pos
	c.runs = append(c.runs, r)
	c.logf("[%d/%d] round %d %-20s %-12s %8.0f MB/s %9.0f IOPS  p99 %7.0f µs",
		c.cur+1, len(c.steps), st.round, st.job.Name, st.disk.Name(), r.MBps, r.IOPS, float64(r.P99us))
	return nil
}

// runGuest boots one guest that runs every round on the guest targets
// and returns the runs in the order they ran.
func (b *bench) runGuest(ctx context.Context, g *guestSetup) ([]runResult, error) {
	steps := guestPlan(b.cfg.Jobs, b.targets, b.cfg.Rounds)
	files, err := tcgguest.Executable(g.fio, guestFioBin)
	if err != nil {
		return nil, fmt.Errorf("fio for the guest: %w", err)
	}
	libDirs := map[string]bool{}
	var dirs []string
	for _, f := range files[1:] {
		if d := "/" + path.Dir(f.Name); !libDirs[d] {
			libDirs[d] = true
			dirs = append(dirs, d)
		}
	}
	files = append(files, tcgguest.File{Name: "init", Mode: 0o755, Data: []byte(guestInit(steps, g.kernel.Modules, dirs, b.cfg.Settle))})
	for i, st := range steps {
		text := st.job.FileText(fio.Place{File: "/dev/" + st.disk.Name()}, b.runner.Var)
		files = append(files, tcgguest.File{Name: fmt.Sprintf("jobs/%d.fio", i), Mode: 0o644, Data: []byte(text)})
	}
	initramfs := filepath.Join(g.dir, "guest-initramfs.cpio")
	if err := (tcgguest.Initramfs{Busybox: g.busybox, Modules: g.kernel.Modules, Files: files}).Write(initramfs); err != nil {
		return nil, err
	}
	defer os.Remove(initramfs)

	m := tcgguest.Machine{Kernel: g.kernel, Initramfs: initramfs, Memory: guestMemory, SMP: guestVCPUs}
	var args []string
	args = append(args, tcgguest.SharedMemory(guestMemory)...)
	args = append(args, tcgguest.VhostUserDisk("vhost0", g.socket, guestVCPUs)...)
	args = append(args, tcgguest.FileDisk("file0", g.disks[targetGuestFile].file, "io_uring", guestVCPUs, targetGuestFile)...)
	args = append(m.Args(args...), "-accel", "tcg")

	c := newGuestConsole(steps, b.snapshot, b.logf)
	// A bound far above what the steps take, so that a guest that hangs
	// ends: every step gets a minute on top of its runtime, and the fills
	// of both disks the time to write them at slowestFill bytes a second.
	const slowestFill = 5e6
	perStep := b.cfg.Runtime + b.cfg.Ramp + b.cfg.Settle + time.Minute
	total := 5*time.Minute + time.Duration(len(steps))*perStep + time.Duration(2*b.cfg.Size/slowestFill)*time.Second
	b.logf("compare: booting the guest (TCG, %d steps, at most %v)", len(steps), total.Round(time.Minute))
	a, err := tcgguest.Run(ctx, g.qemu, args, tcgguest.RunOptions{
		InitMarker: markInit, InitTimeout: 3 * time.Minute, Total: total,
		OnLine: c.line, Logf: b.logf,
	})
	if err != nil {
		return nil, err
	}
	if ctx.Err() != nil {
		return c.runs, ctx.Err()
	}
	if c.err == nil && !c.done {
		c.err = fmt.Errorf("guest %s after %v, at step %d of %d", a.Outcome, a.Elapsed.Round(time.Second), c.cur+1, len(steps))
	}
	if c.err != nil {
		return c.runs, fmt.Errorf("%w\nconsole (last lines):\n%s\nqemu stderr: %s", c.err, lastLines(a.Console, 15), strings.TrimSpace(a.Stderr))
	}
	return c.runs, nil
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
