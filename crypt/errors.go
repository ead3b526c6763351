package crypt

import "errors"

// Sentinel errors. Every error the package returns wraps one of these, so
// callers can tell them apart with errors.Is through any wrapping. No error
// carries key material: they name files, slots and parameters only.
var (
	// ErrWrongKey: no key slot opens with the secret given (every slot's
	// authentication tag failed, or no slot is of the secret's kind).
	ErrWrongKey = errors.New("crypt: wrong key")
	// ErrCorrupt: a slot table fails its magic, checksum or a bound, or a
	// slot that authenticated holds a key other than the table's.
	ErrCorrupt = errors.New("crypt: key slots are corrupt")
	// ErrVersion: a slot table of an unknown version, cipher or slot kind.
	ErrVersion = errors.New("crypt: unsupported key slot format")
	// ErrLastSlot: removing the slot would leave the data key unreachable.
	ErrLastSlot = errors.New("crypt: cannot remove the last key slot")
	// ErrNoSlot: no slot has the id given.
	ErrNoSlot = errors.New("crypt: no such key slot")
	// ErrTooManySlots: the table already holds MaxSlots slots.
	ErrTooManySlots = errors.New("crypt: too many key slots")
	// ErrKeyFile: a key file is refused (not a regular file, wrong mode or
	// owner, wrong size).
	ErrKeyFile = errors.New("crypt: key file refused")
	// ErrInvalid: an argument is out of range (a data unit size, Argon2
	// parameters, an empty passphrase, a closed key).
	ErrInvalid = errors.New("crypt: invalid argument")
)
