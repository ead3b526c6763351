package backend

// pageImage is the in-memory image under Mem and Crash: a copy-on-write array
// of 4 KiB pages. A nil page reads as zeros, so a large, mostly empty image
// costs little memory. clone is O(number of pages) and shares every page;
// after it, a write to a shared page copies the page first. This is what lets
// Crash hand out the state after a power cut as a Mem without copying the
// whole image, which matters under the race detector, where a crash test's
// many copies of a whole image would dominate its run time.
//
// A pageImage is not safe for concurrent use; its owner (Mem, Crash) locks.
type pageImage struct {
	size  int64
	pages []*page // pages[i] holds bytes [i*pageSize, (i+1)*pageSize); nil is zeros
	owned []bool  // owned[i]: pages[i] belongs to this image alone and may be written in place
}

const pageSize = 4096

type page [pageSize]byte

func newPageImage(size int64) *pageImage {
	n := (size + pageSize - 1) / pageSize
	return &pageImage{size: size, pages: make([]*page, n), owned: make([]bool, n)}
}

// newPageImageFrom returns an image holding a copy of data. Pages of zeros
// stay nil.
func newPageImageFrom(data []byte) *pageImage {
	im := newPageImage(int64(len(data)))
	for i := range im.pages {
		chunk := data[i*pageSize : min((i+1)*pageSize, len(data))]
		if !isZero(chunk) {
			im.pages[i] = new(page)
			copy(im.pages[i][:], chunk)
			im.owned[i] = true
		}
	}
	return im
}

// clone returns an image with the same contents, sharing all pages: from now
// on, im and the clone both copy a page before writing to it.
func (im *pageImage) clone() *pageImage {
	clear(im.owned)
	return &pageImage{size: im.size, pages: append([]*page(nil), im.pages...), owned: make([]bool, len(im.pages))}
}

// readAt copies the bytes at off into p. The caller checks the range.
func (im *pageImage) readAt(p []byte, off int64) {
	for len(p) > 0 {
		i, in := off/pageSize, off%pageSize
		n := min(int64(len(p)), pageSize-in)
		if pg := im.pages[i]; pg != nil {
			copy(p[:n], pg[in:])
		} else {
			clear(p[:n])
		}
		p, off = p[n:], off+n
	}
}

// writeAt copies p to off. The caller checks the range.
func (im *pageImage) writeAt(p []byte, off int64) {
	for len(p) > 0 {
		i, in := off/pageSize, off%pageSize
		n := copy(im.writablePage(i)[in:], p)
		p, off = p[n:], off+int64(n)
	}
}

// zero makes [off, off+n) read as zeros, dropping whole pages. The caller
// checks the range.
func (im *pageImage) zero(off, n int64) {
	for n > 0 {
		i, in := off/pageSize, off%pageSize
		step := min(n, pageSize-in)
		switch {
		case step == pageSize:
			im.pages[i], im.owned[i] = nil, false
		case im.pages[i] != nil:
			clear(im.writablePage(i)[in : in+step])
		}
		off, n = off+step, n-step
	}
}

// writablePage returns page i, made private to im (copied if shared,
// allocated if nil).
func (im *pageImage) writablePage(i int64) *page {
	if !im.owned[i] {
		pg := new(page)
		if im.pages[i] != nil {
			*pg = *im.pages[i]
		}
		im.pages[i], im.owned[i] = pg, true
	}
	return im.pages[i]
}

// bytes returns the whole image as one new slice.
func (im *pageImage) bytes() []byte {
	b := make([]byte, im.size)
	for i, pg := range im.pages {
		if pg != nil {
			copy(b[i*pageSize:], pg[:])
		}
	}
	return b
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
