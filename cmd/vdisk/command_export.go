package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ncw/directio"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

func newExportCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "export STORE|MOUNTPOINT NAME DST",
		Short: "Copy a disk out to a sparse raw image file",
		Long: `Export writes disk NAME to the regular file DST (created, or truncated if it
exists) as a raw image of the disk's size. Only the disk's data is written,
and blocks of zeros inside it are skipped, so DST is as sparse as the disk.
DST is synced before export returns. A progress bar is shown when stderr is
a terminal.

STORE may be mounted: given its mount point, or its path while a daemon
serves it, export reads the disk's file on the mount (its data regions, as
SEEK_DATA and SEEK_HOLE find them). A disk in use is read as it changes:
export a snapshot of it (vdisk snapshot) for a consistent copy.`,
		Example: `  vdisk export /srv/vdisks.img vm1.raw ./vm1-backup.raw
  vdisk export /mnt/vdisks vm1-snap ./vm1-backup.raw`,
		Args: exactArgs("STORE", "NAME", "DST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExport(e, args[0], args[1], args[2])
		},
	}
}

func runExport(e *env, storePath, name, dstPath string) (err error) {
	if sameFile(storePath, dstPath) {
		return fmt.Errorf("export: %s is the store itself", dstPath)
	}
	if st, err := os.Stat(dstPath); err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("export: %s is not a regular file", dstPath)
	}
	a, err := e.openAccess(storePath, "export", true)
	if err != nil {
		return err
	}
	defer e.closeAccess(a, &err)
	d, err := a.Open(name)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := d.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close disk: %w", cerr)
		}
	}()

	_, statErr := os.Stat(dstPath)
	created := errors.Is(statErr, os.ErrNotExist)
	dst, err := os.OpenFile(dstPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	written, err := copyFromDisk(e, d, dst)
	if err == nil {
		err = dst.Sync()
	}
	if cerr := dst.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		if created {
			os.Remove(dstPath)
		}
		return fmt.Errorf("export %s to %s: %w", name, dstPath, err)
	}
	fmt.Fprintf(e.stdout, "exported %s to %s: %s, %s written\n", name, dstPath, formatSizeExact(d.Size()), formatSize(written))
	return nil
}

// copyFromDisk sizes dst like d and writes d's data regions into it, skipping
// blocks of zeros at the granularity of dst's file system blocks.
func copyFromDisk(e *env, d diskData, dst *os.File) (int64, error) {
	size := d.Size()
	if err := dst.Truncate(size); err != nil {
		return 0, err
	}
	gran := 4096
	var st unix.Stat_t
	if err := unix.Fstat(int(dst.Fd()), &st); err == nil && st.Blksize >= 512 && st.Blksize <= copyChunk && st.Blksize&(st.Blksize-1) == 0 {
		gran = int(st.Blksize)
	}
	bar := e.newProgress(size, "export")
	defer bar.done()
	buf := directio.AlignedBlock(copyChunk)
	var written int64
	err := d.Regions(func(start, end int64) error {
		for pos := start; pos < end; {
			n := min(int64(len(buf)), end-pos)
			p := buf[:n]
			if _, err := d.ReadAt(p, pos); err != nil && !(errors.Is(err, io.EOF) && pos+n == size) {
				return err
			}
			w, err := writeNonZero(p, pos, gran, func(p []byte, off int64) error {
				_, err := dst.WriteAt(p, off)
				return err
			})
			written += w
			if err != nil {
				return err
			}
			pos += n
			bar.set(pos)
		}
		return nil
	})
	return written, err
}
