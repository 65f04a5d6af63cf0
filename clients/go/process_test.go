package permit_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Separate processes (this test binary as helpers) never hold more than the capacity at once.
func TestCapacityIsNeverExceededByProcesses(t *testing.T) {
	t.Parallel()
	const capacity, processes, rounds = 2, 4, 15
	name := newName(t)
	counter := filepath.Join(t.TempDir(), "holders")
	var cmds []*exec.Cmd
	for i := 0; i < processes; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=holder", "PERMIT_SERVER="+shared.URL, "PERMIT_TEST_NAME="+name,
			fmt.Sprintf("PERMIT_TEST_CAPACITY=%d", capacity), fmt.Sprintf("PERMIT_TEST_ROUNDS=%d", rounds), "PERMIT_TEST_COUNTER="+counter)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		proc := cmd.Process
		t.Cleanup(func() { _ = proc.Kill() })
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("helper %d: %v", i, err)
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("helper %d did not finish", i)
		}
	}
	data, err := os.ReadFile(counter)
	if err != nil {
		t.Fatal(err)
	}
	var now, peak int
	fmt.Sscan(string(data), &now, &peak)
	if now != 0 || peak > capacity || peak < 2 {
		t.Fatalf("holders at the end %d, peak %d (capacity %d): no contention, or too much", now, peak, capacity)
	}
}
