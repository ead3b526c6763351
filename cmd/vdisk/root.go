package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/sirupsen/logrus"
	"github.com/spf13/cobra"
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
}

func newEnv(stdout, stderr io.Writer, isTerminal bool) *env {
	log := logrus.New()
	log.SetOutput(stderr)
	log.SetLevel(logrus.WarnLevel)
	return &env{stdout: stdout, stderr: stderr, log: log, isTerminal: isTerminal}
}

// newRootCmd builds the vdisk command tree.
func newRootCmd(e *env) *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:   "vdisk",
		Short: "Manage vdiskfs stores: virtual disks kept in one file or block device",
		Long: `vdisk manages vdiskfs stores. A store is one backing file or block device
holding many virtual disks; "vdisk mount" shows each disk as a raw image file.
The other commands work offline, on a store that is not mounted.

Sizes take the suffixes K, M, G, T, P, E (powers of 1024; KiB, MiB, ... too).

Exit codes: 0 success (fsck: clean); 1 fsck repaired every finding;
2 fsck found only leaked blocks; 4 fsck left errors uncorrected;
8 operational error (cannot open the store, I/O error, bad arguments).`,
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			lvl, err := logrus.ParseLevel(logLevel)
			if err != nil {
				return usageErrorf("--log-level %q: want one of panic, fatal, error, warn, info, debug, trace", logLevel)
			}
			e.log.SetLevel(lvl)
			return nil
		},
	}
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.CompletionOptions.HiddenDefaultCmd = true
	root.PersistentFlags().StringVar(&logLevel, "log-level", "warn", "log level: error, warn, info, debug, trace")
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
		newImportCmd(e),
		newExportCmd(e),
		newFsckCmd(e),
		newStatsCmd(e),
		newSyncCmd(e),
	)
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

// exactArgs is cobra.ExactArgs naming the expected arguments in the error.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return fmt.Errorf("%s takes %d arguments (%s), got %d", cmd.CommandPath(), len(names), strings.Join(names, " "), len(args))
		}
		return nil
	}
}
