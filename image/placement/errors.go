package placement

import "errors"

// Sentinel errors. The store marks them with its own (image.ErrNoSpace,
// image.ErrCorrupt) where they leave it.
var (
	// ErrNoSpace: too few free blocks for the request.
	ErrNoSpace = errors.New("placement: no free blocks left")
	// ErrCorrupt: a block freed twice or taken while in use: the free
	// space and the maps that led to the call disagree.
	ErrCorrupt = errors.New("placement: free space and maps disagree")
)
