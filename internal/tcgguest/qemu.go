package tcgguest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Machine is a guest's QEMU command line, without its disks and
// accelerator.
type Machine struct {
	Kernel    *Kernel
	Initramfs string
	Memory    string // -m, e.g. "256M"; a vhost-user disk's memfd has the same size
	SMP       int    // vCPUs
}

// Args is the command line of the machine with its serial console on
// stdout, powering off instead of rebooting, and then disk's arguments.
func (m Machine) Args(disk ...string) []string {
	args := []string{
		"-nodefaults", "-no-user-config", "-display", "none", "-serial", "stdio",
		"-no-reboot", "-m", m.Memory, "-smp", strconv.Itoa(m.SMP),
		"-kernel", m.Kernel.Vmlinuz, "-initrd", m.Initramfs,
		"-append", "console=ttyS0 panic=-1 loglevel=4 rdinit=/init",
	}
	return append(args, disk...)
}

// SharedMemory is the arguments that back the guest's memory (of size
// memory, Machine.Memory) with a shared memfd, which a vhost-user backend
// maps.
func SharedMemory(memory string) []string {
	return []string{
		"-object", "memory-backend-memfd,id=mem,size=" + memory + ",share=on",
		"-machine", "memory-backend=mem",
	}
}

// VhostUserDisk is the arguments of a vhost-user-blk device on sock with
// queues queues, its chardev called id and reconnecting every second when
// the backend goes away. The guest's memory must be shared
// (SharedMemory).
func VhostUserDisk(id, sock string, queues int) []string {
	return []string{
		"-chardev", "socket,id=" + id + ",path=" + sock + ",reconnect=1",
		"-device", "vhost-user-blk-pci,chardev=" + id + ",num-queues=" + strconv.Itoa(queues),
	}
}

// FileDisk is the arguments of a virtio-blk device on a raw file opened
// by QEMU itself (cache=none: O_DIRECT; aio: io_uring, native or
// threads), with queues queues and serial as its serial number
// (/sys/block/vdX/serial in the guest).
func FileDisk(id, file, aio string, queues int, serial string) []string {
	return []string{
		"-drive", "file=" + file + ",format=raw,if=none,id=" + id + ",cache=none,aio=" + aio,
		"-device", "virtio-blk-pci,drive=" + id + ",num-queues=" + strconv.Itoa(queues) + ",serial=" + serial,
	}
}

// RunOptions say how to watch a guest.
type RunOptions struct {
	// InitMarker starts the console line /init prints first; without it
	// within InitTimeout, the guest is given up ("no-progress").
	InitMarker  string
	InitTimeout time.Duration
	// Total bounds the whole run ("timeout").
	Total time.Duration
	// A console line holding PassMarker or FailMarker says how the guest
	// ended ("pass", "guest-fail").
	PassMarker, FailMarker string
	// OnLine, if set, is called with every console line as it comes, in
	// order, on Run's goroutine (so it may end that goroutine, as a
	// failing test does: QEMU is then killed). The guest goes on
	// meanwhile: lines are queued while OnLine acts on the host.
	OnLine func(line string)
	// Logf reports when /init was reached; nil for silence.
	Logf func(format string, args ...any)
}

// Attempt is how one run of QEMU went.
type Attempt struct {
	Console string // the guest's serial output
	Stderr  string
	Elapsed time.Duration
	// Outcome: pass, guest-fail (the markers), refused (QEMU printed
	// nothing and failed), no-progress, timeout, exited (otherwise).
	Outcome string
}

// Run boots QEMU with args and waits for it as o says; a cancelled ctx
// kills QEMU (the outcome is then "exited"). It returns an error only
// when QEMU could not be started.
func Run(ctx context.Context, qemu string, args []string, o RunOptions) (*Attempt, error) {
	a := &Attempt{}
	cmd := exec.CommandContext(ctx, qemu, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", qemu, err)
	}
	var mu sync.Mutex // guards console
	var console strings.Builder
	initSeen := make(chan struct{})
	readDone := make(chan struct{})
	lines := make(chan string, 1<<14) // far more than a guest prints between two reads
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		seen := false
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			mu.Lock()
			console.WriteString(line + "\n")
			mu.Unlock()
			if !seen && strings.HasPrefix(line, o.InitMarker) {
				seen = true
				close(initSeen)
			}
			if o.OnLine != nil {
				lines <- line
			}
		}
	}()
	exited := make(chan error, 1)
	go func() {
		<-readDone
		exited <- cmd.Wait()
	}()
	finished := false
	defer func() {
		if !finished { // OnLine ended this goroutine
			cmd.Process.Kill()
			<-exited
		}
	}()
	initTimer := time.NewTimer(o.InitTimeout)
	totalTimer := time.NewTimer(o.Total)
	defer initTimer.Stop()
	defer totalTimer.Stop()
	var waitErr error
wait:
	for {
		select {
		case <-initSeen:
			initSeen = nil
			initTimer.Stop()
			if o.Logf != nil {
				o.Logf("  guest init reached after %v", time.Since(start).Round(time.Millisecond))
			}
		case <-initTimer.C:
			a.Outcome = "no-progress"
			cmd.Process.Kill()
			waitErr = <-exited
			break wait
		case <-totalTimer.C:
			a.Outcome = "timeout"
			cmd.Process.Kill()
			waitErr = <-exited
			break wait
		case line := <-lines:
			o.OnLine(line)
		case waitErr = <-exited:
			for len(lines) > 0 { // all were queued before exited
				o.OnLine(<-lines)
			}
			break wait
		}
	}
	finished = true
	a.Elapsed = time.Since(start)
	mu.Lock()
	a.Console = console.String()
	mu.Unlock()
	a.Stderr = stderr.String()
	if a.Outcome == "" {
		switch {
		case o.PassMarker != "" && strings.Contains(a.Console, o.PassMarker):
			a.Outcome = "pass"
		case o.FailMarker != "" && strings.Contains(a.Console, o.FailMarker):
			a.Outcome = "guest-fail"
		case strings.TrimSpace(a.Console) == "" && waitErr != nil:
			a.Outcome = "refused"
		default:
			a.Outcome = "exited"
		}
	}
	return a, nil
}
