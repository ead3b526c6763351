// Command vdisk is the one command-line tool of vdiskfs: it formats a store,
// mounts it, and manages, checks and repairs it offline.
//
// Every subcommand lives in its own command_<name>.go and writes only to the
// writers in its env, so tests run the whole CLI in process through run. Exit
// codes are listed in exitcodes.go.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/term"

	"github.com/vdiskfs/vdiskfs/image"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args (without the program name), writing to
// stdout and stderr, and returns the process exit code.
func run(args []string, stdout, stderr io.Writer) int {
	e := newEnv(stdout, stderr, isTerminal(stderr))
	root := newRootCmd(e)
	if args == nil {
		args = []string{} // nil would make cobra read os.Args
	}
	if margs, ok := mountHelperArgs(root, args); ok {
		args = margs // run by mount.fuse3 for mount -t fuse.vdisk (mountopts.go)
	}
	root.SetArgs(args)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	var ce *exitCodeError
	if errors.As(err, &ce) {
		if ce.err != nil {
			fmt.Fprintf(stderr, "vdisk: %v\n", ce.err)
		}
		return ce.code
	}
	fmt.Fprintf(stderr, "vdisk: %v\n", err)
	switch {
	case errors.Is(err, image.ErrWrongKey):
		return exitWrongKey
	case errors.Is(err, image.ErrLocked):
		return exitLocked
	}
	var ue usageError
	if !e.started || errors.As(err, &ue) {
		// Cobra rejected the arguments or flags before the command ran.
		fmt.Fprint(stderr, cmd.UsageString())
	}
	return exitFailure
}

// isTerminal reports whether w is a terminal, for progress bars.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
