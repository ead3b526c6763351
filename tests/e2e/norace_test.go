//go:build !race

package e2e

// raceEnabled: the tests are built with -race, and so is the daemon.
const raceEnabled = false
