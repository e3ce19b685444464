// Command prometheus exports rsock's process totals (rsock.Totals) to
// Prometheus, beside an rsock echo server: the same counters expvar
// publishes, as rsock_* metrics at /metrics. It is its own module, so
// that client_golang is a dependency of this example only, not of rsock.
//
//	go run . -listen 127.0.0.1:7480 -metrics 127.0.0.1:9480
package main

import (
	"flag"
	"io"
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rdmanet/rdmanet/rsock"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7480", "rsock echo server address")
	metrics := flag.String("metrics", "127.0.0.1:9480", "plain HTTP address of /metrics")
	flag.Parse()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collector{})
	go func() {
		log.Fatal(http.ListenAndServe(*metrics, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	}()
	ln, err := rsock.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("rsock echo on %s, metrics on http://%s/metrics", ln.Addr(), *metrics)
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}
