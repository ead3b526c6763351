package loadgen

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Shape is what one run does.
type Shape struct {
	Write     bool
	Random    bool
	BS        int
	Depth     int
	Runtime   time.Duration // 0: no limit (one pass over the file)
	Ramp      time.Duration // unmeasured start
	TimeBased bool          // run for Runtime, wrapping at the file's end
	Seed      uint64
}

// ParseShape reads the shape of a fio job's text (its globals and its one
// job section, ${VARS} expanded). The last value of an option wins, as in
// fio.
func ParseShape(text string) (Shape, error) {
	s := Shape{BS: 4096, Depth: 1, Seed: 1}
	rw := "read"
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == ';' || line[0] == '#' || line[0] == '[' {
			continue
		}
		key, val, _ := strings.Cut(line, "=")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		var err error
		switch key {
		case "rw", "readwrite":
			rw = val
		case "bs", "blocksize":
			var n int64
			n, err = parseBytes(val)
			s.BS = int(n)
		case "iodepth":
			s.Depth, err = strconv.Atoi(val)
		case "runtime":
			s.Runtime, err = parseSeconds(val)
		case "ramp_time":
			s.Ramp, err = parseSeconds(val)
		case "time_based":
			s.TimeBased = val == "" || val == "1"
		case "randseed":
			s.Seed, err = strconv.ParseUint(val, 10, 64)
		case "numjobs":
			if val != "1" {
				err = fmt.Errorf("the generator runs one job")
			}
		case "direct":
			if val != "1" {
				err = fmt.Errorf("the generator does direct I/O only")
			}
		case "size", "offset", "filesize", "io_size", "number_ios", "rwmixread", "rwmixwrite", "bssplit", "bsrange",
			"fsync", "fdatasync", "sync", "verify", "zonemode", "rate", "rate_iops", "thinktime":
			err = fmt.Errorf("the generator does not reproduce it")
		}
		if err != nil {
			return Shape{}, fmt.Errorf("fio option %s=%s: %w", key, val, err)
		}
	}
	switch rw {
	case "read":
	case "write":
		s.Write = true
	case "randread":
		s.Random = true
	case "randwrite":
		s.Write, s.Random = true, true
	default:
		return Shape{}, fmt.Errorf("fio option rw=%s: the generator does read, write, randread and randwrite", rw)
	}
	if s.BS < 512 || s.BS%512 != 0 || s.Depth < 1 || s.Depth > 1024 {
		return Shape{}, fmt.Errorf("bs=%d iodepth=%d: want a multiple of 512 and 1 to 1024 in flight", s.BS, s.Depth)
	}
	if s.TimeBased && s.Runtime == 0 {
		return Shape{}, fmt.Errorf("time_based without runtime")
	}
	return s, nil
}

// parseBytes reads fio sizes: 4k, 1M, 256K, 4096 (k = 1024).
func parseBytes(v string) (int64, error) {
	v = strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(v), "b"), "i")
	mult := int64(1)
	if n := len(v); n > 0 {
		if i := strings.IndexByte("kmgt", v[n-1]); i >= 0 {
			mult = 1 << (10 * (i + 1))
			v = v[:n-1]
		}
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n * mult, err
}

// parseSeconds reads fio times: 15 (seconds), 15s, 500ms, 2m.
func parseSeconds(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(v)
}
