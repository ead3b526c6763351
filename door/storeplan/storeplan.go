// Package storeplan provides the door seam (package door) from the store
// (package image): a Plan wraps an image.IOPlan, and NewCompletions gives
// a submission loop its completion queue on the store's backend. It is
// the one place that puts the store's backing I/O on a door's ring
// (backend.Submitter.PrepareSQE), so that package image's API carries no
// ring type.
//
// Concurrency: as package door says, a Plan and a Completions belong to
// one submission loop.
package storeplan

import (
	"github.com/vdiskfs/vdiskfs/door"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/internal/iouring"
)

// Plan is a door.Plan over an image.IOPlan. Its zero value is ready; it is
// reused from request to request, as IOPlan is. The door's adapter plans
// into IOPlan (image.Disk.PlanRead, PlanWrite, PlanWriteSync) and ends the
// request with IOPlan.Finish or Abort.
type Plan struct {
	IOPlan image.IOPlan
}

// Compile-time check: Plan is a door.Plan.
var _ door.Plan = (*Plan)(nil)

// NewPlan returns a Plan whose Async I/O starts on cq (nil: none).
func NewPlan(cq door.Completions) *Plan {
	p := &Plan{}
	if c, ok := cq.(completions); ok {
		p.IOPlan.Completions = c.Completions
	}
	return p
}

func (p *Plan) IOs() int                      { return len(p.IOPlan.IOs) }
func (p *Plan) IOLen(i int) int               { return len(p.IOPlan.IOs[i].Buf) }
func (p *Plan) Async() bool                   { return p.IOPlan.Async() }
func (p *Plan) Start(i int, tag uint64) error { return p.IOPlan.Start(i, tag) }
func (p *Plan) Do(i int) error                { return p.IOPlan.Do(i) }
func (p *Plan) Bytes() int                    { return p.IOPlan.N }
func (p *Plan) CipherBytes() int              { return p.IOPlan.CipherBytes() }

// PrepareSQE puts the i-th I/O on the door's ring when the store's backend
// takes it there (a file or a block device).
func (p *Plan) PrepareSQE(sqe *iouring.SQE, i int) bool {
	sub := p.IOPlan.Submitter()
	return sub != nil && sub.PrepareSQE(sqe, p.IOPlan.BackendIO(i))
}

// completions is a door.Completions over an image.Completions.
type completions struct{ *image.Completions }

// NewCompletions returns the completion queue of one submission loop on
// the store's backend, or nil (a nil interface) when the backend needs
// none (image.Store.NewCompletions).
func NewCompletions(s *image.Store) (door.Completions, error) {
	c, err := s.NewCompletions()
	if err != nil || c == nil {
		return nil, err
	}
	return completions{c}, nil
}
