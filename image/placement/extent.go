package placement

// Extent is a run of Len physical blocks from Start.
type Extent struct {
	Start, Len uint64
}

// End returns the first block after e.
func (e Extent) End() uint64 { return e.Start + e.Len }
