package crypt

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

const (
	// DataKeySize is the length of a disk's data key: two AES-256 keys, the
	// first for the data, the second for the tweaks (IEEE 1619's Key1, Key2).
	DataKeySize = 64
	// KeyFileSize is the only length of a key file LoadKeyFile accepts.
	KeyFileSize = 32
	// MaxPassphrase bounds a passphrase's length in bytes.
	MaxPassphrase = 1024
)

// lockedBuf holds key material outside the Go heap, so that neither the
// garbage collector nor a stack copy leaves a copy of it behind: a private
// anonymous mapping of whole pages, locked in RAM (mlock, so it is never
// written to swap), left out of core dumps (MADV_DONTDUMP) and zeroed in
// a child a fork makes (MADV_WIPEONFORK). All three are best effort: a
// small RLIMIT_MEMLOCK refuses the lock, an old kernel the advice, and the
// buffer is used anyway. close zeroes the bytes and unmaps them.
type lockedBuf struct {
	mem []byte // the whole mapping
	n   int    // bytes in use, mem[:n]
}

func newLockedBuf(n int) (*lockedBuf, error) {
	size := (n + os.Getpagesize() - 1) / os.Getpagesize() * os.Getpagesize()
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("crypt: mapping key memory: %w", err)
	}
	// Best effort, see lockedBuf.
	_ = unix.Mlock(mem)
	_ = unix.Madvise(mem, unix.MADV_DONTDUMP)
	_ = unix.Madvise(mem, unix.MADV_WIPEONFORK)
	return &lockedBuf{mem: mem, n: n}, nil
}

func (b *lockedBuf) bytes() []byte { return b.mem[:b.n:b.n] }

func (b *lockedBuf) close() {
	if b == nil || b.mem == nil {
		return
	}
	clear(b.mem)
	_ = unix.Munlock(b.mem)
	_ = unix.Munmap(b.mem)
	b.mem = nil
}

// DataKey is a disk's data key in locked memory. Close zeroes it; a
// DataKey must not be used or closed while another goroutine uses it.
type DataKey struct {
	buf *lockedBuf
}

// NewDataKey returns a fresh random data key.
func NewDataKey() (*DataKey, error) {
	buf, err := newLockedBuf(DataKeySize)
	if err != nil {
		return nil, err
	}
	if _, err := rand.Read(buf.bytes()); err != nil {
		buf.close()
		return nil, fmt.Errorf("crypt: random data key: %w", err)
	}
	return &DataKey{buf: buf}, nil
}

// Close zeroes the key and releases its memory. A closed key may be
// closed again; any other use panics.
func (k *DataKey) Close() { k.buf.close() }

// bytes is the key itself. It panics after Close.
func (k *DataKey) bytes() []byte {
	if k.buf.mem == nil {
		panic("crypt: data key used after Close")
	}
	return k.buf.bytes()
}

// String and GoString keep a key out of any formatted output.
func (k *DataKey) String() string   { return "crypt.DataKey(redacted)" }
func (k *DataKey) GoString() string { return k.String() }

// Secret is what opens a key slot: the contents of a key file or a
// passphrase, in locked memory. Close zeroes it; a Secret must not be used
// or closed while another goroutine uses it.
type Secret struct {
	kind SlotKind
	buf  *lockedBuf
}

// KeyFileSecret copies a 32-byte key file's contents into a Secret. The
// caller should zero its own copy.
func KeyFileSecret(b []byte) (*Secret, error) {
	if len(b) != KeyFileSize {
		return nil, fmt.Errorf("crypt: key of %d bytes, want %d: %w", len(b), KeyFileSize, ErrKeyFile)
	}
	return newSecret(KindKeyFile, b)
}

// PassphraseSecret copies a passphrase of 1 to MaxPassphrase bytes into a
// Secret. The caller should zero its own copy.
func PassphraseSecret(p []byte) (*Secret, error) {
	if len(p) == 0 || len(p) > MaxPassphrase {
		return nil, fmt.Errorf("crypt: passphrase of %d bytes, want 1 to %d: %w", len(p), MaxPassphrase, ErrInvalid)
	}
	return newSecret(KindPassphrase, p)
}

func newSecret(kind SlotKind, b []byte) (*Secret, error) {
	buf, err := newLockedBuf(len(b))
	if err != nil {
		return nil, err
	}
	copy(buf.bytes(), b)
	return &Secret{kind: kind, buf: buf}, nil
}

// Kind is the kind of slot the secret opens.
func (s *Secret) Kind() SlotKind { return s.kind }

// Close zeroes the secret and releases its memory. A closed secret may be
// closed again; any other use panics.
func (s *Secret) Close() { s.buf.close() }

func (s *Secret) bytes() []byte {
	if s.buf.mem == nil {
		panic("crypt: secret used after Close")
	}
	return s.buf.bytes()
}

// String and GoString keep a secret out of any formatted output.
func (s *Secret) String() string   { return "crypt.Secret(" + s.kind.String() + ", redacted)" }
func (s *Secret) GoString() string { return s.String() }

// LoadKeyFile reads a key file into a Secret. It refuses, with ErrKeyFile,
// a file that is not a regular file (after following symbolic links, as
// Kubernetes secret volumes need), whose mode is not exactly 0600 or 0400,
// that the process's effective user does not own, or that does not hold
// exactly KeyFileSize bytes. systemd's LoadCredential= files (0400, owned
// by the service's user) pass. The checks are made on the opened file, so
// the file checked is the file read.
func LoadKeyFile(path string) (*Secret, error) {
	// O_NONBLOCK: opening a FIFO must not wait for a writer; it is then
	// refused as not a regular file.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("crypt: key file %s: %w", path, err)
	}
	defer f.Close()
	sec, err := ReadKeyFile(f, os.Geteuid())
	if err != nil {
		return nil, fmt.Errorf("crypt: key file %s: %w", path, err)
	}
	return sec, nil
}

// ReadKeyFile reads the key file f, opened by someone else (a key file's
// descriptor passed over a socket), into a Secret, from its start, with
// LoadKeyFile's checks but for the owner: it must be owned by uid owner.
func ReadKeyFile(f *os.File, owner int) (*Secret, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := checkKeyFileInfo(fi, owner); err != nil {
		return nil, err
	}
	buf, err := newLockedBuf(KeyFileSize)
	if err != nil {
		return nil, err
	}
	r := io.NewSectionReader(f, 0, KeyFileSize+1)
	if _, err := io.ReadFull(r, buf.bytes()); err != nil {
		buf.close()
		return nil, fmt.Errorf("reading: %w: %w", ErrKeyFile, err)
	}
	var extra [1]byte
	if n, err := r.Read(extra[:]); n != 0 || !errors.Is(err, io.EOF) {
		buf.close()
		return nil, fmt.Errorf("longer than %d bytes: %w", KeyFileSize, ErrKeyFile)
	}
	return &Secret{kind: KindKeyFile, buf: buf}, nil
}

// checkKeyFileInfo applies LoadKeyFile's rules to an opened file's status.
func checkKeyFileInfo(fi os.FileInfo, euid int) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%s): %w", fi.Mode().Type(), ErrKeyFile)
	}
	if m := fi.Mode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky); m != 0o600 && m != 0o400 {
		return fmt.Errorf("mode %v, want -rw------- (0600) or -r-------- (0400): %w", m, ErrKeyFile)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("no owner information: %w", ErrKeyFile)
	}
	if int(st.Uid) != euid {
		return fmt.Errorf("owned by uid %d, not by uid %d: %w", st.Uid, euid, ErrKeyFile)
	}
	if fi.Size() != KeyFileSize {
		return fmt.Errorf("%d bytes, want %d: %w", fi.Size(), KeyFileSize, ErrKeyFile)
	}
	return nil
}
