package permit

import "time"

// SetTakeWaitMax makes each take ask the server to wait at most d (instead of its 60 s cap), so
// that a test sees a long wait asked again in a few seconds; it returns the function that
// restores it. Only for tests that do not run in parallel.
func SetTakeWaitMax(d time.Duration) (restore func()) {
	before := takeWaitMax
	takeWaitMax = d
	return func() { takeWaitMax = before }
}
