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

// SendRaw writes a raw stream of the encrypted disk (transfer.SendOptions.Raw),
// for `vdisk send --raw` on a mounted store: it needs no key.
func (s *Server) SendRaw(w io.Writer, disk, from string) (transfer.Stats, error) {
	return transfer.Send(w, s.vfs.store, disk, transfer.SendOptions{From: from, Live: true, Raw: true})
}
