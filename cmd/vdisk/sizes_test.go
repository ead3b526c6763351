package main

import (
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string // substring of the error; "" for success
	}{
		{"0", 0, ""},
		{"4096", 4096, ""},
		{"512B", 512, ""},
		{"1K", 1 << 10, ""},
		{"1k", 1 << 10, ""},
		{"1KiB", 1 << 10, ""},
		{"1kib", 1 << 10, ""},
		{"64M", 64 << 20, ""},
		{"64MiB", 64 << 20, ""},
		{"1G", 1 << 30, ""},
		{"1 GiB", 1 << 30, ""},
		{" 2G ", 2 << 30, ""},
		{"+3G", 3 << 30, ""},
		{"1.5G", 3 << 29, ""},
		{"0.5K", 512, ""},
		{"2T", 2 << 40, ""},
		{"1P", 1 << 50, ""},
		{"1PiB", 1 << 50, ""},
		{"7E", 7 << 60, ""},
		{"7.5EiB", 15 << 59, ""},
		{"8E", 0, "too large"},
		{"8191P", 8191 << 50, ""},
		{"9223372036854775807", 1<<63 - 1, ""},
		{"9223372036854775808", 0, "too large"},
		{"8192P", 0, "too large"},
		{"99999999999999999999G", 0, "too large"},
		{"-1", 0, "negative"},
		{"-1G", 0, "negative"},
		{"", 0, "want a number"},
		{"G", 0, "want a number"},
		{"1.", 0, "want a number"},
		{".5K", 0, "want a number"},
		{"1e3", 0, "want a number"},
		{"0x10", 0, "want a number"},
		{"1X", 0, "unknown suffix"},
		{"1GB", 0, "decimal units"},
		{"1KB", 0, "decimal units"},
		{"1.1", 0, "whole number"},
		{"0.1K", 0, "whole number"},
		{"1/2", 0, "want a number"},
		{"1G1", 0, "want a number"},
	} {
		got, err := parseSize(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("parseSize(%q): %v", tc.in, err)
		case tc.err == "" && got != tc.want:
			t.Errorf("parseSize(%q) = %d, want %d", tc.in, got, tc.want)
		case tc.err != "" && err == nil:
			t.Errorf("parseSize(%q) = %d, want an error with %q", tc.in, got, tc.err)
		case tc.err != "" && !strings.Contains(err.Error(), tc.err):
			t.Errorf("parseSize(%q): error %q does not mention %q", tc.in, err, tc.err)
		}
	}
}

func TestFormatSize(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{0, "0 B"},
		{1, "1 B"},
		{1023, "1023 B"},
		{1024, "1 KiB"},
		{1536, "1.5 KiB"},
		{4096, "4 KiB"},
		{1<<20 - 1, "1.0 MiB"},
		{1 << 20, "1 MiB"},
		{251 << 20, "251 MiB"},
		{3 << 29, "1.5 GiB"},
		{1 << 30, "1 GiB"},
		{1<<30 + 1<<20, "1.0 GiB"},
		{5 << 40, "5 TiB"},
		{1 << 50, "1 PiB"},
		{1 << 62, "4 EiB"},
		{1<<63 - 1, "8.0 EiB"},
	} {
		if got := formatSize(tc.in); got != tc.want {
			t.Errorf("formatSize(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got, want := formatSizeExact(1<<30+1<<20), "1.0 GiB (1074790400 bytes)"; got != want {
		t.Errorf("formatSizeExact = %q, want %q", got, want)
	}
	if got, want := formatSizeExact(1<<30), "1 GiB"; got != want {
		t.Errorf("formatSizeExact = %q, want %q", got, want)
	}
}

func TestModeValue(t *testing.T) {
	for in, want := range map[string]uint32{"0644": 0o644, "600": 0o600, "0o755": 0o755, "7777": 0o7777} {
		var m modeValue
		if err := m.Set(in); err != nil || uint32(m) != want {
			t.Errorf("mode %q = %o, %v; want %o", in, m, err, want)
		}
	}
	for _, in := range []string{"", "8", "rw", "17777", "-1"} {
		var m modeValue
		if err := m.Set(in); err == nil {
			t.Errorf("mode %q accepted as %o", in, m)
		}
	}
}
