package permit

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultEndpoint is used when NewClient is given no endpoint and PERMIT_SERVER is unset (the
// CLI's default too).
const DefaultEndpoint = "http://127.0.0.1:7376"

const (
	// defaultTimeout bounds each request that does not wait in a queue.
	defaultTimeout = 10 * time.Second
	// longPollMargin is the extra time a long-poll is given beyond the wait it asks for.
	longPollMargin = 5 * time.Second
	// waitChunk is the longest wait asked of the server in one acquire or campaign; the wait
	// repeats the call.
	waitChunk = 30 * time.Second
	// attemptsMax bounds the attempts of a retried call, over all endpoints.
	attemptsMax = 24
	// retryWindow is the longest a retried call keeps retrying after its first failure: it
	// rides out a leader election (about 2 s).
	retryWindow = 6 * time.Second
	// timeoutsMax is how many attempts may time out before a retried call gives up.
	timeoutsMax = 2
	// backoffMin and backoffMax bound the jittered pause before going around the endpoints
	// again; it doubles from the first to the last.
	backoffMin = 50 * time.Millisecond
	backoffMax = time.Second
	// connectTimeout bounds a TCP connect: an endpoint that does not answer is skipped soon.
	connectTimeout = 2 * time.Second
)

// policy says which failed attempts a call may send again.
type policy int

const (
	// idempotent: any harmless repeat (connection errors, timeouts, no leader, 503s).
	idempotent policy = iota
	// unsent: only attempts that certainly did not reach a leader (session creation).
	unsent
	// onePass: each endpoint once, only unsent attempts, no pause (keepalives: the session's
	// own loop retries).
	onePass
)

// Option configures a Client (see NewClient).
type Option func(*config)

type config struct {
	token      *string
	caFile     *string
	certFile   string
	keyFile    string
	certGiven  bool
	timeout    time.Duration
	httpClient *http.Client
}

// WithAuthToken sends token as "Authorization: Bearer" on every request (servers run with
// --auth need one). Without it the client reads PERMIT_AUTH_TOKEN.
func WithAuthToken(token string) Option { return func(c *config) { c.token = &token } }

// WithCAFile trusts only the PEM certificates in path (a private CA) for https:// endpoints.
// Without it the client reads PERMIT_CA_FILE, else it trusts the system's roots.
func WithCAFile(path string) Option { return func(c *config) { c.caFile = &path } }

// WithClientCert presents the PEM certificate and key in certFile and keyFile to servers that
// require one (--tls-client-ca). Without it the client reads PERMIT_CLIENT_CERT and
// PERMIT_CLIENT_KEY (set together).
func WithClientCert(certFile, keyFile string) Option {
	return func(c *config) { c.certFile, c.keyFile, c.certGiven = certFile, keyFile, true }
}

// WithTimeout bounds each request that does not wait in a queue (default 10 s). Waits
// (Acquire, Campaign, ObserveLeader) are bounded by their context instead.
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithHTTPClient sends the requests through c (its Transport: proxies, TLS, tracing). The
// TLS options and WithTimeout do not apply to it; its Timeout should be 0 or longer than the
// longest wait (the client bounds each request with a context).
func WithHTTPClient(c *http.Client) Option { return func(cfg *config) { cfg.httpClient = c } }

// Client is a connection to a Permit server or cluster. It is safe for concurrent use; share
// one per process.
//
// Requests go to the endpoint that answered last, or to the one a successful answer named as
// the leader (permit-leader) when it is one of the client's endpoints. On connection errors
// and 503s a request moves to the next endpoint; idempotent calls are retried with jittered,
// bounded backoff for a few seconds, which rides out a leader election. A session creation is
// sent again only when it certainly did not reach a leader.
type Client struct {
	endpoints []string
	token     string
	timeout   time.Duration
	http      *http.Client
	preferred atomic.Int64
	batcher   *batcher

	mu       sync.Mutex
	sessions map[*Session]struct{}
	closed   bool
	done     chan struct{} // closed by Close: ends the client's watches
}

func env(name string) string { return os.Getenv(name) }

// NewClient returns a client of the Permit server or cluster at endpoints: URLs like
// "http://10.0.0.1:7376" or "https://permit.internal:7376" (a bare "host:port" gets http://;
// an item may hold several, comma-separated). With no endpoint it reads PERMIT_SERVER
// (comma-separated URLs, as the CLI does), else it uses DefaultEndpoint. Options the program
// does not give come from the environment variables the permit CLI reads (PERMIT_AUTH_TOKEN,
// PERMIT_CA_FILE, PERMIT_CLIENT_CERT and PERMIT_CLIENT_KEY); an explicit option always wins.
func NewClient(endpoints []string, opts ...Option) (*Client, error) {
	cfg := config{timeout: defaultTimeout}
	for _, opt := range opts {
		opt(&cfg)
	}
	if len(endpoints) == 0 {
		if given := env("PERMIT_SERVER"); given != "" {
			endpoints = []string{given}
		} else {
			endpoints = []string{DefaultEndpoint}
		}
	}
	urls, err := normalizeEndpoints(endpoints)
	if err != nil {
		return nil, err
	}
	if cfg.timeout <= 0 {
		return nil, fmt.Errorf("permit: the timeout must be positive, not %v", cfg.timeout)
	}
	token := env("PERMIT_AUTH_TOKEN")
	if cfg.token != nil {
		token = *cfg.token
	}
	c := &Client{endpoints: urls, token: token, timeout: cfg.timeout, sessions: map[*Session]struct{}{}, done: make(chan struct{})}
	if cfg.httpClient != nil {
		c.http = cfg.httpClient
	} else {
		transport, err := newTransport(&cfg)
		if err != nil {
			return nil, err
		}
		c.http = &http.Client{Transport: transport}
	}
	c.batcher = newBatcher(c)
	return c, nil
}

func newTransport(cfg *config) (*http.Transport, error) {
	caFile := env("PERMIT_CA_FILE")
	if cfg.caFile != nil {
		caFile = *cfg.caFile
	}
	certFile, keyFile := cfg.certFile, cfg.keyFile
	if !cfg.certGiven {
		certFile, keyFile = env("PERMIT_CLIENT_CERT"), env("PERMIT_CLIENT_KEY")
		if (certFile == "") != (keyFile == "") {
			return nil, errors.New("permit: PERMIT_CLIENT_CERT and PERMIT_CLIENT_KEY must be set together")
		}
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("permit: reading the CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("permit: %s holds no PEM certificate", caFile)
		}
		tlsConfig.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("permit: loading the client certificate: %w", err)
		}
		tlsConfig.Certificates = []tls.Certificate{pair}
	}
	return &http.Transport{
		// No proxy from the environment: a semaphore service is reached directly, as the CLI
		// and the Python client do.
		Proxy:       nil,
		DialContext: (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		// Idle connections are dropped before the server's 10 s header-read timeout.
		IdleConnTimeout:     4 * time.Second,
		MaxIdleConnsPerHost: 64,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: connectTimeout,
		ForceAttemptHTTP2:   false,
	}, nil
}

func normalizeEndpoints(endpoints []string) ([]string, error) {
	var out []string
	for _, item := range endpoints {
		for _, part := range strings.Split(item, ",") {
			text := strings.TrimSpace(part)
			if text == "" {
				continue
			}
			if !strings.Contains(text, "://") {
				text = "http://" + text
			}
			u, err := url.Parse(text)
			if err != nil {
				return nil, fmt.Errorf("permit: endpoint %q: %w", part, err)
			}
			switch {
			case u.Scheme != "http" && u.Scheme != "https":
				return nil, fmt.Errorf("permit: endpoint %q: only http:// and https:// are supported", part)
			case u.Hostname() == "":
				return nil, fmt.Errorf("permit: endpoint %q: no host", part)
			case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
				return nil, fmt.Errorf("permit: endpoint %q: give only the scheme, host and port", part)
			case u.User != nil:
				return nil, fmt.Errorf("permit: endpoint %q: credentials in the URL are not supported", part)
			}
			out = append(out, u.Scheme+"://"+u.Host)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("permit: no endpoint given")
	}
	return out, nil
}

// Endpoints returns the client's endpoints, normalized to scheme://host:port.
func (c *Client) Endpoints() []string { return append([]string(nil), c.endpoints...) }

// Close closes every session of the client that is still open (on the server too, at most the
// client's timeout each, so that their holds are freed at once) and the idle connections.
// Calls after Close fail.
func (c *Client) Close() error {
	c.mu.Lock()
	if !c.closed {
		close(c.done)
	}
	c.closed = true
	sessions := make([]*Session, 0, len(c.sessions))
	for s := range c.sessions {
		sessions = append(sessions, s)
	}
	c.mu.Unlock()
	// At once, so that an unreachable server costs one timeout, not one per session.
	var wg sync.WaitGroup
	for _, s := range sessions {
		wg.Add(1)
		go func(s *Session) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			_ = s.Close(ctx)
		}(s)
	}
	wg.Wait()
	c.http.CloseIdleConnections()
	return nil
}

// call is one API call: the path (with its escaped segments), optional query and JSON body.
type call struct {
	method  string
	path    string
	query   url.Values
	body    any
	policy  policy
	timeout time.Duration // 0: the client's
	// resent, if set, is set when the call was sent again after an attempt that may have
	// been applied: a refusal of the repeat may be the first attempt's doing.
	resent *bool
}

// answer is a successful answer: its status and raw body.
type answer struct {
	status int
	body   []byte
}

func (a answer) decode(out any) error {
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(a.body, out); err != nil {
		return newError("protocol", a.status, "cannot decode the answer: %v", err)
	}
	return nil
}

// failure is one failed attempt, and what is known about whether the server applied it.
type failure struct {
	err      *Error
	unsent   bool // certainly not applied: retrying cannot do it twice
	timedOut bool // the attempt's own timeout passed
}

func (f failure) retryable(p policy) bool {
	if p != idempotent {
		return f.unsent
	}
	switch f.err.Code {
	case "connection", "timeout", "no_leader", "shutting_down":
		return true
	}
	return f.unsent || f.timedOut
}

// do sends the call, moving to the next endpoint and retrying by its policy.
func (c *Client) do(ctx context.Context, cl call) (answer, error) {
	var payload []byte
	if cl.body != nil {
		var err error
		if payload, err = json.Marshal(cl.body); err != nil {
			return answer{}, fmt.Errorf("permit: encoding the request: %w", err)
		}
	}
	timeout := cl.timeout
	if timeout == 0 {
		timeout = c.timeout
	}
	n := len(c.endpoints)
	maxAttempts := attemptsMax
	if cl.policy == onePass {
		maxAttempts = n
	} else if n > maxAttempts {
		maxAttempts = n
	}
	var firstFailure time.Time
	count, timeouts := 0, 0
	backoff := backoffMin
	for {
		if ctx.Err() != nil {
			return answer{}, contextError(ctx, cl.method+" "+cl.path)
		}
		index := int(c.preferred.Load()) % n
		got, fail := c.attempt(ctx, c.endpoints[index], cl, payload, timeout)
		if fail == nil {
			c.followLeader(index, got.header)
			return got.answer, nil
		}
		if ctx.Err() != nil {
			return answer{}, contextError(ctx, cl.method+" "+cl.path)
		}
		count++
		if firstFailure.IsZero() {
			firstFailure = time.Now()
		}
		if fail.timedOut {
			timeouts++
		}
		exhausted := count >= maxAttempts || time.Since(firstFailure) >= retryWindow ||
			(cl.policy != onePass && timeouts >= timeoutsMax)
		if exhausted || !fail.retryable(cl.policy) {
			return answer{}, fail.err
		}
		if cl.resent != nil && !fail.unsent {
			*cl.resent = true
		}
		next := (index + 1) % n
		c.preferred.CompareAndSwap(int64(index), int64(next))
		if cl.policy != onePass && (next == 0 || n == 1) {
			pause := time.Duration(float64(backoff) * (0.5 + rand.Float64()))
			backoff *= 2
			if backoff > backoffMax {
				backoff = backoffMax
			}
			if err := sleep(ctx, pause); err != nil {
				return answer{}, contextError(ctx, cl.method+" "+cl.path)
			}
		}
	}
}

type reply struct {
	answer
	header http.Header
}

func (c *Client) attempt(ctx context.Context, endpoint string, cl call, payload []byte, timeout time.Duration) (reply, *failure) {
	actx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	target := endpoint + cl.path
	if len(cl.query) > 0 {
		target += "?" + cl.query.Encode()
	}
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(actx, cl.method, target, body)
	if err != nil {
		return reply{}, &failure{err: newError("protocol", 0, "%s: %v", endpoint, err)}
	}
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return reply{}, transportFailure(endpoint, err, ctx.Err() == nil && actx.Err() != nil)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return reply{}, transportFailure(endpoint, err, ctx.Err() == nil && actx.Err() != nil)
	}
	if resp.StatusCode >= 300 {
		return reply{}, answerFailure(endpoint, resp, data)
	}
	return reply{answer{resp.StatusCode, data}, resp.Header}, nil
}

// transportFailure classifies an attempt that got no answer. A refused or timed-out connect
// certainly sent nothing; a TLS failure (an untrusted certificate, a client certificate the
// server refused) is not retried: it would fail the same way again.
func transportFailure(endpoint string, err error, timedOut bool) *failure {
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var header tls.RecordHeaderError
	if errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		errors.As(err, &header) || strings.Contains(err.Error(), "remote error: tls:") {
		return &failure{err: newError("tls", 0, "%s: TLS failed: %v", endpoint, err)}
	}
	var op *net.OpError
	dial := errors.As(err, &op) && op.Op == "dial"
	return &failure{err: newError("connection", 0, "%s: %v", endpoint, err), unsent: dial, timedOut: timedOut && !dial}
}

// answerFailure is a non-2xx answer as an error; only leader_unreachable and storage_error
// prove that nothing was done.
func answerFailure(endpoint string, resp *http.Response, data []byte) *failure {
	var body struct {
		Error *struct {
			Code         string  `json:"code"`
			Message      string  `json:"message"`
			RetryAfterMs *uint64 `json:"retry_after_ms"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &body); err != nil || body.Error == nil || body.Error.Code == "" {
		text := string(data)
		if len(text) > 200 {
			text = text[:200]
		}
		return &failure{err: newError("protocol", resp.StatusCode, "%s: unexpected answer %q", endpoint, text)}
	}
	e := &Error{Code: body.Error.Code, Status: resp.StatusCode, Message: body.Error.Message}
	// The body's milliseconds are exact; the header has whole seconds, rounded up.
	if after := body.Error.RetryAfterMs; after != nil && *after <= uint64(math.MaxInt64/time.Millisecond) {
		e.RetryAfter = time.Duration(*after) * time.Millisecond
	} else if seconds, err := strconv.ParseFloat(resp.Header.Get("Retry-After"), 64); err == nil && seconds >= 0 {
		e.RetryAfter = time.Duration(seconds * float64(time.Second))
	}
	return &failure{err: e, unsent: e.Code == "leader_unreachable" || e.Code == "storage_error"}
}

// followLeader prefers the endpoint a successful answer named as the leader, when it is one of
// the client's: a follower would forward there, one hop more. Unknown addresses are ignored.
func (c *Client) followLeader(current int, header http.Header) {
	if len(c.endpoints) < 2 {
		return
	}
	hint := header.Get("Permit-Leader")
	if hint == "" {
		return
	}
	urls, err := normalizeEndpoints([]string{hint})
	if err != nil || len(urls) != 1 {
		return
	}
	for i, endpoint := range c.endpoints {
		if endpoint == urls[0] {
			c.preferred.CompareAndSwap(int64(current), int64(i))
			return
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// segment is name as one escaped URL path segment, so that a bad name reaches the server,
// which refuses it with a typed error.
func segment(name string) string { return url.PathEscape(name) }

// ms is d in whole milliseconds, rounded up so that a short wait still waits.
func ms(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Millisecond - 1) / time.Millisecond)
}

func (c *Client) checkOpen() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return newError("client_closed", 0, "the client was closed")
	}
	return nil
}
