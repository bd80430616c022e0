package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildQueen builds cmd/queen into a new temporary directory and returns
// the binary's path and a function removing that directory. Suites call it
// once, from TestMain, so every test of the package runs the same binary.
func BuildQueen() (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "queen-bin-")
	if err != nil {
		return "", nil, fmt.Errorf("temp dir for the queen binary: %w", err)
	}
	remove = func() { os.RemoveAll(dir) }
	bin = filepath.Join(dir, "queen")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/queen-mq/queen/cmd/queen").CombinedOutput()
	if err != nil {
		remove()
		return "", nil, fmt.Errorf("go build ./cmd/queen: %w\n%s", err, out)
	}
	return bin, remove, nil
}
