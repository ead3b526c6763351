package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/telemetry"
)

// defaultUmountTimeout bounds how long vdisk umount waits for the daemon to
// close the store and exit after the unmount.
const defaultUmountTimeout = 60 * time.Second

func newUmountCmd(e *env) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "umount MOUNTPOINT",
		Short: "Unmount a store and wait until its daemon has closed it",
		Long: `Unmount the vdiskfs mount at MOUNTPOINT and return only once its daemon has
committed every write, closed the store and exited, so that the store can be
mounted, checked or copied at once. A plain umount(8) returns earlier, while
the daemon is still closing (vdisk commands run after it wait for that).

It fails (exit 8), saying why, when MOUNTPOINT is not a vdiskfs mount, when
the mount is busy (a file on it is open: nothing is unmounted then), when the
daemon has not exited --timeout after the unmount, or when it exited without
closing the store cleanly (the next open replays the journal; run vdisk fsck).`,
		Args: exactArgs("MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runUmount(e, args[0], timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", defaultUmountTimeout, "how long to wait for the daemon to close the store after the unmount")
	return cmd
}

// runUmount unmounts mnt and waits for its daemon, found through the mount's
// stats socket or else the store's owner record, to close the store and exit.
func runUmount(e *env, mnt string, timeout time.Duration) error {
	abs, err := canonicalMountpoint(mnt)
	if err != nil {
		return err
	}
	m, err := vdiskMountAt(abs)
	if err != nil {
		return err
	}
	store, pid := daemonOf(abs, m)
	if err := unmount(abs); err != nil {
		if pid == 0 && errors.Is(err, unix.EBUSY) {
			// Nothing serves the mount any more: its files fail with
			// ENOTCONN, and waiting for their users to close them helps
			// no one; detaching lets the store be mounted again.
			return fmt.Errorf("%w; no daemon serves it any more (was it killed?), so umount -l %s detaches it and its open files fail from now on", err, abs)
		}
		return err
	}
	if pid == 0 {
		return fmt.Errorf("unmounted %s, but found no daemon serving it (was it killed?): the store %s was not closed cleanly; its next open replays the journal", abs, store)
	}
	if err := waitDaemonClosed(pid, store, timeout); err != nil {
		return fmt.Errorf("unmounted %s, but %w", abs, err)
	}
	fmt.Fprintf(e.stdout, "unmounted %s; store %s closed (daemon pid %d exited)\n", abs, store, pid)
	return nil
}

// vdiskMountAt returns the vdiskfs mount at mnt (canonical, see
// canonicalMountpoint), or an error saying what is there instead.
func vdiskMountAt(mnt string) (mountEntry, error) {
	m, ok, err := findMount(mnt)
	switch {
	case err != nil:
		return mountEntry{}, fmt.Errorf("list mounts: %w", err)
	case !ok:
		return mountEntry{}, fmt.Errorf("%s is not mounted", mnt)
	case !isVdiskMount(m):
		return mountEntry{}, fmt.Errorf("%s is a %s mount, not a vdiskfs one", mnt, m.fstype)
	}
	return m, nil
}

// canonicalMountpoint is mnt as /proc/self/mountinfo spells it: absolute,
// with symbolic links resolved in its parent (not in mnt itself, whose stat
// may fail or hang on a dead mount).
func canonicalMountpoint(mnt string) (string, error) {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return "", err
	}
	if abs == "/" {
		return abs, nil
	}
	dir, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return "", fmt.Errorf("mount point %s: %w", mnt, err)
	}
	return filepath.Join(dir, filepath.Base(abs)), nil
}

// daemonOf finds the store and the daemon's pid of the vdiskfs mount m at
// mnt: from the mount's stats socket, or else from the owner record of the
// store the mount names as its source. pid is 0 when no daemon answers for
// the mount.
func daemonOf(mnt string, m mountEntry) (store string, pid int) {
	store = m.source
	if st, err := telemetry.Fetch(mnt); err == nil && st.PID > 0 {
		if st.Store != "" {
			store = st.Store
		}
		return store, st.PID
	}
	h, ok := image.ReadHolder(store)
	host, _ := os.Hostname()
	if ok && h.Program == mountProgram && h.Host == host && isVdiskProcess(h.PID) {
		return store, h.PID
	}
	return store, 0
}

// unmount unmounts mnt, never lazily: a busy mount stays mounted and is an
// error. Without the privilege for umount(2) it uses fusermount3 -u (or
// fusermount -u), as the mount did.
func unmount(mnt string) error {
	err := unix.Unmount(mnt, 0)
	if errors.Is(err, unix.EPERM) {
		err = fusermountU(mnt)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%s is busy (%w): a file on it is open (fuser -vm %s names the processes); nothing was unmounted", mnt, unix.EBUSY, mnt)
	default:
		return fmt.Errorf("unmount %s: %w", mnt, err)
	}
}

// fusermountU runs fusermount3 -u (or fusermount -u) on mnt.
func fusermountU(mnt string) error {
	for _, prog := range []string{"fusermount3", "fusermount"} {
		path, err := exec.LookPath(prog)
		if err != nil {
			continue
		}
		out, err := exec.Command(path, "-u", mnt).CombinedOutput()
		if err != nil {
			if bytes.Contains(out, []byte("busy")) {
				return unix.EBUSY
			}
			return fmt.Errorf("%s -u: %v: %s", prog, err, out)
		}
		return nil
	}
	return fmt.Errorf("umount(2) refused (%w) and no fusermount3 or fusermount found", unix.EPERM)
}

// waitDaemonClosed waits for daemon pid to exit, for at most timeout, and
// then checks the owner record of store: a clean close clears it.
func waitDaemonClosed(pid int, store string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	// A daemon in this very process (tests mount in process) cannot be
	// waited for to exit: its clearing the owner record is what counts.
	self := pid == os.Getpid()
	for {
		// Whether it exited first, the owner record after: read the other
		// way round, a daemon that closed and exited between the two reads
		// would look as if it had exited without closing.
		gone := !self && exited(pid)
		h, open := image.ReadHolder(store)
		stillOwner := open && h.PID == pid
		if self && !stillOwner || gone {
			if stillOwner {
				return fmt.Errorf("its daemon (pid %d) exited without closing the store %s cleanly (see its log); the next open replays the journal, and vdisk fsck %s checks it", pid, store, store)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its daemon (pid %d) has not closed the store %s and exited %s after the unmount; it may still be committing (see its log)", pid, store, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
