package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
)

// encryptedName is the encrypted disk's file in the vdiskfs mount.
const encryptedName = "compare-encrypted.img"

// vdiskfsEncrypted is an encrypted disk (a random key of its own) on the
// in-process vdiskfs mount: the vdiskfs target's, when it is one, else one
// of its own. Its counters are the store's: runs do not overlap, so a
// run's differences are its own.
type vdiskfsEncrypted struct {
	local *vdiskfsLocal
	own   bool // local is this target's: Close closes it
	path  string
	size  int64
}

// newVdiskfsEncrypted makes the encrypted disk on local, or on the mount
// mount makes when local is nil.
func newVdiskfsEncrypted(local *vdiskfsLocal, mount func() (*vdiskfsLocal, error), size int64) (*vdiskfsEncrypted, error) {
	t := &vdiskfsEncrypted{local: local, size: size}
	if local == nil {
		var err error
		if t.local, err = mount(); err != nil {
			return nil, err
		}
		t.own = true
	}
	t.path = filepath.Join(t.local.mnt, encryptedName)
	raw := make([]byte, crypt.KeyFileSize)
	if _, err := rand.Read(raw); err != nil {
		t.Close()
		return nil, err
	}
	key, err := crypt.KeyFileSecret(raw)
	clear(raw)
	if err != nil {
		t.Close()
		return nil, err
	}
	defer key.Close()
	if _, err := t.local.srv.CreateEncrypted(encryptedName, size, image.Attr{Mode: 0o600}, key); err != nil {
		t.Close()
		return nil, fmt.Errorf("create the encrypted disk: %w", err)
	}
	return t, nil
}

func (t *vdiskfsEncrypted) Name() string                    { return targetEncrypted }
func (t *vdiskfsEncrypted) File() string                    { return t.path }
func (t *vdiskfsEncrypted) Reset(ctx context.Context) error { return emptyFile(t.path, t.size) }
func (t *vdiskfsEncrypted) Sample() sample                  { return t.local.Sample() }

// Close removes the encrypted disk, and closes the mount if it is this
// target's.
func (t *vdiskfsEncrypted) Close() error {
	err := os.Remove(t.path)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	if t.own {
		err = errors.Join(err, t.local.Close())
	}
	return err
}
