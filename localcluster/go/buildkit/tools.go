//go:build tools

// Package tools pins BuildKit's daemon and client, built by images/build.sh.
package tools

import (
	_ "github.com/moby/buildkit/cmd/buildctl"
	_ "github.com/moby/buildkit/cmd/buildkitd"
)
