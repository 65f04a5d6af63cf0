package permit_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The tests run against real `permit serve` processes started from the binary PERMIT_BIN names
// (else the workspace's target/debug/permit), on ephemeral loopback ports in temp dirs, each
// killed by its PID when its test ends.

const (
	startTimeout  = 30 * time.Second
	clusterSecret = "permit-go-test-cluster-secret"
)

func permitBin() (string, error) {
	path := os.Getenv("PERMIT_BIN")
	if path == "" {
		path = filepath.Join("..", "..", "target", "debug", "permit")
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("no permit binary at %s (set PERMIT_BIN): %w", path, err)
	}
	return filepath.Abs(path)
}

// server is one `permit serve` child process.
type server struct {
	cmd  *exec.Cmd
	URL  string
	Addr string
	Dir  string // its data dir
	once sync.Once
	log  *os.File
}

// startServer starts `permit serve --listen 127.0.0.1:0 --data-dir dir extra...` (with env
// added to this process's environment) and reads the address it bound from its first line,
// "permit listening on URL".
func startServer(dir string, env []string, extra ...string) (*server, error) {
	bin, err := permitBin()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(dir + ".log")
	if err != nil {
		return nil, err
	}
	args := append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dir}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(append(os.Environ(), "RUST_LOG=warn,openraft=off"), env...)
	cmd.Stderr = logFile
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	s := &server{cmd: cmd, Dir: dir, log: logFile}
	found := make(chan string, 1)
	go func() {
		// Drains stdout until the process ends, so that the pipe never fills.
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if line := lines.Text(); strings.HasPrefix(line, "permit listening on ") {
				select {
				case found <- strings.Fields(line)[3]:
				default:
				}
			}
		}
	}()
	select {
	case url := <-found:
		s.URL = url
		s.Addr = url[strings.Index(url, "://")+3:]
		return s, nil
	case <-time.After(startTimeout):
		s.kill()
		return nil, fmt.Errorf("permit serve did not print its address within %v", startTimeout)
	}
}

// newServer is startServer in t's temp dir, killed when t ends.
func newServer(t testing.TB, extra ...string) *server {
	t.Helper()
	s, err := startServer(filepath.Join(t.TempDir(), "data"), nil, extra...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.kill)
	return s
}

// kill ends the process by its PID (SIGKILL, also when stopped) and reaps it.
func (s *server) kill() {
	s.once.Do(func() {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.log.Close()
	})
}

// signal sends sig to the process by its PID.
func (s *server) signal(sig os.Signal) error { return s.cmd.Process.Signal(sig) }

// eventually polls check until it is true or timeout passes (bounded).
func eventually(timeout time.Duration, check func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if check() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return check()
}

// raw sends a request straight to url (no client: the test's own view of the server).
func raw(method, url, token string, body any) (int, []byte, error) {
	var reader io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		reader = bytes.NewReader(data)
	}
	req, err := http.NewRequest(method, url, reader)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return resp.StatusCode, data, err
}

// cluster is a 3-node cluster of permit serve processes.
type cluster struct {
	nodes []*server
}

func newCluster(t testing.TB) *cluster {
	t.Helper()
	dir := t.TempDir()
	secret := filepath.Join(dir, "cluster.secret")
	if err := os.WriteFile(secret, []byte(clusterSecret), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &cluster{}
	type started struct {
		i   int
		s   *server
		err error
	}
	results := make(chan started, 3)
	for i := 1; i <= 3; i++ {
		go func(i int) {
			s, err := startServer(filepath.Join(dir, fmt.Sprintf("n%d", i)), nil, "--id", fmt.Sprint(i), "--join", "--cluster-secret-file", secret)
			results <- started{i, s, err}
		}(i)
	}
	c.nodes = make([]*server, 3)
	var failed error
	for range c.nodes {
		r := <-results
		c.nodes[r.i-1] = r.s
		if r.err != nil {
			failed = r.err
		}
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n != nil {
				n.kill()
			}
		}
	})
	if failed != nil {
		t.Fatal(failed)
	}
	var members []map[string]any
	for i, n := range c.nodes {
		members = append(members, map[string]any{"id": i + 1, "addr": n.Addr})
	}
	status, body, err := raw("POST", c.nodes[0].URL+"/v1/cluster/init", "", map[string]any{"members": members})
	if err != nil || status >= 300 {
		t.Fatalf("cluster init: %d %s %v", status, body, err)
	}
	if c.leader(10*time.Second) < 0 {
		t.Fatal("no leader elected")
	}
	return c
}

// leader is the index of the node that says it leads, or -1 when none does within timeout.
func (c *cluster) leader(timeout time.Duration) int {
	found := -1
	eventually(timeout, func() bool {
		for i, n := range c.nodes {
			status, body, err := raw("GET", n.URL+"/v1/health", "", nil)
			if err != nil || status >= 500 {
				continue
			}
			var health struct {
				Role string `json:"raft_role"`
			}
			if json.Unmarshal(body, &health) == nil && health.Role == "leader" {
				found = i
				return true
			}
		}
		return false
	})
	return found
}

// speaks reports whether the cluster's feature version reached version within timeout, as
// node i reads it (GET /v1/cluster): the leader raises it once every member answered (a
// single node too, just after it starts).
func (c *cluster) speaks(i int, version uint32, timeout time.Duration) bool {
	return eventually(timeout, func() bool {
		status, body, err := raw("GET", c.nodes[i].URL+"/v1/cluster", "", nil)
		var view struct {
			FeatureVersion uint32 `json:"feature_version"`
		}
		return err == nil && status == 200 && json.Unmarshal(body, &view) == nil && view.FeatureVersion >= version
	})
}

func (c *cluster) urls() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.URL)
	}
	return out
}
