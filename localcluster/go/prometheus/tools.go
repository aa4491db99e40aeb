//go:build tools

// Package tools pins Prometheus (cmd/prometheus), which tests/prometheus.py builds and runs on loopback
// to evaluate the chart's Grafana dashboard against the operator's metrics.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
)
