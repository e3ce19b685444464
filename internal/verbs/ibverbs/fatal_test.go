//go:build cgo && linux

package ibverbs_test

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/rdmanet/rdmanet/internal/verbs"
	"github.com/rdmanet/rdmanet/internal/verbs/ibverbs"
	"github.com/rdmanet/rdmanet/internal/verbs/verbstest"
)

const fatalChild = "RSOCK_TEST_DEVICE_FATAL_CHILD"

// TestDeviceFatalClosesContext: after the device's DEVICE_FATAL (injected:
// the soft devices never raise it), its QPs are dead and their posts
// refused with the reason, and once the connection's objects are closed
// the context shuts down: none of its descriptors or goroutines is left.
// The check runs in a child process, which has opened no device before,
// and which inherited none of its parent's context descriptors.
func TestDeviceFatalClosesContext(t *testing.T) {
	if os.Getenv(fatalChild) == "" {
		d, err := ibverbs.New().Open(deviceOptions())
		if err != nil {
			verbstest.Unavailable(t, err.Error())
		}
		d.Close()
		cmd := exec.Command(os.Args[0], "-test.run", "^TestDeviceFatalClosesContext$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), fatalChild+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("child:\n%s", out)
		require.NoError(t, err)
		require.Contains(t, string(out), "--- PASS: TestDeviceFatalClosesContext")
		return
	}
	// The parent holds a device context open: none of its descriptors
	// reached this process.
	require.Empty(t, contextHeld(), "descriptors inherited from the parent's device context")
	d, err := ibverbs.New().Open(deviceOptions())
	require.NoError(t, err)
	cq, err := d.NewCQ(16, func() {})
	require.NoError(t, err)
	qp, err := d.NewQP(verbs.QPAttr{CQ: cq, SendDepth: 4, RecvDepth: 4, MaxInline: 32})
	require.NoError(t, err)
	mr, err := d.AllocMR(64<<10, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	require.NoError(t, err)
	require.NotEmpty(t, contextHeld(), "the context's descriptors and goroutines")

	ibverbs.DeviceFatal(d)
	err = qp.PostRecv(&verbs.RecvWR{ID: 1, Local: verbs.SGE{MR: mr, Length: 64}})
	require.ErrorIs(t, err, verbs.ErrQPState)
	assert.Contains(t, err.Error(), "device fatal error")

	// What a connection's teardown does.
	require.NoError(t, qp.Close())
	require.NoError(t, cq.Close())
	require.NoError(t, mr.Close())
	require.NoError(t, d.Close())
	ibverbs.DrainPools()
	deadline := time.Now().Add(30 * time.Second)
	for held := contextHeld(); len(held) > 0; held = contextHeld() {
		if time.Now().After(deadline) {
			t.Fatalf("a failed context still holds, 30 s after its last user closed: %v", held)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// contextHeld lists what a device context holds in the process: its
// descriptors (the device's uverbs file, its event files) and its
// goroutines (the event reader, the completion channels' readers). The
// process's rdma_cm state and the runtime's poller are not a context's.
func contextHeld() []string {
	var held []string
	for _, fd := range fdTargets() {
		if strings.Contains(fd, "uverbs") || strings.Contains(fd, "infinibandevent") {
			held = append(held, fd)
		}
	}
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	for _, fn := range []string{"(*devCtx).asyncLoop", "(*compChannel).events"} {
		if strings.Contains(stacks, fn) {
			held = append(held, "goroutine "+fn)
		}
	}
	return held
}

// fdTargets lists what the process's descriptors refer to.
func fdTargets() []string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out = append(out, e.Name()+"="+l)
	}
	return out
}
