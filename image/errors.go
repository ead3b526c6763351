package image

import "errors"

// Sentinel errors. Every error the package returns wraps one of these (or a
// backend error carrying a syscall.Errno), so callers such as the FUSE layer can
// map them with errors.Is through any amount of context.
var (
	// ErrCorrupt marks damage found in the store's metadata: a checksum
	// mismatch, an impossible value, a reference outside the data region. It
	// is never returned for a torn journal tail, which is normal after a crash.
	ErrCorrupt = errors.New("image: store is corrupt")
	// ErrNotStore: the backing does not start with a vdiskfs superblock.
	ErrNotStore = errors.New("image: not a vdiskfs store")
	// ErrVersion: the store was written by a newer (or unknown) format version.
	ErrVersion = errors.New("image: unsupported store format version")
	// ErrNoSpace: the store has no free blocks (or no metadata space) left.
	ErrNoSpace = errors.New("image: no space left in store")
	// ErrExist: a disk with that name already exists.
	ErrExist = errors.New("image: disk already exists")
	// ErrNotExist: no disk with that name.
	ErrNotExist = errors.New("image: no such disk")
	// ErrInvalidName: the disk name is empty, too long, not UTF-8, or
	// contains '/' or NUL, or is "." or "..".
	ErrInvalidName = errors.New("image: invalid disk name")
	// ErrInvalid: an argument is out of range (negative offset, size beyond
	// MaxDiskSize, ...).
	ErrInvalid = errors.New("image: invalid argument")
	// ErrTooLarge: the operation would make a disk larger than MaxDiskSize.
	ErrTooLarge = errors.New("image: disk too large")
	// ErrNoData: SeekData found no data at or after the offset (ENXIO).
	ErrNoData = errors.New("image: no data past offset")
	// ErrClosed: the store or disk handle is closed.
	ErrClosed = errors.New("image: closed")
	// ErrReadOnly: the store was opened read-only.
	ErrReadOnly = errors.New("image: store is read-only")
	// ErrFailed: an earlier flush or metadata write failed; the store refuses
	// further writes and syncs so that no later sync pretends to cover data
	// that may have been lost (the fsyncgate lesson). Reopen the store.
	ErrFailed = errors.New("image: store failed after an I/O error; reopen it")
	// ErrOwned: the superblock says another host has the store open.
	ErrOwned = errors.New("image: store is owned by another host")
)

// Encrypted disks (encrypt.go).
var (
	// ErrLocked: the disk is encrypted and its key has not been given
	// (Store.Unlock): its data cannot be read or written (ENOKEY).
	ErrLocked = errors.New("image: disk is locked: its key has not been given")
	// ErrWrongKey: no key slot of the disk opens with the secret given
	// (EKEYREJECTED).
	ErrWrongKey = errors.New("image: wrong key for the disk")
	// ErrCrossKey: blocks cannot be shared between disks with different
	// keys, or between a plain and an encrypted disk, without copying
	// their data through both keys (EXDEV to copy_file_range).
	ErrCrossKey = errors.New("image: disks do not share a key")
	// ErrNotEncrypted: a key operation on a plain disk.
	ErrNotEncrypted = errors.New("image: disk is not encrypted")
	// ErrBusy: a disk with the key is open (Store.Lock; EBUSY).
	ErrBusy = errors.New("image: disk is in use")
)
