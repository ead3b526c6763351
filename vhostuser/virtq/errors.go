package virtq

import "errors"

var (
	// ErrBadMemory: a memory table whose regions are empty or overlap.
	ErrBadMemory = errors.New("virtq: bad memory table")
	// ErrBadRing: ring addresses or size the memory table does not hold,
	// or a driver index that moved by more than the ring's size.
	ErrBadRing = errors.New("virtq: bad ring")
	// ErrBadChain: a descriptor chain that breaks the rules (package doc).
	ErrBadChain = errors.New("virtq: bad descriptor chain")
	// ErrBadInflight: an inflight region too small or not of this ring's size.
	ErrBadInflight = errors.New("virtq: bad inflight region")
)
