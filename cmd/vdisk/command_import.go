package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ncw/directio"
	"github.com/spf13/cobra"
	"github.com/vdiskfs/vdiskfs/image"
)

func newImportCmd(e *env) *cobra.Command {
	var size sizeValue
	mode := modeValue(0o644)
	var noSeek bool
	cmd := &cobra.Command{
		Use:   "import STORE|MOUNTPOINT NAME SRC",
		Short: "Copy a raw image file into a new disk",
		Long: `Import creates disk NAME with the size of SRC (a raw image file or a block
device) and copies SRC's data into it. Holes in SRC (found with SEEK_DATA and
SEEK_HOLE) and blocks of zeros are not copied: the disk reads zeros there
without using space. A progress bar is shown when stderr is a terminal.

If the copy fails, the new disk is removed.

STORE may be mounted: given its mount point, or its path while a daemon
serves it, import creates the disk on the mount and writes it there (and
fsyncs it), so the disk shows at once.`,
		Example: `  vdisk import /srv/vdisks.img vm1.raw ./debian-12.raw
  vdisk import /mnt/vdisks vm2.raw ./debian-12.raw`,
		Args: exactArgs("STORE", "NAME", "SRC"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runImport(e, args[0], args[1], args[2], size, uint32(mode), !noSeek)
		},
	}
	cmd.Flags().Var(&size, "size", "size of the disk, at least the size of SRC (default: the size of SRC)")
	cmd.Flags().Var(&mode, "mode", "permission bits of the disk file, in octal")
	cmd.Flags().BoolVar(&noSeek, "no-seek-hole", false, "read all of SRC instead of asking the file system where its data is")
	_ = cmd.Flags().MarkHidden("no-seek-hole")
	return cmd
}

// importStats is what an import copied.
type importStats struct {
	data    int64 // bytes in the source's data regions
	written int64 // bytes written to the disk
}

func runImport(e *env, storePath, name, srcPath string, size sizeValue, mode uint32, useSeek bool) (err error) {
	if sameFile(storePath, srcPath) {
		return fmt.Errorf("import: %s is the store itself", srcPath)
	}
	src, err := os.Open(srcPath)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	defer src.Close()
	srcSize, err := src.Seek(0, io.SeekEnd) // st_size is 0 for a block device
	if err != nil {
		return fmt.Errorf("import: size of %s: %w", srcPath, err)
	}
	diskSize := srcSize
	if size.set {
		if size.n < srcSize {
			return fmt.Errorf("import: --size %s is smaller than %s (%s)", formatSize(size.n), srcPath, formatSize(srcSize))
		}
		diskSize = size.n
	}
	if err := image.ValidateName(name); err != nil {
		return fmt.Errorf("import %q: %w", name, err)
	}

	a, err := e.openAccess(storePath, "import", false)
	if err != nil {
		return err
	}
	defer e.closeAccess(a, &err)
	in, err := a.Info()
	if err != nil {
		return err
	}
	d, err := a.Create(name, diskSize, mode)
	if err != nil {
		return err
	}
	st, err := copyIntoDisk(e, d, src, srcSize, in.Info.BlockSize, useSeek)
	if cerr := d.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close disk: %w", cerr)
	}
	if err != nil {
		if rerr := a.Remove(name); rerr != nil {
			e.log.WithError(rerr).WithField("disk", name).Error("removing the partly imported disk")
		}
		return fmt.Errorf("import %s: %w", srcPath, err)
	}
	fmt.Fprintf(e.stdout, "imported %s as %s: %s disk, %s of data, %s written\n",
		srcPath, name, formatSizeExact(diskSize), formatSize(st.data), formatSize(st.written))
	return nil
}

// copyIntoDisk copies the data regions of src (size bytes) into d, skipping
// all-zero blocks of the store's block size bs.
func copyIntoDisk(e *env, d diskData, src *os.File, size int64, bs int, useSeek bool) (importStats, error) {
	var st importStats
	bar := e.newProgress(size, "import")
	defer bar.done()
	buf := directio.AlignedBlock(copyChunk) // a multiple of any block size
	b64 := int64(bs)
	var done int64 // everything below was copied; a multiple of bs or size
	err := fileDataRegions(src, size, useSeek, func(start, end int64) error {
		st.data += end - start
		// Work in whole blocks: a block is skipped only if all of it is
		// zeros, and each block is written at most once even when two
		// data regions share it.
		pos := max(start/b64*b64, done)
		end = min((end+b64-1)/b64*b64, size)
		for pos < end {
			n := min(int64(len(buf)), end-pos)
			p := buf[:n]
			if _, err := src.ReadAt(p, pos); err != nil {
				if errors.Is(err, io.EOF) {
					return fmt.Errorf("%s shrank while being read (short read at %d)", src.Name(), pos)
				}
				return err
			}
			w, err := writeNonZero(p, pos, bs, func(p []byte, off int64) error {
				_, err := d.WriteAt(p, off)
				return err
			})
			st.written += w
			if err != nil {
				return err
			}
			pos += n
			bar.set(pos)
		}
		done = max(done, end)
		return nil
	})
	return st, err
}
