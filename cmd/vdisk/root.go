package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

// env is everything a command may touch outside its arguments: there is no
// global state, so tests run commands in process with their own writers.
type env struct {
	stdout, stderr io.Writer
	log            *logrus.Logger
	// isTerminal: stderr is a terminal, so long copies show a progress bar.
	isTerminal bool
	// started is set when a command's RunE begins: an error before that is
	// a usage error (cobra rejected the arguments) and gets the usage text.
	started bool
	// logFormat is --log-format: "text" or "json".
	logFormat string
	// closeWait bounds the wait for a mount daemon that was unmounted and
	// is still closing the store (see holder.go).
	closeWait time.Duration
	// ceph is --ceph-conf and --ceph-user of the command that runs (ceph.go).
	ceph cephFlags
}

func newEnv(stdout, stderr io.Writer, isTerminal bool) *env {
	log := logrus.New()
	log.SetOutput(stderr)
	log.SetLevel(logrus.WarnLevel)
	log.SetFormatter(textFormatter(stderr))
	return &env{stdout: stdout, stderr: stderr, log: log, isTerminal: isTerminal, logFormat: "text", closeWait: closeWait}
}

// setLogFormat makes e.log write "text" (logrus's key=value lines) or
// "json" (one JSON object per line, for log shippers).
func (e *env) setLogFormat(format string) error {
	switch format {
	case "text":
		e.log.SetFormatter(textFormatter(e.log.Out))
	case "json":
		e.log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return usageErrorf("--log-format %q: want text or json", format)
	}
	e.logFormat = format
	return nil
}

// textFormatter is the text log format. Written to the journal (systemd
// names the stream in $JOURNAL_STREAM), it leaves out the timestamp, which
// journalctl shows already; elsewhere it is logrus's default text format.
func textFormatter(w io.Writer) logrus.Formatter {
	return &logrus.TextFormatter{DisableTimestamp: toJournal(w)}
}

// toJournal reports whether w is the stream systemd connected to the journal:
// $JOURNAL_STREAM is "DEVICE:INODE" of that stream.
func toJournal(w io.Writer) bool {
	js := os.Getenv("JOURNAL_STREAM")
	f, ok := w.(*os.File)
	if js == "" || !ok {
		return false
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return false
	}
	return js == fmt.Sprintf("%d:%d", st.Dev, st.Ino)
}

// newRootCmd builds the vdisk command tree.
func newRootCmd(e *env) *cobra.Command {
	var logLevel, logFormat string
	vi := buildVersionInfo()
	root := &cobra.Command{
		Use:   "vdisk",
		Short: "Manage vdiskfs stores: virtual disks kept in one file or block device",
		Long: `vdisk manages vdiskfs stores. A store is one backing file or block device
holding many virtual disks; "vdisk mount" shows each disk as a raw image file.
ls, info, fsck, create, rm, rename, resize, import, export and defrag take a
store or the mount point of a mounted one (given a mounted store's path,
they go through its mount); stats, sync, umount and, given MOUNTPOINT/DISK,
snapshot, clone, diff, send and receive ask a running mount; the rest work
on a store that is not mounted.

Sizes take the suffixes K, M, G, T, P, E (powers of 1024; KiB, MiB, ... too).

Exit codes: 0 success (fsck: clean); 1 fsck repaired every finding;
2 fsck found only leaked blocks; 4 fsck left errors uncorrected;
8 operational error (cannot open the store, I/O error, bad arguments).`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Version:       vi.Version,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			lvl, err := parseLogLevel(logLevel)
			if err != nil {
				return err
			}
			e.log.SetLevel(lvl)
			return e.setLogFormat(logFormat)
		},
	}
	root.SetVersionTemplate(vi.text())
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.CompletionOptions.HiddenDefaultCmd = true
	root.PersistentFlags().StringVar(&logLevel, "log-level", "warn", "log level: error, warn, info, debug, trace")
	root.PersistentFlags().StringVar(&logFormat, "log-format", "text", "log format: text (key=value lines) or json (one object per line)")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })

	root.AddCommand(
		newFormatCmd(e),
		newMountCmd(e),
		newCreateCmd(e),
		newLsCmd(e),
		newInfoCmd(e),
		newRmCmd(e),
		newResizeCmd(e),
		newRenameCmd(e),
		newSnapshotCmd(e),
		newCloneCmd(e),
		newUpgradeCmd(e),
		newImportCmd(e),
		newExportCmd(e),
		newFsckCmd(e),
		newDefragCmd(e),
		newDiffCmd(e),
		newSendCmd(e),
		newReceiveCmd(e),
		newStatsCmd(e),
		newVhostUserCmd(e),
		newSyncCmd(e),
		newUmountCmd(e),
		newVersionCmd(e),
		newGendocsCmd(e),
		newUnlockCmd(e),
		newLockCmd(e),
		newKeyCmd(e),
	)
	for _, c := range root.Commands() {
		if storeCommands[c.Name()] {
			addStoreFlags(e, c)
		}
	}
	markStart(e, root)
	return root
}

// markStart wraps the RunE of c and of every command under it so that
// e.started is set when the command itself begins.
func markStart(e *env, c *cobra.Command) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			e.started = true
			return run(cmd, args)
		}
	}
	for _, sub := range c.Commands() {
		markStart(e, sub)
	}
}

// parseLogLevel parses a --log-level value.
func parseLogLevel(s string) (logrus.Level, error) {
	lvl, err := logrus.ParseLevel(s)
	if err != nil {
		return 0, usageErrorf("--log-level %q: want one of panic, fatal, error, warn, info, debug, trace", s)
	}
	return lvl, nil
}

// exactArgs is cobra.ExactArgs naming the expected arguments in the error.
// rangeArgs accepts from min arguments to all of names (the rest optional).
func rangeArgs(min int, names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || len(args) > len(names) {
			return fmt.Errorf("%s takes %d to %d arguments (%s), got %d", cmd.CommandPath(), min, len(names), strings.Join(names, " "), len(args))
		}
		return nil
	}
}

func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return fmt.Errorf("%s takes %d arguments (%s), got %d", cmd.CommandPath(), len(names), strings.Join(names, " "), len(args))
		}
		return nil
	}
}
