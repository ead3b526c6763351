package main

import "fmt"

// Exit codes of vdisk. These are the only codes the program returns; scripts
// may rely on them. The fsck codes follow e2fsck(8) and can be tested as bits.
const (
	// exitOK: success; for fsck, the store is clean.
	exitOK = 0
	// exitRepaired: fsck --repair found problems and repaired all of them.
	// The store is consistent now; a repair may have dropped data it could
	// not trust (each action is listed).
	exitRepaired = 1
	// exitLeaks: fsck found only leaked blocks (space used by nothing and
	// not free) and was not asked to repair. No data is at risk; fsck
	// --repair reclaims the space.
	exitLeaks = 2
	// exitUncorrected: fsck found fatal problems and they are still there
	// (no --repair, or the repair failed). Do not mount the store before
	// fsck --repair succeeds.
	exitUncorrected = 4
	// exitFailure: an operational error: the store cannot be opened (missing,
	// not a store, locked by another process), an I/O error, or bad
	// arguments or flags; for umount, the mount is busy (and stays mounted)
	// or its daemon did not close the store cleanly in time; for fsck
	// --repair, the store is mounted (a repair needs it unmounted).
	exitFailure = 8
	// exitWrongKey: the key given does not open the encrypted disk (no key
	// slot of it opens with that key file or passphrase).
	exitWrongKey = 16
	// exitLocked: the disk is encrypted and its key has not been given to
	// the mount (vdisk unlock): its data cannot be read or written.
	exitLocked = 32
)

// exitMeaning says what an exit code means, for fsck's output.
func exitMeaning(code int) string {
	switch code {
	case exitOK:
		return "clean"
	case exitRepaired:
		return "findings were repaired; the store is clean now"
	case exitLeaks:
		return "only leaked blocks: no data is at risk; run vdisk fsck --repair to reclaim the space"
	case exitUncorrected:
		return "errors left uncorrected: do not mount the store; run vdisk fsck --repair"
	case exitFailure:
		return "operational error"
	case exitWrongKey:
		return "wrong key"
	case exitLocked:
		return "disk locked: its key has not been given"
	}
	return "unknown exit code"
}

// exitCodeError makes run exit with code. A nil err exits silently (the
// command already printed what it had to say); otherwise err is printed like
// any error.
type exitCodeError struct {
	code int
	err  error
}

func (e *exitCodeError) Error() string {
	if e.err == nil {
		return exitMeaning(e.code)
	}
	return e.err.Error()
}

func (e *exitCodeError) Unwrap() error { return e.err }

// usageError marks a bad argument found by a command itself; run prints the
// command's usage after it. Errors found by cobra before the command runs
// (argument counts, unknown flags) get the usage too.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}
