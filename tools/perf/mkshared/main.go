// Command mkshared makes the store tools/perf/cow.sh measures, through the
// image API (no mount): src.raw, GIB GiB written in full with a pattern,
// src-snap, a snapshot of it (so every block of src.raw is shared, and each
// first write to src.raw is a copy-on-write), and hole.raw and hole2.raw,
// GIB GiB of holes each (hole2.raw is for cow.sh's A/A control). The store
// file is new, 4×GIB+1 GiB, sparse.
//
//	mkshared [-gib N] STORE       make it (STORE must not exist)
//	mkshared -check STORE         after a run, offline: Check must be clean,
//	                              src-snap must still hold the pattern, and
//	                              src.raw and hole.raw must be fully mapped,
//	                              nothing shared any more (src.raw's every
//	                              block was copied on write)
//	mkshared -check -control STORE  the same after an A/A control run:
//	                              hole.raw and hole2.raw fully mapped,
//	                              src.raw untouched (all of it shared)
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/ncw/directio"
	"github.com/sirupsen/logrus"

	"github.com/vdiskfs/vdiskfs/image"
)

const (
	chunk   = 1 << 20
	writers = 4
)

func main() {
	gib := flag.Int64("gib", 2, "size of src.raw and hole.raw in GiB")
	check := flag.Bool("check", false, "check a store after a run instead of making one")
	control := flag.Bool("control", false, "with -check: after an A/A control run (hole2.raw written, src.raw not)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: mkshared [-gib N] STORE | mkshared -check [-control] STORE")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 1 || *gib <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	var err error
	if *check {
		err = checkStore(flag.Arg(0), *control)
	} else {
		err = makeStore(flag.Arg(0), *gib<<30)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkshared:", err)
		os.Exit(1)
	}
}

func quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// pattern fills p, the chunk at byte off of src.raw, with a pattern that
// names the offset of every 8 bytes (never zero).
func pattern(p []byte, off int64) {
	for i := 0; i < len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], uint64(off+int64(i))|1<<63)
	}
}

func makeStore(path string, size int64) error {
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s exists; mkshared makes a new store", path)
	}
	if err := image.FormatPath(path, 4*size+1<<30, image.FormatOptions{}); err != nil {
		return err
	}
	s, err := image.OpenPath(path, image.Options{CommitInterval: -1, Logger: quiet()})
	if err != nil {
		return err
	}
	start := time.Now()
	if err := fill(s, size); err != nil {
		s.Close()
		return err
	}
	if err := s.Commit(); err != nil {
		s.Close()
		return err
	}
	wrote := time.Since(start)
	if _, err := s.Snapshot("src.raw", "src-snap"); err != nil {
		s.Close()
		return err
	}
	for _, name := range []string{"hole.raw", "hole2.raw"} {
		if _, err := s.Create(name, size, image.Attr{Mode: 0o644}); err != nil {
			s.Close()
			return err
		}
	}
	if err := s.Close(); err != nil {
		return err
	}
	fmt.Printf("mkshared: %s: src.raw %d GiB written in %v, snapshot src-snap, hole.raw and hole2.raw %d GiB of holes\n",
		path, size>>30, wrote.Round(time.Millisecond), size>>30)
	return nil
}

// fill creates src.raw of size bytes and writes all of it, writers at once
// over equal parts.
func fill(s *image.Store, size int64) error {
	if _, err := s.Create("src.raw", size, image.Attr{Mode: 0o644}); err != nil {
		return err
	}
	d, err := s.OpenDisk("src.raw")
	if err != nil {
		return err
	}
	defer d.Close()
	part := size / writers / chunk * chunk
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		lo, hi := int64(w)*part, int64(w+1)*part
		if w == writers-1 {
			hi = size
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := directio.AlignedBlock(chunk)
			for off := lo; off < hi; off += chunk {
				b := buf[:min(chunk, hi-off)]
				pattern(b, off)
				if _, err := d.WriteAt(b, off); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func checkStore(path string, control bool) error {
	s, err := image.OpenPath(path, image.Options{CommitInterval: -1, ReadOnly: true, Logger: quiet()})
	if err != nil {
		return err
	}
	defer s.Close()
	if rep := s.Check(); !rep.Clean() {
		return fmt.Errorf("check: %d finding(s), first: %s", len(rep.Findings), rep.Findings[0])
	}
	written, untouched := []string{"src.raw", "hole.raw"}, "hole2.raw"
	if control {
		written, untouched = []string{"hole2.raw", "hole.raw"}, "src.raw"
	}
	extents := map[string]int{}
	for _, name := range append(written, untouched) {
		info, err := s.Stat(name)
		if err != nil {
			return err
		}
		extents[name] = info.Extents
		wantMapped, wantShared := info.Size, int64(0)
		switch {
		case name == untouched && name == "src.raw":
			wantShared = info.Size // still all shared with src-snap
		case name == untouched:
			wantMapped = 0
		}
		if info.Allocated != wantMapped || info.Shared != wantShared {
			return fmt.Errorf("%s: %d of %d bytes mapped, %d shared; want %d mapped, %d shared", info.Name, info.Allocated, info.Size, info.Shared, wantMapped, wantShared)
		}
	}
	// The snapshot still holds the pattern: one 4 KiB block per MiB.
	d, err := s.OpenDisk("src-snap")
	if err != nil {
		return err
	}
	defer d.Close()
	got, want := directio.AlignedBlock(4096), make([]byte, 4096)
	for off := int64(0); off < d.Size(); off += chunk {
		at := off + (off/chunk*4096)%chunk
		if _, err := d.ReadAt(got, at); err != nil {
			return err
		}
		pattern(want, at)
		if string(got) != string(want) {
			return fmt.Errorf("src-snap: the 4 KiB at %d lost the pattern", at)
		}
	}
	fmt.Printf("mkshared: %s: clean; %s (%d extents) and %s (%d) fully written, %s untouched, src-snap intact\n",
		path, written[0], extents[written[0]], written[1], extents[written[1]], untouched)
	return nil
}
