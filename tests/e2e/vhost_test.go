package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// vhostOps is vmOps and write-zeroes (whole store blocks and pieces of
// them, over written data and over a hole).
var vhostOps = append(append([]guestOp{}, vmOps...),
	guestOp{what: "2 MiB at 500 MiB, bs=256k, O_DIRECT", off: 500 << 20, n: 2 << 20, pat: 0, bs: "256k", direct: true},
	guestOp{what: "write-zeroes 1 MiB at 500 MiB+512 KiB", zero: true, off: 500<<20 + 512<<10, n: 1 << 20},
	guestOp{what: "write-zeroes 8.5 KiB at 1 MiB-3.5 KiB (512-aligned, over written data)", zero: true, off: 1<<20 - 3584, n: 8704},
	guestOp{what: "write-zeroes 64 KiB at 60 MiB (a hole)", zero: true, off: 60 << 20, n: 64 << 10},
)

// vhostQueues is the number of queues every vhost-user guest is given; it
// runs with as many vCPUs so that the guest's virtio-blk uses them all.
const vhostQueues = 2

// TestVMVhostUserReference proves the vhost-user guest harness against a
// reference backend, qemu-storage-daemon's vhost-user-blk export of a raw
// file: the same guest script as the vdiskfs tests (large, small and
// 512-byte writes, discards, write-zeroes, flushes, reads) must pass, and
// the file must then hold exactly the bytes it wrote.
func TestVMVhostUserReference(t *testing.T) {
	requireRoot(t)
	start := time.Now()
	needTools(t, "qemu-storage-daemon:qemu-system-common")
	g := newGuest(t, vhostOps)
	dir := t.TempDir()
	raw := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(raw, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(raw, vmDiskSize); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "qsd.sock")
	startQSD(t, raw, sock)
	g.tcgGuest(t, vhostQueues, vhostUserDisk(sock, vhostQueues), nil)
	// ext4 counts its extent tree blocks in st_blocks too: a few blocks
	// more than the data are allowed.
	const ext4Meta = 64 << 10
	verifyVMDisk(t, raw, g.allOps, g.pattern,
		expectedAllocated(g.allOps, vmDiskSize, 4096, true), expectedAllocated(g.allOps, vmDiskSize, 4096, false)+ext4Meta, "after the guest on qemu-storage-daemon")
	t.Logf("TestVMVhostUserReference: %v in all", time.Since(start).Round(time.Millisecond))
}

// startQSD serves raw as a vhost-user-blk device on sock with
// qemu-storage-daemon (O_DIRECT, discards punched) and returns once the
// socket accepts; cleanup stops it.
func startQSD(t *testing.T, raw, sock string) {
	t.Helper()
	cmd := exec.Command("qemu-storage-daemon",
		"--blockdev", "driver=file,node-name=file0,filename="+raw+",cache.direct=on,aio=io_uring,discard=unmap",
		"--export", fmt.Sprintf("type=vhost-user-blk,id=exp0,node-name=file0,addr.type=unix,addr.path=%s,writable=on,num-queues=%d", sock, vhostQueues),
	)
	logf, err := os.Create(filepath.Join(t.TempDir(), "qsd.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("qemu-storage-daemon: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("qemu-storage-daemon log:\n%s", b)
		}
	})
	waitSocket(t, sock, exited)
}

// waitSocket waits until sock exists (a server listening on it: the
// vhost-user servers here take one frontend at a time, so it is not
// connected to) or exited says the server is gone.
func waitSocket(t *testing.T, sock string, exited <-chan error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if fi, err := os.Stat(sock); err == nil && fi.Mode().Type() == os.ModeSocket {
			return
		}
		select {
		case err := <-exited:
			t.Fatalf("the server of %s exited: %v", sock, err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no socket %s after a minute", sock)
		}
	}
}
