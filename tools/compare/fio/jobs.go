// Package fio drives fio for the compare tool: it splits a job file into
// workloads (one per job section), runs one workload on one target with
// --output-format=json, and reads the result.
//
// # Job files
//
// A job file is fio's own INI format. Every section other than [global] is
// one workload, named after the section; it runs alone, with every [global]
// section that comes before it. The tool adds a first [global] section that
// sets filename= to the target's file, so job files must not set filename
// or directory; a target that an engine of fio's own reaches (fio's rbd
// engine) has the engine's options added after the job instead (Place).
// Before the text goes to fio, ${COMPARE_RUNTIME} and ${COMPARE_RAMP} (and
// any other ${COMPARE_*} variable the caller passes) are replaced; other
// ${VAR}s are left to fio's own environment expansion.
//
// A comment line "; compare: fresh" (or "# compare: fresh") inside a section
// asks for a target that is empty and thin when the workload starts (the
// first write into thin space); "; compare: after NAME" runs the workload
// on what workload NAME, which must come right before it, left on the
// target (a sequential read of a disk the previous job filled in random
// order), with no fill or reset between; "; compare: note TEXT" attaches a
// description.
//
// # Results
//
// Parse reads fio's JSON output (fio 3.x), skipping any text fio printed
// before it; Result.Summary adds up every job and direction into one
// figure per run.
package fio

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
)

// Job is one workload: a fio job section with the globals before it.
type Job struct {
	Name  string // the section name
	Text  string // fio job text (globals, then the one job section), without filename
	Fresh bool   // the target must start empty and thin
	After string // the workload just before, whose result this one runs on
	Note  string // free text from "; compare: note ..."
}

// validName restricts workload names to what reads well in a table and is
// safe as a fio job name and a file name.
var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]*$`)

// ParseJobs splits a job file into workloads, in file order.
func ParseJobs(r io.Reader) ([]Job, error) {
	type section struct {
		name  string
		lines []string
	}
	var (
		sections []*section
		cur      *section
	)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := sc.Text()
		trim := strings.TrimSpace(line)
		if strings.HasPrefix(trim, "[") {
			end := strings.Index(trim, "]")
			if end < 0 {
				return nil, fmt.Errorf("fio job file line %d: unterminated section name %q", lineNo, trim)
			}
			cur = &section{name: strings.TrimSpace(trim[1:end])}
			sections = append(sections, cur)
			continue
		}
		if cur == nil {
			if trim != "" && !isComment(trim) {
				return nil, fmt.Errorf("fio job file line %d: option %q outside a section", lineNo, trim)
			}
			continue
		}
		cur.lines = append(cur.lines, line)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	var (
		globals []string
		jobs    []Job
		seen    = map[string]bool{}
	)
	for _, s := range sections {
		if s.name == "global" {
			for _, l := range s.lines {
				if k := optionName(l); k == "filename" || k == "directory" || k == "filename_format" {
					return nil, fmt.Errorf("fio job file: a [global] section sets %s; the compare tool chooses the file", k)
				}
			}
			globals = append(globals, "[global]")
			globals = append(globals, s.lines...)
			continue
		}
		if !validName.MatchString(s.name) {
			return nil, fmt.Errorf("fio job file: job name %q: use letters, digits, '.', '_', '+' and '-'", s.name)
		}
		if seen[s.name] {
			return nil, fmt.Errorf("fio job file: job %q appears twice", s.name)
		}
		seen[s.name] = true
		j := Job{Name: s.name}
		for _, l := range s.lines {
			key, val, ok := directive(l)
			if !ok {
				if k := optionName(l); k == "filename" || k == "directory" || k == "filename_format" {
					return nil, fmt.Errorf("fio job file: job %q sets %s; the compare tool chooses the file", s.name, k)
				}
				continue
			}
			switch key {
			case "fresh":
				j.Fresh = true
			case "after":
				j.After = val
			case "note":
				j.Note = val
			default:
				return nil, fmt.Errorf("fio job file: job %q: unknown directive \"compare: %s\"", s.name, key)
			}
		}
		var b strings.Builder
		for _, l := range globals {
			b.WriteString(l)
			b.WriteByte('\n')
		}
		b.WriteString("[" + s.name + "]\n")
		for _, l := range s.lines {
			b.WriteString(l)
			b.WriteByte('\n')
		}
		j.Text = b.String()
		if j.After != "" && (len(jobs) == 0 || jobs[len(jobs)-1].Name != j.After) {
			return nil, fmt.Errorf("fio job file: job %q runs after %q, which must be the job just before it", j.Name, j.After)
		}
		jobs = append(jobs, j)
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("fio job file: no job sections")
	}
	return jobs, nil
}

// ParseJobFile reads a job file from disk.
func ParseJobFile(path string) ([]Job, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	jobs, err := ParseJobs(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return jobs, nil
}

func isComment(trim string) bool {
	return strings.HasPrefix(trim, ";") || strings.HasPrefix(trim, "#")
}

// directive recognises "; compare: KEY [VALUE]".
func directive(line string) (key, val string, ok bool) {
	trim := strings.TrimSpace(line)
	if !isComment(trim) {
		return "", "", false
	}
	rest := strings.TrimSpace(trim[1:])
	if !strings.HasPrefix(rest, "compare:") {
		return "", "", false
	}
	rest = strings.TrimSpace(strings.TrimPrefix(rest, "compare:"))
	key, val, _ = strings.Cut(rest, " ")
	return key, strings.TrimSpace(val), key != ""
}

// optionName is the option a job line sets, "" for comments and blanks.
func optionName(line string) string {
	trim := strings.TrimSpace(line)
	if trim == "" || isComment(trim) {
		return ""
	}
	k, _, _ := strings.Cut(trim, "=")
	return strings.TrimSpace(k)
}

var varRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// Expand replaces ${NAME} for every NAME in vars and leaves everything
// else (other variables, fio's $ncpus and $mb_memory) for fio.
func Expand(text string, vars map[string]string) string {
	return varRef.ReplaceAllStringFunc(text, func(ref string) string {
		if v, ok := vars[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// Place is what a workload runs on: a file, or a target that an I/O
// engine of fio's own names in its options (fio's rbd engine on an RBD
// image: ioengine=rbd, pool=, rbdname=).
type Place struct {
	File string
	// Engine holds job options (key=value) that choose the engine and name
	// its target. They follow the job's text, so they take precedence over
	// its ioengine (and direct, which such an engine may not take).
	Engine []string
}

// String names the place in messages: the file, or the engine's options.
func (p Place) String() string {
	if len(p.Engine) > 0 {
		return strings.Join(p.Engine, " ")
	}
	return p.File
}

// FileText is the job file that runs j on p: for a file, a first [global]
// section naming it, then j's text with vars expanded; for an engine's
// target, j's text and then the engine's options.
func (j Job) FileText(p Place, vars map[string]string) string {
	if len(p.Engine) > 0 {
		text := Expand(j.Text, vars)
		if !strings.HasSuffix(text, "\n") {
			text += "\n"
		}
		return text + strings.Join(p.Engine, "\n") + "\n"
	}
	return "[global]\nfilename=" + p.File + "\n" + Expand(j.Text, vars)
}
