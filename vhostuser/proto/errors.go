package proto

import "errors"

// ErrMalformed marks a message or payload that breaks the format: a wrong
// version, a size over a bound, a payload too short for its struct, too
// many file descriptors. Recognise it with errors.Is through any wrapping.
var ErrMalformed = errors.New("vhostuser/proto: malformed message")
