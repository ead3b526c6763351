package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vdiskfs/vdiskfs/tools/compare/loadgen"
	"github.com/vdiskfs/vdiskfs/vhostuser/frontend"
	"github.com/vdiskfs/vdiskfs/vhostuser/proto"
)

// Targets fio cannot reach, driven by package loadgen.
const (
	targetVhost     = "vhost"     // a vdiskfs disk on a vhost-user-blk socket
	targetQSDVhost  = "qsd-vhost" // qemu-storage-daemon's vhost-user-blk export of a raw file
	targetRawUring  = "raw-uring" // the raw file through io_uring: the generator's calibration against fio
	vhostMemory     = 128 << 20   // guest memory of the frontends: the buffers of 64 × 1 MiB and the rings
	vhostSocketName = "vhost.sock"
)

// genTarget is a target the load generator drives instead of fio. File
// is still a path the tool fills, resets and fsyncs outside the measured
// window (the disk's file, the exported raw file).
type genTarget interface {
	target
	engine() loadgen.Engine
}

// --- the raw file through io_uring ---

type rawUringTarget struct {
	rawTarget
	hugePages bool // buffers on hugetlb pages (--hugepages)
}

// newRawUring uses the raw target's file, so that its runs and fio's are
// on the very same file.
func newRawUring(path string, size int64, hugePages bool) (*rawUringTarget, error) {
	r, err := newRaw(path, size)
	if err != nil {
		return nil, err
	}
	return &rawUringTarget{*r, hugePages}, nil
}

func (t *rawUringTarget) Name() string { return targetRawUring }
func (t *rawUringTarget) engine() loadgen.Engine {
	return loadgen.File{Path: t.path, HugePages: t.hugePages}
}

// --- a vhost-user-blk device ---

// vhostDevice is the frontend side shared by the vhost targets: one
// connection, queue 0 driven by the generator (fio's jobs are one thread).
// Every vhost target of a run dials with the same guest memory (mem), so
// that the generator's buffers, allocated and freed run by run, are the
// same pages whichever target a run is on: how physically scattered a
// buffer is decides how many requests the backing device gets for it.
type vhostDevice struct {
	dev *frontend.Device
}

func dialVhost(socket string, size int64, mem *frontend.Memory) (*vhostDevice, error) {
	dev, err := frontend.Dial(frontend.Options{Socket: socket, Memory: mem, Queues: 1})
	if err != nil {
		return nil, err
	}
	if c := dev.Config(); int64(c.Capacity)*proto.SectorSize < size {
		dev.Close()
		return nil, fmt.Errorf("vhost-user device %s has %d bytes, --size is %d", socket, int64(c.Capacity)*proto.SectorSize, size)
	}
	return &vhostDevice{dev: dev}, nil
}

func (v *vhostDevice) engine() loadgen.Engine { return loadgen.Vhost{Dev: v.dev} }

func (v *vhostDevice) close() error {
	if v == nil || v.dev == nil {
		return nil
	}
	return v.dev.Close()
}

// --- qemu-storage-daemon's vhost-user-blk export ---

// qsdVhostTarget is the peer of the vhost door: a raw file exported by
// qemu-storage-daemon as vhost-user-blk (O_DIRECT, io_uring, one queue),
// driven by the generator. Its CPU is the daemon's.
type qsdVhostTarget struct {
	*vhostDevice
	raw    rawTarget
	socket string
	proc   *daemon
}

func newQSDVhost(ctx context.Context, dir string, size int64, mem *frontend.Memory) (*qsdVhostTarget, error) {
	bin, _, err := findQSD()
	if err != nil {
		return nil, err
	}
	raw, err := newRaw(filepath.Join(dir, "qsd-vhost.img"), size)
	if err != nil {
		return nil, err
	}
	t := &qsdVhostTarget{raw: *raw, socket: filepath.Join(dir, "qsd-"+vhostSocketName)}
	if t.proc, err = startDaemon(bin,
		"--blockdev", "driver=file,node-name=file0,filename="+raw.path+",cache.direct=on,aio=io_uring",
		"--export", "type=vhost-user-blk,id=exp0,node-name=file0,addr.type=unix,addr.path="+t.socket+",writable=on,num-queues=1"); err != nil {
		return nil, err
	}
	if err := waitSocket(ctx, t.socket, t.proc); err != nil {
		t.Close()
		return nil, err
	}
	if t.vhostDevice, err = dialVhost(t.socket, size, mem); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// waitSocket waits for a daemon's socket to appear.
func waitSocket(ctx context.Context, socket string, d *daemon) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := os.Stat(socket); err == nil {
			return nil
		}
		select {
		case <-d.done:
			return fmt.Errorf("the daemon exited: %s", strings.TrimSpace(d.output.String()))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no socket %s after 15s: %s", socket, strings.TrimSpace(d.output.String()))
		}
	}
}

func (t *qsdVhostTarget) Name() string                    { return targetQSDVhost }
func (t *qsdVhostTarget) File() string                    { return t.raw.path }
func (t *qsdVhostTarget) Reset(ctx context.Context) error { return t.raw.Reset(ctx) }

func (t *qsdVhostTarget) Sample() sample { return t.proc.sample() }

func (t *qsdVhostTarget) Close() error {
	err := t.vhostDevice.close()
	if t.proc != nil {
		t.proc.stop()
	}
	return errors.Join(err, ignoreNotExist(os.Remove(t.socket)))
}

func ignoreNotExist(err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// --- a vdiskfs disk on its vhost-user socket ---

// vhostTarget is a vdiskfs disk served on a vhost-user-blk socket. With
// --vhost-socket the disk is served already (its file given by
// --vhost-file, its daemon's CPU by --server-pid); otherwise the tool
// formats and mounts a store with the vdisk binary (--vdisk), as the
// --binary targets do, and serves the disk with `vdisk vhost-user`.
type vhostTarget struct {
	*vhostDevice
	name   string
	file   string
	size   int64
	pid    int
	daemon *vdiskDaemon // nil with --vhost-socket
	socket string
}

func newVhostExisting(socket, file string, size int64, pid int, mem *frontend.Memory) (*vhostTarget, error) {
	if file == "" {
		return nil, fmt.Errorf("--vhost-socket needs --vhost-file, the served disk's file (for the fill, reset and fsync between runs)")
	}
	st, err := os.Stat(file)
	if err != nil {
		return nil, fmt.Errorf("--vhost-file: %w", err)
	}
	if st.Size() < size {
		return nil, fmt.Errorf("--vhost-file %s has %d bytes, --size is %d", file, st.Size(), size)
	}
	t := &vhostTarget{name: targetVhost, file: file, size: size, pid: pid}
	if t.vhostDevice, err = dialVhost(socket, size, mem); err != nil {
		return nil, err
	}
	return t, nil
}

// newVhostDaemon serves a disk of a fresh store of spec's binary on a
// socket named after the target.
func newVhostDaemon(ctx context.Context, spec binarySpec, dir, rbdPool string, size int64, mem *frontend.Memory) (*vhostTarget, error) {
	if spec.Path == "" {
		return nil, fmt.Errorf("the vhost target needs a vdisk binary (--vdisk) or --vhost-socket")
	}
	d, err := newVdiskDaemon(ctx, spec, dir, rbdPool, size)
	if err != nil {
		return nil, err
	}
	t := &vhostTarget{name: spec.Name, file: d.path, size: size, daemon: d}
	socket := filepath.Join(dir, spec.Name+".sock")
	if err := runCommand(ctx, spec.Path, "vhost-user", d.path, socket); err != nil {
		return nil, errors.Join(err, t.Close()) // nothing served: Close unmounts
	}
	t.socket = socket // served: Close stops it
	if t.vhostDevice, err = dialVhost(t.socket, size, mem); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

func (t *vhostTarget) Name() string                    { return t.name }
func (t *vhostTarget) File() string                    { return t.file }
func (t *vhostTarget) Reset(ctx context.Context) error { return emptyFile(t.file, t.size) }

func (t *vhostTarget) Sample() sample {
	if t.daemon != nil {
		return t.daemon.Sample()
	}
	if t.pid > 0 {
		if cpu, err := procCPU(t.pid); err == nil {
			return sample{CPU: cpu, HasCPU: true}
		}
	}
	return sample{}
}

func (t *vhostTarget) Close() error {
	err := t.vhostDevice.close()
	if t.daemon == nil {
		return err
	}
	if t.socket != "" {
		err = errors.Join(err, runCommand(context.Background(), t.daemon.bin, "vhost-user", "--stop", t.socket))
	}
	return errors.Join(err, t.daemon.Close())
}
