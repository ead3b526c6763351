package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/image/backend"
)

func newFormatCmd(e *env) *cobra.Command {
	var size, blockSize, journalSize sizeValue
	var force bool
	cmd := &cobra.Command{
		Use:   "format STORE",
		Short: "Create an empty store on a file, block device or RBD image",
		Long: `Format writes an empty store over STORE, a regular file, a block device or a
Ceph RBD image. When STORE does not exist, a sparse file of --size bytes is
created, or an RBD image of --size bytes for rbd:POOL/IMAGE.

An RBD store is named rbd:POOL/IMAGE (or rbd:POOL/NAMESPACE/IMAGE), in
QEMU's syntax: suffixes :id=USER, :conf=FILE and :OPTION=VALUE set the Ceph
client, its configuration file and any Ceph option; --ceph-user (--id) and
--ceph-conf do the same, and without them CEPH_CONF and CEPH_ARGS apply as
for the rbd command. Every command that takes STORE takes these names.

Format refuses to overwrite an existing store (or what looks like a damaged
one) unless --force is given, and always refuses a store that another
process has open.`,
		Example: `  vdisk format /srv/vdisks.img --size 100G
  vdisk format /dev/nvme0n1 --block-size 64K
  vdisk format rbd:rbd/vdisks --size 1T --id vdisk`,
		Args: exactArgs("STORE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runFormat(e, args[0], size, blockSize, journalSize, force)
		},
	}
	f := cmd.Flags()
	f.Var(&size, "size", "size of the new file or RBD image (required when STORE does not exist)")
	f.Var(&blockSize, "block-size", "allocation unit: a power of two from 4K to 1M (default 4K)")
	f.Var(&journalSize, "journal-size", "journal size (default 1/64 of the store, from 1M to 64M)")
	f.BoolVarP(&force, "force", "f", false, "overwrite an existing store, losing every disk on it")
	return cmd
}

func runFormat(e *env, path string, size, blockSize, journalSize sizeValue, force bool) error {
	info, err := backend.Stat(path)
	creating := errors.Is(err, os.ErrNotExist)
	switch {
	case creating:
		if !size.set {
			return usageErrorf("%s does not exist: give --size to create it", path)
		}
		if size.n <= 0 || size.n%4096 != 0 {
			return fmt.Errorf("--size %d: must be a positive multiple of 4 KiB", size.n)
		}
	case err != nil:
		return err
	default:
		if size.set {
			if info.Kind == backend.KindDevice {
				return fmt.Errorf("%s is a %s: --size applies only when creating a new file or RBD image", path, info.Kind)
			}
			if info.Size != size.n {
				return fmt.Errorf("%s already exists with %d bytes: --size applies only when creating a new %s (resize or remove it first)", path, info.Size, info.Kind)
			}
		}
		if err := checkFormattable(e, path, force); err != nil {
			return err
		}
	}
	bs := image.DefaultBlockSize
	if blockSize.set {
		if blockSize.n > image.MaxBlockSize {
			return fmt.Errorf("--block-size %d: more than the largest block size %s", blockSize.n, formatSize(image.MaxBlockSize))
		}
		bs = int(blockSize.n)
	}
	fo := image.FormatOptions{BlockSize: bs, JournalSize: journalSize.n}
	if err := image.FormatPath(path, size.n, fo); err != nil {
		if creating {
			backend.Remove(path) // do not leave a half-made store behind
		}
		return err
	}
	s, err := e.openStore(path, "format", true)
	if err != nil {
		return fmt.Errorf("formatted %s, but it does not open: %w", path, err)
	}
	in := s.Info()
	if err := s.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	fmt.Fprintf(e.stdout, "formatted %s: %s for disks (%d blocks of %s), journal %s, uuid %s\n",
		path, formatSize(in.CapacityBytes), in.DataBlocks, formatSize(int64(in.BlockSize)), formatSize(in.JournalBytes), in.UUID)
	return nil
}

// checkFormattable refuses to format over a store unless force is set, and
// over a store open elsewhere in any case.
func checkFormattable(e *env, path string, force bool) error {
	s, err := e.openStore(path, "format", true)
	switch {
	case err == nil:
		n := len(s.List())
		if cerr := s.Close(); cerr != nil {
			return fmt.Errorf("close store: %w", cerr)
		}
		if !force {
			return fmt.Errorf("%s already holds a vdiskfs store with %d disk(s); use --force to overwrite it", path, n)
		}
		e.log.WithField("store", path).WithField("disks", n).Warn("overwriting an existing store")
		return nil
	case errors.Is(err, image.ErrNotStore):
		return nil // an empty file or device, or anything else: ours to format
	case errors.Is(err, backend.ErrLocked):
		return fmt.Errorf("refusing to format a store that is in use: %w", err)
	case errors.Is(err, image.ErrCorrupt), errors.Is(err, image.ErrVersion), errors.Is(err, image.ErrOwned):
		if !force {
			return fmt.Errorf("%s looks like a vdiskfs store that does not open (%w); use --force to overwrite it", path, err)
		}
		e.log.WithField("store", path).WithError(err).Warn("overwriting a store that does not open")
		return nil
	default:
		return err
	}
}
