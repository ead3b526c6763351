package main

import (
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes parseSize accepts, lower-cased: binary units
// only, so that "1G" means what qemu-img and truncate(1) mean by it.
var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10,
	"m": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gib": 1 << 30,
	"t": 1 << 40, "tib": 1 << 40,
	"p": 1 << 50, "pib": 1 << 50,
	"e": 1 << 60, "eib": 1 << 60,
}

var sizeRE = regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$`)

// parseSize parses a size in bytes: a decimal number (a fraction is allowed if
// the result is a whole number of bytes) followed by an optional suffix K, M,
// G, T, P or E (powers of 1024, any case; KiB, MiB, ... and B are accepted too).
// Negative sizes, unknown suffixes and sizes beyond an int64 are errors.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "-") {
		return 0, fmt.Errorf("size %q: negative", s)
	}
	t = strings.TrimPrefix(t, "+")
	m := sizeRE.FindStringSubmatch(t)
	if m == nil {
		return 0, fmt.Errorf("size %q: want a number with an optional suffix K, M, G, T, P or E", s)
	}
	unit, ok := sizeUnits[strings.ToLower(m[2])]
	if !ok {
		hint := ""
		if strings.HasSuffix(strings.ToLower(m[2]), "b") {
			hint = " (decimal units are not accepted: use K or KiB, powers of 1024)"
		}
		return 0, fmt.Errorf("size %q: unknown suffix %q%s", s, m[2], hint)
	}
	r, ok := new(big.Rat).SetString(m[1])
	if !ok {
		return 0, fmt.Errorf("size %q: bad number", s)
	}
	r.Mul(r, new(big.Rat).SetInt64(unit))
	if !r.IsInt() {
		return 0, fmt.Errorf("size %q: not a whole number of bytes", s)
	}
	n := r.Num()
	if !n.IsInt64() {
		return 0, fmt.Errorf("size %q: too large (the limit is %d bytes)", s, int64(math.MaxInt64))
	}
	return n.Int64(), nil
}

var sizeNames = []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}

// formatSize formats n bytes for people: "512 B", "4 KiB", "1.5 GiB". Whole
// multiples of a unit print without a fraction; others with one decimal.
func formatSize(n int64) string {
	if n < 1024 { // negative sizes too: they are bugs, shown as they are
		return fmt.Sprintf("%d B", n)
	}
	i, unit := 0, int64(1)
	for i+1 < len(sizeNames) && n/unit >= 1024 {
		i, unit = i+1, unit*1024
	}
	if n%unit == 0 {
		return fmt.Sprintf("%d %s", n/unit, sizeNames[i])
	}
	v := float64(n) / float64(unit)
	if v >= 1023.95 && i+1 < len(sizeNames) { // would print as "1024.0"
		return fmt.Sprintf("%.1f %s", v/1024, sizeNames[i+1])
	}
	return fmt.Sprintf("%.1f %s", v, sizeNames[i])
}

// sizeValue is a flag holding a size parsed by parseSize.
type sizeValue struct {
	n   int64
	set bool
}

func (v *sizeValue) String() string {
	if !v.set {
		return ""
	}
	return strconv.FormatInt(v.n, 10)
}

func (v *sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	v.n, v.set = n, true
	return nil
}

func (v *sizeValue) Type() string { return "size" }

// modeValue is a flag holding permission bits in octal ("0644", "644").
type modeValue uint32

func (m *modeValue) String() string { return fmt.Sprintf("%#o", uint32(*m)) }

func (m *modeValue) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimPrefix(s, "0o"), "0O"), 8, 32)
	if err != nil || n > 0o7777 {
		return fmt.Errorf("mode %q: want octal permission bits such as 0644", s)
	}
	*m = modeValue(n)
	return nil
}

func (m *modeValue) Type() string { return "octal" }

// formatSizeExact is formatSize followed by the exact byte count when the
// short form is rounded: "1 GiB", "1.0 GiB (1074790400 bytes)".
func formatSizeExact(n int64) string {
	s := formatSize(n)
	if strings.Contains(s, ".") {
		s += fmt.Sprintf(" (%d bytes)", n)
	}
	return s
}

// avgExtent is the average extent size of bytes mapped by extents: how
// fragmented a disk or store is (0 when nothing is mapped).
func avgExtent(bytes int64, extents int) int64 {
	if extents == 0 {
		return 0
	}
	return bytes / int64(extents)
}
