// Package blkdisk serves an *image.Disk to the vhost-user-blk door: it
// provides blk.Disk (package vhostuser/blk) from package image, so that
// the door imports nothing of the store. Planned reads and writes go
// through the door seam (package door/storeplan) straight into guest
// memory; the blocking calls are the disk's own.
//
// Concurrency: as blk.Disk says. An IO belongs to one queue owner.
package blkdisk

import (
	"github.com/vdiskfs/vdiskfs/door"
	"github.com/vdiskfs/vdiskfs/door/storeplan"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/vhostuser/blk"
)

// Disk is a blk.Disk over an open disk of a store. The caller keeps the
// handle open while the device serves it.
type Disk struct {
	s *image.Store
	d *image.Disk
}

// Compile-time checks: Disk is what the door serves, and its writes
// survive a daemon restart.
var (
	_ blk.Disk        = (*Disk)(nil)
	_ blk.Restartable = (*Disk)(nil)
)

// New returns the door's view of d, a disk of s.
func New(s *image.Store, d *image.Disk) *Disk { return &Disk{s: s, d: d} }

func (d *Disk) Size() int64                      { return d.d.Size() }
func (d *Disk) BlockSize() int                   { return d.s.BlockSize() }
func (d *Disk) Encrypted() bool                  { enc, _ := d.d.Encrypted(); return enc }
func (d *Disk) Flush() error                     { return d.d.Sync() } // what fsync on the disk's file does
func (d *Disk) NewIO(cq door.Completions) blk.IO { return &planIO{d: d.d, plan: storeplan.NewPlan(cq)} }

func (d *Disk) NewCompletions() (door.Completions, error) { return storeplan.NewCompletions(d.s) }

func (d *Disk) ReadAt(p []byte, off int64) (int, error)  { return d.d.ReadAt(p, off) }
func (d *Disk) WriteAt(p []byte, off int64) (int, error) { return d.d.WriteAt(p, off) }

// WritesRecoverable: no mapping waits for a commit, so a store opened
// after this daemon dies maps every block written. (Data written in place
// is on the backing once its O_DIRECT write completed.)
func (d *Disk) WritesRecoverable() bool { return d.s.MappingsDurable() }

// CommitWrites commits the store's mappings (the commit of fdatasync).
func (d *Disk) CommitWrites() error { return d.d.SyncData() }

// Discard punches the range: it reads as zeros and its whole blocks are
// freed, as fallocate(PUNCH_HOLE) on the file.
func (d *Disk) Discard(off, n int64) error { return d.d.Punch(off, n) }

// WriteZeroes zeroes the range without growing the disk. With unmap its
// whole blocks are freed (as a punch); without, the range stays allocated
// (fallocate ZERO_RANGE, then allocation of what it freed).
func (d *Disk) WriteZeroes(off, n int64, unmap bool) error {
	if err := d.d.ZeroRange(off, n, true); err != nil || unmap {
		return err
	}
	return d.d.Allocate(off, n, true)
}

// planIO is one request slot's plan on a queue owner.
type planIO struct {
	d    *image.Disk
	plan *storeplan.Plan
}

func (r *planIO) Start(buf []byte, off int64, write bool, maxIOs int) bool {
	if write {
		return r.d.PlanWrite(&r.plan.IOPlan, buf, off, maxIOs)
	}
	return r.d.PlanRead(&r.plan.IOPlan, buf, off, maxIOs)
}

func (r *planIO) Plan() door.Plan { return r.plan }

func (r *planIO) End(ok bool) {
	if ok {
		r.plan.IOPlan.Finish()
	} else {
		r.plan.IOPlan.Abort()
	}
}
