package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	vfs "github.com/vdiskfs/vdiskfs/fs"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/tools/compare/fio"
	"github.com/vdiskfs/vdiskfs/tools/compare/passthrough"
)

// Target names.
const (
	targetVdiskfs     = "vdiskfs"
	targetPassthrough = "passthrough"
	targetRaw         = "raw"
	targetQSD         = "qsd-qcow2"
	targetEncrypted   = "vdiskfs-encrypted"
)

// diskName is the name of the file fio uses inside every mount.
const diskName = "compare.img"

// sample is what a target can tell about itself at one moment; every
// figure is cumulative, and nil (or HasCPU false) means "not known".
type sample struct {
	Req     *ioCount // read and write requests the file system received (FUSE READ/WRITE)
	Backend *ioCount // data I/O the server issued to its backing
	Meta    *ioCount // metadata I/O (vdiskfs: journal, checkpoints, superblocks)
	Commits *uint64  // vdiskfs journal commits
	Flushes *uint64  // cache flushes the server sent to its backing
	// Backend latency histograms (vdiskfs in process): data reads, writes.
	ReadLat, WriteLat *image.HistogramSnapshot
	CPU               time.Duration
	HasCPU            bool // CPU is the serving process's user+system time
}

// target is one thing fio runs on: a file, and what serves it.
type target interface {
	// Name is the target's name in the results.
	Name() string
	// File is the path fio opens ("" for an enginePlace).
	File() string
	// Reset makes the file empty and thin, with its size unchanged.
	Reset(ctx context.Context) error
	// Sample reads the target's counters.
	Sample() sample
	// Close unmounts and stops what serves the target. Files in the
	// scratch directory stay (the caller removes the directory).
	Close() error
}

// enginePlace is a target that fio reaches through an I/O engine of its
// own instead of a file (fio's rbd engine); its File is "".
type enginePlace interface {
	FioPlace() fio.Place
}

// fioPlace is where fio runs on t.
func fioPlace(t target) fio.Place {
	if e, ok := t.(enginePlace); ok {
		return e.FioPlace()
	}
	return fio.Place{File: t.File()}
}

// syncTarget makes what ran on t durable: it fsyncs t's file. A target
// without a file (librbd with its cache off) has nothing to sync.
func syncTarget(t target) error {
	if t.File() == "" {
		return nil
	}
	return syncFile(t.File())
}

// selfCPU is this process's user+system CPU time: the in-process FUSE
// servers (vdiskfs and the pass-through) run here, and while one of them
// is measured the other is idle.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// clockTick is USER_HZ, the unit of /proc/PID/stat times (100 on every
// Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// procCPU is the user+system CPU time of another process.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcStatCPU(string(b))
}

// parseProcStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/PID/stat line; the command name (field 2) may hold spaces, so
// fields are counted after its closing parenthesis.
func parseProcStatCPU(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields after the name", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("proc stat: %w", err)
	}
	return time.Duration(ut+st) * clockTick, nil
}

// emptyFile truncates path to 0 and back to size (every block freed, the
// file thin) and fsyncs it, so that the frees are committed before the
// next run: a vdiskfs store releases freed blocks only at a commit.
func emptyFile(path string, size int64) error {
	if err := os.Truncate(path, 0); err != nil {
		return err
	}
	if err := os.Truncate(path, size); err != nil {
		return err
	}
	return syncFile(path)
}

// syncFile fsyncs path.
func syncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	return errors.Join(err, f.Close())
}

// createFile makes path a file of size bytes (thin), through whatever file
// system holds it.
func createFile(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// --- vdiskfs served by this process ---

// vdiskfsLocal is a store opened and mounted in this process (fs.Mount),
// so its counters are read from image.Store directly.
type vdiskfsLocal struct {
	store     *image.Store
	srv       *vfs.Server
	mnt       string
	path      string
	size      int64
	storePath string
	ownStore  bool // the tool formatted the store, and removes it
}

// newVdiskfsLocal formats a store at storePath (unless one exists there),
// opens it, mounts it at mnt and creates the disk.
func newVdiskfsLocal(storePath, mnt string, size int64, ownStore bool, commitInterval time.Duration, engine backend.Engine, transport vfs.Transport, log logrus.FieldLogger) (*vdiskfsLocal, error) {
	if _, err := os.Stat(storePath); errors.Is(err, os.ErrNotExist) {
		// Thin: the data region only needs room for one disk, plus
		// blocks freed by a reset and waiting for their commit.
		if err := image.FormatPath(storePath, 2*size+256<<20, image.FormatOptions{}); err != nil {
			return nil, fmt.Errorf("format store %s: %w", storePath, err)
		}
	} else if err != nil {
		return nil, err
	}
	if err := vfs.PrepareTransport(transport); err != nil {
		return nil, fmt.Errorf("FUSE transport %s: %w", transport, err)
	}
	engine = vfs.StoreEngine(transport, engine)
	store, err := image.OpenPath(storePath, image.Options{Logger: log, Program: "vdiskfs compare", CommitInterval: commitInterval, IOEngine: engine})
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", storePath, err)
	}
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		store.Close()
		return nil, err
	}
	srv, err := vfs.Mount(store, mnt, vfs.Options{Logger: log, FsName: "vdiskfs-compare", Transport: transport})
	if err != nil {
		store.Close()
		return nil, err
	}
	t := &vdiskfsLocal{store: store, srv: srv, mnt: mnt, path: filepath.Join(mnt, diskName), size: size, storePath: storePath, ownStore: ownStore}
	if err := createFile(t.path, size); err != nil {
		t.ownStore = true // nothing to remove
		t.Close()
		return nil, fmt.Errorf("vdiskfs: create %s: %w", t.path, err)
	}
	return t, nil
}

func (t *vdiskfsLocal) Name() string { return targetVdiskfs }
func (t *vdiskfsLocal) File() string { return t.path }

func (t *vdiskfsLocal) Reset(ctx context.Context) error { return emptyFile(t.path, t.size) }

func (t *vdiskfsLocal) Sample() sample {
	m := t.store.Metrics()
	c := m.Counters
	rl, wl := m.Histograms["data_read_latency_seconds"], m.Histograms["data_write_latency_seconds"]
	return sample{
		ReadLat: &rl, WriteLat: &wl,
		Req:     &ioCount{Reads: c.ReadRequests, ReadBytes: c.ReadRequestBytes, Writes: c.WriteRequests, WriteBytes: c.WriteRequestBytes},
		Backend: &ioCount{Reads: c.DataReads, ReadBytes: c.DataReadBytes, Writes: c.DataWrites, WriteBytes: c.DataWriteBytes},
		Meta:    &ioCount{Reads: c.MetaReads, ReadBytes: c.MetaReadBytes, Writes: c.MetaWrites, WriteBytes: c.MetaWriteBytes},
		Commits: &c.Commits,
		Flushes: &c.Flushes,
		CPU:     selfCPU(),
		HasCPU:  true,
	}
}

// Close unmounts and closes the store. A store the tool did not make
// loses the test disk; one it made stays for the caller to remove with
// the rest of the scratch files (or to keep, with --keep).
func (t *vdiskfsLocal) Close() error {
	var errs []error
	if !t.ownStore {
		errs = append(errs, os.Remove(t.path))
	}
	errs = append(errs, t.srv.Unmount())
	errs = append(errs, t.store.Close())
	return errors.Join(errs...)
}

// --- vdiskfs mounted by someone else ---

// vdiskfsMount is a disk in an existing vdiskfs mount. Its counters come
// from `vdisk stats --json MNT` when that command works, and its CPU from
// the /proc entry of the daemon (--server-pid, else the pid vdisk stats
// reports).
type vdiskfsMount struct {
	mnt, path string
	size      int64
	vdisk     string // vdisk binary; "" = no stats
	pid       int

	mu     sync.Mutex
	warned bool
}

func newVdiskfsMount(mnt string, size int64, vdisk string, pid int) (*vdiskfsMount, error) {
	st, err := os.Stat(mnt)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("--mount %s: not a directory", mnt)
	}
	t := &vdiskfsMount{mnt: mnt, path: filepath.Join(mnt, fmt.Sprintf("compare-%d.img", os.Getpid())), size: size, vdisk: vdisk, pid: pid}
	if err := createFile(t.path, size); err != nil {
		return nil, fmt.Errorf("vdiskfs mount %s: create %s: %w", mnt, t.path, err)
	}
	return t, nil
}

func (t *vdiskfsMount) Name() string                    { return targetVdiskfs }
func (t *vdiskfsMount) File() string                    { return t.path }
func (t *vdiskfsMount) Reset(ctx context.Context) error { return emptyFile(t.path, t.size) }
func (t *vdiskfsMount) Close() error                    { return os.Remove(t.path) }

// vdiskCounters are the counters of `vdisk stats --json` the tool reads:
// image.CounterSnapshot, with commits and flushes nil when the binary
// measured does not print them.
type vdiskCounters struct {
	image.CounterSnapshot
	Commits *uint64 `json:"commits"`
	Flushes *uint64 `json:"flushes"`
}

// vdiskStats is the part of `vdisk stats --json` the tool reads: the
// counters (under "store_metrics", or at the top level) and the daemon's
// pid.
type vdiskStats struct {
	PID          int            `json:"pid"`
	Counters     *vdiskCounters `json:"counters"`
	StoreMetrics *struct {
		Counters *vdiskCounters `json:"counters"`
	} `json:"store_metrics"`
}

// parseVdiskStats reads `vdisk stats --json` output into a sample and
// the daemon's pid (0 if not given).
func parseVdiskStats(b []byte) (sample, int, error) {
	var vs vdiskStats
	if err := json.Unmarshal(b, &vs); err != nil {
		return sample{}, 0, err
	}
	c := vs.Counters
	if vs.StoreMetrics != nil && vs.StoreMetrics.Counters != nil {
		c = vs.StoreMetrics.Counters
	}
	if c == nil {
		return sample{}, 0, fmt.Errorf("no \"counters\" object")
	}
	return sample{
		Req:     &ioCount{Reads: c.ReadRequests, ReadBytes: c.ReadRequestBytes, Writes: c.WriteRequests, WriteBytes: c.WriteRequestBytes},
		Backend: &ioCount{Reads: c.DataReads, ReadBytes: c.DataReadBytes, Writes: c.DataWrites, WriteBytes: c.DataWriteBytes},
		Meta:    &ioCount{Reads: c.MetaReads, ReadBytes: c.MetaReadBytes, Writes: c.MetaWrites, WriteBytes: c.MetaWriteBytes},
		Commits: c.Commits,
		Flushes: c.Flushes,
	}, vs.PID, nil
}

func (t *vdiskfsMount) Sample() sample {
	var s sample
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.vdisk != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, t.vdisk, "stats", "--json", t.mnt).Output()
		cancel()
		var pid int
		if err == nil {
			s, pid, err = parseVdiskStats(out)
		}
		if err == nil && t.pid == 0 && pid > 0 {
			t.pid = pid // the daemon says who it is: take its CPU too
		}
		if err != nil {
			if !t.warned {
				fmt.Fprintf(os.Stderr, "compare: `%s stats --json %s` gave no counters (%v): vdiskfs request and backend columns are n/a\n", t.vdisk, t.mnt, err)
				t.warned = true
			}
			t.vdisk = ""
			s = sample{}
		}
	}
	if t.pid > 0 {
		if cpu, err := procCPU(t.pid); err == nil {
			s.CPU, s.HasCPU = cpu, true
		}
	}
	return s
}

// --- the go-fuse pass-through of a plain file ---

type passthroughTarget struct {
	srv     *passthrough.Server
	backing string
	mnt     string
	size    int64
}

func newPassthrough(backing, mnt string, size int64) (*passthroughTarget, error) {
	if err := createFile(backing, size); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, err
	}
	srv, err := passthrough.Mount(backing, mnt, passthrough.Options{Name: diskName})
	if err != nil {
		return nil, err
	}
	return &passthroughTarget{srv: srv, backing: backing, mnt: mnt, size: size}, nil
}

func (t *passthroughTarget) Name() string { return targetPassthrough }
func (t *passthroughTarget) File() string { return t.srv.Path() }

// Reset goes through the mount, like the vdiskfs reset: the backing file
// is truncated to 0 and back, which frees its ext4 blocks.
func (t *passthroughTarget) Reset(ctx context.Context) error {
	return emptyFile(t.srv.Path(), t.size)
}

func (t *passthroughTarget) Sample() sample {
	c := t.srv.Counters()
	req := &ioCount{Reads: c.Reads, ReadBytes: c.ReadBytes, Writes: c.Writes, WriteBytes: c.WriteBytes}
	// One pread or pwrite on the backing file per request, by construction.
	be := *req
	return sample{Req: req, Backend: &be, CPU: selfCPU(), HasCPU: true}
}

func (t *passthroughTarget) Close() error { return t.srv.Unmount() }

// --- the plain file itself, no FUSE ---

type rawTarget struct {
	path string
	size int64
}

func newRaw(path string, size int64) (*rawTarget, error) {
	if err := createFile(path, size); err != nil {
		return nil, err
	}
	return &rawTarget{path: path, size: size}, nil
}

func (t *rawTarget) Name() string                    { return targetRaw }
func (t *rawTarget) File() string                    { return t.path }
func (t *rawTarget) Reset(ctx context.Context) error { return emptyFile(t.path, t.size) }
func (t *rawTarget) Sample() sample                  { return sample{} }
func (t *rawTarget) Close() error                    { return nil }

// discard is a logger that drops everything.
func quietLogger(w io.Writer) *logrus.Logger {
	l := logrus.New()
	l.SetOutput(w)
	l.SetLevel(logrus.WarnLevel)
	return l
}
