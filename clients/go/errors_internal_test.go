package permit

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// Every error code the server can answer (ErrorCode in docs/openapi.json) maps to at least
// one sentinel, and this client knows no server code the spec lacks.
func TestEveryErrorCodeOfTheSpecMaps(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "openapi.json"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Components struct {
			Schemas struct {
				ErrorCode struct {
					Enum []string `json:"enum"`
				} `json:"ErrorCode"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatal(err)
	}
	served := spec.Components.Schemas.ErrorCode.Enum
	if len(served) < 30 {
		t.Fatalf("only %d error codes read from the spec", len(served))
	}
	inSpec := map[string]bool{}
	for _, code := range served {
		inSpec[code] = true
		sentinels, ok := codes[code]
		if !ok || len(sentinels) == 0 {
			t.Errorf("the server's error code %q maps to no sentinel", code)
		}
		e := &Error{Code: code, Status: 400, Message: "m"}
		for _, sentinel := range sentinels {
			if !errors.Is(e, sentinel) {
				t.Errorf("errors.Is(%q, %v) is false", code, sentinel)
			}
		}
	}
	local := map[string]bool{"connection": true, "tls": true, "protocol": true, "session_lost": true,
		"session_closed": true, "client_closed": true, "hold_expired": true, "already_held": true,
		"canceled": true, "deadline_exceeded": true}
	for code := range codes {
		if !inSpec[code] && !local[code] {
			t.Errorf("code %q is neither the server's nor this client's", code)
		}
	}
}

func TestSentinelsAndContextErrors(t *testing.T) {
	var wrapped error = &Error{Code: "unavailable", Status: 409}
	if !errors.Is(wrapped, ErrUnavailable) || !errors.Is(wrapped, ErrConflict) || errors.Is(wrapped, ErrNotFound) {
		t.Fatal("unavailable is ErrUnavailable and ErrConflict only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	timedOut := contextError(ctx, "x")
	if !errors.Is(timedOut, ErrTimeout) || !errors.Is(timedOut, context.DeadlineExceeded) {
		t.Fatalf("%v: not ErrTimeout and context.DeadlineExceeded", timedOut)
	}
	canceled, stop := context.WithCancel(context.Background())
	stop()
	if e := contextError(canceled, "x"); !errors.Is(e, context.Canceled) || errors.Is(e, ErrTimeout) {
		t.Fatalf("%v: not context.Canceled alone", e)
	}
}
