//go:build !rbd

package backend

import "fmt"

// RBDSupported says whether this build has the RBD backend (build tag rbd).
const RBDSupported = false

// noRBD is the error of every RBD operation in a build without the backend.
func noRBD(spec string) error {
	return fmt.Errorf("%s: this vdisk was built without Ceph RBD support; build it with "+
		"`make build TAGS=rbd` (needs librbd-dev and librados-dev): %w", spec, ErrUnsupported)
}

func openRBD(spec string, _ OpenOptions) (Backend, error) { return nil, noRBD(spec) }
func statRBD(spec string) (Info, error)                   { return Info{}, noRBD(spec) }
func createRBD(spec string, _ int64) error                { return noRBD(spec) }
func removeRBD(spec string) error                         { return noRBD(spec) }
func breakRBDLock(spec string) ([]string, error)          { return nil, noRBD(spec) }
