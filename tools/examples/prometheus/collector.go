package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rdmanet/rdmanet/rsock"
)

// collector exports rsock.Totals to Prometheus: the same counters as
// rsock.PublishExpvar, read at each scrape.
type collector struct{}

var (
	descOpen       = prometheus.NewDesc("rsock_connections_open", "Open rsock connections, by transport.", []string{"transport"}, nil)
	descMade       = prometheus.NewDesc("rsock_connections_total", "Connections made, by the transport they were made on.", []string{"transport"}, nil)
	descUpgraded   = prometheus.NewDesc("rsock_upgrades_total", "Moves of a connection onto a ring after it was made, by transport.", []string{"transport"}, nil)
	descByCode     = prometheus.NewDesc("rsock_labels_by_reason_total", "Labels connections took (when made, and at each upgrade, decline or failover), by reason code.", []string{"code"}, nil)
	descFallbacks  = prometheus.NewDesc("rsock_fallbacks_total", "Times a connection was made on, or moved to, TCP although an accelerated transport was allowed.", nil, nil)
	descHandshakes = prometheus.NewDesc("rsock_handshake_failures_total", "Connections the listeners dropped during the handshake, by cause.", []string{"cause"}, nil)
	descProbes     = prometheus.NewDesc("rsock_probes_total", "Dials that asked a server whether it speaks rsock.", nil, nil)
	descCMRejected = prometheus.NewDesc("rsock_rdma_cm_rejected_total", "rdma_cm connect requests refused for want of a valid ticket (iWARP).", nil, nil)
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOpen, descMade, descUpgraded, descByCode, descFallbacks, descHandshakes, descProbes, descCMRejected} {
		ch <- d
	}
}

func (collector) Collect(ch chan<- prometheus.Metric) {
	t := rsock.Totals()
	for tr, n := range t.Open {
		ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(n), tr)
	}
	for tr, n := range t.Opened {
		ch <- prometheus.MustNewConstMetric(descMade, prometheus.CounterValue, float64(n), tr)
	}
	for tr, n := range t.Upgraded {
		ch <- prometheus.MustNewConstMetric(descUpgraded, prometheus.CounterValue, float64(n), tr)
	}
	for code, n := range t.ByCode {
		ch <- prometheus.MustNewConstMetric(descByCode, prometheus.CounterValue, float64(n), code)
	}
	ch <- prometheus.MustNewConstMetric(descFallbacks, prometheus.CounterValue, float64(t.Fallbacks))
	for cause, n := range t.HandshakeFailuresBy {
		ch <- prometheus.MustNewConstMetric(descHandshakes, prometheus.CounterValue, float64(n), cause)
	}
	ch <- prometheus.MustNewConstMetric(descProbes, prometheus.CounterValue, float64(t.Probes))
	ch <- prometheus.MustNewConstMetric(descCMRejected, prometheus.CounterValue, float64(t.CMRejected))
}
