package permit_test

import (
	"path/filepath"
	"testing"
	"time"

	"permit.dev/go/permit"
)

// Against a server without the batched keepalive route (a test build's injected bug plays an
// older server), keepalives go one per session: the route is tried once, then not again for a
// minute.
func TestKeepalivesGoOnePerSessionToAServerWithoutTheBatchRoute(t *testing.T) {
	t.Parallel()
	node, err := startServer(filepath.Join(t.TempDir(), "data"), []string{"PERMIT_INJECT_BUG=no_keepalive_batch"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(node.kill)
	if status, _, err := raw("POST", node.URL+"/v1/sessions/keepalive", "", map[string][]string{"sessions": {}}); err != nil || status != 405 {
		t.Skip("this permit binary has no bug injection (the test build of cargo test has it)")
	}
	ctx := bounded(t, 20*time.Second)
	c := newClient(t, []string{node.URL})
	const sessions, ttl = 3, 900 * time.Millisecond
	var all []*permit.Session
	for i := 0; i < sessions; i++ {
		all = append(all, newSession(t, ctx, c, permit.SessionTTL(ttl)))
	}
	start := time.Now()
	if !eventually(15*time.Second, func() bool {
		for _, s := range all {
			if !s.Deadline().After(start.Add(3 * ttl)) {
				return false
			}
		}
		return true
	}) {
		t.Fatal("the sessions were not kept alive")
	}
	m := metrics(t, node.URL)
	refused := m.sum("permit_http_requests_total", `route="/v1/sessions/keepalive"`, `status="405"`)
	single := m.sum("permit_http_requests_total", "/v1/sessions/{id}/keepalive")
	renewals := m.sum("permit_session_keepalives_total")
	// The probe above, and the client's one try.
	if refused != 2 || single < 2*sessions || renewals != single {
		t.Fatalf("refused %v, single %v, renewals %v", refused, single, renewals)
	}
}
