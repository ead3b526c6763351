package image

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/vdiskfs/vdiskfs/image/backend"
	"golang.org/x/sys/unix"
)

// lockWait bounds how long OpenPath waits for the lock of a store whose
// owner on this host has died. The kernel drops a killed process's flock
// when the last reference to its open file goes, and reads the process had
// in flight in its io_uring hold a reference until they complete, after the
// process is gone: a remount right after kill -9 can find the lock held for
// a moment by nobody.
const lockWait = 5 * time.Second

// openBackend is backend.Open, retried while the lock is held by a dead
// owner on this host, for at most lockWait.
func openBackend(path string, o backend.OpenOptions) (backend.Backend, error) {
	deadline := time.Now().Add(lockWait)
	for {
		be, err := backend.Open(path, o)
		if err == nil || !errors.Is(err, backend.ErrLocked) || time.Now().After(deadline) {
			return be, err
		}
		sb := readOwner(path)
		host, _ := os.Hostname()
		if sb == nil || sb.Host != host || sb.OwnerPID <= 0 || !processGone(int(sb.OwnerPID)) {
			return be, err // a live owner, or one we cannot tell
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processGone reports whether process pid has exited: it does not exist,
// or it is a zombie its parent has not reaped yet (a killed daemon's
// parent may be slow to, and a zombie holds no files).
func processGone(pid int) bool {
	if unix.Kill(pid, 0) == unix.ESRCH {
		return true
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// The state follows the command name, which is in parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X')
}

// readOwner reads the superblock of a store without taking the lock, or
// nil when it is not open by anyone or cannot be read.
func readOwner(path string) *superblock {
	be, err := backend.Open(path, backend.OpenOptions{ReadOnly: true, NoLock: true, Engine: backend.EnginePread})
	if err != nil {
		return nil
	}
	defer be.Close()
	sb, _, err := readSuperblocks(be)
	if err != nil || sb.State != stateOpen {
		return nil
	}
	return sb
}

// Holder is the owner record of a store that is open read-write: who opened
// it. It is read without the lock, so it may be stale: an owner that was
// killed leaves its record behind until the next open.
type Holder struct {
	Program string // "vdisk mount", "vdisk fsck", ...; "" when unknown
	PID     int
	Host    string
	Opened  time.Time
}

// ReadHolder reads the owner record of the store at path without taking its
// lock (for a caller that was refused the lock and wants to know whether the
// holder is about to let go). ok is false when the record says the store is
// closed, or the superblock cannot be read.
func ReadHolder(path string) (h Holder, ok bool) {
	sb := readOwner(path)
	if sb == nil {
		return Holder{}, false
	}
	return Holder{Program: sb.Program, PID: int(sb.OwnerPID), Host: sb.Host, Opened: time.Unix(0, sb.OpenedNano)}, true
}

// describeOwner reads the owner record of a locked store without taking the
// lock, to name the holder in the error.
func describeOwner(path string) string {
	sb := readOwner(path)
	if sb == nil {
		return ""
	}
	return fmt.Sprintf(" (held by %s, pid %d on host %q since %s)", orUnknown(sb.Program), sb.OwnerPID, sb.Host,
		time.Unix(0, sb.OpenedNano).Format(time.RFC3339))
}

func orUnknown(s string) string {
	if s == "" {
		return "an unknown program"
	}
	return s
}
