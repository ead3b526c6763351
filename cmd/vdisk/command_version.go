package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// The on-disk format versions of this build: the one it writes and those it
// reads. They mirror image's unexported formatVersion, sharedVersion and
// cryptVersion (image/format.go): a new store is version 1, becomes 2 on
// its first clone or snapshot (or vdisk upgrade), and 3 on its first
// encrypted disk. TestVersionFormatMatchesStore
// checks them against a freshly formatted store.
const formatVersionWritten = 1

var formatVersionsRead = []int{1, 2, 3}

// buildVersion and buildRevision may be set at link time (the Makefile does,
// with -ldflags -X, from git describe and git rev-parse) for builds whose
// binary carries no VCS stamp (go build -buildvcs=false, a git worktree).
// The Go build information wins when it has them.
var (
	buildVersion  string
	buildRevision string
)

// versionInfo is what vdisk --version and vdisk version --json say.
type versionInfo struct {
	Version       string `json:"version"`
	Revision      string `json:"revision"`
	RevisionTime  string `json:"revision_time,omitempty"`
	Modified      bool   `json:"modified"`
	GoVersion     string `json:"go_version"`
	Platform      string `json:"platform"`
	FormatWritten int    `json:"format_version_written"`
	FormatsRead   []int  `json:"format_versions_read"`
}

// buildVersionInfo reads the version from the binary's build information
// (runtime/debug.ReadBuildInfo): the main module's version and the VCS
// stamp, falling back to the link-time values, else "(devel)"/"unknown".
func buildVersionInfo() versionInfo {
	vi := versionInfo{
		Version:       "(devel)",
		Revision:      "unknown",
		GoVersion:     runtime.Version(),
		Platform:      runtime.GOOS + "/" + runtime.GOARCH,
		FormatWritten: formatVersionWritten,
		FormatsRead:   formatVersionsRead,
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v := bi.Main.Version; v != "" && v != "(devel)" {
			vi.Version = v
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				vi.Revision = s.Value
			case "vcs.time":
				vi.RevisionTime = s.Value
			case "vcs.modified":
				vi.Modified = s.Value == "true"
			}
		}
	}
	if vi.Version == "(devel)" && buildVersion != "" {
		vi.Version = buildVersion
	}
	if vi.Revision == "unknown" && buildRevision != "" {
		vi.Revision = strings.TrimSuffix(buildRevision, "-dirty")
		vi.Modified = vi.Modified || strings.HasSuffix(buildRevision, "-dirty")
	}
	return vi
}

// text is the --version output, a cobra version template (so without
// template actions of its own).
func (vi versionInfo) text() string {
	rev := vi.Revision
	if vi.Modified {
		rev += " (modified)"
	}
	if vi.RevisionTime != "" {
		rev += ", " + vi.RevisionTime
	}
	reads := make([]string, len(vi.FormatsRead))
	for i, v := range vi.FormatsRead {
		reads[i] = fmt.Sprint(v)
	}
	return fmt.Sprintf("vdisk %s\nrevision %s\n%s %s\non-disk format: writes version %d (2 once a store shares blocks), reads versions %s\n",
		vi.Version, rev, vi.GoVersion, vi.Platform, vi.FormatWritten, strings.Join(reads, ", "))
}

func newVersionCmd(e *env) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, VCS revision, Go version and on-disk format versions",
		Args:  exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			vi := buildVersionInfo()
			if asJSON {
				return writeJSON(e, vi)
			}
			_, err := fmt.Fprint(e.stdout, vi.text())
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}
