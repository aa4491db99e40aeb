//go:build tools

// Package tools pins the CNCF distribution registry (cmd/registry), which localcluster/registry.sh
// builds and runs as a private registry for the real node to pull from.
package tools

import (
	_ "github.com/distribution/distribution/v3/cmd/registry"
)
