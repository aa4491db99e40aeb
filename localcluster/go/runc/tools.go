//go:build tools

// Package tools pins runc, the OCI runtime the real node's containerd starts containers with.
package tools

import _ "github.com/opencontainers/runc"
