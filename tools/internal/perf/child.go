package perf

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// ChildSpec says how compare starts its servers: this program
// re-executed in server mode, so that client and server are two processes.
type ChildSpec struct {
	// Exe is the program (default: os.Args[0]).
	Exe string
	// Env is added to the environment (a test binary uses it to route
	// the child into server mode).
	Env []string
	// Host is the address the servers listen on (default 127.0.0.1).
	// verbs needs the address of an RDMA-capable interface.
	Host string
}

// readyPrefix starts the line a server prints on stdout once it listens.
const readyPrefix = "RSOCKPERF READY "

// child is a running server process.
type child struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	info   ServerInfo
	stderr *limitedBuffer
}

// startChild starts a server in mode m and waits for its address.
func startChild(spec ChildSpec, m Mode) (*child, error) {
	exe := spec.Exe
	if exe == "" {
		exe = os.Args[0]
	}
	host := spec.Host
	if host == "" {
		host = "127.0.0.1"
	}
	args := []string{"server", "--listen", net.JoinHostPort(host, "0"), "--exit-on-eof"}
	if m.IsPlain() {
		args = append(args, "--plain")
	} else {
		args = append(args, "--transport", m.Transport)
		if m.BusyPoll != 0 {
			args = append(args, "--busy-poll", m.BusyPoll.String())
		}
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), spec.Env...)
	ch := &child{cmd: cmd, stderr: &limitedBuffer{max: 8 << 10}}
	cmd.Stderr = ch.stderr
	var err error
	if ch.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
		_, _ = io.Copy(io.Discard, stdout)
	}()
	var s string
	select {
	case s = <-line:
	case <-time.After(30 * time.Second):
	}
	if !strings.HasPrefix(s, readyPrefix) {
		ch.stop()
		return nil, fmt.Errorf("server (%s) did not start: %q %s", m.Name(), strings.TrimSpace(s), strings.TrimSpace(ch.stderr.String()))
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(s, readyPrefix)), &ch.info); err != nil {
		ch.stop()
		return nil, fmt.Errorf("server (%s) said %q: %v", m.Name(), s, err)
	}
	return ch, nil
}

// stop closes the child's stdin (a server started with --exit-on-eof
// exits), and kills it if it has not exited within 5 s.
func (ch *child) stop() {
	ch.stdin.Close()
	done := make(chan struct{})
	go func() { _ = ch.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = ch.cmd.Process.Kill()
		<-done
	}
}

// limitedBuffer keeps the first max bytes written to it.
type limitedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - b.buf.Len(); room > 0 {
		b.buf.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
