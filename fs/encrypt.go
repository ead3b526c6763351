package fs

import (
	"io"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// CreateEncrypted makes an encrypted disk (image.Store.CreateEncrypted)
// with one key slot opened by key, and shows it in the mount at once, as
// Snapshot does.
func (s *Server) CreateEncrypted(name string, size int64, a image.Attr, key *crypt.Secret) (image.DiskInfo, error) {
	return s.showNew("create", name)(s.vfs.store.CreateEncrypted(name, size, a, key, crypt.Argon2Params{}))
}

// Unlock gives the store a key (image.Store.Unlock) and then, with
// Options.VhostUserDir, serves on their sockets the disks it opened, which
// a locked disk could not be at mount time.
func (s *Server) Unlock(name string, key *crypt.Secret) (int, error) {
	n, err := s.vfs.store.Unlock(name, key)
	if err == nil {
		s.vfs.vhost.unlocked()
	}
	return n, err
}

// SendRaw writes a raw stream of the encrypted disk (transfer.SendOptions.Raw),
// for `vdisk send --raw` on a mounted store: it needs no key.
func (s *Server) SendRaw(w io.Writer, disk, from string) (transfer.Stats, error) {
	return transfer.Send(w, s.vfs.store, disk, transfer.SendOptions{From: from, Live: true, Raw: true})
}
