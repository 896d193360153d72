// Package readme finds the generated samples of a Markdown file, so tests
// that run what a sample shows can check it, or rewrite it from their own
// run. A sample is the fenced block right after a line
//
//	<!-- generated: NAME; CHECKED BY -->
//
// where NAME is unique in the file and CHECKED BY says which test (or
// command) checks and regenerates it, for the reader who edits it.
package readme

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// UpdateEnv, set to 1, has tests rewrite the samples they check instead of
// failing: HOPLINK_UPDATE_DOCS=1 go test ./... -run ..., then review the diff.
const UpdateEnv = "HOPLINK_UPDATE_DOCS"

// Updating says whether tests should rewrite samples.
func Updating() bool { return os.Getenv(UpdateEnv) == "1" }

var marker = regexp.MustCompile(`(?m)^<!-- generated: ([A-Za-z0-9_.-]+);[^\n]*-->\n`)

// span is where a sample's body lies in the file: text[start:end] is the
// block's content between its fences.
func span(text, name string) (start, end int, err error) {
	found := -1
	for _, m := range marker.FindAllStringSubmatchIndex(text, -1) {
		if text[m[2]:m[3]] != name {
			continue
		}
		if found >= 0 {
			return 0, 0, fmt.Errorf("sample %q is marked twice", name)
		}
		found = m[1]
	}
	if found < 0 {
		return 0, 0, fmt.Errorf("no sample %q: want a line <!-- generated: %s; ... --> before its block", name, name)
	}
	rest := text[found:]
	nl := strings.IndexByte(rest, '\n')
	if !strings.HasPrefix(rest, "```") || nl < 0 {
		return 0, 0, fmt.Errorf("sample %q: the line after its marker does not open a fenced block", name)
	}
	start = found + nl + 1
	close := strings.Index(text[start:], "\n```\n")
	if strings.HasPrefix(text[start:], "```\n") {
		return start, start, nil
	}
	if close < 0 {
		return 0, 0, fmt.Errorf("sample %q: its block is not closed", name)
	}
	return start, start + close + 1, nil
}

// Block is the content of the sample NAME in the file at path, every line
// ending in a newline.
func Block(path, name string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s, e, err := span(string(b), name)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return string(b)[s:e], nil
}

// Replace writes content (newline-terminated lines) as the sample NAME.
func Replace(path, name, content string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s, e, err := span(string(b), name)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if content != "" && !strings.HasSuffix(content, "\n") {
		content += "\n"
	}
	out := string(b)[:s] + content + string(b)[e:]
	return os.WriteFile(path, []byte(out), 0o644)
}

// Check compares the sample NAME with want, or rewrites it when Updating.
// The error says what differs and how to regenerate.
func Check(path, name, want string) error {
	if Updating() {
		return Replace(path, name, want)
	}
	got, err := Block(path, name)
	if err != nil {
		return err
	}
	if got == want {
		return nil
	}
	return fmt.Errorf("%s: sample %q drifted from what the code prints now.\n--- in the file:\n%s--- now:\n%s(rewrite it with %s=1 and the same test, then review the diff)", path, name, got, want, UpdateEnv)
}

// Table splits a block of columns aligned by spaces (kubectl's and
// hoplink's tables) into cells: columns are separated by two spaces or
// more, so a header like "CERT EXPIRES" stays one cell.
func Table(block string) [][]string {
	var rows [][]string
	for line := range strings.SplitSeq(strings.TrimRight(block, "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		rows = append(rows, cellSep.Split(strings.TrimSpace(line), -1))
	}
	return rows
}

var cellSep = regexp.MustCompile(`\s{2,}`)
