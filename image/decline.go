package image

import (
	"errors"
	"slices"
	"sync/atomic"
)

// A Decline is why a plan that may not wait (Disk.PlanRead, PlanWrite,
// PlanWriteSync: a door's queue thread) was not made. The request is then
// served by ReadAt, WriteAt or WriteAtSync on a thread that may block, so a
// decline costs speed, never correctness; the store counts each reason
// (Counters.Declines, `vdisk stats`, vdiskfs_plan_declines_total), so
// that a door that serves too little on its own threads shows why.
type Decline uint8

const (
	// DeclineInvalid: not a request to plan (no bytes, out of range).
	DeclineInvalid Decline = iota
	// DeclineClosed: the handle is closed.
	DeclineClosed
	// DeclineEnd: a read at or past the disk's end, or a write past it
	// (a growing write), or a disk that shrank under the request.
	DeclineEnd
	// DeclineUnaligned: the offset, length or buffer is not aligned to
	// the block size (a read-modify-write, or a bounce buffer).
	DeclineUnaligned
	// DeclineBackend: the backend takes no I/O on a ring and the caller
	// has no completion queue on it (a wrapper whose I/O may block).
	DeclineBackend
	// DeclineBusy: another request holds part of the range.
	DeclineBusy
	// DeclineReadOnly: the store takes no writes, or the disk is a
	// snapshot; WriteAt reports it.
	DeclineReadOnly
	// DeclineNeedsCommit: a synchronous write that durable writes alone
	// do not make durable (holes, pending records).
	DeclineNeedsCommit
	// DeclineNoBlocks: the holes cannot be given blocks without waiting
	// (a full store, whose WriteAt commits to release freed blocks, or a
	// chunk of a store file to prepare first).
	DeclineNoBlocks
	// DeclineTooManyIOs: more backing I/Os than the caller takes.
	DeclineTooManyIOs
	// DeclineLocked: the disk is encrypted and locked (ErrLocked).
	DeclineLocked
	// DeclineCipher: a write of an encrypted disk larger than the plan's
	// MaxCipherWrite.
	DeclineCipher

	numDeclines
)

var declineNames = [numDeclines]string{
	DeclineInvalid:     "invalid",
	DeclineClosed:      "closed",
	DeclineEnd:         "end",
	DeclineUnaligned:   "unaligned",
	DeclineBackend:     "backend",
	DeclineBusy:        "busy",
	DeclineReadOnly:    "read_only",
	DeclineNeedsCommit: "needs_commit",
	DeclineNoBlocks:    "no_blocks",
	DeclineTooManyIOs:  "too_many_ios",
	DeclineLocked:      "locked",
	DeclineCipher:      "cipher",
}

// String is the reason's name in counters and metrics.
func (r Decline) String() string {
	if r < numDeclines {
		return declineNames[r]
	}
	return "unknown"
}

// declineError is a plan declined for a reason.
type declineError struct{ reason Decline }

func (e *declineError) Error() string { return "image: request not planned: " + e.reason.String() }

// declineErrors are the declines' errors, made once: a decline allocates
// nothing.
var declineErrors = func() (out [numDeclines]*declineError) {
	for i := range out {
		out[i] = &declineError{Decline(i)}
	}
	return out
}()

// declined is the error of a plan declined for reason r.
func declined(r Decline) error { return declineErrors[r] }

// reasonOf is why err, from prepare without wait, declined a plan.
func reasonOf(err error) Decline {
	var de *declineError
	if errors.As(err, &de) {
		return de.reason
	}
	return DeclineInvalid
}

// declineCounts counts declines by reason.
type declineCounts [numDeclines]atomic.Uint64

// snapshot is the counts by reason name, the reasons never seen left out.
func (c *declineCounts) snapshot() map[string]uint64 {
	var out map[string]uint64
	for i := range c {
		if n := c[i].Load(); n > 0 {
			if out == nil {
				out = make(map[string]uint64)
			}
			out[Decline(i).String()] = n
		}
	}
	return out
}

// DeclineReasons are the names of every Decline, in order.
func DeclineReasons() []string { return slices.Clone(declineNames[:]) }
