package permit_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The README's quick start runs as written, against the shared server.
func TestReadmeQuickStartRunsAsWritten(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) == 0 {
		t.Fatal("no Go quick start in the README")
	}
	quick := strings.ReplaceAll(blocks[0][1], "http://127.0.0.1:7376", shared.URL)
	main := filepath.Join(t.TempDir(), "main.go")
	if err := os.WriteFile(main, []byte(quick), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Built in this module, so that the import resolves to this directory.
	cmd := exec.CommandContext(ctx, "go", "run", main)
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOPROXY=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), "holding 2 permits, fencing token") || !strings.HasSuffix(string(out), "false\n") {
		t.Fatalf("unexpected output:\n%s", out)
	}
}
