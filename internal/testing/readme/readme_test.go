package readme

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const doc = "# t\n\n<!-- generated: a; TestA -->\n```text\none\ntwo\n```\n\nprose\n\n<!-- generated: b; TestB -->\n```console\n```\n"

func TestBlockAndReplace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "README.md")
	os.WriteFile(p, []byte(doc), 0o644)
	if got, err := Block(p, "a"); err != nil || got != "one\ntwo\n" {
		t.Fatalf("Block a = %q, %v", got, err)
	}
	if got, err := Block(p, "b"); err != nil || got != "" {
		t.Fatalf("Block b = %q, %v", got, err)
	}
	if err := Check(p, "a", "one\nthree\n"); err == nil || !strings.Contains(err.Error(), "three") {
		t.Fatalf("Check of a drifted sample = %v", err)
	}
	if err := Replace(p, "b", "x"); err != nil {
		t.Fatal(err)
	}
	if err := Replace(p, "a", "1\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	want := strings.Replace(strings.Replace(doc, "one\ntwo\n", "1\n", 1), "```console\n```", "```console\nx\n```", 1)
	if string(b) != want {
		t.Fatalf("after Replace:\n%s\nwant:\n%s", b, want)
	}
	if err := Check(p, "a", "1\n"); err != nil {
		t.Fatal(err)
	}
}

func TestMistakesAreNamed(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{"x\n", `no sample "a"`},
		{"<!-- generated: a; T -->\n```\nx\n```\n<!-- generated: a; T -->\n```\ny\n```\n", "marked twice"},
		{"<!-- generated: a; T -->\ntext\n", "does not open a fenced block"},
		{"<!-- generated: a; T -->\n```\nx\n", "not closed"},
	} {
		if _, _, err := span(tc.text, "a"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.text, err, tc.want)
		}
	}
}

func TestTable(t *testing.T) {
	got := Table("NAME   READY   CERT EXPIRES   AGE\nhk     False   2027-01-01     5s\n")
	want := [][]string{{"NAME", "READY", "CERT EXPIRES", "AGE"}, {"hk", "False", "2027-01-01", "5s"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Table = %q", got)
	}
}
