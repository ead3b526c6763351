package backend

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestPageImageAgainstModel runs random writes, zeroings and clones against
// plain byte slices. Every clone continues on its own with random writes,
// and must never see writes made to its relatives.
func TestPageImageAgainstModel(t *testing.T) {
	const size = 5*pageSize + 1000 // a partial last page
	rng := rand.New(rand.NewPCG(3, 3))
	images := []*pageImage{newPageImage(size)}
	models := [][]byte{make([]byte, size)}

	for step := range 3000 {
		k := rng.IntN(len(images))
		im, model := images[k], models[k]
		off := int64(rng.IntN(size))
		n := int64(rng.IntN(min(size-int(off), 3*pageSize) + 1))
		switch r := rng.IntN(10); {
		case r < 5:
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(1 + rng.IntN(255))
			}
			im.writeAt(p, off)
			copy(model[off:], p)
		case r < 7:
			im.zero(off, n)
			clear(model[off : off+n])
		case r < 8 && len(images) < 8:
			images = append(images, im.clone())
			models = append(models, bytes.Clone(model))
		default:
			got := make([]byte, n)
			for i := range got {
				got[i] = 0xee // readAt must overwrite all of it
			}
			im.readAt(got, off)
			if !bytes.Equal(got, model[off:off+n]) {
				t.Fatalf("step %d image %d: readAt(%d, %d) differs from the model", step, k, off, n)
			}
		}
	}
	for k, im := range images {
		if !bytes.Equal(im.bytes(), models[k]) {
			t.Errorf("image %d differs from its model", k)
		}
	}

	// Whole zero pages are dropped, and newPageImageFrom keeps zeros sparse.
	im := newPageImageFrom(models[0])
	im.zero(0, size)
	for i, pg := range im.pages[:len(im.pages)-1] {
		if pg != nil {
			t.Errorf("page %d of a zeroed image is still allocated", i)
		}
	}
	if sparse := newPageImageFrom(make([]byte, 1<<20)); sparse.pages[0] != nil {
		t.Error("newPageImageFrom allocated a page of zeros")
	}
}
