//go:build !race

package coalesce

// raceEnabled is true under -race; see race_on_test.go.
const raceEnabled = false
