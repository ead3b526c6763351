package iouring

import (
	"testing"
	"time"
)

// TestYielder: a new Yielder is due at once, and is due again once
// yieldEvery has passed since its Yield.
func TestYielder(t *testing.T) {
	var y Yielder
	if !y.Due() {
		t.Fatal("a new Yielder is not due")
	}
	y.Yield()
	time.Sleep(yieldEvery)
	if !y.Due() {
		t.Fatalf("not due %v after its Yield", yieldEvery)
	}
}
