package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/rdmanet/rdmanet/rsock"
)

// TestDebugPageInABrowser loads the example's /debug/rsock in headless
// Chromium (Debian's package; make test installs it), checks the DOM it
// built: a row per live connection with its transport, and keeps a
// screenshot: in $RSOCK_ARTIFACTS if set (make test sets .artifacts/ of the
// repository), else in the test's temporary directory (its path is logged).
func TestDebugPageInABrowser(t *testing.T) {
	browser := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			browser = p
			break
		}
	}
	if browser == "" {
		t.Skip("no Chromium here (make test installs Debian's chromium package)")
	}
	ln, err := rsock.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: Handler()}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	// Live connections to show: two rsock clients (shm unless the
	// environment says otherwise) holding requests' connections open.
	d := &rsock.Dialer{}
	var want []string
	for range 2 {
		c, err := d.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, awaitSettled(c, 10*time.Second))
		_, err = c.Write([]byte("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"))
		require.NoError(t, err)
		want = append(want, rsock.TransportOf(c))
	}
	url := "http://" + ln.Addr().String() + "/debug/rsock"
	run := func(args ...string) []byte {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run", "--user-data-dir=" + t.TempDir()}, args...)
		out, err := exec.CommandContext(ctx, browser, append(args, url)...).Output()
		require.NoError(t, err, "%s %v", browser, args)
		return out
	}

	doc, err := html.Parse(bytes.NewReader(run("--dump-dom")))
	require.NoError(t, err)
	rows := map[string]int{}
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode && n.Data == "tr" {
			for _, a := range n.Attr {
				if a.Key == "data-transport" {
					rows[a.Val]++
				}
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	need := map[string]int{}
	for _, tr := range want {
		need[tr] += 2 // the client's end and the server's
	}
	need["tcp"]++ // the browser's own connection, a plain client
	for tr, n := range need {
		assert.GreaterOrEqual(t, rows[tr], n, "rows for %s in the page the browser built: %v", tr, rows)
	}

	dir := os.Getenv("RSOCK_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	shot := filepath.Join(dir, "debug-rsock.png")
	run("--screenshot="+shot, "--window-size=1280,900", "--hide-scrollbars")
	png, err := os.ReadFile(shot)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(png, []byte("\x89PNG")), "a PNG")
	assert.Greater(t, len(png), 10<<10, "a screenshot of a page, not a blank")
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
}
