package blockmap

import "errors"

// ErrInvariant is wrapped by every error Check returns, so callers (the image
// checker, tests) can recognise a broken map with errors.Is whatever the
// details in the message.
var ErrInvariant = errors.New("blockmap: invariant violated")
