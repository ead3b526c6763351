package main

// Keys of encrypted disks: the flags that name them, what the daemon does
// with them, and vdisk unlock and vdisk key.
//
// A key is a key file of 32 random bytes (head -c 32 /dev/urandom), mode
// 0600 or 0400, owned by the user who gives it (crypt.LoadKeyFile). It is
// never an argument's value: flags name files. Through a mount, the
// command opens the key file and passes the open descriptor to the daemon
// over the control socket (telemetry.Unlock and the others), which reads
// the key from it; the key's bytes are never in a request.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/vdiskfs/vdiskfs/crypt"
	"github.com/vdiskfs/vdiskfs/image"
	"github.com/vdiskfs/vdiskfs/telemetry"
	"github.com/vdiskfs/vdiskfs/transfer"
)

// encryptionOf is a disk's ENCRYPTION column in vdisk ls.
func encryptionOf(d image.DiskInfo) string {
	switch {
	case d.Locked:
		return "locked"
	case d.Encrypted:
		return "encrypted"
	}
	return "-"
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The daemon's side of telemetry.KeyController: the store's, a new disk
// shows in the mount at once, and an unlocked disk is served on the
// mount's vhost-user directory. Holding a key turns core dumps off.
func (m mountSource) Unlock(name string, key *crypt.Secret) (int, error) {
	holdKeys(m.log)
	return m.srv.Unlock(name, key)
}

func (m mountSource) CreateEncrypted(name string, size int64, a image.Attr, key *crypt.Secret) (image.DiskInfo, error) {
	holdKeys(m.log)
	return m.srv.CreateEncrypted(name, size, a, key)
}

func (m mountSource) Lock(name string) (int, error) { return m.s.Lock(name) }

func (m mountSource) AddKey(name string, have, add *crypt.Secret) (uint32, error) {
	return m.s.AddKey(name, have, add, crypt.Argon2Params{})
}

func (m mountSource) RemoveKey(name string, have *crypt.Secret, slot uint32) error {
	return m.s.RemoveKey(name, have, slot)
}

func (m mountSource) KeySlots(name string) ([]image.KeySlot, error) { return m.s.KeySlots(name) }

// holdKeys makes the process not dumpable (PR_SET_DUMPABLE 0) before it
// holds a data key: no core dump, and no ptrace or /proc/PID/mem by other
// processes of its user. RLIMIT_CORE 0 would not do: a core_pattern that
// pipes to a helper (systemd-coredump, apport) ignores it, and it leaves
// ptrace open. Data keys live in memory left out of dumps already
// (MADV_DONTDUMP), but AES key schedules are in the Go heap.
func holdKeys(log logrus.FieldLogger) {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		log.WithError(err).Warn("cannot turn core dumps off (PR_SET_DUMPABLE); a core dump could hold encryption keys")
	}
}

// keyFlags are the flags that name a key: --key-file, or, where a
// passphrase may do, --passphrase-file.
type keyFlags struct {
	keyFile, passphraseFile string
}

func (k *keyFlags) add(cmd *cobra.Command, what string, passphrase bool) {
	cmd.Flags().StringVar(&k.keyFile, "key-file", "", what+": a file of 32 random bytes, mode 0600 or 0400, owned by you")
	if passphrase {
		cmd.Flags().StringVar(&k.passphraseFile, "passphrase-file", "", what+": a passphrase, the first line of this file (- for standard input), stretched with Argon2id")
	}
}

func (k *keyFlags) given() bool { return k.keyFile != "" || k.passphraseFile != "" }

// secret loads the key the flags name; the process holds keys from then
// on (holdKeys).
func (k *keyFlags) secret(e *env) (*crypt.Secret, error) {
	if k.given() {
		holdKeys(e.log)
	}
	switch {
	case k.keyFile != "" && k.passphraseFile != "":
		return nil, usageErrorf("--key-file and --passphrase-file: give one")
	case k.keyFile != "":
		return crypt.LoadKeyFile(k.keyFile)
	case k.passphraseFile != "":
		return readPassphrase(e, k.passphraseFile)
	}
	return nil, usageErrorf("no key: give --key-file")
}

// readPassphrase reads the first line of path (- for stdin) as a
// passphrase.
func readPassphrase(e *env, path string) (*crypt.Secret, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	b := make([]byte, crypt.MaxPassphrase+2)
	n, err := io.ReadFull(r, b)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("passphrase: %w", err)
	}
	line := b[:n]
	for i, c := range line {
		if c == '\n' {
			line = line[:i]
			break
		}
	}
	s, err := crypt.PassphraseSecret(line)
	clear(b)
	return s, err
}

// openKeyFile opens a key file to pass its descriptor to a daemon, which
// checks it (telemetry.Unlock).
func openKeyFile(path string) (*os.File, error) {
	if path == "" {
		return nil, usageErrorf("through a mount, keys are key files: give --key-file")
	}
	return os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
}

// unlockKeyDir gives the store every key DIR holds for its encrypted
// disks: DIR/NAME.key for disk NAME. A disk without one stays locked; a
// key file refused (its mode or owner, a wrong key) is a warning, and the
// disk stays locked. mount --key-dir.
func unlockKeyDir(log logrus.FieldLogger, s *image.Store, dir string) {
	for _, d := range s.List() {
		if !d.Encrypted || !d.Locked {
			continue
		}
		l := log.WithField("disk", d.Name)
		path := filepath.Join(dir, d.Name+".key")
		key, err := crypt.LoadKeyFile(path)
		if errors.Is(err, os.ErrNotExist) {
			l.Info("no key file for the encrypted disk: it stays locked")
			continue
		}
		if err != nil {
			l.WithError(err).Warn("key file refused: the disk stays locked")
			continue
		}
		holdKeys(log)
		n, err := s.Unlock(d.Name, key)
		key.Close()
		if err != nil {
			l.WithError(err).Warn("key refused: the disk stays locked")
			continue
		}
		l.WithField("disks", n).Info("unlocked with its key file")
	}
}

func newUnlockCmd(e *env) *cobra.Command {
	var k keyFlags
	cmd := &cobra.Command{
		Use:   "unlock MOUNTPOINT/DISK --key-file F",
		Short: "Give a mount the key of an encrypted disk",
		Long: `Unlock gives the daemon serving the mount the key of the encrypted disk
MOUNTPOINT/DISK: the key file F is opened here and passed to the daemon as an
open file over the mount's control socket, which reads the key from it (F
must be 0600 or 0400 and yours). The disk, and every disk with the same key
(its clones and snapshots), can then be opened until the store is unmounted.
A wrong key is refused with exit code 16, and the disk stays locked.

Until then the disk is listed (vdisk ls shows it "locked") and can be
snapshotted, cloned, removed, defragmented and checked, but opening it fails
with ENOKEY ("Required key not available"). vdisk mount --key-dir DIR unlocks
every disk whose key file DIR/NAME.key it finds.`,
		Example: `  head -c 32 /dev/urandom > vm1.key && chmod 0400 vm1.key
  vdisk create /mnt/vdisks vm1.raw 20G --encrypt --key-file vm1.key
  vdisk unlock /mnt/vdisks/vm1.raw --key-file vm1.key`,
		Args: exactArgs("MOUNTPOINT/DISK"),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt, disk, err := mountedDisk(args[0])
			if err != nil {
				return usageErrorf("%v: unlock takes a disk of a mounted store", err)
			}
			f, err := openKeyFile(k.keyFile)
			if err != nil {
				return err
			}
			defer f.Close()
			n, err := telemetry.Unlock(mnt, disk, f)
			if err != nil {
				return fmt.Errorf("unlock %s: %w", args[0], err)
			}
			fmt.Fprintf(e.stdout, "unlocked %s (%d disk(s) with its key)\n", disk, n)
			return nil
		},
	}
	k.add(cmd, "the disk's key", false)
	return cmd
}

func newLockCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "lock MOUNTPOINT/DISK",
		Short: "Make a mount forget the key of an encrypted disk",
		Long: `Lock makes the daemon serving the mount forget the key of the encrypted disk
MOUNTPOINT/DISK, and so of every disk with the same key (its clones and
snapshots): they are locked again, as after the mount started, until vdisk
unlock. It is refused (EBUSY, "Device or resource busy") while any of them is
open. The daemon's memory of the key is released to the Go runtime, not
erased (AES key schedules live in its heap).`,
		Args: exactArgs("MOUNTPOINT/DISK"),
		RunE: func(cmd *cobra.Command, args []string) error {
			mnt, disk, err := mountedDisk(args[0])
			if err != nil {
				return usageErrorf("%v: lock takes a disk of a mounted store", err)
			}
			n, err := telemetry.Lock(mnt, disk)
			if err != nil {
				return fmt.Errorf("lock %s: %w", args[0], err)
			}
			fmt.Fprintf(e.stdout, "locked %s (%d disk(s) with its key)\n", disk, n)
			return nil
		},
	}
}

func newKeyCmd(e *env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key",
		Short: "List, add and remove the key slots of an encrypted disk",
		Long: `An encrypted disk's data key is random and never leaves the store in clear: it
is kept sealed in up to 8 key slots, each opened by a key file (or, for a
store that is not mounted, a passphrase). Adding a slot needs a key that
opens the disk already; removing one too (it may be the slot removed), and
the last slot is never removed. No data is rewritten: to rotate a key, add
the new one and remove the old one. A clone or snapshot made before the
change keeps its own slots.

DISK is MOUNTPOINT/DISK for a mounted store, or STORE DISK for one that is not
mounted.`,
	}
	var have, add keyFlags
	addCmd := &cobra.Command{
		Use:   "add MOUNTPOINT/DISK | STORE DISK",
		Short: "Add a key slot",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return keyRun(e, args, func(mnt, disk string) (string, error) {
				hf, err := openKeyFile(have.keyFile)
				if err != nil {
					return "", err
				}
				defer hf.Close()
				af, err := openKeyFile(add.keyFile)
				if err != nil {
					return "", err
				}
				defer af.Close()
				id, err := telemetry.AddKey(mnt, disk, hf, af)
				return fmt.Sprintf("added key slot %d to %s", id, disk), err
			}, func(s *image.Store, disk string) (string, error) {
				hs, err := have.secret(e)
				if err != nil {
					return "", err
				}
				defer hs.Close()
				as, err := add.secret(e)
				if err != nil {
					return "", err
				}
				defer as.Close()
				id, err := s.AddKey(disk, hs, as, crypt.Argon2Params{})
				return fmt.Sprintf("added key slot %d to %s", id, disk), err
			})
		},
	}
	have.add(addCmd, "a key that opens the disk", true)
	addCmd.Flags().StringVar(&add.keyFile, "new-key-file", "", "the key file to add")
	addCmd.Flags().StringVar(&add.passphraseFile, "new-passphrase-file", "", "the passphrase to add (first line of the file), for a store that is not mounted")

	var slot uint32
	rmCmd := &cobra.Command{
		Use:   "remove MOUNTPOINT/DISK | STORE DISK --slot ID",
		Short: "Remove a key slot",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			done := fmt.Sprintf("removed key slot %d", slot)
			return keyRun(e, args, func(mnt, disk string) (string, error) {
				hf, err := openKeyFile(have.keyFile)
				if err != nil {
					return "", err
				}
				defer hf.Close()
				return done, telemetry.RemoveKey(mnt, disk, hf, slot)
			}, func(s *image.Store, disk string) (string, error) {
				hs, err := have.secret(e)
				if err != nil {
					return "", err
				}
				defer hs.Close()
				return done, s.RemoveKey(disk, hs, slot)
			})
		},
	}
	have.add(rmCmd, "a key that opens the disk", true)
	rmCmd.Flags().Uint32Var(&slot, "slot", 0, "the slot to remove (vdisk key list)")
	rmCmd.MarkFlagRequired("slot")

	listCmd := &cobra.Command{
		Use:   "list MOUNTPOINT/DISK | STORE DISK",
		Short: "List the key slots (no key needed)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var slots []image.KeySlot
			err := keyRun(e, args, func(mnt, disk string) (string, error) {
				var err error
				slots, err = telemetry.KeySlots(mnt, disk)
				return "", err
			}, func(s *image.Store, disk string) (string, error) {
				var err error
				slots, err = s.KeySlots(disk)
				return "", err
			})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "SLOT\tKIND\tARGON2ID")
			for _, sl := range slots {
				cost := "-"
				if sl.Kind == crypt.KindPassphrase.String() {
					cost = fmt.Sprintf("t=%d m=%dKiB p=%d", sl.Argon2.Time, sl.Argon2.MemoryKiB, sl.Argon2.Threads)
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\n", sl.ID, sl.Kind, cost)
			}
			return tw.Flush()
		},
	}
	cmd.AddCommand(addCmd, rmCmd, listCmd)
	return cmd
}

// keyRun runs a key command on MOUNTPOINT/DISK (mounted) or STORE DISK (a
// store it opens), and prints what it says it did.
func keyRun(e *env, args []string, mounted func(mnt, disk string) (string, error), offline func(s *image.Store, disk string) (string, error)) (err error) {
	var msg string
	if len(args) == 1 {
		mnt, disk, merr := mountedDisk(args[0])
		if merr != nil {
			return usageErrorf("%v; for a store that is not mounted: STORE DISK", merr)
		}
		msg, err = mounted(mnt, disk)
	} else {
		s, oerr := e.openStore(args[0], "key", false)
		if oerr != nil {
			return oerr
		}
		defer e.closeStore(s, &err)
		msg, err = offline(s, args[1])
	}
	if err != nil {
		return err
	}
	if msg != "" {
		fmt.Fprintln(e.stdout, msg)
	}
	return nil
}

// createEncrypted is vdisk create --encrypt: through the mount's socket
// with the key file passed open, or in the store this process opened.
func createEncrypted(e *env, a storeAccess, name string, size int64, mode uint32, k *keyFlags) error {
	switch a := a.(type) {
	case mountedStore:
		f, err := openKeyFile(k.keyFile)
		if err != nil {
			return err
		}
		defer f.Close()
		if _, err := telemetry.CreateEncrypted(a.mnt, name, size, mode&0o7777, f); err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
	case offlineStore:
		key, err := k.secret(e)
		if err != nil {
			return err
		}
		defer key.Close()
		attr := image.Attr{Mode: mode & 0o7777, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}
		if _, err := a.s.CreateEncrypted(name, size, attr, key, crypt.Argon2Params{}); err != nil {
			return err
		}
	default:
		return fmt.Errorf("create %s: cannot encrypt here", name)
	}
	fmt.Fprintf(e.stdout, "created %s: %s, encrypted\n", name, formatSizeExact(size))
	return nil
}

// receiveMounted is vdisk receive through a mount: with --encrypt, the key
// file goes to the daemon open with the stream.
func receiveMounted(mnt, name string, in io.Reader, o transfer.ReceiveOptions, encrypt bool, k *keyFlags) (transfer.Stats, error) {
	if !encrypt {
		return telemetry.Receive(mnt, name, in, o)
	}
	f, err := openKeyFile(k.keyFile)
	if err != nil {
		return transfer.Stats{}, err
	}
	defer f.Close()
	return telemetry.ReceiveEncrypted(mnt, name, in, o, f)
}

// encryptionColumn is what vdisk ls adds to its header and to the line of
// disk d: nothing unless the store holds encrypted disks (any), else an
// ENCRYPTION column.
func encryptionColumn(any bool, d *image.DiskInfo) string {
	switch {
	case !any:
		return ""
	case d == nil:
		return "\tENCRYPTION"
	}
	return "\t" + encryptionOf(*d)
}

// anyEncrypted reports whether disks holds an encrypted disk.
func anyEncrypted(disks []image.DiskInfo) bool {
	for _, d := range disks {
		if d.Encrypted {
			return true
		}
	}
	return false
}

// SendRaw is `vdisk send --raw` given a mounted disk.
func (m mountSource) SendRaw(w io.Writer, disk, from string) (transfer.Stats, error) {
	return m.srv.SendRaw(w, disk, from)
}
