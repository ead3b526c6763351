package main

// Waiting for a mount daemon that is closing.
//
// A plain umount(8) returns as soon as the kernel has dropped the mount; the
// daemon then still commits, checkpoints and closes the store, which takes a
// moment, and holds the store's lock until it has. A command run right after
// the umount (vdisk mount, fsck, ls, ...) would be refused the lock. So when
// the lock is refused and its holder is a "vdisk mount" daemon on this host
// that is alive but no longer has the store mounted, the command waits for it
// (closeWait at most, saying so on stderr) and tries again. A holder that is
// still mounted, or any other holder, is refused at once as before.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/moby/sys/mountinfo"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

// closeWait bounds how long a command waits for a mount daemon whose mount
// is gone to close the store. Closing commits the unsynced writes (bounded
// by the commit interval) and writes a checkpoint: seconds at most.
const closeWait = 30 * time.Second

// mountProgram is the owner record's program name of a mount daemon.
const mountProgram = "vdisk mount"

// openPath is image.OpenPath that waits, up to e.closeWait, while the store is
// held by a mount daemon on this host whose mount is already gone.
func (e *env) openPath(path string, opts image.Options) (*image.Store, error) {
	var deadline time.Time
	for {
		s, err := image.OpenPath(path, opts)
		if err == nil || !errors.Is(err, backend.ErrLocked) {
			return s, err
		}
		h, closing := closingHolder(path)
		if !closing && !lettingGo(path) {
			return nil, err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(e.closeWait)
			if closing {
				e.sayWaiting(path, h)
			}
		} else if time.Now().After(deadline) {
			if !closing {
				return nil, fmt.Errorf("%w; its owner record says it was closed, but its lock is still held after %s", err, e.closeWait)
			}
			return nil, fmt.Errorf("%w; its daemon (pid %d) was unmounted but has not closed the store after %s", err, h.PID, e.closeWait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitClosed returns once the store at path is not held by a closing mount
// daemon (see openPath), or with an error after e.closeWait. It does not open
// the store: vdisk mount calls it before it starts its daemon, so that the
// wait is reported on the terminal rather than in the daemon's log.
func (e *env) waitClosed(path string) error {
	h, ok := closingHolder(path)
	if !ok {
		return nil
	}
	e.sayWaiting(path, h)
	deadline := time.Now().Add(e.closeWait)
	for ok {
		if time.Now().After(deadline) {
			return fmt.Errorf("store %s is still held by %s, pid %d, after %s: its mount is gone but it has not closed the store",
				path, h.Program, h.PID, e.closeWait)
		}
		time.Sleep(50 * time.Millisecond)
		h, ok = closingHolder(path)
	}
	return nil
}

func (e *env) sayWaiting(path string, h image.Holder) {
	fmt.Fprintf(e.stderr, "vdisk: %s is still held by %s, pid %d, which was unmounted and is closing the store; waiting for it (up to %s)\n",
		path, h.Program, h.PID, e.closeWait)
}

// lettingGo reports whether the store at path, whose lock was just refused,
// is about to be let go of: its owner record says it was closed, or its
// holder has exited. A closing store writes its closed record, then closes
// its descriptor, which releases the lock; between the two the lock is
// still held for a moment.
func lettingGo(path string) bool {
	if strings.HasPrefix(path, "rbd:") {
		return false // fenced by the image's lock, held by any host: nothing local to wait for
	}
	h, ok := image.ReadHolder(path)
	if !ok {
		return true
	}
	host, _ := os.Hostname()
	return h.Host == host && h.PID > 0 && exited(h.PID)
}

// closingHolder reports the holder of the store at path when it is a mount
// daemon on this host that is still running but has no mount of the store
// any more: it is committing and closing, and will let go of the lock.
func closingHolder(path string) (image.Holder, bool) {
	h, ok := image.ReadHolder(path)
	if !ok || h.Program != mountProgram || h.PID <= 0 {
		return h, false
	}
	if host, _ := os.Hostname(); h.Host != host {
		return h, false
	}
	if !isVdiskProcess(h.PID) {
		return h, false // gone (image.OpenPath waits for that), or the pid was reused
	}
	mounted, err := storeMounted(h.PID, path)
	return h, err == nil && !mounted
}

// isVdiskProcess reports whether pid is a live (not zombie) process running
// a vdisk executable.
func isVdiskProcess(pid int) bool {
	if exited(pid) {
		return false
	}
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return false
	}
	exe = strings.TrimSuffix(exe, " (deleted)") // rebuilt or upgraded under a running daemon
	return strings.HasPrefix(filepath.Base(exe), "vdisk")
}

// exited reports whether pid is gone or a zombie (its descriptors, and so
// the store's lock, are released either way; its parent may reap it late).
func exited(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// mountEntry is what vdisk uses of a mount: where, which type, and its
// source (a vdiskfs daemon's store).
type mountEntry struct {
	mountpoint, fstype, source string
}

// readMountinfo reads the mount table of process pid's mount namespace
// (pid 0: this process's), with github.com/moby/sys/mountinfo, which also
// undoes the kernel's octal escapes.
func readMountinfo(pid int) ([]mountEntry, error) {
	path := "/proc/self/mountinfo"
	if pid > 0 {
		path = "/proc/" + strconv.Itoa(pid) + "/mountinfo"
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mount table: %w", err)
	}
	defer f.Close()
	infos, err := mountinfo.GetMountsFromReader(f, nil)
	if err != nil {
		return nil, fmt.Errorf("mount table %s: %w", path, err)
	}
	out := make([]mountEntry, len(infos))
	for i, m := range infos {
		out[i] = mountEntry{mountpoint: m.Mountpoint, fstype: m.FSType, source: m.Source}
	}
	return out, nil
}

// isVdiskMount reports whether a mount entry is a vdiskfs FUSE mount.
func isVdiskMount(m mountEntry) bool {
	return m.fstype == "fuse.vdiskfs" || m.fstype == "fuseblk.vdiskfs"
}

// storeMounted reports whether the mount namespace of process pid has a
// vdiskfs mount whose source is the store at path.
func storeMounted(pid int, path string) (bool, error) {
	_, ok, err := storeMountpoint(pid, path)
	return ok, err
}

// storeMountpoint returns where the mount namespace of process pid has a
// vdiskfs mount whose source is the store at path. A mount daemon names its
// store as the mount's source (fs.Options.FsName).
func storeMountpoint(pid int, path string) (string, bool, error) {
	ms, err := readMountinfo(pid)
	if err != nil {
		return "", false, err
	}
	for _, m := range ms {
		if isVdiskMount(m) && backend.SameStore(m.source, path) {
			return m.mountpoint, true, nil
		}
	}
	return "", false, nil
}

// mountedAt returns the mount point of the store at path when it is held
// by a mount daemon on this host that has it mounted: for errors that tell
// the user to go through the mount instead.
func mountedAt(path string) (string, bool) {
	h, ok := image.ReadHolder(path)
	if !ok || h.Program != mountProgram || h.PID <= 0 {
		return "", false
	}
	if host, _ := os.Hostname(); h.Host != host || !isVdiskProcess(h.PID) {
		return "", false
	}
	mnt, ok, err := storeMountpoint(h.PID, path)
	return mnt, ok && err == nil
}

// findMount returns the mount at mountpoint (absolute) in this process's
// namespace: the last one, which hides any below it.
func findMount(mountpoint string) (mountEntry, bool, error) {
	ms, err := readMountinfo(0)
	if err != nil {
		return mountEntry{}, false, err
	}
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].mountpoint == mountpoint {
			return ms[i], true, nil
		}
	}
	return mountEntry{}, false, nil
}
