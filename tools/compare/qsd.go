package main

import (
	"bufio"
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

// qsdHint says where qemu-storage-daemon and qemu-img come from.
const qsdHint = "the qsd-qcow2 target needs qemu-storage-daemon (Debian: apt-get install qemu-system-common) " +
	"and qemu-img (Debian: apt-get install qemu-utils)"

// qsdTarget is what users would pick instead of vdiskfs: a qcow2 image
// exported as a file through qemu-storage-daemon's FUSE export, with the
// image opened O_DIRECT (cache.direct=on, aio=native) like vdiskfs's
// backend. Its CPU is the daemon's; it reports no request or backend
// counters (the device columns still apply).
type qsdTarget struct {
	bin, img string
	qcow2    string // the image file
	mnt      string // the export's mount point: a regular file
	size     int64
	proc     *daemon // nil while stopped
}

// daemon is a child process serving a target: its output kept for error
// messages, ended with SIGTERM (SIGKILL after 20s), and with the tool.
type daemon struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed once it exited
	output *strings.Builder
}

func startDaemon(bin string, args ...string) (*daemon, error) {
	d := &daemon{cmd: exec.Command(bin, args...), done: make(chan struct{}), output: &strings.Builder{}}
	d.cmd.Stdout, d.cmd.Stderr = d.output, d.output
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Base(bin), err)
	}
	go func() { _ = d.cmd.Wait(); close(d.done) }()
	return d, nil
}

// stop ends the daemon and waits for it.
func (d *daemon) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(20 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.done
	}
}

// sample is the daemon's CPU time.
func (d *daemon) sample() sample {
	cpu, err := procCPU(d.cmd.Process.Pid)
	if err != nil {
		return sample{}
	}
	return sample{CPU: cpu, HasCPU: true}
}

func findQSD() (qsd, qemuImg string, err error) {
	qsd, err1 := exec.LookPath("qemu-storage-daemon")
	qemuImg, err2 := exec.LookPath("qemu-img")
	if err1 != nil || err2 != nil {
		return "", "", errors.New(qsdHint)
	}
	return qsd, qemuImg, nil
}

func newQSD(ctx context.Context, dir string, size int64) (*qsdTarget, error) {
	bin, img, err := findQSD()
	if err != nil {
		return nil, err
	}
	t := &qsdTarget{bin: bin, img: img, qcow2: filepath.Join(dir, "qsd.qcow2"), mnt: filepath.Join(dir, "qsd-export.img"), size: size}
	if err := t.start(ctx); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

func (t *qsdTarget) Name() string { return targetQSD }
func (t *qsdTarget) File() string { return t.mnt }

// start creates a fresh (empty) qcow2 image and exports it.
func (t *qsdTarget) start(ctx context.Context) error {
	_ = os.Remove(t.qcow2)
	if err := runCommand(ctx, t.img, "create", "-q", "-f", "qcow2", t.qcow2, fmt.Sprint(t.size)); err != nil {
		return err
	}
	f, err := os.OpenFile(t.mnt, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	f.Close()
	if t.proc, err = startDaemon(t.bin,
		"--blockdev", "driver=file,node-name=file0,filename="+t.qcow2+",cache.direct=on,aio=native",
		"--blockdev", "driver=qcow2,node-name=qcow0,file=file0,discard=unmap",
		"--export", "type=fuse,id=exp0,node-name=qcow0,mountpoint="+t.mnt+",writable=on"); err != nil {
		return err
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if mounted(t.mnt) {
			return nil
		}
		select {
		case <-t.proc.done:
			return fmt.Errorf("qemu-storage-daemon exited: %s", strings.TrimSpace(t.proc.output.String()))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("qemu-storage-daemon: export %s not mounted after 15s: %s", t.mnt, strings.TrimSpace(t.proc.output.String()))
		}
	}
}

// stop ends the daemon (it unmounts its export on SIGTERM).
func (t *qsdTarget) stop() error {
	if t.proc == nil {
		return nil
	}
	t.proc.stop()
	t.proc = nil
	if mounted(t.mnt) {
		return syscall.Unmount(t.mnt, syscall.MNT_DETACH)
	}
	return nil
}

// Reset starts over with a new empty image: the FUSE export cannot
// truncate, and a fresh qcow2 is what "thin" means for it.
func (t *qsdTarget) Reset(ctx context.Context) error {
	if err := t.stop(); err != nil {
		return err
	}
	return t.start(ctx)
}

func (t *qsdTarget) Sample() sample {
	if t.proc == nil {
		return sample{}
	}
	return t.proc.sample()
}

func (t *qsdTarget) Close() error { return t.stop() }

// mounted reports whether path is a mount point (in /proc/self/mountinfo).
func mounted(path string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountPath(fields[4]) == path {
			return true
		}
	}
	return false
}

// unescapeMountPath undoes the octal escapes of mountinfo (\040 for space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
