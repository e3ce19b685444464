// Package rsockdebug serves a page about the process's rsock connections,
// in the manner of net/http/pprof and gRPC's channelz: which transport
// carries each connection and why, the process's totals, and the
// throughput per transport over the last minutes. The application mounts
// it where it likes:
//
//	http.Handle("/debug/rsock", rsockdebug.Handler())
//
// The page is HTML for a person; with ?format=json it is JSON for tools.
package rsockdebug

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rdmanet/rdmanet/rsock"
)

// Sampling of the throughput chart.
const (
	sampleEvery = 2 * time.Second
	samples     = 150 // five minutes
)

// Handler returns the handler. The first call starts one goroutine that
// samples the process's byte counts every two seconds for the chart (it
// runs for the life of the process, as expvar's variables do).
func Handler() http.Handler {
	startSampler.Do(func() { go sample() })
	return http.HandlerFunc(serve)
}

var startSampler sync.Once

// history holds the throughput samples: bytes per second by transport,
// oldest first.
var history struct {
	mu   sync.Mutex
	at   []time.Time
	rate []map[string]float64
}

func sample() {
	prev, prevAt := rsock.Bytes(), time.Now()
	for range time.Tick(sampleEvery) {
		cur, now := rsock.Bytes(), time.Now()
		secs := now.Sub(prevAt).Seconds()
		rate := map[string]float64{}
		for tr, n := range cur {
			if d := n - prev[tr]; d > 0 && secs > 0 {
				rate[tr] = float64(d) / secs
			}
		}
		history.mu.Lock()
		history.at = append(history.at, now)
		history.rate = append(history.rate, rate)
		if len(history.at) > samples {
			history.at, history.rate = history.at[1:], history.rate[1:]
		}
		history.mu.Unlock()
		prev, prevAt = cur, now
	}
}

// Report is what the page shows; ?format=json serves it as is.
type Report struct {
	Time        time.Time
	Totals      rsock.TotalStats
	Connections []rsock.ConnState
	// Throughput is bytes per second by transport, one sample every two
	// seconds, oldest first, over the last five minutes.
	Throughput []Sample
}

// Sample is one point of the throughput chart.
type Sample struct {
	Time        time.Time
	BytesPerSec map[string]float64
}

func report() Report {
	r := Report{Time: time.Now(), Totals: rsock.Totals(), Connections: rsock.Connections()}
	slices.SortFunc(r.Connections, func(a, b rsock.ConnState) int { return a.Since.Compare(b.Since) })
	history.mu.Lock()
	for i := range history.at {
		r.Throughput = append(r.Throughput, Sample{history.at[i], history.rate[i]})
	}
	history.mu.Unlock()
	return r
}

func serve(w http.ResponseWriter, req *http.Request) {
	r := report()
	if req.URL.Query().Get("format") == "json" {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := page.Execute(w, view{Report: r, Chart: chart(r.Throughput)}); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

type view struct {
	Report
	Chart template.HTML
}

// chart draws the throughput per transport as an inline SVG.
func chart(s []Sample) template.HTML {
	const w, h, pad = 600, 160, 30
	peak := 1.0
	series := map[string][]float64{}
	for i, p := range s {
		for tr, v := range p.BytesPerSec {
			if series[tr] == nil {
				series[tr] = make([]float64, len(s))
			}
			series[tr][i] = v
			peak = max(peak, v)
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" role="img" aria-label="throughput per transport">`, w, h+pad)
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="#fafafa" stroke="#ccc"/>`, w, h)
	colors := map[string]string{"verbs": "#c0392b", "shm": "#2471a3", "tcp": "#7f8c8d", "sim": "#8e44ad"}
	names := make([]string, 0, len(series))
	for tr := range series {
		names = append(names, tr)
	}
	slices.Sort(names)
	for k, tr := range names {
		var pts []string
		for i, v := range series[tr] {
			x := float64(w) * float64(samples-len(s)+i) / float64(max(samples-1, 1)) // the newest at the right edge
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, float64(h)-v/peak*float64(h-4)))
		}
		c := colors[tr]
		if c == "" {
			c = "#000"
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`, c, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="12" fill="%s">%s</text>`, 10+k*90, h+20, c, template.HTMLEscapeString(tr))
	}
	fmt.Fprintf(&b, `<text x="6" y="14" font-size="11">peak %s/s</text></svg>`, template.HTMLEscapeString(bytesString(peak)))
	return template.HTML(b.String())
}

func bytesString(v float64) string {
	for _, u := range []string{"B", "KB", "MB", "GB"} {
		if v < 1000 {
			return fmt.Sprintf("%.0f %s", v, u)
		}
		v /= 1000
	}
	return fmt.Sprintf("%.0f TB", v)
}

var page = template.Must(template.New("page").Funcs(template.FuncMap{
	"age": func(t time.Time) string { return time.Since(t).Round(time.Second).String() },
}).Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>rsock connections</title>
<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}th{background:#eee}.fallback{background:#fff3e0}</style>
</head><body>
<h1>rsock</h1>
<p>{{len .Connections}} open connections at {{.Time.Format "2006-01-02 15:04:05 MST"}}.</p>
<h2>Throughput per transport, last five minutes</h2>
{{.Chart}}
<h2>Totals</h2>
<table id="totals">
<tr><th>open, by transport</th><td>{{range $k, $v := .Totals.Open}}{{$k}} {{$v}} {{end}}</td></tr>
<tr><th>made, by transport</th><td>{{range $k, $v := .Totals.Opened}}{{$k}} {{$v}} {{end}}</td></tr>
<tr><th>upgraded, by transport</th><td>{{range $k, $v := .Totals.Upgraded}}{{$k}} {{$v}} {{end}}</td></tr>
<tr><th>labels taken, by reason</th><td>{{range $k, $v := .Totals.ByCode}}{{$k}} {{$v}} {{end}}</td></tr>
<tr><th>fallbacks</th><td>{{.Totals.Fallbacks}}</td></tr>
<tr><th>failed handshakes (listeners)</th><td>{{.Totals.HandshakeFailures}}{{range $k, $v := .Totals.HandshakeFailuresBy}}, {{$k}} {{$v}}{{end}}</td></tr>
<tr><th>probes (dials)</th><td>{{.Totals.Probes}}</td></tr>
<tr><th>rdma_cm requests rejected</th><td>{{.Totals.CMRejected}}</td></tr>
</table>
<h2>Connections</h2>
<table id="connections">
<tr><th>transport</th><th>code</th><th>reason</th><th>local</th><th>remote</th><th>age</th><th>read</th><th>written</th><th>ring</th><th>wake-ups</th><th>credit stalls</th></tr>
{{range .Connections}}<tr class="conn{{if .Fallback}} fallback{{end}}" data-transport="{{.Transport}}">
<td>{{.Transport}}</td><td>{{.Code}}</td><td>{{.Reason}}</td><td>{{.LocalAddr}}</td><td>{{.RemoteAddr}}</td><td>{{age .Since}}</td>
<td>{{.BytesRead}}</td><td>{{.BytesWritten}}</td><td>{{if .RingSize}}{{if ge .RingReadable 0}}{{.RingReadable}}{{else}}busy{{end}} / {{.RingSize}}{{end}}</td><td>{{.Wakeups}}</td><td>{{.CreditStalls}}</td></tr>
{{end}}</table>
<p>JSON: <a href="?format=json">?format=json</a></p>
</body></html>
`))
