package fs

import (
	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
)

// CreateEncrypted makes an encrypted disk (image.Store.CreateEncrypted)
// with one key slot opened by key, and shows it in the mount at once, as
// Snapshot does.
func (s *Server) CreateEncrypted(name string, size int64, a image.Attr, key *crypt.Secret) (image.DiskInfo, error) {
	return s.showNew("create", name)(s.vfs.store.CreateEncrypted(name, size, a, key, crypt.Argon2Params{}))
}
