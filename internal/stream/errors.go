package stream

import (
	"errors"
	"fmt"
	"syscall"
)

// Errors returned by Conn. The rsock package wraps them in *net.OpError.
//
//   - net.ErrClosed: the local side closed the Conn.
//   - os.ErrDeadlineExceeded: a read or write deadline passed; the Conn
//     stays usable.
//   - *ResetError (errors.Is syscall.ECONNRESET): the peer aborted, crashed,
//     broke the protocol, or the transport failed.
//   - ErrBrokenPipe (errors.Is syscall.EPIPE): a write after the peer closed
//     for reading or after the local CloseWrite.

// ErrBrokenPipe is returned by Write when the peer will read no more, or
// after CloseWrite.
var ErrBrokenPipe = fmt.Errorf("rsock: broken pipe: %w", syscall.EPIPE)

// ResetError reports a connection torn down by something other than an
// orderly close. It matches syscall.ECONNRESET and unwraps to its cause.
type ResetError struct {
	Reason string // what happened, in words
	Err    error  // the cause, if any
}

func (e *ResetError) Error() string { return "rsock: connection reset: " + e.Why() }

// Why is what happened and its cause, without the prefix: what a goodbye
// and a log record say.
func (e *ResetError) Why() string {
	if e.Err != nil {
		return e.Reason + ": " + e.Err.Error()
	}
	return e.Reason
}

// Why is the Why of the *ResetError err is or wraps (as a failover's
// wraps its cause), else err's message.
func Why(err error) string {
	var re *ResetError
	if errors.As(err, &re) {
		return re.Why()
	}
	return err.Error()
}

// Unwrap exposes the cause and syscall.ECONNRESET.
func (e *ResetError) Unwrap() []error {
	if e.Err != nil {
		return []error{syscall.ECONNRESET, e.Err}
	}
	return []error{syscall.ECONNRESET}
}

func reset(reason string, err error) error { return &ResetError{Reason: reason, Err: err} }
