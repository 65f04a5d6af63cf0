package permit_test

import (
	"strconv"
	"strings"
	"testing"
)

// metricValues is a server's /metrics as "name{labels}" -> value.
type metricValues map[string]float64

func metrics(t *testing.T, url string) metricValues {
	t.Helper()
	status, body, err := raw("GET", url+"/metrics", "", nil)
	if err != nil || status != 200 {
		t.Fatalf("metrics: %d %v", status, err)
	}
	out := metricValues{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndex(line, " ")
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// sum adds the values of the series whose key starts with prefix and contains every must.
func (m metricValues) sum(prefix string, must ...string) float64 {
	total := 0.0
next:
	for key, v := range m {
		if !strings.HasPrefix(key, prefix) {
			continue
		}
		for _, part := range must {
			if !strings.Contains(key, part) {
				continue next
			}
		}
		total += v
	}
	return total
}
