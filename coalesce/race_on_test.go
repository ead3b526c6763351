//go:build race

package coalesce

// raceEnabled is true under -race. sync.Pool then drops a random share of
// Puts on purpose, so allocation counts of the pool are not meaningful.
const raceEnabled = true
