package tcgguest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// Apt runs apt-get: package downloads (never installed) and, for callers
// that install missing tools, installs. The package lists are updated at
// most once per Apt, and only when a download or an install needs it.
type Apt struct {
	mu      sync.Mutex // serializes Update; guards updated
	updated bool
}

// aptArgs wait for the dpkg lock (other jobs on the machine may hold it)
// and let root download into any directory without the _apt sandbox.
var aptArgs = []string{"-o", "DPkg::Lock::Timeout=300", "-o", "APT::Sandbox::User=root"}

// aptCommand is apt-get with args, never asking.
func aptCommand(args ...string) *exec.Cmd {
	cmd := exec.Command("apt-get", append(append([]string{}, aptArgs...), args...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	return cmd
}

// Update runs apt-get update the first time it is called.
func (a *Apt) Update() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.updated {
		return nil
	}
	if out, err := aptCommand("update", "-qq").CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get update: %w\n%s", err, out)
	}
	a.updated = true
	return nil
}

// Install installs pkgs (without recommends), updating the package lists
// first.
func (a *Apt) Install(pkgs ...string) error {
	if err := a.Update(); err != nil {
		return err
	}
	args := append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)
	if out, err := aptCommand(args...).CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get install %v: %w\n%s", pkgs, err, out)
	}
	return nil
}

// Download fetches one package's .deb into dir and returns its path. Stale
// package lists are updated once and the download tried again.
func (a *Apt) Download(pkg, dir string) (string, error) {
	for attempt := 0; ; attempt++ {
		cmd := aptCommand("download", "-qq", pkg)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err == nil {
			break
		}
		if attempt > 0 {
			return "", fmt.Errorf("apt-get download %s: %w\n%s", pkg, err, out)
		}
		if err := a.Update(); err != nil {
			return "", err
		}
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	if len(debs) != 1 {
		return "", fmt.Errorf("apt-get download %s left %v", pkg, debs)
	}
	return debs[0], nil
}

// kernelPackage resolves linux-image-amd64 to the versioned package it
// depends on (the current linux-image-6.x-amd64), updating the package
// lists once if they lack it.
func (a *Apt) kernelPackage() (string, error) {
	for attempt := 0; attempt < 2; attempt++ {
		out, _ := exec.Command("apt-cache", "depends", "linux-image-amd64").Output()
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(strings.TrimLeft(strings.TrimSpace(line), "|"))
			if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") && !strings.HasPrefix(f[1], "<") {
				return f[1], nil
			}
		}
		if err := a.Update(); err != nil {
			return "", err
		}
	}
	return "", fmt.Errorf("apt-cache depends linux-image-amd64 names no linux-image-* package, even after apt-get update")
}
