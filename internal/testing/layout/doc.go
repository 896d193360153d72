// Package layout holds the test that keeps the repository's layout what
// docs/architecture.md says it is: every package has a row in its Layout
// table, and imports only the packages of ours its row allows; and that
// internal/ holds what the binary links, internal/testing/ what only tests
// use. It also holds the module's tests to failing under CI rather than
// skipping there (skips_test.go).
package layout
