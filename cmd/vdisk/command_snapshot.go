package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
	"github.com/vdiskfs/vdiskfs/telemetry"
)

func newSnapshotCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "snapshot MOUNTPOINT/DISK NAME | STORE DISK NAME",
		Short: "Take a read-only snapshot of a disk, sharing all its blocks",
		Long: `Snapshot makes NAME, a new read-only disk that shares every block of DISK:
no data is copied, it takes no space until DISK is written, and it costs time
in proportion to DISK's extents, not its size.

With two arguments, DISK is a disk of a mounted store (MOUNTPOINT/DISK), which
may be in use: the daemon takes the snapshot in one step against the writes
in flight, so NAME holds every write acknowledged before the command started
and none that started after it returned (crash-consistent, like a snapshot
of a disk's contents at a power cut). NAME is durable, and shows in the mount,
when the command returns. With three arguments the store must not be
mounted (use the mount's form then).

A snapshot cannot be written: opens for writing, truncate and fallocate fail
with EROFS ("Read-only file system"); chmod, chown and touch work, and so do
rename and rm. "vdisk clone" of it, or "cp NAME COPY" on the mount, makes a
writable clone that also shares the blocks. vdisk ls shows each disk's origin and its exclusive and
shared bytes. The first snapshot or clone makes a store format version 2
(see vdisk upgrade).`,
		Args: shareArgs,
		RunE: shareRun(e, snapshotKind),
	}
}

// shareKind is what snapshot and clone differ in.
type shareKind struct {
	verb    string // the command: snapshot, clone
	what    string // for its output: "read-only, shares every block"
	mounted func(mountpoint, disk, name string) (telemetry.SnapshotReply, error)
	offline func(s *image.Store, disk, name string) (image.DiskInfo, error)
}

var (
	snapshotKind = shareKind{"snapshot", "read-only, shares every block", telemetry.Snapshot, (*image.Store).Snapshot}
	cloneKind    = shareKind{"clone", "writable, shares every block", telemetry.Clone, (*image.Store).Clone}
)

// shareMounted asks the daemon serving the mount that holds path (a disk
// file) to take the snapshot or clone, through the mount's socket.
func shareMounted(e *env, k shareKind, path, name string) error {
	mnt, disk, err := mountedDisk(path)
	if err != nil {
		return usageErrorf("%v; for a store that is not mounted: vdisk %s STORE DISK NAME", err, k.verb)
	}
	rep, err := k.mounted(mnt, disk, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s %s of %s taken: %s, %s (%s)\n", k.verb, rep.Name, disk, formatSize(rep.Size), k.what, filepath.Join(mnt, rep.Name))
	return nil
}

// mountedDisk splits path, a disk file of a vdiskfs mount, into the mount
// point (as the mount table spells it) and the disk's name.
func mountedDisk(path string) (mnt, disk string, err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", "", err
	}
	dir, disk := filepath.Split(abs)
	if mnt, err = canonicalMountpoint(filepath.Clean(dir)); err != nil {
		return "", "", err
	}
	if _, err := vdiskMountAt(mnt); err != nil {
		return "", "", fmt.Errorf("%s is not a disk of a vdiskfs mount: %w", path, err)
	}
	return mnt, disk, nil
}

// shareOffline takes the snapshot or clone in a store that is not
// mounted.
func shareOffline(e *env, k shareKind, store, disk, name string) (err error) {
	s, err := e.openStore(store, k.verb, false)
	if err != nil {
		if mnt, ok := mountedAt(store); ok && errors.Is(err, backend.ErrLocked) {
			return fmt.Errorf("%w\n%s is mounted at %s: take the %s there: vdisk %s %s %s", err, store, mnt, k.verb, k.verb, filepath.Join(mnt, disk), name)
		}
		return err
	}
	defer e.closeStore(s, &err)
	info, err := k.offline(s, disk, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "%s %s of %s taken: %s, %s\n", k.verb, info.Name, disk, formatSize(info.Size), k.what)
	return nil
}

// shareArgs checks the arguments of snapshot and clone.
func shareArgs(cmd *cobra.Command, args []string) error {
	if len(args) != 2 && len(args) != 3 {
		return fmt.Errorf("%s takes 2 arguments (MOUNTPOINT/DISK NAME) or 3 (STORE DISK NAME), got %d", cmd.CommandPath(), len(args))
	}
	return nil
}

// shareRun runs snapshot or clone with its 2 or 3 arguments.
func shareRun(e *env, k shareKind) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == 2 {
			return shareMounted(e, k, args[0], args[1])
		}
		return shareOffline(e, k, args[0], args[1], args[2])
	}
}

func newCloneCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "clone MOUNTPOINT/DISK NAME | STORE DISK NAME",
		Short: "Make a writable copy of a disk that shares all its blocks",
		Long: `Clone makes NAME, a new writable disk that shares every block of DISK: no data
is copied, it takes no space until either disk is written (each write then
gives the written blocks their own copy), and it costs time in proportion
to DISK's extents, not its size. It is what "cp DISK NAME" on the mount makes
when coreutils hands the copy to the file system (copy_file_range), for any
disk: coreutils 9.1 copies the data of a disk with holes itself, and FICLONE
(cp --reflink) cannot cross FUSE.

With two arguments, DISK is a disk of a mounted store (MOUNTPOINT/DISK), which
may be in use: the clone is taken in one step against the writes in flight,
as vdisk snapshot takes a snapshot, and is durable, and shows in the mount,
when the command returns. With three arguments the store must not be
mounted. vdisk ls shows NAME as a clone of DISK. The first clone or snapshot
makes a store format version 2 (see vdisk upgrade).`,
		Args: shareArgs,
		RunE: shareRun(e, cloneKind),
	}
}

func newUpgradeCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "upgrade STORE",
		Short: "Make a store the current format version (2: shared blocks)",
		Long: `Upgrade makes STORE format version 2, which can hold blocks that several disks
share (clones made by cp on the mount, and snapshots). A version-1 store
becomes version 2 by itself on its first clone or snapshot; upgrade does it
now, without touching any disk. Nothing else changes, but vdisk builds that
know only version 1 refuse the store from then on. On a version-2 store it
does nothing. The store must not be mounted.`,
		Args: exactArgs("STORE"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			s, err := e.openStore(args[0], "upgrade", false)
			if err != nil {
				return err
			}
			defer e.closeStore(s, &err)
			from := s.Version()
			if err := s.Upgrade(); err != nil {
				return err
			}
			if to := s.Version(); to != from {
				fmt.Fprintf(e.stdout, "upgraded %s from format version %d to %d (shared blocks: clones and snapshots); vdisk builds that know only version %d refuse it now\n", args[0], from, to, from)
				return nil
			}
			fmt.Fprintf(e.stdout, "%s is format version %d already: nothing to do\n", args[0], from)
			return nil
		},
	}
}

// originOf is the ORIGIN column of vdisk ls: what a disk was made from.
func originOf(d image.DiskInfo) string {
	kind := ""
	switch {
	case d.Snapshot:
		kind = "snapshot"
	case d.Clone:
		kind = "clone"
	default:
		return "-"
	}
	if d.Origin == "" {
		return fmt.Sprintf("%s of disk id %d (removed)", kind, d.OriginID)
	}
	return kind + " of " + d.Origin
}
