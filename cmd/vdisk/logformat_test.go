package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// --log-format json makes every log line one JSON object (logrus's
// JSONFormatter) with the structured fields; the default is logrus's text.
func TestLogFormat(t *testing.T) {
	for _, format := range []string{"json", "text"} {
		t.Run(format, func(t *testing.T) {
			store := newStore(t)
			mnt, exit := mountInProcess(t, "--log-level", "info", "--log-format", format, store, filepath.Join(t.TempDir(), "mnt"))
			if err := unix.Unmount(mnt, 0); err != nil {
				t.Fatal(err)
			}
			res := <-exit
			if res.code != 0 {
				t.Fatalf("mount exited %d: %s", res.code, res.stderr)
			}
			served := false
			for _, line := range strings.Split(strings.TrimSpace(res.stderr), "\n") {
				if format == "text" {
					served = served || strings.Contains(line, `level=info msg=serving`) && strings.Contains(line, "mountpoint="+mnt)
					continue
				}
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("not a JSON line: %q: %v", line, err)
				}
				if rec["level"] == nil || rec["msg"] == nil || rec["time"] == nil {
					t.Errorf("JSON line lacks level, msg or time: %q", line)
				}
				served = served || rec["msg"] == "serving" && rec["mountpoint"] == mnt
			}
			if !served {
				t.Errorf("no %q line with the mount point in:\n%s", "serving", res.stderr)
			}
		})
	}
	wantFail(t, exitFailure, []string{"--log-format", "text or json"}, "--log-format", "xml", "ls", "x")
}
