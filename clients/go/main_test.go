package permit_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// shared is the server of the tests that need nothing of their own (each uses names of its
// own); the examples reach it through PERMIT_SERVER, which NewClient(nil) reads.
var shared *server

func TestMain(m *testing.M) {
	if helper := os.Getenv(helperEnv); helper != "" {
		os.Exit(runHelper(helper))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "permit-go-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer os.RemoveAll(dir)
	shared, err = startServer(filepath.Join(dir, "data"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer shared.kill()
	// A new server raises the cluster's feature version just after it starts; the queue calls
	// need version 4, the semaphore policies and takes version 5.
	single := &cluster{nodes: []*server{shared}}
	if !single.speaks(0, 5, startTimeout) {
		fmt.Fprintln(os.Stderr, "the server does not speak feature version 5 (semaphore policies)")
		return 2
	}
	os.Setenv("PERMIT_SERVER", shared.URL)
	os.Unsetenv("PERMIT_AUTH_TOKEN")
	return m.Run()
}
