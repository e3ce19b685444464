package rsockdebug

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/html"

	"github.com/rdmanet/rdmanet/rsock"
)

// pair connects a client and a server of a listener with cfg.
func pair(t *testing.T, cfg *rsock.Config) (client, server net.Conn) {
	t.Helper()
	lc := rsock.ListenConfig{Config: cfg}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	d := rsock.Dialer{Config: cfg, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s := <-acc
	require.NotNil(t, s)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c, s
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return b
}

// TestPage: the JSON report and the HTML page list each open connection
// with its transport, and the page has its totals and chart.
func TestPage(t *testing.T) {
	shmC, _ := pair(t, &rsock.Config{Transports: []string{"shm"}})
	tcpC, _ := pair(t, &rsock.Config{Transports: []string{"tcp"}})
	srv := httptest.NewServer(Handler())
	defer srv.Close()

	var r Report
	require.NoError(t, json.Unmarshal(get(t, srv.URL+"?format=json"), &r))
	want := map[string]string{shmC.LocalAddr().String(): "shm", tcpC.LocalAddr().String(): "tcp"}
	found := map[string]string{}
	for _, c := range r.Connections {
		if tr, ok := want[c.LocalAddr]; ok {
			found[c.LocalAddr] = c.Transport
			assert.Equal(t, tr, c.Transport)
		}
	}
	assert.Len(t, found, 2, "the report's connections: %+v", r.Connections)
	assert.GreaterOrEqual(t, r.Totals.Open["shm"], int64(2))

	doc, err := html.Parse(bytes.NewReader(get(t, srv.URL)))
	require.NoError(t, err)
	rows := map[string]int{}
	var svg, totals bool
	var walk func(*html.Node)
	walk = func(n *html.Node) {
		if n.Type == html.ElementNode {
			attrs := map[string]string{}
			for _, a := range n.Attr {
				attrs[a.Key] = a.Val
			}
			switch {
			case n.Data == "tr" && attrs["data-transport"] != "":
				rows[attrs["data-transport"]]++
			case n.Data == "svg":
				svg = true
			case n.Data == "table" && attrs["id"] == "totals":
				totals = true
			}
		}
		for c := n.FirstChild; c != nil; c = c.NextSibling {
			walk(c)
		}
	}
	walk(doc)
	assert.GreaterOrEqual(t, rows["shm"], 2, "rows per transport: %v", rows)
	assert.GreaterOrEqual(t, rows["tcp"], 2, "rows per transport: %v", rows)
	assert.True(t, svg, "the throughput chart")
	assert.True(t, totals, "the totals table")
}
