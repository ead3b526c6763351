package fs

import (
	"context"
	"errors"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/image"
)

// rootNode is the mount's only directory: its entries are the store's
// disks. It holds no state of its own; the store's catalog is the truth.
type rootNode struct {
	gofs.Inode
	vfs *vfs
}

var (
	_ = (gofs.InodeEmbedder)((*rootNode)(nil))
	_ = (gofs.NodeLookuper)((*rootNode)(nil))
	_ = (gofs.NodeReaddirer)((*rootNode)(nil))
	_ = (gofs.NodeGetattrer)((*rootNode)(nil))
	_ = (gofs.NodeSetattrer)((*rootNode)(nil))
	_ = (gofs.NodeStatfser)((*rootNode)(nil))
	_ = (gofs.NodeCreater)((*rootNode)(nil))
	_ = (gofs.NodeMknoder)((*rootNode)(nil))
	_ = (gofs.NodeMkdirer)((*rootNode)(nil))
	_ = (gofs.NodeSymlinker)((*rootNode)(nil))
	_ = (gofs.NodeLinker)((*rootNode)(nil))
	_ = (gofs.NodeTmpfiler)((*rootNode)(nil))
	_ = (gofs.NodeUnlinker)((*rootNode)(nil))
	_ = (gofs.NodeRmdirer)((*rootNode)(nil))
	_ = (gofs.NodeRenamer)((*rootNode)(nil))
)

// Getattr describes the root: a directory owned by the mounter.
func (r *rootNode) Getattr(ctx context.Context, f gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Mode = syscall.S_IFDIR | 0o755
	out.Nlink = 2
	out.Uid, out.Gid = r.vfs.uid, r.vfs.gid
	out.Blksize = 4096
	out.SetTimes(&r.vfs.mounted, &r.vfs.mounted, &r.vfs.mounted)
	return 0
}

// Setattr: the root's attributes are fixed.
func (r *rootNode) Setattr(ctx context.Context, f gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return syscall.EPERM
}

// Statfs describes the whole store.
func (r *rootNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return r.vfs.statfs(out)
}

// Lookup finds the disk called name.
func (r *rootNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if e := checkName(name); e != 0 {
		return nil, e
	}
	info, err := r.vfs.store.Stat(name)
	if err != nil {
		if errors.Is(err, image.ErrNotExist) {
			return nil, syscall.ENOENT // the common case: no log
		}
		return nil, r.vfs.toErrno(err, "lookup", logrus.Fields{"disk": name})
	}
	return r.child(ctx, info, out), 0
}

// child returns the inode of the disk info describes, filling out.
func (r *rootNode) child(ctx context.Context, info image.DiskInfo, out *fuse.EntryOut) *gofs.Inode {
	r.vfs.fillAttr(&out.Attr, info)
	if ch := r.GetChild(info.Name); ch != nil {
		if dn, ok := ch.Operations().(*diskNode); ok && dn.id == info.ID {
			dn.setName(info.Name)
			return ch
		}
	}
	dn := &diskNode{vfs: r.vfs, id: info.ID}
	dn.setName(info.Name)
	// If go-fuse knows this disk's inode already (same StableAttr), it
	// keeps that node and drops dn; the name hint of the kept node
	// repairs itself on first use (diskNode.info).
	return r.NewInode(ctx, dn, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: inoOf(info.ID)})
}

// Readdir lists the disks.
func (r *rootNode) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	disks := r.vfs.store.List()
	entries := make([]fuse.DirEntry, 0, len(disks))
	for _, d := range disks {
		entries = append(entries, fuse.DirEntry{Name: d.Name, Ino: inoOf(d.ID), Mode: syscall.S_IFREG})
	}
	return gofs.NewListDirStream(entries), 0
}

// Create makes a new empty disk owned by the caller and opens it
// (open(2) with O_CREAT of a name the kernel believes absent).
func (r *rootNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if e := checkName(name); e != 0 {
		return nil, nil, 0, e
	}
	fields := logrus.Fields{"disk": name}
	uid, gid := caller(ctx)
	existed := false
	if _, err := r.vfs.store.Create(name, 0, image.Attr{Mode: mode & 0o7777, UID: uid, GID: gid}); err != nil {
		// The name exists in the store although the kernel thought it
		// absent (created behind the mount): without O_EXCL, open it as
		// open(2) would.
		if !errors.Is(err, image.ErrExist) || flags&syscall.O_EXCL != 0 {
			return nil, nil, 0, r.vfs.toErrno(err, "create", fields)
		}
		existed = true
	}
	h, err := r.vfs.store.OpenDisk(name)
	if err != nil {
		return nil, nil, 0, r.vfs.toErrno(err, "create", fields)
	}
	if err := openableFor(h, flags); err != nil {
		h.Close()
		return nil, nil, 0, r.vfs.toErrno(err, "create", fields)
	}
	if existed && flags&syscall.O_TRUNC != 0 {
		if err := h.Truncate(0); err != nil {
			h.Close()
			return nil, nil, 0, r.vfs.toErrno(err, "create", fields)
		}
		r.vfs.vhost.resized(h.ID())
	}
	ch := r.child(ctx, h.Stat(), out)
	f, fuseFlags, e := r.vfs.newFile(ch.Operations().(*diskNode), h, flags)
	if e != 0 {
		return nil, nil, 0, e
	}
	if !existed {
		r.vfs.vhost.created(name)
	}
	return ch, f, fuseFlags, 0
}

// Mknod makes a disk for S_IFREG (mknod(2) of a regular file); every
// other file type is refused with EPERM, as by a filesystem that cannot
// hold it.
func (r *rootNode) Mknod(ctx context.Context, name string, mode uint32, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if mode&syscall.S_IFMT != syscall.S_IFREG && mode&syscall.S_IFMT != 0 {
		return nil, syscall.EPERM
	}
	if e := checkName(name); e != 0 {
		return nil, e
	}
	uid, gid := caller(ctx)
	info, err := r.vfs.store.Create(name, 0, image.Attr{Mode: mode & 0o7777, UID: uid, GID: gid})
	if err != nil {
		return nil, r.vfs.toErrno(err, "mknod", logrus.Fields{"disk": name})
	}
	r.vfs.vhost.created(name)
	return r.child(ctx, info, out), 0
}

// Mkdir: a store has no directories.
func (r *rootNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Symlink: a store holds disks only.
func (r *rootNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Link: a disk has exactly one name.
func (r *rootNode) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

// Tmpfile (O_TMPFILE): a disk always has a name; EOPNOTSUPP is what
// open(2) documents for a filesystem without O_TMPFILE.
func (r *rootNode) Tmpfile(ctx context.Context, flags uint32, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// Unlink removes a disk; handles open on it keep working, and its blocks
// are freed when the last one is closed.
func (r *rootNode) Unlink(ctx context.Context, name string) syscall.Errno {
	if e := checkName(name); e != 0 {
		return syscall.ENOENT
	}
	if info, err := r.vfs.store.Stat(name); err == nil {
		r.vfs.vhost.removing(info.ID) // its servers go first
	}
	if err := r.vfs.store.Remove(name); err != nil {
		return r.vfs.toErrno(err, "unlink", logrus.Fields{"disk": name})
	}
	return 0
}

// Rmdir: there are no directories to remove.
func (r *rootNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	if _, err := r.vfs.store.Stat(name); err == nil {
		return syscall.ENOTDIR
	}
	return syscall.ENOENT
}

// Rename renames a disk, replacing a disk of the new name like rename(2).
// RENAME_NOREPLACE is honoured; RENAME_EXCHANGE and RENAME_WHITEOUT are not
// supported (EINVAL, as rename(2) documents for an unsupported flag).
func (r *rootNode) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if flags&^uint32(unix.RENAME_NOREPLACE) != 0 {
		return syscall.EINVAL
	}
	if newParent.EmbeddedInode() != r.EmbeddedInode() {
		return syscall.EXDEV // cannot happen: there is one directory
	}
	if e := checkName(newName); e != 0 {
		return e
	}
	fields := logrus.Fields{"disk": name, "new_name": newName}
	if flags&unix.RENAME_NOREPLACE != 0 {
		// The kernel holds the directory's lock across RENAME, CREATE,
		// MKNOD and UNLINK, so no request of this mount can create
		// newName between this check and the rename.
		if _, err := r.vfs.store.Stat(newName); err == nil {
			return syscall.EEXIST
		}
	}
	// A disk the rename replaces loses its servers first, as on unlink.
	if old, err := r.vfs.store.Stat(newName); err == nil {
		if info, err := r.vfs.store.Stat(name); err == nil && info.ID != old.ID {
			r.vfs.vhost.removing(old.ID)
		}
	}
	if err := r.vfs.store.Rename(name, newName); err != nil {
		return r.vfs.toErrno(err, "rename", fields)
	}
	if info, err := r.vfs.store.Stat(newName); err == nil {
		r.vfs.vhost.renamed(info.ID, newName)
	}
	if ch := r.GetChild(name); ch != nil {
		if dn, ok := ch.Operations().(*diskNode); ok {
			if info, err := r.vfs.store.Stat(newName); err == nil && info.ID == dn.id {
				dn.setName(newName)
			}
		}
	}
	return 0
}
