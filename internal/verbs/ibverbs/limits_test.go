//go:build cgo && linux

package ibverbs

import (
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/rdmanet/rdmanet/internal/verbs"
)

// TestDevLimitsCheck: depths up to the device's limits pass, one beyond is
// refused with an error naming the limit, the device and the depth; a
// limit the device did not report (0) is not checked. No device needed.
func TestDevLimitsCheck(t *testing.T) {
	l := devLimits{maxQPWR: 512, maxCQE: 1024}
	for _, tc := range []struct {
		name string
		err  error
		want []string // "" for no error
	}{
		{"cq at max", l.checkCQ("mlx5_0", 1024), nil},
		{"cq over", l.checkCQ("mlx5_0", 1025), []string{"CQ of 1025 entries", "mlx5_0", "max_cqe 1024"}},
		{"qp at max", l.checkQP("mlx5_0", 512, 512), nil},
		{"send over", l.checkQP("mlx5_0", 513, 16), []string{"send depth 513", "mlx5_0", "max_qp_wr 512"}},
		{"recv over", l.checkQP("mlx5_0", 16, 600), []string{"receive depth 600", "mlx5_0", "max_qp_wr 512"}},
		{"unreported cq", devLimits{}.checkCQ("x", 1<<30), nil},
		{"unreported qp", devLimits{}.checkQP("x", 1<<30, 1<<30), nil},
	} {
		if tc.want == nil {
			if tc.err != nil {
				t.Errorf("%s: %v, want no error", tc.name, tc.err)
			}
			continue
		}
		if tc.err == nil {
			t.Errorf("%s: no error, want one naming %q", tc.name, tc.want)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(tc.err.Error(), w) {
				t.Errorf("%s: %q does not name %q", tc.name, tc.err, w)
			}
		}
	}
}

// TestQPRefused: a QP refused twice (with the inline size asked for, then
// without inline data) is reported with the first request's capabilities
// and errno, not only the retry's; one refused once, with that errno. The
// errnos stay in the chain.
func TestQPRefused(t *testing.T) {
	c := qpCaps{send: 256, recv: 64, inline: 236}
	err := qpRefused("rxe0", c, syscall.EINVAL, true, syscall.ENOMEM)
	for _, w := range []string{"rxe0", "send 256, recv 64, inline 236", "invalid argument", "without inline data: cannot allocate memory"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q does not say %q", err, w)
		}
	}
	if i, j := strings.Index(err.Error(), "invalid argument"), strings.Index(err.Error(), "cannot allocate memory"); i > j {
		t.Errorf("%q: the first request's errno comes first", err)
	}
	if !errors.Is(err, syscall.EINVAL) || !errors.Is(err, syscall.ENOMEM) {
		t.Errorf("%q: both errnos should be in the chain", err)
	}
	if !verbs.LocalLimit(err) {
		t.Errorf("%q: a refusal for lack of memory is a limit of this host", err)
	}

	err = qpRefused("siw0", qpCaps{send: 64, recv: 32, inline: 0}, syscall.EINVAL, false, syscall.EINVAL)
	if want := "ibverbs: create RC QP on siw0 (send 64, recv 32, inline 0): invalid argument"; err.Error() != want {
		t.Errorf("refused once: %q, want %q", err, want)
	}
	if verbs.LocalLimit(err) {
		t.Errorf("%q: EINVAL is not a limit of this host", err)
	}
}
