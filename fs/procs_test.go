package fs

import (
	"os"
	"runtime"
	"testing"
)

func TestTuneRuntime(t *testing.T) {
	orig := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(orig) })
	env, hadEnv := os.LookupEnv("GOMAXPROCS")
	t.Cleanup(func() {
		if hadEnv {
			os.Setenv("GOMAXPROCS", env)
		} else {
			os.Unsetenv("GOMAXPROCS")
		}
	})

	os.Unsetenv("GOMAXPROCS")
	runtime.GOMAXPROCS(2)
	if got := TuneRuntime(); got != MinProcs || runtime.GOMAXPROCS(0) != MinProcs {
		t.Errorf("from 2: TuneRuntime = %d, GOMAXPROCS = %d; want both %d", got, runtime.GOMAXPROCS(0), MinProcs)
	}

	runtime.GOMAXPROCS(MinProcs + 4)
	if got := TuneRuntime(); got != MinProcs+4 || runtime.GOMAXPROCS(0) != MinProcs+4 {
		t.Errorf("from %d: TuneRuntime = %d, GOMAXPROCS = %d; want both unchanged", MinProcs+4, got, runtime.GOMAXPROCS(0))
	}

	// The operator's GOMAXPROCS wins, even below MinProcs.
	os.Setenv("GOMAXPROCS", "3")
	runtime.GOMAXPROCS(3)
	if got := TuneRuntime(); got != 3 || runtime.GOMAXPROCS(0) != 3 {
		t.Errorf("GOMAXPROCS=3 in the environment: TuneRuntime = %d, GOMAXPROCS = %d; want both 3", got, runtime.GOMAXPROCS(0))
	}
}
