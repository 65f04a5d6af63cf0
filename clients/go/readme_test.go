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
	out := runReadmeBlock(t, 0)
	if !strings.Contains(out, "holding 2 permits, fencing token") || !strings.HasSuffix(out, "false\n") {
		t.Fatalf("unexpected output:\n%s", out)
	}
}

// The README's queue example runs as written, against the shared server.
func TestReadmeQueueExampleRunsAsWritten(t *testing.T) {
	t.Parallel()
	out := runReadmeBlock(t, 1)
	if !strings.Contains(out, "sending to ada@example.com attempt 1 token") || !strings.HasSuffix(out, "pending 0 claimed 0\n") {
		t.Fatalf("unexpected output:\n%s", out)
	}
}

// The README's example of semaphore policies runs as written, against the shared server.
func TestReadmePoliciesExampleRunsAsWritten(t *testing.T) {
	t.Parallel()
	out := runReadmeBlock(t, 2)
	if !strings.Contains(out, "of 10 lock-delay 5s team-a holds 1\n") {
		t.Fatalf("unexpected output:\n%s", out)
	}
}

// runReadmeBlock runs the README's Go block number n (from 0) with go run, pointed at the
// shared server, and returns its output.
func runReadmeBlock(t *testing.T, n int) string {
	t.Helper()
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	if len(blocks) <= n {
		t.Fatalf("the README has %d Go blocks, not %d", len(blocks), n+1)
	}
	code := strings.ReplaceAll(blocks[n][1], "http://127.0.0.1:7376", shared.URL)
	main := filepath.Join(t.TempDir(), "main.go")
	if err := os.WriteFile(main, []byte(code), 0o600); err != nil {
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
	return string(out)
}
