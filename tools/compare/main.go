package main

import (
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	vfs "github.com/vdiskfs/vdiskfs/fs"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tools/compare/fio"
	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
)

//go:embed default.fio
var defaultJobs string

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1
	exitUsage   = 2
	exitMissing = 3
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The in-process servers (vdiskfs and the pass-through alike) run with
	// the runtime settings of the vdisk mount daemon.
	vfs.TuneRuntime()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the parsed flags.
type options struct {
	scratch, store, mount, vdisk string
	serverPID                    int
	targets, baseline            string
	baselineSet                  bool // --baseline was given (with --from-json: take the ratios anew)
	rounds                       int
	runtime, ramp, settle        time.Duration
	size                         int64
	jobs, workloads              string
	printJobs                    bool
	jsonOut, mdOut, chartOut     string
	fromJSON                     string
	fioBin, device               string
	keep, quiet                  bool
	hugePages                    bool
	cpuProfile                   string
	commitInterval               time.Duration
	ioEngine                     backend.Engine
	fuseTransport                vfs.Transport
	binaries                     []binarySpec
	vhostSocket, vhostFile       string
	rbdPool                      string
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.scratch, "scratch", "", "scratch directory on the backing under test (default: a new directory in /var/tmp)")
	fs.StringVar(&o.store, "store", "", "vdiskfs store to use (formatted if it does not exist; default: a new one in the scratch directory)")
	fs.StringVar(&o.mount, "mount", "", "use this existing vdiskfs mount instead of mounting a store")
	fs.StringVar(&o.vdisk, "vdisk", "vdisk", "vdisk binary, for the counters of a --mount (runs: vdisk stats --json MNT)")
	fs.IntVar(&o.serverPID, "server-pid", 0, "pid of the vdiskfs daemon behind --mount, for its CPU time")
	fs.StringVar(&o.targets, "targets", "vdiskfs,passthrough", "comma-separated targets: vdiskfs, vdiskfs-encrypted (an encrypted disk on vdiskfs's mount), passthrough, raw, qsd-qcow2 (or qsd), vhost, qsd-vhost, raw-uring; librbd (fio's rbd engine, with --rbd-pool); \"all\" for every one but librbd; or, alone, guest-vhost and guest-file (fio inside one TCG guest, see the package doc)")
	fs.StringVar(&o.vhostSocket, "vhost-socket", "", "the vhost target: a vdiskfs disk already served on this vhost-user socket (default: the tool mounts a store with --vdisk and serves a disk with vdisk vhost-user)")
	fs.StringVar(&o.vhostFile, "vhost-file", "", "with --vhost-socket: the served disk's file in its mount")
	fs.StringVar(&o.baseline, "baseline", targetPassthrough, "target the ratios are taken against")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds; each runs every workload on every target, the target order alternating")
	fs.DurationVar(&o.runtime, "runtime", 15*time.Second, "measured time of each run (fio runtime)")
	fs.DurationVar(&o.ramp, "ramp", 2*time.Second, "unmeasured start of each run (fio ramp_time)")
	fs.DurationVar(&o.settle, "settle", time.Second, "pause after each run's fsync, before the next run")
	size := fs.String("size", "2G", "size of the disk and of each file (K, M, G, T: powers of 1024)")
	fs.StringVar(&o.jobs, "jobs", "", "fio job file (default: the built-in one, see --print-jobs)")
	fs.StringVar(&o.workloads, "workloads", "", "comma-separated workload names to run (default: all of the job file)")
	fs.BoolVar(&o.printJobs, "print-jobs", false, "print the built-in job file and exit")
	fs.StringVar(&o.jsonOut, "json", "", "write the full report (every run) as JSON to this file (- for stdout)")
	fs.StringVar(&o.mdOut, "markdown", "", "write the table as markdown to this file (- for stdout)")
	fs.StringVar(&o.chartOut, "chart", "", "draw a chart to this .png or .svg file")
	fs.StringVar(&o.fromJSON, "from-json", "", "render a report written by --json instead of measuring (with --baseline: its ratios against that target)")
	fs.StringVar(&o.fioBin, "fio", "fio", "fio binary")
	fs.StringVar(&o.device, "device", "", "block device for the device columns (default: the one holding the scratch directory)")
	fs.BoolVar(&o.keep, "keep", false, "keep the scratch files")
	fs.BoolVar(&o.hugePages, "hugepages", false, "put the I/O buffers on 2 MiB hugetlb pages, as a VM with huge-page memory has them: the vhost targets' guest memory, raw-uring's and fio's (iomem=shmhuge); the kernel's pool must have them free (sysctl vm.nr_hugepages)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress lines on stderr")
	fs.DurationVar(&o.commitInterval, "commit-interval", 0, "commit timer of the in-process vdiskfs store (0: the store's default, negative: off), for experiments")
	fuseTransport := fs.String("fuse-transport", "auto", "how the in-process vdiskfs mount gets its FUSE requests: auto, io_uring or dev (fs.Options.Transport)")
	ioEngine := fs.String("io-engine", "auto", "how the in-process vdiskfs store issues its data reads: auto, io_uring or pread (image.Options.IOEngine)")
	addBinary := func(flag string) func(string) error {
		return func(v string) error {
			b, err := parseBinary(flag, v)
			if err != nil {
				return err
			}
			for _, have := range o.binaries {
				if have.Name == b.Name {
					return fmt.Errorf("target %s given twice (--binary, --vhost-binary)", b.Name)
				}
			}
			o.binaries = append(o.binaries, b)
			return nil
		}
	}
	fs.Func("binary", "NAME=PATH: a target NAME, a fresh store formatted and mounted by the vdisk binary PATH as a user runs it (repeat it to compare binaries, e.g. --binary old=/tmp/vdisk-old --binary new=bin/vdisk --targets old,new --baseline old)", addBinary("--binary"))
	fs.Func("vhost-binary", "NAME=PATH: a target NAME like vhost, a disk of a fresh store served on a vhost-user-blk socket by the vdisk binary PATH (repeat it to compare binaries on the vhost door, e.g. --vhost-binary old=/tmp/vdisk-old --targets raw,vhost,old --baseline raw)", addBinary("--vhost-binary"))
	fs.StringVar(&o.rbdPool, "rbd-pool", "", "Ceph RBD: the librbd target (fio's rbd engine) and the stores of the --binary, --vhost-binary and vhost targets are images in this pool, on the cluster CEPH_CONF names (e.g. --rbd-pool rbd --binary new=bin/vdisk --targets librbd,new --baseline librbd, with a vdisk built with make build TAGS=rbd)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the in-process FUSE servers) to this file")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: compare [flags]\n\nRuns the same fio workloads on a vdiskfs disk and on a go-fuse pass-through of a plain file\n(same FUSE settings, same backing), round after round, and reports medians and ratios.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) { o.baselineSet = o.baselineSet || f.Name == "baseline" })
	var err error
	if o.size, err = parseSize(*size); err != nil {
		return nil, fmt.Errorf("--size: %w", err)
	}
	if o.size < 16<<20 || o.size%(1<<20) != 0 {
		return nil, fmt.Errorf("--size: %d: use a multiple of 1 MiB, at least 16 MiB", o.size)
	}
	if o.rounds < 1 {
		return nil, fmt.Errorf("--rounds: at least 1")
	}
	if o.runtime < time.Second || o.runtime%time.Second != 0 || o.ramp < 0 || o.ramp%time.Second != 0 {
		return nil, fmt.Errorf("--runtime and --ramp: whole seconds (runtime at least 1s)")
	}
	if o.store != "" && o.mount != "" {
		return nil, fmt.Errorf("--store and --mount exclude each other")
	}
	if o.ioEngine, err = backend.ParseEngine(*ioEngine); err != nil {
		return nil, fmt.Errorf("--io-engine: %w", err)
	}
	if o.fuseTransport, err = vfs.ParseTransport(*fuseTransport); err != nil {
		return nil, fmt.Errorf("--fuse-transport: %w", err)
	}
	return o, nil
}

// parseSize reads 2G, 512M, 1073741824.
func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(strings.TrimSuffix(strings.TrimSuffix(s, "iB"), "B"))
	mult := int64(1)
	if n := len(s); n > 0 {
		if i := strings.IndexByte("KMGT", s[n-1]&^0x20); i >= 0 {
			mult = int64(1) << (10 * (i + 1))
			s = s[:n-1]
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > math.MaxInt64/mult {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return v * mult, nil
}

// allTargets is the order targets appear in, whatever order --targets
// names them in.
var allTargets = []string{targetVdiskfs, targetEncrypted, targetPassthrough, targetRaw, targetQSD, targetVhost, targetQSDVhost, targetRawUring}

// parseTargets reads --targets: built-in names, and the names of --binary
// targets, which come after the built-in ones.
func parseTargets(s string, binaries []binarySpec) ([]string, error) {
	known := slices.Clone(allTargets)
	for _, b := range binaries {
		known = append(known, b.Name)
	}
	if s == "all" {
		return known, nil
	}
	known = append(known, targetLibRBD) // with --rbd-pool only: not in "all"
	known = append(known, guestTargets...)
	want := map[string]bool{}
	for _, t := range strings.Split(s, ",") {
		t = strings.TrimSpace(t)
		if t == "qsd" {
			t = targetQSD
		}
		if !slices.Contains(known, t) {
			return nil, fmt.Errorf("--targets: unknown target %q (have %s)", t, strings.Join(known, ", "))
		}
		want[t] = true
	}
	var out []string
	guests := 0
	for _, t := range known {
		if want[t] {
			out = append(out, t)
		}
		if want[t] && slices.Contains(guestTargets, t) {
			guests++
		}
	}
	if guests > 0 && guests < len(out) {
		return nil, fmt.Errorf("--targets: the guest targets (%s) run in one guest of their own: give no other target with them", strings.Join(guestTargets, ", "))
	}
	return out, nil
}

// isGuest reports whether targets are the guest targets (parseTargets
// gives either only those or none).
func isGuest(targets []string) bool {
	return len(targets) > 0 && slices.Contains(guestTargets, targets[0])
}

// loadJobs reads the job file (or the built-in one) and keeps the
// workloads asked for.
func loadJobs(o *options) ([]fio.Job, error) {
	var (
		jobs []fio.Job
		err  error
	)
	if o.jobs == "" {
		jobs, err = fio.ParseJobs(strings.NewReader(defaultJobs))
	} else {
		jobs, err = fio.ParseJobFile(o.jobs)
	}
	if err != nil {
		return nil, err
	}
	if o.workloads == "" {
		return jobs, nil
	}
	var out []fio.Job
	for _, name := range strings.Split(o.workloads, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(jobs, func(j fio.Job) bool { return j.Name == name })
		if i < 0 {
			var have []string
			for _, j := range jobs {
				have = append(have, j.Name)
			}
			return nil, fmt.Errorf("--workloads: no workload %q (have %s)", name, strings.Join(have, ", "))
		}
		out = append(out, jobs[i])
	}
	return out, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "compare: %v\n", err)
		return exitUsage
	}
	if o.printJobs {
		io.WriteString(stdout, defaultJobs)
		return exitOK
	}
	if o.fromJSON != "" {
		rep, err := readReportFile(o.fromJSON)
		if err == nil && o.baselineSet {
			err = rep.rebase(o.baseline)
		}
		if err != nil {
			fmt.Fprintf(stderr, "compare: %v\n", err)
			return exitFailed
		}
		if err := writeOutputs(rep, o, stdout); err != nil {
			fmt.Fprintf(stderr, "compare: %v\n", err)
			return exitFailed
		}
		return exitOK
	}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "compare: %v\n", err)
			return exitFailed
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "compare: %v\n", err)
			return exitFailed
		}
		defer pprof.StopCPUProfile()
	}
	rep, err := measure(ctx, o, stderr)
	if rep != nil && len(rep.Runs) > 0 {
		if werr := writeOutputs(rep, o, stdout); werr != nil {
			fmt.Fprintf(stderr, "compare: %v\n", werr)
			if err == nil {
				return exitFailed
			}
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "compare: %v\n", err)
		if errors.Is(err, fio.ErrNotInstalled) || errors.Is(err, errMissing) {
			return exitMissing
		}
		return exitFailed
	}
	return exitOK
}

// errMissing marks a missing prerequisite other than fio.
var errMissing = errors.New("missing prerequisite")

// measure sets the targets up, runs the rounds and tears everything down.
// The report holds every run made, also when it returns an error.
func measure(ctx context.Context, o *options, stderr io.Writer) (rep *report, err error) {
	targetNames, err := parseTargets(o.targets, o.binaries)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(targetNames, o.baseline) {
		return nil, fmt.Errorf("--baseline %s is not among --targets %s", o.baseline, strings.Join(targetNames, ","))
	}
	jobs, err := loadJobs(o)
	if err != nil {
		return nil, err
	}
	fioBin, err := fio.Find(o.fioBin)
	if err != nil {
		return nil, err
	}
	guest := isGuest(targetNames)
	if guest {
		if err := checkGuestJobs(jobs); err != nil {
			return nil, err
		}
		if o.hugePages {
			return nil, errors.New("--hugepages is for the host's targets: a guest's fio buffers are on the guest's own pages")
		}
	}
	if err := checkRBD(o.rbdPool, targetNames); err != nil {
		return nil, err
	}
	if slices.Contains(targetNames, targetQSD) || slices.Contains(targetNames, targetQSDVhost) {
		if _, _, err := findQSD(); err != nil {
			return nil, fmt.Errorf("%w: %v", errMissing, err)
		}
	}

	// The scratch directory.
	scratch := o.scratch
	ownScratch := false
	if scratch == "" {
		if scratch, err = os.MkdirTemp("/var/tmp", "vdiskfs-compare-"); err != nil {
			return nil, err
		}
		ownScratch = true
	} else if err := os.MkdirAll(scratch, 0o755); err != nil {
		return nil, err
	}
	if scratch, err = filepath.Abs(scratch); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp(scratch, "run-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if o.keep {
			fmt.Fprintf(stderr, "compare: scratch files kept in %s\n", work)
			return
		}
		_ = os.RemoveAll(work)
		if ownScratch {
			_ = os.Remove(scratch)
		}
	}()
	if t := fsTypeOf(work); t == "tmpfs" || t == "fuse" || t == "overlayfs" {
		fmt.Fprintf(stderr, "compare: warning: the scratch directory is on %s: the numbers will not say much about a disk backing\n", t)
	}
	if err := checkSpace(work, o.size, targetNames, o.store == "" && o.mount == "", o.rbdPool != ""); err != nil {
		return nil, err
	}

	var dev *blockDevice
	if d, derr := deviceOf(work, o.device, "/proc/diskstats"); derr == nil {
		dev = d
	} else {
		fmt.Fprintf(stderr, "compare: no device columns: %v\n", derr)
	}

	log := io.Writer(stderr)
	if o.quiet {
		log = nil
	}
	logger := quietLogger(stderr)

	// The vhost targets' guest memory (vhostDevice says why one), closed
	// after them.
	pages, iomem := frontend.SmallPages, ""
	if o.hugePages {
		pages, iomem = frontend.HugePages, "shmhuge"
	}
	guestMem, err := frontend.NewMemory(vhostMemory, pages)
	if err != nil {
		return nil, err
	}
	defer guestMem.Close()
	// The targets, in allTargets order.
	var targets []target
	defer func() {
		for i := len(targets) - 1; i >= 0; i-- {
			if cerr := targets[i].Close(); cerr != nil {
				fmt.Fprintf(stderr, "compare: closing %s: %v\n", targets[i].Name(), cerr)
			}
		}
	}()
	vdiskfsSrc, ioEngineUsed, transportUsed := "", "", ""
	var local *vdiskfsLocal  // the in-process vdiskfs mount, once made
	var guestSet *guestSetup // the guest targets' store and guest, once made
	defer func() {
		if guestSet != nil {
			if cerr := guestSet.Close(); cerr != nil {
				fmt.Fprintf(stderr, "compare: closing the guest targets' store: %v\n", cerr)
			}
		}
	}()
	for _, name := range targetNames {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var (
			t   target
			err error
		)
		switch name {
		case targetVdiskfs:
			if o.mount != "" {
				vdisk := ""
				if p, lerr := lookPath(o.vdisk); lerr == nil {
					vdisk = p
				} else {
					fmt.Fprintf(stderr, "compare: %s not found: vdiskfs request and backend columns are n/a\n", o.vdisk)
				}
				vdiskfsSrc = "mount " + o.mount
				t, err = newVdiskfsMount(o.mount, o.size, vdisk, o.serverPID)
			} else {
				storePath, own := o.store, false
				if storePath == "" {
					storePath, own = filepath.Join(work, "vdiskfs.store"), true
				}
				vdiskfsSrc = "in-process fs.Mount of " + storePath
				var vt *vdiskfsLocal
				vt, err = newVdiskfsLocal(storePath, filepath.Join(work, "mnt-vdiskfs"), o.size, own, o.commitInterval, o.ioEngine, o.fuseTransport, logger)
				if err == nil {
					used, _ := vt.store.IOEngine()
					ioEngineUsed = string(used)
					transportUsed = vt.srv.Transport()
					t, local = vt, vt
				}
			}
		case targetEncrypted:
			// On vdiskfs's own mount when it is a target (it comes first),
			// so that the two disks differ in encryption alone.
			t, err = newVdiskfsEncrypted(local, func() (*vdiskfsLocal, error) {
				vdiskfsSrc = "in-process fs.Mount of " + filepath.Join(work, "vdiskfs.store")
				return newVdiskfsLocal(filepath.Join(work, "vdiskfs.store"), filepath.Join(work, "mnt-vdiskfs"), o.size, true, o.commitInterval, o.ioEngine, o.fuseTransport, logger)
			}, o.size)
		case targetPassthrough:
			t, err = newPassthrough(filepath.Join(work, "passthrough.img"), filepath.Join(work, "mnt-passthrough"), o.size)
		case targetRaw:
			t, err = newRaw(filepath.Join(work, "raw.img"), o.size)
		case targetQSD:
			t, err = newQSD(ctx, work, o.size)
		case targetQSDVhost:
			t, err = newQSDVhost(ctx, work, o.size, guestMem)
		case targetLibRBD:
			t, err = newLibRBD(ctx, o.rbdPool, o.size)
		case targetRawUring:
			t, err = newRawUring(filepath.Join(work, "raw.img"), o.size, o.hugePages)
		case targetGuestVhost, targetGuestFile:
			if guestSet == nil {
				vdisk, lerr := lookPath(o.vdisk)
				if lerr != nil {
					err = fmt.Errorf("%w: %s: %v", errMissing, o.vdisk, lerr)
					break
				}
				logf := func(format string, args ...any) { fmt.Fprintf(stderr, "compare: "+format+"\n", args...) }
				if guestSet, err = newGuestSetup(ctx, vdisk, fioBin, work, o.size, logf); err != nil {
					break
				}
				vdiskfsSrc = guestSet.describe()
			}
			t = guestSet.disks[name]
		case targetVhost:
			if o.vhostSocket != "" {
				t, err = newVhostExisting(o.vhostSocket, o.vhostFile, o.size, o.serverPID, guestMem)
			} else {
				vdisk, lerr := lookPath(o.vdisk)
				if lerr != nil {
					err = fmt.Errorf("%w: %s: %v", errMissing, o.vdisk, lerr)
					break
				}
				t, err = newVhostDaemon(ctx, binarySpec{Name: targetVhost, Path: vdisk, Vhost: true}, work, o.rbdPool, o.size, guestMem)
			}
		default:
			i := slices.IndexFunc(o.binaries, func(b binarySpec) bool { return b.Name == name })
			if o.binaries[i].Vhost {
				t, err = newVhostDaemon(ctx, o.binaries[i], work, o.rbdPool, o.size, guestMem)
			} else {
				t, err = newVdiskDaemon(ctx, o.binaries[i], work, o.rbdPool, o.size)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("setting up %s: %w%s", name, err, mountHint(err))
		}
		targets = append(targets, t)
	}

	vars := map[string]string{
		"COMPARE_RUNTIME": strconv.Itoa(int(o.runtime / time.Second)),
		"COMPARE_RAMP":    strconv.Itoa(int(o.ramp / time.Second)),
	}
	b := &bench{
		cfg: benchConfig{
			Rounds: o.rounds, Runtime: o.runtime, Ramp: o.ramp, Settle: o.settle,
			Size: o.size, Jobs: jobs, Baseline: o.baseline,
		},
		targets: targets,
		runner:  &fio.Runner{Bin: fioBin, Dir: work, Var: vars, IOMem: iomem},
		device:  dev,
		log:     log,
	}
	rep = &report{
		Tool:     "vdiskfs compare",
		Command:  commandLine(),
		Started:  time.Now().UTC().Truncate(time.Second),
		Machine:  newMachineInfo(fio.Version(fioBin), work),
		Targets:  targetNames,
		Baseline: o.baseline,
		Config: configInfo{
			Rounds: o.rounds, RuntimeSec: o.runtime.Seconds(), RampSec: o.ramp.Seconds(), SettleSec: o.settle.Seconds(),
			SizeBytes: o.size, Scratch: scratch, Jobs: jobsName(o.jobs), VdiskfsSrc: vdiskfsSrc,
		},
	}
	if o.commitInterval != 0 {
		rep.Config.CommitInterval = o.commitInterval.String()
	}
	rep.Config.IOEngine = ioEngineUsed
	rep.Config.FUSETransport = transportUsed
	rep.Config.HugePages = o.hugePages
	rep.Config.RBDPool = o.rbdPool

	if dev != nil {
		rep.Config.Device = fmt.Sprintf("%s (%d:%d)", dev.Name, dev.Major, dev.Minor)
	}
	for _, j := range jobs {
		rep.Workloads = append(rep.Workloads, workloadInfo{Name: j.Name, Note: j.Note, Fresh: j.Fresh})
	}
	if log != nil {
		fmt.Fprintf(log, "compare: %d workload(s) × %d target(s) × %d round(s), %s + %s ramp each, in %s\n",
			len(jobs), len(targets), o.rounds, o.runtime, o.ramp, work)
	}
	var runs []runResult
	if guest {
		runs, err = b.runGuest(ctx, guestSet)
	} else {
		runs, err = b.run(ctx)
	}
	rep.Runs = runs
	rep.Finished = time.Now().UTC().Truncate(time.Second)
	rep.Machine.LoadAfter = loadAvg()
	rep.Results = aggregate(runs, rep.workloadNames(), targetNames, o.baseline)
	return rep, err
}

func lookPath(bin string) (string, error) {
	if strings.Contains(bin, "/") {
		if _, err := os.Stat(bin); err != nil {
			return "", err
		}
		return bin, nil
	}
	return execLookPath(bin)
}

// mountHint adds advice to a mount failure.
func mountHint(err error) string {
	if errors.Is(err, os.ErrPermission) || errors.Is(err, syscall.EPERM) || os.Geteuid() != 0 {
		return " (FUSE mounts need root or fusermount3, and /dev/fuse)"
	}
	if _, serr := os.Stat("/dev/fuse"); serr != nil {
		return " (/dev/fuse is missing: modprobe fuse)"
	}
	return ""
}

func jobsName(path string) string {
	if path == "" {
		return "built-in (--print-jobs)"
	}
	return path
}

// commandLine is how the tool was started, quoted for a shell.
func commandLine() string {
	parts := []string{"compare"}
	for _, a := range os.Args[1:] {
		if strings.ContainsAny(a, " \t'\"$\\") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// checkSpace makes sure the scratch file system can hold every file fully
// written, with a margin.
func checkSpace(dir string, size int64, targets []string, ownStore, onRBD bool) error {
	need := int64(0)
	for _, t := range targets {
		switch t {
		case targetVdiskfs:
			if ownStore {
				need += size + size/16 + 128<<20
			}
		case targetQSD:
			need += size + size/16
		case targetPassthrough, targetRaw, targetQSDVhost:
			need += size
		case targetGuestVhost: // the guest's store, with the other disk's share
			need += size + size/16 + 128<<20
		case targetGuestFile, targetRawUring, targetLibRBD: // a second disk of the guest's store; the raw target's file; an RBD image
		default: // a --binary target: a store of its own, unless it is on RBD
			if !onRBD {
				need += size + size/16 + 128<<20
			}
		}
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	avail := int64(st.Bavail) * st.Bsize
	if avail < need+need/10 {
		return fmt.Errorf("%s has %s free, the targets need about %s: use a smaller --size or another --scratch",
			dir, fmtSize(avail&^(1<<20-1)), fmtSize((need+need/10)&^(1<<20-1)))
	}
	return nil
}

// writeOutputs writes the table and whatever formats were asked for.
func writeOutputs(rep *report, o *options, stdout io.Writer) error {
	toStdout := o.jsonOut == "-" || o.mdOut == "-"
	if !toStdout {
		if err := rep.writeTable(stdout); err != nil {
			return err
		}
	}
	write := func(path string, fn func(io.Writer) error) error {
		if path == "" {
			return nil
		}
		if path == "-" {
			return fn(stdout)
		}
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		err = fn(f)
		return errors.Join(err, f.Close())
	}
	if err := write(o.jsonOut, rep.writeJSON); err != nil {
		return fmt.Errorf("--json: %w", err)
	}
	if err := write(o.mdOut, rep.writeMarkdown); err != nil {
		return fmt.Errorf("--markdown: %w", err)
	}
	if o.chartOut != "" {
		if err := rep.writeChart(o.chartOut); err != nil {
			return fmt.Errorf("--chart: %w", err)
		}
	}
	return nil
}

var execLookPath = exec.LookPath
