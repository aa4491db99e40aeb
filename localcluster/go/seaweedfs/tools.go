//go:build tools

// Package tools pins SeaweedFS (its `weed` command), which localcluster/s3server.py builds and runs as
// the real S3 server of the demo, the tests and the benchmarks.
package tools

import (
	_ "github.com/seaweedfs/seaweedfs/weed"
)
